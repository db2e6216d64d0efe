// Row sums shared by the CTAs that split each row's columns when they are
// not a thread-block cluster (kGridExchange): the CL slices of a row are CL
// consecutive CTAs of one cooperative launch (all resident at once), and
// their partial sums meet through global memory (L2). Unlike a hardware
// cluster, such a group needs no CL free SMs in one GPC, so every SM can
// hold a slice (H100: 8 groups of 16 CTAs on 128 SMs, where only 7 clusters
// of 16 fit its GPCs).
//
// Layout of p.exchange, for G = gridDim.x / CL groups:
//   slots: [G][3][ROWS][CL], by call % 3, each one partial as tagged 8-byte
//   words {value, tag} with tag = p.exchange_base + call + 1, one word per
//   float of the partial, padded to 2 words (Sum1, Sum2: 16 bytes) or 4
//   (three moments: 32 bytes; grid_slot_words).
// - The buffer outlives the launch and is not zeroed between launches: the
//   host gives each launch on it a tag range of its own (exchange_base + 1
//   up to exchange_base + row_blocks, ops/grid_exchange_buffers.h), so a
//   word an earlier launch left never carries a tag this one polls for.
//
// Invariants:
// - Callers: the deferred loops, forward and backward (collect k - 1, then
//   publish k; norm/slice_exchange.cuh) and the forward's meeting loop
//   (publish k, then collect k). All make
//   the same call sequence as common/cluster.cuh's publish / collect:
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
//   collect's values were consumed (dx or y of k written) before: no peer can
//   still be waiting on call k's words. (Two slots would not do: a peer's
//   warp could still be reading call k while its lane 0 publishes k + 1.)
// - Partials are merged in rank order, the same as merge_in_order over a
//   cluster's slots, so both exchanges give bitwise the same sums.
#pragma once

#include "common/params.cuh"
#include "common/reduce.cuh"

namespace rtcnorm {

// Tagged 8-byte words one partial of type Acc occupies in a slot (the host
// sizes the buffer by the same grid_slot_words_for).
template <typename Acc>
__device__ constexpr int grid_slot_words() {
  return grid_slot_words_for(static_cast<int>(sizeof(Acc) / sizeof(float)));
}

// This group's slots: [3][ROWS][CL] slots of grid_slot_words<Acc>() words.
template <int CL, int ROWS, typename Acc>
__device__ __forceinline__ unsigned long long* grid_exchange_of(unsigned* base, long long group) {
  return reinterpret_cast<unsigned long long*>(base) + group * kGridExchangeSlots * ROWS * CL * grid_slot_words<Acc>();
}

template <int CL, int ROWS, typename Acc>
__device__ __forceinline__ unsigned long long* grid_slot(unsigned long long* ex, int call, int group, int rank) {
  return ex + grid_slot_words<Acc>() * (((call % kGridExchangeSlots) * ROWS + group) * CL + rank);
}

__device__ __forceinline__ unsigned long long tagged(float v, unsigned tag) {
  return static_cast<unsigned long long>(__float_as_uint(v)) | (static_cast<unsigned long long>(tag) << 32);
}

// The tag of `call` in a launch whose range starts past `base`.
__device__ __forceinline__ unsigned call_tag(unsigned base, int call) {
  return base + static_cast<unsigned>(call) + 1u;
}

// Publishes this CTA's partial of `call` for its row group: `v` must be the
// same in every thread of the group (group_allreduce's result).
template <int CL, int ROWS, typename Acc>
__device__ __forceinline__ void grid_publish(Acc v, unsigned long long* ex, unsigned base, int rank, int call,
                                             int group, int lane) {
  constexpr int kFloats = sizeof(Acc) / sizeof(float);
  static_assert(kFloats >= 1 && kFloats <= 3, "partials of one to three floats");
  if (lane != 0) return;
  unsigned long long* dst = grid_slot<CL, ROWS, Acc>(ex, call, group, rank);
  const unsigned tag = call_tag(base, call);
  const float* f = reinterpret_cast<const float*>(&v);
  if constexpr (kFloats == 1) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(dst), "l"(tagged(f[0], tag)) : "memory");
  } else {
    asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(dst), "l"(tagged(f[0], tag)),
                 "l"(tagged(f[1], tag))
                 : "memory");
    if constexpr (kFloats == 3)
      asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(dst + 2), "l"(tagged(f[2], tag)) : "memory");
  }
}

// Polls one slot until each of its kFloats words carries `tag`, and returns
// the values.
template <typename Acc>
__device__ __forceinline__ Acc grid_poll(const unsigned long long* src, unsigned tag) {
  constexpr int kFloats = sizeof(Acc) / sizeof(float);
  unsigned long long w[3] = {0, 0, 0};
  // Normally long published: the sums were sent a row block ago (deferred
  // loop), or by CTAs that loaded their slices beside this one.
  for (;;) {
    bool ready;
    if constexpr (kFloats == 1) {
      asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w[0]) : "l"(src) : "memory");
      ready = static_cast<unsigned>(w[0] >> 32) == tag;
    } else {
      asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[0]), "=l"(w[1]) : "l"(src) : "memory");
      if constexpr (kFloats == 3)
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w[2]) : "l"(src + 2) : "memory");
      ready = static_cast<unsigned>(w[0] >> 32) == tag && static_cast<unsigned>(w[1] >> 32) == tag &&
              (kFloats == 2 || static_cast<unsigned>(w[2] >> 32) == tag);
    }
    if (ready) break;
    __nanosleep(32);
  }
  Acc v;
  float* f = reinterpret_cast<float*>(&v);
#pragma unroll
  for (int k = 0; k < kFloats; ++k) f[k] = __uint_as_float(static_cast<unsigned>(w[k]));
  return v;
}

// Waits for the group's CL partials of `call` and merges them in rank order
// (merge_in_order's order, as over a cluster's slots). Every warp of the row
// group fetches them itself (lanes 0..CL-1, one rank each) and merges them
// through shuffles (merge_lanes_in_order), so no barrier is needed.
template <int CL, int ROWS, int TPR, typename Acc>
__device__ __forceinline__ Acc grid_collect(unsigned long long* ex, unsigned base, int call, int group) {
  static_assert(TPR % 32 == 0 && CL <= 32, "a warp of the row group fetches every rank's partial");
  const int l = threadIdx.x & 31;
  Acc mine{};
  if (l < CL) mine = grid_poll<Acc>(grid_slot<CL, ROWS, Acc>(ex, call, group, l), call_tag(base, call));
  return merge_lanes_in_order<CL>(mine);
}

}  // namespace rtcnorm
