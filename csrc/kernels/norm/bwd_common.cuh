// Backward helpers shared by the backward designs (bwd_rows.cuh,
// bwd_sliced_row.cuh, bwd_split_row.cuh, bwd_column_grads.cuh): the bundle
// layout, the staging ring, gamma loads, the per-element terms, the dx
// coefficients and formula, and the partial-row writers.
//
// Invariants: every design's first pass sums its row terms through
// element_terms and writes dx through input_grad, so all designs perform the
// same operations in the same order and give the same bits.
#pragma once

#include "common/cluster.cuh"
#include "common/params.cuh"
#include "common/vec.cuh"
#include "norm/fwd_common.cuh"

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
// call it. `vecs`: the vectors of the N columns that exist (a short last
// slice holds fewer).
template <int N, int VEC, int TPR, int ROWS, int NV, typename W, bool DIRECT>
__device__ __forceinline__ void write_partial_row(float (&acc)[NV][VEC], float* partial_row, W* out, float* smem,
                                                  int vecs = N / VEC) {
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
      if (v >= vecs) continue;
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
    for (int col = threadIdx.x; col < vecs * VEC; col += blockDim.x) {
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

}  // namespace rtcnorm
