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

class SoftmaxFn : public torch::autograd::Function<SoftmaxFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const std::optional<Tensor>& mask,
                               double scale, int64_t kind) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto plain = typed_op<UnmaskedSig>("rtcnorm::scaled_softmax");
    static auto masked = typed_op<MaskedSig>("rtcnorm::scaled_masked_softmax");
    static auto upper = typed_op<UnmaskedSig>("rtcnorm::scaled_upper_triang_masked_softmax");
    static auto aligned = typed_op<UnmaskedSig>("rtcnorm::scaled_aligned_causal_masked_softmax");
    Tensor y;
    switch (kind) {
      case kMasked:
        y = masked.call(input, *mask, scale);
        break;
      case kUpperTriang:
        y = upper.call(input, scale);
        break;
      case kAlignedCausal:
        y = aligned.call(input, scale);
        break;
      default:
        y = plain.call(input, scale);
    }
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

Tensor scaled_softmax_autograd(const Tensor& input, double scale) {
  return SoftmaxFn::apply(input, std::nullopt, scale, kPlain)[0];
}

Tensor scaled_masked_softmax_autograd(const Tensor& input, const Tensor& mask, double scale) {
  return SoftmaxFn::apply(input, mask, scale, kMasked)[0];
}

Tensor scaled_upper_triang_masked_softmax_autograd(const Tensor& input, double scale) {
  return SoftmaxFn::apply(input, std::nullopt, scale, kUpperTriang)[0];
}

Tensor scaled_aligned_causal_masked_softmax_autograd(const Tensor& input, double scale) {
  return SoftmaxFn::apply(input, std::nullopt, scale, kAlignedCausal)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(rtcnorm, Autograd, m) {
  m.impl("scaled_softmax", &scaled_softmax_autograd);
  m.impl("scaled_masked_softmax", &scaled_masked_softmax_autograd);
  m.impl("scaled_upper_triang_masked_softmax", &scaled_upper_triang_masked_softmax_autograd);
  m.impl("scaled_aligned_causal_masked_softmax", &scaled_aligned_causal_masked_softmax_autograd);
}

}  // namespace rtcnorm
