// Design: flat_row, forward and backward. Shared by RMSNorm and LayerNorm
// (the KIND policy).
//
// For rows whose width allows no 16-byte vector (N odd, or not a multiple of
// 16 bytes): a contiguous (rows x N) tensor is one flat array, so a row block
// (ROWS consecutive rows) is one contiguous range of it. The CTA copies that
// range into shared memory in 16-byte pieces (cp.async) whatever N is, works
// on its rows there in VEC-wide vectors (VEC: the widest vector dividing N),
// writes the outputs in place and copies the range back out in 16-byte
// pieces. Global memory sees only 16-byte accesses, except the pieces a row
// block shares with its neighbours and the tensor's last piece, which go
// element by element.
//
// Invariants (the host's planner guarantees them; see ops/norm/plan):
// - Every row tensor is contiguous rows x N (row r at r * N) from a 16-byte
//   aligned base: x and the residual in the forward, x, dy and dh in the
//   backward; y, h and dx are the launcher's own allocations.
// - A thread holds its vectors of a row in registers: N / VEC <= TPR * NV.
// - A ring of kFlatStages stages (common/params.cuh): the copies of the
//   CTA's next row block are in flight while it works on the current one.
//   A stage holds one buffer of flat_buffer_elems elements a row tensor.
// - A quantized forward (kQuantBits) writes its codes and scales straight
//   from registers through norm/quant_epilogue.cuh; only h goes through the
//   stage.
// - The arithmetic is the register-row designs' (norm/fwd_common.cuh,
//   norm/bwd_common.cuh): the same operations in the same order a row. The
//   backward's second pass reads x and dy from the stage again (dx as the
//   re-reading designs form it).
// - Backward: each CTA sums dW / dB of its columns in registers over every row
//   block it visits and writes one partial row (or, alone, the gradients), as
//   norm/bwd_rows.cuh does; the column reduce that follows is unchanged.
//   Gamma stays in registers with kKeepGamma; without it, each use reads it
//   again (from L1), so a thread holds a register less an element and wider
//   rows fit.
#pragma once

#include "common/grid_dep.cuh"
#include "norm/bwd_common.cuh"
#include "norm/quant_epilogue.cuh"
#include "norm/stats_guard.cuh"

