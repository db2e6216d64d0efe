// Helpers shared by the C++ autograd registrations (norm_autograd.cpp,
// softmax_autograd.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros_like.h>

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

}  // namespace rtcnorm
