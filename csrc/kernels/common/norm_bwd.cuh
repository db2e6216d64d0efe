// Backward pass shared by RMSNorm and LayerNorm: a persistent grid-stride
// kernel. Thread layout as in norm_fwd.cuh.
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
// Invariants (guaranteed by ops/norm_plan.cpp):
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
// - A row cluster of RC CTAs (kRowClusterBits, cached rows, no column
//   split): each CTA walks row blocks as a lone CTA would, then the
//   cluster's column sums meet in distributed shared memory (in rank order)
//   and cluster c writes partial row c (gridDim.x / RC rows), or, as the
//   grid's only cluster, the gradients (kDirectGrads). A CTA past the last
//   row block adds zeros. Dynamic shared memory then also holds N floats a
//   gradient (plus the bundles of the combine), which the host sizes alike.
// - The column reduce that follows is launched programmatically on sm_90+
//   (grid_dep.cuh): every CTA lets it be scheduled at its start, and it waits
//   for this grid to complete before reading the partial rows.
#pragma once

#include "common/grid_dep.cuh"
#include "common/norm_fwd.cuh"

namespace rtcnorm {

template <int TPR, int ROWS>
struct BwdLayout {
  static constexpr int kBundles = bwd_bundles(TPR, ROWS);  // (params.cuh)
};

// The staging ring (kStagedRow) of one row group: stage s, tensor t (x, dy,
// dh) of the group's row is at(s, t)[v] for the group's vectors v. Stages
// hold ROWS rows each (the CTA's row groups side by side); a row is N
// elements, of which the group's CTA stages the VECS vectors from col0.
// FLAGS are the kernel's: kSingleStride picks x's row map.
template <typename T, int N, int VEC, int TPR, int ROWS, int NV, int VECS, int TENSORS, unsigned FLAGS>
struct StagingRing {
  using PT = Pack<T, VEC>;
  PT* group_base;  // the dynamic shared memory + group * VECS vectors

  __device__ __forceinline__ PT* at(int stage, int tensor) const {
    return group_base + (stage * TENSORS + tensor) * ROWS * VECS;
  }

  // Starts the copies of this thread's vectors of the group's row of row
  // block rb into `stage` (none past the last row) and closes the thread's
  // group of copies, so every thread commits one group per call.
  __device__ __forceinline__ void fill(int stage, long long rb, const NormBwdParams& p, int group, long long col0,
                                       int lane) const {
    const long long row = rb * ROWS + group;
    if (rb < p.row_blocks && row < p.rows) {
      const PT* x = reinterpret_cast<const PT*>(static_cast<const T*>(p.x) + row_offset<FLAGS>(p.x_map, row) + col0);
      const PT* dy = reinterpret_cast<const PT*>(static_cast<const T*>(p.dy) + row * N + col0);
      const PT* dh = reinterpret_cast<const PT*>(static_cast<const T*>(p.dh) + row * N + col0);
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = i * TPR + lane;
        if (VECS % (TPR * NV) != 0 && v >= VECS) continue;
        cp_async(at(stage, 0) + v, x + v);
        cp_async(at(stage, 1) + v, dy + v);
        if constexpr (TENSORS == 3) cp_async(at(stage, 2) + v, dh + v);
      }
    }
    cp_async_commit();
  }
};

template <typename W, int VEC, unsigned FLAGS>
__device__ __forceinline__ void load_gamma(const void* weight, int vec_index, float (&g)[VEC]) {
  if constexpr ((FLAGS & kHasWeight) != 0) {
    float w[VEC];
    to_floats<W, VEC>(load_cached<W, VEC>(static_cast<const W*>(weight), 1LL * vec_index * VEC), w);
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = (FLAGS & kZeroCentered) ? 1.f + w[j] : w[j];
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = 1.f;
  }
}

