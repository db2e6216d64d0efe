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

// Row block rb, from its first piece on: buffer element 0 is tensor element
// `first` (the block's first element rounded down to a piece); the block's
// own elements are buffer elements [own, span); `pieces` pieces cover them,
// of which the first `whole` lie wholly inside the tensor. A block fits
// shared memory, so every offset from `first` is 32-bit. flat_ring forms
// the geometry when it stages a block and again when it works on it, never
// once a tensor or a piece.
struct FlatBlock {
  long long first;
  int own, span, pieces, whole;
};

template <typename T>
__device__ __forceinline__ FlatBlock flat_block(long long rb, int rows_per_block, long long rows, int n) {
  constexpr int kP = flat_piece<T>();
  const long long row0 = rb * rows_per_block;
  const long long begin = row0 * n;
  const int here = rows - row0 < rows_per_block ? static_cast<int>(rows - row0) : rows_per_block;
  FlatBlock b;
  b.first = begin & ~static_cast<long long>(kP - 1);
  b.own = static_cast<int>(begin - b.first);
  b.span = b.own + here * n;
  b.pieces = (b.span + kP - 1) / kP;
  // Only the tensor's last piece can reach past its end (rows * n elements).
  const long long left = rows * n - b.first;
  b.whole = left >= static_cast<long long>(b.pieces) * kP ? b.pieces : static_cast<int>(left / kP);
  return b;
}

// Starts the copies of block b of the K tensors `src` into the stage's K
// buffers of BUF elements (every thread of the CTA takes every blockDim.x-th
// piece of each). A piece reaching past the tensor's end is copied element
// by element; the piece before the block's own elements lies inside the
// tensor (own > 0 there), so it is read whole.
template <typename T, int K, int BUF>
__device__ __forceinline__ void flat_stage(T* stage, const T* const* src, const FlatBlock& b) {
  constexpr int kP = flat_piece<T>();
  using Piece = Pack<T, kP>;
  const T* from[K];
#pragma unroll
  for (int t = 0; t < K; ++t) from[t] = src[t] + b.first;
  for (int q = threadIdx.x; q < b.pieces; q += blockDim.x) {
#pragma unroll
    for (int t = 0; t < K; ++t) {
      if (q < b.whole)
        cp_async(reinterpret_cast<Piece*>(stage + t * BUF) + q, reinterpret_cast<const Piece*>(from[t]) + q);
      else
        for (int j = q * kP; j < b.span; ++j) stage[t * BUF + j] = from[t][j];  // the tensor's last elements
    }
  }
}

// Copies block b of the buffer `src` out to `dst`: whole pieces as 16-byte
// stores, the pieces it shares with the neighbouring blocks element by
// element (only its own elements: a neighbour's CTA writes the rest).
// Pieces [lo, hi) lie wholly in [own, span).
template <typename T, bool STREAMING>
__device__ __forceinline__ void flat_flush(T* dst, const T* src, const FlatBlock& b) {
  constexpr int kP = flat_piece<T>();
  using Piece = Pack<T, kP>;
  T* const to = dst + b.first;
  const int lo = b.own == 0 ? 0 : 1, hi = b.span / kP;
  for (int q = threadIdx.x; q < b.pieces; q += blockDim.x) {
    if (q >= lo && q < hi) {
      store<T, kP, STREAMING>(to, q * kP, reinterpret_cast<const Piece*>(src)[q]);
    } else {
      for (int j = q * kP; j < q * kP + kP; ++j)
        if (j >= b.own && j < b.span) to[j] = src[j];
    }
  }
}

// The ring shared by both directions: a persistent CTA visits row blocks
// blockIdx.x, + gridDim.x, ...; with STAGES > 1 the copies of `src`'s K
// tensors (src: K pointers at least) for the next block start before it
// works on the current one; a ring of one stage copies each block as it
// comes. `before(rb)` runs while the stage's copies land (loads that need no
// stage); then `body(rb, block, stage, before's value)` works on the stage
// and flushes it.
template <typename T, int K, int BUF, int STAGES = kFlatStages, typename Before, typename Body>
__device__ __forceinline__ void flat_ring(T* stages, const T* const* src, long long row_blocks, int rows_per_block,
                                          long long rows, int n, Before before, Body body) {
  const auto fill = [&](int s, long long rb) {
    if (rb < row_blocks) {
      flat_stage<T, K, BUF>(stages + s * K * BUF, src, flat_block<T>(rb, rows_per_block, rows, n));
    }
    cp_async_commit();
  };
  int s = 0;
#pragma unroll
  for (int k = 0; k + 1 < STAGES; ++k) fill(k, blockIdx.x + 1LL * k * gridDim.x);
  for (long long rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
    fill(s == 0 ? STAGES - 1 : s - 1, rb + 1LL * (STAGES - 1) * gridDim.x);
    const auto early = before(rb);
    cp_async_wait<STAGES - 1>();
    __syncthreads();  // every thread's copies of this stage have landed
    body(rb, flat_block<T>(rb, rows_per_block, rows, n), stages + s * K * BUF, early);
    __syncthreads();  // the stage is read out before the next fill reuses it
    s = s + 1 == STAGES ? 0 : s + 1;
  }
  cp_async_wait<0>();
}

}  // namespace rtcnorm
