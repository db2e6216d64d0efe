// Designs: the backward's register_row and staged_row (kStagedRow), and
// the non-deferred cluster slices of sliced_row. Shared by RMSNorm and
// LayerNorm (the KIND policy).
//
// A persistent grid-stride kernel. Thread layout as in fwd_rows.cuh.
//
// Per row, with xhat = (x - mean) * rstd (mean = 0 for RMSNorm) and
// g = gamma (or 1 + gamma, or 1):
//   dx = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g * xhat)) [+ dh]
// where the mean(dy*g) term exists for LayerNorm only, and dh is the incoming
// gradient of the fused residual sum.
//
// dW / dB: each CTA sums dy*xhat (and dy) over the rows it visits, in fp32,
// and writes exactly one row of a (gridDim.x x N) partial buffer. A second
// kernel (column_reduce.cuh) sums those rows in a fixed order. No atomics, no
// M x N temporary, and bitwise the same result on every run for a given
// (M, N, grid).
//
// Invariants (guaranteed by ops/norm/plan):
// - gridDim.x <= row_blocks, so every CTA owns at least one row and writes its
//   whole partial row.
// - kCachedRow: x and dy of the row stay in registers and the dW accumulators
//   are registers too. Otherwise ROWS == 1, the row is streamed twice, and the
//   CTA accumulates in its own partial row in global memory (plain loads:
//   this kernel wrote it).
// - kPrefetchNext (cached rows only): while a CTA reduces and writes row block
//   rb it has L2 fetch row block rb + gridDim.x, which it loads next.
// - kStagedRow (cached rows only): instead of registers, x, dy and dh of a
//   row live in a ring of S stages (2 + the kRingExtraBits field) in dynamic
//   shared memory, filled by cp.async. The copies of the next S - 1 row
//   blocks (rb + gridDim.x, ...) are in flight while the CTA reduces and
//   writes rb from its own stage, so loads stay in flight across the row's
//   barriers. Each thread copies exactly the vectors it reads back, so the
//   ring needs no barrier of its own; it is ROWS * (N / CL) * sizeof(T)
//   * (2 or 3 tensors) * S bytes, with 16-byte vectors.
// - Dynamic shared memory holds bundles * N floats when a CTA combines more
//   than one bundle (see kBundles); the host sizes it with the same formula,
//   as the larger of that and the ring (the combine runs after the ring's
//   last read).
// - A cluster of CL CTAs (kClusterBits, cached rows only) splits every row
//   into CL column slices as in the forward: each CTA keeps x, dy and the dW
//   accumulators of its slice, the row sums meet through the cluster, and
//   cluster c writes partial row c (gridDim.x / CL rows), each CTA its slice.
//   Bundles then hold N / CL floats.
// - kDirectGrads (cached rows, one row block, so a grid of one CTA or one
//   cluster): the column sums are dW / dB themselves; they are written to
//   p.dw / p.db in the weight dtype and no partial row or column reduce
//   exists. Same additions in the same order, so the same bits as the fp32
//   partial row that the reduce would convert. A lone CTA whose first pass
//   keeps its terms has them whole before the row reduction and stores them
//   there (early_direct_grads, params.cuh).
// - The column reduce that follows is launched programmatically on sm_90+
//   (grid_dep.cuh): every CTA lets it be scheduled at its start, and it waits
//   for this grid to complete before reading the partial rows.
#pragma once

#include "common/grid_dep.cuh"
#include "norm/bwd_common.cuh"

