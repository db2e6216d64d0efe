// Memoized norm plans: the launch path's planner is one hash lookup per call.
//
// Plans depend only on the problem, the mode, the gradients asked for and the
// device's SM count and arch, so a plan made once is valid until a planner
// override changes (rtcnorm._tuning, which clears the memo). The memo holds at
// most kNormPlanMemoEntries plans per direction and starts over when full, so
// a stream of ever-new row counts (inference with varying sequence lengths)
// cannot grow it without bound.
#pragma once

#include <cstddef>

#include "ops/norm/plan/planner.h"

namespace rtcnorm {

constexpr size_t kNormPlanMemoEntries = 4096;

// plan_norm_fwd / plan_norm_bwd without the reason text, memoized.
NormFwdPlan memo_plan_norm_fwd(const NormProblem& p, NormMode requested, int sm_count, int arch);
NormBwdPlan memo_plan_norm_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count, int arch);

// Forgets every memoized plan (called whenever a planner override changes).
void clear_norm_plan_memo();

}  // namespace rtcnorm
