// Helpers shared by the C++ autograd registrations (norm_autograd.cpp,
// softmax/softmax_autograd.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <initializer_list>
#include <memory>
#include <string>

namespace rtcnorm {

// A typed handle to one of rtcnorm's own ops, found once per call site.
template <typename Sig>
c10::TypedOperatorHandle<Sig> typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// Gradients are not materialised (that would launch a fill for every unused
// output): an unused output's gradient arrives undefined and counts as zeros.
inline at::Tensor grad_or_zeros(const at::Tensor& g, const at::Tensor& like) {
  return g.defined() ? g : at::zeros_like(like);
}

// True when a call builds no autograd node: grad mode is off or no tensor
// argument requires grad, and none carries a forward-mode tangent (the node
// is what rejects those). The op then runs below autograd directly instead
// of building a node only to discard it (about 3 us of host time per call).
// Absent optional arguments are passed as nullptr.
inline bool needs_no_node(std::initializer_list<const at::Tensor*> args) {
  const bool grad_mode = c10::GradMode::is_enabled();
  for (const at::Tensor* t : args) {
    if (t == nullptr || !t->defined()) continue;
    if ((grad_mode && t->requires_grad()) || t->_fw_grad(/*level=*/0).defined()) return false;
  }
  return true;
}

inline const at::Tensor* optional_ptr(const std::optional<at::Tensor>& t) { return t.has_value() ? &*t : nullptr; }

// The gradients a backward returns, made once differentiable. Where the
// backward runs with grad mode on (create_graph=True) and one of `inputs`
// (its incoming gradients and saved tensors) requires grad, the gradients
// get a node that raises `msg` if a second backward reaches it; their values
// are the first-order gradients either way. Without it they would carry no
// history through rstd and mean, and a second derivative would come out
// silently wrong.
inline torch::autograd::variable_list once_differentiable(const torch::autograd::variable_list& inputs,
                                                          torch::autograd::variable_list grads, const char* msg) {
  if (!c10::GradMode::is_enabled()) return grads;
  return torch::autograd::wrap_outputs(inputs, std::move(grads), [msg](torch::autograd::edge_list&& next) {
    return std::make_shared<torch::autograd::Error>(msg, std::move(next));
  });
}

}  // namespace rtcnorm
