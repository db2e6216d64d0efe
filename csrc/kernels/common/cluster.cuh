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
// - Every thread of every CTA of a cluster calls cluster_exchange_init once,
//   then makes the same sequence of publish / collect calls (the row loop is
//   uniform across the cluster), then calls cluster_exit once with the count.
// - Each CTA pushes its partial into a slot of every CTA of the cluster
//   (st.async), and an mbarrier per slot parity counts the bytes in; a CTA
//   reads only its own shared memory to merge. cluster_publish gives the
//   argument for reusing slots and mbarriers by call parity.
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

// 32-bit shared::cta address of a shared-memory object.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// The shared::cluster address of a shared::cta address's offset in cluster CTA `rank`.
__device__ __forceinline__ unsigned map_to_rank(unsigned addr, int rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}

// Writes `v` into cluster shared memory at `remote` and, once written, takes
// sizeof(Acc) bytes off the transaction count of the mbarrier at `remote_bar`
// (st.async: the completion has release semantics at cluster scope, so this
// thread's earlier memory accesses are ordered before it).
template <typename Acc>
__device__ __forceinline__ void push_to_rank(const Acc& v, unsigned remote, unsigned remote_bar) {
  static_assert(sizeof(Acc) % sizeof(float) == 0, "accumulators are plain floats");
  const float* f = reinterpret_cast<const float*>(&v);
  if constexpr (sizeof(Acc) == 8) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                 :
                 : "r"(remote), "f"(f[0]), "f"(f[1]), "r"(remote_bar)
                 : "memory");
  } else {
#pragma unroll
    for (int k = 0; k < static_cast<int>(sizeof(Acc) / sizeof(float)); ++k)
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
                   :
                   : "r"(remote + 4u * k), "f"(f[k]), "r"(remote_bar)
                   : "memory");
  }
}

// Slots for the partials the cluster's CTAs push to this one, and the
// mbarriers that count them in, both by call modulo SLOTS: 2 where a row-group
// barrier separates every collect from the next publish, 3 where it does not
// (see cluster_publish).
template <int CL, int ROWS, typename Acc, int SLOTS = 2>
struct ClusterScratch {
  static_assert(SLOTS == 2 || SLOTS == 3, "two or three slot sets");
  unsigned long long full[CL > 1 ? SLOTS : 1];          // call % SLOTS: every partial of the call has landed
  Acc slot[CL > 1 ? SLOTS : 1][CL > 1 ? ROWS : 1][CL];  // [call % SLOTS][row group][sender rank]
};

// Before the first cluster_publish: the mbarriers exist before any peer can
// push to them. Every thread of the CTA calls it; the first publish waits for
// the cluster (cluster_exit does, where there was none).
template <int CL, int ROWS, typename Acc, int SLOTS>
__device__ __forceinline__ void cluster_exchange_init(ClusterScratch<CL, ROWS, Acc, SLOTS>& s) {
  if constexpr (CL > 1) {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int k = 0; k < SLOTS; ++k)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&s.full[k])));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
}

// Merges one CTA-level partial per row group across the cluster, in two
// halves so a caller can work between them: cluster_publish pushes this
// CTA's partial into every CTA's slot for it (lanes 0..CL-1 of the group one
// rank each), cluster_collect waits until all CL partials have landed in this
// CTA and merges them from local shared memory. `v` must already be the same
// in every thread of the group (group_allreduce's result); `lane` is the
// thread's index in its group of TPR; `call` counts the caller's
// publish/collect pairs, and collect k comes before publish k + 1 in every
// thread. No cluster barrier is involved after the first call: a barrier's
// release and acquire cost a GPU-scope memory fence and an L1 invalidation.
//
// Why slots and mbarriers can be reused every SLOTS calls: a CTA pushes call
// k + SLOTS into slot and mbarrier k % SLOTS of CTA B only after its own
// collect of k + SLOTS - 1, which needs B's partial of k + SLOTS - 1. B's
// pushing lanes (the row group's first warp) sent that after their collect
// of k + SLOTS - 2 (program order; the push's release orders B's reads
// before it), and every other warp of B's row group must have read call k
// by then too. With SLOTS = 2 that needs a row-group barrier between each
// collect and the next publish (a meeting loop: the next row's
// group_allreduce). The deferred loop collects k - 1 and publishes k back to
// back, so it takes SLOTS = 3: its push of k + 2 follows the group_allreduce
// barrier of row block k + 2, which every warp reaches after its collect of
// k. So B's mbarrier has completed the phase of call k, and B has read those
// slots, before anything of call k + SLOTS reaches them. Partials of call k
// may land before B's own expect-tx arrive for k; the phase cannot complete
// before that arrive (one pending arrival), so the count only dips below zero.
template <int CL, int ROWS, int TPR, typename Acc, int SLOTS>
__device__ __forceinline__ void cluster_publish(Acc v, ClusterScratch<CL, ROWS, Acc, SLOTS>& s, int call, int group,
                                                int lane) {
  if constexpr (CL > 1) {
    if (call == 0) cluster_wait();  // cluster_exchange_init's arrive
    const int par = call % SLOTS;
    if (threadIdx.x == 0) {
      constexpr unsigned kBytes = CL * ROWS * sizeof(Acc);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(&s.full[par])),
                   "r"(kBytes)
                   : "memory");
    }
    const unsigned slot = shared_address(&s.slot[par][group][cluster_rank<CL>()]);
    const unsigned bar = shared_address(&s.full[par]);
    for (int r = lane; r < CL; r += TPR) push_to_rank(v, map_to_rank(slot, r), map_to_rank(bar, r));
  }
}

template <int CL, int ROWS, typename Acc, int SLOTS>
__device__ __forceinline__ Acc cluster_collect(Acc v, ClusterScratch<CL, ROWS, Acc, SLOTS>& s, int call, int group) {
  if constexpr (CL == 1) {
    return v;
  } else {
    const int par = call % SLOTS;
    const unsigned bar = shared_address(&s.full[par]);
    // The phase of mbarrier `par` that call completes: its (call / SLOTS)-th.
    const unsigned parity = static_cast<unsigned>(call / SLOTS) & 1u;
    // The suspend-time hint lets a waiting warp sleep until the phase
    // completes rather than poll: a CTA sharing its SM keeps the issue slots.
    constexpr unsigned kSuspendNs = 10000000;
    unsigned done = 0;
    do {
      asm volatile(
          "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n\tselp.u32 %0, 1, 0, "
          "p;\n\t}"
          : "=r"(done)
          : "r"(bar), "r"(parity), "r"(kSuspendNs)
          : "memory");
    } while (done == 0);
    return merge_in_order<CL>(&s.slot[par][group][0]);
  }
}

template <int CL, int ROWS, int TPR, typename Acc, int SLOTS>
__device__ __forceinline__ Acc cluster_allreduce(Acc v, ClusterScratch<CL, ROWS, Acc, SLOTS>& s, int call, int group,
                                                 int lane) {
  cluster_publish<CL, ROWS, TPR>(v, s, call, group, lane);
  return cluster_collect<CL, ROWS>(v, s, call, group);
}

// After the last collect: `calls` is the number of publish/collect pairs.
// Peers push only partials this CTA collects, so once its last collect has
// returned nothing more lands here; the barrier keeps every CTA's shared
// memory alive until the whole cluster is past its exchanges.
template <int CL>
__device__ __forceinline__ void cluster_exit(int calls) {
  if constexpr (CL > 1) {
    if (calls == 0) cluster_wait();  // cluster_exchange_init's arrive
    cluster_barrier();
  }
}

}  // namespace rtcnorm
