// The flat_row stage ring, shared by the norm (norm/flat_row.cuh) and
// softmax (softmax/flat.cuh) kernels.
//
// A contiguous (rows x n) tensor is one flat array, so a row block (ROWS
// consecutive rows) is one contiguous range of it. A persistent CTA copies
// its next blocks into shared memory in 16-byte cp.async pieces, whatever n
// is, through a ring of kFlatStages stages (common/params.cuh), works on the
// rows in the stage, and copies the range back out in 16-byte pieces.
//
// Invariants (the callers' planners guarantee them):
// - Every staged tensor is contiguous rows x n from a 16-byte aligned base,
//   and so is every tensor a stage is flushed to.
// - A stage holds one buffer of flat_buffer_elems(ROWS, n, sizeof(T))
//   elements a tensor; buffer element 0 is tensor element FlatBlock::first.
// - Global memory sees only 16-byte accesses, except the pieces a row block
//   shares with its neighbours and the tensor's last piece, which go element
//   by element.
#pragma once

#include "common/params.cuh"
#include "common/vec.cuh"

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

}  // namespace rtcnorm
