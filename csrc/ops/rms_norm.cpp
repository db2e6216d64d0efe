// torch.ops.rtcnorm.rms_norm / add_rms_norm / rms_norm_backward: CUDA and CPU
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
std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                            const std::optional<at::Tensor>& weight, std::optional<double> eps,
                                            std::optional<c10::string_view> mode, bool zero_centered_gamma) {
  const NormMode m = check_norm_forward("rms_norm", input, std::nullopt, c10::fromIntArrayRefSlow(normalized_shape),
                                        weight, std::nullopt, eps, mode, input.is_cuda());
  const double e = rms_norm_eps(input, eps);
  auto o = kCuda ? norm_forward_cuda(kRmsNorm, "rms_norm", input, std::nullopt, normalized_shape, weight, std::nullopt,
                                     e, m, zero_centered_gamma)
                 : norm_forward_cpu(kRmsNorm, "rms_norm", input, std::nullopt, normalized_shape, weight, std::nullopt,
                                    e, zero_centered_gamma);
  return {o.y, o.rstd};
}

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                            at::IntArrayRef normalized_shape,
                                                            const std::optional<at::Tensor>& weight,
                                                            std::optional<double> eps,
                                                            std::optional<c10::string_view> mode,
                                                            bool zero_centered_gamma) {
  const NormMode m = check_norm_forward("add_rms_norm", input, residual, c10::fromIntArrayRefSlow(normalized_shape),
                                        weight, std::nullopt, eps, mode, input.is_cuda());
  const double e = rms_norm_eps(input, eps);
  auto o = kCuda ? norm_forward_cuda(kRmsNorm, "add_rms_norm", input, residual, normalized_shape, weight, std::nullopt,
                                     e, m, zero_centered_gamma)
                 : norm_forward_cpu(kRmsNorm, "add_rms_norm", input, residual, normalized_shape, weight, std::nullopt,
                                    e, zero_centered_gamma);
  return {o.y, o.h, o.rstd};
}

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                     const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                                                     at::IntArrayRef normalized_shape, bool zero_centered_gamma,
                                                     bool weight_grad, const std::optional<at::Tensor>& grad_h) {
  check_norm_backward(kRmsNorm, "rms_norm_backward", grad_out, input, std::nullopt, rstd, weight, std::nullopt,
                      c10::fromIntArrayRefSlow(normalized_shape), grad_h, input.is_cuda());
  auto fn = kCuda ? norm_backward_cuda : norm_backward_cpu;
  auto o = fn(kRmsNorm, "rms_norm_backward", grad_out, input, std::nullopt, rstd, weight, std::nullopt,
              normalized_shape, zero_centered_gamma, weight_grad, false, grad_h);
  return {o.dx, o.dw};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtcnorm, CUDA, m) {
  m.impl("rms_norm", &rms_norm<true>);
  m.impl("add_rms_norm", &add_rms_norm<true>);
  m.impl("rms_norm_backward", &rms_norm_backward<true>);
}

TORCH_LIBRARY_IMPL(rtcnorm, CPU, m) {
  m.impl("rms_norm", &rms_norm<false>);
  m.impl("add_rms_norm", &add_rms_norm<false>);
  m.impl("rms_norm_backward", &rms_norm_backward<false>);
}

}  // namespace rtcnorm
