// Integer helpers and arch limits shared by the launch planners (ops/norm/plan/,
// ops/softmax/plan/). Host only; no state.
#pragma once

#include <algorithm>
#include <cstdint>

#include "jit/dtype.h"

namespace rtcnorm {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Inputs (the norm forward's x; the softmax's x, or y and dy) of at least this
// many bytes are read through L1 rather than around it (kL1Allocate,
// kSoftmaxL1Alloc; docs/history.md entry 27 and ops/softmax/plan/designs.cpp).
constexpr int64_t kL1AllocMinInputBytes = int64_t(40) << 20;

// The smallest power of two >= v (1 for v <= 1).
inline int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The largest power of two <= v (1 for v <= 1).
inline int64_t pow2_floor(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p <<= 1;
  return p;
}

// log2 of a power of two.
inline unsigned log2_of_pow2(int64_t v) {
  unsigned k = 0;
  while ((int64_t(1) << k) < v) ++k;
  return k;
}

// A planner tunable: a positive override replaces the rule's value.
inline int pick(int override_value, int rule) { return override_value > 0 ? override_value : rule; }

// Elements per vector access: at most 16 bytes, at most `max_vec` (what every
// pointer and stride allows), and dividing the row length `len`.
inline int widest_vec(jit::DType dtype, int max_vec, int64_t len) {
  int vec = 16 / jit::element_size(dtype);
  while (vec > 1 && (vec > max_vec || len % vec != 0)) vec /= 2;
  return vec;
}

// Dynamic shared memory one CTA may opt into, by architecture (the CUDA
// programming guide's table): 227 KB on sm_90/sm_100 class parts, 163 KB on
// sm_80/sm_87, 99 KB on sm_86/sm_89/sm_120 class parts. A fixed table keeps
// kernel keys identical between GPU-less precompile and the device.
inline int64_t max_smem_per_block(int arch) {
  if (arch == 80 || arch == 87) return 163 * 1024;
  if (arch >= 90 && arch < 120) return 227 * 1024;
  return 99 * 1024;
}

// CTAs of one thread-block cluster: 8 portable, 16 with sm_90's opt-in (none before sm_90).
inline int max_cluster_ctas(int arch) { return arch < 90 ? 1 : arch == 90 ? 16 : 8; }

// Registers ptxas allows a thread at launch bounds (threads, blocks): four
// register partitions of 16384 take warps round-robin, 8 registers a step, at most 255.
inline int regs_at(int threads, int blocks) {
  const int warps = ((threads + 31) / 32) * std::max(1, blocks);
  const int per_partition = (warps + 3) / 4;
  return std::min(255, 16384 / (per_partition * 32) / 8 * 8);
}

// The most CTAs an SM, at most `blocks` (and at least 1), leaving a thread `need` registers.
inline int blocks_leaving(int threads, int blocks, int need) {
  while (blocks > 1 && regs_at(threads, blocks) < need) --blocks;
  return std::max(1, blocks);
}

// Threads a row at about `nv` vectors each: a power of two up to a warp, else the multiple of 32 idling fewest.
inline int threads_per_row(int64_t nvec, int nv) {
  const int64_t want = ceil_div(nvec, std::max(1, nv));
  if (want <= 32) return static_cast<int>(pow2_ceil(want));
  if (want >= 1024) return 1024;
  int64_t best = 0, best_idle = -1;
  for (int v = std::max(1, nv); v >= std::max(1, nv / 2); --v) {
    const int64_t t = std::min<int64_t>(1024, ceil_div(ceil_div(nvec, v), 32) * 32);
    const int64_t idle = t * ceil_div(nvec, t) - nvec;
    if (best_idle < 0 || idle < best_idle) best = t, best_idle = idle;
  }
  return static_cast<int>(best);
}

// `blocks` cut to what `limit` bytes of shared memory hold at `smem` a CTA (at least 1).
inline int fit_smem(int blocks, int64_t smem, int64_t limit) {
  return smem > 0 ? static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, limit / smem))) : blocks;
}

}  // namespace rtcnorm
