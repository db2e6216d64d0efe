// The norm planner: the cheapest of the catalogue's feasible candidates as a launch plan. Needs no GPU.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ops/norm/plan/designs.h"

namespace rtcnorm {

// The ranked candidates of one planning, for explain() only.
struct PlanTrace {
  std::vector<Candidate> ranked;       // cheapest first, at most kTraceLength
  int considered = 0;                  // feasible candidates costed
  bool forced = false, tuned = false;  // an override restricted the design or knobs; rtcnorm.tune's choice was taken
};
constexpr int kTraceLength = 6;
// What a plan of either direction takes from the picked candidate.
struct NormPlan {
  Knobs knobs;
  jit::KernelKey key;  // the kernel (the split backward: its column kernel)
  int64_t row_blocks = 0;
  size_t smem = 0;
  double cost_us = 0;
  PlanTrace trace;  // filled when explaining
};
struct NormFwdPlan : NormPlan {
  FwdDesign design = FwdDesign::kRegisterRow;
  NormMode mode = NormMode::kAuto;          // resolved, never kAuto
  bool persistent = false, cached = false;  // cached: x is read once (registers or shared memory)
};
struct NormBwdPlan : NormPlan {
  BwdDesign design = BwdDesign::kRegisterRow;
  bool split() const { return design == BwdDesign::kSplitRow; }  // every other design holds its rows
  jit::KernelKey coef_key;                                       // the split design's per-row coefficient kernel
  int64_t max_units = std::numeric_limits<int64_t>::max();       // persistent units at most: the partial rows priced
  int64_t col_vecs = 0, col_ctas = 0;  // column_grads: vectors of columns a column CTA owns; column CTAs
};
// `tuned`: a measured choice, taken where feasible and no override is set.
NormFwdPlan plan_norm_fwd(const NormProblem& p, NormMode requested, int sm_count, int arch, bool explain = false,
                          const TunedChoice* tuned = nullptr);
NormBwdPlan plan_norm_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count, int arch,
                          bool explain = false, const TunedChoice* tuned = nullptr);
// Process-wide overrides (tuning, tests): a design and its knobs; problems it cannot run plan as usual.
struct NormOverride {
  int design = -1;  // FwdDesign / BwdDesign as int; -1: none
  Knobs knobs;
  unsigned set = 0;  // bit k: Knob k is set
  bool any() const { return design >= 0 || set != 0; }
};
void set_norm_override(bool forward, const NormOverride& o);
const NormOverride& norm_override(bool forward);
int design_from_name(bool forward, const std::string& name);  // a design's index by name; -1 when unknown
// explain(): a plan's trace as text (only on request, never on launches).
std::string explain_trace(const PlanTrace& trace, bool forward);

}  // namespace rtcnorm
