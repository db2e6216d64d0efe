// Forward helpers shared by every forward design (fwd_rows.cuh,
// fwd_sliced_row.cuh) and by the backward's row addressing: the row map,
// the statistics policies (RMSNorm's sum of squares, LayerNorm's merged
// moments), two-pass statistics, row and affine loads and prefetches.
//
// Invariants: device functions only, no kernel; every design that reads a
// row or gamma goes through these, so the designs' arithmetic is the same
// operations in the same order (the same bits).
#pragma once

#include "common/params.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace rtcnorm {

// kSingleStride: the host guarantees inner_rows >= rows, so the test is
// skipped: its constant-cache load and branch sit in front of the row's first
// load address (H100, bf16 LayerNorm 1x4096 2.37 -> 2.25 us; docs/history.md entry 75).
template <unsigned FLAGS>
__device__ __forceinline__ long long row_offset(const RowMap& m, long long r) {
  if constexpr ((FLAGS & kSingleStride) != 0) return r * m.inner_stride;
  if (r < m.inner_rows) return r * m.inner_stride;
  return (r / m.inner_rows) * m.outer_stride + (r % m.inner_rows) * m.inner_stride;
}

template <int KIND>
struct NormStats;

template <>
struct NormStats<kRmsNorm> {
  using Acc = Sum1;
  __device__ static Acc empty() { return {0.f}; }
  template <typename T, int VEC, int NV>
  __device__ static Acc of_chunk(const Pack<T, VEC> (&v)[NV], const bool (&ok)[NV]) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (!ok[i]) continue;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float f = elem_float(v[i], j);
        s = fmaf(f, f, s);
      }
    }
    return {s};
  }
  __device__ static void finish(Acc a, int n, float eps, float& mean, float& rstd) {
    mean = 0.f;
    rstd = rsqrtf(a.a / static_cast<float>(n) + eps);
  }
};

template <>
struct NormStats<kLayerNorm> {
  using Acc = MeanM2;
  __device__ static Acc empty() { return {0.f, 0.f, 0.f}; }
  template <typename T, int VEC, int NV>
  __device__ static Acc of_chunk(const Pack<T, VEC> (&v)[NV], const bool (&ok)[NV]) {
    float s = 0.f;
    int vecs = 0;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (!ok[i]) continue;
      ++vecs;
#pragma unroll
      for (int j = 0; j < VEC; ++j) s += elem_float(v[i], j);
    }
    if (vecs == 0) return empty();
    const float n = static_cast<float>(vecs * VEC);
    const float mean = s / n;
    float m2 = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (!ok[i]) continue;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = elem_float(v[i], j) - mean;
        m2 = fmaf(d, d, m2);
      }
    }
    return {n, mean, m2};
  }
  __device__ static void finish(Acc a, int n, float eps, float& mean, float& rstd) {
    mean = a.mean;
    rstd = rsqrtf(fmaxf(a.m2 / static_cast<float>(n), 0.f) + eps);
  }
};

// LayerNorm statistics of a row its group caches in registers (NV vectors a
// thread, vector i * TPR + lane, VECS of them in the row): the mean from one
// row reduction, then the mean squared deviation from it in a second. Two
// float sums replace the merges of (count, mean, M2) triples, which divide
// at every step. The second pass sums (x - mean)^2, so a large mean does not
// cancel the variance away as E[x^2] - E[x]^2 would. Every thread of the CTA
// calls it (rows past the end with row_ok false): the reductions may hold
// CTA barriers.
template <typename T, int VEC, int TPR, int ROWS, int NV, int N, int VECS>
__device__ __forceinline__ void two_pass_stats(const Pack<T, VEC> (&row)[NV], bool row_ok, int lane, float eps,
                                               GroupScratch<TPR, ROWS, Sum1>& scratch, float& mean, float& rstd) {
  Sum1 s = {0.f};
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    if (!row_ok || i * TPR + lane >= VECS) continue;
#pragma unroll
    for (int j = 0; j < VEC; ++j) s.a += elem_float(row[i], j);
  }
  // A true division, not a product with a rounded 1 / N: a row of equal
  // values then gets their exact mean, and x - mean is 0 where rstd is
  // 1 / sqrt(eps) (a row of seven 1000s times fl(1/7) is off by 6e-5, which
  // that rstd turns into 0.02 of output).
  mean = group_allreduce<TPR, ROWS>(s, scratch).a / static_cast<float>(N);
  Sum1 q = {0.f};
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    if (!row_ok || i * TPR + lane >= VECS) continue;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = elem_float(row[i], j) - mean;
      q.a = fmaf(d, d, q.a);
    }
  }
  // The variance may take the rounded reciprocal: one ulp of it is harmless.
  constexpr float kInvN = 1.f / static_cast<float>(N);
  rstd = rsqrtf(group_allreduce<TPR, ROWS>(q, scratch).a * kInvN + eps);
}

