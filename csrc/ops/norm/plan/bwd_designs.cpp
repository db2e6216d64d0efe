// The backward designs' candidates (flag words: kernels/common/params.cuh).
#include <algorithm>

#include "ops/norm/kernel_families.h"
#include "ops/norm/plan/designs.h"

namespace rtcnorm {
namespace {

constexpr int kElemChoices[] = {8, 16, 32};  // elements a thread holds (32: 128 registers)
constexpr int64_t kMinSliceElems = 2048;     // a slice's elements at least
constexpr int kColumnLineBytes = 128;        // column_grads: a column CTA's narrowest strip
constexpr int kSplitColThreads = 256;        // split_row: the column kernel's CTA
constexpr int kSplitCoefVecs = 4;            // split_row: the coefficient kernel's vectors a thread

unsigned grad_flags(const NormProblem& p, const BwdWants& w) {
  return base_flags(p) | (w.dh ? kGradDh : 0u) | (w.dw ? kWantDw : 0u) | (w.db ? kWantDb : 0u);
}

// Registers a thread holding `elems` elements of x and dy (and dh) needs (docs/designs.md).
int bwd_row_regs(const NormProblem& p, const BwdWants& w, int elems, bool keep_terms) {
  const int raw = elems / p.vec() * static_cast<int>(ceil_div(p.vec() * p.esize(), 4)) * (w.dh ? 3 : 2);
  const int centred = p.kind == kLayerNorm ? elems : 0;
  return 40 + elems * (1 + w.accums()) + centred + (keep_terms ? 3 * elems : raw);
}

// Persistent CTAs holding rows (of `slices`) in registers or a 2-3 stage ring.
void row_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, int slices, std::vector<Candidate>& out) {
  const int vec = p.vec();
  const int64_t hidden = p.hidden / slices;
  for (int elems : kElemChoices) {
    for (int cta : kCtaChoices) {
      const Layout l = layout_of(p, hidden, std::max(1, elems / vec), cta);
      if (l.nv * vec > elems || (l.tpr > 512 && p.kind == kLayerNorm)) continue;
      if (l.tpr > cta && cta != kCtaChoices[0]) continue;
      const int bundles = bwd_bundles(l.tpr, l.rows);
      const size_t combine = w.accums() > 0 && bundles > 1 ? size_t(bundles) * hidden * sizeof(float) : 0;
      for (int stages : {0, 2, 3}) {
        const bool staged = stages > 0;
        if (staged && vec * p.esize() != 16) continue;
        const int64_t ring = int64_t(stages) * l.rows * hidden * p.esize() * (w.dh ? 3 : 2);
        const size_t smem = std::max<size_t>(combine, static_cast<size_t>(ring));
        if (static_cast<int64_t>(smem) > gpu.smem_per_cta()) continue;
        const int need = bwd_row_regs(p, w, l.nv * vec, false);
        const int blocks = fit_smem(blocks_leaving(l.threads, std::max(1, std::min(4, 2048 / l.threads)), need),
                                    static_cast<int64_t>(smem), gpu.smem_per_cta());
        if (regs_at(l.threads, blocks) < need) continue;  // would spill
        for (int b = blocks; b >= 1 && b >= blocks - 1; --b) {
          const bool keep_terms = l.nv * vec <= 16 && regs_at(l.threads, b) >= bwd_row_regs(p, w, l.nv * vec, true);
          const BwdDesign d = slices > 1 ? BwdDesign::kSlicedRow
                              : staged   ? BwdDesign::kStagedRow
                                         : BwdDesign::kRegisterRow;
          // One row block and one CTA: its column sums are the gradients.
          const bool direct = slices == 1 && l.row_blocks == 1 && w.accums() > 0;
          const unsigned flags = grad_flags(p, w) | kCachedRow | (keep_terms ? kKeepTerms : 0u) |
                                 (staged ? kStagedRow | unsigned(stages - 2) << kRingExtraShift : kPrefetchNext) |
                                 (hidden >= 8192 ? kStreamStore : 0u) | (direct ? kDirectGrads : 0u);
          Candidate& c = add_candidate(out, p, int(d), bwd_family(p.kind), l, l.nv, b,
                                       bwd_row_regs(p, w, l.nv * vec, keep_terms), flags, gpu.arch);
          c.knobs.ring_stages = stages;
          c.knobs.slices = slices;
          c.knobs.persistent = true;
          c.smem = smem;
        }
      }
    }
  }
}

// Rows split over a cluster or a cooperative group; staged slices may defer.
void sliced_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  if (gpu.arch < 90) return;
  for (int s = 2; s <= gpu.max_cluster(); s *= 2) {
    if (p.nvec() % s != 0 || p.hidden / s < kMinSliceElems) continue;
    const size_t first = out.size();
    row_candidates(p, w, gpu, s, out);
    for (size_t i = first, n = out.size(); i < n; ++i) {
      Candidate& c = out[i];
      slice(c, s);
      c.key.flags &= ~kDirectGrads;
      if (c.knobs.ring_stages < 3 || w.dh || (c.key.flags & kKeepTerms) != 0) continue;
      c.key.flags |= kDeferStats;
      if (c.key.threads_per_row % 32 == 0) out.push_back(grid_exchange(c));
    }
  }
}

