// The forward's quantized output epilogue (kQuantBits): each thread turns
// the fp32 outputs of one VEC-wide vector into FP8 or FP4 codes and, for
// block recipes, its lanes agree on the block's scale. Recipes and their
// arithmetic: common/quant_math.cuh and docs/quantized_outputs.md.
//
// Invariants (the planner's feasibility guarantees them, ops/norm/plan):
// - One CTA (group) owns a whole row: no column slices.
// - A block of kBlock elements is kBlock / VEC vectors on as many adjacent
//   lanes of one row group (TPR >= kLanes, both powers of two or TPR a
//   multiple of 32), or the row is a single block (N <= kBlock), whose
//   scale then comes from the row's amax.
// - Every lane of a group calls emit() for every (chunk, vector) slot, in
//   or out of the row: the block's lanes meet in shuffles.
#pragma once

#include "common/params.cuh"
#include "common/quant_math.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace rtcnorm {

struct Max1 {
  float a;
};
__device__ __forceinline__ Max1 merge(Max1 lo, Max1 hi) { return {fmaxf(lo.a, hi.a)}; }
__device__ __forceinline__ Max1 shfl_xor(Max1 v, int m) { return {__shfl_xor_sync(0xffffffffu, v.a, m)}; }

template <unsigned FLAGS>
__device__ constexpr unsigned quant_recipe() {
  return (FLAGS & kQuantBits) >> kQuantShift;
}

