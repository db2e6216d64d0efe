// Reductions over a "row group": TPR consecutive threads of a CTA that share
// one row. A CTA holds ROWS row groups (TPR * ROWS <= 1024 threads).
//
// Invariants:
// - TPR is a power of two up to 32, else a multiple of 32. For TPR <= 32 a
//   group lives inside one warp and is reduced with xor shuffles that never
//   cross the group boundary; for TPR > 32 the group spans TPR / 32 whole
//   warps, combined through shared memory.
// - Every merge is done in a fixed order with the lower-lane (or lower-warp)
//   operand first, so every thread of a group ends with bitwise the same value
//   and the result does not depend on scheduling.
// - MeanM2Eq is merged only with an equal count: every thread of the group
//   holds the same number of elements (or none, a row past the end), the
//   lanes meet in a butterfly and the warps (cluster CTAs), a power of two
//   of them, in a pairwise tree (merge_in_order), so both operands of each
//   merge cover equally many. That makes the merge division-free.
// - group_allreduce contains __syncthreads when TPR > 32: every thread of the
//   CTA must call it the same number of times (rows past the end included).
#pragma once

namespace rtcnorm {

struct Sum1 {
  float a;
};
struct Sum2 {
  float a, b;
};
// Count, mean and sum of squared deviations: merged with Chan's pairwise
// formula, which stays accurate when |mean| >> stddev (E[x^2] - E[x]^2 does not).
struct MeanM2 {
  float n, mean, m2;
};

// The same moments where every merge joins two equal counts (see the
// invariant above): the weight of each side is exactly 1/2, so Chan's
// formula needs no division, and a row of equal values keeps its exact mean.
struct MeanM2Eq {
  float n, mean, m2;
};

template <bool C, typename A, typename B>
struct Select {
  using type = A;
};
template <typename A, typename B>
struct Select<false, A, B> {
  using type = B;
};

__device__ __forceinline__ Sum1 merge(Sum1 lo, Sum1 hi) { return {lo.a + hi.a}; }
__device__ __forceinline__ Sum2 merge(Sum2 lo, Sum2 hi) { return {lo.a + hi.a, lo.b + hi.b}; }
__device__ __forceinline__ MeanM2 merge(MeanM2 lo, MeanM2 hi) {
  const float n = lo.n + hi.n;
  if (hi.n == 0.f) return lo;
  if (lo.n == 0.f) return hi;
  const float delta = hi.mean - lo.mean;
  const float w_hi = hi.n / n;
  return {n, lo.mean + delta * w_hi, lo.m2 + hi.m2 + delta * delta * lo.n * w_hi};
}

__device__ __forceinline__ MeanM2Eq merge(MeanM2Eq lo, MeanM2Eq hi) {
  const float delta = hi.mean - lo.mean;
  // n_lo * n_hi / (n_lo + n_hi) with n_hi == n_lo is n_lo / 2.
  return {lo.n + hi.n, 0.5f * (lo.mean + hi.mean), lo.m2 + hi.m2 + delta * delta * (0.5f * lo.n)};
}

// An accumulator as type To: itself, or the moments as the other of MeanM2
// and MeanM2Eq (the same three fields).
template <typename To>
struct AccAs {
  __device__ static To from(To a) { return a; }
};
template <>
struct AccAs<MeanM2Eq> {
  __device__ static MeanM2Eq from(MeanM2 a) { return {a.n, a.mean, a.m2}; }
  __device__ static MeanM2Eq from(MeanM2Eq a) { return a; }
};
template <>
struct AccAs<MeanM2> {
  __device__ static MeanM2 from(MeanM2Eq a) { return {a.n, a.mean, a.m2}; }
  __device__ static MeanM2 from(MeanM2 a) { return a; }
};

// Merges the K partials at `part` (registers or shared memory) in a fixed
// order, so every thread that calls it gets bitwise the same result: left to
// right, each read as the merge needs it, or, for MeanM2Eq, as a pairwise
// tree in index order (K a power of two) so that each merge joins equal counts.
template <int K, typename Acc>
__device__ __forceinline__ Acc merge_in_order(const Acc* part) {
  Acc r = part[0];
#pragma unroll
  for (int k = 1; k < K; ++k) r = merge(r, part[k]);
  return r;
}
template <int K>
__device__ __forceinline__ MeanM2Eq merge_in_order(const MeanM2Eq* part) {
  static_assert((K & (K - 1)) == 0, "equal-count merges pair a power of two of partials");
  MeanM2Eq t[K];
#pragma unroll
  for (int k = 0; k < K; ++k) t[k] = part[k];
#pragma unroll
  for (int step = 1; step < K; step *= 2) {
#pragma unroll
    for (int k = 0; k + step < K; k += 2 * step) t[k] = merge(t[k], t[k + step]);
  }
  return t[0];
}

// Every float of `v` from lane `src` of the warp (every lane calls it).
template <typename Acc>
__device__ __forceinline__ Acc shfl_from(const Acc& v, int src) {
  Acc r;
  const float* f = reinterpret_cast<const float*>(&v);
  float* g = reinterpret_cast<float*>(&r);
#pragma unroll
  for (int j = 0; j < static_cast<int>(sizeof(Acc) / sizeof(float)); ++j) g[j] = __shfl_sync(0xffffffffu, f[j], src);
  return r;
}

// merge_in_order of the K partials `v` of warp lanes 0..K-1, in every lane:
// left-to-right merges take each partial as it is shuffled in (K = 16 held
// at once cost a register-bound backward 2.7%, LayerNorm 512x131072 170.8 ->
// 175.5 us); MeanM2Eq's pairwise tree needs them all.
template <int K, typename Acc>
__device__ __forceinline__ Acc merge_lanes_in_order(const Acc& v) {
  Acc r = shfl_from(v, 0);
#pragma unroll
  for (int k = 1; k < K; ++k) r = merge(r, shfl_from(v, k));
  return r;
}
template <int K>
__device__ __forceinline__ MeanM2Eq merge_lanes_in_order(const MeanM2Eq& v) {
  MeanM2Eq part[K];
#pragma unroll
  for (int k = 0; k < K; ++k) part[k] = shfl_from(v, k);
  return merge_in_order<K>(part);
}

__device__ __forceinline__ Sum1 shfl_xor(Sum1 v, int m) { return {__shfl_xor_sync(0xffffffffu, v.a, m)}; }
__device__ __forceinline__ Sum2 shfl_xor(Sum2 v, int m) {
  return {__shfl_xor_sync(0xffffffffu, v.a, m), __shfl_xor_sync(0xffffffffu, v.b, m)};
}
__device__ __forceinline__ MeanM2 shfl_xor(MeanM2 v, int m) {
  return {__shfl_xor_sync(0xffffffffu, v.n, m), __shfl_xor_sync(0xffffffffu, v.mean, m),
          __shfl_xor_sync(0xffffffffu, v.m2, m)};
}
// The partner's count equals this lane's (the MeanM2Eq invariant): not sent.
__device__ __forceinline__ MeanM2Eq shfl_xor(MeanM2Eq v, int m) {
  return {v.n, __shfl_xor_sync(0xffffffffu, v.mean, m), __shfl_xor_sync(0xffffffffu, v.m2, m)};
}

// Butterfly over the WIDTH lanes of each aligned lane block (WIDTH <= 32).
template <int WIDTH, typename Acc>
__device__ __forceinline__ Acc lanes_allreduce(Acc v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = WIDTH / 2; m > 0; m >>= 1) {
    const Acc other = shfl_xor(v, m);
    v = (lane & m) ? merge(other, v) : merge(v, other);
  }
  return v;
}

