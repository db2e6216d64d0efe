// Design: the backward's sliced_row with deferred statistics (cluster or
// grid-exchange slices). Shared by RMSNorm and LayerNorm.
//
// Backward of staged column-cluster rows (kStagedRow with kClusterBits and
// kDeferStats, sm_90+), with the cluster's exchange of row sums taken off the
// critical path.
//
// In norm/bwd_rows.cuh a cluster CTA sums its slice of row block k, publishes the
// sums and waits for its peers' before it can write dx of k: every row block
// waits on the slowest CTA of the cluster, whose copies set the pace. Here
// CTA iteration k
//   1. waits for its own copies of row block k and sums its slice
//      (adding the dW / dB terms, which need only the saved statistics),
//   2. collects the cluster's sums of row block k - 1 (published one
//      iteration ago, so normally long complete) and publishes those of k,
//   3. writes dx of row block k - 1 from the ring,
//   4. starts the copies of row block k + S - 1 into the stage k - 1 left.
// After the last row block, the sums of the last are collected and its dx
// written. The ring holds S >= 3 stages: one row block being finished, one
// being summed, S - 2 in flight.
//
// Invariants:
// - Same arithmetic in the same order as norm_bwd's cluster path (the same
//   element_terms, the same rank-order merge, dW / dB summed over row blocks
//   in the same order), so dx, dW and dB are bitwise the same.
// - Collects and publishes alternate in every thread: iteration k collects
//   call k - 1, then publishes call k, with no row-group barrier between
//   them, so slots and mbarriers cycle through three sets (common/cluster.cuh
//   gives why; two let a warp of a peer still read call k - 1 while that
//   peer's first warp has published k and another CTA overwrites k - 1's
//   slot with k + 1).
// - Each thread copies exactly the ring vectors it reads back, and a stage is
//   refilled only after this thread's last read of it (its dx in step 3).
// - The row loop is uniform across the cluster (every CTA of a cluster walks
//   the same row blocks): every CTA collects every call its peers publish.
// - kGridExchange: the CL slices are CL consecutive CTAs of a cooperative
//   launch rather than a hardware cluster, and the sums meet through global
//   memory (common/grid_exchange.cuh) with the same call sequence and the
//   same rank-order merge: bitwise the same results as the cluster.
#pragma once

#include "common/grid_dep.cuh"
#include "norm/bwd_common.cuh"
#include "norm/slice_exchange.cuh"

