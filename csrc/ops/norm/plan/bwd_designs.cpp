// The backward designs: feasibility, knob candidates, resources and lowering
// to kernel keys (the kernel template's flag word, kernels/common/params.cuh).
#include <algorithm>

#include "ops/norm/kernel_families.h"
#include "ops/norm/plan/designs.h"

namespace rtcnorm {
namespace {

// Elements of a row a thread may hold (x and dy as stored, plus an fp32 dW /
// dB accumulator each): 32 fills 128 registers a thread.
constexpr int kElemChoices[] = {8, 16, 32};
constexpr int kCtaChoices[] = {128, 256, 512, 1024};
// Rows of a slice are at least this many elements.
constexpr int64_t kMinSliceElems = 2048;
// Split design: the column kernel's CTA and the coefficient kernel's vectors a thread.
constexpr int kSplitColThreads = 256;
constexpr int kSplitCoefVecs = 4;

unsigned grad_flags(const NormProblem& p, const BwdWants& w) {
  return (p.has_weight ? kHasWeight : 0u) | (p.zero_centered ? kZeroCentered : 0u) | (w.dh ? kGradDh : 0u) |
         (w.dw ? kWantDw : 0u) | (w.db ? kWantDb : 0u) | (p.single_stride ? kSingleStride : 0u);
}

// Registers a thread holding `elems` elements of x and dy (and dh) needs: the
// raw values, an fp32 accumulator per gradient, a float of working values
// each, and about 32 for the rest; with the first pass's terms kept as
// floats (kKeepTerms), three floats each instead of the raw values (ptxas,
// sm_90: RMSNorm bf16 at 8 / 16 / 32 elements takes 63 / 80+ / 130+).
int bwd_row_regs(const NormProblem& p, const BwdWants& w, int elems, bool keep_terms) {
  // A register holds at most 4 bytes of a row, and a lone 16-bit element (N odd) one.
  const int raw = elems / p.vec() * static_cast<int>(ceil_div(p.vec() * p.esize(), 4)) * (w.dh ? 3 : 2);
  const int centred = p.kind == kLayerNorm ? elems : 0;  // LayerNorm's x - mean
  return 40 + elems * (1 + w.accums()) + centred + (keep_terms ? 3 * elems : raw);
}

// Rows of `hidden` elements (a slice when sliced) held by the CTA's threads.
void row_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, int slices, std::vector<Candidate>& out) {
  const int vec = p.vec();
  const int64_t nvec = p.nvec() / slices;
  const int64_t hidden = p.hidden / slices;
  for (int elems : kElemChoices) {
    const int nv_target = std::max(1, elems / vec);
    const int tpr = threads_per_row(nvec, nv_target);
    const int nv = static_cast<int>(ceil_div(nvec, tpr));
    if (nv * vec > elems || (tpr > 512 && p.kind == kLayerNorm)) continue;
    for (int cta : kCtaChoices) {
      if (tpr > cta && cta != kCtaChoices[0]) continue;
      const int rows = std::max(1, cta / tpr), threads = tpr * rows;
      const int64_t row_blocks = ceil_div(p.rows, rows);
      const int bundles = bwd_bundles(tpr, rows);
      const size_t combine = w.accums() > 0 && bundles > 1 ? size_t(bundles) * hidden * sizeof(float) : 0;
      for (int stages : {0, 2, 3}) {
        const bool staged = stages > 0;
        if (staged && vec * p.esize() != 16) continue;
        const int64_t ring = int64_t(stages) * rows * hidden * p.esize() * (w.dh ? 3 : 2);
        const size_t smem = std::max<size_t>(combine, static_cast<size_t>(ring));
        if (static_cast<int64_t>(smem) > gpu.smem_per_cta()) continue;
        const bool terms = nv * vec <= 16;
        const int need = bwd_row_regs(p, w, nv * vec, false);
        int blocks = blocks_leaving(threads, std::max(1, std::min(4, 2048 / threads)), need);
        if (smem > 0)
          blocks = static_cast<int>(std::min<int64_t>(blocks, std::max<int64_t>(1, gpu.smem_per_cta() / smem)));
        if (regs_at(threads, blocks) < need) continue;  // would spill
        for (int b = blocks; b >= 1 && b >= blocks - 1; --b) {
          const bool keep_terms = terms && regs_at(threads, b) >= bwd_row_regs(p, w, nv * vec, true);
          Candidate c;
          c.design = static_cast<int>(slices > 1 ? BwdDesign::kSlicedRow
                                      : staged   ? BwdDesign::kStagedRow
                                                 : BwdDesign::kRegisterRow);
          c.regs = bwd_row_regs(p, w, nv * vec, keep_terms);
          c.knobs.vecs_per_thread = nv;
          c.knobs.cta_threads = threads;
          c.knobs.blocks_per_sm = b;
          c.knobs.ring_stages = stages;
          c.knobs.slices = slices;
          c.knobs.persistent = true;
          c.row_blocks = row_blocks;
          c.smem = smem;
          jit::KernelKey& k = c.key;
          k = norm_key(p, bwd_family(p.kind), gpu.arch);
          k.threads_per_row = static_cast<int16_t>(tpr);
          k.rows_per_cta = static_cast<int16_t>(rows);
          k.vecs_per_thread = static_cast<int16_t>(nv);
          k.variant = static_cast<int16_t>(b);
          k.flags = grad_flags(p, w) | kCachedRow | (keep_terms ? kKeepTerms : 0u) |
                    (staged ? kStagedRow | unsigned(stages - 2) << kRingExtraShift : kPrefetchNext) |
                    (hidden >= 8192 ? kStreamStore : 0u);
          // One row block and one CTA: its column sums are the gradients.
          if (slices == 1 && row_blocks == 1 && w.accums() > 0) k.flags |= kDirectGrads;
          out.push_back(c);
        }
      }
    }
  }
}

// Rows split over `slices` CTAs of a cluster, or of a cooperative group
// meeting in global memory. Staged slices may collect the row's sums one row
// block late (deferred), overlapping the exchange with the next row's loads.
void sliced_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  if (gpu.arch < 90) return;
  for (int s = 2; s <= gpu.max_cluster(); s *= 2) {
    if (p.nvec() % s != 0 || p.hidden / s < kMinSliceElems) continue;
    const size_t first = out.size();
    row_candidates(p, w, gpu, s, out);
    for (size_t i = first, n = out.size(); i < n; ++i) {
      Candidate& c = out[i];
      c.key.flags |= s == 16 ? kCluster16 : log2_of_pow2(s) << kClusterShift;
      c.key.flags &= ~kDirectGrads;
      c.key.cluster = static_cast<int16_t>(s);
      const bool deferrable = c.knobs.ring_stages >= 3 && !w.dh && (c.key.flags & kKeepTerms) == 0;
      if (!deferrable) continue;
      c.key.flags |= kDeferStats;
      if (c.key.threads_per_row % 32 != 0) continue;
      Candidate g = c;
      g.knobs.grid_exchange = true;
      g.key.flags |= kGridExchange;
      g.key.cluster = 1;
      out.push_back(g);
    }
  }
}

