// Reference-quality CPU implementations of the norm ops, in fp32 (fp64 for
// fp64 input) with ATen ops. They define the semantics the CUDA kernels are
// tested against, and serve CPU tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/norm_common.h"

namespace rtcnorm {

NormFwdOutputs norm_forward_cpu(NormKind kind, const char* op, const at::Tensor& input,
                                const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                double eps, bool zero_centered);

NormBwdOutputs norm_backward_cpu(NormKind kind, const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                                 const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                                 const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                 at::IntArrayRef normalized_shape, bool zero_centered, bool want_dw, bool want_db,
                                 const std::optional<at::Tensor>& grad_h);

}  // namespace rtcnorm
