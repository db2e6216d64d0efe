// The forward designs: feasibility, knob candidates, resources and lowering
// to a kernel key (the kernel template's flag word, kernels/common/params.cuh).
#include <algorithm>

#include "kernels/common/quant_math.cuh"
#include "ops/norm/kernel_families.h"
#include "ops/norm/plan/designs.h"

namespace rtcnorm {
namespace {

// Row bytes a thread may hold in registers: 64 16-bit or 32 fp32 values
// (32 registers).
constexpr int kRegisterRowBytes = 128;
constexpr int kMinThreadsPerRow = 4;
// Vectors a thread streams per chunk where the row is not held in registers.
constexpr int kChunkVecs = 8;
// Slices of a row are at least this many bytes: narrower slices leave each
// CTA too little to load for the cluster exchange to pay.
constexpr int64_t kMinSliceBytes = 8 * 1024;
// The stages of a deferred-statistics ring (a slice's next rows in flight).
constexpr int kDeferredStages = 3;

unsigned feature_flags(const NormProblem& p) {
  return (p.has_weight ? kHasWeight : 0u) | (p.has_bias ? kHasBias : 0u) | (p.zero_centered ? kZeroCentered : 0u) |
         (p.residual ? kResidual : 0u) | (p.single_stride ? kSingleStride : 0u) | p.quant;
}

// A quantized output (norm/quant_epilogue.cuh) needs its row in one CTA
// (no slices), and a block scale's vectors on adjacent lanes of one row
// group, unless the row is a single block.
bool carries_epilogue(const NormProblem& p, const Candidate& c) {
  if (p.quant == 0) return true;
  if (c.knobs.slices > 1 || c.key.cluster > 1) return false;
  const int block = quant::block_of(p.recipe());
  return block == 0 || p.hidden <= block || c.key.threads_per_row >= block / c.key.vec;
}

// Registers a thread of a register row needs: the row as stored, the
// residual's operand while h is formed, gamma / beta packs where they are
// loaded beside x, LayerNorm's centred values (or a slice's merged
// moments), and about 24 for addresses, sums and indices (ptxas, sm_90: bf16
// rows of 32 / 64 / 128 bytes a thread take 55 / 64 / 72 in RMSNorm;
// LayerNorm spills 156 bytes at 72, and a slice of it 84 at 80).
int fwd_row_regs(const NormProblem& p, int raw, bool preload, bool sliced) {
  const int affine = preload ? raw * p.wsize() / p.esize() * p.affine_tensors() : 0;
  // LayerNorm: two passes over the held row, or (slices) merged moments.
  const int layer = p.kind == kLayerNorm ? (sliced ? 2 * raw : raw) : 0;
  // Rows of scalar accesses (N odd) keep a predicate and an address term an
  // element; a quantized output needs its codes, block amax and scale, and
  // a scalar row's per-element shuffles besides.
  const int scalar = p.vec() == 1 ? raw : 0;
  const int quant = p.quant != 0 ? 8 + scalar : 0;
  return 24 + raw + raw / 4 + layer + (p.residual ? raw : 0) + affine + scalar + quant;
}

struct Layout {
  int vec = 1, tpr = 1, rows = 1, nv = 1, threads = 1;
  int64_t row_blocks = 0;
};

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

jit::KernelKey key_of(const NormProblem& p, const Layout& l, int nv, unsigned flags, int blocks, int arch) {
  jit::KernelKey k = norm_key(p, fwd_family(p.kind), arch);
  k.threads_per_row = static_cast<int16_t>(l.tpr);
  k.rows_per_cta = static_cast<int16_t>(l.rows);
  k.vecs_per_thread = static_cast<int16_t>(nv);
  k.flags = feature_flags(p) | flags;
  k.variant = static_cast<int16_t>(std::max(1, std::min(blocks, 2048 / l.threads)));
  return k;
}

// Load and store hints every cached design shares: inputs of 40 MB or more
// read through L1; outputs past L2 stored evict-first.
unsigned memory_flags(const NormProblem& p) {
  const int64_t bytes = p.rows * p.row_bytes();
  return (bytes >= kL1AllocMinInputBytes ? kL1Allocate : 0u) | (bytes >= (int64_t(64) << 20) ? kStreamStore : 0u);
}

// LayerNorm statistics of a row held in registers: two passes over it (the
// mean, then squared deviations); merging (count, mean, M2) in one pass ran
// at half the bandwidth on rows of more than two warps (H200).
bool two_pass_stats(const NormProblem& p) { return p.kind == kLayerNorm; }

// gamma / beta: loaded into registers beside x where a thread holds at most
// two vectors, else prefetched into L1 beside the row where CTAs are few.
unsigned affine_flags(const NormProblem& p, int nv, int64_t row_blocks, const Gpu& gpu) {
  if (p.affine_tensors() == 0) return 0u;
  if (nv <= 2) return kPreloadAffine;
  return row_blocks <= gpu.sm_count ? kPrefetchAffine : 0u;
}

bool mode_allows(NormMode mode, bool persistent, bool cached) {
  switch (mode) {
    case NormMode::kAuto:
      return true;
    case NormMode::kStaticPersistent:
      return persistent;
    case NormMode::kMultiWaveReload:
      return !cached && !persistent;
    case NormMode::kMultiWaveCached:
      return cached && !persistent;
  }
  return false;
}

constexpr int kVecChoices[] = {1, 2, 4, 8, 16, 32, 64};
constexpr int kCtaChoices[] = {128, 256, 512, 1024};

void register_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, int slices, std::vector<Candidate>& out) {
  const int64_t hidden = p.hidden / slices;
  for (int nv_target : kVecChoices) {
    if (nv_target > 1 && nv_target / 2 >= p.nvec() / slices) break;
    for (int cta : kCtaChoices) {
      const Layout l = layout_of(p, hidden, nv_target, cta);
      // A register holds at most 4 bytes of the row, and a lone 16-bit
      // element (N odd) takes one to itself.
      const int raw = l.nv * static_cast<int>(ceil_div(l.vec * p.esize(), 4));
      // A row keeps at least 4 threads: with fewer, a warp's stores scatter
      // over 16+ rows (N = 64 and 128 at 2 threads ran at 36-87% of the best).
      if (raw * 4 > kRegisterRowBytes || (l.tpr < kMinThreadsPerRow && p.nvec() >= kMinThreadsPerRow)) continue;
      if (l.tpr > cta && cta != kCtaChoices[0]) continue;  // one shape of a CTA wider than asked
      for (bool persistent : {false, true}) {
        if (!mode_allows(mode, persistent, true)) continue;
        Candidate c;
        c.design = static_cast<int>(slices > 1 ? FwdDesign::kSlicedRow : FwdDesign::kRegisterRow);
        const unsigned aff = affine_flags(p, l.nv, l.row_blocks, gpu);
        c.regs = fwd_row_regs(p, raw, aff == kPreloadAffine, slices > 1);
        const int blocks = blocks_leaving(l.threads, std::max(1, 2048 / l.threads), c.regs);
        if (regs_at(l.threads, blocks) < c.regs) continue;  // would spill
        const bool keep_gamma = persistent && slices == 1 && l.nv * l.vec * p.affine_tensors() <= 16;
        unsigned flags = kCachedRow | memory_flags(p) | (two_pass_stats(p) ? kTwoPassStats : 0u) |
                         (keep_gamma ? kKeepGamma : aff) | (persistent ? kPrefetchNext : 0u);
        c.knobs.vecs_per_thread = l.nv;
        c.knobs.cta_threads = l.threads;
        c.knobs.blocks_per_sm = blocks;
        c.knobs.persistent = persistent;
        c.knobs.slices = slices;
        c.row_blocks = l.row_blocks;
        c.key = key_of(p, l, l.nv, flags, blocks, gpu.arch);
        out.push_back(c);
      }
    }
  }
}

// A row split over `slices` CTAs: a thread-block cluster (distributed shared
// memory) or consecutive CTAs of a persistent cooperative launch (global
// memory exchange, any SM); either may stage the slices through a ring and
// collect the row's statistics one row block late (deferred).
void sliced_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  if (gpu.arch < 90) return;
  for (int s = 2; s <= gpu.max_cluster(); s *= 2) {
    if (p.nvec() % s != 0 || p.row_bytes() / s < kMinSliceBytes) continue;
    const size_t first = out.size();
    register_rows(p, mode, gpu, s, out);
    for (size_t i = first, n = out.size(); i < n; ++i) {
      Candidate& c = out[i];
      c.key.cluster = static_cast<int16_t>(s);
      c.key.flags |= s == 16 ? kCluster16 : log2_of_pow2(s) << kClusterShift;
      c.key.flags &= ~(kL1Allocate | kTwoPassStats);
      // The exchange through global memory needs whole warps a slice's row and a persistent grid.
      if (c.knobs.persistent && c.key.threads_per_row % 32 == 0) {
        Candidate g = c;
        g.knobs.grid_exchange = true;
        g.key.flags |= kGridExchange;
        g.key.cluster = 1;
        out.push_back(g);
        // Deferred statistics: 16-byte vectors, no residual, the ring in shared memory.
        const int64_t stage = int64_t(g.key.rows_per_cta) * (p.hidden / s) * p.esize();
        if (!p.residual && g.key.vec * p.esize() == 16 && kDeferredStages * stage <= gpu.smem_per_cta()) {
          Candidate d = g;
          d.knobs.ring_stages = kDeferredStages;
          d.key.flags &= ~(kPrefetchNext | kKeepGamma | kPreloadAffine | kPrefetchAffine);
          d.key.flags |= kStagedRow | kDeferStats | kStreamStore | (unsigned(kDeferredStages - 2) << kRingExtraShift);
          d.smem = static_cast<size_t>(kDeferredStages * stage);
          d.knobs.blocks_per_sm =
              std::max<int>(1, std::min<int64_t>(d.knobs.blocks_per_sm, gpu.smem_per_cta() / (int64_t)d.smem));
          d.key.variant = static_cast<int16_t>(d.knobs.blocks_per_sm);
          out.push_back(d);
        }
      }
    }
  }
}