// One vector's per-element terms: xm = x - mean (mean 0 for RMSNorm), dy as
// floats, xhat = xm * rstd and wdy = w * dy, the last two added to the row
// sums the input gradient needs: s.a += sum(wdy * xhat), and for LayerNorm
// s.b += sum(wdy) (RMSNorm's dx has no mean(wdy) term; its s.b stays 0).
// Every first pass goes through it, so every design sums the same bits.
// __fmul_rn keeps wdy a rounded product (never contracted into an FMA).
template <int KIND, typename T, int VEC>
__device__ __forceinline__ void element_terms(const Pack<T, VEC>& xv, const Pack<T, VEC>& dv, const float (&g)[VEC],
                                              float mean, float rstd, Sum2& s, float (&xm)[VEC], float (&df)[VEC],
                                              float (&wdy)[VEC], float (&xhat)[VEC]) {
  float xf[VEC];
  to_floats<T, VEC>(xv, xf);
  to_floats<T, VEC>(dv, df);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    xm[j] = xf[j] - mean;
    xhat[j] = xm[j] * rstd;
    wdy[j] = __fmul_rn(df[j], g[j]);
    s.a = fmaf(wdy[j], xhat[j], s.a);
    if constexpr (KIND == kLayerNorm) s.b += wdy[j];
  }
}

// element_terms for vector v with its gamma loaded here, the terms dropped.
template <int KIND, typename T, typename W, int VEC, unsigned FLAGS>
__device__ __forceinline__ void add_row_terms(const void* weight, int v, const Pack<T, VEC>& xv, const Pack<T, VEC>& dv,
                                              float mean, float rstd, Sum2& s) {
  float g[VEC], xm[VEC], df[VEC], wdy[VEC], xhat[VEC];
  load_gamma<W, VEC, FLAGS>(weight, v, g);
  element_terms<KIND, T, VEC>(xv, dv, g, mean, rstd, s, xm, df, wdy, xhat);
}

// Adds one cached vector's terms to the CTA's register sums: dW += dy * xhat,
// dB += dy. A lone CTA calls it beside dx, a cluster's CTA while its barrier
// is pending; one formula, so both designs sum the same bits.
template <typename T, int VEC, bool DW, bool DB>
__device__ __forceinline__ void add_affine_grads(const Pack<T, VEC>& dv, const float (&xhat)[VEC], float (&dw)[VEC],
                                                 float (&db)[VEC]) {
  float df[VEC];
  to_floats<T, VEC>(dv, df);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    if constexpr (DW) dw[j] = fmaf(df[j], xhat[j], dw[j]);
    if constexpr (DB) db[j] += df[j];
  }
}

// A row's dx coefficients. With the row's c1 = mean(w*dy * xhat) and
// c2 = mean(w*dy) (0 for RMSNorm),
//   dx = rstd * (w*dy - c2 - xhat * c1) = rstd * (xm * k1 + (w*dy + k0))
// with xm = x - mean, k1 = -rstd * c1 and k0 = -c2: per element two FMAs and
// a multiply after x - mean, where the first form takes six operations in a
// second pass that re-reads the row (w*dy and xhat are not at hand there).
// w*dy + k0 is formed first, so RMSNorm's (k0 = 0) is the rounded w*dy its
// row sum used, and rows of one element (1 - xhat^2 cancels) keep the first
// form's error.
struct DxCoef {
  float rstd, k1, k0;
};

template <int KIND>
__device__ __forceinline__ DxCoef dx_coef(float c1, float c2, float rstd) {
  return {rstd, -rstd * c1, KIND == kLayerNorm ? -c2 : 0.f};
}

// One vector of dx [+ dh] from xm = x - mean and wk = w*dy + k0 (as floats).
// Every backward design writes dx through it: the same operations in the same
// order, so the same bits. A LayerNorm row of one element has dx = 0 exactly
// (y = beta whatever x is), which rounding would not give; a NaN or infinity
// in its x or dy still makes dx NaN, as the first form did.
template <int KIND, int N, typename T, int VEC, bool DH>
__device__ __forceinline__ Pack<T, VEC> input_grad(const float (&xm)[VEC], const float (&wk)[VEC], DxCoef k,
                                                   const Pack<T, VEC>& dh) {
  float out[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    out[j] = (KIND == kLayerNorm && N == 1) ? 0.f * (xm[j] + wk[j]) : k.rstd * fmaf(xm[j], k.k1, wk[j]);
    if constexpr (DH) out[j] += elem_float(dh, j);
  }
  return from_floats<T, VEC>(out);
}

