#include "ops/norm_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <sstream>

#include "ops/plan_util.h"

namespace rtcnorm {
namespace {

using jit::DType;
using jit::KernelFamily;
using jit::KernelKey;

std::string norm_expression(const char* kernel, const KernelKey& k) {
  std::ostringstream os;
  os << "rtcnorm::" << kernel << "<" << jit::kernel_type_name(k.dtype) << ", " << jit::kernel_type_name(k.wdtype)
     << ", " << k.hidden << ", " << k.vec << ", " << k.threads_per_row << ", " << k.rows_per_cta << ", "
     << k.vecs_per_thread << ", " << k.flags << "u, " << k.variant << ">";
  return os.str();
}

std::string column_reduce_expression(const KernelKey& k) {
  return std::string("rtcnorm::column_reduce<") + jit::kernel_type_name(k.wdtype) + ", " + std::to_string(k.vec) + ">";
}

// Launch-bounds CTAs per SM. Never a register cap below 64 per thread
// (65536 registers / (threads x 64)): a 1024-thread CTA asked for 2 per SM
// gets 32 registers and spills its cached row (measured: 3478 -> 1487 GB/s).
int min_blocks_for(int threads, int requested) { return std::max(1, std::min(requested, 1024 / threads)); }

// Registers a thread may use when `blocks` CTAs of `threads` share an SM, as
// ptxas caps them for those launch bounds (sm_80-sm_100): the register file
// is four partitions of 16384, a CTA's warps spread over them round-robin,
// and a warp takes registers in steps of 8 a thread, at most 255. (224-thread
// CTAs at 3 an SM: 21 warps, 6 on the fullest partition, 80 registers.)
static int regs_at(int threads, int blocks) {
  const int warps = ((threads + 31) / 32) * std::max(1, blocks);
  const int per_partition = (warps + 3) / 4;
  return std::min(255, 16384 / (per_partition * 32) / 8 * 8);
}

// The most CTAs per SM, at most `blocks`, whose launch bounds leave `need`
// registers a thread (at least one CTA).
static int blocks_leaving(int threads, int blocks, int need) {
  while (blocks > 1 && regs_at(threads, blocks) < need) --blocks;
  return std::max(1, blocks);
}

// Launch-bounds CTAs per SM for a kernel whose CTAs each take `smem` bytes of
// dynamic shared memory: no more than fit the opt-in budget, at least one.
static int smem_capped_blocks(int min_blocks, int64_t smem, int arch) {
  return static_cast<int>(std::min<int64_t>(min_blocks, std::max<int64_t>(1, max_smem_per_block(arch) / smem)));
}

const KernelFamily* fwd_family(NormKind k) { return k == kRmsNorm ? &kRmsNormFwd : &kLayerNormFwd; }
const KernelFamily* bwd_family(NormKind k) { return k == kRmsNorm ? &kRmsNormBwd : &kLayerNormBwd; }

// Threads per row for `nvec` vectors at about nv_target vectors per thread.
// Up to a warp: a power of two (groups reduce with in-warp butterflies).
// Beyond: any multiple of 32 (warps reduce through shared memory), picking the
// vectors per thread in [nv_target / 2, nv_target] that leaves the fewest idle
// slots, so N = 5120 or 7168 does not idle half of a power-of-two CTA.
int choose_tpr(int64_t nvec, int nv_target) {
  const int64_t want = ceil_div(nvec, nv_target);
  if (want <= 32) return static_cast<int>(pow2_ceil(want));
  if (want >= 1024) return 1024;
  int best = 0;
  int64_t best_waste = -1;
  for (int nv = nv_target; nv >= std::max(1, nv_target / 2); --nv) {
    const int64_t t = std::min<int64_t>(1024, ceil_div(ceil_div(nvec, nv), 32) * 32);
    const int64_t waste = t * ceil_div(nvec, t) - nvec;
    if (best_waste < 0 || waste < best_waste) {
      best = static_cast<int>(t);
      best_waste = waste;
    }
  }
  return best;
}

int choose_vec(const NormProblem& p) { return widest_vec(p.dtype, p.max_vec, p.hidden); }

KernelKey base_key(const NormProblem& p, const KernelFamily* fam, int arch) {
  KernelKey k;
  k.family = fam;
  k.dtype = p.dtype;
  k.wdtype = p.has_weight || p.has_bias ? p.wdtype : p.dtype;
  k.hidden = static_cast<int32_t>(p.hidden);
  k.arch = static_cast<int16_t>(arch);
  return k;
}

}  // namespace

const KernelFamily kRmsNormFwd{"rms_norm_fwd", "rms_norm.cuh",
                               [](const KernelKey& k) { return norm_expression("rms_norm_fwd", k); }};
const KernelFamily kRmsNormBwd{"rms_norm_bwd", "rms_norm.cuh",
                               [](const KernelKey& k) { return norm_expression("rms_norm_bwd", k); }};
const KernelFamily kLayerNormFwd{"layer_norm_fwd", "layer_norm.cuh",
                                 [](const KernelKey& k) { return norm_expression("layer_norm_fwd", k); }};
const KernelFamily kLayerNormBwd{"layer_norm_bwd", "layer_norm.cuh",
                                 [](const KernelKey& k) { return norm_expression("layer_norm_bwd", k); }};
const KernelFamily kRmsNormBwdCoef{"rms_norm_bwd_coef", "rms_norm.cuh",
                                   [](const KernelKey& k) { return norm_expression("rms_norm_bwd_coef", k); }};
const KernelFamily kRmsNormBwdCols{"rms_norm_bwd_cols", "rms_norm.cuh",
                                   [](const KernelKey& k) { return norm_expression("rms_norm_bwd_cols", k); }};
const KernelFamily kLayerNormBwdCoef{"layer_norm_bwd_coef", "layer_norm.cuh",
                                     [](const KernelKey& k) { return norm_expression("layer_norm_bwd_coef", k); }};
const KernelFamily kLayerNormBwdCols{"layer_norm_bwd_cols", "layer_norm.cuh",
                                     [](const KernelKey& k) { return norm_expression("layer_norm_bwd_cols", k); }};
const KernelFamily kColumnReduce{"column_reduce", "column_reduce.cuh", column_reduce_expression};

NormMode parse_mode(const std::optional<c10::string_view>& mode, const char* op) {
  if (!mode.has_value()) return NormMode::kAuto;
  const std::string m(mode->data(), mode->size());
  if (m == "static_persistent") return NormMode::kStaticPersistent;
  if (m == "multi_wave_reload") return NormMode::kMultiWaveReload;
  if (m == "multi_wave_cached") return NormMode::kMultiWaveCached;
  TORCH_CHECK_VALUE(false, "rtcnorm.", op, ": mode must be None, 'static_persistent', 'multi_wave_reload' or ",
                    "'multi_wave_cached', got '", m, "'");
}

const char* mode_name(NormMode m) {
  switch (m) {
    case NormMode::kAuto:
      return "auto";
    case NormMode::kStaticPersistent:
      return "static_persistent";
    case NormMode::kMultiWaveReload:
      return "multi_wave_reload";
    case NormMode::kMultiWaveCached:
      return "multi_wave_cached";
  }
  return "?";
}

int64_t persistent_grid(int64_t row_blocks, int sm_count, int blocks_per_sm) {
  return std::max<int64_t>(1, std::min<int64_t>(row_blocks, int64_t(sm_count) * std::max(1, blocks_per_sm)));
}

NormTuning& norm_tuning() {
  static NormTuning t;
  return t;
}

// Collects the human-readable reason for a plan only when asked (explain);
// launches pass no sink, so the hot path builds no strings.
class Reason {
 public:
  explicit Reason(std::string* sink) : sink_(sink) {
    if (sink_) os_.emplace();
  }
  void finish() {
    if (sink_) *sink_ = os_->str();
  }
  template <typename T>
  Reason& operator<<(const T& v) {
    if (os_) *os_ << v;
    return *this;
  }

