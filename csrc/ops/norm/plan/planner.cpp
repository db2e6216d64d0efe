// The planner (planner.h), the catalogue's names and knobs, and the designs' shared pieces (designs.h).
#include "ops/norm/plan/planner.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <string>

namespace rtcnorm {
namespace {

// In Knob order.
const struct {
  const char* name;
  int Knobs::*field;
} kKnobs[kKnobCount] = {{"vecs_per_thread", &Knobs::vecs_per_thread}, {"cta_threads", &Knobs::cta_threads},
                        {"blocks_per_sm", &Knobs::blocks_per_sm},     {"slices", &Knobs::slices},
                        {"ring_stages", &Knobs::ring_stages},         {"persistent", &Knobs::persistent},
                        {"grid_exchange", &Knobs::grid_exchange}};

constexpr unsigned bit(Knob k) { return 1u << static_cast<int>(k); }
constexpr unsigned kRowKnobs = bit(Knob::kVecsPerThread) | bit(Knob::kCtaThreads) | bit(Knob::kBlocksPerSm);
constexpr unsigned kSliceKnobs = kRowKnobs | bit(Knob::kSlices) | bit(Knob::kGridExchange) | bit(Knob::kRingStages);
// [forward][design], in BwdDesign / FwdDesign order: the name and the declared knobs.
const struct {
  const char* name;
  unsigned knobs;
} kDesigns[2][kBwdDesignCount] = {{{"register_row", kRowKnobs},
                                   {"staged_row", kRowKnobs | bit(Knob::kRingStages)},
                                   {"sliced_row", kSliceKnobs},
                                   {"split_row", bit(Knob::kVecsPerThread)},
                                   {"column_grads", kRowKnobs},
                                   {"flat_row", kRowKnobs}},
                                  {{"register_row", kRowKnobs | bit(Knob::kPersistent)},
                                   {"smem_row", kRowKnobs},
                                   {"sliced_row", kSliceKnobs},
                                   {"reload_row", kRowKnobs | bit(Knob::kPersistent)},
                                   {"flat_row", kRowKnobs}}};

NormOverride g_overrides[2];  // [forward]

// Keeps the candidates an override (else the tuned choice) allows (if none: all), prices and ranks them (ties in
// catalogue order); the cheapest fills `plan`.
template <class Cost>
const Candidate& pick(bool forward, const TunedChoice* tuned, bool explain, std::vector<Candidate>& cands,
                      NormPlan& plan, Cost cost) {
  NormOverride o = g_overrides[forward];
  const bool use_tuned = !o.any() && tuned != nullptr && tuned->design >= 0 && tuned->design < design_count(forward);
  if (use_tuned) o = NormOverride{tuned->design, tuned->knobs, declared_knobs(forward, tuned->design)};
  const auto refused = [&](const Candidate& c) {
    for (int k = 0; k < kKnobCount; ++k)
      if ((o.set >> k & 1u) != 0 && c.knobs.get(Knob(k)) != o.knobs.get(Knob(k))) return true;
    return o.design >= 0 && c.design != o.design;
  };
  if (o.any() && !std::all_of(cands.begin(), cands.end(), refused)) {
    cands.erase(std::remove_if(cands.begin(), cands.end(), refused), cands.end());
    plan.trace.forced = !use_tuned;
    plan.trace.tuned = use_tuned;
  }
  // A kernel and launch that two layouts or targets reach is one candidate.
  const auto same = [](const Candidate& a, const Candidate& b) {
    return a.design == b.design && a.key == b.key && a.knobs.persistent == b.knobs.persistent;
  };
  for (auto it = cands.begin(); it != cands.end(); ++it)
    cands.erase(std::remove_if(it + 1, cands.end(), [&](const Candidate& c) { return same(*it, c); }), cands.end());
  for (Candidate& c : cands) cost(c);
  TORCH_INTERNAL_ASSERT(!cands.empty(), "rtcnorm: the norm catalogue has no feasible design");
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.us < b.us; });
  plan.trace.considered = static_cast<int>(cands.size());
  if (explain) plan.trace.ranked.assign(cands.begin(), cands.begin() + std::min<size_t>(kTraceLength, cands.size()));
  const Candidate& best = cands.front();
  plan.knobs = best.knobs;
  plan.key = best.key;
  plan.row_blocks = best.row_blocks;
  plan.smem = best.smem;
  plan.cost_us = best.us;
  return best;
}

}  // namespace

