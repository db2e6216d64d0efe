#include "ops/softmax/plan/planner.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <unordered_map>

#include "ops/plan_util.h"

namespace rtcnorm {
namespace {

// The memo and the overrides, under one lock: a plan is computed and stored
// under the exclusive lock, so no plan made with stale overrides survives a
// change. The memo is cleared when it reaches kMaxPlans problems (a decode
// loop adds one per key length).
constexpr size_t kMaxPlans = 1 << 14;

struct PlannerState {
  std::shared_mutex mu;
  std::unordered_map<SoftmaxProblem, SoftmaxPlan, SoftmaxProblemHash> memo;
  SoftmaxOverrides overrides;
};

PlannerState& state() {
  static PlannerState s;
  return s;
}

SoftmaxPlan make_plan(SoftmaxDesign d, const SoftmaxProblem& p, const SoftmaxKnobs& k) {
  SoftmaxPlan plan;
  plan.design = d;
  plan.knobs = k;
  plan.key = design_key(d, p, k);
  plan.cached = cached_design(d);
  plan.persistent = persistent_design(d);
  plan.ctas_per_sm = plan.persistent ? k.ctas_per_sm : 0;
  plan.row_blocks = design_row_blocks(d, p, k);
  if (d == SoftmaxDesign::kMaskReuse) plan.reuse_splits = static_cast<int>(ceil_div(p.mask_bcast, k.reuse_run));
  return plan;
}

SoftmaxTrace trace_with(const SoftmaxProblem& p, const SoftmaxOverrides& ov) {
  SoftmaxTrace t;
  t.problem = p;
  for (int i = 0; i < kNumSoftmaxDesigns; ++i) {
    const SoftmaxDesignInfo& info = design_info(static_cast<SoftmaxDesign>(i));
    SoftmaxKnobOverrides knobs = ov.knobs;
    knobs.set &= info.knobs;  // a knob reaches only the designs that declare it
    knobs.forced = ov.design == info.design;
    SoftmaxCandidate c;
    c.design = info.design;
    c.feasible = info.shape(p, knobs, &c.knobs, &c.why_not);
    if (c.feasible) c.cost = softmax_cost(c.design, p, c.knobs);
    t.candidates.push_back(c);
  }
  for (int i = 0; i < kNumSoftmaxDesigns; ++i) {
    const SoftmaxCandidate& c = t.candidates[i];
    if (!c.feasible) continue;
    if (ov.design == c.design) {
      t.picked = i;
      t.forced = true;
      break;
    }
    if (t.picked < 0 || c.cost.ns < t.candidates[t.picked].cost.ns) t.picked = i;
  }
  // kStreamed runs any row, so a design is always picked.
  const SoftmaxCandidate& c = t.candidates[t.picked];
  t.plan = make_plan(c.design, p, c.knobs);
  return t;
}

// The knob names as an error lists them.
std::string knob_list(unsigned bits) {
  std::string s;
  for (int i = 0; i < kNumSoftmaxKnobs; ++i)
    if (bits & (1u << i)) s += std::string(s.empty() ? "" : ", ") + knob_name(static_cast<SoftmaxKnob>(i));
  return s;
}

std::string design_list() {
  std::string s;
  for (int i = 0; i < kNumSoftmaxDesigns; ++i)
    s += std::string(i ? ", " : "") + design_info(static_cast<SoftmaxDesign>(i)).name;
  return s;
}

}  // namespace

SoftmaxPlan plan_softmax(const SoftmaxProblem& p) {
  PlannerState& s = state();
  {
    std::shared_lock<std::shared_mutex> lock(s.mu);
    const auto it = s.memo.find(p);
    if (it != s.memo.end()) return it->second;
  }
  std::unique_lock<std::shared_mutex> lock(s.mu);
  if (s.memo.size() >= kMaxPlans) s.memo.clear();
  return s.memo.try_emplace(p, trace_with(p, s.overrides).plan).first->second;
}

SoftmaxTrace trace_softmax(const SoftmaxProblem& p) {
  PlannerState& s = state();
  std::shared_lock<std::shared_mutex> lock(s.mu);
  return trace_with(p, s.overrides);
}

SoftmaxOverrides softmax_overrides() {
  PlannerState& s = state();
  std::shared_lock<std::shared_mutex> lock(s.mu);
  return s.overrides;
}

std::optional<SoftmaxDesign> softmax_design_named(const std::string& name) {
  for (int i = 0; i < kNumSoftmaxDesigns; ++i)
    if (name == design_info(static_cast<SoftmaxDesign>(i)).name) return static_cast<SoftmaxDesign>(i);
  return std::nullopt;
}

void set_softmax_overrides(const std::optional<std::string>& design,
                           const std::vector<std::pair<std::string, int64_t>>& knobs) {
  SoftmaxOverrides ov;
  unsigned declared = 0;  // knobs the forced design declares, or any design
  if (design) {
    ov.design = softmax_design_named(*design);
    if (!ov.design)
      throw std::invalid_argument("rtcnorm._tuning: unknown softmax design '" + *design + "'; the designs are " +
                                  design_list());
    declared = design_info(*ov.design).knobs;
  } else {
    for (int i = 0; i < kNumSoftmaxDesigns; ++i) declared |= design_info(static_cast<SoftmaxDesign>(i)).knobs;
  }
  for (const auto& [name, value] : knobs) {
    int found = -1;
    for (int i = 0; i < kNumSoftmaxKnobs; ++i)
      if (name == knob_name(static_cast<SoftmaxKnob>(i))) found = i;
    if (found < 0 || !(declared & (1u << found)))
      throw std::invalid_argument("rtcnorm._tuning: softmax knob '" + name + "' is not declared by " +
                                  (design ? "design '" + *design + "'" : std::string("any design")) +
                                  "; its knobs are " + knob_list(declared));
    const std::string range = knob_range_error(static_cast<SoftmaxKnob>(found), value);
    if (!range.empty())
      throw std::invalid_argument("rtcnorm._tuning: softmax knob " + name + " must be " + range + ", got " +
                                  std::to_string(value));
    ov.knobs.set |= 1u << found;
    ov.knobs.value[found] = value;
  }
  PlannerState& s = state();
  std::unique_lock<std::shared_mutex> lock(s.mu);
  s.overrides = ov;
  s.memo.clear();
}

int64_t softmax_grid(const SoftmaxPlan& plan, int sm_count, int blocks_per_sm) {
  if (!plan.persistent) return fixed_grid(plan);
  const int per_sm = std::max(1, plan.ctas_per_sm > 0 ? std::min(blocks_per_sm, plan.ctas_per_sm) : blocks_per_sm);
  return std::max<int64_t>(1, std::min<int64_t>(plan.row_blocks, int64_t(sm_count) * per_sm));
}

}  // namespace rtcnorm
