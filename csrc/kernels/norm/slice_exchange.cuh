// The exchange of a row's column slices in the deferred loops (forward:
// norm/fwd_sliced_row.cuh, backward: norm/bwd_sliced_row.cuh),
// which collect call k - 1 and publish call k back to back, and the ring
// loop both run (deferred_ring_loop).
//
// Invariants:
// - The CL slices are a thread-block cluster whose partials are pushed into
//   each CTA's shared memory (common/cluster.cuh), or with GRID consecutive
//   CTAs of a cooperative launch whose partials meet as tagged words in
//   global memory (common/grid_exchange.cuh). Both merge in rank order, so
//   they give bitwise the same results.
// - Three slot sets: no row-group barrier separates collect k - 1 from
//   publish k (common/cluster.cuh gives why two would not do).
// - Every thread of the CTA constructs the exchange before the first publish
//   (a cluster's mbarriers are set up there) and calls exit() after the last
//   collect.
#pragma once

#include "common/cluster.cuh"
#include "common/grid_exchange.cuh"
#include "common/vec.cuh"

namespace rtcnorm {

template <int CL, int ROWS, int TPR, typename Acc, bool GRID>
struct SliceExchange {
  using Scratch = ClusterScratch<GRID ? 1 : CL, ROWS, Acc, 3>;
  Scratch& scratch;           // the cluster's slots (unused by a grid group)
  long long slice_group;      // this CTA's group of CL slices (CL consecutive CTAs)
  long long slice_groups;     // the grid's groups: the row-block stride
  unsigned long long* words;  // GRID: this group's part of p.exchange
  unsigned tag_base;          // GRID: the launch's p.exchange_base
  int rank;                   // this CTA's slice of the row
  int group, lane;            // the thread's row group (TPR threads a row) and place in it

  __device__ __forceinline__ SliceExchange(Scratch& s, unsigned* exchange, unsigned base)
      : scratch(s),
        slice_group(blockIdx.x / CL),
        slice_groups(gridDim.x / CL),
        words(GRID ? grid_exchange_of<CL, ROWS, Acc>(exchange, blockIdx.x / CL) : nullptr),
        tag_base(base),
        rank(GRID ? static_cast<int>(blockIdx.x % CL) : cluster_rank<CL>()),
        group(threadIdx.x / TPR),
        lane(threadIdx.x % TPR) {
    if constexpr (!GRID) cluster_exchange_init(scratch);
  }

  __device__ __forceinline__ void publish(Acc v, int call) const {
    if constexpr (GRID)
      grid_publish<CL, ROWS>(v, words, tag_base, rank, call, group, lane);
    else
      cluster_publish<CL, ROWS, TPR>(v, scratch, call, group, lane);
  }

  __device__ __forceinline__ Acc collect(int call) const {
    if constexpr (GRID)
      return grid_collect<CL, ROWS, TPR, Acc>(words, tag_base, call, group);
    else
      return cluster_collect<CL, ROWS>(Acc{}, scratch, call, group);
  }

  // After the last collect; `calls` is the number of publishes.
  __device__ __forceinline__ void exit(int calls) const {
    if constexpr (!GRID) cluster_exit<CL>(calls);
  }
};

// The deferred loop over this slice group's row blocks first, first + stride,
// ... < count, through a ring of S stages of cp.async copies (S - 1 filled
// before the call). Iteration k waits for row block k's copies, sums it
// (sum(row, stage) -> the row group's reduced partial), collects call k - 1
// and publishes call k back to back, finishes row block k - 1 from its stage
// (finish(row, stage, collected)), and refills the stage k - 1 freed with
// row block k + S - 1 (fill(stage, rb), which commits one copy group per
// call). The last row block is finished after the loop, then the exchange
// exits. RowT is the caller's row handle (row_at(rb)); its value-initialised
// form stands for "no row yet".
template <int S, typename Exchange, typename RowAt, typename Sum, typename Finish, typename Fill>
__device__ __forceinline__ void deferred_ring_loop(const Exchange& ex, long long first, long long count,
                                                   long long stride, RowAt row_at, Sum sum, Finish finish, Fill fill) {
  static_assert(S >= 3, "one stage being finished, one being summed, one in flight");
  decltype(row_at(first)) pending{};  // the row block waiting for its group's partials
  int pending_stage = 0;              // and its ring stage
  int stage = 0;
  int calls = 0;
  for (long long rb = first; rb < count; rb += stride) {
    const auto r = row_at(rb);
    cp_async_wait<S - 2>();  // row block rb's copies have landed; S - 2 later ones fly
    const auto part = sum(r, stage);
    if (calls > 0) {
      const auto done = ex.collect(calls - 1);
      ex.publish(part, calls);
      finish(pending, pending_stage, done);
    } else {
      ex.publish(part, calls);
    }
    ++calls;
    pending = r;
    pending_stage = stage;
    // The stage of the row block just finished (none before the first) takes
    // row block rb + (S - 1) * stride.
    fill(stage == 0 ? S - 1 : stage - 1, rb + (S - 1) * stride);
    stage = stage + 1 == S ? 0 : stage + 1;
  }
  if (calls > 0) finish(pending, pending_stage, ex.collect(calls - 1));
  ex.exit(calls);
}

}  // namespace rtcnorm
