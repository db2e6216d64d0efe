// The cost model: an estimate of one call's device time for a candidate, from
// the bytes it moves, the bytes each SM keeps in flight, its waves and its
// launches. It ranks candidates; it is not a timer.
#pragma once

#include "ops/norm/plan/designs.h"

namespace rtcnorm {

void cost_fwd(const NormProblem& p, const Gpu& gpu, Candidate& c);
void cost_bwd(const NormProblem& p, const BwdWants& w, const Gpu& gpu, Candidate& c);

}  // namespace rtcnorm
