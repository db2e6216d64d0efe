// RMSNorm kernels: y = x * rsqrt(mean(x^2) + eps) * g, with g = gamma,
// 1 + gamma (zero-centred) or 1 (no weight). The bodies are shared with
// LayerNorm (norm/fwd_rows.cuh, norm/bwd_rows.cuh); RMSNorm is the
// kRmsNorm statistics policy: mean fixed at 0, sum of squares only.
//
// MINB is the CTAs per SM the launch bounds ask registers to allow (the
// planner's occupancy target); it changes the register cap, never the result.
#pragma once

#include "norm/bwd_entry.cuh"
#include "norm/bwd_split_row.cuh"
#include "norm/flat_row.cuh"
#include "norm/fwd_rows.cuh"
#include "norm/fwd_sliced_row.cuh"

namespace rtcnorm {

template <typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS, int MINB>
__global__ void __launch_bounds__(TPR* ROWS, MINB) rms_norm_fwd(const NormFwdParams p) {
  if constexpr ((FLAGS & kDeferStats) != 0)
    norm_fwd_deferred<kRmsNorm, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
  else
    norm_fwd<kRmsNorm, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
}

template <typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS, int MINB>
__global__ void __launch_bounds__(TPR* ROWS, MINB) rms_norm_bwd(const NormBwdParams p) {
  norm_bwd_entry<kRmsNorm, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
}

// Split backward for rows that do not fit in registers (norm/bwd_split_row.cuh).
// coef: one CTA of TPR threads per row (ROWS == 1). cols: TPR is the CTA's
// column threads and NV the rows each thread keeps in flight (ROWS == 1).
template <typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS, int MINB>
__global__ void __launch_bounds__(TPR, MINB) rms_norm_bwd_coef(const NormBwdParams p) {
  norm_bwd_coef<kRmsNorm, T, W, N, VEC, TPR, NV, FLAGS>(p);
}

template <typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS, int MINB>
__global__ void __launch_bounds__(TPR, MINB) rms_norm_bwd_cols(const NormBwdParams p) {
  norm_bwd_cols<kRmsNorm, T, W, N, VEC, TPR, NV, FLAGS>(p);
}

// flat_row: rows of any width staged through shared memory in 16-byte pieces
// of the flat tensor (norm/flat_row.cuh).
template <typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS, int MINB>
__global__ void __launch_bounds__(TPR* ROWS, MINB) rms_norm_fwd_flat(const NormFwdParams p) {
  norm_fwd_flat<kRmsNorm, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
}

template <typename T, typename W, int N, int VEC, int TPR, int ROWS, int NV, unsigned FLAGS, int MINB>
__global__ void __launch_bounds__(TPR* ROWS, MINB) rms_norm_bwd_flat(const NormBwdParams p) {
  norm_bwd_flat<kRmsNorm, T, W, N, VEC, TPR, ROWS, NV, FLAGS>(p);
}

}  // namespace rtcnorm