// input_grad from xm, dy and gamma as floats: wk = fma(w, dy, k0), which for
// RMSNorm (k0 = 0) is element_terms' rounded wdy (a zero's sign aside), so a
// design that kept wdy passes it instead and writes the same values.
template <int KIND, int N, typename T, int VEC, bool DH>
__device__ __forceinline__ Pack<T, VEC> input_grad(const float (&xm)[VEC], const float (&df)[VEC],
                                                   const float (&g)[VEC], DxCoef k, const Pack<T, VEC>& dh) {
  float wk[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) wk[j] = fmaf(g[j], df[j], k.k0);
  return input_grad<KIND, N, T, VEC, DH>(xm, wk, k, dh);
}

// input_grad from the row's packed x and dy: xm = x - mean here.
template <int KIND, int N, typename T, int VEC, bool DH>
__device__ __forceinline__ Pack<T, VEC> input_grad(const Pack<T, VEC>& xv, const Pack<T, VEC>& dv,
                                                   const float (&g)[VEC], float mean, DxCoef k,
                                                   const Pack<T, VEC>& dh) {
  float xm[VEC], df[VEC];
  to_floats<T, VEC>(xv, xm);
  to_floats<T, VEC>(dv, df);
#pragma unroll
  for (int j = 0; j < VEC; ++j) xm[j] -= mean;
  return input_grad<KIND, N, T, VEC, DH>(xm, df, g, k, dh);
}

// Sums register accumulators over the CTA's row groups and writes the CTA's
// partial row, or with DIRECT (kDirectGrads: the grid is one CTA or cluster)
// the gradient itself, `out`, in the weight dtype W. Either way each lane
// stores its VEC contiguous columns as one vector (16-byte pieces): scalar
// stores would touch VEC sectors per instruction. All threads of the CTA must
// call it.
template <int N, int VEC, int TPR, int ROWS, int NV, typename W, bool DIRECT>
__device__ __forceinline__ void write_partial_row(float (&acc)[NV][VEC], float* partial_row, W* out, float* smem) {
  constexpr int kVecs = N / VEC;
  constexpr int kBundles = BwdLayout<TPR, ROWS>::kBundles;
  const int lane = threadIdx.x % TPR;
  if constexpr (TPR < 32) {
#pragma unroll
    for (int m = TPR; m < 32; m <<= 1)
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], m);
  }
  const bool representative = TPR < 32 ? (threadIdx.x & 31) < TPR : true;
  const int bundle = TPR < 32 ? threadIdx.x / 32 : threadIdx.x / TPR;
  if (representative) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      if (v >= kVecs) continue;
      if (kBundles == 1 && DIRECT) {
        store<W, VEC>(out, 1LL * v * VEC, from_floats<W, VEC>(acc[i]));
      } else {
        Pack<float, VEC> sums;
#pragma unroll
        for (int j = 0; j < VEC; ++j) sums.e[j] = acc[i][j];
        store<float, VEC>(kBundles == 1 ? partial_row : smem + bundle * N, 1LL * v * VEC, sums);
      }
    }
  }
  if constexpr (kBundles > 1) {
    __syncthreads();
    for (int col = threadIdx.x; col < N; col += blockDim.x) {
      float s = smem[col];
#pragma unroll 4
      for (int b = 1; b < kBundles; ++b) s += smem[b * N + col];
      if constexpr (DIRECT)
        out[col] = from_float<W>(s);
      else
        partial_row[col] = s;
    }
    __syncthreads();
  }
}

