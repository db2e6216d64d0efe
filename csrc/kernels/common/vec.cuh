// Vectorised global-memory access.
//
// A Pack<T, VEC> is VEC consecutive elements moved as one access of
// sizeof(T) * VEC bytes (2, 4, 8 or 16). The host picks VEC so that every
// pointer and row stride is a multiple of that size; a misaligned address here
// is a host bug, not something the kernel recovers from.
//
// Loads come in two flavours:
// - load_nc: the read-only (non-coherent) path, for inputs nothing in the same
//   kernel writes. `L1::no_allocate` keeps streamed rows from evicting reused
//   data such as gamma; L1_ALLOC lets them allocate in L1 instead (softmax
//   inputs and float32 norm rows of 40 MB or more).
// - load_coherent: an ordinary load, for data this kernel wrote earlier (the
//   residual sum h, the dW partial row), where the .nc path may return stale
//   data; the norm forward also reads 16-bit inputs of 40 MB or more with
//   it (norm/fwd_rows.cuh, load_row_vec).
#pragma once

#include "common/types.cuh"

namespace rtcnorm {

template <typename T, int VEC>
struct __align__(sizeof(T) * VEC < 16 ? sizeof(T) * VEC : 16) Pack {
  T e[VEC];
};

template <int BYTES>
struct RawOf;
template <>
struct RawOf<16> {
  using type = uint4;
};
template <>
struct RawOf<8> {
  using type = uint2;
};
template <>
struct RawOf<4> {
  using type = unsigned;
};
template <>
struct RawOf<2> {
  using type = unsigned short;
};
template <>
struct RawOf<1> {
  using type = unsigned char;
};

// A Pack moves as kCount accesses of kUnit bytes: one access up to 16 bytes,
// several 16-byte accesses beyond (an fp32 gamma beside 8-wide bf16 rows).
template <typename P>
struct Access {
  static constexpr int kUnit = sizeof(P) < 16 ? static_cast<int>(sizeof(P)) : 16;
  static constexpr int kCount = static_cast<int>(sizeof(P)) / kUnit;
  using Raw = typename RawOf<kUnit>::type;
  union View {
    Raw raw[kCount];
    P pack;
  };
};

__device__ __forceinline__ uint4 ld_nc_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ __forceinline__ uint2 ld_nc_stream(const uint2* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
__device__ __forceinline__ unsigned ld_nc_stream(const unsigned* p) {
  unsigned r;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ unsigned short ld_nc_stream(const unsigned short* p) {
  unsigned short r;
  asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(r) : "l"(p));
  return r;
}

// Streamed input: read once, not kept in L1 (unless L1_ALLOC).
template <typename T, int VEC, bool L1_ALLOC = false>
__device__ __forceinline__ Pack<T, VEC> load_nc(const T* base, long long elem_offset) {
  using A = Access<Pack<T, VEC>>;
  typename A::View u;
  const auto* src = reinterpret_cast<const typename A::Raw*>(base + elem_offset);
#pragma unroll
  for (int k = 0; k < A::kCount; ++k) u.raw[k] = L1_ALLOC ? __ldg(src + k) : ld_nc_stream(src + k);
  return u.pack;
}

// Asks L2 (or L1 and L2) to fetch the 128-byte line holding base[elem_offset],
// with no register result: a grid-stride loop issues it for its next row while
// it reduces and writes the current one, so DRAM stays busy across the row's
// barrier; a CTA issues the L1 form for gamma/beta beside its row's loads, so
// their latency overlaps the row's rather than following the reduction. Only
// the thread whose access opens a line issues it (the others' requests would
// be merged into the same line anyway).
template <bool L1, typename T, int VEC>
__device__ __forceinline__ void prefetch_line(const T* base, long long elem_offset) {
  constexpr long long kBytes = sizeof(T) * VEC;
  const long long byte = elem_offset * static_cast<long long>(sizeof(T));
  if (kBytes >= 128 || byte % 128 < kBytes) {
#pragma unroll
    for (long long b = 0; b < kBytes; b += 128) {
      const char* a = reinterpret_cast<const char*>(base) + byte + b;
      if constexpr (L1)
        asm volatile("prefetch.global.L1 [%0];" ::"l"(a));
      else
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void prefetch_l2(const T* base, long long elem_offset) {
  prefetch_line<false, T, VEC>(base, elem_offset);
}

// Reused read-only input (gamma, beta): the ordinary read-only cache path.
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_cached(const T* base, long long elem_offset) {
  using A = Access<Pack<T, VEC>>;
  typename A::View u;
  const auto* src = reinterpret_cast<const typename A::Raw*>(base + elem_offset);
#pragma unroll
  for (int k = 0; k < A::kCount; ++k) u.raw[k] = __ldg(src + k);
  return u.pack;
}

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_coherent(const T* base, long long elem_offset) {
  using A = Access<Pack<T, VEC>>;
  typename A::View u;
  const auto* src = reinterpret_cast<const typename A::Raw*>(base + elem_offset);
#pragma unroll
  for (int k = 0; k < A::kCount; ++k) u.raw[k] = src[k];
  return u.pack;
}

__device__ __forceinline__ void st_stream(uint4* p, uint4 v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_stream(uint2* p, uint2 v) {
  asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void st_stream(unsigned* p, unsigned v) {
  asm volatile("st.global.cs.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_stream(unsigned char* p, unsigned char v) {
  asm volatile("st.global.cs.u8 [%0], %1;" ::"l"(p), "h"(static_cast<unsigned short>(v)) : "memory");
}
__device__ __forceinline__ void st_stream(unsigned short* p, unsigned short v) {
  asm volatile("st.global.cs.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}

// STREAMING stores evict-first (.cs): for outputs this kernel never re-reads.
template <typename T, int VEC, bool STREAMING = false>
__device__ __forceinline__ void store(T* base, long long elem_offset, const Pack<T, VEC>& p) {
  using A = Access<Pack<T, VEC>>;
  typename A::View u;
  u.pack = p;
  auto* dst = reinterpret_cast<typename A::Raw*>(base + elem_offset);
#pragma unroll
  for (int k = 0; k < A::kCount; ++k) {
    if constexpr (STREAMING)
      st_stream(dst + k, u.raw[k]);
    else
      dst[k] = u.raw[k];
  }
}

// Asynchronous global -> shared copy of one Pack (cp.async, sm_80+), in
// 16-byte pieces that bypass L1 (.cg). The data lands while the thread goes
// on; cp_async_commit closes the thread's current group of copies and
// cp_async_wait<K> returns once at most K of its groups are still in flight.
// Completion is per thread: a thread that reads back only the vectors it
// copied itself needs no barrier. Both addresses must be 16-byte aligned.
template <typename P>
__device__ __forceinline__ void cp_async(P* dst, const P* src) {
  static_assert(sizeof(P) % 16 == 0, "cp.async stages whole 16-byte pieces");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const char* g = reinterpret_cast<const char*>(src);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(P)); k += 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s + k), "l"(g + k) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int K>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(K) : "memory");
}

// Element j of a pack as a float. Two bf16 share a 32-bit register: the low
// one is the word shifted up, the high one the word with its low half cleared
// (one instruction each; element by element the high one took an extract and
// a shift). Exact either way.
template <typename T, int VEC>
__device__ __forceinline__ float elem_float(const Pack<T, VEC>& p, int j) {
  if constexpr (is_bf16<T>::value && VEC % 2 == 0) {
    // The pair's word, joined in PTX from the two 16-bit halves (which a
    // vector load split out of it: the join costs no instruction). A union
    // would do the same in C++ but made ptxas spill narrow-row kernels.
    unsigned w;
    asm("mov.b32 %0, {%1, %2};" : "=r"(w) : "h"(p.e[j & ~1].bits), "h"(p.e[j | 1].bits));
    return __uint_as_float((j & 1) != 0 ? w & 0xffff0000u : w << 16);
  } else {
    return to_float(p.e[j]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void to_floats(const Pack<T, VEC>& p, float (&f)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) f[i] = elem_float(p, i);
}

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> from_floats(const float (&f)[VEC]) {
  Pack<T, VEC> p;
#pragma unroll
  for (int i = 0; i < VEC; ++i) p.e[i] = from_float<T>(f[i]);
  return p;
}

}  // namespace rtcnorm