namespace rtcnorm {

// Elements of a 16-byte piece.
template <typename T>
__host__ __device__ constexpr int flat_piece() {
  return 16 / static_cast<int>(sizeof(T));
}

// Row block rb's range [begin, end) of the flat tensor; buffer element 0 is
// tensor element `first` (begin rounded down to a piece).
struct FlatBlock {
  long long begin, end, first;
};

template <typename T>
__device__ __forceinline__ FlatBlock flat_block(long long rb, int rows_per_block, long long rows, int n) {
  const long long begin = rb * rows_per_block * n;
  const long long last = (rb + 1) * rows_per_block < rows ? (rb + 1) * rows_per_block : rows;
  return {begin, last * n, begin & ~static_cast<long long>(flat_piece<T>() - 1)};
}

// Starts the copies of block b of `src` into `dst` (every thread of the CTA
// takes every blockDim.x-th piece). A piece reaching past the tensor's
// `total` elements is copied element by element; the piece before `begin`
// lies inside the tensor (begin > 0 there), so it is read whole. A block
// spans fewer than 2^31 elements (it fits shared memory): offsets from
// b.first are 32-bit.
template <typename T>
__device__ __forceinline__ void flat_stage(T* dst, const T* src, const FlatBlock& b, long long total) {
  constexpr int kP = flat_piece<T>();
  using Piece = Pack<T, kP>;
  const T* const from = src + b.first;
  const int pieces = static_cast<int>((b.end - b.first + kP - 1) / kP);
  const long long inside = (total - b.first) / kP;  // pieces wholly inside the tensor
  const int whole = inside < pieces ? static_cast<int>(inside) : pieces;
  for (int q = threadIdx.x; q < pieces; q += blockDim.x) {
    if (q < whole) {
      cp_async(reinterpret_cast<Piece*>(dst) + q, reinterpret_cast<const Piece*>(from) + q);
    } else {
      const int left = static_cast<int>(total - b.first - static_cast<long long>(q) * kP);  // < kP here
      for (int j = 0; j < kP && j < left; ++j) dst[q * kP + j] = from[q * kP + j];
    }
  }
}

// Copies block b of the buffer `src` out to `dst`: whole pieces as 16-byte
// stores, the pieces it shares with the neighbouring blocks element by
// element (only its own elements: a neighbour's CTA writes the rest).
// Pieces [lo, hi) lie wholly in [begin, end).
template <typename T, bool STREAMING>
__device__ __forceinline__ void flat_flush(T* dst, const T* src, const FlatBlock& b) {
  constexpr int kP = flat_piece<T>();
  using Piece = Pack<T, kP>;
  T* const to = dst + b.first;
  const int own = static_cast<int>(b.begin - b.first), end = static_cast<int>(b.end - b.first);
  const int pieces = (end + kP - 1) / kP, lo = own == 0 ? 0 : 1, hi = end / kP;
  for (int q = threadIdx.x; q < pieces; q += blockDim.x) {
    if (q >= lo && q < hi) {
      store<T, kP, STREAMING>(to, q * kP, reinterpret_cast<const Piece*>(src)[q]);
    } else {
      for (int j = q * kP; j < q * kP + kP; ++j)
        if (j >= own && j < end) to[j] = src[j];
    }
  }
}

// The ring shared by both directions: a persistent CTA visits row blocks
// blockIdx.x, + gridDim.x, ...; the copies of `src`'s K tensors for the next
// block start before it works on the current one (src: K pointers at least). `before(rb)` runs while
// the stage's copies land (loads that need no stage); then
// `body(rb, block, stage, before's value)` works on the stage and flushes it.
template <typename T, int K, int BUF, typename Before, typename Body>
__device__ __forceinline__ void flat_ring(T* stages, const T* const* src, long long row_blocks, int rows_per_block,
                                          long long rows, int n, Before before, Body body) {
  const long long total = rows * n;
  const auto fill = [&](int s, long long rb) {
    if (rb < row_blocks) {
      const FlatBlock b = flat_block<T>(rb, rows_per_block, rows, n);
#pragma unroll
      for (int t = 0; t < K; ++t) flat_stage<T>(stages + (s * K + t) * BUF, src[t], b, total);
    }
    cp_async_commit();
  };
  int s = 0;
#pragma unroll
  for (int k = 0; k + 1 < kFlatStages; ++k) fill(k, blockIdx.x + 1LL * k * gridDim.x);
  for (long long rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
    fill(s == 0 ? kFlatStages - 1 : s - 1, rb + 1LL * (kFlatStages - 1) * gridDim.x);
    const auto early = before(rb);
    cp_async_wait<kFlatStages - 1>();
    __syncthreads();  // every thread's copies of this stage have landed
    body(rb, flat_block<T>(rb, rows_per_block, rows, n), stages + s * K * BUF, early);
    __syncthreads();  // the stage is read out before the next fill reuses it
    s = s + 1 == kFlatStages ? 0 : s + 1;
  }
  cp_async_wait<0>();
}

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_fwd_flat(const NormFwdParams& p) {
  using PT = Pack<T, VEC>;
  using Stats = NormStats<KIND>;
  constexpr int kVecs = N / VEC;
  constexpr bool kRes = (FLAGS & kResidual) != 0;
  constexpr bool kCs = (FLAGS & kStreamStore) != 0;
  constexpr int kTensors = kRes ? 2 : 1;  // x (h written in its place), residual (y in its place)
  constexpr int kBuf = flat_buffer_elems(ROWS, N, sizeof(T));
  static_assert(N % VEC == 0 && kVecs <= TPR * NV, "a thread holds its vectors of a row");
  static_assert((FLAGS & (kClusterBits | kCluster16 | kGridExchange)) == 0, "a flat row block is one CTA's");
  using Quant = QuantEpilogue<T, N, VEC, TPR, FLAGS>;
  Quant quant_out(p);

  __shared__ GroupScratch<TPR, ROWS, Sum1> scratch;
  extern __shared__ __align__(16) unsigned char norm_dyn_smem[];
  T* const stages = reinterpret_cast<T*>(norm_dyn_smem);
  constexpr bool kFlat = flat_lanes<TPR, ROWS>();
  const int lane = kFlat ? threadIdx.x : threadIdx.x % TPR;
  const int group = kFlat ? 0 : threadIdx.x / TPR;
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.residual);

  // gamma / beta of this thread's columns, the same for every row.
  float kg[NV][VEC], kb[NV][VEC];
#pragma unroll
  for (int i = 0; i < NV; ++i)
    if (i * TPR + lane < kVecs) load_affine<W, VEC, FLAGS>(p, i * TPR + lane, kg[i], kb[i]);