std::string explain_trace(const PlanTrace& t, bool forward) {
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

const char* design_name(bool forward, int design) { return kDesigns[forward][design].name; }
unsigned declared_knobs(bool forward, int design) { return kDesigns[forward][design].knobs; }
const char* knob_name(Knob k) { return kKnobs[static_cast<int>(k)].name; }
int Knobs::get(Knob k) const { return this->*kKnobs[static_cast<int>(k)].field; }
void Knobs::set(Knob k, int v) { this->*kKnobs[static_cast<int>(k)].field = v; }

jit::KernelKey norm_key(const NormProblem& p, const jit::KernelFamily* family, const Layout& l, int nv, unsigned flags,
                        int variant, int arch) {
  jit::KernelKey k;
  k.family = family;
  k.dtype = p.dtype;
  k.wdtype = p.has_weight || p.has_bias ? p.wdtype : p.dtype;
  k.hidden = static_cast<int32_t>(p.hidden);
  k.arch = static_cast<int16_t>(arch);
  k.vec = static_cast<int16_t>(p.vec());
  k.threads_per_row = static_cast<int16_t>(l.tpr);
  k.rows_per_cta = static_cast<int16_t>(l.rows);
  k.vecs_per_thread = static_cast<int16_t>(nv);
  k.flags = flags | (p.has_weight ? kHasWeight : 0u) | (p.zero_centered ? kZeroCentered : 0u) |
            (p.single_stride ? kSingleStride : 0u) |
            (l.slices == 16 ? kCluster16 : log2_of_pow2(l.slices) << kClusterShift);
  k.cluster = static_cast<int16_t>(l.slices);
  k.variant = static_cast<int16_t>(variant);
  return k;
}
Layout layout_of(const NormProblem& p, int slices, int nv_target, int cta_threads) {
  Layout l;
  l.slices = slices;
  const int64_t nvec = ceil_div(p.nvec(), int64_t{slices});  // the widest slice
  l.tpr = threads_per_row(nvec, nv_target);
  l.nv = static_cast<int>(ceil_div(nvec, l.tpr));
  l.rows = std::max(1, cta_threads / l.tpr);
  l.threads = l.tpr * l.rows;
  l.row_blocks = ceil_div(p.rows, l.rows);
  return l;
}
Candidate& add_candidate(std::vector<Candidate>& out, const NormProblem& p, int design, const jit::KernelFamily* family,
                         const Layout& l, int nv, int blocks, int regs, unsigned flags, int arch) {
  Candidate& c = out.emplace_back();
  c.design = design;
  c.regs = regs;
  c.knobs.vecs_per_thread = nv;
  c.knobs.cta_threads = l.threads;
  c.knobs.blocks_per_sm = blocks;
  c.knobs.slices = l.slices;
  c.row_blocks = l.row_blocks;
  c.key = norm_key(p, family, l, nv, flags, blocks, arch);
  return c;
}
bool add_flat(std::vector<Candidate>& out, const NormProblem& p, int design, const jit::KernelFamily* family,
              const Layout& l, int nv, int regs, int streams, int64_t combine, unsigned flags, const Gpu& gpu) {
  const int64_t stages = int64_t{flat_stages(flat_chunks(int(p.nvec()), l.tpr * l.nv))} * streams *
                         flat_buffer_elems(l.rows, int(p.hidden), p.esize());
  const int64_t smem = std::max(combine, stages * p.esize());
  if (l.nv > nv || smem > gpu.smem_per_cta()) return false;
  const int blocks = fit_smem(blocks_leaving(l.threads, std::max(1, 2048 / l.threads), regs), smem, gpu.smem_per_cta());
  if (regs_at(l.threads, blocks) < regs) return false;  // would spill
  Candidate& c = add_candidate(out, p, design, family, l, l.nv, blocks, regs, flags, gpu.arch);
  c.smem = static_cast<size_t>(smem);
  c.knobs.persistent = true;
  return true;
}
Candidate grid_exchange(Candidate c) {
  c.knobs.grid_exchange = true;
  c.key.flags |= kGridExchange;
  c.key.cluster = 1;
  return c;
}

const NormOverride& norm_override(bool forward) { return g_overrides[forward]; }
void set_norm_override(bool forward, const NormOverride& o) { g_overrides[forward] = o; }

int design_from_name(bool forward, const std::string& name) {
  for (int d = 0; d < design_count(forward); ++d)
    if (name == design_name(forward, d)) return d;
  return -1;
}
NormFwdPlan plan_norm_fwd(const NormProblem& p, NormMode requested, int sm_count, int arch, bool explain,
                          const TunedChoice* tuned) {
  const Gpu gpu{std::max(1, sm_count), arch};
  std::vector<Candidate> cands;
  // Cached modes no cached design holds fall back to reload, then auto; a forced or tuned design ranks every one.
  for (NormMode m : {requested, NormMode::kMultiWaveReload, NormMode::kAuto})
    if (cands.empty()) fwd_candidates(p, m, gpu, cands, g_overrides[true].design >= 0 || tuned != nullptr);
  NormFwdPlan plan;
  const Candidate& best = pick(true, tuned, explain, cands, plan, [&](Candidate& c) { cost_fwd(p, gpu, c); });
  plan.design = static_cast<FwdDesign>(best.design);
  plan.persistent = best.knobs.persistent;
  plan.cached = plan.design != FwdDesign::kReloadRow;
  plan.mode = plan.persistent ? NormMode::kStaticPersistent
                              : (plan.cached ? NormMode::kMultiWaveCached : NormMode::kMultiWaveReload);
  return plan;
}
NormBwdPlan plan_norm_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count, int arch,
                          bool explain, const TunedChoice* tuned) {
  const Gpu gpu{std::max(1, sm_count), arch};
  const BwdWants w{want_dw, want_db, grad_dh};
  std::vector<Candidate> cands;
  bwd_candidates(p, w, gpu, cands, g_overrides[false].design >= 0 || tuned != nullptr);
  NormBwdPlan plan;
  const Candidate& best = pick(false, tuned, explain, cands, plan, [&](Candidate& c) { cost_bwd(p, w, gpu, c); });
  plan.design = static_cast<BwdDesign>(best.design);
  plan.col_vecs = best.col_vecs;
  plan.col_ctas = best.col_ctas;
  if (plan.split()) plan.coef_key = split_coef_key(p, arch);
  if (!plan.split()) plan.max_units = std::max<int64_t>(1, best.grid / std::max(1, best.knobs.slices));
  return plan;
}

}  // namespace rtcnorm