namespace rtcnorm {

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd_deferred(const NormBwdParams& p) {
  using PT = Pack<T, VEC>;
  allow_dependents();
  constexpr int kCl = column_cluster_ctas<FLAGS>();
  constexpr int kSlice = N / kCl;
  constexpr int kVecs = kSlice / VEC;
  constexpr bool kEven = kVecs % (TPR * NV) == 0;
  constexpr bool kDw = (FLAGS & kWantDw) != 0;
  constexpr bool kDb = (FLAGS & kWantDb) != 0;
  constexpr bool kDh = (FLAGS & kGradDh) != 0;
  constexpr bool kCs = (FLAGS & kStreamStore) != 0;
  constexpr int kStages = 2 + static_cast<int>((FLAGS & kRingExtraBits) >> kRingExtraShift);
  constexpr float kInvN = 1.f / static_cast<float>(N);
  constexpr bool kGrid = (FLAGS & kGridExchange) != 0;
  static_assert(kCl > 1, "the exchange being deferred is a column cluster's");
  static_assert((N / VEC) % kCl == 0, "the ring stages equal slices");
  static_assert((FLAGS & kStagedRow) != 0 && (FLAGS & kCachedRow) != 0, "rows are staged in the ring");
  static_assert((FLAGS & kKeepTerms) == 0, "no kept terms");
  static_assert(kVecs <= TPR * NV, "a staged slice is one chunk");

  extern __shared__ __align__(16) float smem[];
  __shared__ GroupScratch<TPR, ROWS, Sum2> scratch;
  using Exchange = SliceExchange<kCl, ROWS, TPR, Sum2, kGrid>;
  __shared__ typename Exchange::Scratch cscratch;
  const Exchange ex(cscratch, p.exchange, p.exchange_base);
  const long long cluster = ex.slice_group, clusters = ex.slice_groups;
  const int lane = ex.lane;
  const int group = ex.group;
  const int vbase = ex.rank * kVecs;
  const long long col0 = 1LL * vbase * VEC;
  T* dx = static_cast<T*>(p.dx);
  const StagingRing<T, N, VEC, TPR, ROWS, NV, kVecs, kDh ? 3 : 2, FLAGS> ring{reinterpret_cast<PT*>(smem) +
                                                                              group * kVecs};

  // A row block of this group: its row, where its gradient goes, its saved
  // statistics.
  struct RowRef {
    long long goff;
    float mean, rstd;
    bool ok;
  };
  const auto row_ref = [&](long long rb) {
    const long long row = rb * ROWS + group;
    const bool ok = rb < p.row_blocks && row < p.rows;
    return RowRef{row * N + col0, (KIND == kLayerNorm && ok) ? p.mean[row] : 0.f, ok ? p.rstd[row] : 0.f, ok};
  };
#pragma unroll
  for (int s = 0; s + 1 < kStages; ++s) ring.fill(s, cluster + s * clusters, p, group, col0, lane);

  float dw_acc[kDw ? NV : 1][VEC];
  float db_acc[kDb ? NV : 1][VEC];
#pragma unroll
  for (int i = 0; i < NV; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      dw_acc[kDw ? i : 0][j] = 0.f;
      db_acc[kDb ? i : 0][j] = 0.f;
    }

  // dx of a row block whose cluster sums `s` are complete, from its stage.
  const auto write_dx = [&](const RowRef& r, int stage, Sum2 s) {
    const DxCoef k = dx_coef<KIND>(s.a * kInvN, s.b * kInvN, r.rstd);
    if (!r.ok) return;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      if (!(kEven || v < kVecs)) continue;
      float g[VEC];
      load_gamma<W, VEC, FLAGS>(p.weight, vbase + v, g);
      PT hv{};
      if constexpr (kDh) hv = ring.at(stage, 2)[v];
      store<T, VEC, kCs>(
          dx, r.goff + 1LL * v * VEC,
          input_grad<KIND, N, T, VEC, kDh>(ring.at(stage, 0)[v], ring.at(stage, 1)[v], g, r.mean, k, hv));
    }
  };

  // The row group's reduced sums of a row block from its stage, adding its
  // dW / dB terms to the thread's partials.
  const auto sum = [&](const RowRef& r, int stage) {
    Sum2 s = {0.f, 0.f};
    if (r.ok) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = i * TPR + lane;
        if (!(kEven || v < kVecs)) continue;
        const PT dv = ring.at(stage, 1)[v];
        float g[VEC], xm[VEC], df[VEC], wdy[VEC], xhat[VEC];
        load_gamma<W, VEC, FLAGS>(p.weight, vbase + v, g);
        element_terms<KIND, T, VEC>(ring.at(stage, 0)[v], dv, g, r.mean, r.rstd, s, xm, df, wdy, xhat);
        add_affine_grads<T, VEC, kDw, kDb>(dv, xhat, dw_acc[kDw ? i : 0], db_acc[kDb ? i : 0]);
      }
    }
    return group_allreduce<TPR, ROWS>(s, scratch);
  };
  const auto fill = [&](int stage, long long rb) { ring.fill(stage, rb, p, group, col0, lane); };
  deferred_ring_loop<kStages>(ex, cluster, p.row_blocks, clusters, row_ref, sum, write_dx, fill);
  __syncthreads();  // the partial-row combine reuses the ring
  constexpr bool kDirect = (FLAGS & kDirectGrads) != 0;
  float* pw = p.partial_w + cluster * N + col0;
  float* pb = p.partial_b + cluster * N + col0;
  if constexpr (kDw)
    write_partial_row<kSlice, VEC, TPR, ROWS, NV, W, kDirect>(dw_acc, pw, static_cast<W*>(p.dw) + col0, smem);
  if constexpr (kDb)
    write_partial_row<kSlice, VEC, TPR, ROWS, NV, W, kDirect>(db_acc, pb, static_cast<W*>(p.db) + col0, smem);
}

}  // namespace rtcnorm
