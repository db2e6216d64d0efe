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
//   The forward also takes rows of single elements that no register layout
//   holds, one a CTA (ROWS == 1): the statistics (and the residual's sum)
//   from the stage's 16-byte pieces, a pass (two for LayerNorm's); the
//   outputs in flat_chunks chunks of TPR * NV elements, loading gamma / beta
//   as it normalizes (a quantized row: a first pass for its amax). A chunk
//   puts adjacent columns on adjacent lanes, so those loads coalesce, where a
//   piece would give each thread 8 adjacent columns.
// - A ring of flat_stages stages (common/params.cuh): kFlatStages, so the
//   copies of the CTA's next row block are in flight while it works on the
//   current one; one for a row read in chunks, whose stage fills shared
//   memory. A stage holds one buffer of flat_buffer_elems elements a row
//   tensor.
// - A quantized forward (kQuantBits) writes its codes and scales straight
//   from registers through norm/quant_epilogue.cuh; only h goes through the
//   stage.
// - The arithmetic is the register-row designs' (norm/fwd_common.cuh,
//   norm/bwd_common.cuh): the same operations in the same order a row (a row
//   read in pieces sums them in its own order). The
//   backward's second pass reads x and dy from the stage again (dx as the
//   re-reading designs form it).
// - Backward: each CTA sums dW / dB of its columns in registers over every row
//   block it visits and writes one partial row (or, alone, the gradients), as
//   norm/bwd_rows.cuh does; the column reduce that follows is unchanged.
//   Gamma stays in registers with kKeepGamma; without it, each use reads it
//   again (from L1), so a thread holds a register less an element and wider
//   rows fit.
#pragma once

#include "common/flat_stage.cuh"
#include "common/grid_dep.cuh"
#include "norm/bwd_common.cuh"
#include "norm/quant_epilogue.cuh"
#include "norm/stats_guard.cuh"

