#include "ops/softmax/plan/designs.h"

#include <algorithm>

#include "kernels/common/params.cuh"
#include "ops/plan_util.h"
#include "ops/softmax/kernels.h"

namespace rtcnorm {

SoftmaxArch::SoftmaxArch(int a, int sms)
    : arch(a), sm_count(sms), smem_bytes(max_smem_per_block(a)), clusters(a >= 90) {}

namespace {

using jit::KernelKey;

// Register budgets for the raw row data a thread holds (x; or y and dy), in
// 32-bit registers. Launch bounds hold every kernel to 64 registers
// (kResidentThreads); ptxas needs the rest for addresses, exp and the
// reduction. A row is split for the target and may grow to the maximum
// before adding threads.
constexpr int kTargetRegs = 16;  // 64 bytes in flight per thread: enough for HBM
constexpr int kMaxRegs = 32;
constexpr int kFewRowsFwdRegs = 8;  // a lone CTA per SM: its time is one thread's serial chain
constexpr int kResidentThreads = 1024;
constexpr int kMaxCachedThreads = 1024;
// Rows shorter than a CTA share one, forward and backward (docs/history.md
// entry 89: 256-thread backward CTAs beat 512 by 2-5% on H200).
constexpr int kCtaThreads = 256;
constexpr int kBwdShortVecs = 256;  // backward rows of up to this many 16-byte vectors: one pair a thread
constexpr int kWarp = 32;           // up to kMaxRegs a thread, a warp per row needs no barriers
constexpr int kKeepExpElems = 16;   // cached forward rows keep exp2(z - m) up to this many elements a thread
constexpr int kStreamRegs = 8;      // streamed chunks stay small: two are live at once
constexpr int kStreamThreads = 512;
constexpr int kStreamCtasPerSm = 2;  // streamed rows in flight stay well inside L2
// Masked forward with a broadcast mask: from this many keys the heads'
// re-reads of a mask row miss L2, so rows sharing it run back to back, a
// CTA each of at least kLongMaskedThreads (docs/history.md).
constexpr int64_t kLongMaskedCols = 4096;
constexpr int kLongMaskedThreads = 128;
// Mask reuse: runs of kReuseRun rows from kReuseCols keys, keeping at least
// kReuseBlocks row blocks in the grid (docs/history.md).
constexpr int64_t kReuseRun = 4, kReuseCols = 2048, kReuseBlocks = 2048;
// Row clusters: at most an eighth as many rows as SMs, rows of
// kMinClusterRowVecs vectors or more, slices of kMinClusterSliceVecs or
// more (docs/history.md entry 49).
constexpr int kMaxRowCluster = 8;
constexpr int64_t kMinClusterRowVecs = 4096, kMinClusterSliceVecs = 256;
// Many rows: a row split over a cluster leaves at least this many CTAs on an
// SM (docs/history.md entry 89: 1024x65536 forward 100.5 us unsplit, 88.5 in
// CTAs of 512 threads, 79.6 in CTAs of 256).
constexpr int kClusterResident = 4;

// Per-problem register arithmetic shared by the designs.
struct RowBudget {
  int vec, tensors, regs_per_vec, target_nv, max_nv;
  int64_t nvec;
};

RowBudget row_budget(const SoftmaxProblem& p, bool few_rows) {
  RowBudget b;
  const bool bwd = p.backward;
  const int esize = jit::element_size(p.dtype);
  b.vec = softmax_vec(p);
  b.tensors = bwd ? 2 : 1;
  b.regs_per_vec = b.tensors * std::max(1, b.vec * esize / 4);
  b.nvec = p.cols / b.vec;
  const bool full_bwd = bwd && p.kernel_kind() != kSoftmaxCausal;  // causal rows keep the forward's shape
  const bool bwd_short = full_bwd && b.vec * esize == 16 && b.nvec <= kBwdShortVecs;
  const int target_regs = bwd_short ? b.regs_per_vec : (few_rows && !bwd ? kFewRowsFwdRegs : kTargetRegs);
  const int max_regs = std::max(target_regs, bwd_short ? b.regs_per_vec : kMaxRegs);
  // Forward rows of single elements spill past 8 a thread.
  b.max_nv = std::min(std::max(1, max_regs / b.regs_per_vec), !bwd && b.vec == 1 ? 8 : 32);
  b.target_nv = std::min(b.max_nv, std::max(1, target_regs / b.regs_per_vec));
  return b;
}

bool long_masked(const SoftmaxProblem& p) { return p.broadcast_mask() && p.cols >= kLongMaskedCols; }

// Packed rows: a warp per row where it fits within max_nv, at most a CTA otherwise.
int64_t packed_threads(const RowBudget& b) {
  int64_t tpr = pow2_ceil(ceil_div(b.nvec, b.target_nv));
  if (tpr > kWarp && ceil_div(b.nvec, kWarp) <= b.max_nv) tpr = kWarp;
  if (tpr > kCtaThreads) tpr = std::max<int64_t>(kCtaThreads, pow2_ceil(ceil_div(b.nvec, b.max_nv)));
  return tpr;
}

// A row (or slice) of `vecs` alone in its CTA: threads at the target, no warp preference.
int64_t spread_threads(const RowBudget& b, int64_t vecs) {
  const int64_t n = std::clamp<int64_t>(pow2_ceil(ceil_div(vecs, b.target_nv)), 1, kCtaThreads);
  return std::max<int64_t>(n, pow2_ceil(ceil_div(vecs, b.max_nv)));
}

bool fail(const char** why, const char* reason) {
  *why = reason;
  return false;
}

bool too_long(int64_t tpr, const char** why) {
  return tpr > kMaxCachedThreads && !fail(why, "the row needs more than 1024 threads at the register maximum");
}

// The knobs every design derives alike, and the launch bounds: a cached grid
// of at most one CTA per SM takes launch bounds of one (entry 47).
void finish(const SoftmaxProblem& p, const SoftmaxKnobOverrides& ov, bool cached, int64_t row_blocks, SoftmaxKnobs* k) {
  const int threads = k->threads_per_row * k->rows_per_cta;
  const bool one_wave = cached && p.arch.sm_count > 0 && row_blocks <= p.arch.sm_count;
  k->min_blocks = std::min(255, std::max(1, (one_wave ? 1 : kResidentThreads) / threads));
  k->keep_exp = cached && !p.backward && k->vecs_per_thread * k->vec <= kKeepExpElems;
  // Inputs of 40 MB or more load through L1 (entry 47).
  const int64_t input_bytes = p.rows * p.cols * jit::element_size(p.dtype);
  k->l1_alloc =
      ov.has(SoftmaxKnob::kL1Alloc) ? ov.get(SoftmaxKnob::kL1Alloc) != 0 : input_bytes >= kL1AllocMinInputBytes;
  k->stream_store = ov.has(SoftmaxKnob::kStreamStore) && ov.get(SoftmaxKnob::kStreamStore) != 0;
  if (!ov.has(SoftmaxKnob::kHeadsInner)) k->heads_inner = k->heads_inner || long_masked(p);
}

// Register rows shaped for packing (kRows, kMaskReuse).
bool packed_shape(const SoftmaxProblem& p, SoftmaxKnobs* k, const char** why) {
  const RowBudget b = row_budget(p, false);
  int64_t tpr = packed_threads(b);
  int cta = kCtaThreads;
  if (long_masked(p)) {
    tpr = std::max<int64_t>(kLongMaskedThreads, pow2_ceil(ceil_div(b.nvec, b.max_nv)));
    cta = static_cast<int>(std::min<int64_t>(tpr, kCtaThreads));
  }
  if (too_long(tpr, why)) return false;
  k->vec = b.vec;
  k->threads_per_row = static_cast<int>(tpr);
  k->vecs_per_thread = static_cast<int>(pow2_ceil(ceil_div(b.nvec, tpr)));
  k->rows_per_cta = tpr < cta ? static_cast<int>(cta / tpr) : 1;
  return true;
}

bool rows_shape(const SoftmaxProblem& p, const SoftmaxKnobOverrides& ov, SoftmaxKnobs* k, const char** why) {
  if (!packed_shape(p, k, why)) return false;
  if (ov.has(SoftmaxKnob::kHeadsInner)) k->heads_inner = p.broadcast_mask() && ov.get(SoftmaxKnob::kHeadsInner) != 0;
  finish(p, ov, true, ceil_div(p.rows, k->rows_per_cta), k);
  return true;
}

bool mask_reuse_shape(const SoftmaxProblem& p, const SoftmaxKnobOverrides& ov, SoftmaxKnobs* k, const char** why) {
  if (!p.broadcast_mask()) return fail(why, "needs a masked forward with a mask broadcast over rows");
  if (!packed_shape(p, k, why)) return false;
  const int64_t blocks = ceil_div(p.rows, k->rows_per_cta);
  int64_t run = std::min<int64_t>({p.mask_bcast, kReuseRun, blocks / kReuseBlocks});
  if (ov.has(SoftmaxKnob::kReuseRun)) {
    run = std::min(p.mask_bcast, ov.get(SoftmaxKnob::kReuseRun));
  } else if (p.cols < kReuseCols) {
    return fail(why, "rows of fewer than 2048 keys re-read their mask row cheaply from L2");
  } else if (run < 2) {
    return fail(why, "runs of 2 or more would leave fewer than 2048 row blocks");
  }
  k->reuse_run = std::max<int64_t>(1, run);
  k->heads_inner = true;
  finish(p, ov, true, blocks, k);
  return true;
}

bool few_rows_feasible(const SoftmaxProblem& p, const char** why) {
  return (p.arch.sm_count > 0 && p.rows <= p.arch.sm_count) || fail(why, "needs at most one row per SM");
}

bool few_rows_shape(const SoftmaxProblem& p, const SoftmaxKnobOverrides& ov, SoftmaxKnobs* k, const char** why) {
  if (!few_rows_feasible(p, why)) return false;
  const RowBudget b = row_budget(p, true);
  const int64_t tpr = spread_threads(b, b.nvec);
  if (too_long(tpr, why)) return false;
  k->vec = b.vec;
  k->threads_per_row = static_cast<int>(tpr);
  k->vecs_per_thread = static_cast<int>(pow2_ceil(ceil_div(b.nvec, tpr)));
  finish(p, ov, true, p.rows, k);
  return true;
}

// How many CTAs split a row. Few rows (at most an eighth as many as SMs):
// the most, up to 8, that keep slices of kMinClusterSliceVecs. Many rows:
// only rows of 16-byte accesses whose unsplit CTA would take more than
// 1 / kClusterResident of an SM's threads, split over the fewest CTAs that
// let kClusterResident of them share an SM (an unsplit CTA alone on its SM
// runs its load, reductions and store in series). Narrower accesses are
// issue-bound, and a split only adds cluster barriers to them (entry 89:
// 4096x12345 bf16 forward 229 us split, 145 streamed). 1: no split.
int64_t cluster_split(const SoftmaxProblem& p, const RowBudget& b, bool few) {
  if (few) {
    if (p.rows * kMaxRowCluster > p.arch.sm_count || b.nvec < kMinClusterRowVecs) return 1;
    int64_t cl = 1;
    while (cl < kMaxRowCluster && p.rows * cl * 2 <= p.arch.sm_count && b.nvec / (cl * 2) >= kMinClusterSliceVecs)
      cl *= 2;
    return cl;
  }
  const int64_t shared = kResidentThreads / kClusterResident;
  if (b.vec * jit::element_size(p.dtype) < 16 || pow2_ceil(ceil_div(b.nvec, b.max_nv)) <= shared) return 1;
  for (int64_t cl = 2; cl <= kMaxRowCluster; cl *= 2)
    if (spread_threads(b, ceil_div(b.nvec, cl)) <= shared) return cl;
  return 1;
}

bool cluster_rows_shape(const SoftmaxProblem& p, const SoftmaxKnobOverrides& ov, SoftmaxKnobs* k, const char** why) {
  if (!p.arch.clusters) return fail(why, "thread-block clusters need sm_90");
  const bool few = p.arch.sm_count > 0 && p.rows <= p.arch.sm_count;
  const RowBudget b = row_budget(p, few);
  const int64_t forced = ov.has(SoftmaxKnob::kCluster) ? ov.get(SoftmaxKnob::kCluster) : 0;
  const int64_t cl = forced ? (b.nvec >= forced ? forced : 1) : cluster_split(p, b, few);
  if (cl < 2)
    return fail(why, few ? "needs at most an eighth as many rows as SMs and rows of 4096 vectors or more"
                         : "needs rows of 16-byte accesses whose CTA would take over a quarter of an SM");
  const int64_t slice = ceil_div(b.nvec, cl);
  const int64_t tpr = spread_threads(b, slice);
  if (too_long(tpr, why)) return false;
  k->vec = b.vec;
  k->cluster = static_cast<int>(cl);
  k->threads_per_row = static_cast<int>(tpr);
  k->vecs_per_thread = static_cast<int>(pow2_ceil(ceil_div(slice, tpr)));
  finish(p, ov, true, p.rows, k);
  return true;
}

// Streamed rows re-read their inputs, so they are only for rows that no
// CTA can hold: more than 1024 threads at the register maximum.
bool streamed_shape(const SoftmaxProblem& p, const SoftmaxKnobOverrides& ov, SoftmaxKnobs* k, const char** why) {
  const RowBudget b = row_budget(p, false);
  if (pow2_ceil(ceil_div(b.nvec, b.max_nv)) <= kMaxCachedThreads) return fail(why, "the row fits one CTA's registers");
  k->vec = b.vec;
  k->threads_per_row = kStreamThreads;
  k->vecs_per_thread = std::min(32, std::max(1, kStreamRegs * b.tensors / b.regs_per_vec));
  k->ctas_per_sm =
      static_cast<int>(ov.has(SoftmaxKnob::kCtasPerSm) ? ov.get(SoftmaxKnob::kCtasPerSm) : kStreamCtasPerSm);
  finish(p, ov, false, p.rows, k);
  return true;
}

// flat_row: CTAs of kFlatCta threads. A row takes the fewest power-of-two
// threads (at most kFlatCta) that hold at most kFlatVecs vectors each a
// pass, and a CTA packs kFlatCta / tpr rows while a stage (all its
// tensors) stays within kFlatStageBytes. A CTA has one stage in flight while it works on the
// other, so the copies an SM keeps in flight are its CTAs' stages: small
// CTAs, several an SM (launch bounds from kFlatRegs registers a thread and
// the ring's shared memory), keep 64-100 KB in flight. 1024-thread CTAs of
// one row kept 8-25 KB and ran at 13-36% of copy (docs/history.md entry 94).
// The static reduction scratch takes at most kFlatScratch bytes besides the
// ring; packed rows' addressing spilled at 32 registers, and on sm_90 at 40
// for rows of a few elements.
constexpr int64_t kFlatVecs = 64, kFlatCta = 256, kFlatStageBytes = 32 << 10, kFlatScratch = 1 << 10;
constexpr int64_t kFlatRegs = 48;

bool flat_shape(const SoftmaxProblem& p, const SoftmaxKnobOverrides& ov, SoftmaxKnobs* k, const char** why) {
  const int64_t esize = jit::element_size(p.dtype), tensors = p.backward ? 2 : 1;
  if (!p.flat) return fail(why, "needs every row tensor contiguous from a 16-byte aligned base");
  if (p.kernel_kind() == kSoftmaxMasked) return fail(why, "takes no mask");
  if (p.cols * esize % 16 == 0) return fail(why, "rows of whole 16-byte pieces take 16-byte accesses already");
  const int vec = widest_vec(p.dtype, 16, p.cols);
  // Unless forced: at most one row per SM leaves the ring nothing to
  // overlap, and a decode loop would compile a kernel per key length
  // (few_rows and cluster_rows serve every length with a handful).
  if (!ov.forced && p.arch.sm_count > 0 && p.rows <= p.arch.sm_count) return fail(why, "needs more rows than SMs");
  const int64_t limit = p.arch.smem_bytes - kFlatScratch;
  const auto ring = [&](int64_t r) {
    return kFlatStages * tensors * flat_buffer_elems(static_cast<int>(r), static_cast<int>(p.cols), int(esize)) * esize;
  };
  if (kFlatStages * tensors * p.cols * esize > limit || ring(1) > limit)
    return fail(why, "the stage ring of one row does not fit shared memory");
  const int64_t tpr = std::clamp<int64_t>(pow2_ceil(ceil_div(p.cols / vec, kFlatVecs)), 2, kFlatCta);
  int64_t rows = std::max<int64_t>(1, kFlatCta / tpr);
  while (rows > 1 && (rows * p.cols * esize * tensors > kFlatStageBytes || ring(rows) > limit)) rows /= 2;
  // Launch bounds: as many CTAs as kFlatRegs registers a thread and shared memory allow.
  const int64_t fit = std::max<int64_t>(1, p.arch.smem_bytes / ring(rows));
  const int64_t by_regs = 65536 / (kFlatRegs * tpr * rows);
  // Unless forced, a backward stage holds one row and the SM two CTAs: its
  // two passes over y and dy then have the threads to hide shared memory's
  // latency. Packed short rows (1001 wide: 16 threads a row) and a CTA alone
  // on its SM (25001 wide) ran 10-23% behind the register designs (H200,
  // docs/history.md entry 94).
  if (!ov.forced && p.backward && (rows > 1 || std::min(by_regs, fit) < 2))
    return fail(why, "a backward stage of packed rows, or one CTA an SM, leaves too few threads a row");
  k->vec = vec;
  k->threads_per_row = static_cast<int>(tpr);
  k->vecs_per_thread = static_cast<int>(ceil_div(p.cols / vec, tpr));
  k->rows_per_cta = static_cast<int>(rows);
  k->min_blocks = static_cast<int>(std::clamp<int64_t>(std::min(by_regs, fit), 1, 32));
  k->ctas_per_sm = static_cast<int>(ov.has(SoftmaxKnob::kCtasPerSm) ? ov.get(SoftmaxKnob::kCtasPerSm) : 0);
  k->stream_store = ov.has(SoftmaxKnob::kStreamStore) && ov.get(SoftmaxKnob::kStreamStore) != 0;
  k->smem_bytes = ring(rows);
  return true;
}

constexpr unsigned kOutputKnobs = knob_bit(SoftmaxKnob::kL1Alloc) | knob_bit(SoftmaxKnob::kStreamStore);

// Catalogue order breaks cost ties: the more specialised design first.
const SoftmaxDesignInfo kDesigns[kNumSoftmaxDesigns] = {
    {SoftmaxDesign::kClusterRows, "cluster_rows", knob_bit(SoftmaxKnob::kCluster) | kOutputKnobs, cluster_rows_shape},
    {SoftmaxDesign::kFewRows, "few_rows", kOutputKnobs, few_rows_shape},
    {SoftmaxDesign::kMaskReuse, "mask_reuse", knob_bit(SoftmaxKnob::kReuseRun) | kOutputKnobs, mask_reuse_shape},
    {SoftmaxDesign::kRows, "rows", knob_bit(SoftmaxKnob::kHeadsInner) | kOutputKnobs, rows_shape},
    {SoftmaxDesign::kStreamed, "streamed", knob_bit(SoftmaxKnob::kCtasPerSm) | kOutputKnobs, streamed_shape},
    {SoftmaxDesign::kFlatRow, "flat_row", knob_bit(SoftmaxKnob::kCtasPerSm) | knob_bit(SoftmaxKnob::kStreamStore),
     flat_shape},
};

}  // namespace

const SoftmaxDesignInfo& design_info(SoftmaxDesign d) { return kDesigns[static_cast<int>(d)]; }

const char* knob_name(SoftmaxKnob k) {
  static const char* const kNames[kNumSoftmaxKnobs] = {"cluster",     "reuse_run", "ctas_per_sm",
                                                       "heads_inner", "l1_alloc",  "stream_store"};
  return kNames[static_cast<int>(k)];
}

const char* knob_range_error(SoftmaxKnob k, int64_t v) {
  switch (k) {
    case SoftmaxKnob::kCluster:
      return v == 2 || v == 4 || v == 8 ? "" : "2, 4 or 8";
    case SoftmaxKnob::kReuseRun:
      return v >= 1 && v <= (int64_t(1) << 30) ? "" : "from 1 to 2^30";
    case SoftmaxKnob::kCtasPerSm:
      return v >= 1 && v <= 32 ? "" : "from 1 to 32";
    default:
      return v == 0 || v == 1 ? "" : "0 or 1";
  }
}

int softmax_vec(const SoftmaxProblem& p) { return widest_vec(p.dtype, p.max_vec, p.cols); }

bool cached_design(SoftmaxDesign d) { return d != SoftmaxDesign::kStreamed && d != SoftmaxDesign::kFlatRow; }
bool persistent_design(SoftmaxDesign d) { return !cached_design(d); }

SoftmaxResources design_resources(SoftmaxDesign, const SoftmaxKnobs& k) {
  SoftmaxResources r;
  r.smem_bytes = k.smem_bytes;
  r.threads = k.threads_per_row * k.rows_per_cta;
  r.regs_per_thread = std::min(255, 65536 / (k.min_blocks * r.threads));
  r.cluster = k.cluster;
  return r;
}

int64_t design_row_blocks(SoftmaxDesign d, const SoftmaxProblem& p, const SoftmaxKnobs& k) {
  if (d != SoftmaxDesign::kMaskReuse) return ceil_div(p.rows, k.rows_per_cta);
  // Row block rb is run rb % splits of mask row block rb / splits.
  return ceil_div(p.rows / p.mask_bcast, k.rows_per_cta) * ceil_div(p.mask_bcast, k.reuse_run);
}

KernelKey design_key(SoftmaxDesign d, const SoftmaxProblem& p, const SoftmaxKnobs& k) {
  const bool cached = cached_design(d);
  unsigned opts = 0;
  if (k.keep_exp) opts |= kSoftmaxKeepExp;
  if (k.heads_inner) opts |= kSoftmaxHeadsInner;
  if (d == SoftmaxDesign::kMaskReuse) opts |= kSoftmaxMaskReuse;
  if (k.stream_store) opts |= kSoftmaxStreamStore;
  if (k.l1_alloc) opts |= kSoftmaxL1Alloc;
  opts |= log2_of_pow2(k.cluster) << kSoftmaxClusterShift;
  KernelKey key;
  const bool flat = d == SoftmaxDesign::kFlatRow;
  key.family = flat ? (p.backward ? &kSoftmaxBwdFlat : &kSoftmaxFwdFlat) : p.backward ? &kSoftmaxBwd : &kSoftmaxFwd;
  key.dtype = p.dtype;
  key.wdtype = p.dtype;
  key.hidden = flat     ? static_cast<int32_t>(p.cols)
               : cached ? k.cluster * k.threads_per_row * k.vecs_per_thread * k.vec
                        : 0;
  key.vec = static_cast<int16_t>(k.vec);
  key.threads_per_row = static_cast<int16_t>(k.threads_per_row);
  key.rows_per_cta = static_cast<int16_t>(k.rows_per_cta);
  key.vecs_per_thread = static_cast<int16_t>(k.vecs_per_thread);
  key.flags = (cached ? kSoftmaxCachedFlag : 0u) | (opts << kSoftmaxOptsShift) |
              (static_cast<unsigned>(k.min_blocks) << kSoftmaxMinBlocksShift);
  const SoftmaxKind kind = p.kernel_kind();
  key.variant = static_cast<int16_t>(p.backward ? (kind == kSoftmaxCausal ? 1 : 0) : kind);
  key.arch = static_cast<int16_t>(p.arch.arch);
  key.cluster = static_cast<int16_t>(k.cluster);
  return key;
}

}  // namespace rtcnorm
