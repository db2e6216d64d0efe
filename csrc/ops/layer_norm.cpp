// torch.ops.rtcnorm.layer_norm / layer_norm_backward: CUDA and CPU
// implementations. Schemas live in csrc/registration.cpp; autograd and fake
// implementations in python/rtcnorm/_ops.py.
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "ops/norm_common.h"
#include "ops/norm_cpu.h"

namespace rtcnorm {
namespace {

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias, double eps,
                                                          std::optional<c10::string_view> mode,
                                                          bool zero_centered_gamma) {
  const NormMode m = check_norm_forward("layer_norm", input, std::nullopt, c10::fromIntArrayRefSlow(normalized_shape),
                                        weight, bias, eps, mode, input.is_cuda());
  NormFwdOutputs o = kCuda ? norm_forward_cuda(kLayerNorm, "layer_norm", input, std::nullopt, normalized_shape, weight,
                                               bias, eps, m, zero_centered_gamma)
                           : norm_forward_cpu(kLayerNorm, "layer_norm", input, std::nullopt, normalized_shape, weight,
                                              bias, eps, zero_centered_gamma);
  return {o.y, o.mean, o.rstd};
}

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, at::IntArrayRef normalized_shape,
    bool zero_centered_gamma, bool weight_grad, bool bias_grad) {
  check_norm_backward(kLayerNorm, "layer_norm_backward", grad_out, input, mean, rstd, weight, bias,
                      c10::fromIntArrayRefSlow(normalized_shape), std::nullopt, input.is_cuda());
  auto fn = kCuda ? norm_backward_cuda : norm_backward_cpu;
  auto o = fn(kLayerNorm, "layer_norm_backward", grad_out, input, mean, rstd, weight, bias, normalized_shape,
              zero_centered_gamma, weight_grad, bias_grad, std::nullopt);
  return {o.dx, o.dw, o.db};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtcnorm, CUDA, m) {
  m.impl("layer_norm", &layer_norm<true>);
  m.impl("layer_norm_backward", &layer_norm_backward<true>);
}

TORCH_LIBRARY_IMPL(rtcnorm, CPU, m) {
  m.impl("layer_norm", &layer_norm<false>);
  m.impl("layer_norm_backward", &layer_norm_backward<false>);
}

}  // namespace rtcnorm
