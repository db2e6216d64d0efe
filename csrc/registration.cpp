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

  // ---- Gated RMSNorm (ops/norm/gated.h) ----
  // Per group of group_size consecutive columns (None: the whole last dim);
  // returns (y, rstd of shape lead + (N / group_size,)).
  m.def(
      "rms_norm_gated(Tensor input, Tensor gate, Tensor? weight=None, float? eps=None, bool norm_before_gate=True, "
      "int? group_size=None, str activation=\"silu\") -> (Tensor, Tensor)");
  m.def(
      "rms_norm_gated_backward(Tensor grad_out, Tensor input, Tensor gate, Tensor rstd, Tensor? weight, "
      "bool norm_before_gate, int? group_size, str activation, bool weight_grad) -> (Tensor, Tensor, Tensor)");
  // The gated forward with a quantized output (norm_quant's recipes and
  // scale layouts); returns (data, dequant scales, amax of y or empty, rstd).
  m.def(
      "rms_norm_gated_quant(Tensor input, Tensor gate, Tensor? weight, float? eps, bool norm_before_gate, "
      "int? group_size, str activation, str recipe, ScalarType out_dtype, Tensor? scale=None, "
      "str scale_layout=\"plain\") -> (Tensor, Tensor, Tensor, Tensor)");

  // ---- LayerNorm ----
  m.def(
      "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, "
      "str? mode=None, bool zero_centered_gamma=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "layer_norm_backward(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, "
      "int[] normalized_shape, bool zero_centered_gamma, bool weight_grad, bool bias_grad) "
      "-> (Tensor, Tensor, Tensor)");

  // ---- Quantized norm outputs (docs/quantized_outputs.md) ----
  // norm: 'rms_norm' (residual: add_rms_norm) or 'layer_norm'. recipe:
  // 'per_tensor' / 'per_token' (FP8), 'mxfp8', 'nvfp4'; scale: the
  // per-tensor quantize multiplier or NVFP4's global encode scale. Returns
  // (data, dequant scales, amax of y or empty, h or empty, mean or empty,
  // rstd); mean / rstd / h feed rms_norm_backward / layer_norm_backward.
  m.def(
      "norm_quant(Tensor input, Tensor? residual, int[] normalized_shape, Tensor? weight, Tensor? bias, float? eps, "
      "str norm, str recipe, ScalarType out_dtype, Tensor? scale=None, str scale_layout=\"plain\", "
      "bool zero_centered_gamma=False, str? mode=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");

  // ---- Softmax family ----
  // softmax(scale * x) over the last dim, masked elements excluded (0 in the
  // output); a row with nothing visible is all zeros. mask: bool, True =
  // masked out, broadcastable to input. Causal ops take (..., sq, sk): query q
  // sees keys j <= q + (sk - sq) (upper_triang: sq == sk; aligned: sq <= sk).
  m.def("scaled_softmax(Tensor input, float scale=1.0) -> Tensor");
  m.def("scaled_masked_softmax(Tensor input, Tensor mask, float scale=1.0) -> Tensor");
  m.def("scaled_upper_triang_masked_softmax(Tensor input, float scale=1.0) -> Tensor");
  m.def("scaled_aligned_causal_masked_softmax(Tensor input, float scale=1.0) -> Tensor");
  // dx = scale * y * (dy - sum(dy * y)) from the forward's output y alone;
  // causal: keys past the diagonal are not read and get dx = 0.
  m.def("scaled_softmax_backward(Tensor grad_output, Tensor output, float scale, bool causal=False) -> Tensor");
}