 private:
  std::string* sink_;
  std::optional<std::ostringstream> os_;
};

// Memory-hint flag bits: evict-first stores (kStreamStore) and the next-row-
// block L2 prefetch of a grid-stride loop (kPrefetchNext); each caller's rule
// comes from the H100 sweep in docs/history.md (entry 7). A tuning
// override (1 + the bits >> 9) replaces the rule.
// Rows at or below this width are "narrow": many rows share a CTA.
constexpr int kDefaultNarrowRow = 512;
// (the narrow_row tunable replaces the width)
static bool is_narrow_row(const NormProblem& p) {
  return p.hidden <= pick(norm_tuning().narrow_row, kDefaultNarrowRow);
}
// Narrow rows: the base vectors per thread (H200 sweep) and the row blocks
// per SM up to which they run persistent at that base.
constexpr int kNarrowBaseVecs = 2;
constexpr int kNarrowPersistentBlocksPerSm = 16;

// Narrow 16-bit rows (no residual, 16-bit gamma and beta) whose vectors
// split evenly at the base two a thread run as a plain multi-wave grid of
// 256-thread CTAs at launch bounds past the narrow rule's 1024 threads an SM
// (64 registers). dense_narrow_threads gives those bounds' threads an SM, or
// 0 where the rule does not apply.
//
// RMSNorm (N = 64, 128, 256) needs 32 registers there (ptxas, sm_80 and
// sm_90: no spill), so 2048 threads fit eight CTAs an SM. A grid of 1-32
// such CTAs an SM then issues every row's loads in a round or a few: no
// persistent loop, and no 4-vector threads to fit one round of four CTAs
// (narrow_vecs_target). H100 kernel-only, L2 flushed, bf16, us
// (docs/history.md entry 70): 6144x128 3.46 -> 3.08, 8192x128 3.81 ->
// 3.34, 16384x128 5.48 -> 4.62, 32768x128 7.75 -> 7.22 (torch.compile's
// kernel 7.14), 65536x128 14.02 -> 13.82, 4096x256 3.92 -> 3.40, 16384x256
// 7.60 -> 7.00, 65536x256 25.85 -> 25.29, 32768x64 5.36 -> 4.88, but
// 262144x64 (4096 CTAs) 25.88 -> 26.17; fp16 alike. Left alone: grids under
// one CTA an SM (4096x128 at two vectors: 128 CTAs, 3.00 -> 4.14), longer
// grids (within 1% either way: 262144x128 47.92 / 48.43), uneven splits (N =
// 192 and 384, 16 and 32 threads for 24 and 48 vectors: 6-26% slower), rows
// past 384 (16384x512 at two vectors 12.64 -> 13.84), and sm_100
// (unmeasured; ptxas spills 8 bytes there at 32 registers).
//
// LayerNorm (N = 128, 256, with gamma and/or beta) spills 24 bytes at 32
// registers and fits 48 with its gamma and beta loaded beside x
// (kPreloadAffine, dense_narrow_preload): 1280 threads, five CTAs an SM. It
// pays where the grid has at least 12 such CTAs an SM, past the four-vector
// persistent grids (H100 kernel-only, L2 flushed, bf16, us, docs/history.md entry 71:
// 32768x256 14.93 -> 14.16, 65536x256 26.85 -> 25.65, 131072x256 49.63 ->
// 48.69, 65536x128 15.18 -> 14.13, 131072x128 26.98 -> 25.98, 262144x128
// 49.52 -> 49.04); at 8 an SM and fewer it lost 2-4% (16384x256 7.87 ->
// 8.07, 32768x128 7.85 -> 8.13), and N = 64 ran within 1.5% either way.
constexpr int kDenseNarrowRmsThreads = 2048, kDenseNarrowLnThreads = 1280;
constexpr int64_t kDenseNarrowLnMinBlocksPerSm = 12;

static int dense_narrow_threads(const NormProblem& p, int sm_count, int arch, int cta_threads) {
  const int tune = norm_tuning().fwd_dense_narrow;
  if (tune == 1 || arch > 90 || p.residual || jit::element_size(p.dtype) != 2) return 0;
  const bool affine = p.has_weight || p.has_bias;
  if (affine && jit::element_size(p.wdtype) != 2) return 0;
  const bool ln = p.kind == kLayerNorm;
  // (LayerNorm's two vectors serve the rule's bounds: a tuning override of
  // the bounds keeps its four.)
  if (ln && (!affine || p.hidden < 128 || norm_tuning().fwd_min_blocks != 0)) return 0;
  const int64_t nvec = p.hidden / choose_vec(p);
  const int tpr = choose_tpr(nvec, kNarrowBaseVecs);
  // (16-bit rows past 384 elements take 8 vectors: narrow_vecs_target.)
  if (nvec != int64_t(kNarrowBaseVecs) * tpr || p.hidden > 384) return 0;
  const int64_t blocks = ceil_div(p.rows, std::max(1, cta_threads / tpr));
  const bool grid_ok =
      ln ? blocks >= kDenseNarrowLnMinBlocksPerSm * sm_count : blocks >= sm_count && blocks <= 32 * int64_t(sm_count);
  if (tune != 2 && !grid_ok) return 0;
  return ln ? kDenseNarrowLnThreads : kDenseNarrowRmsThreads;
}

// Whether dense narrow rows of this op load gamma and beta beside x.
static bool dense_narrow_preload(const NormProblem& p) { return p.kind == kLayerNorm; }

static unsigned hint_bits(int override_value, bool stream_store, bool prefetch_next) {
  // (the override's bits count from kStreamStore's, the lower of the two)
  if (override_value > 0) return static_cast<unsigned>(override_value - 1) * kStreamStore;
  return (stream_store ? kStreamStore : 0u) | (prefetch_next ? kPrefetchNext : 0u);
}

// H100 sweep (docs/history.md, entry 10): a long row kept in registers
// spills once a residual joins it (RMSNorm + residual at N = 16384: 1455 GB/s
// from registers, 2776 from shared memory), and LayerNorm's gamma and beta
// crowd it past 64 KB rows (1024x65536: 1490 -> 1869), or at 32 KB float32
// rows in 256-thread CTAs (4096x8192: 2047 -> 2658). Elsewhere registers match
// or beat shared memory (which also takes L1 away from gamma), so the rule
// keeps them.
//
// LayerNorm rows of up to 64 KB cached by CTAs of more than 256 threads stay
// in registers at one CTA per SM (wide_ln_row): a shared-memory row
// leaves L1 no room for gamma and beta, which then come from L2 for every row
// (H100 kernel-only, us, entry 45: bf16 2048x32768 120.4 -> 103.0, fp16
// 117.1 -> 101.7, 128x32768 12.5 -> 9.9; bf16 rows with float32 gamma/beta
// 155.4 -> 119.9; float32 4096x16384 190.0 -> 182.7, 2048x16384 99.2 -> 94.2).
//
// Except 16-bit LayerNorm rows of 64-128 KB beside 16-bit gamma and beta
// (32768 < N <= 65536, N a multiple of 2048): one CTA of N / 64 threads, a
// whole number of warps, holds the row in registers at 64 elements a thread,
// one CTA an SM. Its normalize step loads gamma and beta after the row
// reduction and stores plainly: loaded beside x their packs spill at these
// registers (288 bytes at N = 65536), and so did the evict-first stores'
// addresses (236), which also take the prefetch of the next row
// (wide_ln_register_row's plans drop all three). H100 kernel-only, bf16, us
// (docs/history.md entry 76), shared-memory rows or cluster slices ->
// this: 1024 / 4096 x 40960 75.0 -> 65.7, 303.5 -> 234.5; x 49152 98.4 ->
// 80.8, 336.6 -> 285.6; x 57344 97.4 -> 91.7, 378.5 -> 331.5; 65536 lost at
// 256 and 512 rows (29.9 -> 30.3, 54.2 -> 55.1: a row then spread over a
// cluster's 8 SMs runs sooner) and in fp16 (1024 rows 103.0 -> 105.0: its
// conversions spill 12 bytes at 64 registers), and gained past 4 rows an SM
// in bf16 (1024 / 2048 / 4096 rows 102.1 -> 100.8, 196.7 -> 190.5, 380.6 ->
// 366.3), so 65536 takes it there only; narrower rows take it from one row
// an SM (256 rows of 40960 / 49152: 22.6 -> 20.6, 33.8 -> 27.5), fewer being
// the latency-bound grids that clusters serve.
constexpr int64_t kWideLnRegsMinElems = 32768, kWideLnRegsMaxElems = 65536, kWideLnRegsStep = 2048;
constexpr int kWideLnRegsMinRowsPerSm = 4;

static bool wide_ln_register_row(const NormProblem& p, int sm_count) {
  const NormTuning& t = norm_tuning();
  // (An override of the row's layout or storage plans the row as asked.)
  if (t.fwd_wide_ln_regs == 1 || t.fwd_smem_row_bytes != 0 || t.fwd_cta_threads != 0 || t.fwd_vecs_target != 0 ||
      t.fwd_cache_bytes != 0)
    return false;
  const bool shape_ok = p.kind == kLayerNorm && p.has_bias && !p.residual && jit::element_size(p.dtype) == 2 &&
                        jit::element_size(p.wdtype) == 2 && p.hidden > kWideLnRegsMinElems &&
                        p.hidden <= kWideLnRegsMaxElems && p.hidden % kWideLnRegsStep == 0;
  if (!shape_ok) return false;
  if (t.fwd_wide_ln_regs == 2) return true;
  if (p.hidden < kWideLnRegsMaxElems) return p.rows >= sm_count;
  return p.dtype == jit::DType::kBFloat16 && p.rows > int64_t{kWideLnRegsMinRowsPerSm} * sm_count;
}

static bool smem_row_rule(const NormProblem& p, int64_t row_bytes, int reg_threads) {
  if (p.residual) return row_bytes >= 16 * 1024;
  if (!p.has_bias) return false;
  if (row_bytes > 64 * 1024) return true;
  return jit::element_size(p.dtype) == 4 && row_bytes >= 32 * 1024 && reg_threads <= 256;
}

// A LayerNorm row with bias that a CTA of more than 256 threads caches in
// registers at more than 64 bytes a thread: its launch bounds take one CTA
// per SM, so that ptxas has 128 registers a thread (H100 kernel-only, entry
// 45: bf16 2048x32768 at two CTAs per SM spills, 190 us against 103.5 at one;
// 384 threads at 2048x24576 87.0 -> 83.3).
static bool wide_ln_row(const NormProblem& p, int cta_threads, int thread_bytes) {
  return p.kind == kLayerNorm && p.has_bias && !p.residual && cta_threads > 256 && thread_bytes > 64;
}

// CTAs an SM for a float32 LayerNorm row of more than 80 bytes a thread in
// registers: the most that leave 96 registers, or one (a persistent grid,
// low_residency below) where those would hold fewer than 512 threads. At 80
// registers ptxas spilled 48-60 bytes (N = 6144-7168, 192-224 threads), and
// rows of 257-320 threads had run one CTA an SM (wide_ln_row) where two fit
// 96. H100 kernel-only, us (docs/history.md entry 68; x 4096 / 16384
// rows): 7168 (224 threads, 3 -> 1) 88.5 -> 86.1, 342.3 -> 329.2, 65536 rows
// 1360.7 -> 1301.1; 9216 (288, 1 -> 2) 113.1 -> 104.1, 431.7 -> 403.3; 10240
// (320, 1 -> 2) 125.3 -> 115.2. Unchanged: 160 threads (5120: 4 leave 96),
// 352+ (12288: two at 80 lost 2.5%).
static int fp32_ln_row_blocks(int cta_threads) {
  const int blocks = blocks_leaving(cta_threads, 4, 96);
  return blocks * cta_threads < 512 ? 1 : blocks;
}

// Vectors per thread per chunk of a shared-memory row: 4 with a residual,
// whose second operand would otherwise spill; else 8 up to 64 KB rows (a
// 512-thread CTA, two per SM) and 16 beyond (512 threads, one CTA per SM).
static int smem_row_vecs(const NormProblem& p, int64_t row_bytes) {
  if (p.residual) return 4;
  return row_bytes > 64 * 1024 ? 16 : 8;
}

// Vectors per thread of a narrow forward row (H100 kernel-only sweep,
// docs/history.md entry 24). Launch bounds hold a narrow CTA to 1024
// threads per SM, so the bytes each thread has in flight set the rows in
// flight. Two 16-byte vectors per thread is the base. LayerNorm, whose two
// row reductions per row weigh more, takes 4 (bf16 65536x256: 1997 -> 2203
// GB/s, 131072x384 1895 -> 2590; dense_narrow_threads has since taken
// many-row grids of 128 and 256 to 2 at other launch bounds); RMSNorm with
// 4 lost 2-5% at 65536-262144 rows of 128-256. 16-bit rows of more than 384
// elements take 8 in either op (16384x512: LayerNorm 1641 -> 2001, RMSNorm
// 1912 -> 2123). Neither applies beside a residual (x and r in registers
// spill: 2222 -> 981) or where the fewer, fuller CTAs would leave under two
// per SM (4096x512 lost 22-28%). A row keeps at least 4 threads: at 2 (128
// rows per CTA) N = 64 and 128 ran at 36-87% of the best.
//
// RMSNorm takes 4 too where its CTAs at 4 vectors number at most one round
// of the CTAs launch bounds keep resident (1024 threads per SM): every load
// of x is then issued at once, where 2 vectors take two rounds (H100,
// CUDA-graph replay, bf16, us: 32768x128 12.06 -> 11.26, 16384x256 12.02 ->
// 11.42; at two rounds, 65536x128, 4 lost 3.7%; docs/history.md entry 35).
static int narrow_vecs_target(const NormProblem& p, int sm_count, int cta_threads) {
  constexpr int kBase = kNarrowBaseVecs, kMinThreadsPerRow = 4, kMinBlocksPerSm = 2, kOneRoundVecs = 4;
  if (p.residual) return kBase;
  const int64_t nvec = p.hidden / choose_vec(p);
  const auto row_blocks_at = [&](int nv) { return ceil_div(p.rows, std::max(1, cta_threads / choose_tpr(nvec, nv))); };
  const bool wide16 = jit::element_size(p.dtype) == 2 && p.hidden > 384;
  int want = wide16 ? 8 : (p.kind == kLayerNorm ? 4 : kBase);
  if (want == kBase && row_blocks_at(kOneRoundVecs) <= int64_t(std::max(1, 1024 / cta_threads)) * sm_count)
    want = kOneRoundVecs;
  if (want == kBase) return kBase;
  const int nv = static_cast<int>(std::max<int64_t>(kBase, std::min<int64_t>(want, nvec / kMinThreadsPerRow)));
  return row_blocks_at(nv) >= int64_t(kMinBlocksPerSm) * sm_count ? nv : kBase;
}

// Vectors per thread of a wide (non-narrow) forward row. H200 sweeps set 8
// (128 bytes a thread) for bandwidth-bound grids. A problem whose threads at
// 2 vectors each fill at most half the device's thread slots is latency-
// bound instead: every thread then runs a shorter load-reduce-store chain
// (H100 kernel-only, 8 -> 2 vectors, us: RMSNorm 1x4096 2.71 -> 2.27, 32x4096
// 3.04 -> 2.53, 256x8192 5.62 -> 5.04; LayerNorm 1x4096 3.51 -> 2.64, 32x4096
// 3.92 -> 2.86, 256x8192 6.66 -> 5.76), while 4096x1024 (a full device at 2)
// lost with it (RMSNorm 7.62 -> 8.30).
constexpr int kWideVecs = 8, kLatencyVecs = 2, kLatencyThreadsPerSm = 1024;

int64_t few_rows_max(const NormProblem& p, int sm_count) {
  return int64_t(sm_count) * kLatencyThreadsPerSm / ceil_div(p.hidden / choose_vec(p), int64_t(kLatencyVecs));
}

// `few_rows`: p.rows <= few_rows_max (the forward's few-row grid).
static int wide_vecs_target(bool few_rows) { return few_rows ? kLatencyVecs : kWideVecs; }

// L1 prefetch of gamma/beta beside the row's loads (kPrefetchAffine); a
// tuning override of 1 / 2 forces it off / on. H100 (docs/history.md
// entry 17): where a grid has at most one CTA per SM, each CTA's gamma load
// after the row reduction is a DRAM or L2 round trip nothing else hides, and
// the prefetch gains 10-20% per call (RMSNorm 128x4096: 261 -> 320 GB/s).
// In full grids gamma already sits in L1 and the prefetches only take issue
// and L1 bandwidth from the row: RMSNorm 4096x2048 2074 -> 1231.
//
// A register-cached row of the few-row layout (at most kLatencyVecs vectors a
// thread) loads its gamma/beta vectors into registers beside x instead
// (kPreloadAffine): no L1 round trip after the reduction, and the prefetch
// instructions go. H100 kernel-only, bf16, us (docs/history.md entry
// 39): RMSNorm 1x4096 2.35 -> 2.14, 128x4096 3.06 -> 2.88; LayerNorm 1x4096
// 2.64 -> 2.49, 128x4096 3.38 -> 3.20; 256x4096 / 256x8192 within 1.5%.
// Rows of more vectors a thread keep the prefetch: RMSNorm 1x65536 (8
// vectors) lost 38% with the packs held in registers. Override 3 forces the
// preload on every register-cached row.
//
// So does a 16-bit LayerNorm row of 16-bit gamma and beta on a 512-thread CTA
// alone on its SM (wide_ln_row, 128 registers a thread): its 64 registers of
// packs fit beside the row, and the normalize step waits on no L2 round trip
// after the reduction (H100 kernel-only, bf16, us, docs/history.md entry 53: 1024x32768
// 54.4 -> 53.3, 2048x32768 101.5 -> 97.6, 4096x32768 196.4 -> 187.6).
// 384-thread CTAs (2048x24576: 81.3 -> 82.6) and the same slices of a
// cluster (256x262144: 165.8 -> 189.1) lost with it; RMSNorm's rows of
// 32768 run two CTAs an SM (64 registers) and spilled (94 -> 132).
//
// So do rows whose launch bounds the planner set with the packs in mind
// (packs_fit): the dense narrow LayerNorm rows (dense_narrow_threads), and
// 16-bit rows of 128-thread CTAs in one wave at four an SM (128 registers a
// thread for a row of at most 128 bytes). H100 kernel-only, L2 flushed, bf16,
// us (docs/history.md entry 71): LayerNorm 3072x1024 6.72 -> 6.57, 4096x1024 8.07 ->
// 7.81, 2048x2048 8.08 -> 7.82, 768x4096 7.37 -> 7.01, 384x8192 7.45 -> 7.10
// (512x8192 8.12 -> 8.17); RMSNorm 2560x1024 5.57 -> 5.38, 3072x1024 6.20 ->
// 5.81, 1536x2048 6.28 -> 6.04, 1024x4096 7.78 -> 7.37, 512x8192 7.81 ->
// 7.28. RMSNorm CTAs of four or eight rows in grids of more than three an SM
// lost (2048x2048 7.47 -> 7.81, 2-5% in three runs; 4096x1024 -2% to +5%
// over four runs) and keep the plain loads. Across the standard shapes at 64
// registers the packs spill and cost 40-200% (RMSNorm 4096x2048 12.5 ->
// 22.0 us, LayerNorm 16384x8192 184 -> 479).
//
// Rows of wide_ln_register_row (after_reduction) load them after the row
// reduction unless an override says otherwise: beside x their packs spill.
static unsigned affine_fetch_rule(int override_value, const NormProblem& p, bool keep, bool in_regs, int nv,
                                  bool latency_layout, bool small_grid, bool wide_ln, bool packs_fit,
                                  bool after_reduction) {
  if (keep || !(p.has_weight || p.has_bias)) return 0u;
  if (override_value == 3) return in_regs ? kPreloadAffine : kPrefetchAffine;
  if (override_value > 0) return override_value == 2 ? kPrefetchAffine : 0u;
  if (after_reduction) return 0u;
  if (in_regs && packs_fit) return kPreloadAffine;
  if (in_regs && latency_layout && nv <= kLatencyVecs) return kPreloadAffine;
  const bool packs16 = jit::element_size(p.dtype) == 2 && jit::element_size(p.wdtype) == 2;
  if (in_regs && wide_ln && packs16) return kPreloadAffine;
  return small_grid ? kPrefetchAffine : 0u;
}

// explain() text of the forward's grid (with_fwd_grid_exchange rewrites it).
// The opening of a register-cached row's text (with_fwd_deferred rewrites it).
constexpr const char* kRegisterRowWhy = "row fits in registers (";
constexpr const char* kPersistentGridWhy = "; grid = SMs x occupancy";
constexpr const char* kMultiWaveGridWhy = "; grid = one CTA per row block";
constexpr const char* kWideLnRegsWhy =
    "; a 16-bit LayerNorm row of 64-128 KB at 64 elements a thread: gamma and beta loaded after the row reduction, "
    "plain stores";
constexpr const char* kPrefetchAheadWhy =
    "; each CTA prefetches into L2 the row a device-full of CTAs ahead and stores evict-first";

// The plan for one CTA (or row group) per row; plan_norm_fwd may split the
// row across a cluster of such CTAs instead.
static NormFwdPlan plan_fwd_cta(const NormProblem& p, NormMode requested, int sm_count, int arch, bool explain,
                                bool cluster_slice = false) {
  const NormTuning& t = norm_tuning();
  const int kNarrowRow = pick(t.narrow_row, kDefaultNarrowRow);
  const bool narrow = p.hidden <= kNarrowRow;
  // H200 sweeps: wide rows want 8 x 16 B in flight per thread and 128-thread
  // CTAs. Narrow rows share 256-thread CTAs; narrow_vecs_target gives their
  // vectors per thread (H100 sweep, docs/history.md entry 24).
  const int kCtaThreads = pick(t.fwd_cta_threads, narrow ? 256 : 128);
  const bool few_rows = !narrow && p.rows <= few_rows_max(p, sm_count);
  // Narrow rows the dense rule takes run at its two vectors a thread.
  const int dense_threads = narrow ? dense_narrow_threads(p, sm_count, arch, kCtaThreads) : 0;
  const bool dense_rule = dense_threads > 0;
  const int kFwdVecsTarget = pick(t.fwd_vecs_target, dense_rule ? kNarrowBaseVecs
                                                     : narrow   ? narrow_vecs_target(p, sm_count, kCtaThreads)
                                                                : wide_vecs_target(few_rows));
  // Raw row bytes a thread may keep: 128 B is 64 bf16 or 32 fp32 values.
  const int kFwdCacheBytes = pick(t.fwd_cache_bytes, 128);
  NormFwdPlan plan;
  const int esize = jit::element_size(p.dtype);
  const int vec = choose_vec(p);
  const int64_t nvec = p.hidden / vec;
  const int64_t row_bytes = p.hidden * esize;
  const int reg_tpr = choose_tpr(nvec, kFwdVecsTarget);
  const int reg_nv = static_cast<int>(ceil_div(nvec, reg_tpr));
  const bool reg_can = int64_t(reg_nv) * vec * esize <= kFwdCacheBytes;
  // Shared memory where the rule prefers it or registers cannot hold the row;
  // a tuning override of the row bytes replaces the rule.
  const int smem_vecs = pick(t.fwd_smem_vecs, smem_row_vecs(p, row_bytes));
  const int smem_tpr = choose_tpr(nvec, smem_vecs);
  const int smem_rows = std::max(1, kCtaThreads / smem_tpr);
  const bool wide_ln_regs = wide_ln_register_row(p, sm_count);
  const bool smem_wanted = t.fwd_smem_row_bytes > 0
                               ? row_bytes >= t.fwd_smem_row_bytes
                               : (!reg_can || (!wide_ln_regs && smem_row_rule(p, row_bytes, reg_tpr)));
  const bool smem_fits = !narrow && smem_wanted && smem_rows * row_bytes <= max_smem_per_block(arch);
  const bool fits = smem_fits || reg_can;
  const int tpr = smem_fits ? smem_tpr : reg_tpr;
  const int nv_row = static_cast<int>(ceil_div(nvec, tpr));
  const int rows = std::max(1, kCtaThreads / tpr);
  plan.row_blocks = ceil_div(p.rows, rows);
  // Launch bounds of a wide register-cached row. Left 128 registers (4 CTAs
  // per SM), ptxas takes them all even for a short per-thread row; rows of at
  // most 80 bytes per thread are capped at 64 (8 CTAs), spilling at most a
  // few bytes (H100, LayerNorm 16384x5120 kernel-only: 2367 -> 2852 GB/s).
  // Longer rows spill there (LayerNorm N = 6144: 144 bytes, 7168: 44), and so
  // do rows beside a residual (80-96 bytes), so those keep 4.
  //
  // Rows of 81-128 bytes per thread (H100 sweep, docs/history.md entry
  // 15): 16-bit rows with 16-bit gamma/beta in 128-thread CTAs gain 1-15% at
  // 7 or 8 CTAs per SM, where ptxas spills at most 16 bytes: 8 when the CTA
  // holds two or more rows (N <= 4096), 7 (72 registers) for one row, where
  // 8 spills RMSNorm at N = 8192 and loses 1%. float32 gamma and beta spill
  // 100-300 bytes there, and 96-thread CTAs (N = 6144) 144, so they keep 4.
  //
  // float32 RMSNorm rows (float32 gamma, no beta) in 128-thread CTAs take 8
  // whether the CTA holds one row or several: with one affine tensor ptxas
  // fits 64 registers without spilling (H100, kernel-only, 4 -> 8, us:
  // 4096x768 14.5 -> 13.0, 4096x1024 17.9 -> 15.8, 4096x2048 29.2 -> 28.1,
  // 4096x4096 51.8 -> 49.9; 16384-32768 rows 0-2.7%; docs/history.md
  // entry 32).
  //
  // LayerNorm rows with float32 gamma and beta there spill at 64 registers
  // but not at 80 (6 CTAs, float32 rows) or 96 (5, 16-bit rows), and run
  // 0.4-3.8% faster than at 4 (H100, kernel-only, us: float32 4096x1024
  // 18.3 -> 17.6, 4096x2048 30.0 -> 28.9; bf16 rows 16384x1024 33.0 -> 31.9,
  // 4096x4096 33.0 -> 32.0; docs/history.md entry 33).
  //
  // A grid of at most one CTA per SM (decode-sized M) is latency-bound, not
  // occupancy-bound: launch bounds of one CTA per SM cost it nothing, and
  // ptxas issues the row's loads together with registers to spare (H100,
  // 8..128 x 4096: 4 against 8 +5-25% per call; 1 against 4, kernel-only,
  // 0-3%: bf16 RMSNorm 32x4096 2.34 -> 2.29 us, LayerNorm 2.67 -> 2.61,
  // LayerNorm 64x8192 3.52 -> 3.46; docs/history.md entry 48).
  //
  // So does a 16-bit grid of more than 2 and at most 4 CTAs per SM, which
  // the 4-CTA bound still runs in one wave (H100, CUDA-graph replay, bf16,
  // 2.5-4 CTAs per SM at N = 1024 / 2048 / 4096: LayerNorm +6-10% against 8,
  // e.g. 4096x1024 12.8 -> 12.0 us; RMSNorm +1-5.5%). At 2 per SM and below
  // the 8-CTA build is as fast or 9-11% faster (LayerNorm), past 4 the
  // second wave costs 9-14%; docs/history.md entry 35.
  const int thread_bytes = nv_row * vec * esize;
  const int wsize = jit::element_size(p.wdtype);
  const bool small_grid = plan.row_blocks <= sm_count;
  const bool one_wave_at_4 = plan.row_blocks > 2 * int64_t(sm_count) && plan.row_blocks <= 4 * int64_t(sm_count);
  // Rows of 81-128 bytes a thread in 128-thread CTAs (the cases below).
  const bool full_cta_row = !small_grid && !p.residual && tpr * rows == 128 && thread_bytes <= 128;
  const bool rms_fp32_row = p.kind == kRmsNorm && esize == 4 && wsize == 4;
  int reg_blocks = 4;
  // Set where the one-wave rule below leaves 128 registers to a row of at
  // most 128 bytes a thread, room for its gamma/beta packs, and where those
  // load beside x (affine_fetch_rule): LayerNorm rows, and RMSNorm rows of
  // CTAs of one or two rows or grids of at most three CTAs an SM.
  bool one_wave_packs = false;
  // (An explicit fwd_min_blocks replaces reg_blocks below, whatever it is.)
  const bool fp32_ln_row =
      p.kind == kLayerNorm && esize == 4 && !p.residual && thread_bytes > 80 && t.reg_headroom != 1;
  if (small_grid)
    reg_blocks = 1;
  else if (wide_ln_row(p, tpr * rows, thread_bytes))
    reg_blocks = fp32_ln_row ? fp32_ln_row_blocks(tpr * rows) : 1;
  else if (!p.residual && thread_bytes <= 80)
    reg_blocks = 8;
  else if (full_cta_row && esize == 2 && wsize == 2 && one_wave_at_4)
    reg_blocks = 4, one_wave_packs = p.kind == kLayerNorm || rows <= 2 || plan.row_blocks <= 3 * int64_t(sm_count);
  else if (full_cta_row && (rms_fp32_row || (esize == 2 && wsize == 2)))
    reg_blocks = rows >= 2 || rms_fp32_row ? 8 : 7;
  else if (full_cta_row && p.kind == kLayerNorm && wsize == 4)
    reg_blocks = esize == 4 ? 6 : 5;
  // LayerNorm rows of more than 80 bytes a thread in CTAs past 128 threads,
  // where 4 CTAs an SM leave 64-80 registers: ptxas spills 16-bit rows there
  // (N = 12288, 192 threads, 80 registers: 88 bytes; 96 fit), and more so
  // beside float32 gamma and beta (N = 16384, 256 threads: 264 bytes at 64,
  // 124 at 80); float32 rows spill 148 bytes at 72 (N = 7168, 224 threads)
  // and 48 at 80. They take the most CTAs that leave 96 registers (float32
  // rows: fp32_ln_row_blocks, entry 68). H100 kernel-only, us (docs/history.md
  // entry 67, float32 at 80 registers): bf16 4096x12288 86.0 -> 71.8, 4096x14336 135.4 -> 94.0 (two
  // CTAs an SM: a persistent grid), float32 16384x7168 492.5 -> 346.1, bf16
  // rows with float32 gamma/beta 4096x16384 207.3 -> 98.5, 512x131072 208.3
  // -> 149.0. Column-cluster slices of same-dtype rows do not spill at 64
  // and lost 20% at two CTAs an SM (bf16 512x131072 105.1 -> 127.9), so
  // only slices beside float32 gamma and beta take it.
  const bool slice_ok = !cluster_slice || (esize == 2 && wsize == 4);
  if (reg_blocks == 4 && p.kind == kLayerNorm && !p.residual && thread_bytes > 80 && tpr * rows > 128 && slice_ok &&
      t.reg_headroom != 1)
    reg_blocks = esize == 4 ? fp32_ln_row_blocks(tpr * rows) : blocks_leaving(tpr * rows, reg_blocks, 96);
  const int reg_min_blocks = min_blocks_for(tpr * rows, pick(t.fwd_min_blocks, reg_blocks));
  // Threads those launch bounds guarantee per SM; under 512 (a 96-thread CTA
  // at N = 6144 taking 168 registers) LayerNorm's multi-wave grid has too few
  // rows in flight, and a persistent one prefetching its next row wins
  // (2469 -> 2667 GB/s); RMSNorm's lighter rows still reach 99% of copy
  // there, ahead of persistent CTAs (2916 vs 2812).
  const bool low_residency = p.kind == kLayerNorm && !small_grid && reg_min_blocks * tpr * rows < 512;
  // A multi-wave grid of one CTA an SM (wide_ln_row's launch bounds), each
  // holding a 16-bit LayerNorm row in registers, keeps a single row's reads
  // in flight an SM, and none while the CTA reduces and writes it. Each CTA
  // therefore prefetches into L2 the row block a device-full of CTAs ahead
  // (the one the CTA that next takes its SM will load) and stores
  // evict-first. This replaces low_residency's persistent grid for rows of
  // 257-511 threads. H100 kernel-only, L2 flushed, us (docs/history.md
  // entry 62): bf16 512 / 1024 / 2048 / 4096 / 8192 x 32768 31.1 -> 26.8,
  // 52.8 -> 48.2, 97.6 -> 93.1, 187.9 -> 184.4, 472.0 -> 409.3; fp16
  // 2048x32768 97.9 -> 93.1; bf16 2048x24576 81.6 (persistent) -> 71.7,
  // 4096x20480 131.5 -> 118.0. float32 rows land either way (1024 / 2048 /
  // 4096 / 8192 x 16384: 50.0 -> 49.8, 94.3 -> 96.1, 184.9 -> 187.8, 424.5 ->
  // 366.7), two device-fulls ahead lost 30% (bf16 2048x32768: 126.8), and
  // RMSNorm's 1024-thread rows lost 10-30% (2048x65536 183.9 -> 238.6), so
  // the rule keeps to 16-bit LayerNorm rows. (Read only for a row cached in
  // registers: the mode choice below and plan.prefetch_ahead both imply it.)
  const bool wide_regs = !smem_fits && wide_ln_regs;
  const bool ahead_rule = t.fwd_prefetch_ahead != 1 && !wide_regs && wide_ln_row(p, tpr * rows, thread_bytes) &&
                          !small_grid && reg_min_blocks == 1 && (esize == 2 || t.fwd_prefetch_ahead == 2);

  // Narrow rows run persistent up to kNarrowPersistentBlocksPerSm row blocks
  // per SM at the base vectors per thread; a CTA of fuller threads counts as
  // nv_row / base blocks, so the same bytes of x switch it (H100: LayerNorm
  // bf16 65536x512 at 8 vectors, persistent 2211 GB/s, one CTA per row block
  // 2485).
  const bool narrow_persistent = plan.row_blocks * std::max(nv_row, kNarrowBaseVecs) <=
                                 int64_t(kNarrowBaseVecs) * kNarrowPersistentBlocksPerSm * sm_count;
  // Rows of dense_narrow_threads at its two vectors a thread (a tuning
  // override of the vectors or bounds opts out): 256-thread CTAs, multi-wave.
  const bool dense_narrow = dense_rule && reg_can && nv_row == kNarrowBaseVecs && t.fwd_min_blocks == 0;

  Reason why(explain ? &plan.reason : nullptr);
  NormMode mode = requested;
  if (mode == NormMode::kAuto) {
    if (!fits) {
      mode = NormMode::kMultiWaveReload;
      why << "row of " << p.hidden << " elements exceeds the register cache (" << kFwdCacheBytes
          << " bytes per thread at 1024 threads) and shared memory (" << max_smem_per_block(arch) / 1024
          << " KB per CTA on sm_" << arch << "), so x is re-read for the normalize pass";
    } else if (dense_narrow) {
      mode = NormMode::kMultiWaveCached;
      why << "narrow 16-bit rows at " << kNarrowBaseVecs << " vectors per thread (" << 65536 / dense_threads / 8 * 8
          << " registers): " << rows << " rows per CTA, one CTA per row block, launch bounds of " << dense_threads
          << " threads per SM" << (dense_narrow_preload(p) ? ", gamma/beta loaded beside x" : "");
    } else if (narrow && narrow_persistent) {
      mode = NormMode::kStaticPersistent;
      why << "narrow rows (N <= " << kNarrowRow << ") and at most " << kNarrowPersistentBlocksPerSm << " row blocks of "
          << kNarrowBaseVecs << " vectors per thread per SM: " << rows
          << " rows per CTA, persistent CTAs load gamma once";
    } else if (narrow) {
      mode = NormMode::kMultiWaveCached;
      why << "narrow rows (N <= " << kNarrowRow << ") in many waves: " << rows
          << " rows per CTA, one CTA per row block";
    } else if (smem_fits) {
      mode = NormMode::kMultiWaveCached;
      why << "row of " << row_bytes / 1024 << " KB kept in shared memory: read x once, one chunk of "
          << std::min(nv_row, smem_vecs) * vec << " elements per thread in registers at a time";
    } else if (low_residency && !ahead_rule) {
      mode = NormMode::kStaticPersistent;
      why << kRegisterRowWhy << nv_row * vec << " elements per thread) but launch bounds guarantee only "
          << reg_min_blocks * tpr * rows << " threads per SM: persistent CTAs prefetch their next row into L2";
    } else {
      mode = NormMode::kMultiWaveCached;
      why << kRegisterRowWhy << nv_row * vec << " elements per thread): read x once";
      if (kFwdVecsTarget == kLatencyVecs && t.fwd_vecs_target == 0 && nv_row < kWideVecs)
        why << "; few rows (latency-bound): " << nv_row << " vectors per thread rather than " << kWideVecs;
    }
  } else {
    why << "mode requested";
    if (mode != NormMode::kMultiWaveReload && !fits)
      why << "; row of " << p.hidden << " elements fits neither registers nor shared memory, so it is streamed "
          << "twice (reload)";
    else if (mode != NormMode::kMultiWaveReload && smem_fits)
      why << "; row kept in shared memory (" << row_bytes / 1024 << " KB)";
  }
  plan.mode = mode;
  plan.persistent = mode == NormMode::kStaticPersistent;
  plan.cached = fits && mode != NormMode::kMultiWaveReload;
  const bool in_smem = plan.cached && smem_fits;
  const bool in_regs = plan.cached && !smem_fits;
  plan.prefetch_ahead = ahead_rule && in_regs && !plan.persistent;
  plan.smem = in_smem ? static_cast<size_t>(rows * row_bytes) : 0;
  const int nv = in_regs ? nv_row : std::min(nv_row, smem_fits ? smem_vecs : kFwdVecsTarget);
  const int wtensors = int(p.has_weight) + int(p.has_bias);
  const bool keep = plan.persistent && in_regs && wtensors > 0 && nv * vec * wtensors <= pick(t.keep_gamma_floats, 16);
  // dense_narrow: dense_threads an SM, past min_blocks_for's 64-register
  // floor (a mode forced persistent keeps the narrow bounds: its kept gamma
  // needs them).
  const bool dense_bounds = dense_narrow && !plan.persistent && in_regs;
  const bool packs_fit = (dense_bounds && dense_narrow_preload(p)) || (one_wave_packs && t.fwd_min_blocks == 0);

  KernelKey k = base_key(p, fwd_family(p.kind), arch);
  k.vec = static_cast<int16_t>(vec);
  k.threads_per_row = static_cast<int16_t>(tpr);
  k.rows_per_cta = static_cast<int16_t>(rows);
  k.vecs_per_thread = static_cast<int16_t>(nv);
  k.flags = (p.has_weight ? kHasWeight : 0u) | (p.has_bias ? kHasBias : 0u) | (p.zero_centered ? kZeroCentered : 0u) |
            (p.residual ? kResidual : 0u) | (in_regs ? kCachedRow : 0u) | (in_smem ? kSmemRow : 0u) |
            (keep ? kKeepGamma : 0u) |
            hint_bits(t.fwd_hints, ((p.hidden >= 32768 && !in_smem) || plan.prefetch_ahead) && !wide_regs,
                      (plan.persistent && in_regs) || plan.prefetch_ahead) |
            affine_fetch_rule(t.fwd_affine_prefetch, p, keep, in_regs, nv, few_rows, small_grid,
                              !cluster_slice && tpr * rows >= 512 && wide_ln_row(p, tpr * rows, thread_bytes),
                              packs_fit, wide_regs);
  // Sweeps: capping registers at 4 CTAs/SM (128 per thread at 128 threads)
  // keeps more rows in flight than the compiler's own choice. A shared-memory
  // row allows no more CTAs per SM than its rows fit there.
  // float32 gamma and beta beside a 16-bit row in shared memory want 128
  // registers (one CTA per SM): 1441 -> 1728 GB/s at LayerNorm 2048x32768,
  // a row that entry 45 has since moved to registers.
  const bool wide_affine = in_smem && p.has_bias && jit::element_size(p.wdtype) > esize;
  int min_blocks = in_regs && !narrow ? reg_min_blocks : pick(t.fwd_min_blocks, wide_affine ? 1 : 4);
  if (in_smem) min_blocks = smem_capped_blocks(min_blocks, static_cast<int64_t>(plan.smem), arch);
  // A LayerNorm chunk of a shared-memory row (nv vectors a thread) with its
  // gamma, beta and sums needs about one register per 2 bytes of the chunk
  // and 32 more: ptxas spilled 120-172 bytes at 64-80 (bf16 N = 49152, 384
  // threads, 256-byte chunks; float32 24576; float32 8192, 256 threads,
  // 128-byte chunks at 4 CTAs an SM). H100 kernel-only, us (entry 67): bf16
  // 4096x49152 434.3 -> 337.1, float32 1024x24576 118.2 -> 81.6, float32
  // 4096x8192 137.2 -> 92.8, 16384x8192 537.2 -> 357.0. Column-cluster
  // slices (float32 1024x65536) lost 17% there and keep their bounds.
  if (in_smem && !cluster_slice && p.kind == kLayerNorm && t.fwd_min_blocks == 0 && t.reg_headroom != 1)
    min_blocks = blocks_leaving(tpr * rows, min_blocks, nv * vec * esize / 2 + 32);
  // Narrow 16-bit LayerNorm rows beside float32 gamma and beta, 64 elements
  // a thread, spill 280 bytes at 4 CTAs an SM (64 registers) like the wide
  // rows above, and take the same 96 (entry 67: 65536x512 105.5 -> 50.6 us,
  // 16384x512, a persistent grid, 28.0 -> 15.7).
  if (in_regs && narrow && p.kind == kLayerNorm && esize == 2 && jit::element_size(p.wdtype) == 4 &&
      nv * vec * esize > 80 && t.fwd_min_blocks == 0 && t.reg_headroom != 1)
    min_blocks = blocks_leaving(tpr * rows, min_blocks, 96);
  k.variant = static_cast<int16_t>(dense_bounds ? std::max(1, dense_threads / (tpr * rows))
                                                : min_blocks_for(tpr * rows, min_blocks));
  plan.key = k;
  why << "; vec=" << vec << " threads_per_row=" << tpr << " rows_per_cta=" << rows << " vecs_per_thread=" << nv
      << (in_smem ? "; shared memory " + std::to_string(plan.smem) + " bytes" : std::string())
      << (plan.persistent ? kPersistentGridWhy : kMultiWaveGridWhy) << (keep ? "; gamma kept in registers" : "")
      << (plan.prefetch_ahead ? kPrefetchAheadWhy : "") << (wide_regs && in_regs ? kWideLnRegsWhy : "");
  why.finish();
  return plan;
}

// Column-kernel CTA threads and rows each thread keeps in flight; the
// coefficient kernel streams vectors of kSplitCoefVecs per thread per chunk.
constexpr int kSplitColThreads = 256;
// Rows in flight: 64 bytes of x (and of dy) per thread, 4 to 16 rows.
constexpr int kSplitBytesInFlight = 64;
constexpr int kSplitCoefVecs = 4;

static NormBwdPlan plan_split_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int arch,
                                  bool explain, int vec, NormBwdPlan plan) {
  const NormTuning& t = norm_tuning();
  const int64_t nvec = p.hidden / vec;
  const unsigned affine = (p.has_weight ? kHasWeight : 0u) | (p.zero_centered ? kZeroCentered : 0u);
  KernelKey c = base_key(p, p.kind == kRmsNorm ? &kRmsNormBwdCoef : &kLayerNormBwdCoef, arch);
  const int ctpr = choose_tpr(nvec, kSplitCoefVecs);
  c.vec = static_cast<int16_t>(vec);
  c.threads_per_row = static_cast<int16_t>(ctpr);
  c.rows_per_cta = 1;
  c.vecs_per_thread = static_cast<int16_t>(std::min<int64_t>(kSplitCoefVecs, ceil_div(nvec, ctpr)));
  c.flags = affine;
  c.variant = 1;
  plan.coef_key = c;

  KernelKey k = base_key(p, p.kind == kRmsNorm ? &kRmsNormBwdCols : &kLayerNormBwdCols, arch);
  k.vec = static_cast<int16_t>(vec);
  k.threads_per_row = static_cast<int16_t>(std::min<int64_t>(kSplitColThreads, pow2_ceil(nvec)));
  k.rows_per_cta = 1;
  const int ru = std::clamp(kSplitBytesInFlight / (vec * jit::element_size(p.dtype)), 4, 16);
  k.vecs_per_thread = static_cast<int16_t>(pick(t.bwd_split_rows, ru));
  k.flags = affine | (grad_dh ? kGradDh : 0u) | (want_dw ? kWantDw : 0u) | (want_db ? kWantDb : 0u) |
            hint_bits(t.bwd_hints, true, false);
  // 128 registers per thread at most: RU rows of x and dy plus fp32 dW/dB.
  k.variant = 2;
  plan.key = k;
  plan.row_blocks = p.rows;
  plan.smem = 0;
  Reason why(explain ? &plan.reason : nullptr);
  why << "row of " << p.hidden << " elements does not fit in registers: split backward, a per-row coefficient "
      << "kernel (" << ctpr << " threads per row) then a column kernel (" << k.threads_per_row
      << " threads, each owning " << vec << " columns and " << k.vecs_per_thread
      << " rows in flight) over row tiles, each tile writing one fp32 partial row";
  why.finish();
  return plan;
}

