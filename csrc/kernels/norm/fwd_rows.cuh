// Designs: the forward's register_row, smem_row and reload_row, and
// sliced_row without deferred statistics (cluster or grid-exchange
// slices). Shared by RMSNorm and LayerNorm (the KIND policy).
//
// Thread layout: a CTA of TPR * ROWS threads holds ROWS row groups; group g
// owns row rb * ROWS + g of row block rb. Thread `lane` of a group owns the
// VEC-wide vectors lane, lane + TPR, ... of its row, NV of them per chunk.
//
// Invariants (the host's planner guarantees them; see ops/norm/plan):
// - N % VEC == 0, and every base pointer and row stride is VEC-aligned.
// - kCachedRow implies the row is one chunk (N / VEC <= TPR * NV): the row is
//   read from memory once and kept in registers as raw T.
// - kSmemRow keeps the row in dynamic shared memory instead (ROWS * N * sizeof(T)
//   bytes, set by the host): read from memory once, in chunks, with only one
//   chunk in registers. Each thread reads back exactly the vectors it wrote,
//   so the row needs no barrier of its own. This frees the registers a long
//   register-cached row pins, which otherwise spill once gamma, beta or the
//   residual join it (LayerNorm at N = 32768: 188 bytes per thread).
// - With neither, the row is streamed in chunks twice: once for the
//   statistics, once to normalize (the second read mostly hits L2).
// - The loop over row blocks is uniform across the CTA (rows past the end
//   still take part in the barriers), so a persistent grid (gridDim.x smaller
//   than row_blocks) and a one-block-per-row-block grid share this code.
//   gridDim.x / CL <= row_blocks: every CTA has a first row block.
// - Statistics accumulate in fp32, never as E[x^2] - E[x]^2. LayerNorm uses
//   per-chunk two-pass moments merged with Chan's formula, or, with
//   kTwoPassStats (a row one CTA caches in registers), the mean from one row
//   reduction and the squared deviations from it in a second.
// - A cluster of CL CTAs (kClusterBits) splits every row into CL column
//   slices of S = ceil(N / VEC / CL) vectors: CTA rank r owns vectors
//   [r * S, min((r + 1) * S, N / VEC)), never none (the last slice is the
//   short one where CL does not divide N / VEC), caches its slice, and the
//   slices' statistics are merged through the cluster (common/cluster.cuh).
//   Row blocks are then indexed per cluster.
// - kGridExchange: the CL slices are CL consecutive CTAs of a cooperative
//   launch (a persistent grid, every CTA resident) instead of a cluster, and
//   the statistics meet through p.exchange in global memory
//   (common/grid_exchange.cuh) in the same rank order. Row blocks are then
//   indexed per group.
#pragma once

#include "common/cluster.cuh"
#include "common/grid_exchange.cuh"
#include "norm/fwd_common.cuh"
#include "norm/quant_epilogue.cuh"
#include "norm/stats_guard.cuh"

