// Rows whose fp32 statistics overflow (the forward's scale guard).
//
// The forward sums x (LayerNorm) and squares (both) in fp32. Rows of large
// magnitude overflow them: fp32 rows near 1e30, bf16 rows near 1e38, any row
// whose sum of squares passes FLT_MAX. The plain rstd is then 0 or NaN and
// every output would be 0. The guard recomputes such a row's statistics.
//
// Invariants:
// - The test on the normal path is `rstd > 0 and |mean| <= FLT_MAX`, two
//   compares and a branch never taken: with finite sums var + eps is finite
//   and >= 0, so rsqrt of it is > 0 (+inf for eps = 0 on a constant row).
//   Only an overflowed sum, an inf or a NaN fails it. (The mean is tested
//   too: a Chan merge of two +inf chunk means makes M2 NaN, which the
//   clamp fmaxf(M2 / n, 0) turns into 0, leaving rstd finite.)
// - The rescue reads the row from memory (x, plus the residual rounded to T
//   as the forward rounds h) and sums it again on x * 2^-80 (kGuardScale),
//   where its sums cannot overflow; eps scales by 2^-160 with the variance
//   (to 0: it is negligible beside a variance that overflowed), and mean
//   and rstd are scaled back. A power-of-two scale keeps the scaled values
//   exact. Two serial fp32 loops hold a handful of registers beside the row
//   the caller keeps: ptxas' reports of the planned kernels are unchanged.
// - Each thread of the row runs the same serial loops in the same order over
//   the same values, so every thread, and every CTA of a cluster or grid
//   group, gets the same bits without a barrier or an exchange: taking the
//   branch need not be uniform.
// - A row holding an inf or a NaN gets non-finite statistics again: its
//   outputs are not finite, as before.
// - fp16 rows cannot overflow (65504^2 * 2^24 < FLT_MAX): no code for them.
//
// Limits: the serial sums round like any fp32 sum of N terms (N * 2^-24 at
// worst, far less in practice). Elements below 2^-46 turn subnormal once
// scaled and lose bits; beside the 2^38 or more a row needs to overflow a
// sum, their share is below 2^-84. y = (x - mean) * rstd is formed in fp32
// as on the normal path: it overflows only for rows holding values of both
// signs beyond FLT_MAX / 2, whose outputs there are +-inf (never 0). rstd of
// rows near FLT_MAX is an fp32 subnormal (about 22 significant bits).
#pragma once

#include "common/params.cuh"
#include "common/types.cuh"

namespace rtcnorm {

template <typename T, bool RES>
__device__ __forceinline__ float guard_elem(const T* x, const T* res, int k) {
  const float v = to_float(x[k]);
  if constexpr (RES)
    return round_through<T>(v + to_float(res[k]));
  else
    return v;
}

// The rescue runs only where a plain fp32 sum overflowed, which takes a row
// whose largest magnitude is 2^38 or more (a square, or a Chan merge's
// delta^2 * count product, past 2^128 with N <= 2^24): scaled by 2^-80 it
// stays at least 2^-42, its square far from underflow, while 2^24 squares
// of FLT_MAX * 2^-80 stay below 2^120.
constexpr float kGuardScale = 8.271806125530277e-25f;  // 2^-80

template <int KIND, typename T, bool RES>
__device__ __forceinline__ void rescue_stats(const T* x, const T* res, int n, float eps, float& mean, float& rstd) {
  constexpr float s = kGuardScale;
  float ms = 0.f;
  if constexpr (KIND == kLayerNorm) {
#pragma unroll 1
    for (int k = 0; k < n; ++k) ms += guard_elem<T, RES>(x, res, k) * s;
    ms /= static_cast<float>(n);
  }
  float m2 = 0.f;
#pragma unroll 1
  for (int k = 0; k < n; ++k) {
    const float d = guard_elem<T, RES>(x, res, k) * s - ms;
    m2 = fmaf(d, d, m2);
  }
  mean = ms / s;
  rstd = rsqrtf(m2 / static_cast<float>(n) + eps * s * s) * s;
}

// `row_of()` returns the row's first elements {x, res}; it is called only on
// the rescue path, so their addresses hold no registers on the normal one.
template <typename T>
struct GuardRow {
  const T* x;
  const T* res;
};

template <int KIND, typename T, bool RES, typename RowOf>
__device__ __forceinline__ void guard_stats(const RowOf& row_of, int n, float eps, float& mean, float& rstd) {
  constexpr bool kHalf = sizeof(T) == 2 && !is_bf16<T>::value;
  if constexpr (!kHalf) {
    if (!(rstd > 0.f && fabsf(mean) <= 3.402823466e38f)) {
      const GuardRow<T> r = row_of();
      rescue_stats<KIND, T, RES>(r.x, r.res, n, eps, mean, rstd);
    }
  }
}

}  // namespace rtcnorm
