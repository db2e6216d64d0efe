// Row statistics shared by the CTAs of a thread-block cluster that split each
// row's columns between them (sm_90+: distributed shared memory). A row too
// long for one CTA's registers becomes CL slices that each fit, and the
// slices' partial sums meet through the cluster's shared memory instead of
// a second read of the row.
//
// Invariants:
// - CL (CTAs per cluster) is 1, 2, 4, 8 or 16 (sm_90's non-portable size).
//   CL == 1 compiles to nothing, so one kernel body serves every
//   architecture; CL > 1 needs sm_90+ and a launch with that cluster shape
//   (jit::launch does both from the kernel key).
// - Every thread of every CTA of a cluster makes the same sequence of
//   cluster_allreduce calls (the row loop is uniform across the cluster) and
//   calls cluster_exit once after the last: a CTA's shared memory must outlive
//   the other CTAs' reads of its slots.
// - Slots are double-buffered by call parity. A CTA overwrites slot[k & 1] in
//   call k only after passing call k - 1's barrier, which no CTA reaches
//   before it has finished reading call k - 2's slots.
// - Partials are merged in rank order (merge_in_order), the same order in
//   every CTA, so every CTA of a cluster ends with bitwise the same statistics.
#pragma once

#include "common/params.cuh"
#include "common/reduce.cuh"

namespace rtcnorm {

// CTAs of the column cluster that splits each row (kClusterBits, kCluster16).
template <unsigned FLAGS>
__device__ constexpr int column_cluster_ctas() {
  return (FLAGS & kCluster16) != 0 ? 16 : 1 << ((FLAGS & kClusterBits) >> kClusterShift);
}

template <int CL>
__device__ __forceinline__ int cluster_rank() {
  if constexpr (CL == 1) {
    return 0;
  } else {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return static_cast<int>(r);
  }
}

// Every thread of the cluster arrives; writes before the arrive are visible
// to distributed shared-memory reads after the wait. Work placed between the
// two overlaps the other CTAs' arrival.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_barrier() {
  cluster_arrive();
  cluster_wait();
}

// The shared::cluster address of `local`'s offset in cluster CTA `rank`.
__device__ __forceinline__ unsigned remote_address(const float* local, int rank) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}

// The float at `local`'s offset in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ float load_remote(const float* local, int rank) {
  float v;
  // No memory clobber: cluster_barrier's orders these loads; leaving them
  // free lets the CL loads of cluster_allreduce be in flight together.
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote_address(local, rank)));
  return v;
}

// Four floats at `local`'s offset (16-byte aligned) in the shared memory of
// cluster CTA `rank`, in one access.
__device__ __forceinline__ float4 load_remote4(const float* local, int rank) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote_address(local, rank)));
  return v;
}

template <typename Acc>
__device__ __forceinline__ Acc load_remote(const Acc& local, int rank) {
  static_assert(sizeof(Acc) % sizeof(float) == 0, "accumulators are plain floats");
  Acc r;
  float* dst = reinterpret_cast<float*>(&r);
  const float* src = reinterpret_cast<const float*>(&local);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(Acc) / sizeof(float)); ++k) dst[k] = load_remote(src + k, rank);
  return r;
}

template <int CL, int ROWS, typename Acc>
struct ClusterScratch {
  Acc slot[CL > 1 ? 2 : 1][CL > 1 ? ROWS : 1];
};

// Merges one CTA-level partial per row group across the cluster, in two
// halves so a caller can work between them: cluster_publish stores this
// CTA's partial and arrives; cluster_collect waits and merges. `v` must
// already be the same in every thread of the group (group_allreduce's
// result); `writer` is one thread per group; `call` counts the caller's
// publish/collect pairs.
template <int CL, int ROWS, typename Acc>
__device__ __forceinline__ void cluster_publish(Acc v, ClusterScratch<CL, ROWS, Acc>& s, int call, int group,
                                                bool writer) {
  if constexpr (CL > 1) {
    if (writer) s.slot[call & 1][group] = v;
    cluster_arrive();
  }
}

template <int CL, int ROWS, typename Acc>
__device__ __forceinline__ Acc cluster_collect(Acc v, ClusterScratch<CL, ROWS, Acc>& s, int call, int group) {
  if constexpr (CL == 1) {
    return v;
  } else {
    cluster_wait();
    // Every load is issued before the first merge: one round trip, not CL.
    const Acc& slot = s.slot[call & 1][group];
    Acc part[CL];
#pragma unroll
    for (int k = 0; k < CL; ++k) part[k] = load_remote(slot, k);
    return merge_in_order<CL>(part);
  }
}

template <int CL, int ROWS, typename Acc>
__device__ __forceinline__ Acc cluster_allreduce(Acc v, ClusterScratch<CL, ROWS, Acc>& s, int call, int group,
                                                 bool writer) {
  cluster_publish<CL, ROWS>(v, s, call, group, writer);
  return cluster_collect<CL, ROWS>(v, s, call, group);
}

template <int CL>
__device__ __forceinline__ void cluster_exit() {
  if constexpr (CL > 1) cluster_barrier();
}

}  // namespace rtcnorm