SplitGrid split_grid(const NormBwdPlan& plan, int64_t rows, int sm_count) {
  SplitGrid g;
  const int64_t nvec = plan.key.hidden / plan.key.vec;
  g.col_tiles = ceil_div(nvec, plan.key.threads_per_row);
  // About 8 column CTAs per SM in total, and at least 32 rows per tile, so the
  // partial rows stay a few percent of the traffic; gridDim.y <= 65535.
  const int64_t want = ceil_div(int64_t(sm_count) * 8, g.col_tiles);
  const int64_t tiles = std::max<int64_t>(1, std::min(want, rows / 32));
  g.rows_per_tile = std::max(ceil_div(rows, tiles), ceil_div(rows, 65535));
  g.row_tiles = ceil_div(rows, g.rows_per_tile);
  return g;
}

// What a caller asks of a CTA's backward plan beyond the rules below: the
// elements a thread caches (0: the rule), whether its rows are staged
// through shared memory (the cluster slices of 16-bit rows) and the CTA size
// of a many-row grid (0: the rule).
struct BwdCtaHint {
  int cache_elems = 0;
  bool staged = false;
  int cta_threads = 0;
  bool column_grid = false;  // CTAs of exactly cta_threads for a column-gradient grid
  // A one-wave column grid (one_wave_column_plan): register rows, never
  // staged, at launch bounds of min_blocks CTAs an SM.
  bool one_wave = false;
  int min_blocks = 0;
  int max_tpr = 0;  // threads a row at most (0: the layout's choice)
};

