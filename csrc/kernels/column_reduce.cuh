// Second stage of the norm backward: sums the (parts x cols) fp32 partial
// rows written by the persistent backward kernel into one row of W (dW and
// dB together: gridDim.y is the number of outputs).
//
// Invariants:
// - Block is 32 x kSplit threads; thread (tx, ty) owns G consecutive columns
//   (G = 4 for rows of 16384+ columns, a multiple of 4: one 16-byte access
//   of each partial row, so the few parts a thread of wide rows keep 4x the
//   bytes in flight; narrower rows keep G = 1 and more CTAs). It sums parts
//   ty, ty + kSplit, ... of each of its columns in increasing order, then
//   thread ty == 0 adds the kSplit sums in increasing ty. The order of every
//   addition is fixed by (parts, cols) and is the same for every G, so the
//   result is bitwise reproducible. No atomics.
// - On sm_90+ it is launched programmatically after the backward kernel that
//   writes the partial rows (grid_dep.cuh): it waits for that grid to
//   complete before its first read.
#pragma once

#include "common/grid_dep.cuh"
#include "common/params.cuh"
#include "common/vec.cuh"

namespace rtcnorm {

constexpr int kColumnReduceSplit = 16;

template <typename W, int G>
__global__ void __launch_bounds__(32 * kColumnReduceSplit) column_reduce(const ColumnReduceParams p) {
  static_assert(G == 1 || G == 4, "one float or one 16-byte access a partial row");
  __shared__ float part[kColumnReduceSplit][32 * G + 1];
  grid_dependency_wait();
  const float* partial = p.partial[blockIdx.y];
  const int col = (blockIdx.x * 32 + threadIdx.x) * G;  // cols % G == 0: all G columns or none are in range
  float s[G];
#pragma unroll
  for (int k = 0; k < G; ++k) s[k] = 0.f;
  if (col < p.cols) {
#pragma unroll 8
    for (int r = threadIdx.y; r < p.parts; r += kColumnReduceSplit) {
      const Pack<float, G> v = load_coherent<float, G>(partial, 1LL * r * p.cols + col);
#pragma unroll
      for (int k = 0; k < G; ++k) s[k] += v.e[k];
    }
  }
#pragma unroll
  for (int k = 0; k < G; ++k) part[threadIdx.y][threadIdx.x * G + k] = s[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < p.cols) {
#pragma unroll
    for (int k = 0; k < G; ++k) {
      float t = part[0][threadIdx.x * G + k];
#pragma unroll
      for (int y = 1; y < kColumnReduceSplit; ++y) t += part[y][threadIdx.x * G + k];
      static_cast<W*>(p.out[blockIdx.y])[col + k] = from_float<W>(t);
    }
  }
}

}  // namespace rtcnorm
