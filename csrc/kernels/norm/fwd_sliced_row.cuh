// Design: the forward's sliced_row with deferred statistics and a staged
// ring (cluster or grid-exchange slices). Shared by RMSNorm and LayerNorm.
//
// Forward of column-slice rows staged through shared memory, with the
// slices' exchange of statistics taken off the critical path
// (kClusterBits with kStagedRow and kDeferStats, sm_90+, persistent grid).
//
// In norm/fwd_rows.cuh a slice CTA sums its slice of row block k, publishes the
// partial and waits for its peers' before it can write y of k: every row
// block waits on the slowest CTA of the slice group, whose loads set the
// pace, and the CTA's row sits in registers meanwhile. Here CTA iteration k
//   1. waits for its own copies of row block k and sums its slice,
//   2. collects the group's partials of row block k - 1 (published one
//      iteration ago, so normally long complete) and publishes those of k,
//   3. writes y (and the statistics) of row block k - 1 from the ring,
//   4. starts the copies of row block k + S - 1 into the stage k - 1 left.
// After the last row block, the partials of the last are collected and its y
// written. The ring holds S >= 3 stages: one row block being finished, one
// being summed, S - 2 in flight (norm/bwd_sliced_row.cuh is the
// backward's loop of the same shape).
//
// Invariants:
// - Same arithmetic in the same order as norm_fwd's slice path (one chunk's
//   of_chunk merged into an empty accumulator, the same row reduction, the
//   same rank-order merge, the same normalize step), so y, rstd and mean are
//   bitwise the same.
// - Collects and publishes alternate with no row-group barrier between
//   collect k - 1 and publish k, so slots cycle through three sets
//   (common/cluster.cuh gives why).
// - Each thread copies exactly the ring vectors it reads back, and a stage is
//   refilled only after this thread's last read of it (its y in step 3), so
//   the ring needs no barrier of its own.
// - The row loop is uniform across the slice group: every CTA collects every
//   call its peers publish.
#pragma once

#include "norm/fwd_common.cuh"
#include "norm/slice_exchange.cuh"
#include "norm/stats_guard.cuh"

namespace rtcnorm {

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_fwd_deferred(const NormFwdParams& p) {
  using Stats = NormStats<KIND>;
  using Acc = typename Stats::Acc;
  using PT = Pack<T, VEC>;
  constexpr int kCl = column_cluster_ctas<FLAGS>();
  constexpr int kVecs = N / VEC / kCl;
  constexpr bool kEven = kVecs % (TPR * NV) == 0;
  constexpr int kStages = 2 + static_cast<int>((FLAGS & kRingExtraBits) >> kRingExtraShift);
  constexpr bool kGrid = (FLAGS & kGridExchange) != 0;
  constexpr bool kCs = (FLAGS & kStreamStore) != 0;
  using Red = typename Select<equal_count_merge<KIND, TPR, kEven>(), MeanM2Eq, Acc>::type;
  static_assert(kCl > 1, "the exchange being deferred is a row's slices'");
  static_assert((N / VEC) % kCl == 0, "the ring stages equal slices");
  static_assert(kVecs <= TPR * NV, "a staged slice is one chunk");
  static_assert((FLAGS & kResidual) == 0, "no residual: the ring holds x alone");
  static_assert(sizeof(PT) == 16, "the ring is filled in 16-byte copies");

  extern __shared__ __align__(16) unsigned char norm_dyn_smem[];
  __shared__ GroupScratch<TPR, ROWS, Red> scratch;
  using Exchange = SliceExchange<kCl, ROWS, TPR, Red, kGrid>;
  __shared__ typename Exchange::Scratch cscratch;
  const Exchange ex(cscratch, p.exchange, p.exchange_base);
  const long long cluster = ex.slice_group, clusters = ex.slice_groups;
  const int lane = ex.lane;
  const int group = ex.group;
  const int vbase = ex.rank * kVecs;
  const long long col0 = 1LL * vbase * VEC;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  // Stage s of this row group: kVecs vectors, the CTA's row groups side by side.
  PT* const ring = reinterpret_cast<PT*>(norm_dyn_smem) + group * kVecs;
  const auto stage_at = [&](int s) { return ring + s * ROWS * kVecs; };

  // Starts the copies of this thread's vectors of row block rb into stage s
  // (none past the last row) and closes its group of copies: every thread
  // commits one group per call.
  const auto fill = [&](int s, long long rb) {
    const long long row = rb * ROWS + group;
    if (rb < p.row_blocks && row < p.rows) {
      const PT* src = reinterpret_cast<const PT*>(x + row_offset<FLAGS>(p.x_map, row) + col0);
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = i * TPR + lane;
        if (kEven || v < kVecs) cp_async(stage_at(s) + v, src + v);
      }
    }
    cp_async_commit();
  };

  struct RowRef {
    long long row;
    bool ok;
  };
  // y and the statistics of a row block whose group partials `red` are
  // complete, from its stage.
  const auto write_y = [&](const RowRef& r, int s, Red red) {
    float mean, rstd;
    Stats::finish(AccAs<Acc>::from(red), N, p.eps, mean, rstd);
    if (!r.ok) return;
    // Overflowed sums (norm/stats_guard.cuh).
    guard_stats<KIND, T, false>(
        [&] {
          return GuardRow<T>{x + row_offset<FLAGS>(p.x_map, r.row), x};
        },
        N, p.eps, mean, rstd);
    if (lane == 0 && ex.rank == 0) {
      p.rstd[r.row] = rstd;
      if (KIND == kLayerNorm && p.mean != nullptr) p.mean[r.row] = mean;
    }
    const long long yoff = r.row * N + col0;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      if (!(kEven || v < kVecs)) continue;
      const PT xv = stage_at(s)[v];
      float g[VEC], b[VEC];
      load_affine<W, VEC, FLAGS>(p, vbase + v, g, b);
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = fmaf((elem_float(xv, j) - mean) * rstd, g[j], b[j]);
      store<T, VEC, kCs>(y, yoff + 1LL * v * VEC, from_floats<T, VEC>(out));
    }
  };

#pragma unroll
  for (int s = 0; s + 1 < kStages; ++s) fill(s, cluster + s * clusters);

  const auto row_at = [&](long long rb) { return RowRef{rb * ROWS + group, rb * ROWS + group < p.rows}; };
  // The row group's reduced statistics of a row block, from its stage.
  const auto sum = [&](const RowRef& r, int s) {
    PT xv[NV];
    bool ok[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      ok[i] = r.ok && (kEven || v < kVecs);
      if (ok[i]) xv[i] = stage_at(s)[v];
    }
    const Acc acc = merge(Stats::empty(), Stats::template of_chunk<T, VEC, NV>(xv, ok));
    return group_allreduce<TPR, ROWS>(AccAs<Red>::from(acc), scratch);
  };
  deferred_ring_loop<kStages>(ex, cluster, p.row_blocks, clusters, row_at, sum, write_y, fill);
}

}  // namespace rtcnorm