namespace rtcnorm {

// A row read in chunks (one row a CTA of TPR threads, VEC == 1) is worked on
// in its stage's 16-byte pieces [0, b.pieces), thread `lane` taking pieces
// lane, lane + TPR, ...: the row's elements are stage elements [b.own,
// b.span); the first and last piece may also hold a neighbour's elements, or
// none past the tensor's end, which every sum masks and no flush writes.

// The sum of a row's x (SQUARE: of (x - centre)^2); with RES, first h = x + r
// in x's place, whole pieces (what lies outside the row is never flushed).
template <typename T, int TPR, bool SQUARE, bool RES>
__device__ __forceinline__ float flat_piece_sum(T* xbuf, const T* rbuf, const FlatBlock& b, int lane, float centre) {
  constexpr int kP = flat_piece<T>();
  using Piece = Pack<T, kP>;
  float s = 0.f;
  for (int q = lane; q < b.pieces; q += TPR) {
    Piece v = reinterpret_cast<const Piece*>(xbuf)[q];
    if constexpr (RES) {
      const Piece r = reinterpret_cast<const Piece*>(rbuf)[q];
#pragma unroll
      for (int j = 0; j < kP; ++j) v.e[j] = from_float<T>(elem_float(v, j) + elem_float(r, j));
      reinterpret_cast<Piece*>(xbuf)[q] = v;
    }
    const int lo = b.own - q * kP, hi = b.span - q * kP;  // the row's elements of the piece: [lo, hi)
#pragma unroll
    for (int j = 0; j < kP; ++j) {
      const float d = elem_float(v, j) - centre;
      if (j >= lo && j < hi) s = SQUARE ? fmaf(d, d, s) : s + d;
    }
  }
  return s;
}

// The row's statistics from its pieces, as the register rows form them:
// RMSNorm's mean square; LayerNorm's mean, then the mean squared deviation.
template <int KIND, typename T, int TPR, int N, bool RES>
__device__ __forceinline__ void flat_piece_stats(T* xbuf, const T* rbuf, const FlatBlock& b, int lane, float eps,
                                                 GroupScratch<TPR, 1, Sum1>& scratch, float& mean, float& rstd) {
  const float sum =
      group_allreduce<TPR, 1>(Sum1{flat_piece_sum<T, TPR, KIND == kRmsNorm, RES>(xbuf, rbuf, b, lane, 0.f)}, scratch).a;
  if constexpr (KIND == kRmsNorm) {
    mean = 0.f;
    rstd = rsqrtf(sum / static_cast<float>(N) + eps);
  } else {
    mean = sum / static_cast<float>(N);
    const float sq = flat_piece_sum<T, TPR, true, false>(xbuf, rbuf, b, lane, mean);
    rstd = rsqrtf(group_allreduce<TPR, 1>(Sum1{sq}, scratch).a * (1.f / static_cast<float>(N)) + eps);
  }
}

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_fwd_flat(const NormFwdParams& p) {
  using PT = Pack<T, VEC>;
  using Stats = NormStats<KIND>;
  constexpr int kVecs = N / VEC;
  constexpr int kChunk = TPR * NV;
  constexpr int kChunks = flat_chunks(kVecs, kChunk);
  constexpr bool kStaged = kChunks > 1;  // the row is read from its stage, a chunk at a time
  constexpr bool kRes = (FLAGS & kResidual) != 0;
  constexpr bool kCs = (FLAGS & kStreamStore) != 0;
  constexpr int kTensors = kRes ? 2 : 1;  // x (h written in its place), residual (y in its place)
  constexpr int kBuf = flat_buffer_elems(ROWS, N, sizeof(T));
  static_assert(N % VEC == 0, "N must be a multiple of VEC");
  static_assert(!kStaged || (ROWS == 1 && VEC == 1), "a row read in chunks is its CTA's only row, of single elements");
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

  // gamma / beta of this thread's columns, the same for every row (a row
  // read in chunks loads each vector's as it normalizes it).
  float kg[kStaged ? 1 : NV][VEC], kb[kStaged ? 1 : NV][VEC];
  if constexpr (!kStaged) {
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (i * TPR + lane < kVecs) load_affine<W, VEC, FLAGS>(p, i * TPR + lane, kg[i], kb[i]);
  }

  const auto block = [&](long long rb, const FlatBlock& b, T* stage, int) {
    T* const xbuf = stage;
    T* const rbuf = stage + (kRes ? kBuf : 0);
    PT* const xs = reinterpret_cast<PT*>(xbuf + b.own + group * N);
    PT* const rs = reinterpret_cast<PT*>(rbuf + b.own + group * N);
    const long long row = rb * ROWS + group;
    const bool row_ok = ROWS == 1 || row < p.rows;  // one row a block: every block is a row

    // Chunk c into xv (ok: the vectors that exist); the first visit adds the
    // residual and leaves h in x's place.
    PT xv[NV];
    bool ok[NV];
    const auto load_chunk = [&](int c, bool first) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = c * kChunk + i * TPR + lane;
        ok[i] = row_ok && (kVecs % kChunk == 0 || v < kVecs);
        if (!ok[i]) continue;
        xv[i] = xs[v];
        if (kRes && first) {
          const PT rv = rs[v];
#pragma unroll
          for (int j = 0; j < VEC; ++j) xv[i].e[j] = from_float<T>(elem_float(xv[i], j) + elem_float(rv, j));
          xs[v] = xv[i];  // h
        }
      }
    };
    float mean, rstd;
    if constexpr (kStaged) {
      flat_piece_stats<KIND, T, TPR, N, kRes>(xbuf, rbuf, b, lane, p.eps, scratch, mean, rstd);
    } else {
      load_chunk(0, true);
      if constexpr (KIND == kLayerNorm) {
        two_pass_stats<T, VEC, TPR, ROWS, NV, N, kVecs>(xv, row_ok, lane, p.eps, scratch, mean, rstd);
      } else {
        const Sum1 a = group_allreduce<TPR, ROWS>(Stats::template of_chunk<T, VEC, NV>(xv, ok), scratch);
        Stats::finish(a, N, p.eps, mean, rstd);
      }
    }
    if (row_ok) {  // overflowed sums (norm/stats_guard.cuh)
      const auto row_of = [&] { return GuardRow<T>{x + row * N, kRes ? res + row * N : res}; };
      guard_stats<KIND, T, kRes>(row_of, N, p.eps, mean, rstd);
      if (lane == 0) {
        p.rstd[row] = rstd;
        if (KIND == kLayerNorm && p.mean != nullptr) p.mean[row] = mean;
      }
    }
    // The passes below visit each chunk c, its vectors in xv (a register
    // row: already there).
    const auto output = [&](int c, int i, float(&out)[VEC]) {
      float g[VEC], bias[VEC];
      if constexpr (kStaged) load_affine<W, VEC, FLAGS>(p, c * kChunk + i * TPR + lane, g, bias);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if constexpr (!kStaged) g[j] = kg[i][j], bias[j] = kb[i][j];
        out[j] = fmaf((elem_float(xv[i], j) - mean) * rstd, g[j], bias[j]);
      }
    };
    if constexpr (Quant::kRecipe == 0) {
      PT* const ys = kRes ? rs : xs;
#pragma unroll 1
      for (int c = 0; c < kChunks; ++c) {
        if constexpr (kStaged) load_chunk(c, false);
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (!ok[i]) continue;
          float out[VEC];
          output(c, i, out);
          ys[c * kChunk + i * TPR + lane] = from_floats<T, VEC>(out);
        }
      }
    } else {
      float row_value = 0.f;  // the row's amax or per-token multiplier
      if constexpr (Quant::kRowAmax) {
        float a = 0.f;
#pragma unroll 1
        for (int c = 0; c < kChunks; ++c) {
          if constexpr (kStaged) load_chunk(c, false);
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            if (!ok[i]) continue;
            float out[VEC];
            output(c, i, out);
#pragma unroll
            for (int j = 0; j < VEC; ++j) a = fmaxf(a, fabsf(out[j]));
          }
        }
        row_value = Quant::template row_value_of<TPR, ROWS>(p, row, a, row_ok && lane == 0);
      }
      const auto qrow = Quant::template row_of<Quant::kPointer>(p, row);
#pragma unroll 1
      for (int c = 0; c < kChunks; ++c) {
        if constexpr (kStaged) load_chunk(c, false);
        if constexpr (Quant::kLaneSplit) {
          quant_out.template emit_slots<kCs>(p, qrow, c * kChunk + lane, lane, ok, [&](int i) {
            float out[1];
            output(c, i, out);
            return out[0];
          });
        } else {
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            float out[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) out[j] = 0.f;
            if (ok[i]) output(c, i, out);
            quant_out.template emit<kCs>(p, qrow, c * kChunk + i * TPR + lane, lane, ok[i], out, row_value);
          }
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
  flat_ring<T, kTensors, kBuf, flat_stages(kChunks)>(stages, src, p.row_blocks, ROWS, p.rows, N, nothing_early, block);
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
    const int at = b.own + group * N;
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
