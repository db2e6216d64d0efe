// The forward's quantized output epilogue (kQuantBits): each thread turns
// the fp32 outputs of one VEC-wide vector into FP8 or FP4 codes and, for
// block recipes, its lanes agree on the block's scale. Recipes and their
// arithmetic: common/quant_math.cuh and docs/quantized_outputs.md.
//
// Invariants (the planner's feasibility guarantees them, ops/norm/plan;
// gated_key for the gated forward, ops/norm/gated_cuda.cpp):
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

// Four FP8 codes in one word (a in the low byte), as fp8x2 gives them; the
// halves join inside the asm so no byte is split out and reassembled.
template <bool E5M2>
__device__ __forceinline__ unsigned fp8x4(float a, float b, float c, float d) {
  unsigned r;
  if constexpr (E5M2)
    asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n"
        " cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n mov.b32 %0, {lo, hi};\n}"
        : "=r"(r)
        : "f"(a), "f"(b), "f"(c), "f"(d));
  else
    asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        " cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n mov.b32 %0, {lo, hi};\n}"
        : "=r"(r)
        : "f"(a), "f"(b), "f"(c), "f"(d));
  return r;
}

// The E4M3 code of v >= 0 (+inf and past 448: 0x7E), as quant::e4m3_code
// gives it.
__device__ __forceinline__ unsigned e4m3_of(float v) { return fp8x2<false>(v, 0.f) & 0xffu; }

// The value of E4M3 code c (not NaN), exact through half.
__device__ __forceinline__ float e4m3_decode(unsigned c) {
  unsigned two;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(two) : "h"(static_cast<unsigned short>(c)));
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(two)));
  return f;
}
#endif

// NVFP4's encode multiplier gs / s for each of the 128 non-negative E4M3
// scale codes (0 for code 0), one table a CTA in shared memory: a block's
// multiplier is then one load, not an IEEE division.
__device__ __forceinline__ float* nvfp4_encode_table() {
  __shared__ float table[128];
  return table;
}

// Every thread of the CTA: fills the table for global scale gs.
__device__ __forceinline__ void nvfp4_fill_encode_table(float gs) {
  float* table = nvfp4_encode_table();
  for (unsigned c = threadIdx.x; c < 128u; c += blockDim.x) {
#if __CUDA_ARCH__ >= 890
    table[c] = c == 0x7fu ? 0.f : quant::nvfp4_encode_of(e4m3_decode(c), gs);
#else
    table[c] = c == 0x7fu ? 0.f : quant::nvfp4_encode(c, gs);
#endif
  }
  __syncthreads();
}

// The E4M3 scale code of a block of largest magnitude a (>= 0, not NaN).
__device__ __forceinline__ unsigned nvfp4_block_code(float a, float gs) {
#if __CUDA_ARCH__ >= 890
  return e4m3_of(quant::nvfp4_scale_input(a, gs));
#else
  return quant::nvfp4_scale_code(a, gs);
#endif
}

