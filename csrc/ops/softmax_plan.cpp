#include "ops/softmax_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "ops/plan_util.h"
#include "ops/variants.h"

namespace rtcnorm {
namespace {

using jit::DType;
using jit::KernelFamily;
using jit::KernelKey;

// Key flags: bit 0 cached, bits 8..15 the launch-bounds min blocks (MINB),
// bits 16..23 the SoftmaxOpt bits (OPTS); every bit reaches the expression.
constexpr unsigned kCachedFlag = 1u;
constexpr int kMinBlocksShift = 8, kOptsShift = 16;

std::string softmax_expression(const char* kernel, const KernelKey& k) {
  std::ostringstream os;
  os << "rtcnorm::" << kernel << "<" << jit::kernel_type_name(k.dtype) << ", " << k.vec << ", " << k.threads_per_row
     << ", " << k.rows_per_cta << ", " << k.vecs_per_thread << ", ";
  if (k.family == &kSoftmaxFwd)
    os << k.variant;
  else
    os << (k.variant != 0 ? "true" : "false");
  os << ", " << ((k.flags & kCachedFlag) != 0 ? "true" : "false") << ", " << ((k.flags >> kMinBlocksShift) & 0xffu)
     << ", " << ((k.flags >> kOptsShift) & 0xffu) << "u>";
  return os.str();
}

// Per-thread register budgets for the raw row data (x; or y and dy), in
// 32-bit registers. Every kernel is held to 64 registers (kResidentThreads),
// and ptxas needs the rest for addresses, exponentials and the reduction.
constexpr int kTargetRegs = 16;  // 64 bytes in flight per thread: enough for HBM
constexpr int kMaxRegs = 32;     // a cached row may grow to this before adding threads
// Launch bounds reserve registers for this many resident threads per SM
// (64 per thread): a 512-thread CTA caching a 64 KiB row still fits twice.
constexpr int kResidentThreads = 1024;
// Cached rows of at most this many elements per thread keep exp2(z - m) in
// fp32 registers for the write pass; longer ones recompute it (MUFU is cheap
// next to the registers 64 extra values would take).
constexpr int kKeepExpElems = 16;
// Streamed chunks stay small: ptxas overlaps a chunk's loads with the previous
// chunk's math, holding two chunks live.
constexpr int kStreamRegs = 8;
constexpr int kStreamThreads = 512;
constexpr int kCtaThreads = 256;  // rows shorter than a CTA share one
// The backward's CTAs, and its short-row rule (H100 sweep, benchmarks/NOTES.md
// entry 16): rows of up to 256 16-byte vectors, one vector pair per thread in
// 512-thread CTAs, ran 1.0-1.2% faster than 4 pairs per thread in 256-thread
// CTAs (sk = 1024 bf16: 2926 -> 2955 GB/s); longer rows keep 16 registers of
// row data per thread, and 512-thread CTAs (sk = 8192: 2928 -> 2948). Causal
// rows keep the forward's shape: there the same change lost 7-15% (sk = 1024:
// 4186 -> 3563 GB/s, counting the full rows' bytes).
constexpr int kBwdCtaThreads = 512;
constexpr int kBwdShortVecs = 256;
constexpr int kLongMaskedCols = 4096;
// Mask reuse (H100 sweep, benchmarks/NOTES.md): runs of 4 rows per mask row
// were best or within 1% from sk = 2048 up (sk = 4096: runs of 32 2715 GB/s,
// 16 2787, 4 2822); at sk = 1024 reuse lost (2731 -> 2637). Runs stay short
// enough to leave the grid kReuseBlocks row blocks (sk = 2048, 8 rows per
// CTA: 2048 blocks, 4 waves, 2752 GB/s), and longer CTAs are not worth it
// where the grid is small already.
constexpr int kReuseRun = 4;
constexpr int kReuseCols = 2048;
constexpr int kReuseBlocks = 2048;
constexpr int kLongMaskedThreads = 128;
// Past this many threads a row group needs barriers; up to kMaxRegs per thread
// a warp per row is preferred (shuffles only).
constexpr int kWarp = 32;
// Grids of at most one row per SM (decode). Each row takes a CTA of its
// own, spread over threads at the register target with no warp preference,
// and the forward's target drops to kFewRowsFwdRegs: a lone CTA on its SM
// has nothing else in flight, and its time is the serial chain of one
// thread's loads, exponentials and reduction (H100 kernel-only,
// benchmarks/NOTES.md entry 49: 32 rows of 2048 bf16, packed 8 to a CTA
// 4.45 us, a row per CTA at 4 vectors a thread 3.23, at 2 2.75; masked rows
// of 4096 4.53 -> 3.50). With at most an eighth as many rows
// as SMs, rows of kMinClusterRowVecs vectors or more (sm_90+) split over a
// cluster of up to kMaxRowCluster CTAs, keeping kMinClusterSliceVecs or more
// each (entry 49: 8 rows of 32768 forward 6.80 -> 4.80 us, backward 5.44 ->
// 4.08; 8 of 65536 12.2 -> 5.5 and 13.9 -> 5.4; but 16 rows of 16384 lost
// 0.3 us backward and 32 rows of 8192 0.6-0.8 us: the cluster launch and
// barrier cost more than a 32 KB row's loads take).
constexpr int kFewRowsFwdRegs = 8;
constexpr int kMaxRowCluster = 8;
constexpr int64_t kMinClusterRowVecs = 4096;
constexpr int64_t kMinClusterSliceVecs = 256;

bool switch_on(int override_value, bool rule) { return override_value > 0 ? override_value == 2 : rule; }

// Most threads a register-cached row may use. RTCNORM_SOFTMAX_CACHE_THREADS
// (a power of two, 32 to 1024) lowers it for tuning: longer rows then stream.
int env_cached_threads() {
  static const int v = [] {
    const char* e = std::getenv("RTCNORM_SOFTMAX_CACHE_THREADS");
    if (e == nullptr || *e == '\0') return 1024;
    const int n = std::atoi(e);
    TORCH_CHECK_VALUE(n >= 32 && n <= 1024 && (n & (n - 1)) == 0,
                      "rtcnorm: RTCNORM_SOFTMAX_CACHE_THREADS must be a power of two from 32 to 1024, got '", e, "'");
    return n;
  }();
  return v;
}

int max_cached_threads() { return pick(softmax_tuning().cache_threads, env_cached_threads()); }

int choose_vec(const SoftmaxProblem& p) { return widest_vec(p.dtype, p.max_vec, p.cols); }

// Causal rows of a single query (decode, sq == 1) see every key: they run
// the plain kernels, without the per-element causal tests.
SoftmaxKind planned_kind(const SoftmaxProblem& p) {
  return p.kind == kSoftmaxCausal && p.sq == 1 ? kSoftmaxPlain : p.kind;
}

// Threads per row for `nvec` vectors at target_nv (at most max_nv) vectors a
// thread: a warp where it fits within max_nv, at most cta_threads otherwise.
int64_t threads_per_row(int64_t nvec, int target_nv, int max_nv, int cta_threads) {
  int64_t tpr = pow2_ceil(ceil_div(nvec, target_nv));
  if (tpr > kWarp && ceil_div(nvec, kWarp) <= max_nv) tpr = kWarp;
  if (tpr > cta_threads) tpr = std::max<int64_t>(cta_threads, pow2_ceil(ceil_div(nvec, max_nv)));
  return tpr;
}

// CTAs per cluster splitting each of a few-row grid's rows of `nvec`
// vectors (1: no cluster); an override forces its size on any few-row grid.
int row_cluster(const SoftmaxProblem& p, int64_t nvec, int arch) {
  const SoftmaxTuning& t = softmax_tuning();
  const int forced = p.backward ? t.bwd_cluster : t.fwd_cluster;
  if (arch < 90 || forced == 1) return 1;
  if (forced > 1) return nvec >= forced ? forced : 1;
  if (p.rows * kMaxRowCluster > p.sm_count || nvec < kMinClusterRowVecs) return 1;
  int cl = 1;
  while (cl < kMaxRowCluster && p.rows * cl * 2 <= p.sm_count && nvec / (cl * 2) >= kMinClusterSliceVecs) cl *= 2;
  return cl;
}

// A cached grid of at most one CTA per SM (decode: a few rows), which takes
// launch bounds of one.
bool one_wave_grid(const SoftmaxProblem& p, const SoftmaxPlan& plan) {
  return p.sm_count > 0 && plan.cached && !plan.persistent && plan.row_blocks <= p.sm_count;
}

}  // namespace

const KernelFamily kSoftmaxFwd{"softmax_fwd", "softmax.cuh",
                               [](const KernelKey& k) { return softmax_expression("softmax_fwd", k); }};
const KernelFamily kSoftmaxBwd{"softmax_bwd", "softmax.cuh",
                               [](const KernelKey& k) { return softmax_expression("softmax_bwd", k); }};

SoftmaxPlan plan_softmax(const SoftmaxProblem& p, int arch) {
  const SoftmaxTuning& t = softmax_tuning();
  const bool bwd = p.backward;
  const SoftmaxKind kind = planned_kind(p);
  const int vec = choose_vec(p);
  const int tensors = bwd ? 2 : 1;
  const int regs_per_vec = tensors * std::max(1, vec * jit::element_size(p.dtype) / 4);
  const int64_t nvec = p.cols / vec;
  // Full-row backward (not causal) in kBwdCtaThreads CTAs; rows of up to
  // kBwdShortVecs 16-byte vectors take one vector of y and one of dy per
  // thread, so a row spreads over up to 256 threads.
  const bool full_bwd = bwd && kind != kSoftmaxCausal;
  const bool bwd_short = full_bwd && vec * jit::element_size(p.dtype) == 16 && nvec <= kBwdShortVecs;
  const bool few_rows = switch_on(t.few_rows, p.sm_count > 0 && p.rows <= p.sm_count);
  const int rule_regs = bwd_short ? regs_per_vec : (few_rows && !bwd ? kFewRowsFwdRegs : kTargetRegs);
  const int target_regs = pick(bwd ? t.bwd_target_regs : t.fwd_target_regs, rule_regs);
  const int max_regs =
      std::max(target_regs, pick(bwd ? t.bwd_max_regs : t.fwd_max_regs, bwd_short ? regs_per_vec : kMaxRegs));
  int cta_threads = pick(bwd ? t.bwd_cta_threads : t.fwd_cta_threads, full_bwd ? kBwdCtaThreads : kCtaThreads);
  // Masked forward rows of >= 4096 keys with a mask broadcast over heads
  // (H100 sweep, benchmarks/NOTES.md): the heads sharing a mask row run back
  // to back, so that row is read from DRAM once rather than once per head
  // (sq rows apart, the heads' mask re-reads miss L2 from sk = 4096 up), and
  // a row takes a CTA of its own with at least 128 threads: 69-73% -> 78-85%
  // of copy.
  const bool long_masked = !bwd && kind == kSoftmaxMasked && p.mask_bcast && p.cols >= kLongMaskedCols;
  // Forward rows of single elements spill past 8 per thread (each element is
  // predicated, masked and exponentiated on its own).
  const int max_nv = std::min(std::max(1, max_regs / regs_per_vec), !bwd && vec == 1 ? 8 : 32);
  const int target_nv = std::min(max_nv, std::max(1, target_regs / regs_per_vec));

  // Few rows (see kMaxRowCluster): a CTA per row, or a cluster of CTAs
  // each holding a slice of it as if it were the row. Clusters run one row
  // block per launch slot, so a forced persistent grid or mask reuse run
  // (its own row order) keeps whole-CTA rows.
  const bool persistent_forced = switch_on(bwd ? t.bwd_persistent : t.fwd_persistent, false);
  const bool reuse_forced = t.reuse_run > 0 || t.mask_reuse == 2;
  int cl = few_rows && !persistent_forced && !reuse_forced ? row_cluster(p, nvec, arch) : 1;
  auto spread_threads = [&](int64_t vecs) {
    const int64_t n = std::clamp<int64_t>(pow2_ceil(ceil_div(vecs, target_nv)), 1, cta_threads);
    return std::max<int64_t>(n, pow2_ceil(ceil_div(vecs, max_nv)));
  };
  int64_t tpr = few_rows ? spread_threads(ceil_div(nvec, cl)) : threads_per_row(nvec, target_nv, max_nv, cta_threads);
  if (!few_rows && long_masked && t.fwd_target_regs == 0 && t.fwd_cta_threads == 0) {
    tpr = std::max<int64_t>(kLongMaskedThreads, pow2_ceil(ceil_div(nvec, max_nv)));
    cta_threads = static_cast<int>(std::min<int64_t>(tpr, kCtaThreads));
  }
  if (cl > 1 && tpr > max_cached_threads()) {  // a slice too long to cache: stream whole rows
    cl = 1;
    tpr = spread_threads(nvec);
  }

  SoftmaxPlan plan;
  plan.cached = tpr <= max_cached_threads();
  int nv, rows;
  if (plan.cached) {
    // Rounded up to a power of two: one kernel serves every length in
    // (capacity / 2, capacity], so growing lengths reuse kernels.
    nv = static_cast<int>(pow2_ceil(ceil_div(ceil_div(nvec, cl), tpr)));
    rows = tpr < cta_threads && !few_rows ? static_cast<int>(cta_threads / tpr) : 1;
  } else {
    tpr = pick(t.stream_threads, kStreamThreads);
    nv = std::min(32, std::max(1, pick(t.stream_regs, kStreamRegs) * tensors / regs_per_vec));
    rows = 1;
  }
  plan.persistent = !plan.cached || persistent_forced;
  plan.ctas_per_sm = pick(t.ctas_per_sm, plan.cached ? 0 : kStreamCtasPerSm);
  plan.row_blocks = ceil_div(p.rows, rows);

  const int threads = static_cast<int>(tpr) * rows;
  // A grid of at most one CTA per SM (decode: a few rows) loses nothing to
  // launch bounds of one CTA per SM, and ptxas then schedules the row's loads
  // with room to spare (H100 kernel-only, benchmarks/NOTES.md entry 47:
  // aligned causal 1x32x1x8192 backward 3.82 -> 3.62 us, 2x16x1x16384 forward
  // 6.11 -> 5.86; masked 1x32x1x8192 forward 5.20 -> 5.02).
  const int resident =
      pick(bwd ? t.bwd_resident_threads : t.fwd_resident_threads, one_wave_grid(p, plan) ? 1 : kResidentThreads);
  const int min_blocks = std::min(255, std::max(1, resident / threads));
  unsigned opts = 0;
  if (plan.cached && !bwd && nv * vec <= pick(t.keep_exp_elems, kKeepExpElems)) opts |= kSoftmaxKeepExp;
  if (plan.cached && plan.persistent && switch_on(bwd ? t.bwd_prefetch : t.fwd_prefetch, false))
    opts |= kSoftmaxPrefetch;
  if (switch_on(bwd ? t.bwd_stream_store : t.fwd_stream_store, false)) opts |= kSoftmaxStreamStore;
  // Inputs of 40 MB or more load x (y and dy) through L1 rather than around
  // it (H100 kernel-only, benchmarks/NOTES.md entry 47): 1.6-4.2% off the
  // masked forward and backward at 256 MB-8 GB (bf16 4x32x1024x1024 backward
  // 270.3 -> 264.9 us), 1-2% off the causal backward; 64 MB inputs within
  // +-1.2%, but 16-32 MB ones 0.3-3.3% slower (masked 1x8x1024x1024 backward
  // 19.15 -> 19.78 us), as the norm forward found (entry 27).
  const int64_t input_bytes = p.rows * p.cols * jit::element_size(p.dtype);
  if (switch_on(bwd ? t.bwd_l1_alloc : t.fwd_l1_alloc, input_bytes >= kL1AllocMinInputBytes)) opts |= kSoftmaxL1Alloc;
  if (!bwd && kind == kSoftmaxMasked && p.mask_bcast && switch_on(t.mask_order, long_masked))
    opts |= kSoftmaxHeadsInner;
  // A mask broadcast over a dim (heads): each row group loads its mask row's
  // bits once and applies them to a run of the rows sharing it.
  int64_t per = std::min<int64_t>({p.bcast, kReuseRun, plan.row_blocks / kReuseBlocks});
  const bool reuse_rule = p.cols >= kReuseCols && per >= 2;
  if (t.reuse_run > 0) per = std::min<int64_t>(p.bcast, t.reuse_run);
  if (!bwd && kind == kSoftmaxMasked && p.mask_bcast && p.bcast > 1 && plan.cached && cl == 1 &&
      switch_on(t.mask_reuse, reuse_rule || t.reuse_run > 0)) {
    const int64_t mask_blocks = ceil_div(p.rows / p.bcast, rows);
    per = std::max<int64_t>(1, per);
    plan.reuse_splits = static_cast<int>(ceil_div(p.bcast, per));
    plan.row_blocks = mask_blocks * plan.reuse_splits;
    opts = (opts & ~kSoftmaxPrefetch) | kSoftmaxHeadsInner | kSoftmaxMaskReuse;
  }
  opts |= static_cast<unsigned>(log2_of_pow2(cl)) << kSoftmaxClusterShift;

  KernelKey k;
  k.family = p.backward ? &kSoftmaxBwd : &kSoftmaxFwd;
  k.dtype = p.dtype;
  k.wdtype = p.dtype;
  k.hidden = plan.cached ? static_cast<int32_t>(cl * tpr * nv * vec) : 0;
  k.vec = static_cast<int16_t>(vec);
  k.threads_per_row = static_cast<int16_t>(tpr);
  k.rows_per_cta = static_cast<int16_t>(rows);
  k.vecs_per_thread = static_cast<int16_t>(nv);
  k.flags =
      (plan.cached ? kCachedFlag : 0u) | (opts << kOptsShift) | (static_cast<unsigned>(min_blocks) << kMinBlocksShift);
  k.variant = static_cast<int16_t>(p.backward ? (kind == kSoftmaxCausal ? 1 : 0) : kind);
  k.arch = static_cast<int16_t>(arch);
  k.cluster = static_cast<int16_t>(cl);
  plan.key = k;
  return plan;
}

int64_t softmax_grid(const SoftmaxPlan& plan, int sm_count, int blocks_per_sm) {
  if (!plan.persistent) return fixed_grid(plan);
  const int per_sm = std::max(1, plan.ctas_per_sm > 0 ? std::min(blocks_per_sm, plan.ctas_per_sm) : blocks_per_sm);
  return std::max<int64_t>(1, std::min<int64_t>(plan.row_blocks, int64_t(sm_count) * per_sm));
}

std::string describe_grid(const SoftmaxPlan& plan) {
  if (!plan.persistent) return std::to_string(fixed_grid(plan));
  return plan.ctas_per_sm > 0 ? "SMs x min(occupancy, " + std::to_string(plan.ctas_per_sm) + ")" : "SMs x occupancy";
}

std::string describe_plan(const SoftmaxProblem& p, const SoftmaxPlan& plan) {
  const KernelKey& k = plan.key;
  std::ostringstream os;
  const char* data = p.backward ? "y and dy" : "x";
  if (plan.cached) {
    os << "row of " << p.cols << " kept in registers (" << data << " read once): " << k.threads_per_row
       << " threads per row, " << k.vecs_per_thread << " vectors of " << k.vec << " per thread, " << k.rows_per_cta
       << " rows per CTA; kernel serves rows of up to " << k.hidden << " elements; grid = "
       << (plan.persistent ? describe_grid(plan) + ", CTAs stride over row blocks"
           : k.cluster > 1 ? "one cluster per row block"
                           : "one CTA per row block");
    if (k.cluster > 1)
      os << "; row split across a cluster of " << k.cluster << " CTAs, each holding interleaved pieces of "
         << k.threads_per_row << " vectors (" << k.hidden / k.cluster
         << " elements of the row), statistics merged through distributed shared memory";
  } else {
    os << "row of " << p.cols << " exceeds the register cache (" << max_cached_threads()
       << " threads per row): streamed in chunks of " << k.threads_per_row * k.vecs_per_thread * k.vec << " elements, "
       << data << " re-read (mostly from L2) for the " << (p.backward ? "dx pass" : "normalize pass")
       << "; grid = " << describe_grid(plan);
  }
  const unsigned opts = (k.flags >> kOptsShift) & 0xffu;
  const unsigned minb = (k.flags >> kMinBlocksShift) & 0xffu;
  os << "; launch bounds: " << minb << (minb == 1 ? " CTA per SM" : " CTAs per SM");
  if (minb == 1 && one_wave_grid(p, plan)) os << " (grid of at most one CTA per SM)";
  if (opts & kSoftmaxKeepExp) os << "; exp2 kept in registers";
  if (opts & kSoftmaxPrefetch) os << "; next row block prefetched into L2";
  if (opts & kSoftmaxStreamStore) os << "; output stored evict-first";
  if (opts & kSoftmaxL1Alloc) os << "; " << data << " loaded through L1 (input of 40 MB or more)";
  if (opts & kSoftmaxMaskReuse)
    os << "; each row group reads its mask row once for a run of " << ceil_div(p.bcast, plan.reuse_splits)
       << " rows sharing it (" << plan.reuse_splits << (plan.reuse_splits == 1 ? " run" : " runs") << " per mask row)";
  else if (opts & kSoftmaxHeadsInner)
    os << "; rows sharing a mask row taken consecutively";
  if (planned_kind(p) == kSoftmaxCausal)
    os << "; causal: keys past the diagonal are neither read nor computed";
  else if (p.kind == kSoftmaxCausal)
    os << "; causal with a single query: every key is visible, so the plain kernel runs";
  return os.str();
}

SoftmaxTuning& softmax_tuning() {
  static SoftmaxTuning t;
  return t;
}

const SoftmaxTunable kSoftmaxTunables[] = {
    {"fwd_target_regs", &SoftmaxTuning::fwd_target_regs, 1, 128, false},
    {"fwd_max_regs", &SoftmaxTuning::fwd_max_regs, 1, 256, false},
    {"bwd_target_regs", &SoftmaxTuning::bwd_target_regs, 1, 128, false},
    {"bwd_max_regs", &SoftmaxTuning::bwd_max_regs, 1, 256, false},
    {"fwd_cta_threads", &SoftmaxTuning::fwd_cta_threads, 32, 1024, true},
    {"bwd_cta_threads", &SoftmaxTuning::bwd_cta_threads, 32, 1024, true},
    {"fwd_resident_threads", &SoftmaxTuning::fwd_resident_threads, 32, 2048, false},
    {"bwd_resident_threads", &SoftmaxTuning::bwd_resident_threads, 32, 2048, false},
    {"fwd_persistent", &SoftmaxTuning::fwd_persistent, 1, 2, false},
    {"bwd_persistent", &SoftmaxTuning::bwd_persistent, 1, 2, false},
    {"fwd_prefetch", &SoftmaxTuning::fwd_prefetch, 1, 2, false},
    {"bwd_prefetch", &SoftmaxTuning::bwd_prefetch, 1, 2, false},
    {"fwd_stream_store", &SoftmaxTuning::fwd_stream_store, 1, 2, false},
    {"bwd_stream_store", &SoftmaxTuning::bwd_stream_store, 1, 2, false},
    {"fwd_l1_alloc", &SoftmaxTuning::fwd_l1_alloc, 1, 2, false},
    {"bwd_l1_alloc", &SoftmaxTuning::bwd_l1_alloc, 1, 2, false},
    {"keep_exp_elems", &SoftmaxTuning::keep_exp_elems, 1, 256, false},
    {"mask_order", &SoftmaxTuning::mask_order, 1, 2, false},
    {"mask_reuse", &SoftmaxTuning::mask_reuse, 1, 2, false},
    {"reuse_run", &SoftmaxTuning::reuse_run, 1, 1 << 30, false},
    {"ctas_per_sm", &SoftmaxTuning::ctas_per_sm, 1, 32, false},
    {"cache_threads", &SoftmaxTuning::cache_threads, 32, 1024, true},
    {"stream_regs", &SoftmaxTuning::stream_regs, 1, 64, false},
    {"stream_threads", &SoftmaxTuning::stream_threads, 32, 1024, true},
    {"few_rows", &SoftmaxTuning::few_rows, 1, 2, false},
    {"fwd_cluster", &SoftmaxTuning::fwd_cluster, 1, 8, true},
    {"bwd_cluster", &SoftmaxTuning::bwd_cluster, 1, 8, true},
};
const int kNumSoftmaxTunables = static_cast<int>(sizeof(kSoftmaxTunables) / sizeof(kSoftmaxTunables[0]));

std::string check_softmax_tunable(const SoftmaxTunable& t, int64_t value) {
  if (value == 0) return "";
  const bool in_range = value >= t.lo && value <= t.hi;
  if (in_range && (!t.pow2 || (value & (value - 1)) == 0)) return "";
  std::ostringstream os;
  os << "rtcnorm._tuning: softmax " << t.name << " must be 0 (the planner's rule) or ";
  if (t.hi == 2)
    os << "1 (off) or 2 (on)";
  else
    os << (t.pow2 ? "a power of two " : "") << "from " << t.lo << " to " << t.hi;
  os << ", got " << value;
  return os.str();
}

namespace {

// Every kernel an op may launch for (dtype, sk, arch): its forward and the
// backward its autograd calls. Assumes aligned tensors (the widest vector
// access), as freshly allocated tensors are; masks both full and broadcast.
std::vector<KernelKey> softmax_keys(SoftmaxKind kind, DType dtype, int64_t cols, int arch) {
  SoftmaxProblem p;
  p.dtype = dtype;
  p.rows = 1 << 16;
  p.cols = cols;
  p.max_vec = 16;
  p.kind = kind;
  std::vector<KernelKey> keys = {plan_softmax(p, arch).key};
  if (kind == kSoftmaxMasked) {  // and a mask broadcast over 16 heads
    p.mask_bcast = true;
    p.bcast = 16;
    keys.push_back(plan_softmax(p, arch).key);
    p.mask_bcast = false;
    p.bcast = 1;
  }
  p.backward = true;
  keys.push_back(plan_softmax(p, arch).key);
  // Decode-sized grids on 132 SMs: 32 rows (a CTA per row, its own launch
  // bounds, loads around L1 where the large grid's go through it) and 8 rows
  // (long ones split over clusters); causal ones also with a single query,
  // which runs the plain kernels.
  p.sm_count = 132;
  for (int64_t rows : {32, 8})
    for (int64_t sq : {int64_t{0}, int64_t{1}})
      for (bool backward : {false, true}) {
        if (sq == 1 && kind != kSoftmaxCausal) continue;
        p.rows = rows;
        p.sq = sq;
        p.backward = backward;
        const KernelKey k = plan_softmax(p, arch).key;
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
      }
  return keys;
}

template <SoftmaxKind kKind>
std::vector<KernelKey> keys_of(DType dtype, int64_t cols, const std::vector<NormMode>& /*modes*/, int arch) {
  return softmax_keys(kKind, dtype, cols, arch);
}

const bool kRegistered = register_variants("scaled_softmax", keys_of<kSoftmaxPlain>) &&
                         register_variants("scaled_masked_softmax", keys_of<kSoftmaxMasked>) &&
                         register_variants("scaled_upper_triang_masked_softmax", keys_of<kSoftmaxCausal>) &&
                         register_variants("scaled_aligned_causal_masked_softmax", keys_of<kSoftmaxCausal>);

}  // namespace
}  // namespace rtcnorm
