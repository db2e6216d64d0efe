// The catalogue's names and declared knobs, and the pieces designs share.
#include "ops/norm/plan/designs.h"

#include <algorithm>

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

// In FwdDesign / BwdDesign order.
constexpr unsigned bit(Knob k) { return 1u << static_cast<int>(k); }
constexpr unsigned kRowKnobs = bit(Knob::kVecsPerThread) | bit(Knob::kCtaThreads) | bit(Knob::kBlocksPerSm);
constexpr unsigned kSliceKnobs = kRowKnobs | bit(Knob::kSlices) | bit(Knob::kGridExchange) | bit(Knob::kRingStages);
struct Entry {
  const char* name;
  unsigned knobs;
};
constexpr Entry kFwdDesigns[kFwdDesignCount] = {{"register_row", kRowKnobs | bit(Knob::kPersistent)},
                                                {"smem_row", kRowKnobs},
                                                {"sliced_row", kSliceKnobs},
                                                {"reload_row", kRowKnobs | bit(Knob::kPersistent)}};
constexpr Entry kBwdDesigns[kBwdDesignCount] = {{"register_row", kRowKnobs},
                                                {"staged_row", kRowKnobs | bit(Knob::kRingStages)},
                                                {"sliced_row", kSliceKnobs},
                                                {"split_row", bit(Knob::kVecsPerThread)},
                                                {"column_grads", kRowKnobs}};
const Entry& entry(bool forward, int design) { return forward ? kFwdDesigns[design] : kBwdDesigns[design]; }

}  // namespace

const char* design_name(bool forward, int design) { return entry(forward, design).name; }
unsigned declared_knobs(bool forward, int design) { return entry(forward, design).knobs; }
const char* knob_name(Knob k) { return kKnobs[static_cast<int>(k)].name; }
int Knobs::get(Knob k) const { return this->*kKnobs[static_cast<int>(k)].field; }
void Knobs::set(Knob k, int v) { this->*kKnobs[static_cast<int>(k)].field = v; }

jit::KernelKey norm_key(const NormProblem& p, const jit::KernelFamily* family, int arch) {
  jit::KernelKey k;
  k.family = family;
  k.dtype = p.dtype;
  k.wdtype = p.has_weight || p.has_bias ? p.wdtype : p.dtype;
  k.hidden = static_cast<int32_t>(p.hidden);
  k.arch = static_cast<int16_t>(arch);
  k.vec = static_cast<int16_t>(p.vec());
  return k;
}
unsigned base_flags(const NormProblem& p) {
  return (p.has_weight ? kHasWeight : 0u) | (p.zero_centered ? kZeroCentered : 0u) |
         (p.single_stride ? kSingleStride : 0u);
}
Layout layout_of(const NormProblem& p, int64_t hidden, int nv_target, int cta_threads) {
  Layout l;
  l.vec = p.vec();
  const int64_t nvec = hidden / l.vec;
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
  c.row_blocks = l.row_blocks;
  c.key = norm_key(p, family, arch);
  c.key.threads_per_row = static_cast<int16_t>(l.tpr);
  c.key.rows_per_cta = static_cast<int16_t>(l.rows);
  c.key.vecs_per_thread = static_cast<int16_t>(nv);
  c.key.flags = flags;
  c.key.variant = static_cast<int16_t>(blocks);
  return c;
}
void slice(Candidate& c, int s) {
  c.key.cluster = static_cast<int16_t>(s);
  c.key.flags |= s == 16 ? kCluster16 : log2_of_pow2(s) << kClusterShift;
}
Candidate grid_exchange(Candidate c) {
  c.knobs.grid_exchange = true;
  c.key.flags |= kGridExchange;
  c.key.cluster = 1;
  return c;
}
int threads_per_row(int64_t nvec, int nv) {
  const int64_t want = ceil_div(nvec, std::max(1, nv));
  if (want <= 32) return static_cast<int>(pow2_ceil(want));
  if (want >= 1024) return 1024;
  int best = 0;
  int64_t best_idle = -1;
  for (int v = std::max(1, nv); v >= std::max(1, nv / 2); --v) {
    const int64_t t = std::min<int64_t>(1024, ceil_div(ceil_div(nvec, v), 32) * 32);
    const int64_t idle = t * ceil_div(nvec, t) - nvec;
    if (best_idle < 0 || idle < best_idle) best = static_cast<int>(t), best_idle = idle;
  }
  return best;
}

// Four register partitions of 16384 take warps round-robin, 8 registers a
// step, at most 255 (sm_80 - sm_100).
int regs_at(int threads, int blocks) {
  const int warps = ((threads + 31) / 32) * std::max(1, blocks);
  const int per_partition = (warps + 3) / 4;
  return std::min(255, 16384 / (per_partition * 32) / 8 * 8);
}
int blocks_leaving(int threads, int blocks, int need) {
  while (blocks > 1 && regs_at(threads, blocks) < need) --blocks;
  return std::max(1, blocks);
}

}  // namespace rtcnorm
