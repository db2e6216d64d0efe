// Backward for grids of few row blocks (kColumnGrads): dx and the affine
// gradients run side by side in one launch, on different CTAs.
//
// dW = sum(dy * xhat) and dB = sum(dy) need only the saved statistics
// (xhat = (x - mean) * rstd), never a row's dx sums. So the grid's first
// row_blocks CTAs compute dx, one row block each, exactly as norm_bwd.cuh
// does with no gradient wanted, while the CTAs after them (column CTAs) read
// x and dy again, column slice by column slice, and write dW / dB themselves
// in the weight dtype. No fp32 partial rows and no column reduce kernel: for
// a few rows, the partial rows cost as much traffic as the rows and the
// reduce a second launch's latency.
//
// Column CTA c owns vectors c * CV .. c * CV + CV - 1 (CV = p.col_vecs).
// Thread t is column lane t % CV and row lane l = t / CV of L = blockDim.x /
// CV lanes (threads past L * CV idle). Lane l sums rows l, l + L, l + 2L, ...
// in that order, kColumnRowsInFlight rows' loads in flight; then the lanes'
// sums meet in shared memory as a pairwise tree of fixed shape. No atomics:
// dW / dB are bitwise the same on every run for a given (M, N, CV, block).
//
// Invariants (ops/norm_plan.cpp, ops/norm_common.cpp):
// - gridDim.x = row_blocks + ceil(N / VEC / CV), with row_blocks no more than
//   one wave, so a row CTA's grid-stride loop visits its one row block only.
// - Dynamic shared memory holds 2 * blockDim.x * VEC floats (dW's lanes, then
//   dB's) beside whatever the row CTAs' plan needs.
// - Register rows (kCachedRow, not staged, no cluster), never with
//   kDirectGrads: the row CTAs write no gradient at all.
#pragma once

#include "common/norm_bwd_deferred.cuh"

namespace rtcnorm {

constexpr int kColumnRowsInFlight = 4;

template <int KIND, typename T, typename W, int N, int VEC, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd_column_grads(const NormBwdParams& p) {
  using PT = Pack<T, VEC>;
  constexpr int kVecs = N / VEC;
  constexpr bool kDw = (FLAGS & kWantDw) != 0;
  constexpr bool kDb = (FLAGS & kWantDb) != 0;
  constexpr int kRu = kColumnRowsInFlight;
  allow_dependents();
  extern __shared__ __align__(16) float smem[];
  const int cv = p.col_vecs;
  const int lanes = static_cast<int>(blockDim.x) / cv;
  const int c = static_cast<int>(threadIdx.x) % cv;
  const int l = static_cast<int>(threadIdx.x) / cv;
  const int v = static_cast<int>(blockIdx.x - p.row_blocks) * cv + c;
  const bool lane_ok = l < lanes;
  const long long col = 1LL * v * VEC;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);

  float dw[VEC], db[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) dw[j] = db[j] = 0.f;
  if (lane_ok && v < kVecs) {
    const long long step = 1LL * lanes;
#pragma unroll 1
    for (long long r0 = l; r0 < p.rows; r0 += kRu * step) {
      PT xv[kRu], dv[kRu];
      float rs[kRu], mu[kRu];
#pragma unroll
      for (int u = 0; u < kRu; ++u) {
        const long long row = r0 + u * step;
        if (row >= p.rows) continue;
        xv[u] = load_nc<T, VEC>(x, row_offset(p.x_map, row) + col);
        dv[u] = load_nc<T, VEC>(dy, row * N + col);
        rs[u] = __ldg(p.rstd + row);
        mu[u] = KIND == kLayerNorm ? __ldg(p.mean + row) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kRu; ++u) {
        if (r0 + u * step >= p.rows) continue;
        float xhat[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) xhat[j] = (elem_float(xv[u], j) - mu[u]) * rs[u];  // the row CTAs' bits
        add_affine_grads<T, VEC, kDw, kDb>(dv[u], xhat, dw, db);
      }
    }
  }

  // Pairwise tree over the row lanes: at step s, lane l < s adds lane l + s
  // (when that lane exists). Element j of thread t's sums sits at
  // j * blockDim.x + t (dW's, then dB's after VEC * blockDim.x floats), so a
  // warp's accesses are consecutive words: no bank conflicts. Every slot is
  // read and written by its own column's threads only, so the barriers are
  // the tree's only ordering.
  const int stride = static_cast<int>(blockDim.x);
  float* const sw = smem + threadIdx.x;
  float* const sb = sw + VEC * stride;
  if (lane_ok) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if constexpr (kDw) sw[j * stride] = dw[j];
      if constexpr (kDb) sb[j * stride] = db[j];
    }
  }
  int span = 1;
  while (span < lanes) span <<= 1;
  for (int s = span >> 1; s > 0; s >>= 1) {
    __syncthreads();
    if (l < s && l + s < lanes) {
      const int o = s * cv;  // lane l + s's slots, cv threads on
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if constexpr (kDw) sw[j * stride] = dw[j] = dw[j] + sw[j * stride + o];
        if constexpr (kDb) sb[j * stride] = db[j] = db[j] + sb[j * stride + o];
      }
    }
  }
  if (l == 0 && v < kVecs) {
    if constexpr (kDw) store<W, VEC>(static_cast<W*>(p.dw), col, from_floats<W, VEC>(dw));
    if constexpr (kDb) store<W, VEC>(static_cast<W*>(p.db), col, from_floats<W, VEC>(db));
  }
}

// The backward kernels' one body, for RMSNorm and LayerNorm alike: the
// deferred-statistics design, the column-gradient split above, or the
// persistent kernel of norm_bwd.cuh.
template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd_entry(const NormBwdParams& p) {
  if constexpr ((FLAGS & kDeferStats) != 0) {
    norm_bwd_deferred<KIND, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
  } else if constexpr ((FLAGS & kColumnGrads) != 0) {
    static_assert(
        (FLAGS & (kCachedRow | kStagedRow | kDirectGrads | kClusterBits | kCluster16 | kRowClusterBits)) == kCachedRow,
        "column CTAs pair with register rows of lone CTAs that write no gradient");
    if (blockIdx.x >= p.row_blocks)
      norm_bwd_column_grads<KIND, T, W, N, VEC, FLAGS>(p);
    else
      norm_bwd<KIND, T, W, N, VEC, TPR, ROWS, NV, FLAGS & ~(kWantDw | kWantDb | kColumnGrads)>(p);
  } else {
    norm_bwd<KIND, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
  }
}

}  // namespace rtcnorm