namespace rtcnorm {

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_fwd(const NormFwdParams& p) {
  using Stats = NormStats<KIND>;
  using Acc = typename Stats::Acc;
  using PT = Pack<T, VEC>;
  constexpr int kCl = column_cluster_ctas<FLAGS>();
  constexpr int kNvec = N / VEC;
  constexpr int kVecs = (kNvec + kCl - 1) / kCl;  // vectors of a slice of a row (the last may hold fewer)
  constexpr bool kUneven = kNvec % kCl != 0;
  constexpr int kChunk = TPR * NV;
  constexpr int kChunks = (kVecs + kChunk - 1) / kChunk;
  constexpr bool kCached = (FLAGS & kCachedRow) != 0;
  constexpr bool kSmem = (FLAGS & kSmemRow) != 0;
  constexpr bool kKeep = (FLAGS & kKeepGamma) != 0;
  constexpr bool kRes = (FLAGS & kResidual) != 0;
  constexpr bool kEven = !kUneven && kVecs % kChunk == 0;
  // Whole chunks: every thread of a group sums the same count of elements,
  // so LayerNorm's (count, mean, M2) triples meet in equal-count merges
  // (MeanM2Eq, no division) across lanes, warps and cluster CTAs, where the
  // warps of a group pair off (a power of two of them). Cluster slices,
  // shared-memory and streamed rows take them (H100, docs/history.md entry 53: bf16
  // 512x131072 129.5 -> 109.5 us, 1024x65536 114.1 -> 104.5); a row one CTA
  // caches in registers keeps the general merge where it does not take two
  // passes: its many-row grids ran 1-2% slower with them (16384x7168).
  constexpr bool kOneCtaRegisterRow = kCached && kCl == 1;
  constexpr bool kEqualCounts = equal_count_merge<KIND, TPR, kEven>() && !kOneCtaRegisterRow;
  using Red = typename Select<kEqualCounts, MeanM2Eq, Acc>::type;
  constexpr bool kCs = (FLAGS & kStreamStore) != 0;
  constexpr bool kNext = (kCached || (kSmem && kChunks == 1)) && (FLAGS & kPrefetchNext) != 0;
  constexpr bool kAffine = (FLAGS & (kHasWeight | kHasBias)) != 0;
  constexpr bool kAffinePf = !kKeep && kAffine && (FLAGS & kPrefetchAffine) != 0;
  // kPreloadAffine: a cached row's gamma/beta vectors are loaded as stored
  // beside its x, into registers, and converted only when the normalize step
  // needs them: one memory round trip per row instead of two.
  constexpr bool kPreload = kCached && !kKeep && kAffine && (FLAGS & kPreloadAffine) != 0;
  constexpr bool kTwoPass = KIND == kLayerNorm && (FLAGS & kTwoPassStats) != 0;
  constexpr bool kAlloc = (FLAGS & kL1Allocate) != 0;
  constexpr bool kGrid = (FLAGS & kGridExchange) != 0;
  constexpr int kHwCl = kGrid ? 1 : kCl;  // CTAs of a hardware cluster
  static_assert(!kGrid || kCl > 1, "a grid group splits a row's columns");
  static_assert(N % VEC == 0, "N must be a multiple of VEC");
  static_assert(kVecs * (kCl - 1) < kNvec, "every slice of a row holds a vector");
  static_assert(!kUneven || ((FLAGS & (kPrefetchNext | kPrefetchAffine)) == 0),
                "prefetches cover whole slices: a short last slice takes none");
  static_assert(kCl == 1 || kCached || kSmem, "a cluster splits rows it caches, never streamed ones");
  static_assert(!kCached || kChunks == 1, "a cached row must fit in one chunk");
  static_assert(!(kCached && kSmem), "a row is cached in registers or in shared memory, not both");
  static_assert(!kKeep || kChunks == 1, "gamma kept in registers must fit in one chunk");
  static_assert(!kTwoPass || (kCached && kCl == 1), "two-pass statistics read a row one CTA caches");
  using Quant = QuantEpilogue<T, N, VEC, TPR, FLAGS>;
  static_assert(Quant::kRecipe == 0 || kCl == 1, "a quantized row is owned by one CTA");
  Quant quant_out(p);
  // A quantized cached row whose vectors all exist loads a row past the end
  // as row 0 (xoff is 0 there), so its epilogue runs without branches; the
  // epilogue stores nothing for it.
  constexpr bool kLoadAll = Quant::kRecipe != 0 && kCached && kEven;

  __shared__ GroupScratch<TPR, kTwoPass ? 1 : ROWS, Red> scratch;
  __shared__ GroupScratch<TPR, kTwoPass ? ROWS : 1, Sum1> scratch1;
  __shared__ ClusterScratch<kHwCl, ROWS, Red> cscratch;
  cluster_exchange_init(cscratch);
  constexpr bool kFlat = flat_lanes<TPR, ROWS>();
  const int lane = kFlat ? threadIdx.x : threadIdx.x % TPR;
  const int group = kFlat ? 0u : threadIdx.x / TPR;
  const int rank = kGrid ? static_cast<int>(blockIdx.x % kCl) : cluster_rank<kHwCl>();
  unsigned long long* const gex = kGrid ? grid_exchange_of<kCl, ROWS, Red>(p.exchange, blockIdx.x / kCl) : nullptr;
  const int vbase = rank * kVecs;                                // this CTA's first vector of a row
  const int vend = kUneven ? min(kVecs, kNvec - vbase) : kVecs;  // and its count
  const long long col0 = 1LL * vbase * VEC;                      // and first column
  extern __shared__ __align__(16) unsigned char norm_dyn_smem[];
  PT* const srow = reinterpret_cast<PT*>(norm_dyn_smem) + (kSmem ? group * kVecs : 0);
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  T* h = static_cast<T*>(p.h);

  float kg[kKeep ? NV : 1][VEC];
  float kb[kKeep ? NV : 1][VEC];
  if constexpr (kKeep) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      if (kEven || v < vend) load_affine<W, VEC, FLAGS>(p, vbase + v, kg[i], kb[i]);
    }
  }

  const long long cluster = blockIdx.x / kCl, clusters = gridDim.x / kCl;
  int calls = 0;
  // Every cluster owns at least one row block (the grid never exceeds
  // row_blocks), so the first row's loads wait on no loop test: a test of
  // row_blocks first would put its constant-cache miss before them.
  long long rb = cluster;
  do {
    const long long row = rb * ROWS + group;
    const bool row_ok = row < p.rows;
    const long long xoff = row_ok ? row_offset<FLAGS>(p.x_map, row) + col0 : 0;
    const long long roff = (kRes && row_ok) ? row_offset<FLAGS>(p.residual_map, row) + col0 : 0;
    const long long yoff = row * N + col0;

    PT cache[kCached ? NV : 1];
    AffinePacks<W, VEC> affine[kPreload ? NV : 1];
    Acc acc = Stats::empty();
#pragma unroll 1
    for (int c = 0; c < kChunks; ++c) {
      PT xv[NV];
      bool ok[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = c * kChunk + i * TPR + lane;
        ok[i] = row_ok && (kEven || v < vend);
        if (ok[i] || kLoadAll) xv[i] = load_row_vec<T, VEC, kAlloc>(x, xoff + 1LL * v * VEC);
      }
      if constexpr (kPreload) {
#pragma unroll
        for (int i = 0; i < NV; ++i)
          if (ok[i] || kLoadAll) affine[i] = load_affine_packs<W, VEC, FLAGS>(p, vbase + c * kChunk + i * TPR + lane);
      }
      if constexpr (kAffinePf) {
        // Only the chunk whose gamma the normalize pass reads first; later
        // chunks' lines would be evicted before use on long rows.
        if (c == 0 && row_ok) prefetch_affine<W, VEC, TPR, NV, kVecs, FLAGS>(p, col0, lane);
      }
      if constexpr (kNext) {
        const long long next = (rb + (p.prefetch_ahead > 0 ? p.prefetch_ahead : clusters)) * ROWS + group;
        if (next < p.rows) {
          prefetch_row<T, VEC, TPR, NV, kVecs>(x, row_offset<FLAGS>(p.x_map, next) + col0, lane);
          if constexpr (kRes)
            prefetch_row<T, VEC, TPR, NV, kVecs>(res, row_offset<FLAGS>(p.residual_map, next) + col0, lane);
        }
      }
      if constexpr (kRes) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (!ok[i]) continue;
          const int v = c * kChunk + i * TPR + lane;
          const PT rv = load_row_vec<T, VEC, kAlloc>(res, roff + 1LL * v * VEC);
#pragma unroll
          for (int j = 0; j < VEC; ++j) xv[i].e[j] = from_float<T>(elem_float(xv[i], j) + elem_float(rv, j));
          store<T, VEC>(h, yoff + 1LL * v * VEC, xv[i]);
        }
      }
      if constexpr (!kTwoPass) acc = merge(acc, Stats::template of_chunk<T, VEC, NV>(xv, ok));
      if constexpr (kCached) {
#pragma unroll
        for (int i = 0; i < NV; ++i) cache[i] = xv[i];
      }
      if constexpr (kSmem) {
#pragma unroll
        for (int i = 0; i < NV; ++i)
          if (ok[i]) srow[c * kChunk + i * TPR + lane] = xv[i];
      }
    }

    float mean, rstd;
    if constexpr (kTwoPass) {
      two_pass_stats<T, VEC, TPR, ROWS, NV, N, kVecs>(cache, row_ok, lane, p.eps, scratch1, mean, rstd);
    } else {
      Red red = AccAs<Red>::from(acc);
      red = group_allreduce<TPR, ROWS>(red, scratch);
      if constexpr (kGrid) {
        grid_publish<kCl, ROWS>(red, gex, p.exchange_base, rank, calls, group, lane);
        red = grid_collect<kCl, ROWS, TPR, Red>(gex, p.exchange_base, calls++, group);
      } else {
        red = cluster_allreduce<kCl, ROWS, TPR>(red, cscratch, calls++, group, lane);
      }
      Stats::finish(AccAs<Acc>::from(red), N, p.eps, mean, rstd);
    }
    if (row_ok) {  // overflowed sums (norm/stats_guard.cuh)
      const auto row_of = [&] {
        return GuardRow<T>{x + row_offset<FLAGS>(p.x_map, row),
                           kRes ? res + row_offset<FLAGS>(p.residual_map, row) : res};
      };
      guard_stats<KIND, T, kRes>(row_of, N, p.eps, mean, rstd);
    }
    if (row_ok && lane == 0 && rank == 0) {
      p.rstd[row] = rstd;
      if (KIND == kLayerNorm && p.mean != nullptr) p.mean[row] = mean;
    }

    // The fp32 outputs of vector slot i of chunk c (vector v of the row).
    const auto normalized = [&](int c, int i, int v, float(&out)[VEC]) {
      PT xv;
      if constexpr (kCached)
        xv = cache[i];
      else if constexpr (kSmem)
        xv = srow[v];
      else if constexpr (kRes)
        xv = load_coherent<T, VEC>(h, yoff + 1LL * v * VEC);
      else
        xv = load_row_vec<T, VEC, kAlloc>(x, xoff + 1LL * v * VEC);
      float g[VEC], b[VEC];
      if constexpr (kKeep) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          g[j] = kg[i][j];
          b[j] = kb[i][j];
        }
      } else if constexpr (kPreload) {
        affine_floats<W, VEC, FLAGS>(affine[i], g, b);
      } else {
        load_affine<W, VEC, FLAGS>(p, vbase + v, g, b);
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = fmaf((elem_float(xv, j) - mean) * rstd, g[j], b[j]);
    };
    float row_value = 0.f;  // quantized outputs: the row's amax or per-token multiplier
    if constexpr (Quant::kRowAmax) {
      float a = 0.f;
#pragma unroll 1
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          const int v = c * kChunk + i * TPR + lane;
          if (!row_ok || !(kEven || v < vend)) continue;
          float out[VEC];
          normalized(c, i, v, out);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a = fmaxf(a, fabsf(out[j]));
        }
      }
      row_value = Quant::template row_value_of<TPR, ROWS>(p, row, a, row_ok && lane == 0);
    }

    constexpr auto kRowForm = kLoadAll                          ? Quant::kPinned
                              : Quant::kRecipe == quant::kNvfp4 ? Quant::kPointer
                                                                : Quant::kOffset;
    const auto qrow = Quant::template row_of<kRowForm>(p, row);
