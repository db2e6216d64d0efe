// torch.ops.rtcnorm.norm_quant: RMSNorm (with an optional residual) or
// LayerNorm whose output is quantized as it is written (ops/norm/quant.h).
// CUDA: the planned forward kernel with the quantizing epilogue; CPU: the
// float32 reference forward, then the same quantizer arithmetic.
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "ops/norm/quant.h"
#include "ops/norm_common.h"
#include "ops/norm_cpu.h"

namespace rtcnorm {
namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

template <bool kCuda>
Outputs norm_quant(const at::Tensor& input, const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
                   const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                   std::optional<double> eps, c10::string_view norm, c10::string_view recipe, at::ScalarType out_dtype,
                   const std::optional<at::Tensor>& scale, c10::string_view scale_layout, bool zero_centered_gamma,
                   std::optional<c10::string_view> mode) {
  const QuantCall c = check_norm_quant(input, residual, c10::fromIntArrayRefSlow(normalized_shape), weight, bias, eps,
                                       norm, recipe, out_dtype, scale, scale_layout, mode, input.is_cuda());
  const char* op = c.op;
  const NormKind kind = c.kind;
  const QuantSpec& q = c.spec;
  const double e = kind == kRmsNorm ? rms_norm_eps(input, eps) : eps.value_or(1e-5);
  const NormDims d = norm_dims(input, normalized_shape);
  QuantOutputs qo = quant_outputs(q, input, d.lead, d.rows, d.hidden, scale);
  NormFwdOutputs o;
  if constexpr (kCuda) {
    const QuantLaunch ql = quant_launch(q, qo, scale, d.hidden);
    o = norm_forward_cuda(kind, op, input, residual, normalized_shape, weight, bias, e, c.mode, zero_centered_gamma,
                          &ql);
  } else {
    // float32 math on the input (h rounded to input's dtype first), y kept in float32.
    const at::Tensor h = residual.has_value() ? input + *residual : at::Tensor();
    const at::Tensor xf = (h.defined() ? h : input).to(at::kFloat);
    auto f32 = [](const std::optional<at::Tensor>& t) {
      return t.has_value() ? std::optional<at::Tensor>(t->to(at::kFloat)) : std::nullopt;
    };
    o = norm_forward_cpu(kind, op, xf, std::nullopt, normalized_shape, f32(weight), f32(bias), e, zero_centered_gamma);
    o.h = h;
    if (d.rows > 0) quantize_rows_cpu(q, o.y.reshape({d.rows, d.hidden}).contiguous(), host_scale(scale), qo);
  }
  const auto stat = input.options().dtype(at::kFloat);
  return {qo.data,
          qo.scales,
          qo.amax,
          o.h.defined() ? o.h : at::empty({0}, input.options()),
          o.mean.defined() ? o.mean : at::empty({0}, stat),
          o.rstd};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtcnorm, CUDA, m) { m.impl("norm_quant", &norm_quant<true>); }
TORCH_LIBRARY_IMPL(rtcnorm, CPU, m) { m.impl("norm_quant", &norm_quant<false>); }

}  // namespace rtcnorm
