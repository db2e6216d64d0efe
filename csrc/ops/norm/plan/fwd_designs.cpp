// The forward designs' candidates (flag words: kernels/common/params.cuh).
#include <algorithm>

#include "kernels/common/quant_math.cuh"
#include "ops/norm/kernel_families.h"
#include "ops/norm/plan/designs.h"

namespace rtcnorm {
namespace {

constexpr int kRegisterRowBytes = 128;        // row bytes a thread holds in registers (32 registers)
constexpr int kMinThreadsPerRow = 4;          // fewer: a warp's stores scatter over 16+ rows
constexpr int kChunkVecs = 8;                 // vectors a thread streams a chunk where no design holds the row
constexpr int64_t kMinSliceBytes = 8 * 1024;  // narrower slices leave the exchange unpaid
constexpr int kDeferredStages = 3;            // a deferred-statistics ring

// Inputs of kL1AllocMinInputBytes or more read through L1; outputs past L2 stored evict-first.
unsigned memory_flags(const NormProblem& p) {
  const int64_t bytes = p.rows * p.row_bytes();
  return (bytes >= kL1AllocMinInputBytes ? kL1Allocate : 0u) | (bytes >= (int64_t(64) << 20) ? kStreamStore : 0u);
}
unsigned affine_flags(const NormProblem& p, int nv, int64_t row_blocks, const Gpu& gpu) {
  return p.affine_tensors() == 0 ? 0u : nv <= 2 ? kPreloadAffine : row_blocks <= gpu.sm_count ? kPrefetchAffine : 0u;
}
bool mode_allows(NormMode mode, bool persistent, bool cached) {
  if (mode == NormMode::kStaticPersistent) return persistent;
  return mode == NormMode::kAuto || (!persistent && cached == (mode == NormMode::kMultiWaveCached));
}
// Rows (or slices) held in registers, a thread aiming at 1 - 64 vectors (under twice the row's).
void register_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, int slices, std::vector<Candidate>& out) {
  const int d = int(slices > 1 ? FwdDesign::kSlicedRow : FwdDesign::kRegisterRow);
  each_layout(p, slices, {1, 2, 4, 8, 16, 32, 64}, [&](const Layout& l, int nv_target) {
    if (nv_target > 1 && nv_target / 2 >= p.nvec() / slices) return;
    // A register holds at most 4 bytes of the row; a lone 16-bit element one.
    const int raw = l.nv * static_cast<int>(ceil_div(p.vec() * p.esize(), 4));
    if (raw * 4 > kRegisterRowBytes || (l.tpr < kMinThreadsPerRow && p.nvec() >= kMinThreadsPerRow)) return;
    const unsigned aff = affine_flags(p, l.nv, l.row_blocks, gpu);
    const int scalar = p.vec() == 1 ? raw : 0, layer = p.kind == kLayerNorm ? (slices > 1 ? 2 * raw : raw) : 0;
    const int bounds = p.nvec() % slices != 0 ? l.nv : 0;  // unequal slices: a vector's own bound test
    const int regs = 24 + raw + raw / 4 + layer + (p.residual ? raw : 0) + bounds +
                     (aff == kPreloadAffine ? raw * p.wsize() / p.esize() * p.affine_tensors() : 0) + scalar +
                     (p.quant != 0 ? 8 + scalar : 0);
    const int blocks = blocks_leaving(l.threads, std::max(1, 2048 / l.threads), regs);
    if (regs_at(l.threads, blocks) < regs) return;  // would spill
    for (bool persistent : {false, true}) {
      if (!mode_allows(mode, persistent, true)) continue;
      const bool keep_gamma = persistent && slices == 1 && l.nv * p.vec() * p.affine_tensors() <= 16;
      const unsigned flags = p.fwd_flags() | kCachedRow | memory_flags(p) |
                             (p.kind == kLayerNorm ? kTwoPassStats : 0u) | (keep_gamma ? kKeepGamma : aff) |
                             (persistent ? kPrefetchNext : 0u);
      Candidate& c = add_candidate(out, p, d, fwd_family(p.kind), l, l.nv, blocks, regs, flags, gpu.arch);
      c.knobs.persistent = persistent;
    }
  });
}

// Register rows split over 2-16 CTAs (sm_90+, can_slice); persistent slices may meet in global memory, deferring
// statistics (equal slices only).
void sliced_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  for (int s = 2; s <= max_cluster_ctas(gpu.arch); s *= 2) {
    const bool even = p.nvec() % s == 0;
    if (!can_slice(p, s) || p.row_bytes() / s < kMinSliceBytes) continue;
    const size_t first = out.size();
    register_rows(p, mode, gpu, s, out);
    for (size_t i = first, n = out.size(); i < n; ++i) {
      Candidate& c = out[i];
      c.key.flags &= ~(kL1Allocate | kTwoPassStats | (even ? 0u : kPrefetchNext | kPrefetchAffine));
      if (!c.knobs.persistent || c.key.threads_per_row % 32 != 0) continue;
      const Candidate g = grid_exchange(c);  // `c` dangles once `out` grows
      out.push_back(g);
      const int64_t stage = int64_t(g.key.rows_per_cta) * (p.hidden / s) * p.esize();
      if (!even || p.residual || g.key.vec * p.esize() != 16 || kDeferredStages * stage > gpu.smem_per_cta()) continue;
      Candidate& d = out.emplace_back(g);
      d.knobs.ring_stages = kDeferredStages;
      d.key.flags &= ~(kPrefetchNext | kKeepGamma | kPreloadAffine | kPrefetchAffine);
      d.key.flags |= kStagedRow | kDeferStats | kStreamStore | (unsigned(kDeferredStages - 2) << kRingExtraShift);
      d.smem = static_cast<size_t>(kDeferredStages * stage);
      d.knobs.blocks_per_sm = fit_smem(d.knobs.blocks_per_sm, d.smem, gpu.smem_per_cta());
      d.key.variant = static_cast<int16_t>(d.knobs.blocks_per_sm);
    }
  }
}