// H100 kernel-only sweep (docs/history.md, entry 20): staging 16-bit rows
// of 7168+ elements through shared memory gains 2-13% over registers
// (RMSNorm 4096x16384 1962 -> 2142 GB/s, 16384x7168 2265 -> 2406, LayerNorm
// 16384x8192 2414 -> 2542); narrower rows lose 5-10% (RMSNorm 16384x4096 2613
// -> 2416) and float32 rows lose 9-20%. Beside the residual's dh (three
// tensors in the ring) N = 8192 lost 5% (16384x8192 2862 -> 2707) and 16384
// gained 13% (4096x16384 2145 -> 2427).
static bool stage_rule(const NormProblem& p, bool grad_dh) {
  return jit::element_size(p.dtype) == 2 && (grad_dh ? p.hidden > 8192 : p.hidden >= 7168);
}

// RMSNorm grids of a few 16-bit register rows (up to 256 threads a row): CTAs
// sized to the rows rather than 512 threads. A grid of one row block gets a
// CTA of just its rows (no idle row groups in its barriers); up to 32 row
// blocks of 128-thread (or one-row) CTAs put more SMs on the rows, whose extra
// fp32 partial rows stay few. H100 kernel-only, bf16, persisting L2 lines reset,
// median of 3 (docs/history.md entry 43), 512 threads -> this rule, us:
// 2x1024 2.77 -> 2.48, 16x1024 4.50 -> 3.78, 64x1024 4.60 -> 4.24, 2x2048 2.94 ->
// 2.69, 8x2048 4.53 -> 3.78, 32x2048 4.63 -> 4.24, 8x4096 4.78 -> 4.44, 16x4096
// 4.90 -> 4.64, 32x4096 5.15 -> 5.07. Past 32 such row blocks the partial rows
// cost more than the SMs gain (one-row CTAs: 64x4096 5.67 -> 5.72, 128x4096 6.63
// -> 7.05); LayerNorm lost at 32x4096 (6.41 -> 6.76) and keeps 512.
static int few_row_rms_threads(const NormProblem& p, int tpr, int threads) {
  constexpr int kFewRowMaxBlocks = 32;
  constexpr int kFewRowCtaThreads = 128;
  if (p.kind != kRmsNorm || jit::element_size(p.dtype) != 2 || tpr > 256 || p.rows <= 1) return threads;
  const int64_t fit = threads / tpr;  // rows a CTA of `threads` holds
  // (rounded up to a power of two, for fewer kernels, but never past `fit`
  // where the threads of a row are not a power of two)
  if (p.rows <= fit) return tpr * static_cast<int>(std::min(fit, pow2_ceil(p.rows)));
  const int rows = std::max(1, kFewRowCtaThreads / tpr);
  return ceil_div(p.rows, rows) <= kFewRowMaxBlocks ? tpr * rows : threads;
}

// One stage of the backward's staging ring (kStagedRow): x and dy (and the
// residual's dh) of a CTA's `rows` rows of `cols` elements.
static int64_t ring_stage_bytes_of(int64_t rows, int64_t cols, int esize, bool grad_dh) {
  return rows * cols * esize * (grad_dh ? 3 : 2);
}

// Row blocks per SM past which a persistent backward CTA walks enough rows
// for a deeper pipeline (a third ring stage, the next-row prefetch) to pay.
constexpr int kDeepPipeRowBlocksPerSm = 4;

// How a plan's gradients leave the CTAs (explain() text): replaced by the
// column CTAs' account where they take over (with_column_grads_rule).
constexpr const char* kDirectGradsWhy =
    "; one row block: its CTA writes its column sums as the gradients (no partial rows, no column reduce)";
constexpr const char* kPartialRowsWhy = "; grid = SMs x occupancy, one fp32 partial row per CTA";
// early_direct_grads (H100, bf16, us, docs/history.md entry 77: RMSNorm
// 1x4096 2.23 -> 2.12, LayerNorm 2.48 -> 2.29, float32 RMSNorm 2.57 -> 2.35).
constexpr const char* kEarlyGradsWhy = "; the gradients are stored before the row reduction";

// explain() text of a row split into column slices, which the grid-group rule
// (with_grid_exchange) rewrites for slices that are not a hardware cluster.
constexpr const char* kSlicesOnClusterWhy = "; row split across a cluster of ";
constexpr const char* kClusterMergeWhy = " columns each, statistics merged through distributed shared memory";
constexpr const char* kClusterDeferWhy = "; the cluster's row sums are collected one row block late";

// Replaces the first `from` in a plan's reason by `to`; false where absent.
static bool replace_phrase(std::string& reason, const std::string& from, const std::string& to) {
  const size_t at = reason.find(from);
  if (at == std::string::npos) return false;
  reason.replace(at, from.size(), to);
  return true;
}

// Whether a plan's column slices may be a grid group (kGridExchange) rather
// than a hardware cluster: grid_collect has a whole warp of each slice's row
// group fetch the CL partials.
static bool grid_group_eligible(const jit::KernelKey& key, int arch) {
  return arch >= 90 && key.cluster > 1 && key.threads_per_row % 32 == 0;
}

// Makes a slice plan's hardware cluster a grid group: the flags keep the
// slices, the launch has no cluster shape. explain() text says that the
// slices' `sums` meet through global memory (a slice plan's text always
// holds both phrases, from widen_to_cluster).
template <typename Plan>
static void to_grid_group(Plan& plan, const char* sums, bool explain) {
  plan.key.flags |= kGridExchange;
  plan.key.cluster = 1;
  if (!explain) return;
  const bool rewritten = replace_phrase(plan.reason, kSlicesOnClusterWhy, "; row split across a group of ") &&
                         replace_phrase(plan.reason, kClusterMergeWhy,
                                        std::string(" columns each, ") + sums + " merged through global memory");
  TORCH_INTERNAL_ASSERT(rewritten, "rtcnorm: explain() text of a slice plan lost a phrase");
}

static NormBwdPlan plan_bwd_cta(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count, int arch,
                                bool explain, BwdCtaHint hint = {}) {
  const NormTuning& t = norm_tuning();
  const bool narrow = is_narrow_row(p);
  // H200 sweeps: narrow rows want 8 cached elements per thread and 1024-thread
  // CTAs; RMSNorm above 8K up to 16K wants 32; everything else 16 at 512
  // threads. At N = 8192 32 elements spilled (H100, 16384x8192 kernel-only:
  // bf16 2295 -> 2649 GB/s at 16, fp32 1988 -> 2881); at 16384 16 elements
  // would take 1024-thread CTAs of 64 registers (fp32 2192 -> 1923).
  const bool wide_rms = p.kind == kRmsNorm && p.hidden > 8192 && p.hidden <= 16384;
  const int kBwdCacheElems = pick(t.bwd_cache_elems, pick(hint.cache_elems, narrow ? 8 : (wide_rms ? 32 : 16)));
  NormBwdPlan plan;
  const int vec = choose_vec(p);
  const int64_t nvec = p.hidden / vec;
  const int nv_target = std::max(1, kBwdCacheElems / vec);
  const int tpr = std::min(choose_tpr(nvec, nv_target), pick(hint.max_tpr, 1024));
  const int nv_row = static_cast<int>(ceil_div(nvec, tpr));
  // At 1024 threads a thread has 64 registers: LayerNorm's two accumulator
  // sets spill there, so LayerNorm caches only up to 512 threads per row.
  plan.cached = nv_row * vec <= kBwdCacheElems && (tpr <= 512 || p.kind == kRmsNorm);
  // A single row (decode) takes a CTA of one row group (at least a warp):
  // no idle groups in its barriers and no bundles to combine. H100
  // kernel-only, bf16 (docs/history.md entry 39): RMSNorm 1x4096 2.97 ->
  // 2.45 us, LayerNorm 1x4096 3.71 -> 2.65.
  const int base_threads = p.rows == 1 ? std::max(32, tpr) : (narrow ? 1024 : pick(hint.cta_threads, 512));
  const int row_threads =
      plan.cached && !narrow && !hint.column_grid ? few_row_rms_threads(p, tpr, base_threads) : base_threads;
  const int rows = plan.cached ? std::max(1, pick(t.bwd_cta_threads, row_threads) / tpr) : 1;
  const int base_rows = std::max(1, base_threads / tpr);
  const bool few_row_ctas = plan.cached && t.bwd_cta_threads == 0 && rows != base_rows;
  const int nv = plan.cached ? nv_row : std::min(nv_row, nv_target);
  plan.row_blocks = ceil_div(p.rows, rows);
  plan.lone_sized_cta = few_row_ctas && plan.row_blocks == 1;
  const int bundles = bwd_bundles(tpr, rows);
  const bool accum = want_dw || want_db;
  plan.smem = (plan.cached && accum && bundles > 1) ? size_t(bundles) * size_t(p.hidden) * sizeof(float) : 0;

  plan.split = !plan.cached && pick(t.bwd_split, 2) == 2;
  if (plan.split) return plan_split_bwd(p, want_dw, want_db, grad_dh, arch, explain, vec, plan);

  KernelKey k = base_key(p, bwd_family(p.kind), arch);
  k.vec = static_cast<int16_t>(vec);
  k.threads_per_row = static_cast<int16_t>(tpr);
  k.rows_per_cta = static_cast<int16_t>(rows);
  k.vecs_per_thread = static_cast<int16_t>(nv);
  // CTAs under 512 threads left uncapped take so many registers that one or
  // two fit per SM (N = 5120: 320 threads); two per SM was 45% faster.
  // LayerNorm's two accumulator sets need ~96 registers: two CTAs of 448
  // threads (N = 7168) cap them at 72 and spill 176 bytes, so one CTA per SM
  // there (H100, 16384x7168: 1473 -> 2143 GB/s; N = 5120 keeps two: 2290 vs 1830).
  const int threads = tpr * rows;
  // A one-row RMSNorm CTA whose kept terms (kKeepTerms, below) fit one CTA's
  // registers but not two's (N = 6144 and 7168: 384 and 448 threads) runs one
  // per SM and keeps them. H100 graph replay, bf16 (docs/history.md entry
  // 38): 16384x6144 229.3 -> 221.0 us, 16384x7168 284.1 -> 265.9; N = 5120
  // keeps them at two per SM (187.0 us; 193.8 at one).
  // Whether `regs` registers a thread fit launch bounds of `blocks_per_sm`
  // CTAs; terms_fit_at asks it for the kept terms (the estimate below).
  const auto regs_fit_at = [&](int blocks_per_sm, int regs) {
    return regs <= std::min(255, 65536 / (blocks_per_sm * threads));
  };
  const int elems = nv * vec, accums = int(want_dw) + int(want_db);
  const auto terms_fit_at = [&](int blocks_per_sm) {
    return !narrow && elems <= 16 && regs_fit_at(blocks_per_sm, elems * (3 + accums) + 32);
  };
  const bool terms_need_one = p.kind == kRmsNorm && plan.cached && rows == 1 && terms_fit_at(1) && !terms_fit_at(2) &&
                              pick(t.bwd_keep_terms, 2) == 2;
  // RMSNorm's one gradient set fits two CTAs an SM where its dW accumulators
  // and the row's values (2 x 32 registers at 32 elements a thread) and 32
  // more fit: rows of 11264-14336 16-bit elements in CTAs of 352-448 threads
  // spilled 160-350 bytes at two an SM (ptxas, sm_90 / sm_100) and ran at
  // 47-57% of copy; one an SM, H100 kernel-only, bf16 (docs/history.md
  // entry 65): 4096x12288 179.5 -> 125.9 us, 4096x14336 257.4 -> 152.0,
  // 64x12288 14.5 -> 12.0; 320 threads (10240, 102 registers) keep two.
  // Rows of at most 16 cached elements a thread without kept terms spilled
  // at the estimates above where two CTAs leave few registers (ptxas,
  // sm_90): 16-bit RMSNorm at 64 and 72 registers (N = 1536, 2560: 56
  // bytes; 3584: 28), float32 RMSNorm at 64-80 (152-280 bytes), float32
  // LayerNorm with dW and dB at 96 (N = 5120: 120 bytes). Those need 80 (16-bit
  // RMSNorm), 112 (float32 RMSNorm) and, for LayerNorm's float32 rows, the
  // row's x and dy as floats beside both gradient sets and 40 more, counted
  // on the partitions' registers (regs_at). H100 kernel-only, us (entry 67):
  // bf16 RMSNorm 4096x2560 47.0 -> 38.7, 4096x1536 31.5 -> 25.7, 4096x3584
  // 56.4 -> 42.8; float32 4096x2560 125.3 -> 58.8, 16384x5120 383.0 ->
  // 348.0; float32 LayerNorm 16384x5120 467.5 -> 345.7, 4096x9216 267.2 ->
  // 174.4.
  int two_need = p.kind == kRmsNorm ? 2 * elems + 32 : 96;
  bool two_fits_regs = regs_fit_at(2, two_need);
  if (elems <= 16 && t.reg_headroom != 1) {
    const bool fp32_row = jit::element_size(p.dtype) == 4;
    if (p.kind == kRmsNorm)
      two_need = fp32_row ? 112 : 80;
    else if (fp32_row)
      two_need = std::max(two_need, 2 * elems + accums * elems + 40);
    two_fits_regs = two_need <= regs_at(threads, 2);
  }
  const bool two_fit = threads < 512 && !terms_need_one && two_fits_regs;
  const int min_blocks = min_blocks_for(threads, pick(t.bwd_min_blocks, pick(hint.min_blocks, two_fit ? 2 : 1)));
  // H100 sweep: the next-row prefetch gains 6-11% for 512-thread CTAs of at
  // most 16 cached elements (N = 1K..8K) and loses up to 40% where registers
  // are tight (1024-thread narrow CTAs, 32 cached elements, two CTAs of
  // 320-448 threads at N = 5120 / 7168). A lone CTA under 512 threads of one
  // or two rows has registers to spare for it (LayerNorm, docs/history.md
  // entry 17, bf16 16384 rows: N = 3072 2048 -> 2335 GB/s, 6144 2058 -> 2295,
  // 7168 2168 -> 2382); three rows of 160 threads (N = 2560) lost 12%.
  // Evict-first stores help wide rows and narrow LayerNorm rows.
  const bool lone_cta = threads < 512 && min_blocks == 1 && rows <= 2;
  // The staging ring (kStagedRow): S stages of the CTA's rows of x, dy and
  // dh, in 16-byte vectors; it must fit the CTA's shared memory. Two stages,
  // but three for a one-row CTA whose two-stage ring leaves no room for a
  // second CTA on the SM: that CTA alone keeps the SM's rows in flight, one
  // row's copies beside the row it works on with two stages, two with three
  // (H100, bf16 RMSNorm 4096x16384, 128 KB -> 192 KB: 181.8 -> 160.5 us).
  // Rings of two CTAs per SM (64 KB: 4096x8192, 16384x8192, 16384x7168,
  // 256x8192) and column-cluster slices of 2-4 rows (2048x32768, 1024x65536,
  // LayerNorm 4096x16384) lost 0-10% with three (docs/history.md entry 46).
  // Both this and the prefetch rule below take grids of several row blocks a
  // CTA (more than kDeepPipeRowBlocksPerSm per SM): with one or two a CTA the
  // deeper pipeline has nothing to fetch ahead (256x16384 22.4 -> 22.7 us,
  // 256x5120 10.6 -> 11.0).
  const int esize = jit::element_size(p.dtype);
  const int64_t ring_stage_bytes = ring_stage_bytes_of(rows, p.hidden, esize, grad_dh);
  const int64_t smem_cap = max_smem_per_block(arch);
  const bool many_row_blocks = plan.row_blocks > int64_t(kDeepPipeRowBlocksPerSm) * sm_count;
  const bool deep_ring =
      rows == 1 && !grad_dh && many_row_blocks && 4 * ring_stage_bytes > smem_cap && 3 * ring_stage_bytes <= smem_cap;
  const int ring_stages = std::max(2, pick(t.bwd_ring_stages, deep_ring ? 3 : 2));
  const int64_t ring = ring_stages * ring_stage_bytes;
  const bool staged = plan.cached && vec * esize % 16 == 0 && ring <= smem_cap && !hint.one_wave &&
                      pick(t.bwd_stage, hint.staged || stage_rule(p, grad_dh) ? 2 : 1) == 2;
  if (staged) plan.smem = std::max<size_t>(plan.smem, static_cast<size_t>(ring));
  // A ring allows no more CTAs per SM than fit its shared memory.
  const int blocks = staged ? smem_capped_blocks(min_blocks, ring, arch) : min_blocks;
  // Terms kept as floats between the passes (kKeepTerms): xhat, w * dy and
  // gamma, 3 floats per element beside the dW (and dB) accumulators. They
  // cut the loop's instructions by a quarter or more and gain 1-9% wherever
  // they fit the launch bounds' registers (H100, CUDA-graph replay, bf16:
  // RMSNorm 16384x8192 303 -> 287 us, 4096x4096 48.5 -> 45.0, LayerNorm
  // 16384x7168 300 -> 281, 4096x1024 21.3 -> 19.7; docs/history.md entry
  // 34). Where they do not (32-element cluster slices: 200-400 bytes of
  // spill, 2048x32768 -37%; 7168-wide RMSNorm rows at two 448-thread CTAs
  // per SM, -10%, which therefore run one per SM, above) the rows keep the
  // two reads. Rows of at most 16 elements a thread take them where the
  // estimate, with 32 registers for addresses, statistics and loop state,
  // fits the launch bounds (ptxas reports no spill for any such kernel of
  // N = 64..131072 on sm_90); narrow rows (8 elements) moved -1.2% to +1.6%,
  // so they keep the two reads too.
  const bool keep_terms = plan.cached && pick(t.bwd_keep_terms, terms_fit_at(blocks) ? 2 : 1) == 2;
  // One-row 16-bit RMSNorm CTAs of under 512 threads, two per SM with their
  // terms kept (N = 5120: 320 threads), take the next-row prefetch too: H100 bf16
  // 16384x5120 184.3 -> 178.5 us, 32768x5120 359.7 -> 351.7. LayerNorm's
  // there (no kept terms at two per SM) lost 64% (entry 46).
  const bool rms_two_kept = p.kind == kRmsNorm && esize == 2 && !grad_dh && !few_row_ctas && many_row_blocks &&
                            !staged && rows == 1 && threads < 512 && blocks == 2 && keep_terms;
  const bool prefetch_next =
      plan.cached && !staged && !narrow && kBwdCacheElems <= 16 && (threads == 512 || lone_cta || rms_two_kept);
  // One row block: the lone CTA's (or cluster's) column sums are dW / dB
  // themselves, written in the weight dtype, and no column reduce runs
  // (kDirectGrads). H100 graph replay, bf16 (docs/history.md entry 37):
  // RMSNorm 1x4096 8.35 -> 6.98 us, 1x65536 23.7 -> 11.9; LayerNorm 1x8192
  // 10.8 -> 7.5, 1x65536 36.2 -> 13.2.
  const bool direct = plan.cached && accum && plan.row_blocks == 1 && pick(t.bwd_direct_grads, 2) == 2;
  k.flags = (p.has_weight ? kHasWeight : 0u) | (p.zero_centered ? kZeroCentered : 0u) |
            (plan.cached ? kCachedRow : 0u) | (staged ? kStagedRow : 0u) | (grad_dh ? kGradDh : 0u) |
            (want_dw ? kWantDw : 0u) | (want_db ? kWantDb : 0u) |
            (staged ? static_cast<unsigned>(ring_stages - 2) << kRingExtraShift : 0u) | (keep_terms ? kKeepTerms : 0u) |
            (direct ? kDirectGrads : 0u) | hint_bits(t.bwd_hints, p.hidden >= 8192 || narrow, prefetch_next);
  k.variant = static_cast<int16_t>(blocks);
  plan.key = k;
  Reason why(explain ? &plan.reason : nullptr);
  if (staged)
    why << "x and dy staged through a " << ring_stages << "-stage shared-memory ring (" << ring / 1024
        << " KB, the next "
        << (ring_stages == 2 ? std::string("row's copies") : std::to_string(ring_stages - 1) + " rows' copies")
        << " in flight), dW partials in registers";
  else if (plan.cached)
    why << "x and dy kept in registers, dW partials in registers";
  else
    why << "row streamed twice, dW partials accumulated in the CTA's own partial row";
  if (keep_terms) why << "; xhat, w*dy and gamma kept as floats between the two passes";
  why << "; vec=" << vec << " threads_per_row=" << tpr << " rows_per_cta=" << rows << " vecs_per_thread=" << nv;
  if (few_row_ctas) why << "; few 16-bit rows: CTAs of " << tpr * rows << " threads rather than " << tpr * base_rows;
  if (hint.column_grid) why << "; column-gradient grid: CTAs of " << tpr * rows << " threads";
  why << (direct ? kDirectGradsWhy : kPartialRowsWhy);
  why.finish();
  return plan;
}

