// The backward's design dispatch, one body for RMSNorm and LayerNorm: the
// flag word picks sliced_row with deferred statistics (bwd_sliced_row.cuh),
// column_grads (bwd_column_grads.cuh, row CTAs beside column CTAs), or the
// persistent row kernel (bwd_rows.cuh: register_row, staged_row, sliced_row
// meeting per row block). split_row is its own pair of kernels
// (bwd_split_row.cuh).
//
// Invariant: the flags a design sets select exactly one body at compile time.
#pragma once

#include "norm/bwd_column_grads.cuh"
#include "norm/bwd_rows.cuh"
#include "norm/bwd_sliced_row.cuh"

namespace rtcnorm {

template <int KIND, typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS>
__device__ __forceinline__ void norm_bwd_entry(const NormBwdParams& p) {
  if constexpr ((FLAGS & kDeferStats) != 0) {
    norm_bwd_deferred<KIND, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
  } else if constexpr ((FLAGS & kColumnGrads) != 0) {
    static_assert((FLAGS & (kCachedRow | kStagedRow | kDirectGrads | kClusterBits | kCluster16)) == kCachedRow,
                  "column CTAs pair with register rows of lone CTAs that write no gradient");
    if (blockIdx.x >= p.row_blocks)
      norm_bwd_column_grads<KIND, T, W, N, VEC, FLAGS>(p);
    else
      norm_bwd<KIND, T, W, N, VEC, TPR, ROWS, NV, FLAGS & ~(kWantDw | kWantDb | kColumnGrads)>(p);
  } else {
    norm_bwd<KIND, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
  }
}

}  // namespace rtcnorm