// A row streamed in chunks of up to `nv_target` vectors a thread: the CTA's rows held in shared memory (`in_smem`:
// smem_row, where they fit), else read twice (reload_row).
void chunked_row(const NormProblem& p, NormMode mode, const Gpu& gpu, bool in_smem, int nv_target, int cta,
                 bool persistent, std::vector<Candidate>& out) {
  const Layout l = layout_of(p, 1, nv_target, cta);
  const int nv = std::min(l.nv, nv_target), regs = 32 + nv * p.vec() * p.esize() / 2;
  const int64_t smem = in_smem ? int64_t(l.rows) * p.row_bytes() : 0;
  if (smem > gpu.smem_per_cta() || !mode_allows(mode, persistent, in_smem)) return;
  const unsigned flags = p.fwd_flags() | (in_smem ? kSmemRow | memory_flags(p) | affine_flags(p, nv, l.row_blocks, gpu)
                                                  : memory_flags(p) & ~kL1Allocate);
  const int blocks = fit_smem(blocks_leaving(l.threads, std::min(4, 2048 / l.threads), regs), smem, gpu.smem_per_cta());
  const auto d = in_smem ? FwdDesign::kSmemRow : FwdDesign::kReloadRow;
  Candidate& c = add_candidate(out, p, int(d), fwd_family(p.kind), l, nv, blocks, regs, flags, gpu.arch);
  c.smem = static_cast<size_t>(smem);
  c.knobs.persistent = persistent;
}

// flat_row: a thread holds up to 32 elements, 4 bytes each with gamma / beta, LayerNorm's centred value, the residual's
// operand and sum (+ a quantized epilogue's share); a row no layout holds: one a CTA, read in chunks of 16 a thread.
void flat_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  if (!flat_worth(p, true) || !mode_allows(mode, true, true)) return;
  const int v = p.vec();
  const size_t first = out.size();
  const auto add = [&](const Layout& l, int nv, bool chunked) {
    const int per_elem = chunked ? 1 + p.residual : 1 + 2 * p.residual + p.affine_tensors() + (p.kind == kLayerNorm);
    add_flat(out, p, int(FwdDesign::kFlatRow), fwd_flat_family(p.kind), l, nv,
             40 + l.nv * v * per_elem + (p.quant != 0 ? 8 + (v == 1 ? (chunked ? 32 : l.nv) : 0) : 0),
             p.residual ? 2 : 1, 0, p.fwd_flags() | (memory_flags(p) & kStreamStore), gpu);
  };
  each_layout(p, 1, {2 / v, 4 / v, 8 / v, 16 / v, 32 / v}, [&](const Layout& l, int nv) {
    if (l.nv <= nv) add(l, nv, false);
  });
  if (out.size() > first) return;  // a layout in registers holds the row
  for (int t : {1024, 512, 256})
    if (int64_t{t} * 16 / v < p.nvec()) add(Layout{t, 1, 16 / v, t, 1, p.rows}, 16 / v, true);
}

}  // namespace

void fwd_candidates(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out, bool every) {
  register_rows(p, mode, gpu, 1, out);
  // Unless `every`: shared-memory rows if registers cannot hold a row; slices also for fewer rows than SMs.
  const bool held = !out.empty();
  if (every || !held || p.residual)
    for (int nv_target : {4, 8, 16})
      for (int cta : {256, 512}) chunked_row(p, mode, gpu, true, nv_target, cta, false, out);
  if (!p.residual && p.quant == 0 && (every || !held || p.rows < gpu.sm_count)) sliced_rows(p, mode, gpu, out);
  for (bool persistent : {false, true}) chunked_row(p, mode, gpu, false, kChunkVecs, 256, persistent, out);
  flat_rows(p, mode, gpu, out);
  // A quantized output: a block scale's vectors on adjacent lanes of one row group, unless a row is one block.
  const int block = p.quant != 0 ? quant::block_of(p.recipe()) : 0;
  const auto splits_block = [&](const Candidate& c) { return c.key.threads_per_row < block / c.key.vec; };
  if (block > 0 && p.hidden > block) out.erase(std::remove_if(out.begin(), out.end(), splits_block), out.end());
}

}  // namespace rtcnorm