// ---- Thread-block clusters (sm_90+, common/cluster.cuh) ----
// A wide row is split into CL column slices, one per CTA of a cluster, and
// each slice is planned as a row of N / CL: the same kernel, whose
// statistics then meet through distributed shared memory. The rule (from
// kernel-only sweeps, docs/history.md entry 18):
// - forward: only rows no single CTA caches, which are then read once
//   instead of twice: 512x131072 bf16 RMSNorm
//   1805 -> 2460 GB/s (H100), LayerNorm 1515 -> 1734; rows one CTA caches
//   lost 3-25% when split (a cluster barrier per row);
// - backward: float32 rows past 8192 elements gain 30-45% over the split
//   design (H200, RMSNorm 2048x32768 2284 -> 3127, LayerNorm 4096x16384
//   2243 -> 3228) and RMSNorm's one-CTA rows of 16384, which spill 400
//   bytes (2466 -> 3262; H100 2121 -> 2527). 16-bit rows carry half the
//   bytes per barrier and did not beat the split design with one row per
//   barrier (H200 -4% to -22%, H100 -10% to +12%); staged through shared
//   memory, 32 elements a thread, slices of 4096 elements (several rows
//   per CTA, so per barrier) they do (entry 20, H100: RMSNorm 2048x32768
//   1549 -> 1957 GB/s, 1024x65536 1536 -> 1859; LayerNorm 1491 -> 2011,
//   1446 -> 1815, 4096x16384 1535 -> 2029). Rows of 131072 (slices of
//   16384) stay split: no cluster plan beat it there.
constexpr int kMaxCluster = jit::kMaxPortableCluster;
// The largest cluster a tuning override (or the 16-CTA backward rule) may
// ask for: sm_90's non-portable size there, the portable one elsewhere.
static int max_cluster_on(int arch) { return arch == 90 ? jit::kMaxNonPortableCluster : kMaxCluster; }
// Widest slice the rule splits a row down to: the forward's best register
// rows are 16-32 KB (RMSNorm / LayerNorm 4096x16384 bf16: 96-97% of copy),
// the backward's 8192 elements (16 per thread at 512 threads).
constexpr int64_t kFwdSliceBytes = 32 * 1024;
constexpr int64_t kBwdSliceElems = 8192;
constexpr int64_t kBwd16SliceElems = 4096;
constexpr int kBwd16CacheElems = 32;

// CTAs per cluster for a row of `units` (bytes or elements) cut into slices
// of at most `slice` units (at most kMaxCluster of them); an override of 2-8
// (16 on sm_90) forces that size, 1 forbids clusters. Halved until the row's vectors
// split evenly; 1 before sm_90.
static int cluster_size(int override_value, int64_t units, int64_t slice, int64_t nvec, int arch) {
  if (arch < 90 || override_value == 1) return 1;
  int cl = 1;
  if (override_value > 1) {
    cl = static_cast<int>(pow2_floor(std::min(override_value, max_cluster_on(arch))));
  } else {
    while (cl < kMaxCluster && units > slice * cl) cl *= 2;
  }
  while (cl > 1 && nvec % cl != 0) cl /= 2;
  return cl;
}

// Turns the plan of a slice (a row of p.hidden / cl) into the whole row's
// cluster plan: the key names the whole row and the cluster shape.
template <typename Plan>
static Plan widen_to_cluster(Plan plan, const NormProblem& p, int cl, bool explain) {
  plan.key.hidden = static_cast<int32_t>(p.hidden);
  plan.key.flags |= cl == jit::kMaxNonPortableCluster ? kCluster16 : log2_of_pow2(cl) << kClusterShift;
  plan.key.cluster = static_cast<int16_t>(cl);
  if (explain)
    plan.reason +=
        kSlicesOnClusterWhy + std::to_string(cl) + " CTAs, " + std::to_string(p.hidden / cl) + kClusterMergeWhy;
  return plan;
}

// A LayerNorm row one CTA caches in registers takes its statistics in two
// passes (the mean, then squared deviations from it) instead of merging
// (count, mean, M2) triples, which divides at every merge. H100 kernel-only,
// bf16: 4096x512 6.39 -> 4.98 us, 4096x4096 27.8 -> 26.1, 32x8192 4.80 ->
// 3.91 (docs/history.md entry 26). Rows of more than two warps each pay
// a second round of CTA barriers; in grids of more than 32 row blocks per SM
// that cost 1.2-1.5% in 128-thread CTAs, seven or eight an SM (16384x5120,
// 16384x7168; 0.4-0.6% in entry 63), so those keep the merge, as do rows in
// shared memory, streamed rows and cluster slices (whose CTAs merge their
// slices' triples through the cluster). Larger CTAs, fewer an SM, have no
// other CTA to cover the merges' divisions and take two passes in any grid
// (entry 63, us: bf16 8192x32768 at one 512-thread CTA an SM 412.2 -> 365.8,
// 8192x24576 333.7 -> 268.3, float32 8192x16384 428.2 -> 359.5; 256-thread
// CTAs 16384x16384 361.3 -> 359.1, 8192x16384 182.8 -> 180.9).
constexpr int kTwoPassMaxWarpsPerRow = 2;
constexpr int64_t kTwoPassWideRowBlocksPerSm = 32;
constexpr int kTwoPassMergeMaxCtaThreads = 128;

static NormFwdPlan with_stats_rule(NormFwdPlan plan, const NormProblem& p, int sm_count, bool explain) {
  const int forced = norm_tuning().fwd_two_pass;
  const bool one_cta_register_row = (plan.key.flags & kCachedRow) != 0 && plan.key.cluster == 1;
  if (p.kind != kLayerNorm || !one_cta_register_row || forced == 1) return plan;
  const bool barrier_bound = plan.key.threads_per_row > 32 * kTwoPassMaxWarpsPerRow &&
                             plan.key.threads() <= kTwoPassMergeMaxCtaThreads &&
                             plan.row_blocks > kTwoPassWideRowBlocksPerSm * sm_count;
  if (forced == 0 && barrier_bound) return plan;
  plan.key.flags |= kTwoPassStats;
  if (explain) plan.reason += "; statistics in two passes over the cached row (mean, then squared deviations)";
  return plan;
}

// 16-bit LayerNorm rows one CTA would hold in shared memory (past 64 KB)
// split across a cluster of 8 where the grid has at most 8 rows an SM: each
// CTA then keeps a slice in registers beside its part of gamma and beta.
// H100 kernel-only, bf16, us (docs/history.md entry 54): 256x65536 32.0
// -> 29.6, 1024x65536 104.8 -> 102.3 (clusters of 4: 103.1); 2048x65536
// 197.2 -> 198.2, so more rows keep one CTA a row. RMSNorm's 65536 rows sit
// in registers and lost as slices (1024x65536 95.0 -> 102.2).
constexpr int kFwdSmemRowCluster = 8;
constexpr int kFwdSmemRowClusterMaxRowsPerSm = 8;

// (Only where smem_row_rule chose the shared-memory row: an override that
// forces one keeps it.)
static bool smem_row_cluster_rule(const NormFwdPlan& plan, const NormProblem& p, int sm_count) {
  const NormTuning& t = norm_tuning();
  return p.kind == kLayerNorm && jit::element_size(p.dtype) == 2 && !p.residual && t.fwd_smem_row_bytes == 0 &&
         t.fwd_smem_vecs == 0 && (plan.key.flags & kSmemRow) != 0 &&
         p.rows <= int64_t{kFwdSmemRowClusterMaxRowsPerSm} * sm_count;
}

// One CTA per row group, or the row split across a cluster of CTAs.
static NormFwdPlan plan_fwd_layout(const NormProblem& p, NormMode requested, int sm_count, int arch, bool explain) {
  int forced = norm_tuning().fwd_cluster;
  NormFwdPlan plan = plan_fwd_cta(p, requested, sm_count, arch, explain);
  // A reload was asked for: x is streamed twice by request, never cached.
  if (requested == NormMode::kMultiWaveReload) return plan;
  if (forced == 0 && smem_row_cluster_rule(plan, p, sm_count)) forced = kFwdSmemRowCluster;
  if (plan.cached && forced <= 1) return plan;
  const int64_t nvec = p.hidden / choose_vec(p);
  const int cl = cluster_size(forced, p.hidden * jit::element_size(p.dtype), kFwdSliceBytes, nvec, arch);
  if (cl == 1) return plan;
  NormProblem slice = p;
  slice.hidden = p.hidden / cl;
  // Clusters, not CTAs, are what fill the device (the decode-sized grid rule).
  const NormFwdPlan cplan = plan_fwd_cta(slice, requested, std::max(1, sm_count / cl), arch, explain, true);
  return cplan.cached ? widen_to_cluster(cplan, p, cl, explain) : plan;
}

// Forward inputs of 40 MB or more (near or past H100's 50 MB L2) are read
// through L1 (kL1Allocate: 16-bit rows by ordinary loads since entry 72,
// ld.global.nc before and for float32) rather than around it. H100 kernel-only,
// L2 flushed, both ways interleaved (docs/history.md entry 27): 1.0-1.5%
// faster from 40 MB of x up (bf16 RMSNorm 16384x8192 182.3 -> 180.0 us,
// LayerNorm 16384x7168 162.6 -> 160.5, fp32 LayerNorm 8192x8192 188.6 ->
// 184.7), but 0.5-4% slower at 32 MB and below (LayerNorm 4096x4096 25.7 ->
// 26.6, 8192x2048 26.2 -> 26.7), so L2-sized inputs keep L1::no_allocate. The
// backward keeps it everywhere: through L1 it lost 1-5% (fp32 RMSNorm
// 16384x4096 284 -> 301 us). So do rows split across a cluster, whose slices
// ran 1-3% slower through L1 (RMSNorm 512x131072 106.4 -> 107.8 us, 256x262144
// 111.4 -> 114.7; LayerNorm 512x131072 153.1 -> 157.4).
static NormFwdPlan with_load_rule(NormFwdPlan plan, const NormProblem& p, bool explain) {
  const int forced = norm_tuning().fwd_l1_alloc;
  const int64_t input_bytes = p.rows * p.hidden * jit::element_size(p.dtype);
  const bool rule = input_bytes >= kL1AllocMinInputBytes && plan.key.cluster == 1;
  if (forced == 1 || (forced == 0 && !rule)) return plan;
  plan.key.flags |= kL1Allocate;
  if (explain) plan.reason += "; x read through L1 (input of 40 MB or more)";
  return plan;
}

// Forward column slices as a grid group (kGridExchange): the CL CTAs that
// split a row are consecutive CTAs of a persistent cooperative launch, whose
// statistics meet through global memory, instead of a thread-block cluster.
// A persistent grid walks its row blocks one after another, where a
// multi-wave grid overlaps the rows of the CTAs an SM holds, so on sm_90 the
// rule takes groups only where the two are alike: launch bounds of one CTA an
// SM (each SM works on one row at a time either way), and a grid of more
// than half a wave of them. There clusters of CL whole SMs fit a GPC's SMs
// only CL at a time (about 120 of 132 at CL = 8) while groups take every SM.
// H100 kernel-only, cluster -> group, us (docs/history.md entry 60):
// bf16 LayerNorm 16 / 128 / 512 x 262144 17.7 -> 14.3, 81.4 -> 71.7, 297.2
// -> 249.3; float32 LayerNorm 256x131072 144.9 -> 127.9; bf16 RMSNorm
// 16x131072 10.9 -> 8.5; float32 RMSNorm 64x262144 59.5 -> 60.9 (the one
// loss), 512x196608 529.3 -> 528.6. Grids of several CTAs an SM lose 10-30%
// as persistent groups when they span many waves (RMSNorm 512x131072 102.0
// -> 118.0, float32 LayerNorm 2048x65536 403.6 -> 537.5) and land either way
// within one wave (RMSNorm 64x131072 16.4 -> 15.4, LayerNorm 48x131072 13.9
// -> 16.1), so they keep clusters.
// Only where the mode is the heuristic's or asked to be persistent; applied
// after the statistics and load rules, which read a hardware cluster of 1 as
// a row one CTA holds.
static bool fwd_grid_group_rule(const NormFwdPlan& plan, int sm_count, int arch) {
  return arch == 90 && plan.key.variant == 1 && 2 * plan.row_blocks * plan.key.cluster > sm_count;
}

static NormFwdPlan with_fwd_grid_exchange(NormFwdPlan plan, NormMode requested, int sm_count, int arch, bool explain) {
  const int cl = plan.key.cluster;
  const bool eligible = grid_group_eligible(plan.key, arch) && plan.cached &&
                        (requested == NormMode::kAuto || requested == NormMode::kStaticPersistent);
  const int forced = norm_tuning().fwd_grid_exchange;
  if (!eligible || forced == 1) return plan;
  if (pick(forced, fwd_grid_group_rule(plan, sm_count, arch) ? 2 : 1) != 2) return plan;
  to_grid_group(plan, "statistics", explain);
  const bool prefetch_next = norm_tuning().fwd_hints == 0;
  if (prefetch_next) plan.key.flags |= kPrefetchNext;
  plan.persistent = true;
  plan.mode = NormMode::kStaticPersistent;
  if (explain) {
    // A multi-wave plan's grid phrase turns persistent.
    replace_phrase(plan.reason, kMultiWaveGridWhy, kPersistentGridWhy);
    plan.reason += "; the group is " + std::to_string(cl) +
                   " consecutive CTAs of a persistent cooperative launch, not a hardware cluster" +
                   (prefetch_next ? ", each prefetching its next row into L2" : "");
  }
  return plan;
}

