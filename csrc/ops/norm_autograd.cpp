// Autograd for rms_norm, add_rms_norm and layer_norm, registered at the
// Autograd key in C++. A Python autograd wrapper costs tens of microseconds
// per call, which at small shapes is more than the kernels take; here the
// backward node calls the backward op directly from the autograd engine.
//
// Invariants:
// - The forward redispatches below autograd, so the same code serves CUDA,
//   CPU and fake tensors (torch.compile traces through it).
// - Statistics outputs (rstd, mean) are non-differentiable; an incoming
//   gradient for them is ignored, and none is materialised.
// - The weight's gradient is computed only when the weight requires it.
// - A call that needs no node (needs_no_node) runs the op below autograd
//   directly; its outputs are the same tensors the node would have returned.
// - The backward is once differentiable: it runs the backward op below
//   autograd, and under create_graph=True its gradients raise a clear error
//   if differentiated again (once_differentiable), never a wrong number.
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>

#include "ops/autograd_util.h"

namespace rtcnorm {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using RmsFwd = std::tuple<Tensor, Tensor>(const Tensor&, at::IntArrayRef, const std::optional<Tensor>&,
                                          std::optional<double>, std::optional<c10::string_view>, bool);
using AddRmsFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, at::IntArrayRef,
                                                     const std::optional<Tensor>&, std::optional<double>,
                                                     std::optional<c10::string_view>, bool);
using RmsBwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                          at::IntArrayRef, bool, bool, const std::optional<Tensor>&);
using LnFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, at::IntArrayRef, const std::optional<Tensor>&,
                                                 const std::optional<Tensor>&, double, std::optional<c10::string_view>,
                                                 bool);
using LnBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                 const std::optional<Tensor>&, const std::optional<Tensor>&,
                                                 at::IntArrayRef, bool, bool, bool);

// needs_input_grad counts the tensor arguments that were given: an absent
// optional weight shifts the bias down by one.
constexpr size_t kRmsWeightEdge = 1, kAddRmsWeightEdge = 2, kLnWeightEdge = 1;

std::optional<Tensor> opt(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

constexpr const char* kRmsTwice =
    "rtcnorm.rms_norm: double backward is not supported (the backward is once differentiable); "
    "use torch.nn.functional.rms_norm where a second derivative is needed";
constexpr const char* kAddRmsTwice =
    "rtcnorm.add_rms_norm: double backward is not supported (the backward is once differentiable); "
    "use torch.nn.functional.rms_norm on input + residual where a second derivative is needed";
constexpr const char* kLnTwice =
    "rtcnorm.layer_norm: double backward is not supported (the backward is once differentiable); "
    "use torch.nn.functional.layer_norm where a second derivative is needed";

// The ops below autograd, found once.
const c10::TypedOperatorHandle<RmsFwd>& rms_fwd() {
  static const auto op = typed_op<RmsFwd>("rtcnorm::rms_norm");
  return op;
}
const c10::TypedOperatorHandle<AddRmsFwd>& add_rms_fwd() {
  static const auto op = typed_op<AddRmsFwd>("rtcnorm::add_rms_norm");
  return op;
}
const c10::TypedOperatorHandle<LnFwd>& ln_fwd() {
  static const auto op = typed_op<LnFwd>("rtcnorm::layer_norm");
  return op;
}

class RmsNormFn : public torch::autograd::Function<RmsNormFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, at::IntArrayRef normalized_shape,
                               const std::optional<Tensor>& weight, std::optional<double> eps,
                               std::optional<c10::string_view> mode, bool zero_centered) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, rstd] = rms_fwd().call(input, normalized_shape, weight, eps, mode, zero_centered);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({input, weight.value_or(Tensor()), rstd});
    ctx->saved_data["shape"] = normalized_shape.vec();
    ctx->saved_data["zc"] = zero_centered;
    ctx->mark_non_differentiable({rstd});
    return {y, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = typed_op<RmsBwd>("rtcnorm::rms_norm_backward");
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const bool want_w = saved[1].defined() && ctx->needs_input_grad(kRmsWeightEdge);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [dx, dw] = bwd.call(grad_or_zeros(grads[0], saved[0]), saved[0], saved[2], opt(saved[1]), shape,
                             ctx->saved_data["zc"].toBool(), want_w, std::nullopt);
    return once_differentiable({grads[0], saved[0], saved[1]},
                               {dx, Tensor(), want_w ? dw : Tensor(), Tensor(), Tensor(), Tensor()}, kRmsTwice);
  }
};

