// Quantized output formats: fp32 to FP8 (E4M3, E5M2), FP4 (E2M1) and the
// block-scale bytes (E8M0, E4M3), for the norm kernels' output epilogue and
// the CPU implementation alike (docs/quantized_outputs.md).
//
// Invariants:
// - Host and device compute the same bits: conversions round to nearest
//   even and saturate (finite values and infinities past the largest normal
//   go to +-max; FP8 keeps NaN, E2M1 has none and gives +6). The device's
//   cvt.rn.satfinite (sm_89+) follows the same rules for FP8.
// - Power-of-two scale factors are built from exponent bits, never by
//   exp2f, so they are exact.
// - The recipe codes are part of kernel keys (NormFlags' kQuantBits) and of
//   the disk cache's names: never renumber them.
#pragma once

#if defined(__CUDACC_RTC__)
#include "common/types.cuh"  // byte_perm
#define RTCNORM_QFN __host__ __device__ __forceinline__
#else
#include <cmath>
#include <cstdint>
#include <cstring>
#define RTCNORM_QFN inline
#endif

namespace rtcnorm {
namespace quant {

enum Recipe : unsigned {
  kNone = 0,
  kPerTensorE4M3 = 1,
  kPerTensorE5M2 = 2,
  kPerTokenE4M3 = 3,
  kPerTokenE5M2 = 4,
  kMxfp8 = 5,
  kNvfp4 = 6,
};

constexpr RTCNORM_QFN bool per_tensor(unsigned r) { return r == kPerTensorE4M3 || r == kPerTensorE5M2; }
constexpr RTCNORM_QFN bool per_token(unsigned r) { return r == kPerTokenE4M3 || r == kPerTokenE5M2; }
constexpr RTCNORM_QFN bool e5m2(unsigned r) { return r == kPerTensorE5M2 || r == kPerTokenE5M2; }
// Elements sharing one scale along a row (0: no block scales).
constexpr RTCNORM_QFN int block_of(unsigned r) { return r == kMxfp8 ? 32 : r == kNvfp4 ? 16 : 0; }
// Whether the recipe returns the amax of the whole tensor.
constexpr RTCNORM_QFN bool tensor_amax(unsigned r) { return per_tensor(r) || r == kNvfp4; }
// Largest finite FP8 value of the recipe's data.
constexpr RTCNORM_QFN float fp8_max(bool is_e5m2) { return is_e5m2 ? 57344.f : 448.f; }

RTCNORM_QFN unsigned bits_of(float f) {
#if defined(__CUDACC_RTC__)
  return __float_as_uint(f);
#else
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

RTCNORM_QFN float float_of(unsigned u) {
#if defined(__CUDACC_RTC__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

RTCNORM_QFN float round_even(float v) {
#if defined(__CUDACC_RTC__)
  return rintf(v);
#else
  return std::nearbyint(v);  // the default rounding mode: to nearest even
#endif
}

// IEEE minNum / maxNum against a non-NaN b: a NaN a gives b.
RTCNORM_QFN float min_num(float a, float b) {
#if defined(__CUDACC_RTC__)
  return fminf(a, b);
#else
  return a <= b ? a : b;
#endif
}

RTCNORM_QFN float max_num(float a, float b) {
#if defined(__CUDACC_RTC__)
  return fmaxf(a, b);
#else
  return a >= b ? a : b;
#endif
}

RTCNORM_QFN float abs_of(float a) {
#if defined(__CUDACC_RTC__)
  return fabsf(a);
#else
  return std::fabs(a);
#endif
}

// 2^k for k in [-126, 127].
RTCNORM_QFN float pow2(int k) { return float_of(static_cast<unsigned>(k + 127) << 23); }

// The code of v in a small float format of MBITS mantissa bits and exponent
// bias BIAS whose largest normal is `maxv` (code max_code), the sign at bit
// SIGN; NaN gives nan_code. Round to nearest even, saturating.
template <int MBITS, int BIAS, int SIGN>
RTCNORM_QFN unsigned small_float_code(float v, float maxv, unsigned max_code, unsigned nan_code) {
  const unsigned b = bits_of(v);
  if ((b & 0x7fffffffu) > 0x7f800000u) return nan_code;
  const unsigned sign = (b >> 31) << SIGN;
  const float a = float_of(b & 0x7fffffffu);
  if (a >= maxv) return sign | max_code;
  // floor(log2(a)) from the exponent field (fp32 subnormals land below every
  // format's subnormal range and round to 0 there).
  const int e = static_cast<int>((b >> 23) & 0xffu) - 127;
  const int emin = 1 - BIAS;
  if (e < emin) {  // the format's subnormals: multiples of 2^(emin - MBITS)
    const unsigned q = static_cast<unsigned>(round_even(a * pow2(MBITS - emin)));
    return sign | q;  // q == 2^MBITS is the smallest normal's code
  }
  const unsigned q = static_cast<unsigned>(round_even(a * pow2(MBITS - e)));  // in [2^M, 2^(M+1)]
  return sign | ((static_cast<unsigned>(e + BIAS) << MBITS) + q - (1u << MBITS));
}

RTCNORM_QFN unsigned e4m3_code(float v) { return small_float_code<3, 7, 7>(v, 448.f, 0x7eu, 0x7fu); }
RTCNORM_QFN unsigned e5m2_code(float v) { return small_float_code<2, 15, 7>(v, 57344.f, 0x7bu, 0x7fu); }
// E2M1 codes 0-7 stand for 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
// It has no NaN: NaN gives +6 (0x7); -0 gives 0x8. e2m1_clamp saturates
// to [-6, 6] (infinities too) and sends NaN to +6. For a = |c|, c clamped,
// and p = 2^max(floor(log2 a), 0), t = p + a * 2^-22 rounded once to fp32
// counts, in its low bits, the steps of a on the format's grid above 0 in
// a's binade (steps of 0.5 below 2, of 1 in [2, 4), of 2 in [4, 6]),
// rounded to nearest even; the code is steps + 2 log2(p), and an even code
// is an even step count, so ties go to even. t stays in p's binade, so
// t >> 22 = 2 (log2(p) + 127): magnitude code = (t & 7) + (t >> 22) - 254.
// a * 2^-22 is exact or far below half an ulp of p, so the add contracted
// into an fma gives the same t. e2m1_code equals
// small_float_code<1, 1, 3>(v, 6.f, 7u, 7u) for every float.
RTCNORM_QFN float e2m1_clamp(float v) { return max_num(min_num(v, 6.f), -6.f); }
RTCNORM_QFN unsigned e2m1_grid_bits(float c) {
  const float a = abs_of(c);
  return bits_of(float_of(bits_of(max_num(a, 1.f)) & 0x7f800000u) + a * 0x1p-22f);
}
RTCNORM_QFN unsigned e2m1_code(float v) {
  const float c = e2m1_clamp(v);
  const unsigned t = e2m1_grid_bits(c);
  return (bits_of(c) >> 28 & 8u) | ((t & 7u) + (t >> 22) - 254u);
}

// The sign bits of K fp32 patterns at bit 4j + 3, as e2m1 nibbles hold them.
// The device gathers four signs a word in three byte permutes.
template <int K>
RTCNORM_QFN unsigned e2m1_signs(const unsigned (&b)[K]) {
#if defined(__CUDA_ARCH__)
  if constexpr (K == 8) {
    const unsigned even = byte_perm(byte_perm(b[0], b[2], 0xfbfbu), byte_perm(b[4], b[6], 0xfbfbu), 0x5410u);
    const unsigned odd = byte_perm(byte_perm(b[1], b[3], 0xfbfbu), byte_perm(b[5], b[7], 0xfbfbu), 0x5410u);
    return (even & 0x08080808u) | (odd & 0x80808080u);
  } else if constexpr (K == 4) {
    return (byte_perm(b[0], b[2], 0xfbfbu) & 0x0808u) | (byte_perm(b[1], b[3], 0xfbfbu) & 0x8080u);
  } else
#endif
  {
    unsigned signs = 0;
    for (int j = 0; j < K; ++j) signs |= (b[j] >> 31) << (4 * j + 3);
    return signs;
  }
}

// The codes of v[j] * mult, j < K <= 8, element j in nibble j; equal to
// packing e2m1_code of the products. The magnitudes are summed with their
// 254 offsets, which one subtraction removes (the nibbles never carry).
// On the device a product's NaN is the canonical positive one, so only the
// magnitude is clamped and the sign bit is the product's.
template <int K>
RTCNORM_QFN unsigned e2m1_codes(const float (&v)[K], float mult) {
  static_assert(K >= 1 && K <= 8, "eight nibbles to a word");
  unsigned sum = 0, offset = 0, b[K];
  for (int j = 0; j < K; ++j) {
#if defined(__CUDA_ARCH__)
    const float c = v[j] * mult;
    const unsigned t = e2m1_grid_bits(min_num(abs_of(c), 6.f));
#else
    const float c = e2m1_clamp(v[j] * mult);
    const unsigned t = e2m1_grid_bits(c);
#endif
    sum += ((t & 7u) + (t >> 22)) << (4 * j);
    offset += 254u << (4 * j);
    b[j] = bits_of(c);
  }
  return (sum - offset) | e2m1_signs<K>(b);
}

RTCNORM_QFN float e4m3_value(unsigned c) {
  const unsigned e = (c >> 3) & 0xfu, m = c & 7u;
  const float mag =
      e == 0 ? static_cast<float>(m) * pow2(-9) : static_cast<float>(8u + m) * pow2(static_cast<int>(e) - 10);
  return (c & 0x80u) ? -mag : mag;
}

// MXFP8 (OCP MX v1.0): the E8M0 byte of a block whose largest magnitude is
// `amax`: floor(log2(amax)) - 8 (E4M3's largest exponent) + 127, at least 0
// (amax 0 or tiny); 0xFF (NaN) for an infinite amax.
RTCNORM_QFN unsigned e8m0_of_amax(float amax) {
  const unsigned field = (bits_of(amax) >> 23) & 0xffu;
  if (field == 0xffu) return 0xffu;
  return field >= 8u ? field - 8u : 0u;
}

// The multiplier that takes a block to its E4M3 range: 2^(127 - byte), exact;
// NaN for the NaN scale.
RTCNORM_QFN float e8m0_inverse(unsigned byte) {
  return byte == 0xffu ? float_of(0x7fc00000u) : float_of((254u - byte) << 23);
}

// NVFP4: the E4M3 scale byte of a block of largest magnitude `amax` under
// the global encode scale gs (the byte of nvfp4_scale_input), and the
// multiplier taking the block to E2M1 from the scale's value s (0 where s
// is 0).
RTCNORM_QFN float nvfp4_scale_input(float amax, float gs) { return (amax / 6.f) * gs; }
RTCNORM_QFN unsigned nvfp4_scale_code(float amax, float gs) { return e4m3_code(nvfp4_scale_input(amax, gs)); }
RTCNORM_QFN float nvfp4_encode_of(float s, float gs) { return s == 0.f ? 0.f : gs / s; }
RTCNORM_QFN float nvfp4_encode(unsigned scale_code, float gs) { return nvfp4_encode_of(e4m3_value(scale_code), gs); }

// The blocked layout of block scales that cuBLAS and torch._scaled_mm take:
// 128 x 4 tiles of the (rows, cols) matrix padded to multiples of (128, 4),
// tiles in row-major order, entry (r, c) of a tile at (r % 32) * 16 + (r / 32) * 4 + c.
// The offset splits into a row part and a column part.
RTCNORM_QFN long long blocked_scale_row(long long row, long long padded_cols) {
  return (row / 128) * (padded_cols / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4;
}
template <typename I>
RTCNORM_QFN I blocked_scale_col(I col) {
  return (col / 4) * 512 + (col % 4);
}
RTCNORM_QFN long long blocked_scale_offset(long long row, long long col, long long padded_cols) {
  return blocked_scale_row(row, padded_cols) + blocked_scale_col(col);
}

}  // namespace quant
}  // namespace rtcnorm