// Column slices staged through a shared-memory ring, their statistics
// collected one row block late (kDeferStats, common/norm_fwd_deferred.cuh):
// a slice CTA sums row block k + 1 while its peers' partials of k arrive,
// where the meeting loop holds every row block's y until the slowest slice's
// loads land. The kernel is persistent, its slices a grid group (the ring's
// stages cap the CTAs an SM, and a group may then take every SM), and y is
// stored evict-first so that the ring's copies keep L2.
// H100 kernel-only, bf16 unless marked, us (docs/history.md entry 66),
// multi-wave clusters -> deferred groups, y, rstd bitwise equal: RMSNorm
// 64 / 128 / 256 / 512 / 2048 x 131072 16.4 -> 15.4, 29.0 -> 26.0, 52.1 ->
// 47.7, 101.1 -> 94.7, 392.8 -> 381.9; fp16 512x131072 101.7 -> 94.2; float32
// 256x131072 102.9 -> 96.9; 512x262144 242.5 -> 195.3; 256x196608 103.0 ->
// 80.7. LayerNorm's CTAs of the same shape lost (1024x65536 102.7 -> 112.7:
// gamma and beta come from L2 for every row block) and gain only on
// 512-thread CTAs the layout does not pick (entry 66), so the rule is
// RMSNorm's. Grids of at most one row block a group (one wave) have nothing
// to defer and keep their plans.
static bool fwd_deferred_rule(const NormFwdPlan& plan, const NormProblem& p, int sm_count, int stage_bytes_total,
                              int arch) {
  const int64_t groups = int64_t{sm_count} *
                         std::max<int64_t>(1, max_smem_per_block(arch) / std::max(1, stage_bytes_total)) /
                         column_slices(plan.key.flags);
  return arch == 90 && p.kind == kRmsNorm && plan.row_blocks > groups;
}

static NormFwdPlan with_fwd_deferred(NormFwdPlan plan, const NormProblem& p, NormMode requested, int sm_count, int arch,
                                     bool explain) {
  const NormTuning& t = norm_tuning();
  const int esize = jit::element_size(p.dtype);
  const int slices = column_slices(plan.key.flags);
  const bool mode_ok = requested == NormMode::kAuto || requested == NormMode::kStaticPersistent;
  const bool group_ok = grid_group_eligible(plan.key, arch) || (plan.key.flags & kGridExchange) != 0;
  const bool eligible = arch >= 90 && mode_ok && plan.cached && plan.smem == 0 && slices > 1 && group_ok &&
                        !p.residual && plan.key.vec * esize == 16;
  if (!eligible || t.fwd_defer_stats == 1) return plan;
  // The kernel needs one stage being finished, one being summed, one in flight.
  const int stages = std::max(3, pick(t.fwd_ring_stages, 3));
  const int64_t stage_bytes = int64_t{plan.key.rows_per_cta} * (p.hidden / slices) * esize;
  if (stages * stage_bytes > max_smem_per_block(arch)) return plan;
  if (t.fwd_defer_stats != 2 && !fwd_deferred_rule(plan, p, sm_count, static_cast<int>(stages * stage_bytes), arch))
    return plan;
  const bool group = (plan.key.flags & kGridExchange) != 0 || t.fwd_grid_exchange != 1;
  if ((plan.key.flags & kGridExchange) == 0 && group) to_grid_group(plan, "statistics", explain);
  plan.key.flags &= ~(kRingExtraBits | kPrefetchNext | kKeepGamma | kPreloadAffine | kPrefetchAffine | kL1Allocate);
  plan.key.flags |= kStagedRow | kDeferStats | (static_cast<unsigned>(stages - 2) << kRingExtraShift);
  if (t.fwd_hints == 0) plan.key.flags |= kStreamStore;
  plan.smem = static_cast<size_t>(stages * stage_bytes);
  plan.key.variant = static_cast<int16_t>(smem_capped_blocks(plan.key.variant, stages * stage_bytes, arch));
  plan.persistent = true;
  plan.mode = NormMode::kStaticPersistent;
  plan.prefetch_ahead = false;
  if (explain) {
    // The layout's opening clause described a slice held in registers; the
    // slice now lives in the ring, and registers hold one row block's sum.
    if (plan.reason.rfind(kRegisterRowWhy, 0) == 0) {
      const size_t end = plan.reason.find("; ");
      plan.reason.replace(0, end == std::string::npos ? plan.reason.size() : end,
                          "row slice of " + std::to_string(stage_bytes / plan.key.rows_per_cta / 1024) +
                              " KB staged in shared memory, not registers: read x once");
    }
    replace_phrase(plan.reason, kMultiWaveGridWhy, kPersistentGridWhy);
    plan.reason += std::string("; the group is ") + std::to_string(slices) +
                   (group ? " consecutive CTAs of a persistent cooperative launch" : " CTAs of a persistent cluster") +
                   ", each staging its slices through a " + std::to_string(stages) +
                   "-stage shared-memory ring and collecting the group's statistics one row block late";
  }
  return plan;
}

// ---- Rows of one stride (kSingleStride) ----
// A row's first load waits for its address, and the general row map
// (RowMap) first tests the row against inner_rows: a constant-cache read and
// a branch between the kernel's start and that load. Where every map of the
// problem is one stride the kernel skips the test. It shows only where that
// first load is the kernel's critical path, grids of at most one lone CTA an
// SM. H100 kernel-only, bf16, us (docs/history.md entry 75): forward
// LayerNorm 1x4096 2.37 -> 2.25, 32x4096 2.67 -> 2.56, RMSNorm 1x4096 1.98
// -> 1.95; backward RMSNorm 1x4096 2.30 -> 2.21, 32x4096 2.97 -> 2.90,
// LayerNorm 1x4096 2.55 -> 2.47. Larger forward grids ran within 1% either
// way, and so did persistent register-row backward grids (RMSNorm
// 16384x5120); ptxas scheduled the staged backward loops worse (LayerNorm
// 16384x8192, a staged row cluster, 280 -> 321 us; 256x8192 15.1 -> 15.5):
// those keep the general map.
constexpr const char* kSingleStrideWhy = "; rows of one stride: no row-map test before the first load";

static bool single_stride_rule(int tune, const NormProblem& p, bool lone_ctas) {
  if (!p.single_stride || tune == 1) return false;
  return tune == 2 || lone_ctas;
}

static NormFwdPlan with_fwd_single_stride(NormFwdPlan plan, const NormProblem& p, int sm_count, bool explain) {
  const unsigned f = plan.key.flags;
  const bool lone_ctas =
      (f & kCachedRow) != 0 && (f & kDeferStats) == 0 && column_slices(f) == 1 && plan.row_blocks <= sm_count;
  if (!single_stride_rule(norm_tuning().fwd_single_stride, p, lone_ctas)) return plan;
  plan.key.flags |= kSingleStride;
  if (explain) plan.reason += kSingleStrideWhy;
  return plan;
}

// The backward's: register-row CTAs, at most one an SM, none in a cluster or
// staging its rows.
static NormBwdPlan with_bwd_single_stride(NormBwdPlan plan, const NormProblem& p, int sm_count, bool explain) {
  constexpr unsigned kStagedOrGrouped =
      kStagedRow | kClusterBits | kCluster16 | kRowClusterBits | kDeferStats | kGridExchange;
  const unsigned f = plan.key.flags;
  const bool lone_ctas =
      !plan.split && plan.cached && (f & kStagedOrGrouped) == 0 && plan.row_blocks <= std::max(1, sm_count);
  if (!single_stride_rule(norm_tuning().bwd_single_stride, p, lone_ctas)) return plan;
  plan.key.flags |= kSingleStride;
  if (plan.split) plan.coef_key.flags |= kSingleStride;
  if (explain) plan.reason += kSingleStrideWhy;
  return plan;
}

NormFwdPlan plan_norm_fwd(const NormProblem& p, NormMode requested, int sm_count, int arch, bool explain) {
  const NormFwdPlan plan = plan_fwd_layout(p, requested, sm_count, arch, explain);
  return with_fwd_single_stride(
      with_fwd_deferred(with_fwd_grid_exchange(with_load_rule(with_stats_rule(plan, p, sm_count, explain), p, explain),
                                               requested, sm_count, arch, explain),
                        p, requested, sm_count, arch, explain),
      p, sm_count, explain);
}

// Staged column-cluster rows may collect the cluster's row sums one row block
// late (kDeferStats, common/norm_bwd_deferred.cuh): a CTA sums row block k + 1
// while its peers' sums of k arrive, instead of meeting them at every row
// block. That needs a third ring stage (the row block whose dx waits): with
// x and dy only, 3 x 32 KB per 512-thread CTA (no residual's dh) on sm_90+.
// H100 kernel-only, bf16, two-stage meeting -> deferred (docs/history.md
// entry 51): RMSNorm 2048x32768 192.0 -> 167.6 us (slices of 8192),
// 1024x65536 197.7 -> 177.2, 512x131072 264.3 (split design) -> 198.6;
// LayerNorm's two gradient sets lost 1-4% (128 registers, spills) except at
// 512x131072, 290.4 (split) -> 251.6. So one gradient set defers at every
// width, in slices of 8192 (fewer CTAs a row: 2048x32768 173.2 us at 8 CTAs,
// 167.6 at 4), two past 65536 elements, where the alternative is the split
// design.
// Two gradient sets also defer on rows of at most 16384 elements, in slices
// of 2048 on 256-thread CTAs (4 rows of 64 threads, 32 elements a thread,
// a 96 KB ring): two CTAs an SM, each one's cluster waits hidden behind the
// other's work. H100 kernel-only, bf16 LayerNorm (entry 52), two-stage
// meeting in slices of 4096 -> this: 1024x16384 61.5 -> 54.6 us, 4096x16384
// 186.9 -> 168.3, 8192x16384 354.0 -> 323.0, 16384x16384 687.3 -> 632.0,
// 1x16384 5.8 -> 4.4, 32x16384 12.4 -> 10.4; rows whose old slices were not
// 64-thread groups most: 4096x12288 184.3 -> 135.5, 4096x10240 190.8 ->
// 125.1, 2048x9216 86.2 -> 67.6. At 32768 (slices of 4096, 2 rows a CTA) it
// gained 2%, at 65536 it lost 10%.
constexpr int64_t kBwd16DeferSliceElems = 8192;
constexpr int64_t kBwd16DeferMinBothSets = 65536;  // LayerNorm's dW and dB: defer past this width
constexpr int64_t kBwd16DeferPairMaxBoth = 16384;  // and up to this one, in the slices below
constexpr int64_t kBwd16DeferPairSliceElems = 2048;
constexpr int kBwd16DeferPairCtaThreads = 256;
// Since the pushed exchange (entry 54) those rows split finer on sm_90: 16
// CTAs a row (its non-portable cluster size), slices of N / 16 on the same
// 256-thread CTAs (8 rows of 32 threads). H100 kernel-only, bf16 LayerNorm,
// clusters of 8 -> 16, us (entry 55): 4096x16384 175.7 -> 168.4, 16384x16384
// 665.8 -> 633.7, 512x16384 35.2 -> 33.8, 4096x12288 134.2 -> 127.6,
// 512x9216 25.8 -> 24.4, 64x16384 12.9 -> 12.5. In grids of many rows, rows
// short of 16384 elements split across 4 CTAs instead (slices of 2304-3584
// elements, planned as any slice): 4096x10240 115.1 -> 101.4, 4096x12288
// 134.2 -> 121.8, 16384x12288 496.0 -> 443.1, 4096x14336 157.9 -> 145.0; at
// 512 rows they lost 1-4% to clusters of 16, and at 16384 elements 7%.
constexpr int kBwd16PairManyRowsCluster = 4;
constexpr int64_t kBwd16PairManyRowsMin = 2048;
// Deferred rows past 65536 elements split across 16 CTAs on sm_90 (its
// non-portable cluster size), in slices of 8192: more rows a cluster in
// flight, though only 7 such clusters fit the H100's GPCs (112 CTAs against
// 15 x 8). H100 kernel-only, bf16, clusters of 8 -> 16, us (entry 53):
// RMSNorm 512x131072 183.8 -> 175.1, LayerNorm 219.1 -> 205.8; at 65536 it
// lost (RMSNorm 169.8 -> 181.2, LayerNorm 185.3 -> 212.9), at 32768 it moved
// 1-2% on 256-thread CTAs.
constexpr int64_t kBwd16Cluster16MinElems = 131072;
// Deferred slices of one gradient set (and LayerNorm's 24576-32768-wide rows)
// are planned as rows of 32 elements a thread, as many to a CTA as fit 512
// threads. Where half as wide a slice fills more of those threads, the row
// splits across twice the CTAs (up to 8): at 24576 elements, clusters of 4
// give 2 rows of 192 threads (384), clusters of 8 give 5 rows of 96 (480).
// H100 kernel-only, bf16, L2 flushed, median of 5, clusters of 4 -> 8, us
// (docs/history.md entry 56): RMSNorm 1024x24576 72.6 -> 67.2,
// 2048x24576 127.8 -> 121.3, 4096x24576 241.6 -> 227.8; LayerNorm 2048x24576
// 133.5 -> 128.8. Where both fill the same threads it gained nothing
// (RMSNorm 32768: 512x 51.2 / 50.8, 2048x 159.6 / 158.8, 4096x 305.8 /
// 308.3) or lost (LayerNorm 32768: 2048x 167.9 / 172.0), so ties keep the
// smaller cluster. Only where both slices hold 32 elements a thread, in
// grids of 1024+ rows, on sm_90: the shapes measured. A/B of the rule
// (us): RMSNorm 2048x23552 128.2 -> 120.5; LayerNorm without bias (dW
// alone), 12288 elements on 4 CTAs rather than 2: 1024 rows 45.4 -> 42.1,
// 4096 rows 130.4 -> 131.6 (the one loss seen, 0.9%).
constexpr int64_t kBwd16DeferFillMinRows = 1024;

// Since the cluster's sums travel as pushes into each CTA's shared memory
// (common/cluster.cuh) rather than through cluster barriers, two gradient
// sets also defer on rows of 24576-32768 elements in grids of many rows, in
// slices of at most 8192. H100 kernel-only, bf16 LayerNorm, meeting in
// slices of 4096 -> deferred (entry 54): 2048x32768 175.7 -> 170.6 us (185.1
// -> 171.3 in another run), 1024x32768 101.1 -> 94.7, 4096x32768 334.1 ->
// 328.4, 2048x24576 145.8 -> 133.3; but 256x32768 36.0 -> 39.6 (a few row
// blocks a cluster: the deferred loop's extra stage does not pay) and
// 1024x20480 62.8 -> 68.0 (slices of 5120 on 160-thread rows).
constexpr int64_t kBwd16DeferMidMinBoth = 24576;
constexpr int64_t kBwd16DeferMidMaxBoth = 32768;
constexpr int64_t kBwd16DeferMidMinRows = 1024;

// With slices as grid groups (kGridExchange, below), two gradient sets
// also defer on rows of 32768-65536 elements in grids of many rows, in
// slices of 8192 (not 16384). H100 kernel-only, bf16 LayerNorm 1024x65536
// (docs/history.md entry 59): meeting on clusters of 8 190.3 us,
// deferred grid groups of 4 (slices of 16384) 177.6, of 8 163.8.
static bool group_defer_rule(const NormProblem& p, bool both, int arch) {
  return arch == 90 && both && norm_tuning().bwd_grid_exchange != 1 && p.hidden > kBwd16DeferMidMaxBoth &&
         p.hidden <= kBwd16DeferMinBothSets && p.rows >= kBwd16DeferMidMinRows;
}

static bool defer_rule(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int arch) {
  const int forced = norm_tuning().bwd_defer_stats;
  if (arch < 90 || grad_dh || forced == 1) return false;
  const bool both = want_dw && want_db;
  const bool mid =
      p.hidden >= kBwd16DeferMidMinBoth && p.hidden <= kBwd16DeferMidMaxBoth && p.rows >= kBwd16DeferMidMinRows;
  return forced == 2 || !both || p.hidden > kBwd16DeferMinBothSets || p.hidden <= kBwd16DeferPairMaxBoth || mid ||
         group_defer_rule(p, both, arch);
}

static NormBwdPlan with_defer(NormBwdPlan plan, const NormProblem& p, int arch, bool explain) {
  const unsigned f = plan.key.flags;
  const bool eligible = (f & kStagedRow) != 0 && plan.key.cluster > 1 && (f & (kKeepTerms | kGradDh)) == 0;
  if (!eligible) return plan;
  const int stages = std::max(3, 2 + static_cast<int>((f & kRingExtraBits) >> kRingExtraShift));
  const int64_t stage_bytes =
      ring_stage_bytes_of(plan.key.rows_per_cta, p.hidden / plan.key.cluster, jit::element_size(p.dtype), false);
  if (stages * stage_bytes > max_smem_per_block(arch)) return plan;
  plan.key.flags = (f & ~kRingExtraBits) | kDeferStats | (static_cast<unsigned>(stages - 2) << kRingExtraShift);
  plan.smem = std::max<size_t>(plan.smem, static_cast<size_t>(stages * stage_bytes));
  // The deeper ring may leave room for fewer CTAs an SM: launch bounds to match.
  plan.key.variant = static_cast<int16_t>(smem_capped_blocks(plan.key.variant, stages * stage_bytes, arch));
  if (explain)
    plan.reason += kClusterDeferWhy + (", through a " + std::to_string(stages)) + "-stage ring (" +
                   std::to_string(stages * stage_bytes / 1024) + " KB)";
  return plan;
}

// Deferred column slices need not be a thread-block cluster: as a group of
// consecutive CTAs of a cooperative launch (kGridExchange), whose row sums
// meet through global memory one row block late, they are not placed a
// cluster to a GPC. An H100 holds 7 clusters of 16 (112 of its 132 SMs) and
// 15 of 8 (120), but 8 groups of 16 or 16 of 8 (128). Only where the grid
// has row blocks for more groups than one an SM's worth of clusters.
static NormBwdPlan with_grid_exchange(NormBwdPlan plan, int sm_count, int arch, bool explain) {
  const unsigned f = plan.key.flags;
  const int cl = plan.key.cluster;
  const bool eligible =
      grid_group_eligible(plan.key, arch) && (f & kDeferStats) != 0 && (f & (kDirectGrads | kRowClusterBits)) == 0;
  const int forced = norm_tuning().bwd_grid_exchange;
  if (!eligible || forced == 1) return plan;
  const bool rule = arch == 90 && plan.row_blocks >= sm_count / cl;
  if (pick(forced, rule ? 2 : 1) != 2) return plan;
  to_grid_group(plan, "row sums", explain);
  if (explain) {
    // A deferred slice plan's text always holds it (with_defer).
    const bool rewritten =
        replace_phrase(plan.reason, kClusterDeferWhy, "; the group's row sums are collected one row block late");
    TORCH_INTERNAL_ASSERT(rewritten, "rtcnorm: explain() text of a deferred slice plan lost a phrase");
    plan.reason += "; the group is " + std::to_string(cl) +
                   " consecutive CTAs of a cooperative launch, not a hardware cluster, so groups are not packed a "
                   "cluster to a GPC";
  }
  return plan;
}

