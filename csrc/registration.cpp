// Every op schema of the rtcnorm library, in one place. Implementations are
// registered per dispatch key next to each op (csrc/ops/<op>.cpp); fake
// (meta) implementations and autograd in python/rtcnorm/_ops.py.
//
// Conventions:
// - Forward ops return the per-row statistics their backward needs (rstd,
//   and mean for LayerNorm) as extra outputs, float32 (float64 on CPU for
//   float64 input).
// - A backward op returns an empty tensor for a gradient that was not asked for.
#include <torch/library.h>

TORCH_LIBRARY(rtcnorm, m) {
  // ---- RMSNorm ----
  m.def(
      "rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None, str? mode=None, "
      "bool zero_centered_gamma=False) -> (Tensor, Tensor)");
  m.def(
      "add_rms_norm(Tensor input, Tensor residual, int[] normalized_shape, Tensor? weight=None, float? eps=None, "
      "str? mode=None, bool zero_centered_gamma=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "rms_norm_backward(Tensor grad_out, Tensor input, Tensor rstd, Tensor? weight, int[] normalized_shape, "
      "bool zero_centered_gamma, bool weight_grad, Tensor? grad_h=None) -> (Tensor, Tensor)");

  // ---- LayerNorm ----
  m.def(
      "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, "
      "str? mode=None, bool zero_centered_gamma=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "layer_norm_backward(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, "
      "int[] normalized_shape, bool zero_centered_gamma, bool weight_grad, bool bias_grad) "
      "-> (Tensor, Tensor, Tensor)");

  // ---- Softmax family ----
  // (softmax schemas)
}