#pragma unroll 1
    for (int c = 0; c < kChunks; ++c) {
      if constexpr (Quant::kLaneSplit) {  // one element a slot: the chunk's outputs, then its codes
        bool oks[NV];
#pragma unroll
        for (int i = 0; i < NV; ++i) oks[i] = row_ok && (kEven || c * kChunk + i * TPR + lane < vend);
        quant_out.template emit_slots<kCs>(p, qrow, c * kChunk + lane, lane, oks, [&](int i) {
          float out[1];
          normalized(c, i, c * kChunk + i * TPR + lane, out);
          return out[0];
        });
        continue;
      }
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = c * kChunk + i * TPR + lane;
        const bool ok = row_ok && (kEven || v < vend);
        float out[VEC];
        if constexpr (Quant::kRecipe == 0) {
          if (!ok) continue;
          normalized(c, i, v, out);
          store<T, VEC, kCs>(y, yoff + 1LL * v * VEC, from_floats<T, VEC>(out));
        } else {
          if constexpr (kLoadAll) {
            normalized(c, i, v, out);
          } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) out[j] = 0.f;
            if (ok) normalized(c, i, v, out);
          }
          quant_out.template emit<kCs>(p, qrow, v, lane, ok, out, row_value);
        }
      }
    }
    rb += clusters;
  } while (rb < p.row_blocks);
  if constexpr (Quant::kRecipe != 0) quant_out.finish(p);
  cluster_exit<kHwCl>(calls);
}

}  // namespace rtcnorm
