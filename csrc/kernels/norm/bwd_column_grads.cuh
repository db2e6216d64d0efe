// Design: the backward's column_grads.
//
// Backward for grids of few row blocks (kColumnGrads): dx and the affine
// gradients run side by side in one launch, on different CTAs.
//
// dW = sum(dy * xhat) and dB = sum(dy) need only the saved statistics
// (xhat = (x - mean) * rstd), never a row's dx sums. So the grid's first
// row_blocks CTAs compute dx, one row block each, exactly as norm/bwd_rows.cuh
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
// sums meet in one shared-memory exchange of fixed order
// (column_lanes_reduce). No atomics: dW / dB are bitwise the same on every
// run for a given (M, N, CV, block).
//
// Invariants (ops/norm/plan, ops/norm_common.cpp):
// - gridDim.x = row_blocks + ceil(N / VEC / CV) exceeds row_blocks, so a row
//   CTA's grid-stride loop visits its one row block only. row_blocks is at
//   most the SMs, or the whole grid fits the SMs at once (one-wave grids):
//   no CTA waits on another either way.
// - Dynamic shared memory holds 2 * blockDim.x * VEC floats (dW's lane sums,
//   then dB's) beside whatever the row CTAs' plan needs.
// - blockDim.x is a whole number of warps (the exchange shuffles whole warps).
// - Register rows (kCachedRow, not staged, no cluster), never with
//   kDirectGrads: the row CTAs write no gradient at all.
#pragma once

#include "common/grid_dep.cuh"
#include "norm/bwd_common.cuh"

namespace rtcnorm {

constexpr int kColumnRowsInFlight = 4;

// The column CTA's lane sums meet in one exchange through shared memory.
// Each thread of a row lane that holds a row (l < used) stores its sums
// element-major: sum q of thread t (dW's element j is q = j, dB's follow
// dW's) sits at q * blockDim.x + t, so a warp stores consecutive words.
// After one barrier, output o = q * cv + c (sum q of column vector c) is
// added up by G consecutive threads: part k adds lanes k, k + G, k + 2G, ...
// in that order, then the G parts meet in a butterfly of warp shuffles. G is
// the largest power of two up to 32 / cv (1 where cv >= 32; cv is a power of
// two) with G threads for every output in the CTA, so all outputs take one
// round where the CTA has the threads. At G = 32 / cv a warp holds cv
// outputs of one q, each load covering 32 consecutive words (no bank
// conflicts); a smaller G spreads a warp over 32 / (G * cv) sums q, at that
// many ways of conflict. Every sum's order is fixed by (rows, blockDim, cv):
// no atomics, the same bits on every run.
template <typename W, int VEC, int VECS, bool kDw, bool kDb>
__device__ __forceinline__ void column_lanes_reduce(const NormBwdParams& p, const float (&dw)[VEC],
                                                    const float (&db)[VEC], int l, int lanes, int first_vec) {
  extern __shared__ __align__(16) float smem[];
  constexpr int kSets = (kDw ? 1 : 0) + (kDb ? 1 : 0);
  constexpr int kDbAt = kDw ? VEC : 0;  // dB's first sum
  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int cv = p.col_vecs;
  const int used = static_cast<int>(min(static_cast<long long>(lanes), p.rows));
  if (l < used) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if constexpr (kDw) smem[j * threads + tid] = dw[j];
      if constexpr (kDb) smem[(kDbAt + j) * threads + tid] = db[j];
    }
  }
  __syncthreads();
  const int outputs = kSets * VEC * cv;
  int g = 1;
  while (2 * g * cv <= 32 && 2 * g * outputs <= threads) g <<= 1;
  const int part = tid & (g - 1);
  const int per_round = threads / g;
  // Rounds are uniform over the CTA: whole warps take part in the shuffles.
  for (int o0 = 0; o0 < outputs; o0 += per_round) {
    const int o = o0 + tid / g;
    const bool out_ok = o < outputs;
    const int q = out_ok ? o / cv : 0;
    const int c = o - q * cv;
    float s = 0.f;
    if (out_ok) {
      const float* slot = smem + q * threads + c;
      for (int k = part; k < used; k += g) s += slot[k * cv];
    }
    for (int m = 1; m < g; m <<= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    const int v = first_vec + c;
    if (out_ok && part == 0 && v < VECS) {
      const bool is_db = !kDw || q >= VEC;
      W* const out = static_cast<W*>(is_db ? p.db : p.dw);
      out[1LL * v * VEC + (q - (is_db ? kDbAt : 0))] = from_float<W>(s);
    }
  }
}

template <int KIND, typename T, typename W, int N, int VEC, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd_column_grads(const NormBwdParams& p) {
  using PT = Pack<T, VEC>;
  constexpr int kVecs = N / VEC;
  constexpr bool kDw = (FLAGS & kWantDw) != 0;
  constexpr bool kDb = (FLAGS & kWantDb) != 0;
  constexpr int kRu = kColumnRowsInFlight;
  allow_dependents();
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
        xv[u] = load_nc<T, VEC>(x, row_offset<FLAGS>(p.x_map, row) + col);
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

  column_lanes_reduce<W, VEC, kVecs, kDw, kDb>(p, dw, db, l, lanes, v - c);
}

}  // namespace rtcnorm