// A row cluster's (kRowClusterBits, RC CTAs) column sums meet: each CTA has
// left its own in `sums` (N floats of its shared memory, by
// write_partial_row) and passed a cluster barrier; CTA r then adds up its
// share of the columns over the ranks, in rank order, into the cluster's
// partial row, or with DIRECT (the grid is this one cluster) into the
// gradient `out` in the weight dtype. The caller's next cluster barrier keeps
// every CTA's shared memory alive until its peers have read it.
template <int N, int RC, typename W, bool DIRECT>
__device__ __forceinline__ void sum_row_cluster_columns(const float* sums, float* partial_row, W* out) {
  constexpr int kG = N % 4 == 0 ? 4 : 1;  // floats an access: 16 bytes where every group is 16-byte aligned
  constexpr int kGroups = N / kG;
  constexpr int kShare = (kGroups + RC - 1) / RC;
  const int first = cluster_rank<RC>() * kShare;
  const int last = min(kGroups, first + kShare);
  for (int g = first + static_cast<int>(threadIdx.x); g < last; g += blockDim.x) {
    float part[RC][kG];  // every rank's load issued before the first add: one round trip
#pragma unroll
    for (int k = 0; k < RC; ++k) {
      if constexpr (kG == 4) {
        const float4 v = load_remote4(sums + g * 4, k);
        part[k][0] = v.x;
        part[k][1] = v.y;
        part[k][2] = v.z;
        part[k][3] = v.w;
      } else {
        part[k][0] = load_remote(sums + g, k);
      }
    }
    Pack<float, kG> total;
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      total.e[j] = part[0][j];
#pragma unroll
      for (int k = 1; k < RC; ++k) total.e[j] += part[k][j];
    }
    if constexpr (DIRECT)
      store<W, kG>(out, 1LL * g * kG, from_floats<W, kG>(total.e));
    else
      store<float, kG>(partial_row, 1LL * g * kG, total);
  }
}

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd(const NormBwdParams& p) {
  using PT = Pack<T, VEC>;
  allow_dependents();
  constexpr int kCl = column_cluster_ctas<FLAGS>();
  constexpr int kSlice = N / kCl;      // columns of this CTA's slice of a row
  constexpr int kVecs = kSlice / VEC;  // and its vectors
  constexpr int kChunk = TPR * NV;
  constexpr int kChunks = (kVecs + kChunk - 1) / kChunk;
  constexpr bool kCached = (FLAGS & kCachedRow) != 0;
  constexpr bool kDw = (FLAGS & kWantDw) != 0;
  constexpr bool kDb = (FLAGS & kWantDb) != 0;
  constexpr bool kDh = (FLAGS & kGradDh) != 0;
  constexpr bool kEven = kVecs % kChunk == 0;
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
  static_assert(N % (VEC * kCl) == 0, "a cluster splits a row into equal slices of whole vectors");
  static_assert(kCl == 1 || kCached, "a cluster splits rows it caches in registers");
  static_assert(!kStaged || kCached, "staged rows are cached rows");
  static_assert((FLAGS & kDirectGrads) == 0 || kCached, "only register sums are written as the gradients");
  constexpr int kRc = 1 << ((FLAGS & kRowClusterBits) >> kRowClusterShift);
  static_assert(kRc == 1 || (kCl == 1 && kCached), "a row cluster's CTAs cache whole rows in registers or the ring");
  constexpr bool kDirect = (FLAGS & kDirectGrads) != 0;
  // (The loop below then runs once, and dW / dB are whole after its first pass.)
  constexpr bool kEarlyGrads = early_direct_grads(FLAGS, TPR, ROWS);
  static_assert(!kEarlyGrads || (kTerms && kCl == 1 && kRc == 1 && BwdLayout<TPR, ROWS>::kBundles == 1),
                "gradients stored early: a lone CTA, its terms kept, one bundle of columns");

  extern __shared__ __align__(16) float smem[];
  __shared__ GroupScratch<TPR, ROWS, Sum2> scratch;
  __shared__ ClusterScratch<kCl, ROWS, Sum2> cscratch;
  cluster_exchange_init(cscratch);
  // (flat_lanes.) CTAs of a column or row cluster keep the division: flat,
  // LayerNorm's 448-thread row-cluster and 224-thread column-cluster rows ran
  // 8-9% slower (H100, bf16 16384x7168 261.7 -> 282.8 us, 4096x14336 145.4 ->
  // 158.7; docs/history.md entry 76).
  constexpr bool kFlat = kCl == 1 && kRc == 1 && flat_lanes<TPR, ROWS>();
  const int lane = kFlat ? threadIdx.x : threadIdx.x % TPR;
  const int group = kFlat ? 0u : threadIdx.x / TPR;
  const int vbase = cluster_rank<kCl>() * kVecs;  // this CTA's first vector of a row
  const long long col0 = 1LL * vbase * VEC;       // and first column
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

  // gamma of this thread's columns, the same for every row the CTA visits.
  // Loaded here (a staged CTA's first rows' copies are already in flight), or
  // with kGammaBesideRow right after the first row's loads are issued
  // (below): converting gamma waits for it, so loaded first its DRAM round
  // trip and the row's queue instead of overlapping.
  constexpr bool kGammaLate = kTerms && !kStaged && (FLAGS & kGammaBesideRow) != 0;
  float gk[kTerms ? NV : 1][VEC];
  const auto load_kept_gamma = [&]() {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * TPR + lane;
      if (kEven || v < kVecs) load_gamma<W, VEC, FLAGS>(p.weight, vbase + v, gk[kTerms ? i : 0]);
    }
  };
  if constexpr (kTerms && !kGammaLate) load_kept_gamma();

  int calls = 0;
  // A lone CTA owns a first row block (gridDim.x <= row_blocks), so its first
  // row's loads wait on no loop test (see norm_fwd.cuh). A row cluster's last
  // CTAs may own none. Column-cluster CTAs keep the test: the one H100 run
  // without it had their backward 1-11% slower (docs/history.md entry 44;
  // not separated from machine-to-machine variance).
  long long rb = cluster;
  bool more = (kRc == 1 && kCl == 1) || rb < p.row_blocks;
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
        if (!row_ok || !(kEven || v < kVecs)) continue;
        if constexpr (kStaged) {
          xv[i] = ring.at(stage, 0)[v];
          dv[i] = ring.at(stage, 1)[v];
        } else {
          xv[i] = load_nc<T, VEC>(x, xoff + 1LL * v * VEC);
          dv[i] = load_nc<T, VEC>(dy, goff + 1LL * v * VEC);
        }
      }
      if constexpr (kGammaLate) {
        if (first_row) load_kept_gamma();
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
        if (!row_ok || !(kEven || v < kVecs)) continue;
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
        if (!row_ok || !(kEven || v < kVecs)) continue;
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
        if (!row_ok || !(kEven || v < kVecs)) continue;
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
  if constexpr (kRc > 1) {
    // The CTA's column sums stay in its shared memory, dW's at [0, N) and
    // dB's after them (each combine's bundles start at its own sums, which
    // it writes in place), for the cluster to add up.
    float* const sum_w = smem;
    float* const sum_b = smem + (kDw ? N : 0);
    if constexpr (kDw) write_partial_row<N, VEC, TPR, ROWS, NV, W, false>(dw_acc, sum_w, nullptr, sum_w);
    if constexpr (kDb) write_partial_row<N, VEC, TPR, ROWS, NV, W, false>(db_acc, sum_b, nullptr, sum_b);
    cluster_barrier();
    const long long part = (kDirect ? 0 : blockIdx.x / kRc) * N;
    if constexpr (kDw)
      sum_row_cluster_columns<N, kRc, W, kDirect>(sum_w, kDirect ? nullptr : p.partial_w + part, static_cast<W*>(p.dw));
    if constexpr (kDb)
      sum_row_cluster_columns<N, kRc, W, kDirect>(sum_b, kDirect ? nullptr : p.partial_b + part, static_cast<W*>(p.db));
    cluster_barrier();
  } else if constexpr (!kEarlyGrads) {
    if constexpr (kCached && kDw)
      write_partial_row<kSlice, VEC, TPR, ROWS, NV, W, kDirect>(dw_acc, pw, static_cast<W*>(p.dw) + col0, smem);
    if constexpr (kCached && kDb)
      write_partial_row<kSlice, VEC, TPR, ROWS, NV, W, kDirect>(db_acc, pb, static_cast<W*>(p.db) + col0, smem);
  }
}

}  // namespace rtcnorm
