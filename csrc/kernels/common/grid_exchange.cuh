// Row sums shared by the CTAs that split each row's columns when they are
// not a thread-block cluster (kGridExchange): the CL slices of a row are CL
// consecutive CTAs of one cooperative launch (all resident at once), and
// their partial sums meet through global memory (L2). Unlike a hardware
// cluster, such a group needs no CL free SMs in one GPC, so every SM can
// hold a slice (H100: 8 groups of 16 CTAs on 128 SMs, where only 7 clusters
// of 16 fit its GPCs).
//
// Layout of p.exchange, for G = gridDim.x / CL groups (the host allocates
// and zeroes it before the launch):
//   slots: [G][3][ROWS][CL] of 16 bytes, by call % 3: two 8-byte words
//   {a, tag} and {b, tag} with tag = call + 1.
//
// Invariants:
// - The same call sequence as common/cluster.cuh's publish / collect:
//   every thread of the group's CTAs makes it, collect k before publish
//   k + 1, and the group's row loop is uniform.
// - Each 8-byte word is written and read whole (single-copy atomic), so a
//   word whose tag is call + 1 carries that call's value: no flag, no
//   fence and no acquire (whose L1 invalidation would evict gamma), just a
//   relaxed GPU-scope store and polled loads that L2 serves.
// - Slot reuse: a CTA writes call k + 3 into slot k % 3 only after its
//   collect of call k + 2, which saw every peer's publish of k + 2. A peer
//   publishes k + 2 after the row-group barrier of that row block
//   (group_allreduce's __syncthreads for TPR > 32; the warp's program order
//   otherwise), which follows its collect of k in every warp, and that
//   collect's values were consumed (dx of k written) before: no peer can
//   still be waiting on call k's words. (Two slots would not do: a peer's
//   warp could still be reading call k while its lane 0 publishes k + 1.)
// - Partials are merged in rank order, the same as merge_in_order over a
//   cluster's slots, so both exchanges give bitwise the same sums.
#pragma once

#include "common/params.cuh"
#include "common/reduce.cuh"

namespace rtcnorm {

// This group's slots: [3][ROWS][CL] pairs of tagged words.
template <int CL, int ROWS>
__device__ __forceinline__ unsigned long long* grid_exchange_of(unsigned* base, long long group) {
  return reinterpret_cast<unsigned long long*>(base) + group * kGridExchangeSlots * ROWS * CL * 2;
}

__device__ __forceinline__ unsigned long long tagged(float v, unsigned tag) {
  return static_cast<unsigned long long>(__float_as_uint(v)) | (static_cast<unsigned long long>(tag) << 32);
}

// Publishes this CTA's partial of `call` for its row group: `v` must be the
// same in every thread of the group (group_allreduce's result).
template <int CL, int ROWS>
__device__ __forceinline__ void grid_publish(Sum2 v, unsigned long long* ex, int rank, int call, int group, int lane) {
  if (lane != 0) return;
  unsigned long long* dst = ex + 2 * (((call % kGridExchangeSlots) * ROWS + group) * CL + rank);
  const unsigned tag = static_cast<unsigned>(call) + 1u;
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(dst), "l"(tagged(v.a, tag)), "l"(tagged(v.b, tag))
               : "memory");
}

// Waits for the group's CL partials of `call` and merges them in rank order.
// Every warp of the row group fetches them itself (lanes 0..CL-1, one rank
// each) and spreads them by shuffles, so no barrier is needed.
template <int CL, int ROWS, int TPR>
__device__ __forceinline__ Sum2 grid_collect(const unsigned long long* ex, int call, int group) {
  static_assert(TPR % 32 == 0 && CL <= 32, "a warp of the row group fetches every rank's partial");
  const int l = threadIdx.x & 31;
  float a = 0.f, b = 0.f;
  if (l < CL) {
    const unsigned tag = static_cast<unsigned>(call) + 1u;
    const unsigned long long* src = ex + 2 * (((call % kGridExchangeSlots) * ROWS + group) * CL + l);
    unsigned long long wa, wb;
    // Normally long published (the sums were sent a row block ago).
    for (;;) {
      asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(wa), "=l"(wb) : "l"(src) : "memory");
      if (static_cast<unsigned>(wa >> 32) == tag && static_cast<unsigned>(wb >> 32) == tag) break;
      __nanosleep(32);
    }
    a = __uint_as_float(static_cast<unsigned>(wa));
    b = __uint_as_float(static_cast<unsigned>(wb));
  }
  Sum2 r{__shfl_sync(0xffffffffu, a, 0), __shfl_sync(0xffffffffu, b, 0)};
#pragma unroll
  for (int k = 1; k < CL; ++k) r = merge(r, Sum2{__shfl_sync(0xffffffffu, a, k), __shfl_sync(0xffffffffu, b, k)});
  return r;
}

}  // namespace rtcnorm
