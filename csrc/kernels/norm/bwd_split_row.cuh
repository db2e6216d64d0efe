// Design: the backward's split_row (coef and cols kernels). Shared by
// RMSNorm and LayerNorm.
//
// Backward for rows too long to keep in registers: a column-split pass pair
// instead of re-reading each row from L2 with a read-modify-write of the
// CTA's fp32 partial row per row (which bounds that design at ~35-40% of
// copy for N >= 32768).
//
// 1. norm_bwd_coef: one CTA per row streams x and dy once and writes the
//    row's two coefficients, c1 = mean(dy*g * xhat) and c2 = mean(dy*g)
//    (0 for RMSNorm), to row_coef[2 * row], row_coef[2 * row + 1].
// 2. norm_bwd_cols: CTA (bx, by) owns vector columns bx * CT .. bx * CT + CT-1
//    of every row in row tile by (rows by * rows_per_tile ..). Each thread
//    walks its rows top to bottom, RU rows in flight, writes dx and sums dW
//    (and dB) for its columns in fp32 registers, then writes its slice of
//    partial row `by`. column_reduce.cuh adds the row tiles in a fixed order:
//    no atomics, bitwise reproducible for a given (M, N, rows_per_tile).
//
// Traffic: x and dy are read twice from DRAM (5 units against the 3 a
// single pass moves), but every access is a fully coalesced stream with no
// dependence on L2 capacity, and the partial rows cost rows/rows_per_tile
// times N floats.
//
// Invariants (ops/norm/plan, ops/norm_common.cpp):
// - The same per-element arithmetic as norm/bwd_rows.cuh (dy*g rounded once, the
//   same c1/c2 formulas), so the two designs agree to rounding of the sums.
// - gridDim.y * rows_per_tile >= rows and every row tile holds >= 1 row.
// - On sm_90+ norm_bwd_cols and the column reduce are launched
//   programmatically (grid_dep.cuh): each waits for the previous grid before
//   touching memory.
#pragma once

#include "common/grid_dep.cuh"
#include "norm/bwd_common.cuh"

namespace rtcnorm {

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd_coef(const NormBwdParams& p) {
  using PT = Pack<T, VEC>;
  allow_dependents();
  constexpr int kVecs = N / VEC;
  constexpr int kChunk = TPR * NV;
  constexpr int kChunks = (kVecs + kChunk - 1) / kChunk;
  constexpr bool kEven = kVecs % kChunk == 0;
  constexpr float kInvN = 1.f / static_cast<float>(N);
  __shared__ GroupScratch<TPR, 1, Sum2> scratch;
  const int lane = threadIdx.x;
  const long long row = blockIdx.x;
  const long long xoff = row_offset<FLAGS>(p.x_map, row);
  const long long goff = row * N;
  const float rstd = p.rstd[row];
  const float mean = KIND == kLayerNorm ? p.mean[row] : 0.f;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);

  Sum2 s = {0.f, 0.f};
#pragma unroll 1
  for (int c = 0; c < kChunks; ++c) {
    PT xv[NV], dv[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = c * kChunk + i * TPR + lane;
      if (!(kEven || v < kVecs)) continue;
      xv[i] = load_nc<T, VEC>(x, xoff + 1LL * v * VEC);
      dv[i] = load_nc<T, VEC>(dy, goff + 1LL * v * VEC);
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = c * kChunk + i * TPR + lane;
      if (!(kEven || v < kVecs)) continue;
      add_row_terms<KIND, T, W, VEC, FLAGS>(p.weight, v, xv[i], dv[i], mean, rstd, s);
    }
  }
  s = group_allreduce<TPR, 1>(s, scratch);
  if (lane == 0) {
    p.row_coef[2 * row] = s.a * kInvN;
    p.row_coef[2 * row + 1] = KIND == kLayerNorm ? s.b * kInvN : 0.f;
  }
}

template <int KIND, typename T, typename W, int N, int VEC, int CT, int RU, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd_cols(const NormBwdParams& p) {
  using PT = Pack<T, VEC>;
  constexpr int kVecs = N / VEC;
  constexpr bool kDw = (FLAGS & kWantDw) != 0;
  constexpr bool kDb = (FLAGS & kWantDb) != 0;
  constexpr bool kDh = (FLAGS & kGradDh) != 0;
  constexpr bool kCs = (FLAGS & kStreamStore) != 0;
  // Launched programmatically after norm_bwd_coef (sm_90+): row_coef is read
  // only after that grid has completed.
  grid_dependency_wait();
  allow_dependents();
  const int v = blockIdx.x * CT + threadIdx.x;
  if (v >= kVecs) return;  // no barriers below: idle columns may leave
  const long long r0 = 1LL * blockIdx.y * p.rows_per_tile;
  const long long r1 = r0 + p.rows_per_tile < p.rows ? r0 + p.rows_per_tile : p.rows;
  const long long col = 1LL * v * VEC;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const T* dh = static_cast<const T*>(p.dh);
  T* dx = static_cast<T*>(p.dx);

  float g[VEC];
  load_gamma<W, VEC, FLAGS>(p.weight, v, g);
  float dw[VEC], db[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) dw[j] = db[j] = 0.f;

#pragma unroll 1
  for (long long r = r0; r < r1; r += RU) {
    PT xv[RU], dv[RU], hv[kDh ? RU : 1];
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      const long long row = r + u;
      if (row >= r1) continue;
      xv[u] = load_nc<T, VEC>(x, row_offset<FLAGS>(p.x_map, row) + col);
      dv[u] = load_nc<T, VEC>(dy, row * N + col);
      if constexpr (kDh) hv[u] = load_nc<T, VEC>(dh, row * N + col);
    }
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      const long long row = r + u;
      if (row >= r1) continue;
      const float rstd = __ldg(p.rstd + row);
      const float mean = KIND == kLayerNorm ? __ldg(p.mean + row) : 0.f;
      const float c1 = __ldg(p.row_coef + 2 * row);
      const float c2 = KIND == kLayerNorm ? __ldg(p.row_coef + 2 * row + 1) : 0.f;
      float xm[VEC], df[VEC], xhat[VEC];
      to_floats<T, VEC>(xv[u], xm);
      to_floats<T, VEC>(dv[u], df);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        xm[j] -= mean;
        xhat[j] = xm[j] * rstd;  // the coefficient kernel's bits
      }
      store<T, VEC, kCs>(dx, row * N + col,
                         input_grad<KIND, N, T, VEC, kDh>(xm, df, g, dx_coef<KIND>(c1, c2, rstd), hv[kDh ? u : 0]));
      add_affine_grads<T, VEC, kDw, kDb>(dv[u], xhat, dw, db);
    }
  }
  const long long prow = 1LL * blockIdx.y * N + col;
  Pack<float, VEC> a, b;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    a.e[j] = dw[j];
    b.e[j] = db[j];
  }
  if constexpr (kDw) store<float, VEC>(p.partial_w, prow, a);
  if constexpr (kDb) store<float, VEC>(p.partial_b, prow, b);
}

}  // namespace rtcnorm