// The slice shape the deferred rules were measured on: cached,
// kBwd16CacheElems elements a thread.
static bool bwd16_measured_slice(const NormBwdPlan& sp) {
  return sp.cached && sp.key.vecs_per_thread * sp.key.vec == kBwd16CacheElems;
}

// float32 rows of 131072 elements: slices of 16384 on a cluster of 8 hold
// 32 elements a thread of x, dy and dW, and ptxas spilled 336-380 bytes
// (RMSNorm, 128 registers; LayerNorm's were not cached at all and ran the
// split design). On sm_90's 16-CTA clusters the slices are 8192 wide, 16
// elements a thread on 512 threads, and keep their terms with no spill.
// H100 kernel-only, float32, us (docs/history.md entry 68): RMSNorm
// 1x131072 15.0 -> 6.3, 32x 57.0 -> 35.6, 256x 261.2 -> 162.6, 512x 483.9 ->
// 310.6, 2048x 1879.4 -> 1196.7; LayerNorm (from split) 1x 27.3 -> 7.4, 32x
// 50.8 -> 42.6, 512x 490.6 -> 306.7, 2048x 1865.3 -> 1187.8. At 98304
// (6144-wide slices on 384 threads) it lost 10-56% (RMSNorm 512x 263.9 ->
// 385.9, LayerNorm 369.8 -> 397.0), so it keeps to slices of exactly 8192.
static bool float32_cluster16_rule(const NormProblem& p, int64_t nvec, int wide_cl) {
  return jit::element_size(p.dtype) == 4 && wide_cl > kMaxCluster && p.hidden == wide_cl * kBwdSliceElems &&
         nvec % wide_cl == 0;
}

// The column-slice plan of plan_bwd_layout: slices of a row across CTAs of a
// cluster (or grid group), deferred where `defer`. `pair_allowed` = false
// plans two gradient sets in slices of 8192 where they would pair.
static NormBwdPlan plan_bwd_slices(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count,
                                   int arch, bool explain, const NormBwdPlan& plan, bool wide16, bool defer,
                                   bool pair_allowed) {
  const int forced = norm_tuning().bwd_cluster;
  const bool both = want_dw && want_db;
  // Two gradient sets on rows of at most 16384 elements: pairs of 256-thread
  // CTAs an SM (above).
  const bool pair = pair_allowed && defer && both && p.hidden <= kBwd16DeferPairMaxBoth;
  const bool double_slice = both && p.hidden > kBwd16DeferMidMaxBoth && !group_defer_rule(p, both, arch);
  const int64_t slice16 = !defer ? kBwd16SliceElems
                          : pair ? kBwd16DeferPairSliceElems
                                 : (double_slice ? 2 : 1) * kBwd16DeferSliceElems;
  const int64_t nvec = p.hidden / choose_vec(p);
  int cl = cluster_size(forced, p.hidden, wide16 ? slice16 : kBwdSliceElems, nvec, arch);
  const int wide_cl = max_cluster_on(arch);
  if (forced == 0 && defer && wide_cl > kMaxCluster && p.hidden >= kBwd16Cluster16MinElems && nvec % wide_cl == 0)
    cl = wide_cl;
  if (forced == 0 && float32_cluster16_rule(p, nvec, wide_cl)) cl = wide_cl;
  if (forced == 0 && pair && wide_cl > kMaxCluster) {
    const bool many_rows = p.rows >= kBwd16PairManyRowsMin && p.hidden < kBwd16DeferPairMaxBoth;
    if (many_rows && nvec % kBwd16PairManyRowsCluster == 0)
      cl = kBwd16PairManyRowsCluster;
    else if (!many_rows && nvec % wide_cl == 0)
      cl = wide_cl;
  }
  if (cl == 1) return plan;
  const BwdCtaHint hint =
      wide16 ? BwdCtaHint{kBwd16CacheElems, true, pair ? kBwd16DeferPairCtaThreads : 0} : BwdCtaHint{};
  const auto slice_plan = [&](int c) {
    NormProblem slice = p;
    slice.hidden = p.hidden / c;
    return plan_bwd_cta(slice, want_dw, want_db, grad_dh, sm_count, arch, explain, hint);
  };
  NormBwdPlan cplan = slice_plan(cl);
  // Twice or four times the CTAs, whichever first fills more threads (four
  // only arises from slices of 2: RMSNorm 14336, 448 -> 512 threads).
  if (forced == 0 && arch == 90 && defer && !pair && p.rows >= kBwd16DeferFillMinRows && bwd16_measured_slice(cplan)) {
    for (int c = 2 * cl; c <= kMaxCluster && nvec % c == 0; c *= 2) {
      NormBwdPlan wider = slice_plan(c);
      if (bwd16_measured_slice(wider) && wider.key.threads() > cplan.key.threads()) {
        cl = c;
        cplan = std::move(wider);
        break;
      }
    }
  }
  if (!cplan.cached) return plan;
  const NormBwdPlan cluster_plan = widen_to_cluster(cplan, p, cl, explain);
  return defer ? with_defer(cluster_plan, p, arch, explain) : cluster_plan;
}

// 16-bit rows of 8193-16384 elements that one CTA stages (x and dy through
// its shared-memory ring, one gradient set: RMSNorm) split into slices of
// at most 8192 on sm_90 as well, in grids of 128+ rows, where the slices'
// CTAs hold at least as many threads as the one CTA. The slices defer
// (with_defer) unless they keep their terms (16 elements a thread: 11264,
// 13312), and then meet at every row block. LayerNorm's (two
// sets, 16-bit gamma and beta) do so in grids of 2048+ rows, where their
// 256-thread pair plan (above) would defer and the slices hold 16 or 32
// elements a thread. H100 kernel-only, bf16, L2 flushed, median of 3, one CTA (pair
// plan) -> slices, us (docs/history.md entry 64): RMSNorm 4096x9216
// 108.6 -> 90.3, 4096x12288 178.2 -> 113.6, 16384x12288 652.0 -> 426.9,
// 4096x14336 256.0 -> 136.7 (8 CTAs, the fill rule), 4096x16384 158.7 ->
// 151.5, 1024x16384 52.7 -> 47.3, 256x12288 19.4 -> 16.1, but 4096x15360
// 148.4 -> 171.3 (320-thread slices beside one 480-thread CTA); LayerNorm
// 4096x11264 130.0 -> 120.2, 4096x12288 137.2 -> 129.2, 4096x16384 163.0 ->
// 157.5, 16384x16384 604.9 -> 582.4, 16384x11264 483.1 -> 427.7 (slices of
// 16 a thread, which keep their terms), but 1024 rows lost 1-2%, slices of
// 24 elements a thread (15360) up to 2.4% and float32 gamma and beta 2.2%.
// Pair plans that keep terms (10240, 14336) do not defer and stay.
constexpr int64_t kBwd16StagedSliceMinElems = 8192;  // exclusive
constexpr int64_t kBwd16StagedSliceMaxElems = 16384;
constexpr int64_t kBwd16StagedSliceMinRows = 128;
constexpr int64_t kBwd16StagedSliceMinRowsBoth = 2048;

// Whether 16-bit rows of the staged-slice widths may leave the one-CTA plan
// (or, with two gradient sets, the pair plan) for slices of at most 8192:
// the rule's shape conditions above, or the bwd_staged_slices override; the
// comparisons with the slice plan are plan_bwd_layout's. `one_cta` is the
// plan of one CTA a row.
static bool staged_slice_rule(const NormProblem& p, const NormBwdPlan& one_cta, bool both, bool grad_dh, int arch) {
  const int forced = norm_tuning().bwd_staged_slices;
  if (forced == 1 || arch < 90 || grad_dh || jit::element_size(p.dtype) != 2 || p.hidden <= kBwd16StagedSliceMinElems ||
      p.hidden > kBwd16StagedSliceMaxElems)
    return false;
  // One set: only where one CTA caches the row through its ring.
  if (!both && !(one_cta.cached && (one_cta.key.flags & kStagedRow) != 0)) return false;
  if (forced == 2) return true;
  if (both) return arch == 90 && p.rows >= kBwd16StagedSliceMinRowsBoth && p.wdtype == p.dtype;
  return arch == 90 && p.rows >= kBwd16StagedSliceMinRows;
}

static NormBwdPlan plan_bwd_layout(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count,
                                   int arch, bool explain, BwdCtaHint row_hint = {}) {
  const int forced = norm_tuning().bwd_cluster;
  NormBwdPlan plan = plan_bwd_cta(p, want_dw, want_db, grad_dh, sm_count, arch, explain, row_hint);
  const bool both = want_dw && want_db;
  // 16-bit rows one CTA does not cache (RMSNorm past 16384 elements, LayerNorm
  // past 8192) become staged slices; so may narrower ones (staged_slice_rule).
  const int esize = jit::element_size(p.dtype);
  const bool staged_slices = staged_slice_rule(p, plan, both, grad_dh, arch);
  const bool wide16 = esize == 2 && (!plan.cached || (staged_slices && !both));
  const bool defer = wide16 && defer_rule(p, want_dw, want_db, grad_dh, arch);
  // (Deferred slices reach 16384 elements: 32 a thread at 512 threads.)
  const int64_t max16 = kMaxCluster * (defer ? 2 * kBwd16DeferSliceElems : kBwdSliceElems);
  const bool rule = esize == 4 ? p.hidden > kBwdSliceElems : wide16 && p.hidden <= max16;
  if (forced == 1 || (forced == 0 && !rule)) return plan;
  const NormBwdPlan sliced = plan_bwd_slices(p, want_dw, want_db, grad_dh, sm_count, arch, explain, plan, wide16, defer,
                                             /*pair_allowed=*/true);
  if (!staged_slices || forced != 0) return sliced;
  const bool override = norm_tuning().bwd_staged_slices == 2;
  // One set: the slices replace the one CTA only where they fill as many
  // threads (staged_slice_rule).
  if (!both) return override || sliced.key.threads() >= plan.key.threads() ? sliced : plan;
  // Two sets: the pair plan gives way to slices of 8192 of 16 or 32 elements
  // a thread where it would defer.
  if (!override && (sliced.key.flags & kDeferStats) == 0) return sliced;
  NormBwdPlan unpaired = plan_bwd_slices(p, want_dw, want_db, grad_dh, sm_count, arch, explain, plan, wide16, defer,
                                         /*pair_allowed=*/false);
  const int elems = unpaired.key.vecs_per_thread * unpaired.key.vec;
  const bool whole = unpaired.cached && (elems == kBwd16CacheElems || 2 * elems == kBwd16CacheElems);
  return override || whole ? unpaired : sliced;
}

// A register-cached CTA (or cluster) that keeps its terms and visits a single
// row block, because the grid has a CTA per row block, loads gamma right after
// its row's x and dy (kGammaBesideRow) rather than before them: converting
// gamma waits for it, so loaded first its DRAM round trip and the row's would
// queue. Persistent CTAs pay that once for many rows and keep the early load,
// which ptxas fits in fewer registers (the late one spills 8-16 bytes in
// RMSNorm's two 320-thread CTAs per SM at N = 5120). A grid of one row block
// per CTA has at most one CTA per SM, so its launch bounds ask for one (no
// spill at any N). H100 kernel-only, bf16, us (docs/history.md entry 39):
// RMSNorm 32x4096 6.01 -> 5.15, 128x4096 7.40 -> 6.59, 256x2048 6.84 ->
// 6.22; LayerNorm 32x4096 7.54 -> 6.23, 256x4096 9.50 -> 9.12.
static NormBwdPlan with_gamma_rule(NormBwdPlan plan, int sm_count, bool explain) {
  const unsigned f = plan.key.flags;
  if (plan.split || (f & kKeepTerms) == 0 || (f & kStagedRow) != 0) return plan;
  const bool lone_row_block = plan.row_blocks <= std::max(1, sm_count / std::max<int>(1, plan.key.cluster));
  if (pick(norm_tuning().bwd_gamma_beside_row, lone_row_block ? 2 : 1) != 2) return plan;
  plan.key.flags |= kGammaBesideRow;
  if (lone_row_block) plan.key.variant = 1;
  if (explain)
    plan.reason += lone_row_block
                       ? "; one row block per CTA: gamma loaded beside the row, launch bounds of one CTA per SM"
                       : "; gamma loaded beside the first row (tuning override)";
  return plan;
}

// ---- Row clusters (sm_90+, kRowClusterBits) ----
// Every persistent CTA's column sums become a fp32 partial row that a second
// kernel reads back. The CTAs of a row cluster, each walking its own row
// blocks, instead add up their column sums in distributed shared memory and
// the cluster writes one partial row; a grid of one cluster writes the
// gradients themselves (kDirectGrads) and no column reduce runs.
// H100 kernel-only sweep, bf16 (docs/history.md entry 40):
// - staged rows (x and dy through the shared-memory ring), clusters of 2:
//   LayerNorm's two partial rows a CTA, 1-16% faster at every row count
//   measured (N = 8192: 256 rows 17.2 -> 15.0 us, 512 22.9 -> 19.3, 4096
//   82.8 -> 79.4; N = 7168: 512 rows 21.2 -> 18.9); one partial row
//   (RMSNorm) 3-13% faster for rows of 8192+ up to about 8 row blocks an
//   SM (256x8192 13.3 -> 12.9, 128x16384 19.2 -> 16.7, 1024x16384 51.6 ->
//   50.3), while 7168-wide RMSNorm rows (one 448-thread CTA an SM) lost
//   up to 9%. Clusters of 4 fit only 120 CTAs on 132 SMs and gained less.
// - grids of fewer row blocks than half the SMs: a cluster costs 0.4-1.7 us
//   more than the partial rows and column reduce it saves (RMSNorm 32x4096
//   5.07 -> 5.75 us as one cluster of 16 writing the gradients, 6.6-6.9 as
//   clusters of 2-8; staged 32x8192 6.97 -> 7.39, LayerNorm 9.61 -> 9.68).
// - register rows (N = 128-4096, 256-4096 rows) lost 2-38%.
// Those keep one partial row a CTA.
constexpr int kRuleRowCluster = 2;
constexpr int64_t kRowClusterMinHidden = 8192;       // one-gradient rows of at least this width
constexpr int64_t kRowClusterMaxRowBlocksPerSm = 8;  // and at most this many row blocks an SM

static int row_cluster_size(const NormBwdPlan& plan, int sm_count, int arch) {
  const unsigned f = plan.key.flags;
  const bool eligible = arch >= 90 && !plan.split && plan.cached && plan.key.cluster == 1 &&
                        (f & (kWantDw | kWantDb)) != 0 && plan.row_blocks > 1;
  const int forced = norm_tuning().bwd_row_cluster;
  if (!eligible || forced == 1) return 1;
  if (forced > 1) return static_cast<int>(pow2_floor(std::min(forced, max_cluster_on(arch))));
  const bool two_grads = (f & kWantDw) != 0 && (f & kWantDb) != 0;
  const bool wide_few = plan.key.hidden >= kRowClusterMinHidden &&
                        plan.row_blocks <= kRowClusterMaxRowBlocksPerSm * std::max(1, sm_count);
  const bool enough_rows = 2 * plan.row_blocks >= sm_count;
  return (f & kStagedRow) != 0 && enough_rows && (two_grads || wide_few) ? kRuleRowCluster : 1;
}

static NormBwdPlan with_row_cluster_rule(NormBwdPlan plan, int sm_count, int arch, bool explain) {
  const int rc = row_cluster_size(plan, sm_count, arch);
  if (rc == 1) return plan;
  const KernelKey& k = plan.key;
  const bool dw = (k.flags & kWantDw) != 0, db = (k.flags & kWantDb) != 0;
  // The CTA's column sums (N floats a gradient) and the bundles its combine
  // reads, laid out as norm_bwd.cuh's row-cluster epilogue expects.
  const int64_t sums = ((dw && db) ? 1 : 0) + std::max(1, bwd_bundles(k.threads_per_row, k.rows_per_cta));
  const size_t smem = std::max(plan.smem, static_cast<size_t>(sums * k.hidden) * sizeof(float));
  if (static_cast<int64_t>(smem) > max_smem_per_block(arch)) return plan;
  plan.key.flags |= log2_of_pow2(rc) << kRowClusterShift;
  plan.key.cluster = static_cast<int16_t>(rc);
  plan.smem = smem;
  const bool direct = plan.row_blocks <= rc && pick(norm_tuning().bwd_direct_grads, 2) == 2;
  if (direct) plan.key.flags |= kDirectGrads;
  if (explain)
    plan.reason += "; row cluster of " + std::to_string(rc) +
                   " CTAs: their column sums meet in distributed shared memory, " +
                   (direct ? std::string("and the grid's one cluster writes the gradients (no column reduce)")
                           : std::string("one fp32 partial row per cluster"));
  return plan;
}

int64_t bwd_grid_row_blocks(const NormBwdPlan& plan) {
  const bool row_cluster = (plan.key.flags & kRowClusterBits) != 0;
  return row_cluster ? ceil_div(plan.row_blocks, plan.key.cluster) : plan.row_blocks;
}

