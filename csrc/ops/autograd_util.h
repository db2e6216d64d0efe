// Helpers shared by the C++ autograd registrations (norm_autograd.cpp,
// softmax_autograd.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <initializer_list>

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

}  // namespace rtcnorm
