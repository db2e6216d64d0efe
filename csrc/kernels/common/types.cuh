// Storage types, fp32 conversions and the byte permute for NVRTC-compiled
// kernels.
//
// Invariants:
// - No CUDA header is included: NVRTC gets only the embedded sources, so the
//   16-bit float types are plain 2-byte structs converted with PTX `cvt`.
// - Every conversion to a 16-bit type rounds to nearest even (`cvt.rn`), the
//   same rounding torch uses, so outputs match a float reference bit for bit
//   whenever the fp32 results agree.
// - `cvt.rn.bf16.f32` needs sm_80 or newer; the host refuses older archs.
#pragma once

namespace rtcnorm {

struct bf16 {
  unsigned short bits;
};
struct fp16 {
  unsigned short bits;
};

template <typename T>
struct is_bf16 {
  static constexpr bool value = false;
};
template <>
struct is_bf16<bf16> {
  static constexpr bool value = true;
};

__device__ __forceinline__ float to_float(float v) { return v; }

__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(static_cast<unsigned>(v.bits) << 16); }

__device__ __forceinline__ float to_float(fp16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}

template <typename T>
__device__ __forceinline__ T from_float(float v);

template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}

template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
  return r;
}

template <>
__device__ __forceinline__ fp16 from_float<fp16>(float v) {
  fp16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
  return r;
}

// Bytes of {b, a} (a: 0-3, b: 4-7) picked by the nibbles of sel; a nibble's
// bit 3 fills the byte with the picked byte's top bit.
__device__ __forceinline__ unsigned byte_perm(unsigned a, unsigned b, unsigned sel) {
  unsigned d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Rounds v through the storage type T and back: what a value looks like after
// being written to memory as T and read again.
template <typename T>
__device__ __forceinline__ float round_through(float v) {
  return to_float(from_float<T>(v));
}

}  // namespace rtcnorm
