// The backward designs' candidates (flag words: kernels/common/params.cuh).
#include <algorithm>

#include "ops/norm/kernel_families.h"
#include "ops/norm/plan/designs.h"

namespace rtcnorm {
namespace {

constexpr int64_t kMinSliceElems = 2048;  // a slice's elements at least
constexpr int kColumnLineBytes = 128;     // column_grads: a column CTA's narrowest strip
constexpr int kSplitColThreads = 256;     // split_row: the column kernel's CTA
constexpr int kSplitCoefVecs = 4;         // split_row: the coefficient kernel's vectors a thread

// Registers a thread holding `elems` elements of x and dy (and dh) needs (docs/designs.md).
int bwd_row_regs(const NormProblem& p, const BwdWants& w, int elems, bool keep_terms) {
  const int raw = elems / p.vec() * static_cast<int>(ceil_div(p.vec() * p.esize(), 4)) * (w.dh ? 3 : 2);
  const int centred = p.kind == kLayerNorm ? elems : 0;
  return 40 + elems * (1 + w.accums()) + centred + (keep_terms ? 3 * elems : raw);
}

// The row designs' flags on rows (or slices) of `hidden`, and the bytes of shared memory
// combining a CTA's column sums. One row block in one CTA: its column sums are the gradients.
unsigned row_flags(const NormProblem& p, const BwdWants& w, const Layout& l, int64_t hidden) {
  const bool direct = l.slices == 1 && l.row_blocks == 1 && w.accums() > 0;
  return w.flags() | (hidden >= 8192 ? kStreamStore : 0u) | (direct ? kDirectGrads : 0u);
}
int64_t combine_bytes(const BwdWants& w, const Layout& l, int64_t hidden) {
  const int bundles = bwd_bundles(l.tpr, l.rows);
  return w.accums() > 0 && bundles > 1 ? int64_t{bundles} * hidden * int64_t{sizeof(float)} : 0;
}

// Persistent CTAs holding rows (of `slices`) in registers or a 2-3 stage ring, 8-32 elements a thread
// (32: 128 registers).
void row_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, int slices, std::vector<Candidate>& out) {
  const int vec = p.vec();
  const bool even = p.nvec() % slices == 0;
  const int64_t hidden = ceil_div(p.nvec(), slices) * vec;  // the widest slice's columns
  each_layout(p, slices, {8 / vec, 16 / vec, 32 / vec}, [&](const Layout& l, int nv) {
    if (l.nv > nv || (l.tpr > 512 && p.kind == kLayerNorm)) return;
    for (int stages : {0, 2, 3}) {
      const bool staged = stages > 0;
      if (staged && (vec * p.esize() != 16 || !even)) continue;
      const int64_t ring = int64_t(stages) * l.rows * hidden * p.esize() * (w.dh ? 3 : 2);
      const int64_t smem = std::max(combine_bytes(w, l, hidden), ring);
      if (smem > gpu.smem_per_cta()) continue;
      const int need = bwd_row_regs(p, w, l.nv * vec, false);
      const int blocks =
          fit_smem(blocks_leaving(l.threads, std::min(4, 2048 / l.threads), need), smem, gpu.smem_per_cta());
      if (regs_at(l.threads, blocks) < need) continue;  // would spill
      const auto d = slices > 1 ? BwdDesign::kSlicedRow : staged ? BwdDesign::kStagedRow : BwdDesign::kRegisterRow;
      for (int b = blocks; b >= 1 && b >= blocks - 1; --b) {
        const bool keep_terms = l.nv * vec <= 16 && regs_at(l.threads, b) >= bwd_row_regs(p, w, l.nv * vec, true);
        const unsigned ahead =
            staged ? kStagedRow | unsigned(stages - 2) << kRingExtraShift : (even ? kPrefetchNext : 0u);
        const unsigned flags = row_flags(p, w, l, hidden) | kCachedRow | (keep_terms ? kKeepTerms : 0u) | ahead;
        Candidate& c = add_candidate(out, p, int(d), bwd_family(p.kind), l, l.nv, b,
                                     bwd_row_regs(p, w, l.nv * vec, keep_terms), flags, gpu.arch);
        c.knobs.ring_stages = stages;
        c.knobs.persistent = true;
        c.smem = static_cast<size_t>(smem);
      }
    }
  });
}

// Rows split over a cluster or a cooperative group (sm_90+, can_slice); staged slices may defer.
void sliced_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  for (int s = 2; s <= max_cluster_ctas(gpu.arch); s *= 2) {
    if (!can_slice(p, s) || p.hidden / s < kMinSliceElems) continue;
    const size_t first = out.size();
    row_candidates(p, w, gpu, s, out);
    for (size_t i = first, n = out.size(); i < n; ++i) {
      Candidate& c = out[i];
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
    c.key.flags |= (w.dw ? kWantDw : 0u) | (w.db ? kWantDb : 0u) | kColumnGrads;
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
    c.smem = std::max(c.smem, size_t(2) * threads * c.key.vec * sizeof(float));
    out.push_back(c);
  }
}

// The split design's column kernel: one row of threads walking down columns.
void split_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  const int threads = static_cast<int>(std::min<int64_t>(kSplitColThreads, pow2_ceil(p.nvec())));
  const Layout l{threads, 1, 1, threads, 1, p.rows};
  for (int rows_in_flight : {4, 8, 16}) {
    const int regs = 40 + rows_in_flight * p.vec() * p.esize() * (w.dh ? 3 : 2) / 4 + p.vec() * w.accums();
    if (regs > regs_at(l.threads, 2)) continue;  // would spill
    add_candidate(out, p, int(BwdDesign::kSplitRow), split_cols_family(p.kind), l, rows_in_flight, 2, regs,
                  w.flags() | kStreamStore, gpu.arch);
  }
}

// flat_row: a thread keeps gamma and the dW / dB sums of its elements (the second pass re-reads x and dy from
// shared memory); where that would spill, it reads gamma again at each use instead of keeping it. 32 elements a
// thread only for rows that 16 cannot hold.
void flat_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  if (!flat_worth(p, false)) return;
  const size_t first = out.size();
  const int v = p.vec();
  each_layout(p, 1, {4 / v, 8 / v, 16 / v, 32 / v}, [&](const Layout& l, int nv) {
    if ((nv == 32 / v && out.size() > first) || (l.tpr > 512 && p.kind == kLayerNorm)) return;
    for (bool keep : {true, false})
      if (add_flat(out, p, int(BwdDesign::kFlatRow), bwd_flat_family(p.kind), l, nv,
                   40 + l.nv * v * (int(keep) + 1 + w.accums()), w.dh ? 3 : 2, combine_bytes(w, l, p.hidden),
                   row_flags(p, w, l, p.hidden) | (keep ? kKeepGamma : 0u), gpu))
        break;
  });
}

}  // namespace

jit::KernelKey split_coef_key(const NormProblem& p, int arch) {
  const Layout l = layout_of(p, 1, kSplitCoefVecs, 1);  // one row a CTA
  return norm_key(p, split_coef_family(p.kind), l, std::min(kSplitCoefVecs, l.nv), 0, 1, arch);
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
