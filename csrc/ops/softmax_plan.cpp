#include "ops/softmax_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "ops/variants.h"

namespace rtcnorm {
namespace {

using jit::DType;
using jit::KernelFamily;
using jit::KernelKey;

constexpr unsigned kCachedFlag = 1u;

std::string softmax_expression(const char* kernel, const KernelKey& k) {
  std::ostringstream os;
  os << "rtcnorm::" << kernel << "<" << jit::kernel_type_name(k.dtype) << ", " << k.vec << ", " << k.threads_per_row
     << ", " << k.rows_per_cta << ", " << k.vecs_per_thread << ", ";
  if (k.family == &kSoftmaxFwd)
    os << k.variant;
  else
    os << (k.variant != 0 ? "true" : "false");
  os << ", " << ((k.flags & kCachedFlag) != 0 ? "true" : "false") << ">";
  return os.str();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Per-thread register budgets for the raw row data (x; or y and dy), in
// 32-bit registers. Every kernel is held to 64 registers (SoftmaxBounds), and
// ptxas needs the rest for addresses, exponentials and the reduction.
constexpr int kTargetRegs = 16;  // 64 bytes in flight per thread: enough for HBM
constexpr int kMaxRegs = 32;     // a cached row may grow to this before adding threads
// Streamed chunks stay small: ptxas overlaps a chunk's loads with the previous
// chunk's math, holding two chunks live.
constexpr int kStreamRegs = 8;
constexpr int kStreamThreads = 512;
constexpr int kCtaThreads = 256;  // rows shorter than a CTA share one
// Past this many threads a row group needs barriers; up to kMaxRegs per thread
// a warp per row is preferred (shuffles only).
constexpr int kWarp = 32;

// Most threads a register-cached row may use. RTCNORM_SOFTMAX_CACHE_THREADS
// (a power of two, 32 to 1024) lowers it for tuning: longer rows then stream.
int max_cached_threads() {
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

int choose_vec(const SoftmaxProblem& p) {
  int vec = 16 / jit::element_size(p.dtype);
  while (vec > 1 && (vec > p.max_vec || p.cols % vec != 0)) vec /= 2;
  return vec;
}

}  // namespace

const KernelFamily kSoftmaxFwd{"softmax_fwd", "softmax.cuh",
                               [](const KernelKey& k) { return softmax_expression("softmax_fwd", k); }};
const KernelFamily kSoftmaxBwd{"softmax_bwd", "softmax.cuh",
                               [](const KernelKey& k) { return softmax_expression("softmax_bwd", k); }};

SoftmaxPlan plan_softmax(const SoftmaxProblem& p, int arch) {
  const int vec = choose_vec(p);
  const int tensors = p.backward ? 2 : 1;
  const int regs_per_vec = tensors * std::max(1, vec * jit::element_size(p.dtype) / 4);
  // Forward rows of single elements spill past 8 per thread (each element is
  // predicated, masked and exponentiated on its own).
  const int max_nv = std::min(std::max(1, kMaxRegs / regs_per_vec), !p.backward && vec == 1 ? 8 : 32);
  const int target_nv = std::min(max_nv, std::max(1, kTargetRegs / regs_per_vec));
  const int64_t nvec = p.cols / vec;

  int64_t tpr = pow2_ceil(ceil_div(nvec, target_nv));
  if (tpr > kWarp && ceil_div(nvec, kWarp) <= max_nv) tpr = kWarp;
  if (tpr > kCtaThreads) tpr = std::max<int64_t>(kCtaThreads, pow2_ceil(ceil_div(nvec, max_nv)));

  SoftmaxPlan plan;
  plan.cached = tpr <= max_cached_threads();
  int nv, rows;
  if (plan.cached) {
    // Rounded up to a power of two: one kernel serves every length in
    // (capacity / 2, capacity], so growing lengths reuse kernels.
    nv = static_cast<int>(pow2_ceil(ceil_div(nvec, tpr)));
    rows = tpr < kCtaThreads ? static_cast<int>(kCtaThreads / tpr) : 1;
  } else {
    tpr = kStreamThreads;
    nv = std::max(1, kStreamRegs * tensors / regs_per_vec);
    rows = 1;
  }
  plan.persistent = !plan.cached;
  plan.row_blocks = ceil_div(p.rows, rows);

  KernelKey k;
  k.family = p.backward ? &kSoftmaxBwd : &kSoftmaxFwd;
  k.dtype = p.dtype;
  k.wdtype = p.dtype;
  k.hidden = plan.cached ? static_cast<int32_t>(tpr * nv * vec) : 0;
  k.vec = static_cast<int16_t>(vec);
  k.threads_per_row = static_cast<int16_t>(tpr);
  k.rows_per_cta = static_cast<int16_t>(rows);
  k.vecs_per_thread = static_cast<int16_t>(nv);
  k.flags = plan.cached ? kCachedFlag : 0u;
  k.variant = static_cast<int16_t>(p.backward ? (p.kind == kSoftmaxCausal ? 1 : 0) : p.kind);
  k.arch = static_cast<int16_t>(arch);
  plan.key = k;
  return plan;
}

int64_t softmax_grid(const SoftmaxPlan& plan, int sm_count, int blocks_per_sm) {
  if (!plan.persistent) return plan.row_blocks;
  const int per_sm = std::max(1, std::min(blocks_per_sm, kStreamCtasPerSm));
  return std::max<int64_t>(1, std::min<int64_t>(plan.row_blocks, int64_t(sm_count) * per_sm));
}

std::string describe_plan(const SoftmaxProblem& p, const SoftmaxPlan& plan) {
  const KernelKey& k = plan.key;
  std::ostringstream os;
  const char* data = p.backward ? "y and dy" : "x";
  if (plan.cached) {
    os << "row of " << p.cols << " kept in registers (" << data << " read once): " << k.threads_per_row
       << " threads per row, " << k.vecs_per_thread << " vectors of " << k.vec << " per thread, " << k.rows_per_cta
       << " rows per CTA; kernel serves rows of up to " << k.hidden << " elements; grid = one CTA per row block";
  } else {
    os << "row of " << p.cols << " exceeds the register cache (" << max_cached_threads()
       << " threads per row): streamed in chunks of " << k.threads_per_row * k.vecs_per_thread * k.vec << " elements, "
       << data << " re-read (mostly from L2) for the " << (p.backward ? "dx pass" : "normalize pass")
       << "; grid = SMs x min(occupancy, " << kStreamCtasPerSm << ")";
  }
  if (p.kind == kSoftmaxCausal) os << "; causal: keys past the diagonal are neither read nor computed";
  return os.str();
}

namespace {

// Every kernel an op may launch for (dtype, sk, arch): its forward and the
// backward its autograd calls. Assumes aligned tensors (the widest vector
// access), as freshly allocated tensors are.
std::vector<KernelKey> softmax_keys(SoftmaxKind kind, DType dtype, int64_t cols, int arch) {
  SoftmaxProblem p;
  p.dtype = dtype;
  p.rows = 1 << 16;
  p.cols = cols;
  p.max_vec = 16;
  p.kind = kind;
  std::vector<KernelKey> keys = {plan_softmax(p, arch).key};
  p.backward = true;
  keys.push_back(plan_softmax(p, arch).key);
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
