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
// E2M1 has no NaN: NaN gives +6 (code 7). Its eight magnitudes make the
// code a count of the rounding boundaries below |v|: a boundary is passed
// at equality where the even code lies above it (0.75 -> 1, 1.75 -> 2,
// 3.5 -> 4), so ties go to even; past 5 everything saturates to 6. Exactly
// small_float_code<1, 1, 3>, in a third of its instructions.
RTCNORM_QFN unsigned e2m1_code(float v) {
  const float a = v < 0.f ? -v : v;
  if (!(a == a)) return 0x7u;
  const unsigned mag = static_cast<unsigned>(a > 0.25f) + static_cast<unsigned>(a >= 0.75f) +
                       static_cast<unsigned>(a > 1.25f) + static_cast<unsigned>(a >= 1.75f) +
                       static_cast<unsigned>(a > 2.5f) + static_cast<unsigned>(a >= 3.5f) +
                       static_cast<unsigned>(a > 5.f);
  return (bits_of(v) >> 31) << 3 | mag;
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
// the global encode scale gs, and the multiplier taking the block to E2M1
// (0 where the scale byte is 0).
RTCNORM_QFN unsigned nvfp4_scale_code(float amax, float gs) { return e4m3_code((amax / 6.f) * gs); }
RTCNORM_QFN float nvfp4_encode(unsigned scale_code, float gs) {
  const float s = e4m3_value(scale_code);
  return s == 0.f ? 0.f : gs / s;
}

// The blocked layout of block scales that cuBLAS and torch._scaled_mm take:
// 128 x 4 tiles of the (rows, cols) matrix padded to multiples of (128, 4),
// tiles in row-major order, entry (r, c) of a tile at (r % 32) * 16 + (r / 32) * 4 + c.
RTCNORM_QFN long long blocked_scale_offset(long long row, long long col, long long padded_cols) {
  const long long tile = (row / 128) * (padded_cols / 4) + col / 4;
  return tile * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + (col % 4);
}

}  // namespace quant
}  // namespace rtcnorm
