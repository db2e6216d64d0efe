// Integer helpers shared by the launch planners (ops/norm/plan/,
// ops/softmax/plan/). Host only; no state.
#pragma once

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

}  // namespace rtcnorm