// Rows too long for one CTA's registers (or beside a residual, whose operand
// crowds the registers) held in shared memory.
void smem_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  if (!mode_allows(mode, false, true)) return;
  for (int nv_target : {4, 8, 16}) {
    for (int cta : {256, 512}) {
      const Layout l = layout_of(p, p.hidden, nv_target, cta);
      const int64_t smem = int64_t(l.rows) * p.row_bytes();
      if (smem > gpu.smem_per_cta()) continue;
      Candidate c;
      c.design = static_cast<int>(FwdDesign::kSmemRow);
      const int nv = std::min(l.nv, nv_target);
      c.regs = 32 + nv * l.vec * p.esize() / 2;
      int blocks = blocks_leaving(l.threads, std::min(4, 2048 / l.threads), c.regs);
      blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, gpu.smem_per_cta() / smem)));
      c.knobs.vecs_per_thread = nv;
      c.knobs.cta_threads = l.threads;
      c.knobs.blocks_per_sm = blocks;
      c.row_blocks = l.row_blocks;
      c.smem = static_cast<size_t>(smem);
      c.key = key_of(p, l, nv, kSmemRow | memory_flags(p) | affine_flags(p, nv, l.row_blocks, gpu), blocks, gpu.arch);
      out.push_back(c);
    }
  }
}

