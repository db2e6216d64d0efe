// Second stage of the norm backward: sums the (parts x cols) fp32 partial
// rows written by the persistent backward kernel into one row of W (dW and
// dB together: gridDim.y is the number of outputs).
//
// Invariants:
// - Block is 32 x kSplit threads. Thread (tx, ty) sums parts ty, ty + kSplit,
//   ... of column blockIdx.x * 32 + tx in increasing order, then thread ty == 0
//   adds the kSplit sums in increasing ty. The order of every addition is fixed
//   by (parts, cols), so the result is bitwise reproducible. No atomics.
// - On sm_90+ it is launched programmatically after the backward kernel that
//   writes the partial rows (grid_dep.cuh): it waits for that grid to
//   complete before its first read.
#pragma once

#include "common/grid_dep.cuh"
#include "common/params.cuh"
#include "common/types.cuh"

namespace rtcnorm {

constexpr int kColumnReduceSplit = 16;

template <typename W>
__global__ void __launch_bounds__(32 * kColumnReduceSplit) column_reduce(const ColumnReduceParams p) {
  __shared__ float part[kColumnReduceSplit][33];
  grid_dependency_wait();
  const float* partial = p.partial[blockIdx.y];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (col < p.cols) {
#pragma unroll 8
    for (int r = threadIdx.y; r < p.parts; r += kColumnReduceSplit) s += partial[1LL * r * p.cols + col];
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < p.cols) {
    float t = part[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kColumnReduceSplit; ++k) t += part[k][threadIdx.x];
    static_cast<W*>(p.out[blockIdx.y])[col] = from_float<W>(t);
  }
}

}  // namespace rtcnorm