namespace rtcnorm {

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd(const NormBwdParams& p) {
  using PT = Pack<T, VEC>;
  allow_dependents();
  constexpr int kCl = column_cluster_ctas<FLAGS>();
  constexpr int kNvec = N / VEC;
  constexpr int kVecs = (kNvec + kCl - 1) / kCl;  // vectors of a slice of a row (the last may hold fewer)
  constexpr int kSlice = kVecs * VEC;             // and their columns
  constexpr bool kUneven = kNvec % kCl != 0;
  constexpr int kChunk = TPR * NV;
  constexpr int kChunks = (kVecs + kChunk - 1) / kChunk;
  constexpr bool kCached = (FLAGS & kCachedRow) != 0;
  constexpr bool kDw = (FLAGS & kWantDw) != 0;
  constexpr bool kDb = (FLAGS & kWantDb) != 0;
  constexpr bool kDh = (FLAGS & kGradDh) != 0;
  constexpr bool kEven = !kUneven && kVecs % kChunk == 0;
  constexpr bool kCs = (FLAGS & kStreamStore) != 0;
  constexpr bool kStaged = (FLAGS & kStagedRow) != 0;
  constexpr int kStages = 2 + static_cast<int>((FLAGS & kRingExtraBits) >> kRingExtraShift);
  constexpr bool kNext = kCached && !kStaged && (FLAGS & kPrefetchNext) != 0;
  constexpr bool kRegs = kCached && !kStaged;  // x and dy kept in registers
  // Terms kept as floats between the passes (kKeepTerms: x - mean and dy,
  // or w * dy for RMSNorm; gamma for the CTA's life): the second pass
  // neither re-reads nor re-converts x, dy and gamma, and dW / dB are summed
  // in the first (the 8192-wide bf16 LayerNorm loop: 40 -> 30 instructions
  // per element). Same values as the re-read design (see input_grad).
  constexpr bool kTerms = kCached && (FLAGS & kKeepTerms) != 0;
  constexpr float kInvN = 1.f / static_cast<float>(N);
  static_assert(!kCached || kChunks == 1, "a cached row must fit in one chunk");
  static_assert(kCached || ROWS == 1, "streamed rows accumulate in global memory: one row per CTA");
  static_assert(N % VEC == 0 && kVecs * (kCl - 1) < kNvec, "every slice of a row holds whole vectors");
  static_assert(!kUneven || ((FLAGS & (kStagedRow | kPrefetchNext)) == 0),
                "rings and prefetches cover whole slices: a short last slice takes neither");
  static_assert(kCl == 1 || kCached, "a cluster splits rows it caches in registers");
  static_assert(!kStaged || kCached, "staged rows are cached rows");
  static_assert((FLAGS & kDirectGrads) == 0 || kCached, "only register sums are written as the gradients");
  constexpr bool kDirect = (FLAGS & kDirectGrads) != 0;
  // (The loop below then runs once, and dW / dB are whole after its first pass.)
  constexpr bool kEarlyGrads = early_direct_grads(FLAGS, TPR, ROWS);
  static_assert(!kEarlyGrads || (kTerms && kCl == 1 && BwdLayout<TPR, ROWS>::kBundles == 1),
                "gradients stored early: a lone CTA, its terms kept, one bundle of columns");

  extern __shared__ __align__(16) float smem[];
  __shared__ GroupScratch<TPR, ROWS, Sum2> scratch;
  __shared__ ClusterScratch<kCl, ROWS, Sum2> cscratch;
  cluster_exchange_init(cscratch);
  // (flat_lanes.) CTAs of a column cluster keep the division: flat,
  // LayerNorm's 448-thread row-cluster and 224-thread column-cluster rows ran
  // 8-9% slower (H100, bf16 16384x7168 261.7 -> 282.8 us, 4096x14336 145.4 ->
  // 158.7; docs/history.md entry 76).
  constexpr bool kFlat = kCl == 1 && flat_lanes<TPR, ROWS>();
  const int lane = kFlat ? threadIdx.x : threadIdx.x % TPR;
  const int group = kFlat ? 0u : threadIdx.x / TPR;
  const int vbase = cluster_rank<kCl>() * kVecs;                 // this CTA's first vector of a row
  const int vend = kUneven ? min(kVecs, kNvec - vbase) : kVecs;  // and its count
  const long long col0 = 1LL * vbase * VEC;                      // and first column
  const long long cluster = blockIdx.x / kCl, clusters = gridDim.x / kCl;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const T* dh = static_cast<const T*>(p.dh);
  T* dx = static_cast<T*>(p.dx);
  float* pw = p.partial_w + cluster * N + col0;
  float* pb = p.partial_b + cluster * N + col0;

  // The staging ring: stage s, tensor t (x, dy, dh) of this group's row.
  const StagingRing<T, N, VEC, TPR, ROWS, NV, kVecs, kDh ? 3 : 2, FLAGS> ring{reinterpret_cast<PT*>(smem) +
                                                                              group * kVecs};
  int stage = 0;  // the ring stage of row block rb
  if constexpr (kStaged) {
#pragma unroll
    for (int s = 0; s + 1 < kStages; ++s) ring.fill(s, cluster + s * clusters, p, group, col0, lane);
  }

  float dw_acc[kCached && kDw ? NV : 1][VEC];
  float db_acc[kCached && kDb ? NV : 1][VEC];
#pragma unroll
  for (int i = 0; i < (kCached && kDw ? NV : 1); ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw_acc[i][j] = 0.f;
#pragma unroll
  for (int i = 0; i < (kCached && kDb ? NV : 1); ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) db_acc[i][j] = 0.f;

  // gamma of this thread's columns, the same for every row the CTA visits,
  // loaded once before the first row (a staged CTA's first rows' copies are
  // already in flight).
  float gk[kTerms ? NV : 1][VEC];
  if constexpr (kTerms) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      if (kEven || v < vend) load_gamma<W, VEC, FLAGS>(p.weight, vbase + v, gk[i]);
    }
  }