// Prefetches into L2 (L1 too when L1) the vectors this thread will load from
// the row that starts at `off`: a grid-stride CTA calls it for its next row
// block right after issuing the current row's loads, so the memory system
// keeps working while the CTA sits in the row reduction and writes its outputs.
template <typename T, int VEC, int TPR, int NV, int VECS, bool L1 = false>
__device__ __forceinline__ void prefetch_row(const T* base, long long off, int lane) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = i * TPR + lane;
    if (v < VECS) prefetch_line<L1, T, VEC>(base, off + 1LL * v * VEC);
  }
}

// A vector of x (or of the residual) as the plan reads it: around L1
// (L1::no_allocate), or, with kL1Allocate (inputs of 40 MB or more), through
// L1. 16-bit rows take an ordinary ld.global there, which allocates in L1 on
// the load/store path: up to 1.4% faster than ld.global.nc (H100, bf16 RMSNorm 2048x32768 94.3 ->
// 93.1 us; docs/history.md entry 72), and safe because no CTA writes
// what it reads. float32 rows keep ld.global.nc: with ordinary loads ptxas
// spilled their LayerNorm rows (32768 wide: 72 bytes at 128 registers).
template <typename T, int VEC, bool ALLOC>
__device__ __forceinline__ Pack<T, VEC> load_row_vec(const T* base, long long elem_offset) {
  if constexpr (ALLOC && sizeof(T) == 2)
    return load_coherent<T, VEC>(base, elem_offset);
  else
    return load_nc<T, VEC, ALLOC>(base, elem_offset);
}

// gamma and beta of one vector as stored (a tensor the kernel lacks is not read).
template <typename W, int VEC>
struct AffinePacks {
  Pack<W, VEC> w, b;
};

template <typename W, int VEC, unsigned FLAGS>
__device__ __forceinline__ AffinePacks<W, VEC> load_affine_packs(const NormFwdParams& p, int vec_index) {
  AffinePacks<W, VEC> a{};
  if constexpr ((FLAGS & kHasWeight) != 0)
    a.w = load_cached<W, VEC>(static_cast<const W*>(p.weight), 1LL * vec_index * VEC);
  if constexpr ((FLAGS & kHasBias) != 0)
    a.b = load_cached<W, VEC>(static_cast<const W*>(p.bias), 1LL * vec_index * VEC);
  return a;
}

// The floats the normalize step multiplies and adds: gamma with the
// zero-centred shift applied (1 without a weight), and beta (0 without one).
template <typename W, int VEC, unsigned FLAGS>
__device__ __forceinline__ void affine_floats(const AffinePacks<W, VEC>& a, float (&g)[VEC], float (&b)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    g[j] = 1.f;
    b[j] = 0.f;
    if constexpr ((FLAGS & kHasWeight) != 0)
      g[j] = (FLAGS & kZeroCentered) ? 1.f + elem_float(a.w, j) : elem_float(a.w, j);
    if constexpr ((FLAGS & kHasBias) != 0) b[j] = elem_float(a.b, j);
  }
}

template <typename W, int VEC, unsigned FLAGS>
__device__ __forceinline__ void load_affine(const NormFwdParams& p, int vec_index, float (&g)[VEC], float (&b)[VEC]) {
  affine_floats<W, VEC, FLAGS>(load_affine_packs<W, VEC, FLAGS>(p, vec_index), g, b);
}

// Fetches into L1 the gamma/beta lines of this thread's vectors of the first
// chunk (of the slice starting at column col0), so that the normalize pass,
// which reads them right after the row reduction, finds them there instead
// of waiting on L2 or DRAM.
template <typename W, int VEC, int TPR, int NV, int VECS, unsigned FLAGS>
__device__ __forceinline__ void prefetch_affine(const NormFwdParams& p, long long col0, int lane) {
  if constexpr ((FLAGS & kHasWeight) != 0)
    prefetch_row<W, VEC, TPR, NV, VECS, true>(static_cast<const W*>(p.weight), col0, lane);
  if constexpr ((FLAGS & kHasBias) != 0)
    prefetch_row<W, VEC, TPR, NV, VECS, true>(static_cast<const W*>(p.bias), col0, lane);
}

// Whether a slice's LayerNorm moments may merge as equal counts (MeanM2Eq,
// no division): whole chunks (EVEN), so every thread sums as many elements,
// in a power of two of warps, which pair off. The meeting and deferred loops
// both ask here, so their partials are the same bits.
template <int KIND, int TPR, bool EVEN>
__device__ constexpr bool equal_count_merge() {
  constexpr int kWarps = TPR > 32 ? TPR / 32 : 1;
  return KIND == kLayerNorm && EVEN && (kWarps & (kWarps - 1)) == 0;
}
}  // namespace rtcnorm