  const auto block = [&](long long rb, const FlatBlock& b, T* stage, int) {
    T* const xbuf = stage;
    T* const rbuf = stage + (kRes ? kBuf : 0);
    PT* const xs = reinterpret_cast<PT*>(xbuf + (b.begin - b.first) + group * N);
    PT* const rs = reinterpret_cast<PT*>(rbuf + (b.begin - b.first) + group * N);
    const long long row = rb * ROWS + group;
    const bool row_ok = ROWS == 1 || row < p.rows;  // one row a block: every block is a row

    PT xv[NV];
    bool ok[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      ok[i] = row_ok && (i < kVecs / TPR || v < kVecs);  // earlier i: every lane's v < kVecs
      if (!ok[i]) continue;
      xv[i] = xs[v];
      if constexpr (kRes) {
        const PT rv = rs[v];
#pragma unroll
        for (int j = 0; j < VEC; ++j) xv[i].e[j] = from_float<T>(elem_float(xv[i], j) + elem_float(rv, j));
        xs[v] = xv[i];  // h
      }
    }
    float mean, rstd;
    if constexpr (KIND == kLayerNorm) {
      two_pass_stats<T, VEC, TPR, ROWS, NV, N, kVecs>(xv, row_ok, lane, p.eps, scratch, mean, rstd);
    } else {
      const Sum1 a = group_allreduce<TPR, ROWS>(Stats::template of_chunk<T, VEC, NV>(xv, ok), scratch);
      Stats::finish(a, N, p.eps, mean, rstd);
    }
    if (row_ok) {  // overflowed sums (norm/stats_guard.cuh)
      const auto row_of = [&] { return GuardRow<T>{x + row * N, kRes ? res + row * N : res}; };
      guard_stats<KIND, T, kRes>(row_of, N, p.eps, mean, rstd);
      if (lane == 0) {
        p.rstd[row] = rstd;
        if (KIND == kLayerNorm && p.mean != nullptr) p.mean[row] = mean;
      }
    }
    const auto output = [&](int i, float(&out)[VEC]) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = fmaf((elem_float(xv[i], j) - mean) * rstd, kg[i][j], kb[i][j]);
    };
    if constexpr (Quant::kRecipe == 0) {
      PT* const ys = kRes ? rs : xs;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (!ok[i]) continue;
        float out[VEC];
        output(i, out);
        ys[i * TPR + lane] = from_floats<T, VEC>(out);
      }
    } else {
      float row_value = 0.f;  // the row's amax or per-token multiplier
      if constexpr (Quant::kRowAmax) {
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (!ok[i]) continue;
          float out[VEC];
          output(i, out);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a = fmaxf(a, fabsf(out[j]));
        }
        row_value = Quant::template row_value_of<TPR, ROWS>(p, row, a, row_ok && lane == 0);
      }
      const auto qrow = Quant::template row_of<Quant::kPointer>(p, row);
      if constexpr (Quant::kLaneSplit) {
        quant_out.template emit_slots<kCs>(p, qrow, lane, lane, ok, [&](int i) {
          float out[1];
          output(i, out);
          return out[0];
        });
      } else {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          float out[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) out[j] = 0.f;
          if (ok[i]) output(i, out);
          quant_out.template emit<kCs>(p, qrow, i * TPR + lane, lane, ok[i], out, row_value);
        }
      }
    }
    if constexpr (Quant::kRecipe == 0 || kRes) {
      __syncthreads();  // the block's outputs are whole in the stage
      if constexpr (Quant::kRecipe == 0) flat_flush<T, kCs>(static_cast<T*>(p.y), kRes ? rbuf : xbuf, b);
      if constexpr (kRes) flat_flush<T, kCs>(static_cast<T*>(p.h), xbuf, b);
    }
  };
  const auto nothing_early = [](long long) { return 0; };
  const T* const src[2] = {x, res};
  flat_ring<T, kTensors, kBuf>(stages, src, p.row_blocks, ROWS, p.rows, N, nothing_early, block);
  if constexpr (Quant::kRecipe != 0) quant_out.finish(p);
}

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd_flat(const NormBwdParams& p) {
  using PT = Pack<T, VEC>;
  allow_dependents();
  constexpr int kVecs = N / VEC;
  constexpr bool kDw = (FLAGS & kWantDw) != 0;
  constexpr bool kDb = (FLAGS & kWantDb) != 0;
  constexpr bool kDh = (FLAGS & kGradDh) != 0;
  constexpr bool kCs = (FLAGS & kStreamStore) != 0;
  constexpr bool kDirect = (FLAGS & kDirectGrads) != 0;
  constexpr int kTensors = kDh ? 3 : 2;  // x, dy (dx written in its place), dh
  constexpr int kBuf = flat_buffer_elems(ROWS, N, sizeof(T));
  constexpr float kInvN = 1.f / static_cast<float>(N);
  static_assert(N % VEC == 0 && kVecs <= TPR * NV, "a thread holds its vectors of a row");
  static_assert((FLAGS & (kClusterBits | kCluster16 | kGridExchange | kColumnGrads)) == 0,
                "a flat row block is one CTA's");

  extern __shared__ __align__(16) float smem[];
  __shared__ GroupScratch<TPR, ROWS, Sum2> scratch;
  T* const stages = reinterpret_cast<T*>(smem);
  constexpr bool kFlat = flat_lanes<TPR, ROWS>();
  const int lane = kFlat ? threadIdx.x : threadIdx.x % TPR;
  const int group = kFlat ? 0 : threadIdx.x / TPR;

  constexpr bool kKeep = (FLAGS & kKeepGamma) != 0;
  float gk[kKeep ? NV : 1][VEC];
  float dw_acc[kDw ? NV : 1][VEC], db_acc[kDb ? NV : 1][VEC];
  const auto gamma = [&](int i, int v) -> const float(&)[VEC] {
    if constexpr (!kKeep) load_gamma<W, VEC, FLAGS>(p.weight, v, gk[0]);
    return gk[kKeep ? i : 0];
  };
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    if (kKeep && i * TPR + lane < kVecs) load_gamma<W, VEC, FLAGS>(p.weight, i * TPR + lane, gk[i]);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if constexpr (kDw) dw_acc[i][j] = 0.f;
      if constexpr (kDb) db_acc[i][j] = 0.f;
    }
  }

  // The row's statistics load while its stage lands.
  const auto row_stats = [&](long long rb) {
    const long long row = rb * ROWS + group;
    const bool ok = ROWS == 1 || row < p.rows;
    return float2{ok ? p.rstd[row] : 0.f, KIND == kLayerNorm && ok ? p.mean[row] : 0.f};
  };
  const auto block = [&](long long rb, const FlatBlock& b, T* stage, float2 st) {
    const bool row_ok = ROWS == 1 || rb * ROWS + group < p.rows;
    const float rstd = st.x, mean = st.y;
    const long long at = (b.begin - b.first) + group * N;
    const PT* const xs = reinterpret_cast<const PT*>(stage + at);
    PT* const ds = reinterpret_cast<PT*>(stage + kBuf + at);
    const PT* const hs = reinterpret_cast<const PT*>(stage + 2 * kBuf + at);

    // The second pass reads x and dy from the stage again rather than
    // keeping their terms in registers: more CTAs fit an SM.
    Sum2 sums = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      if (!row_ok || (i >= kVecs / TPR && v >= kVecs)) continue;
      const PT dv = ds[v];
      float xm[VEC], df[VEC], wdy[VEC], xhat[VEC];
      element_terms<KIND, T, VEC>(xs[v], dv, gamma(i, v), mean, rstd, sums, xm, df, wdy, xhat);
      add_affine_grads<T, VEC, kDw, kDb>(dv, xhat, dw_acc[kDw ? i : 0], db_acc[kDb ? i : 0]);
    }
    sums = group_allreduce<TPR, ROWS>(sums, scratch);
    const DxCoef k = dx_coef<KIND>(sums.a * kInvN, sums.b * kInvN, rstd);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      if (!row_ok || (i >= kVecs / TPR && v >= kVecs)) continue;
      PT hv{};
      if constexpr (kDh) hv = hs[v];
      ds[v] = input_grad<KIND, N, T, VEC, kDh>(xs[v], ds[v], gamma(i, v), mean, k, hv);
    }
    __syncthreads();  // the block's dx is whole in the stage
    flat_flush<T, kCs>(static_cast<T*>(p.dx), stage + kBuf, b);
  };
  const T* const src[3] = {static_cast<const T*>(p.x), static_cast<const T*>(p.dy), static_cast<const T*>(p.dh)};
  flat_ring<T, kTensors, kBuf>(stages, src, p.row_blocks, ROWS, p.rows, N, row_stats, block);
  __syncthreads();  // the partial-row combine reuses the stages
  if constexpr (kDw)
    write_partial_row<N, VEC, TPR, ROWS, NV, W, kDirect>(dw_acc, p.partial_w + blockIdx.x * N, static_cast<W*>(p.dw),
                                                         smem);
  if constexpr (kDb)
    write_partial_row<N, VEC, TPR, ROWS, NV, W, kDirect>(db_acc, p.partial_b + blockIdx.x * N, static_cast<W*>(p.db),
                                                         smem);
}

}  // namespace rtcnorm