template <bool E5M2, int VEC>
__device__ __forceinline__ Pack<unsigned char, VEC> fp8_pack(const float (&f)[VEC], float mult) {
  Pack<unsigned char, VEC> q;
#if __CUDA_ARCH__ >= 890
  if constexpr (VEC == 1) {
    q.e[0] = static_cast<unsigned char>(fp8x2<E5M2>(f[0] * mult, 0.f) & 0xffu);
    return q;
  } else if constexpr (VEC % 4 == 0) {  // whole 32-bit words of codes
    union {
      unsigned w[VEC / 4];
      Pack<unsigned char, VEC> pack;
    } u;
#pragma unroll
    for (int j = 0; j < VEC; j += 4)
      u.w[j / 4] = fp8x4<E5M2>(f[j] * mult, f[j + 1] * mult, f[j + 2] * mult, f[j + 3] * mult);
    return u.pack;
  } else if constexpr (VEC % 2 == 0) {
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

// P: the kernel's parameter block; it names the members read here (y,
// scales, amax, qscale_ptr, qscale, scale_cols) as NormFwdParams does.
template <typename T, int N, int VEC, int TPR, unsigned FLAGS, typename P = NormFwdParams>
struct QuantEpilogue {
  static constexpr unsigned kRecipe = quant_recipe<FLAGS>();
  static constexpr int kBlock = quant::block_of(kRecipe);
  static constexpr int kLanes = kBlock > 0 ? (kBlock / VEC > 0 ? kBlock / VEC : 1) : 1;
  // The row's amax comes first: per-token scales, or a row of one block
  // whose lanes do not cover it.
  static constexpr bool kRowAmax = quant::per_token(kRecipe) || (kBlock > 0 && TPR < kLanes);
  static constexpr bool kTensorAmax = quant::tensor_amax(kRecipe);
  static constexpr long long kRowBytes = kRecipe == quant::kNvfp4 ? (N + 1) / 2 : N;  // a row's codes
  static_assert(kBlock == 0 || TPR >= kLanes || N <= kBlock, "a block's lanes must sit in one row group");
  static_assert(kBlock == 0 || kBlock % VEC == 0, "a vector never straddles two blocks");
  static_assert(kLanes <= 32, "a block's lanes meet in one warp");

  float tensor_amax = 0.f;  // this thread's max |y| (NaN ignored)
  float qscale = 1.f;       // the per-tensor or global scale

  __device__ __forceinline__ explicit QuantEpilogue(const P& p) {
    if constexpr (quant::per_tensor(kRecipe) || kRecipe == quant::kNvfp4)
      qscale = p.qscale_ptr != nullptr ? *p.qscale_ptr : p.qscale;
    if constexpr (kRecipe == quant::kNvfp4) nvfp4_fill_encode_table(qscale);
  }

  // The multiplier of a per-token row (and its dequant scale, written by the
  // row's first lane), from the row's amax.
  __device__ static float token_multiplier(const P& p, long long row, float amax, bool writer) {
    constexpr float kMax = quant::fp8_max(quant::e5m2(kRecipe));
    if (writer) static_cast<float*>(p.scales)[row] = amax > 0.f ? amax / kMax : 1.f;
    return amax > 0.f ? kMax / amax : 1.f;
  }

  // From each thread's part `a` of a row's amax, the row of GROUP threads in
  // a CTA of ROWS rows: a per-token row's multiplier (token_multiplier), or
  // a one-block row's amax.
  template <int GROUP, int ROWS>
  __device__ __forceinline__ static float row_value_of(const P& p, long long row, float a, bool writer) {
    __shared__ GroupScratch<GROUP, ROWS, Max1> qscratch;
    a = group_allreduce<GROUP, ROWS>(Max1{a}, qscratch).a;
    return quant::per_token(kRecipe) ? token_multiplier(p, row, a, writer) : a;
  }

  // The row's part of its block scales' offsets.
  __device__ __forceinline__ static long long scale_row(const P& p, long long row) {
    return (FLAGS & kBlockedScales) != 0 ? quant::blocked_scale_row(row, p.scale_cols) : row * p.scale_cols;
  }

  // A predicated store: its address stays in the path every lane runs, so
  // the row's part is computed once, not in each vector's branch.
  __device__ __forceinline__ static void scale_store(unsigned char* scales, long long soff, int blk, unsigned code,
                                                     bool writer) {
    // blk < 2^20: its part fits an int.
    unsigned char* at = scales + soff + ((FLAGS & kBlockedScales) != 0 ? quant::blocked_scale_col(blk) : blk);
    asm volatile("{\n .reg .pred w;\n setp.ne.u32 w, %2, 0;\n @w st.global.u8 [%0], %1;\n}" ::"l"(at),
                 "h"(static_cast<unsigned short>(code)), "r"(static_cast<unsigned>(writer))
                 : "memory");
  }

  // Where a row's outputs go. How the addresses are formed changes the
  // schedule ptxas builds, and each form is kept where it was measured best:
  // - kPinned: the row's own pointers, passed through an opaque move so the
  //   compiler keeps them in registers instead of rebuilding them from the
  //   row index for each vector (rows whose every vector exists: the emits
  //   then run without branches);
  // - kPointer: the row's own pointers (flat rows, gated rows, NVFP4
  //   register rows with partial vectors);
  // - kOffset: the row index, each vector's offsets formed in place (FP8
  //   register rows with partial vectors: with the pointer forms, one-element
  //   MXFP8 rows ran about 20% slower).
  enum RowForm { kPinned, kPointer, kOffset };
  template <RowForm FORM>
  struct Row {
    unsigned char* y;       // the row's first code byte (kOffset: the tensor's)
    unsigned char* scales;  // the row's part of its block scales (kOffset: the tensor's)
    long long row;
  };
  template <RowForm FORM>
  __device__ __forceinline__ static Row<FORM> row_of(const P& p, long long row) {
    unsigned char* const y = static_cast<unsigned char*>(p.y);
    unsigned char* const scales = static_cast<unsigned char*>(p.scales);
    if constexpr (FORM == kOffset) return {y, scales, row};
    Row<FORM> r{y + row * kRowBytes, kBlock > 0 ? scales + scale_row(p, row) : nullptr, row};
    if constexpr (FORM == kPinned) {
      asm("mov.b64 %0, %0;" : "+l"(r.y));
      asm("mov.b64 %0, %0;" : "+l"(r.scales));
    }
    return r;
  }

  // Vector v of row r (ok: it exists), its outputs in f. row_value: the
  // per-token multiplier, or the row's amax for a one-block row.
  template <bool CS, RowForm FORM>
  __device__ __forceinline__ void emit(const P& p, const Row<FORM>& r, int v, int lane, bool ok, const float (&f)[VEC],
                                       float row_value) {
    float a = 0.f;
    if (ok) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) a = fmaxf(a, fabsf(f[j]));
    }
    if constexpr (kTensorAmax) tensor_amax = fmaxf(tensor_amax, a);
    unsigned char* y = r.y;
    const long long yoff = FORM == kOffset ? r.row * kRowBytes : 0;
    if constexpr (quant::per_tensor(kRecipe) || quant::per_token(kRecipe)) {
      const float mult = quant::per_tensor(kRecipe) ? qscale : row_value;
      if (ok) store<unsigned char, VEC, CS>(y, yoff + 1LL * v * VEC, fp8_pack<quant::e5m2(kRecipe), VEC>(f, mult));
      return;
    } else {
      if constexpr (kRowAmax) {
        a = row_value;
      } else {
#pragma unroll
        for (int m = kLanes / 2; m > 0; m >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, m));
      }
      const int blk = v * VEC / kBlock;
      const long long soff = FORM == kOffset ? scale_row(p, r.row) : 0;
      const bool scale_writer = ok && (kRowAmax ? v == 0 : lane % kLanes == 0);
      if constexpr (kRecipe == quant::kMxfp8) {
        const unsigned code = quant::e8m0_of_amax(a);
        scale_store(r.scales, soff, blk, code, scale_writer);
        if (ok)
          store<unsigned char, VEC, CS>(y, yoff + 1LL * v * VEC, fp8_pack<false, VEC>(f, quant::e8m0_inverse(code)));
      } else {
        // a >= 0 is never NaN (fmaxf drops NaN), so neither is the code.
        const unsigned code = nvfp4_block_code(a, qscale);
        const float enc = nvfp4_encode_table()[code];
        scale_store(r.scales, soff, blk, code, scale_writer);
        if constexpr (VEC % 2 == 0) {
          constexpr int kWord = VEC < 8 ? VEC : 8;  // codes packed per 32-bit word
          Pack<unsigned char, VEC / 2> q;
#pragma unroll
          for (int j0 = 0; j0 < VEC; j0 += kWord) {
            float part[kWord];
#pragma unroll
            for (int j = 0; j < kWord; ++j) part[j] = f[j0 + j];
            const unsigned word = quant::e2m1_codes<kWord>(part, enc);
#pragma unroll
            for (int b = 0; b < kWord / 2; ++b) q.e[j0 / 2 + b] = static_cast<unsigned char>(word >> (8 * b));
          }
          if (ok) store<unsigned char, VEC / 2, CS>(y, yoff + v * (VEC / 2), q);
        } else {
          scalar_code<CS>(y + yoff, v, ok, f[0], enc);
        }
      }
    }
  }

  // The code of element v (VEC == 1, ok: it exists) of a block recipe under
  // the block's multiplier, y the row's first code byte: its FP8 byte, or
  // its E2M1 nibble, even lanes joining their odd neighbour's (TPR is even
  // or the row is one element). Every lane of a group calls it for every slot.
  template <bool CS>
  __device__ __forceinline__ static void scalar_code(unsigned char* y, int v, bool ok, float f, float mult) {
    if constexpr (kRecipe == quant::kMxfp8) {
      const float one[1] = {f};
      if (ok) store<unsigned char, 1, CS>(y, v, fp8_pack<false, 1>(one, mult));
    } else {
      const unsigned mine = ok ? quant::e2m1_code(f * mult) : 0u;
      const unsigned next = TPR > 1 ? __shfl_down_sync(0xffffffffu, mine, 1) : 0u;
      if (ok && v % 2 == 0) y[v / 2] = static_cast<unsigned char>(mine | (next << 4));
    }
  }

  // One butterfly step of emit_slots, a[0, 2M) -> a[0, M): lane bit M picks
  // the half a lane keeps, its partner sends the other. M is a template
  // argument so that every index is a constant and `a` stays in registers.
  template <int M>
  __device__ __forceinline__ static void fold(float (&a)[kLanes], int lane) {
    if constexpr (M > 0) {
      const bool up = (lane & M) != 0;
#pragma unroll
      for (int j = 0; j < M; ++j) {
        const float lo = a[j], hi = a[j + M];
        a[j] = fmaxf(up ? hi : lo, __shfl_xor_sync(0xffffffffu, up ? lo : hi, M));
      }
      fold<M / 2>(a, lane);
    }
  }

  // One element a lane (VEC == 1) with block scales: a block's kLanes
  // elements lie on kLanes lanes, one a slot. Rather than every lane
  // reducing and scaling every slot's block, the lanes of a block split a
  // group of kLanes slots: a butterfly leaves lane k the block amax of slot
  // k of the group, it alone works out that block's scale and stores it, and
  // the multipliers come back by shuffles. Slot s is vector v0 + s * TPR
  // (v0: this lane's first); ok[s]: it exists; value(s): its output, taken
  // twice (for the amax, then for the code) so that no more than a group's
  // kLanes outputs are live at once. Every lane of a group calls it with
  // the same slots.
  static constexpr bool kLaneSplit = VEC == 1 && kBlock > 0 && !kRowAmax && kLanes > 1;

  template <bool CS, int NV, RowForm FORM, typename Value>
  __device__ __forceinline__ void emit_slots(const P& p, const Row<FORM>& r, int v0, int lane, const bool (&ok)[NV],
                                             Value value) {
    static_assert(kLaneSplit, "slots split their blocks' scales over the block's lanes");
    constexpr int L = kLanes;
    const int k = lane % L;
    unsigned char* const y = r.y + (FORM == kOffset ? r.row * kRowBytes : 0);
    const long long soff = FORM == kOffset ? scale_row(p, r.row) : 0;
#pragma unroll
    for (int g = 0; g < NV; g += L) {
      float a[L];
#pragma unroll
      for (int j = 0; j < L; ++j) {
        // -1: absent on this lane. fmaxf(0, NaN) drops NaN, as emit() does.
        a[j] = g + j < NV && ok[g + j] ? fmaxf(0.f, fabsf(value(g + j))) : -1.f;
        if constexpr (kTensorAmax) tensor_amax = fmaxf(tensor_amax, a[j]);
      }
      fold<L / 2>(a, lane);
      // a[0]: the block amax of slot g + k; negative where no element of it exists.
      const float amax = fmaxf(a[0], 0.f);
      unsigned code;
      float mult;
      if constexpr (kRecipe == quant::kMxfp8) {
        code = quant::e8m0_of_amax(amax);
        mult = quant::e8m0_inverse(code);
      } else {
        code = nvfp4_block_code(amax, qscale);
        mult = nvfp4_encode_table()[code];
      }
      scale_store(r.scales, soff, (v0 - k + (g + k) * TPR) / kBlock, code, a[0] >= 0.f);
#pragma unroll
      for (int j = 0; j < L; ++j) {
        if (g + j >= NV) break;
        const float mj = __shfl_sync(0xffffffffu, mult, j, L);
        scalar_code<CS>(y, v0 + (g + j) * TPR, ok[g + j], ok[g + j] ? value(g + j) : 0.f, mj);
      }
    }
  }

  // After the grid-stride loop, every thread of the CTA: the CTA's amax
  // joins the tensor's (non-negative floats order as their bits).
  __device__ __forceinline__ void finish(const P& p) {
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