void reload_rows(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out) {
  for (bool persistent : {false, true}) {
    if (!mode_allows(mode, persistent, false)) continue;
    const Layout l = layout_of(p, p.hidden, kChunkVecs, 256);
    Candidate c;
    c.design = static_cast<int>(FwdDesign::kReloadRow);
    const int nv = std::min(l.nv, kChunkVecs);
    c.regs = 32 + nv * l.vec * p.esize() / 2;
    const int blocks = blocks_leaving(l.threads, std::min(4, 2048 / l.threads), c.regs);
    c.knobs.vecs_per_thread = nv;
    c.knobs.cta_threads = l.threads;
    c.knobs.blocks_per_sm = blocks;
    c.knobs.persistent = persistent;
    c.row_blocks = l.row_blocks;
    c.key = key_of(p, l, nv, memory_flags(p) & ~kL1Allocate, blocks, gpu.arch);
    out.push_back(c);
  }
}

}  // namespace

void fwd_candidates(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out, bool every) {
  register_rows(p, mode, gpu, 1, out);
  // Slicing pays an exchange a row block: only for rows one CTA cannot hold,
  // or for fewer rows than SMs (more SMs then load each row).
  const bool held = !out.empty();
  // Shared-memory rows only where registers cannot hold the row, or beside
  // a residual (its operand crowds the registers); `every` (a forced
  // design) considers every feasible design.
  if (every || !held || p.residual) smem_rows(p, mode, gpu, out);
  if (!p.residual && p.quant == 0 && mode != NormMode::kMultiWaveReload && (every || !held || p.rows < gpu.sm_count))
    sliced_rows(p, mode, gpu, out);
  reload_rows(p, mode, gpu, out);
  out.erase(std::remove_if(out.begin(), out.end(), [&](const Candidate& c) { return !carries_epilogue(p, c); }),
            out.end());
}

}  // namespace rtcnorm