// Whether a CTA of ROWS groups of TPR threads (blockDim.x == TPR * ROWS)
// takes a thread's lane in its group as threadIdx.x and the group as 0
// rather than dividing by TPR: one group whose TPR is not a power of two (a
// row of 320 or 768 threads). The compiler cannot bound threadIdx.x by TPR,
// so the division made the row index differ per thread, and ptxas held a
// per-thread row, row test and addresses (H100, sm_90: a bf16 LayerNorm
// 49152-wide row at 768 threads spilled 76 bytes at 80 registers, 4 without;
// RMSNorm's 5120-wide backward at 320 threads 20 bytes, 0; docs/history.md
// entry 76). Power-of-two TPR keep the division, a mask and a shift: spelled
// as here, ptxas scheduled some of those kernels worse (bf16 LayerNorm
// 1024x65536 on clusters of 128-thread CTAs, 102 -> 158 us). Callers write
// `flat ? threadIdx.x : threadIdx.x % TPR` in place, so that kernels outside
// the case compile to the same machine code as before it.
template <int TPR, int ROWS>
__device__ constexpr bool flat_lanes() {
  return ROWS == 1 && (TPR & (TPR - 1)) != 0;
}

// Shared scratch needed by group_allreduce<TPR, ROWS, Acc>.
template <int TPR, int ROWS, typename Acc>
struct GroupScratch {
  Acc slot[ROWS * (TPR > 32 ? TPR / 32 : 1)];
};

// FLAT = false keeps the division where flat_lanes would drop it (norm_bwd's
// clusters).
template <int TPR, int ROWS, bool FLAT = true, typename Acc>
__device__ __forceinline__ Acc group_allreduce(Acc v, GroupScratch<TPR, ROWS, Acc>& scratch) {
  v = lanes_allreduce<(TPR < 32 ? TPR : 32)>(v);
  if constexpr (TPR > 32) {
    constexpr int kWarpsPerRow = TPR / 32;
    constexpr bool kFlat = FLAT && flat_lanes<TPR, ROWS>();
    const int group = kFlat ? 0u : threadIdx.x / TPR;
    const int warp_in_group = (kFlat ? threadIdx.x : threadIdx.x % TPR) / 32;
    if ((threadIdx.x & 31) == 0) scratch.slot[group * kWarpsPerRow + warp_in_group] = v;
    __syncthreads();
    const Acc r = merge_in_order<kWarpsPerRow>(&scratch.slot[group * kWarpsPerRow]);
    __syncthreads();
    v = r;
  }
  return v;
}

}  // namespace rtcnorm
