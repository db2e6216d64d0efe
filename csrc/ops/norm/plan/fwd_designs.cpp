// The forward designs' candidates (flag words: kernels/common/params.cuh).
#include <algorithm>

#include "kernels/common/quant_math.cuh"
#include "ops/norm/kernel_families.h"
#include "ops/norm/plan/designs.h"

namespace rtcnorm {
namespace {

constexpr int kVecChoices[] = {1, 2, 4, 8, 16, 32, 64};  // vectors a thread aims at
constexpr int kRegisterRowBytes = 128;                   // row bytes a thread holds in registers (32 registers)
constexpr int kMinThreadsPerRow = 4;                     // fewer: a warp's stores scatter over 16+ rows
constexpr int kChunkVecs = 8;                 // vectors a thread streams a chunk where no design holds the row
constexpr int64_t kMinSliceBytes = 8 * 1024;  // narrower slices leave the exchange unpaid
constexpr int kDeferredStages = 3;            // a deferred-statistics ring

unsigned fwd_flags(const NormProblem& p) {
  return base_flags(p) | (p.has_bias ? kHasBias : 0u) | (p.residual ? kResidual : 0u) | p.quant;
}
// A quantized output's conditions (docs/designs.md).
bool carries_epilogue(const NormProblem& p, const Candidate& c) {
  if (p.quant == 0) return true;
  if (c.knobs.slices > 1 || c.key.cluster > 1) return false;
  const int block = quant::block_of(p.recipe());
  return block == 0 || p.hidden <= block || c.key.threads_per_row >= block / c.key.vec;
}

// Inputs of kL1AllocMinInputBytes or more read through L1; outputs past L2 stored evict-first.
unsigned memory_flags(const NormProblem& p) {
  const int64_t bytes = p.rows * p.row_bytes();
  return (bytes >= kL1AllocMinInputBytes ? kL1Allocate : 0u) | (bytes >= (int64_t(64) << 20) ? kStreamStore : 0u);
}
unsigned affine_flags(const NormProblem& p, int nv, int64_t row_blocks, const Gpu& gpu) {
  if (p.affine_tensors() == 0) return 0u;
  return nv <= 2 ? kPreloadAffine : row_blocks <= gpu.sm_count ? kPrefetchAffine : 0u;
}
bool mode_allows(NormMode mode, bool persistent, bool cached) {
  return mode == NormMode::kAuto ||
         (mode == NormMode::kStaticPersistent ? persistent
                                              : !persistent && cached == (mode == NormMode::kMultiWaveCached));
}
void register_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, int slices, std::vector<Candidate>& out) {
  for (int nv_target : kVecChoices) {
    if (nv_target > 1 && nv_target / 2 >= p.nvec() / slices) break;
    for (int cta : kCtaChoices) {
      const Layout l = layout_of(p, p.hidden / slices, nv_target, cta);
      // A register holds at most 4 bytes of the row; a lone 16-bit element one.
      const int raw = l.nv * static_cast<int>(ceil_div(l.vec * p.esize(), 4));
      if (raw * 4 > kRegisterRowBytes || (l.tpr < kMinThreadsPerRow && p.nvec() >= kMinThreadsPerRow)) continue;
      if (l.tpr > cta && cta != kCtaChoices[0]) continue;  // one shape of a CTA wider than asked
      const unsigned aff = affine_flags(p, l.nv, l.row_blocks, gpu);
      const int scalar = p.vec() == 1 ? raw : 0, layer = p.kind == kLayerNorm ? (slices > 1 ? 2 * raw : raw) : 0;
      const int regs = 24 + raw + raw / 4 + layer + (p.residual ? raw : 0) +
                       (aff == kPreloadAffine ? raw * p.wsize() / p.esize() * p.affine_tensors() : 0) + scalar +
                       (p.quant != 0 ? 8 + scalar : 0);
      const int blocks = blocks_leaving(l.threads, std::max(1, 2048 / l.threads), regs);
      if (regs_at(l.threads, blocks) < regs) continue;  // would spill
      for (bool persistent : {false, true}) {
        if (!mode_allows(mode, persistent, true)) continue;
        const bool keep_gamma = persistent && slices == 1 && l.nv * l.vec * p.affine_tensors() <= 16;
        const unsigned flags = fwd_flags(p) | kCachedRow | memory_flags(p) |
                               (p.kind == kLayerNorm ? kTwoPassStats : 0u) | (keep_gamma ? kKeepGamma : aff) |
                               (persistent ? kPrefetchNext : 0u);
        const int d = int(slices > 1 ? FwdDesign::kSlicedRow : FwdDesign::kRegisterRow);
        Candidate& c = add_candidate(out, p, d, fwd_family(p.kind), l, l.nv, blocks, regs, flags, gpu.arch);
        c.knobs.persistent = persistent;
        c.knobs.slices = slices;
      }
    }
  }
}

// Register rows split over 2-16 CTAs; persistent slices may meet in global memory, deferring statistics.
void sliced_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  if (gpu.arch < 90) return;
  for (int s = 2; s <= gpu.max_cluster(); s *= 2) {
    if (p.nvec() % s != 0 || p.row_bytes() / s < kMinSliceBytes) continue;
    const size_t first = out.size();
    register_rows(p, mode, gpu, s, out);
    for (size_t i = first, n = out.size(); i < n; ++i) {
      Candidate& c = out[i];
      slice(c, s);
      c.key.flags &= ~(kL1Allocate | kTwoPassStats);
      if (!c.knobs.persistent || c.key.threads_per_row % 32 != 0) continue;
      const Candidate g = grid_exchange(c);
      out.push_back(g);
      const int64_t stage = int64_t(g.key.rows_per_cta) * (p.hidden / s) * p.esize();
      if (p.residual || g.key.vec * p.esize() != 16 || kDeferredStages * stage > gpu.smem_per_cta()) continue;
      Candidate d = g;
      d.knobs.ring_stages = kDeferredStages;
      d.key.flags &= ~(kPrefetchNext | kKeepGamma | kPreloadAffine | kPrefetchAffine);
      d.key.flags |= kStagedRow | kDeferStats | kStreamStore | (unsigned(kDeferredStages - 2) << kRingExtraShift);
      d.smem = static_cast<size_t>(kDeferredStages * stage);
      d.knobs.blocks_per_sm = fit_smem(d.knobs.blocks_per_sm, d.smem, gpu.smem_per_cta());
      d.key.variant = static_cast<int16_t>(d.knobs.blocks_per_sm);
      out.push_back(d);
    }
  }
}

