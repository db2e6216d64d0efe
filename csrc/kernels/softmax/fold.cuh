// Folded logits for the cached forward rows: each loaded vector of x is
// rewritten once, in registers, so that every pass reads it as plain scaled
// logits and the max pass compares raw values.
//
// Invariants:
// - A scale s2 <= 0 moves into x: x -> -x for s2 < 0, x -> x * 0 for s2 == 0;
//   the passes then use s2e = |s2| (1 for s2 == 0), always > 0. Rounding to
//   nearest is symmetric, so fma(x', s2e, c) == fma(x, s2, c) bit for bit,
//   NaN and infinities included.
// - A masked element, or a key past a causal row's diagonal, becomes -inf;
//   fma(-inf, s2e, c) == -inf for any finite c (exp_base keeps c finite),
//   exactly the -inf the unfolded logits give it.
// - With s2e > 0, rounding is monotonic: max(x') * s2e == max(fma(x', s2e, -0))
//   for the same elements, so the row max is that of the unfolded logits.
//   max.{bf16,f16}x2 ignores a NaN beside a number, as fmaxf does.
// - Mask bits are those of load_mask_bits: bit j set when element j is masked.
#pragma once

#include "common/softmax_math.cuh"

namespace rtcnorm {

struct FoldScale {
  float s2e;    // the scale the passes use: > 0
  bool adjust;  // x needs negating (s2 < 0) or zeroing (s2 == 0)
  bool zero;
};

__device__ __forceinline__ FoldScale fold_scale(float s2) {
  return {s2 > 0.f ? s2 : (s2 < 0.f ? -s2 : 1.f), !(s2 > 0.f), s2 == 0.f};
}

template <typename T>
struct FoldBits {
  static constexpr bool kPairs = sizeof(T) == 2;
  static constexpr unsigned kNegInf = sizeof(T) == 4 ? 0xff800000u : is_bf16<T>::value ? 0xff80ff80u : 0xfc00fc00u;
};

// Negates (or zeroes) a vector for fold_scale's adjust; uniform across a row.
template <typename T, int VEC>
__device__ __forceinline__ void fold_adjust(Pack<T, VEC>& xv, const FoldScale& f) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    float v = to_float(xv.e[j]);
    v = f.zero ? v * 0.f : -v;
    xv.e[j] = from_float<T>(v);  // exact: a sign change or a zero (NaN stays NaN)
  }
}

// Sets to -inf the elements 4q .. 4q + 3 of xv whose byte of `flags` has its
// top bit set (byte e for element 4q + e). A word of two 16-bit elements (or
// one float) takes its lane mask from prmt's sign mode, which spreads a
// byte's top bit over the element's bytes.
template <typename T, int VEC>
__device__ __forceinline__ void fold_quad(Pack<T, VEC>& xv, int q, unsigned flags) {
  constexpr int kPer = 4 / static_cast<int>(sizeof(T));  // elements a word
  unsigned* w = reinterpret_cast<unsigned*>(&xv);
#pragma unroll
  for (int k = 0; k < 4 / kPer && q * 4 + k * kPer < VEC; ++k) {
    const unsigned sel = kPer == 2 ? (0x9988u + 0x2222u * k) : (0x8888u + 0x1111u * k);
    const unsigned lm = byte_perm(flags, 0u, sel);
    unsigned& x = w[q * 4 / kPer + k];
    x = (x & ~lm) | (FoldBits<T>::kNegInf & lm);
  }
}

// Sets the masked elements of xv (bit j of mbits) to -inf. A nibble times
// 0x10204080 puts its bit i at bit 8i + 7 (the products do not overlap).
template <typename T, int VEC>
__device__ __forceinline__ void fold_mask(Pack<T, VEC>& xv, unsigned mbits) {
  if constexpr (static_cast<int>(sizeof(T)) * VEC < 4) {
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if ((mbits >> j) & 1u) xv.e[j].bits = static_cast<unsigned short>(FoldBits<T>::kNegInf);
  } else {
#pragma unroll
    for (int q = 0; q < (VEC + 3) / 4; ++q) fold_quad(xv, q, ((mbits >> (4 * q)) & 0xfu) * 0x10204080u);
  }
}

// Running max of folded vectors' raw values: two 16-bit elements an
// instruction where a vector holds pairs, else one float.
template <typename T, int VEC>
struct RawMax {
  static constexpr bool kPacked = FoldBits<T>::kPairs && VEC % 2 == 0;
  unsigned pair = FoldBits<T>::kNegInf;
  float one = neg_inf();

  __device__ __forceinline__ void add(const Pack<T, VEC>& xv) {
    if constexpr (kPacked) {
      const unsigned* w = reinterpret_cast<const unsigned*>(&xv);
#pragma unroll
      for (int k = 0; k < VEC / 2; ++k) {
        if constexpr (is_bf16<T>::value)
          asm("max.bf16x2 %0, %0, %1;" : "+r"(pair) : "r"(w[k]));
        else
          asm("max.f16x2 %0, %0, %1;" : "+r"(pair) : "r"(w[k]));
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) one = fmaxf(one, to_float(xv.e[j]));
    }
  }
  // The max logit: the max raw value times s2e (> 0).
  __device__ __forceinline__ float logit(float s2e) const {
    float m = one;
    if constexpr (kPacked) {
      T lo, hi;
      lo.bits = static_cast<unsigned short>(pair & 0xffffu);
      hi.bits = static_cast<unsigned short>(pair >> 16);
      m = fmaxf(to_float(lo), to_float(hi));
    }
    return m * s2e;
  }
};

}  // namespace rtcnorm