class AddRmsNormFn : public torch::autograd::Function<AddRmsNormFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& residual,
                               at::IntArrayRef normalized_shape, const std::optional<Tensor>& weight,
                               std::optional<double> eps, std::optional<c10::string_view> mode, bool zero_centered) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, h, rstd] = add_rms_fwd().call(input, residual, normalized_shape, weight, eps, mode, zero_centered);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({h, weight.value_or(Tensor()), rstd});
    ctx->saved_data["shape"] = normalized_shape.vec();
    ctx->saved_data["zc"] = zero_centered;
    ctx->mark_non_differentiable({rstd});
    return {y, h, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = typed_op<RmsBwd>("rtcnorm::rms_norm_backward");
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const bool want_w = saved[1].defined() && ctx->needs_input_grad(kAddRmsWeightEdge);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [dh, dw] = bwd.call(grad_or_zeros(grads[0], saved[0]), saved[0], saved[2], opt(saved[1]), shape,
                             ctx->saved_data["zc"].toBool(), want_w, opt(grads[1]));
    return once_differentiable({grads[0], grads[1], saved[0], saved[1]},
                               {dh, dh, Tensor(), want_w ? dw : Tensor(), Tensor(), Tensor(), Tensor()}, kAddRmsTwice);
  }
};

class LayerNormFn : public torch::autograd::Function<LayerNormFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, at::IntArrayRef normalized_shape,
                               const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, double eps,
                               std::optional<c10::string_view> mode, bool zero_centered) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = ln_fwd().call(input, normalized_shape, weight, bias, eps, mode, zero_centered);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({input, weight.value_or(Tensor()), bias.value_or(Tensor()), mean, rstd});
    ctx->saved_data["shape"] = normalized_shape.vec();
    ctx->saved_data["zc"] = zero_centered;
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = typed_op<LnBwd>("rtcnorm::layer_norm_backward");
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const bool want_w = saved[1].defined() && ctx->needs_input_grad(kLnWeightEdge);
    const bool want_b = saved[2].defined() && ctx->needs_input_grad(saved[1].defined() ? 2 : 1);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [dx, dw, db] = bwd.call(grad_or_zeros(grads[0], saved[0]), saved[0], saved[3], saved[4], opt(saved[1]),
                                 opt(saved[2]), shape, ctx->saved_data["zc"].toBool(), want_w, want_b);
    return once_differentiable(
        {grads[0], saved[0], saved[1], saved[2]},
        {dx, Tensor(), want_w ? dw : Tensor(), want_b ? db : Tensor(), Tensor(), Tensor(), Tensor()}, kLnTwice);
  }
};

std::tuple<Tensor, Tensor> rms_norm_autograd(const Tensor& input, at::IntArrayRef normalized_shape,
                                             const std::optional<Tensor>& weight, std::optional<double> eps,
                                             std::optional<c10::string_view> mode, bool zero_centered) {
  if (needs_no_node({&input, optional_ptr(weight)})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rms_fwd().call(input, normalized_shape, weight, eps, mode, zero_centered);
  }
  auto out = RmsNormFn::apply(input, normalized_shape, weight, eps, mode, zero_centered);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_autograd(const Tensor& input, const Tensor& residual,
                                                         at::IntArrayRef normalized_shape,
                                                         const std::optional<Tensor>& weight, std::optional<double> eps,
                                                         std::optional<c10::string_view> mode, bool zero_centered) {
  if (needs_no_node({&input, &residual, optional_ptr(weight)})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return add_rms_fwd().call(input, residual, normalized_shape, weight, eps, mode, zero_centered);
  }
  auto out = AddRmsNormFn::apply(input, residual, normalized_shape, weight, eps, mode, zero_centered);
  return {out[0], out[1], out[2]};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_autograd(const Tensor& input, at::IntArrayRef normalized_shape,
                                                       const std::optional<Tensor>& weight,
                                                       const std::optional<Tensor>& bias, double eps,
                                                       std::optional<c10::string_view> mode, bool zero_centered) {
  if (needs_no_node({&input, optional_ptr(weight), optional_ptr(bias)})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return ln_fwd().call(input, normalized_shape, weight, bias, eps, mode, zero_centered);
  }
  auto out = LayerNormFn::apply(input, normalized_shape, weight, bias, eps, mode, zero_centered);
  return {out[0], out[1], out[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtcnorm, Autograd, m) {
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
  m.impl("layer_norm", &layer_norm_autograd);
}

}  // namespace rtcnorm