// ---- Column CTAs for dW / dB (kColumnGrads, common/norm_bwd_columns.cuh) ----
// A grid of at most one row block an SM has a lone CTA per row block. dW / dB
// need only the saved statistics, so column CTAs beside the row CTAs, in the
// same launch, can sum them over every row and write the gradients, where
// otherwise each row CTA writes an fp32 partial row and a second kernel adds
// them up. A column CTA's threads cover CV vectors of columns (at least 128
// bytes of a row: whole lines), CV doubled until the column CTAs fit the SMs
// the row CTAs leave (or the CTA is one row lane wide); its L = threads / CV
// row lanes each sum every L-th row.
constexpr int kColumnLineBytes = 128;
// CV's least value: the vectors of one line (one, where a vector is wider).
static int line_column_vecs(int vec_bytes) { return std::max(1, kColumnLineBytes / vec_bytes); }
// The rule: column CTAs wherever a row lane has at most this many rows (one
// round of loads in flight, kColumnRowsInFlight) and there is more than one
// row. A single row's CTA writes dW / dB itself (column CTAs cost 0.3 us at
// 1x4096, bf16 RMSNorm), and so does a lone CTA sized to its 2-4 rows (RMSNorm
// 2x1024 2.33 us direct, 2.52 with column CTAs). A lone row block of 2-8 rows
// on a CTA not sized to them gains (H100, kernel us, direct -> column CTAs,
// docs/history.md entry 58): RMSNorm 2x4096 3.35 -> 2.58, 8x1024 3.08 ->
// 2.57; LayerNorm 2x4096 4.21 -> 2.60, 2x1024 3.19 -> 2.47, fp32 2x4096 4.10
// -> 2.89. Narrow rows (1024-thread CTAs of many rows) keep their plans: a
// lone block lost there (LayerNorm 64x128 3.63 -> 3.91 us, 2x512 3.08 ->
// 3.44; RMSNorm 64x128 3.00 -> 3.25).
constexpr int64_t kColumnMaxRowsPerLane = 4;

// One-wave column grids (one_wave_column_plan): a row lane may have up to
// this many rows, three rounds of kColumnRowsInFlight: the most a grid of
// 16-bit rows that fits one wave at three CTAs an SM has (330x4096 on 132
// SMs; H100 kernel us, the rule before -> one wave, docs/history.md entry
// 79: RMSNorm 9.96 -> 8.62, LayerNorm 11.23 -> 9.50; 264x8192, 9 rows a lane,
// 13.20 -> 10.67 and 15.07 -> 11.01).
constexpr int64_t kOneWaveMaxRowsPerLane = 11;

static NormBwdPlan with_column_grads_rule(NormBwdPlan plan, const NormProblem& p, int sm_count, bool explain,
                                          bool one_wave = false) {
  const unsigned f = plan.key.flags;
  constexpr unsigned kExcluded = kStagedRow | kClusterBits | kCluster16 | kRowClusterBits | kDeferStats;
  const int threads = plan.key.threads();
  const int vec_bytes = plan.key.vec * jit::element_size(p.dtype);
  const int64_t nvec = p.hidden / plan.key.vec;
  int cv = line_column_vecs(vec_bytes);
  // A grid capped below its row blocks (bwd_min_row_blocks) has CTAs of
  // several row blocks: it keeps its partial rows. A one-wave grid's row
  // and column CTAs all fit the launch bounds' CTAs an SM at once.
  const bool one_wave_fits =
      one_wave && cv <= threads && plan.row_blocks + ceil_div(nvec, cv) <= int64_t(plan.key.variant) * sm_count;
  const bool eligible =
      !plan.split && plan.cached && (f & (kWantDw | kWantDb)) != 0 && (f & kExcluded) == 0 && plan.key.cluster == 1 &&
      (one_wave ? one_wave_fits : plan.row_blocks <= sm_count && bwd_max_units(plan, sm_count) >= plan.row_blocks);
  const int forced = norm_tuning().bwd_column_grads;
  if (!eligible || forced == 1) return plan;
  if (!one_wave) {
    const int64_t free_sms = std::max<int64_t>(1, sm_count - plan.row_blocks);
    while (2 * cv <= threads && ceil_div(nvec, cv) > free_sms) cv *= 2;
    cv = std::min(cv, threads);
  }
  const int64_t lanes = threads / cv;
  const int64_t rows_per_lane = ceil_div(p.rows, lanes);
  const bool narrow = is_narrow_row(p);
  const int64_t max_rows_per_lane = one_wave ? kOneWaveMaxRowsPerLane : kColumnMaxRowsPerLane;
  const bool rule = p.rows > 1 && !narrow && !plan.lone_sized_cta && rows_per_lane <= max_rows_per_lane;
  if (pick(one_wave ? norm_tuning().bwd_one_wave_columns : forced, rule ? 2 : 1) != 2) return plan;
  const size_t lane_sums = size_t(2) * threads * plan.key.vec * sizeof(float);
  plan.key.flags = (f & ~kDirectGrads) | kColumnGrads;
  plan.smem = std::max(plan.smem, lane_sums);
  plan.col_vecs = cv;
  plan.col_ctas = ceil_div(nvec, cv);
  if (explain) {
    for (const char* gone : {kDirectGradsWhy, kPartialRowsWhy}) replace_phrase(plan.reason, gone, "");
    plan.reason += "; " + std::to_string(plan.col_ctas) + " column CTAs beside the row CTAs write dW" +
                   ((f & kWantDb) != 0 ? std::string(" / dB") : std::string()) + " (" +
                   std::to_string(cv * plan.key.vec) + " columns each, " + std::to_string(lanes) + " row lanes of " +
                   std::to_string(rows_per_lane) + " rows): no partial rows, no column reduce";
    if (one_wave)
      plan.reason += "; one wave: " + std::to_string(plan.row_blocks + plan.col_ctas) + " CTAs at launch bounds of " +
                     std::to_string(plan.key.variant) + " CTAs an SM";
  }
  return plan;
}

static NormBwdPlan plan_bwd_rules(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count,
                                  int arch, bool explain, BwdCtaHint row_hint = {}) {
  return with_column_grads_rule(
      with_row_cluster_rule(
          with_gamma_rule(plan_bwd_layout(p, want_dw, want_db, grad_dh, sm_count, arch, explain, row_hint), sm_count,
                          explain),
          sm_count, arch, explain),
      p, sm_count, explain);
}

// A grid whose column CTAs write dW / dB runs on CTAs of 256 threads (rows
// of up to 256 threads, past narrow rows): its row CTAs then hold one row
// of 4096 16-bit elements (two of 2048, four of 1024), and its column CTAs
// have half the row lanes of 512 threads, fewer of them idle at a few rows a
// lane. H100, kernel us, 512 -> 256 threads (docs/history.md entry 58):
// bf16 LayerNorm 32x4096 3.32 -> 3.03, 128x1024 3.48 -> 3.16; RMSNorm
// 64x4096 3.61 -> 3.32, 32x2048 3.08 (128-thread few-row CTAs) -> 2.84;
// fp32 RMSNorm 32x4096 3.38 -> 3.04, LayerNorm 3.54 -> 3.20. A grid
// that would lose its column CTAs at 256 (more row blocks than leave the
// column CTAs their SMs) keeps its plan.
constexpr int kColumnGridCtaThreads = 256;

// ---- One-wave column grids ----
// A grid of more row blocks than SMs, or of rows the rules stage through
// shared memory, still takes column CTAs where every row CTA and every
// column CTA is resident at once: CTAs of at most 256 threads of register
// rows (a row of 8192 16-bit elements is 32 a thread), launch bounds of 2
// CTAs an SM, or 3 where ptxas fits a 16-bit row in their 80 registers, and
// column CTAs one line (128 bytes) wide with up to kOneWaveMaxRowsPerLane
// rows a lane. The row CTAs then run dx alone, each once, while the column
// CTAs read x and dy again (mostly from L2) for dW / dB: no partial rows, no
// column reduce, and no row block waits for another's SM. Every other
// backward plan of these grids walks two row blocks a CTA (a second latency
// chain), stages rows or splits them.
// H100, kernel us, bf16, the rule before -> one wave (docs/history.md
// entry 79): RMSNorm 128x8192 10.8 -> 5.9, 192x8192 12.1 -> 7.9, 256x8192
// 12.7 -> 9.5; LayerNorm 128x8192 13.5 -> 6.0, 256x8192 15.6 -> 10.0.
// Grids past one wave keep their plans (a probe of RMSNorm 512x4096, CTAs of
// two rows and 16 rows a column lane: 11.0 -> 12.4).
// A row takes at most 256 threads here: rows that 256 threads do not split
// evenly run ragged (N = 5120: 3 or 2 vectors a thread, not the 320-thread
// row of the other rules, whose 64 registers at three CTAs an SM spilled
// LayerNorm's 188 bytes) or on the layout's narrower row (7168: 224 threads,
// 3072: 192, 1536: two rows of 96). Rows the other rules split (LayerNorm's
// odd N of 6001-8191) take it too. H100, kernel us, the plan before -> one
// wave (docs/history.md entry 80): RMSNorm 256x5120 10.9 -> 7.6, 128x7168
// 9.6 -> 5.8, 200x3072 7.7 -> 5.9, 33x4097 8.3 -> 3.5; LayerNorm 256x5120
// 16.0 -> 8.2, 128x7168 12.5 -> 6.1, 256x1536 6.7 -> 5.4, split 44x6001 fp16
// 16.1 -> 4.9. Float32 scalar rows past 24 a thread (ptxas spilled 44 bytes
// at 28) lost where they replace a register plan (RMSNorm 44x7001 7.9 ->
// 9.0): those take it only in place of a split (or where
// bwd_one_wave_columns=2 forces it: wide_float_scalars).
constexpr int kOneWaveMaxElems = 32;  // cached elements a thread: 16-bit rows of up to 8192
constexpr int kOneWaveMaxFloatScalars = 24;
static NormBwdPlan one_wave_column_plan(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count,
                                        int arch, bool explain, bool wide_float_scalars) {
  const int vec = choose_vec(p);
  const int elems = static_cast<int>(ceil_div(ceil_div(p.hidden, vec), kColumnGridCtaThreads)) * vec;
  if (elems > kOneWaveMaxElems) return {};
  const int esize = jit::element_size(p.dtype);
  if (vec == 1 && esize == 4 && elems > kOneWaveMaxFloatScalars && !wide_float_scalars) return {};
  // Three CTAs an SM: 16-bit rows and weights, no residual gradient, up to
  // sm_90 (ptxas at 80 registers, 8192-wide rows: RMSNorm unspilled on sm_80
  // and sm_90, LayerNorm 40 bytes; sm_100 spilled 72 and 156); float32 rows
  // or weights, dh and later archs take two.
  const bool three_fit = esize == 2 && p.wdtype == p.dtype && !grad_dh && arch <= 90;
  const int max_blocks = three_fit ? 3 : 2;
  // The fewest CTAs any such plan has (cached rows: a 256-thread CTA holds at
  // most 256 * cache_elems elements of rows; column CTAs one line wide) must
  // fit one wave, so grids of many rows, every large backward call, leave
  // here without planning rows twice.
  const int cache_elems = std::max(16, elems);
  const int64_t fewest_row_ctas = ceil_div(p.rows * p.hidden, int64_t{kColumnGridCtaThreads} * cache_elems);
  const int64_t col_ctas = ceil_div(p.hidden / vec, line_column_vecs(vec * esize));
  if (fewest_row_ctas + col_ctas > int64_t{max_blocks} * sm_count) return {};
  for (int blocks = 2; blocks <= max_blocks; ++blocks) {
    BwdCtaHint hint;
    hint.cache_elems = cache_elems;
    hint.cta_threads = kColumnGridCtaThreads;
    hint.column_grid = true;
    hint.one_wave = true;
    hint.min_blocks = blocks;
    hint.max_tpr = kColumnGridCtaThreads;
    const NormBwdPlan rows = plan_bwd_layout(p, want_dw, want_db, grad_dh, sm_count, arch, explain, hint);
    if (rows.split || !rows.cached || rows.key.threads() > kColumnGridCtaThreads || rows.key.variant != blocks)
      return {};
    NormBwdPlan plan = with_column_grads_rule(rows, p, sm_count, explain, true);
    if ((plan.key.flags & kColumnGrads) != 0) return plan;
  }
  return {};
}

// Programmatic launches of the backward's later kernels (sm_90+): their CTAs
// are scheduled while the previous kernel drains, so the launch gap between
// them is hidden. Results are unchanged (each waits for the previous grid
// before touching memory).
NormBwdPlan plan_norm_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count, int arch,
                          bool explain) {
  const NormTuning& t = norm_tuning();
  NormBwdPlan plan = plan_bwd_rules(p, want_dw, want_db, grad_dh, sm_count, arch, explain);
  const bool narrow = is_narrow_row(p);
  if ((plan.key.flags & kColumnGrads) != 0 && !narrow && t.bwd_cta_threads == 0 &&
      plan.key.threads() != kColumnGridCtaThreads && plan.key.threads_per_row <= kColumnGridCtaThreads) {
    BwdCtaHint hint;
    hint.cta_threads = kColumnGridCtaThreads;
    hint.column_grid = true;
    NormBwdPlan alt = plan_bwd_rules(p, want_dw, want_db, grad_dh, sm_count, arch, explain, hint);
    if ((alt.key.flags & kColumnGrads) != 0) plan = std::move(alt);
  }
  // Overrides that ask for a row layout (a sweep's CTAs, staging, clusters,
  // a capped grid) keep it: the one-wave rule yields to them unless forced.
  const bool layout_forced = t.bwd_cta_threads != 0 || t.bwd_cache_elems != 0 || t.bwd_min_blocks != 0 ||
                             t.bwd_stage != 0 || t.bwd_ring_stages != 0 || t.bwd_row_cluster != 0 ||
                             t.bwd_cluster != 0 || t.bwd_split != 0 || t.bwd_min_row_blocks != 0;
  const int one_wave = pick(t.bwd_one_wave_columns, layout_forced ? 1 : 2);
  if ((plan.key.flags & (kColumnGrads | kDirectGrads)) == 0 && !narrow && p.rows > 1 && one_wave == 2) {
    const bool wide_float_scalars = plan.split || t.bwd_one_wave_columns == 2;
    NormBwdPlan alt = one_wave_column_plan(p, want_dw, want_db, grad_dh, sm_count, arch, explain, wide_float_scalars);
    if ((alt.key.flags & kColumnGrads) != 0) plan = std::move(alt);
  }
  plan = with_bwd_single_stride(with_grid_exchange(std::move(plan), sm_count, arch, explain), p, sm_count, explain);
  if (explain && !plan.split && early_direct_grads(plan.key.flags, plan.key.threads_per_row, plan.key.rows_per_cta))
    plan.reason += kEarlyGradsWhy;
  const int forced = t.bwd_programmatic;
  plan.programmatic = forced > 0 ? forced == 2 : arch >= 90;
  return plan;
}

// H100 kernel-only sweep (docs/history.md, entry 22): every persistent
// CTA writes a fp32 partial row (4 bytes a column per output) that the column
// reduce reads back. A staged one-CTA row (x and dy through the shared-memory
// ring) with fewer rows than resident CTAs would get a CTA per row, and the
// partials then rival the rows' own traffic (256x8192 bf16 RMSNorm: 8 MB
// beside 12.6 MB). So such a grid is capped at about SMs / 2 CTAs or enough
// for staged_row_blocks_per_cta row blocks each, whichever is more. With the
// partial rows written as vector stores (entry 36) one output pays off at 2
// row blocks a CTA (RMSNorm 256x8192 18.0 -> 16.5 us, 512x8192 23.6 -> 21.0,
// 512x16384 41.9 -> 37.2), two outputs still at 8 (LayerNorm 256x8192 20.7
// capped at 66 CTAs, 21.4 at 128).
// Register rows (256x4096: 13.0 us uncapped, 15.2 at half the CTAs) and
// cluster rows (128x32768: 34.2 -> 37.6) lost with fewer CTAs: they keep the
// resident grid.
static int64_t staged_row_blocks_per_cta(const NormBwdPlan& plan) {
  const bool both = (plan.key.flags & kWantDw) != 0 && (plan.key.flags & kWantDb) != 0;
  return both ? 8 : 2;
}

int64_t bwd_max_units(const NormBwdPlan& plan, int sm_count, std::string* why) {
  constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();
  if (plan.split) return kNoCap;
  const int forced = norm_tuning().bwd_min_row_blocks;
  const bool staged = (plan.key.flags & kStagedRow) != 0;
  if (forced <= 0 && (!staged || plan.key.cluster > 1 || column_slices(plan.key.flags) > 1)) return kNoCap;
  // A row cluster's CTAs each own row blocks: its cap counts whole clusters.
  const int64_t per_unit = (plan.key.flags & kRowClusterBits) != 0 ? plan.key.cluster : 1;
  const int64_t cap = forced > 0 ? ceil_div(ceil_div(plan.row_blocks, forced), per_unit)
                                 : std::max<int64_t>(std::max(1, sm_count / 2),
                                                     ceil_div(plan.row_blocks, staged_row_blocks_per_cta(plan)));
  if (why != nullptr && cap < bwd_grid_row_blocks(plan))
    *why = forced > 0 ? "; the grid is also capped at ceil(row blocks / bwd_min_row_blocks) = " + std::to_string(cap) +
                            (plan.key.cluster > 1 ? " clusters" : " CTAs") + ", by the tuning override"
                      : "; the grid is also capped at max(SMs / 2, row blocks / " +
                            std::to_string(staged_row_blocks_per_cta(plan)) + ") = " + std::to_string(cap) +
                            " CTAs (it binds only below the resident CTAs, when rows are few: fewer fp32 "
                            "partial rows to write and reduce)";
  return cap;
}

KernelKey column_reduce_key(DType out, int64_t cols, int arch) {
  KernelKey k;
  k.family = &kColumnReduce;
  k.dtype = DType::kFloat32;
  k.wdtype = out;
  k.vec = static_cast<int16_t>(column_reduce_width(cols));
  k.threads_per_row = 32;
  k.rows_per_cta = 16;
  k.arch = static_cast<int16_t>(arch);
  return k;
}

}  // namespace rtcnorm
