// The softmax family: argument checks shared by every path, and the CPU
// (reference-quality) implementations.
//
// Semantics every implementation keeps:
// - The softmax runs over the last dim of x, in fp32 (fp64 for fp64 CPU
//   input), output in x's dtype: y = softmax(scale * x) with masked elements
//   excluded and set to exactly 0.
// - A row with no visible element (a fully masked row) is all zeros, never
//   NaN, and its gradient is zero.
// - Causal ops take (..., sq, sk); query q sees keys j <= q + (sk - sq).
// - The backward reads only y and dy: dx = scale * y * (dy - sum(dy * y)),
//   with dx = 0 wherever y = 0 is structural (causal: never read).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/common/softmax_params.cuh"
#include "ops/softmax/plan/problem.h"

namespace rtcnorm {

enum class SoftmaxOp { kScaled, kMasked, kUpperTriang, kAlignedCausal };

const char* softmax_op_name(SoftmaxOp op);
SoftmaxKind softmax_kind(SoftmaxOp op);
SoftmaxVariant softmax_variant(SoftmaxOp op);

struct SoftmaxDims {
  int64_t rows = 0;
  int64_t cols = 0;  // sk
  int64_t sq = 1;    // causal ops: queries per (sq x sk) matrix
};

// Every argument check of a softmax forward call (mask: scaled_masked_softmax's,
// else nullptr) and of the backward, in ops/softmax/softmax_checks.cpp: ONE
// implementation for the CPU and CUDA impls and the fake impls
// (python/rtcnorm/_softmax_ops.py, through rtcnorm._C). Symbolic sizes are
// checked as ops/norm_checks.h says. `cuda` selects the CUDA path's rules
// (kernel dtypes, launch limits); the real impls pass input.is_cuda().
void check_softmax_forward(SoftmaxOp op, const at::Tensor& input, const at::Tensor* mask, double scale, bool cuda);
void check_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, double scale, bool causal,
                            bool cuda);
// The dims of a checked input (or output).
SoftmaxDims softmax_dims(const at::Tensor& t, bool causal);

// The CPU paths; the op entries check the arguments first.
at::Tensor softmax_forward_cpu(SoftmaxOp op, const at::Tensor& input, const at::Tensor* mask, double scale);
at::Tensor softmax_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output, double scale, bool causal);

}  // namespace rtcnorm
