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

// plan_norm_fwd / plan_norm_bwd for a CUDA device, without the trace,
// memoized; a measured choice for the problem on that GPU model is taken
// where one is stored (ops/norm/tuned_plans.h).
NormFwdPlan memo_plan_norm_fwd(const NormProblem& p, NormMode requested, int device);
NormBwdPlan memo_plan_norm_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int device);

// Forgets every memoized plan (called whenever an override or a tuned choice changes).
void clear_norm_plan_memo();

}  // namespace rtcnorm