  int calls = 0;
  // A lone CTA owns a first row block (gridDim.x <= row_blocks), so its first
  // row's loads wait on no loop test (see norm/fwd_rows.cuh). Column-cluster
  // CTAs keep the test: the one H100 run without it had their backward 1-11%
  // slower (docs/history.md entry 44; not separated from machine-to-machine
  // variance).
  long long rb = cluster;
  bool more = kCl == 1 || rb < p.row_blocks;
  while (more) {
    const long long row = rb * ROWS + group;
    const bool row_ok = row < p.rows;
    const long long xoff = row_ok ? row_offset<FLAGS>(p.x_map, row) + col0 : 0;
    const long long goff = row * N + col0;
    const float rstd = row_ok ? p.rstd[row] : 0.f;
    const float mean = (KIND == kLayerNorm && row_ok) ? p.mean[row] : 0.f;
    const bool first_row = rb == cluster;

    if constexpr (kStaged) {
      // The stage rb - clusters was read from (this thread's reads of it are
      // done) takes row block rb + (S - 1) * clusters.
      ring.fill(stage == 0 ? kStages - 1 : stage - 1, rb + (kStages - 1) * clusters, p, group, col0, lane);
      cp_async_wait<kStages - 1>();  // this row's copies have landed; S - 1 later rows' fly
    }
    PT xc[kCached ? NV : 1], dyc[kCached ? NV : 1];  // filled when kRegs and not kTerms
    // x - mean, and dy (LayerNorm) or w * dy (RMSNorm), when kTerms.
    float xmk[kTerms ? NV : 1][VEC], dyk[kTerms ? NV : 1][VEC];
    Sum2 s = {0.f, 0.f};
#pragma unroll 1
    for (int c = 0; c < kChunks; ++c) {
      PT xv[NV], dv[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = c * kChunk + i * TPR + lane;
        if (!row_ok || !(kEven || v < vend)) continue;
        if constexpr (kStaged) {
          xv[i] = ring.at(stage, 0)[v];
          dv[i] = ring.at(stage, 1)[v];
        } else {
          xv[i] = load_nc<T, VEC>(x, xoff + 1LL * v * VEC);
          dv[i] = load_nc<T, VEC>(dy, goff + 1LL * v * VEC);
        }
      }
      if constexpr (kNext) {
        const long long next = (rb + clusters) * ROWS + group;
        if (next < p.rows) {
          prefetch_row<T, VEC, TPR, NV, kVecs>(x, row_offset<FLAGS>(p.x_map, next) + col0, lane);
          prefetch_row<T, VEC, TPR, NV, kVecs>(dy, next * N + col0, lane);
          if constexpr (kDh) prefetch_row<T, VEC, TPR, NV, kVecs>(dh, next * N + col0, lane);
        }
      }
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = c * kChunk + i * TPR + lane;
        if (!row_ok || !(kEven || v < vend)) continue;
        if constexpr (kTerms) {
          float df[VEC], wdy[VEC], xhat[VEC];
          element_terms<KIND, T, VEC>(xv[i], dv[i], gk[i], mean, rstd, s, xmk[i], df, wdy, xhat);
#pragma unroll
          for (int j = 0; j < VEC; ++j) dyk[i][j] = KIND == kLayerNorm ? df[j] : wdy[j];
          add_affine_grads<T, VEC, kDw, kDb>(dv[i], xhat, dw_acc[kDw ? i : 0], db_acc[kDb ? i : 0]);
        } else {
          add_row_terms<KIND, T, W, VEC, FLAGS>(p.weight, vbase + v, xv[i], dv[i], mean, rstd, s);
        }
        if constexpr (kRegs && !kTerms) {
          xc[i] = xv[i];
          dyc[i] = dv[i];
        }
      }
    }