// Few row blocks: the row CTAs write dx only, and CTAs after them each own
// `col_vecs` vectors of columns and sum dW / dB over every row, written as
// the gradients: no partial rows, no second kernel. Row and column CTAs
// together fit one wave at the candidate's residency.
constexpr int kColumnLineBytes = 128;
void column_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  if (w.accums() == 0 || p.rows < 2) return;
  // The row CTAs hold no dW / dB accumulators: their layouts and residency
  // are those of a backward that computes dx alone.
  std::vector<Candidate> rows;
  row_candidates(p, BwdWants{false, false, w.dh}, gpu, 1, rows);
  const unsigned grads = (w.dw ? kWantDw : 0u) | (w.db ? kWantDb : 0u);
  for (Candidate c : rows) {
    c.key.flags |= grads;
    const int64_t slots = int64_t{c.knobs.blocks_per_sm} * gpu.sm_count;
    if (c.knobs.ring_stages != 0 || c.row_blocks >= slots) continue;
    const int threads = c.key.threads();
    const int64_t nvec = p.nvec();
    int cv = std::max(1, kColumnLineBytes / (c.key.vec * p.esize()));
    const int64_t free_slots = std::max<int64_t>(1, std::min<int64_t>(gpu.sm_count, slots - c.row_blocks));
    while (2 * cv <= threads && ceil_div(nvec, cv) > free_slots) cv *= 2;
    cv = std::min(cv, threads);
    if (c.row_blocks + ceil_div(nvec, cv) > slots) continue;
    c.design = static_cast<int>(BwdDesign::kColumnGrads);
    c.col_vecs = cv;
    c.col_ctas = ceil_div(nvec, cv);
    c.key.flags = (c.key.flags & ~kDirectGrads) | kColumnGrads;
    c.smem = std::max(c.smem, size_t(2) * threads * c.key.vec * sizeof(float));
    out.push_back(c);
  }
}

void split_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out) {
  const int vec = p.vec();
  const int64_t nvec = p.nvec();
  for (int rows_in_flight : {4, 8, 16}) {
    Candidate c;
    c.design = static_cast<int>(BwdDesign::kSplitRow);
    c.knobs.vecs_per_thread = rows_in_flight;
    c.knobs.cta_threads = static_cast<int>(std::min<int64_t>(kSplitColThreads, pow2_ceil(nvec)));
    c.knobs.blocks_per_sm = 2;
    c.row_blocks = p.rows;
    c.regs = 40 + rows_in_flight * vec * p.esize() * (w.dh ? 3 : 2) / 4 + vec * w.accums();
    if (c.regs > regs_at(c.knobs.cta_threads, c.knobs.blocks_per_sm)) continue;  // would spill
    jit::KernelKey& k = c.key;
    k = norm_key(p, split_cols_family(p.kind), gpu.arch);
    k.threads_per_row = static_cast<int16_t>(c.knobs.cta_threads);
    k.vecs_per_thread = static_cast<int16_t>(rows_in_flight);
    k.flags = grad_flags(p, w) | kStreamStore;
    k.variant = 2;
    out.push_back(c);
  }
}

}  // namespace

jit::KernelKey split_coef_key(const NormProblem& p, int arch) {
  jit::KernelKey c = norm_key(p, split_coef_family(p.kind), arch);
  const int64_t nvec = p.nvec();
  const int tpr = threads_per_row(nvec, kSplitCoefVecs);
  c.threads_per_row = static_cast<int16_t>(tpr);
  c.vecs_per_thread = static_cast<int16_t>(std::min<int64_t>(kSplitCoefVecs, ceil_div(nvec, tpr)));
  c.flags = (p.has_weight ? kHasWeight : 0u) | (p.zero_centered ? kZeroCentered : 0u) |
            (p.single_stride ? kSingleStride : 0u);
  c.variant = 1;
  return c;
}

void bwd_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out, bool every) {
  row_candidates(p, w, gpu, 1, out);
  // Slicing pays an exchange a row block: only for rows one CTA cannot hold,
  // or for fewer rows than SMs (more SMs then load each row); `every` (a
  // forced design) considers every feasible design.
  if (every || out.empty() || p.rows < gpu.sm_count) sliced_candidates(p, w, gpu, out);
  column_candidates(p, w, gpu, out);
  split_candidates(p, w, gpu, out);
}

}  // namespace rtcnorm
