// The softmax backward kernel (see softmax.cuh for the layout and invariants).
#pragma once

#include "softmax/rows.cuh"

namespace rtcnorm {

template <typename T, int VEC, int TPR, int ROWS, int NV, bool CAUSAL, bool CACHED, int MINB, unsigned OPTS>
__global__ void __launch_bounds__(TPR* ROWS, MINB) softmax_bwd(const SoftmaxBwdParams p) {
  using PT = Pack<T, VEC>;
  constexpr int kChunk = TPR * NV;
  constexpr bool kCs = (OPTS & kSoftmaxStreamStore) != 0;
  constexpr bool kL1 = (OPTS & kSoftmaxL1Alloc) != 0;
  constexpr int kCl = 1 << ((OPTS & kSoftmaxClusterBits) >> kSoftmaxClusterShift);
  static_assert(CACHED || ROWS == 1, "streamed rows take a whole CTA");
  static_assert(kCl == 1 || (CACHED && ROWS == 1), "a cluster splits cached rows of one CTA each");

  __shared__ GroupScratch<TPR, ROWS, Sum1> scratch;
  __shared__ ClusterScratch<kCl, ROWS, Sum1> cscratch;
  cluster_exchange_init(cscratch);
  const int lane = threadIdx.x % TPR;
  const int rank = cluster_rank<kCl>();
  int calls = 0;
  auto vidx = [&](int c, int i) { return row_vector<TPR, NV, kCl>(c, i, lane, rank); };
  const T* y = static_cast<const T*>(p.y);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  const int nvec = p.cols / VEC;

  for (int rb = blockIdx.x / kCl; rb < p.row_blocks; rb += gridDim.x / kCl) {
    const SoftmaxRow r = softmax_row<VEC, TPR, ROWS, CAUSAL>(rb, p.sq, p.rows, p.cols, p.diag);
    const long long yoff = static_cast<long long>(r.row) * p.cols;
    const long long goff = r.ok ? row_offset(p.dy_rows, r.row) : 0;
    const int nstore = r.ok ? nvec : 0;

    auto load_chunk = [&](int c, PT(&yv)[NV], PT(&gv)[NV]) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = vidx(c, i);
        if (v < r.nload) {
          yv[i] = load_nc<T, VEC, kL1>(y, yoff + 1LL * v * VEC);
          gv[i] = load_nc<T, VEC, kL1>(dy, goff + 1LL * v * VEC);
        }
      }
    };
    // Lanes of the vector straddling the causal diagonal are skipped too, so
    // whatever dy holds past it never reaches the sum.
    auto hidden = [&](int v, int j) { return CAUSAL && v * VEC + j >= r.len; };
    auto dot_chunk = [&](int c, const PT(&yv)[NV], const PT(&gv)[NV], float s) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = vidx(c, i);
        if (v >= r.nload) continue;
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          if (!hidden(v, j)) s = fmaf(elem_float(gv[i], j), elem_float(yv[i], j), s);
      }
      return s;
    };
    auto store_chunk = [&](int c, const PT(&yv)[NV], const PT(&gv)[NV], float dot) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = vidx(c, i);
        if (v >= nstore) continue;
        PT out = zero_pack<T, VEC>();
        if (v < r.nload) {
#pragma unroll
          for (int j = 0; j < VEC; ++j)
            if (!hidden(v, j)) out.e[j] = from_float<T>(elem_float(yv[i], j) * p.scale * (elem_float(gv[i], j) - dot));
        }
        store<T, VEC, kCs>(dx, yoff + 1LL * v * VEC, out);
      }
    };

    if constexpr (CACHED) {
      PT yv[NV], gv[NV];
      load_chunk(0, yv, gv);
      Sum1 dot = group_allreduce<TPR, ROWS>(Sum1{dot_chunk(0, yv, gv, 0.f)}, scratch);
      dot = cluster_allreduce<kCl, ROWS, TPR>(dot, cscratch, calls++, 0, static_cast<int>(threadIdx.x));
      store_chunk(0, yv, gv, dot.a);
    } else {
      float s = 0.f;
      const int load_chunks = (r.nload + kChunk - 1) / kChunk;
#pragma unroll 1
      for (int c = 0; c < load_chunks; ++c) {
        PT yv[NV], gv[NV];
        load_chunk(c, yv, gv);
        s = dot_chunk(c, yv, gv, s);
      }
      const float dot = group_allreduce<TPR, ROWS>(Sum1{s}, scratch).a;
#pragma unroll 1
      for (int c = (nstore + kChunk - 1) / kChunk - 1; c >= 0; --c) {
        PT yv[NV], gv[NV];
        load_chunk(c, yv, gv);
        store_chunk(c, yv, gv, dot);
      }
    }
  }
  cluster_exit<kCl>(calls);
}

}  // namespace rtcnorm