// A row streamed in chunks of `nv` vectors a thread (held in `smem`, or read twice).
Candidate& chunked_row(const NormProblem& p, const Gpu& gpu, FwdDesign d, const Layout& l, int nv, unsigned flags,
                       int64_t smem, std::vector<Candidate>& out) {
  const int regs = 32 + nv * l.vec * p.esize() / 2;
  const int blocks = fit_smem(blocks_leaving(l.threads, std::min(4, 2048 / l.threads), regs), smem, gpu.smem_per_cta());
  Candidate& c = add_candidate(out, p, int(d), fwd_family(p.kind), l, nv, blocks, regs, fwd_flags(p) | flags, gpu.arch);
  c.smem = static_cast<size_t>(smem);
  return c;
}
void smem_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  for (int nv_target : {4, 8, 16}) {
    for (int cta : {256, 512}) {
      const Layout l = layout_of(p, p.hidden, nv_target, cta);
      const int64_t smem = int64_t(l.rows) * p.row_bytes();
      const int nv = std::min(l.nv, nv_target);
      if (smem <= gpu.smem_per_cta() && mode_allows(mode, false, true))
        chunked_row(p, gpu, FwdDesign::kSmemRow, l, nv,
                    kSmemRow | memory_flags(p) | affine_flags(p, nv, l.row_blocks, gpu), smem, out);
    }
  }
}
void reload_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  const Layout l = layout_of(p, p.hidden, kChunkVecs, 256);
  for (bool persistent : {false, true})
    if (mode_allows(mode, persistent, false))
      chunked_row(p, gpu, FwdDesign::kReloadRow, l, std::min(l.nv, kChunkVecs), memory_flags(p) & ~kL1Allocate, 0, out)
          .knobs.persistent = persistent;
}

// flat_row: a thread holds up to 32 elements, a register each (4 bytes) with its
// gamma / beta, LayerNorm's centred value and the residual's operand and sum.
void flat_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  if (!flat_worth(p, true) || p.quant != 0 || !mode_allows(mode, true, true)) return;
  const int per_elem = 1 + p.affine_tensors() + (p.kind == kLayerNorm ? 1 : 0) + (p.residual ? 2 : 0);
  for (int elems : {2, 4, 8, 16, 32})
    for (int cta : kCtaChoices) {
      const Layout l = layout_of(p, p.hidden, std::max(1, elems / p.vec()), cta);
      const int64_t buffers = kFlatStages * (p.residual ? 2 : 1);
      add_flat(out, p, int(FwdDesign::kFlatRow), fwd_flat_family(p.kind), l, elems, cta, 40 + l.nv * l.vec * per_elem,
               buffers * flat_buffer_elems(l.rows, int(p.hidden), p.esize()) * p.esize(),
               fwd_flags(p) | (memory_flags(p) & kStreamStore), gpu);
    }
}

}  // namespace

void fwd_candidates(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out, bool every) {
  register_rows(p, mode, gpu, 1, out);
  // Unless `every`: shared-memory rows if registers cannot hold a row; slices also for fewer rows than SMs.
  const bool held = !out.empty();
  if (every || !held || p.residual) smem_rows(p, mode, gpu, out);
  if (!p.residual && p.quant == 0 && mode != NormMode::kMultiWaveReload && (every || !held || p.rows < gpu.sm_count))
    sliced_rows(p, mode, gpu, out);
  reload_rows(p, mode, gpu, out);
  flat_rows(p, mode, gpu, out);
  out.erase(std::remove_if(out.begin(), out.end(), [&](const Candidate& c) { return !carries_epilogue(p, c); }),
            out.end());
}

}  // namespace rtcnorm
