// The norm kernel templates (jit::KernelFamily) and how their keys are spelled.
#pragma once

#include <cstdint>

#include "jit/kernel_key.h"
#include "kernels/common/params.cuh"

namespace rtcnorm {

extern const jit::KernelFamily kRmsNormFwd, kRmsNormBwd, kLayerNormFwd, kLayerNormBwd, kColumnReduce;
extern const jit::KernelFamily kRmsNormBwdCoef, kRmsNormBwdCols, kLayerNormBwdCoef, kLayerNormBwdCols;
extern const jit::KernelFamily kRmsNormFwdFlat, kRmsNormBwdFlat, kLayerNormFwdFlat, kLayerNormBwdFlat;

const jit::KernelFamily* fwd_family(NormKind k);
const jit::KernelFamily* bwd_family(NormKind k);
const jit::KernelFamily* fwd_flat_family(NormKind k);
const jit::KernelFamily* bwd_flat_family(NormKind k);
const jit::KernelFamily* split_coef_family(NormKind k);
const jit::KernelFamily* split_cols_family(NormKind k);

// The dW / dB column reducer (column_reduce.cuh): each thread owns
// column_reduce_width(cols) columns, 4 for rows of 16384+ (a multiple of 4),
// where a grid of 4-column threads still has a CTA an SM, else 1.
constexpr int64_t kColumnReduceWideCols = 16384;
inline int column_reduce_width(int64_t cols) { return cols % 4 == 0 && cols >= kColumnReduceWideCols ? 4 : 1; }
jit::KernelKey column_reduce_key(jit::DType out, int64_t cols, int arch);

}  // namespace rtcnorm