    if constexpr (kEarlyGrads) {
      // The gradients are complete: their stores drain during the row
      // reduction and the dx pass instead of after them.
      if constexpr (kDw)
        write_partial_row<kSlice, VEC, TPR, ROWS, NV, W, true>(dw_acc, pw, static_cast<W*>(p.dw), smem);
      if constexpr (kDb)
        write_partial_row<kSlice, VEC, TPR, ROWS, NV, W, true>(db_acc, pb, static_cast<W*>(p.db), smem);
    }
    s = group_allreduce<TPR, ROWS, kFlat>(s, scratch);
    cluster_publish<kCl, ROWS, TPR>(s, cscratch, calls, group, lane);
    if constexpr (kCl > 1 && !kTerms) {
      // dW / dB need only the saved statistics: sum them while the cluster's
      // other CTAs arrive (a lone CTA does it beside dx, below).
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = i * TPR + lane;
        if (!row_ok || !(kEven || v < vend)) continue;
        const PT xv = kStaged ? ring.at(stage, 0)[v] : xc[i];
        float xhat[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) xhat[j] = (elem_float(xv, j) - mean) * rstd;
        add_affine_grads<T, VEC, kDw, kDb>(kStaged ? ring.at(stage, 1)[v] : dyc[i], xhat, dw_acc[kDw ? i : 0],
                                           db_acc[kDb ? i : 0]);
      }
    }
    s = cluster_collect<kCl, ROWS>(s, cscratch, calls++, group);
    const DxCoef k = dx_coef<KIND>(s.a * kInvN, s.b * kInvN, rstd);

#pragma unroll 1
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = c * kChunk + i * TPR + lane;
        if (!row_ok || !(kEven || v < vend)) continue;
        float xm[VEC], df[VEC], xhat[VEC];  // xhat: for the dW / dB terms below (not with kTerms)
        PT dv;                              // dy, for them too
        PT hv{};
        if constexpr (kDh) hv = kStaged ? ring.at(stage, 2)[v] : load_nc<T, VEC>(dh, goff + 1LL * v * VEC);
        if constexpr (kTerms) {
          if constexpr (KIND == kLayerNorm)
            store<T, VEC, kCs>(dx, goff + 1LL * v * VEC,
                               input_grad<KIND, N, T, VEC, kDh>(xmk[i], dyk[i], gk[i], k, hv));
          else  // w * dy kept: it is wk
            store<T, VEC, kCs>(dx, goff + 1LL * v * VEC, input_grad<KIND, N, T, VEC, kDh>(xmk[i], dyk[i], k, hv));
        } else {
          PT xv;
          if constexpr (kStaged) {
            xv = ring.at(stage, 0)[v];
            dv = ring.at(stage, 1)[v];
          } else if constexpr (kCached) {
            xv = xc[i];
            dv = dyc[i];
          } else {
            xv = load_nc<T, VEC>(x, xoff + 1LL * v * VEC);
            dv = load_nc<T, VEC>(dy, goff + 1LL * v * VEC);
          }
          float g[VEC];
          load_gamma<W, VEC, FLAGS>(p.weight, vbase + v, g);
          to_floats<T, VEC>(xv, xm);
          to_floats<T, VEC>(dv, df);
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            xm[j] -= mean;
            xhat[j] = xm[j] * rstd;  // the first pass's bits
          }
          store<T, VEC, kCs>(dx, goff + 1LL * v * VEC, input_grad<KIND, N, T, VEC, kDh>(xm, df, g, k, hv));
        }
        if constexpr (kCached) {
          // A cluster summed them while its barrier was pending, kTerms in the
          // first pass.
          if constexpr (kCl == 1 && !kTerms)
            add_affine_grads<T, VEC, kDw, kDb>(dv, xhat, dw_acc[kDw ? i : 0], db_acc[kDb ? i : 0]);
        } else {
          const long long col = 1LL * v * VEC;
          if constexpr (kDw) {
            Pack<float, VEC> a;
            if (first_row) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) a.e[j] = 0.f;
            } else {
              a = load_coherent<float, VEC>(pw, col);
            }
#pragma unroll
            for (int j = 0; j < VEC; ++j) a.e[j] = fmaf(elem_float(dv, j), xhat[j], a.e[j]);
            store<float, VEC>(pw, col, a);
          }
          if constexpr (kDb) {
            Pack<float, VEC> a;
            if (first_row) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) a.e[j] = 0.f;
            } else {
              a = load_coherent<float, VEC>(pb, col);
            }
#pragma unroll
            for (int j = 0; j < VEC; ++j) a.e[j] += elem_float(dv, j);
            store<float, VEC>(pb, col, a);
          }
        }
      }
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
    rb += clusters;
    more = rb < p.row_blocks;
  }

  cluster_exit<kCl>(calls);
  if constexpr (kStaged) __syncthreads();  // the partial-row combine reuses the ring
  if constexpr (!kEarlyGrads) {
    if constexpr (kCached && kDw)
      write_partial_row<kSlice, VEC, TPR, ROWS, NV, W, kDirect>(dw_acc, pw, static_cast<W*>(p.dw) + col0, smem, vend);
    if constexpr (kCached && kDb)
      write_partial_row<kSlice, VEC, TPR, ROWS, NV, W, kDirect>(db_acc, pb, static_cast<W*>(p.db) + col0, smem, vend);
  }
}

}  // namespace rtcnorm
