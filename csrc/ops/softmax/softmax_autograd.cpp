// Autograd for the four softmax ops, registered at the Autograd key in C++
// (a Python wrapper adds tens of microseconds of host time per call).
//
// Invariants:
// - The backward reads only the saved output: dx = scale * y * (dy - sum(dy * y)),
//   never x or the mask; the causal ops pass causal=true so the backward skips
//   (and zero-fills) the region past the diagonal.
// - The mask gets no gradient; there is no double backward.
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>

#include "ops/autograd_util.h"

namespace rtcnorm {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum SoftmaxKind : int64_t { kPlain = 0, kMasked = 1, kUpperTriang = 2, kAlignedCausal = 3 };

using UnmaskedSig = Tensor(const Tensor&, double);
using MaskedSig = Tensor(const Tensor&, const Tensor&, double);
using BackwardSig = Tensor(const Tensor&, const Tensor&, double, bool);

// The forward op of `kind`, called below autograd.
Tensor softmax_below_autograd(const Tensor& input, const std::optional<Tensor>& mask, double scale, int64_t kind) {
  static const auto plain = typed_op<UnmaskedSig>("rtcnorm::scaled_softmax");
  static const auto masked = typed_op<MaskedSig>("rtcnorm::scaled_masked_softmax");
  static const auto upper = typed_op<UnmaskedSig>("rtcnorm::scaled_upper_triang_masked_softmax");
  static const auto aligned = typed_op<UnmaskedSig>("rtcnorm::scaled_aligned_causal_masked_softmax");
  switch (kind) {
    case kMasked:
      return masked.call(input, *mask, scale);
    case kUpperTriang:
      return upper.call(input, scale);
    case kAlignedCausal:
      return aligned.call(input, scale);
    default:
      return plain.call(input, scale);
  }
}

class SoftmaxFn : public torch::autograd::Function<SoftmaxFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const std::optional<Tensor>& mask,
                               double scale, int64_t kind) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Tensor y = softmax_below_autograd(input, mask, scale, kind);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = kind == kUpperTriang || kind == kAlignedCausal;
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = typed_op<BackwardSig>("rtcnorm::scaled_softmax_backward");
    const Tensor y = ctx->get_saved_variables()[0];
    const Tensor dx = bwd.call(grad_or_zeros(grads[0], y), y, ctx->saved_data["scale"].toDouble(),
                               ctx->saved_data["causal"].toBool());
    return {dx, Tensor(), Tensor(), Tensor()};
  }
};

// Runs the op through SoftmaxFn, or below autograd when no node is needed.
Tensor softmax_autograd(const Tensor& input, const std::optional<Tensor>& mask, double scale, int64_t kind) {
  if (needs_no_node({&input, optional_ptr(mask)})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return softmax_below_autograd(input, mask, scale, kind);
  }
  return SoftmaxFn::apply(input, mask, scale, kind)[0];
}

Tensor scaled_softmax_autograd(const Tensor& input, double scale) {
  return softmax_autograd(input, std::nullopt, scale, kPlain);
}

Tensor scaled_masked_softmax_autograd(const Tensor& input, const Tensor& mask, double scale) {
  return softmax_autograd(input, mask, scale, kMasked);
}

Tensor scaled_upper_triang_masked_softmax_autograd(const Tensor& input, double scale) {
  return softmax_autograd(input, std::nullopt, scale, kUpperTriang);
}

Tensor scaled_aligned_causal_masked_softmax_autograd(const Tensor& input, double scale) {
  return softmax_autograd(input, std::nullopt, scale, kAlignedCausal);
}

}  // namespace

TORCH_LIBRARY_IMPL(rtcnorm, Autograd, m) {
  m.impl("scaled_softmax", &scaled_softmax_autograd);
  m.impl("scaled_masked_softmax", &scaled_masked_softmax_autograd);
  m.impl("scaled_upper_triang_masked_softmax", &scaled_upper_triang_masked_softmax_autograd);
  m.impl("scaled_aligned_causal_masked_softmax", &scaled_aligned_causal_masked_softmax_autograd);
}

}  // namespace rtcnorm
