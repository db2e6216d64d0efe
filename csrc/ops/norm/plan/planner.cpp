#include "ops/norm/plan/planner.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iterator>
#include <sstream>
#include <string>

namespace rtcnorm {
namespace {

NormOverride& override_slot(bool forward) {
  static NormOverride fwd, bwd;
  return forward ? fwd : bwd;
}

// Keeps the candidates an override (else the tuned choice) allows; none leaves
// all.
void restrict(bool forward, const TunedChoice* tuned, std::vector<Candidate>& cands, PlanTrace& trace) {
  NormOverride o = override_slot(forward);
  const bool use_tuned = !o.any() && tuned != nullptr && tuned->design >= 0 && tuned->design < design_count(forward);
  if (use_tuned) o = NormOverride{tuned->design, tuned->knobs, declared_knobs(forward, tuned->design)};
  if (!o.any()) return;
  std::vector<Candidate> kept;
  std::copy_if(cands.begin(), cands.end(), std::back_inserter(kept), [&](const Candidate& c) {
    for (int k = 0; k < kKnobCount; ++k)
      if ((o.set >> k & 1u) != 0 && c.knobs.get(Knob(k)) != o.knobs.get(Knob(k))) return false;
    return o.design < 0 || c.design == o.design;
  });
  if (kept.empty()) return;
  trace.forced = !use_tuned;
  trace.tuned = use_tuned;
  cands.swap(kept);
}

// Restricts, prices and ranks the candidates (ties keep the catalogue's
// order) and takes the cheapest into `plan`.
template <class Cost>
const Candidate& pick(bool forward, const TunedChoice* tuned, bool explain, std::vector<Candidate>& cands,
                      NormPlan& plan, Cost cost) {
  restrict(forward, tuned, cands, plan.trace);
  for (Candidate& c : cands) cost(c);
  TORCH_INTERNAL_ASSERT(!cands.empty(), "rtcnorm: the norm catalogue has no feasible design");
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.us < b.us; });
  if (explain) {
    plan.trace.considered = static_cast<int>(cands.size());
    plan.trace.ranked.assign(cands.begin(), cands.begin() + std::min<size_t>(kTraceLength, cands.size()));
  }
  const Candidate& best = cands.front();
  plan.knobs = best.knobs;
  plan.key = best.key;
  plan.row_blocks = best.row_blocks;
  plan.smem = best.smem;
  plan.cost_us = best.us;
  return best;
}

// explain(): the trace as text, built only on request.
std::string trace_text(const PlanTrace& t, bool forward) {
  std::ostringstream os;
  os.precision(3);
  if (t.ranked.empty()) return "";
  for (size_t i = 0; i < t.ranked.size(); ++i) {
    const Candidate& c = t.ranked[i];
    os << (i == 0 ? "" : i == 1 ? "; then: " : "; ") << design_name(forward, c.design) << " (";
    for (int k = 0, shown = 0; k < kKnobCount; ++k)
      if ((declared_knobs(forward, c.design) >> k & 1u) != 0)
        os << (shown++ > 0 ? " " : "") << knob_name(Knob(k)) << "=" << c.knobs.get(Knob(k));
    os << ") " << c.us << " us";
    if (i == 0)
      os << ", " << c.bytes / 1e6 << " MB moved at " << int(c.efficiency * 100 + 0.5) << "% of DRAM bandwidth, "
         << c.in_flight / 1024 << " KB in flight an SM, " << c.regs << " registers a thread";
  }
  os << "; " << (forward ? "forward:" : "backward:") << " ranked " << t.considered
     << " feasible candidates by the cost model";
  if (t.forced) os << " (restricted by an override)";
  if (t.tuned) os << " (the measured choice of rtcnorm.tune)";
  return os.str();
}

}  // namespace

const NormOverride& norm_override(bool forward) { return override_slot(forward); }
void set_norm_override(bool forward, const NormOverride& o) { override_slot(forward) = o; }

int design_from_name(bool forward, const std::string& name) {
  for (int d = 0; d < design_count(forward); ++d)
    if (name == design_name(forward, d)) return d;
  return -1;
}
NormFwdPlan plan_norm_fwd(const NormProblem& p, NormMode requested, int sm_count, int arch, bool explain,
                          const TunedChoice* tuned) {
  const Gpu gpu{std::max(1, sm_count), arch};
  std::vector<Candidate> cands;
  const bool every = override_slot(true).design >= 0;
  // A cached mode no cached design can hold streams x twice; a mode with no
  // design carrying the quantized epilogue plans as auto.
  for (NormMode m : {requested, NormMode::kMultiWaveReload, NormMode::kAuto})
    if (cands.empty()) fwd_candidates(p, m, gpu, cands, every);
  NormFwdPlan plan;
  const Candidate& best = pick(true, tuned, explain, cands, plan, [&](Candidate& c) { cost_fwd(p, gpu, c); });
  plan.design = static_cast<FwdDesign>(best.design);
  plan.persistent = best.knobs.persistent;
  plan.cached = plan.design != FwdDesign::kReloadRow;
  plan.mode = plan.persistent ? NormMode::kStaticPersistent
              : plan.cached   ? NormMode::kMultiWaveCached
                              : NormMode::kMultiWaveReload;
  return plan;
}
NormBwdPlan plan_norm_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count, int arch,
                          bool explain, const TunedChoice* tuned) {
  const Gpu gpu{std::max(1, sm_count), arch};
  const BwdWants w{want_dw, want_db, grad_dh};
  std::vector<Candidate> cands;
  bwd_candidates(p, w, gpu, cands, override_slot(false).design >= 0);
  NormBwdPlan plan;
  const Candidate& best = pick(false, tuned, explain, cands, plan, [&](Candidate& c) { cost_bwd(p, w, gpu, c); });
  plan.design = static_cast<BwdDesign>(best.design);
  plan.split = plan.design == BwdDesign::kSplitRow;
  plan.cached = !plan.split;
  plan.programmatic = arch >= 90;
  plan.col_vecs = best.col_vecs;
  plan.col_ctas = best.col_ctas;
  if (plan.split)
    plan.coef_key = split_coef_key(p, arch);
  else
    plan.max_units = std::max<int64_t>(1, best.grid / std::max(1, best.knobs.slices));
  return plan;
}
std::string explain_fwd(const NormFwdPlan& plan) { return trace_text(plan.trace, true); }
std::string explain_bwd(const NormBwdPlan& plan) { return trace_text(plan.trace, false); }

}  // namespace rtcnorm