// Few row blocks: dx-only row CTAs, then column CTAs summing dW / dB; one wave in all.
void column_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  if (w.accums() == 0 || p.rows < 2) return;
  std::vector<Candidate> rows;
  row_candidates(p, BwdWants{false, false, w.dh}, gpu, 1, rows);
  for (Candidate c : rows) {
    c.key.flags |= (w.dw ? kWantDw : 0u) | (w.db ? kWantDb : 0u);
    const int64_t slots = int64_t{c.knobs.blocks_per_sm} * gpu.sm_count;
    if (c.knobs.ring_stages != 0 || c.row_blocks >= slots) continue;
    const int threads = c.key.threads();
    int cv = std::max(1, kColumnLineBytes / (c.key.vec * p.esize()));
    const int64_t free_slots = std::max<int64_t>(1, std::min<int64_t>(gpu.sm_count, slots - c.row_blocks));
    while (2 * cv <= threads && ceil_div(p.nvec(), cv) > free_slots) cv *= 2;
    cv = std::min(cv, threads);
    c.col_ctas = ceil_div(p.nvec(), cv);
    if (c.row_blocks + c.col_ctas > slots) continue;
    c.design = static_cast<int>(BwdDesign::kColumnGrads);
    c.col_vecs = cv;
    c.key.flags = (c.key.flags & ~kDirectGrads) | kColumnGrads;
    c.smem = std::max(c.smem, size_t(2) * threads * c.key.vec * sizeof(float));
    out.push_back(c);
  }
}

// The split design's column kernel: one row of threads walking down columns.
void split_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  Layout l;
  l.tpr = l.threads = static_cast<int>(std::min<int64_t>(kSplitColThreads, pow2_ceil(p.nvec())));
  l.row_blocks = p.rows;
  for (int rows_in_flight : {4, 8, 16}) {
    const int regs = 40 + rows_in_flight * p.vec() * p.esize() * (w.dh ? 3 : 2) / 4 + p.vec() * w.accums();
    if (regs > regs_at(l.threads, 2)) continue;  // would spill
    add_candidate(out, p, int(BwdDesign::kSplitRow), split_cols_family(p.kind), l, rows_in_flight, 2, regs,
                  grad_flags(p, w) | kStreamStore, gpu.arch);
  }
}

// flat_row: a thread keeps gamma and the dW / dB sums of its elements (the
// second pass re-reads x and dy from shared memory); where that would spill,
// it reads gamma again at each use instead of keeping it. 32 elements a
// thread only for rows that 16 cannot hold.
void flat_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  if (!flat_worth(p, false)) return;
  const size_t first = out.size();
  for (int elems : {4, 8, 16, 32})
    for (int cta : kCtaChoices) {
      if (elems == 32 && out.size() > first) return;
      const Layout l = layout_of(p, p.hidden, std::max(1, elems / p.vec()), cta);
      if (l.tpr > 512 && p.kind == kLayerNorm) continue;
      const int bundles = bwd_bundles(l.tpr, l.rows);
      const int64_t combine = w.accums() > 0 && bundles > 1 ? int64_t{bundles} * p.hidden * 4 : 0;
      const int64_t ring = kFlatStages * (w.dh ? 3 : 2) * flat_buffer_elems(l.rows, int(p.hidden), p.esize());
      const bool direct = l.row_blocks == 1 && w.accums() > 0;
      const unsigned flags = grad_flags(p, w) | (p.hidden >= 8192 ? kStreamStore : 0u) | (direct ? kDirectGrads : 0u);
      for (bool keep : {true, false})
        if (add_flat(out, p, int(BwdDesign::kFlatRow), bwd_flat_family(p.kind), l, elems, cta,
                     40 + l.nv * l.vec * (int(keep) + 1 + w.accums()), std::max(combine, ring * p.esize()),
                     flags | (keep ? kKeepGamma : 0u), gpu))
          break;
    }
}

}  // namespace

jit::KernelKey split_coef_key(const NormProblem& p, int arch) {
  jit::KernelKey c = norm_key(p, split_coef_family(p.kind), arch);
  const int tpr = threads_per_row(p.nvec(), kSplitCoefVecs);
  c.threads_per_row = static_cast<int16_t>(tpr);
  c.vecs_per_thread = static_cast<int16_t>(std::min<int64_t>(kSplitCoefVecs, ceil_div(p.nvec(), tpr)));
  c.flags = base_flags(p);
  c.variant = 1;
  return c;
}
void bwd_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out, bool every) {
  row_candidates(p, w, gpu, 1, out);
  // Unless `every`: slices only where one CTA cannot hold a row or rows are few.
  if (every || out.empty() || p.rows < gpu.sm_count) sliced_candidates(p, w, gpu, out);
  column_candidates(p, w, gpu, out);
  split_candidates(p, w, gpu, out);
  flat_candidates(p, w, gpu, out);
}

}  // namespace rtcnorm