#if __CUDA_ARCH__ >= 890
// Two FP8 codes in one cvt (lo in the low byte), as quant::e4m3_code /
// e5m2_code give them.
template <bool E5M2>
__device__ __forceinline__ unsigned fp8x2(float lo, float hi) {
  unsigned short r;
  if constexpr (E5M2)
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif

template <bool E5M2, int VEC>
__device__ __forceinline__ Pack<unsigned char, VEC> fp8_pack(const float (&f)[VEC], float mult) {
  Pack<unsigned char, VEC> q;
#if __CUDA_ARCH__ >= 890
  if constexpr (VEC % 2 == 0) {
#pragma unroll
    for (int j = 0; j < VEC; j += 2) {
      const unsigned two = fp8x2<E5M2>(f[j] * mult, f[j + 1] * mult);
      q.e[j] = static_cast<unsigned char>(two & 0xffu);
      q.e[j + 1] = static_cast<unsigned char>(two >> 8);
    }
    return q;
  }
#endif
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    q.e[j] = static_cast<unsigned char>(E5M2 ? quant::e5m2_code(f[j] * mult) : quant::e4m3_code(f[j] * mult));
  return q;
}

template <typename T, int N, int VEC, int TPR, unsigned FLAGS>
struct QuantEpilogue {
  static constexpr unsigned kRecipe = quant_recipe<FLAGS>();
  static constexpr int kBlock = quant::block_of(kRecipe);
  static constexpr int kLanes = kBlock > 0 ? (kBlock / VEC > 0 ? kBlock / VEC : 1) : 1;
  // The row's amax comes first: per-token scales, or a row of one block
  // whose lanes do not cover it.
  static constexpr bool kRowAmax = quant::per_token(kRecipe) || (kBlock > 0 && TPR < kLanes);
  static constexpr bool kTensorAmax = quant::tensor_amax(kRecipe);
  static_assert(kBlock == 0 || TPR >= kLanes || N <= kBlock, "a block's lanes must sit in one row group");
  static_assert(kBlock == 0 || kBlock % VEC == 0, "a vector never straddles two blocks");
  static_assert(kLanes <= 32, "a block's lanes meet in one warp");

  float tensor_amax = 0.f;  // this thread's max |y| (NaN ignored)
  float qscale = 1.f;       // the per-tensor or global scale

  __device__ __forceinline__ explicit QuantEpilogue(const NormFwdParams& p) {
    if constexpr (quant::per_tensor(kRecipe) || kRecipe == quant::kNvfp4)
      qscale = p.qscale_ptr != nullptr ? *p.qscale_ptr : p.qscale;
  }

  // The multiplier of a per-token row (and its dequant scale, written by the
  // row's first lane), from the row's amax.
  __device__ static float token_multiplier(const NormFwdParams& p, long long row, float amax, bool writer) {
    constexpr float kMax = quant::fp8_max(quant::e5m2(kRecipe));
    if (writer) static_cast<float*>(p.scales)[row] = amax > 0.f ? amax / kMax : 1.f;
    return amax > 0.f ? kMax / amax : 1.f;
  }

  __device__ __forceinline__ void scale_store(const NormFwdParams& p, long long row, int blk, unsigned code) {
    const long long at =
        (FLAGS & kBlockedScales) != 0 ? quant::blocked_scale_offset(row, blk, p.scale_cols) : row * p.scale_cols + blk;
    static_cast<unsigned char*>(p.scales)[at] = static_cast<unsigned char>(code);
  }

  // Vector v of row `row` (ok: it exists), its outputs in f. row_value: the
  // per-token multiplier, or the row's amax for a one-block row.
  template <bool CS>
  __device__ __forceinline__ void emit(const NormFwdParams& p, long long row, int v, int lane, bool ok,
                                       const float (&f)[VEC], float row_value) {
    float a = 0.f;
    if (ok) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) a = fmaxf(a, fabsf(f[j]));
    }
    if constexpr (kTensorAmax) tensor_amax = fmaxf(tensor_amax, a);
    unsigned char* y = static_cast<unsigned char*>(p.y);
    if constexpr (quant::per_tensor(kRecipe) || quant::per_token(kRecipe)) {
      const float mult = quant::per_tensor(kRecipe) ? qscale : row_value;
      if (ok) store<unsigned char, VEC, CS>(y, row * N + 1LL * v * VEC, fp8_pack<quant::e5m2(kRecipe), VEC>(f, mult));
      return;
    } else {
      if constexpr (kRowAmax) {
        a = row_value;
      } else {
#pragma unroll
        for (int m = kLanes / 2; m > 0; m >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, m));
      }
      const int blk = v * VEC / kBlock;
      const bool scale_writer = ok && (kRowAmax ? v == 0 : lane % kLanes == 0);
      if constexpr (kRecipe == quant::kMxfp8) {
        const unsigned code = quant::e8m0_of_amax(a);
        if (scale_writer) scale_store(p, row, blk, code);
        if (ok)
          store<unsigned char, VEC, CS>(y, row * N + 1LL * v * VEC, fp8_pack<false, VEC>(f, quant::e8m0_inverse(code)));
      } else {
        const unsigned code = quant::nvfp4_scale_code(a, qscale);
        if (scale_writer) scale_store(p, row, blk, code);
        const float enc = quant::nvfp4_encode(code, qscale);
        constexpr long long kRowBytes = (N + 1) / 2;
        if constexpr (VEC % 2 == 0) {
          Pack<unsigned char, VEC / 2> q;
#pragma unroll
          for (int j = 0; j < VEC; j += 2)
            q.e[j / 2] =
                static_cast<unsigned char>(quant::e2m1_code(f[j] * enc) | quant::e2m1_code(f[j + 1] * enc) << 4);
          if (ok) store<unsigned char, VEC / 2, CS>(y, row * kRowBytes + v * (VEC / 2), q);
        } else {
          // One element a lane: even lanes join their odd neighbour's code
          // (TPR is even or the row is one element).
          const unsigned mine = ok ? quant::e2m1_code(f[0] * enc) : 0u;
          const unsigned next = TPR > 1 ? __shfl_down_sync(0xffffffffu, mine, 1) : 0u;
          if (ok && v % 2 == 0) y[row * kRowBytes + v / 2] = static_cast<unsigned char>(mine | (next << 4));
        }
      }
    }
  }

  // After the grid-stride loop, every thread of the CTA: the CTA's amax
  // joins the tensor's (non-negative floats order as their bits).
  __device__ __forceinline__ void finish(const NormFwdParams& p) {
    if constexpr (kTensorAmax) {
      __shared__ float warp_max[32];
      float a = tensor_amax;
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, m));
      const int warps = (blockDim.x + 31) / 32;
      if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = a;
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < warps; ++w) a = fmaxf(a, warp_max[w]);
        atomicMax(reinterpret_cast<unsigned*>(p.amax), __float_as_uint(a));
      }
    }
  }
};

}  // namespace rtcnorm
