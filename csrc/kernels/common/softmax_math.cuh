// Device helpers of the softmax kernels: exp2, the (max, sum) pair of an
// online softmax, row addressing through RowIndex, and mask loads.
//
// Invariants:
// - Logits are kept in the log2 domain: z = x * scale * log2(e), so every
//   exponential is one MUFU.EX2 (ex2.approx.ftz: relative error below 2^-22,
//   results under 2^-126 flush to zero, which no fp16/bf16 output can hold
//   anyway and which is below fp32 tolerance).
// - A masked or out-of-range element has z = -inf and contributes exp2 = 0.
//   A (max, sum) pair with max = -inf has sum = 0; merging never subtracts
//   -inf from -inf, so a fully masked row yields sum 0, never NaN.
#pragma once

#include "common/reduce.cuh"
#include "common/softmax_params.cuh"
#include "common/vec.cuh"

namespace rtcnorm {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float fast_exp2(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// Running maximum and the sum of exp2(z - m) over the elements seen so far.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum merge(MaxSum lo, MaxSum hi) {
  const float m = fmaxf(lo.m, hi.m);
  if (m == neg_inf()) return {m, 0.f};
  return {m, lo.s * fast_exp2(lo.m - m) + hi.s * fast_exp2(hi.m - m)};
}

__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int lane_mask) {
  return {__shfl_xor_sync(0xffffffffu, v.m, lane_mask), __shfl_xor_sync(0xffffffffu, v.s, lane_mask)};
}

// The offset exp2(z - m) must be taken against: m itself, or 0 when nothing
// was seen (then every z is -inf and exp2 gives 0 instead of NaN).
__device__ __forceinline__ float exp_base(float m) { return m == neg_inf() ? 0.f : m; }

__device__ __forceinline__ unsigned fast_div(const FastDiv& d, unsigned n) {
  return (__umulhi(n, d.mul) + n) >> d.shift;
}

__device__ __forceinline__ long long row_offset(const RowIndex& ri, unsigned r) {
  long long off = 0;
#pragma unroll
  for (int g = 0; g < kMaxRowGroups - 1; ++g) {
    if (g + 1 >= ri.groups) break;
    const unsigned q = fast_div(ri.size[g], r);
    off += static_cast<long long>(r - q * ri.size[g].d) * ri.stride[g];
    r = q;
  }
  return off + static_cast<long long>(r) * ri.stride[ri.groups - 1];
}

// Packs four 0/1-or-any bytes of w into bits 0..3: bit j is set when byte j
// is nonzero. Bytes are first reduced to their 0x80 bit being "nonzero",
// then one multiply gathers the four flags into the top byte.
__device__ __forceinline__ unsigned nonzero_bytes_to_bits(unsigned w) {
  const unsigned nz = ((((w & 0x7f7f7f7fu) + 0x7f7f7f7fu) | w) & 0x80808080u) >> 7;
  return (nz * 0x01020408u) >> 24;
}

// VEC consecutive mask bytes as VEC bits (bit j: element j is masked out).
// The host guarantees the address is VEC-byte aligned.
template <int VEC>
__device__ __forceinline__ unsigned load_mask_bits(const unsigned char* p) {
  if constexpr (VEC == 8) {
    unsigned lo, hi;
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(lo), "=r"(hi) : "l"(p));
    return nonzero_bytes_to_bits(lo) | (nonzero_bytes_to_bits(hi) << 4);
  } else if constexpr (VEC == 4) {
    unsigned w;
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(w) : "l"(p));
    return nonzero_bytes_to_bits(w);
  } else if constexpr (VEC == 2) {
    unsigned short h;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(h) : "l"(p));
    return nonzero_bytes_to_bits(h);
  } else {
    static_assert(VEC == 1, "mask vectors are 1, 2, 4 or 8 bytes");
    unsigned short b;
    asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(b) : "l"(p));
    return b != 0 ? 1u : 0u;
  }
}

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> zero_pack() {
  Pack<T, VEC> p;
#pragma unroll
  for (int j = 0; j < VEC; ++j) p.e[j] = from_float<T>(0.f);
  return p;
}

}  // namespace rtcnorm
