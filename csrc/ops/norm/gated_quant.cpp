// torch.ops.rtcnorm.rms_norm_gated_quant: the gated RMSNorm (ops/norm/gated.h)
// whose output is quantized as it is written, with the recipes, scale
// layouts and checks of norm_quant (ops/norm/quant.h).
//
// CUDA: the gated forward kernel emitting through quant_epilogue.cuh where
// gated_key carries the recipe; elsewhere (a block straddling two groups, a
// per-token row that is no whole warp or power-of-two lane group, rows too
// wide for registers) the fp32 composite forward on the device, quantized
// by the CPU quantizer and copied back: slower, never different codes.
// CPU: the fp32 composite forward, then the same quantizer.
#include <ATen/ATen.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "ops/norm/gated.h"
#include "ops/norm/quant.h"
#include "ops/norm_checks.h"

namespace rtcnorm {

QuantSpec check_gated_quant(const at::Tensor& input, const at::Tensor& gate, const std::optional<at::Tensor>& weight,
                            std::optional<double> eps, std::optional<c10::SymInt> group_size,
                            c10::string_view activation, c10::string_view recipe, at::ScalarType out_dtype,
                            const std::optional<at::Tensor>& scale, c10::string_view scale_layout, bool cuda,
                            bool scale_value) {
  check_gated_forward(input, gate, weight, eps, std::move(group_size), activation, cuda);
  return check_quant_args(input, recipe, out_dtype, scale, scale_layout, scale_value);
}

namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Quantizes y (input's shape, float32, any device) with the CPU quantizer;
// the outputs land on input's device.
QuantOutputs quantize_via_cpu(const QuantSpec& q, const at::Tensor& input, const at::Tensor& y, const GatedArgs& a,
                              const std::optional<at::Tensor>& scale) {
  const at::Tensor yc = y.to(at::kCPU);
  const std::optional<at::Tensor> sc = scale.has_value() ? std::optional<at::Tensor>(scale->cpu()) : std::nullopt;
  QuantOutputs o = quant_outputs(q, yc, yc.dim() - 1, a.rows, a.hidden, sc);
  if (a.rows > 0) quantize_rows_cpu(q, yc.reshape({a.rows, a.hidden}).contiguous(), host_scale(sc), o);
  if (input.is_cpu()) return o;
  return {o.data.to(input.device()), o.scales.to(input.device()), o.amax.to(input.device())};
}

template <bool kCuda>
Outputs rms_norm_gated_quant(const at::Tensor& input, const at::Tensor& gate, const std::optional<at::Tensor>& weight,
                             std::optional<double> eps, bool norm_before_gate, std::optional<int64_t> group_size,
                             c10::string_view activation, c10::string_view recipe, at::ScalarType out_dtype,
                             const std::optional<at::Tensor>& scale, c10::string_view scale_layout) {
  const std::optional<c10::SymInt> g = group_size.has_value() ? std::optional<c10::SymInt>(*group_size) : std::nullopt;
  const QuantSpec q = check_gated_quant(input, gate, weight, eps, g, activation, recipe, out_dtype, scale, scale_layout,
                                        kCuda, /*scale_value=*/true);
  const GatedArgs a = gated_args(input, group_size, activation);
  const double e = rms_norm_eps(input, eps);
  if constexpr (kCuda) {
    QuantOutputs qo = quant_outputs(q, input, input.dim() - 1, a.rows, a.hidden, scale);
    const std::optional<at::Tensor> rstd =
        gated_quant_forward_cuda(input, gate, weight, e, norm_before_gate, a, quant_launch(q, qo, scale, a.hidden));
    if (rstd.has_value()) return {qo.data, qo.scales, qo.amax, *rstd};
  }
  const GatedFwdOut o = gated_forward_ref(input, gate, weight, e, norm_before_gate, a, /*keep_float=*/true);
  const QuantOutputs qo = quantize_via_cpu(q, input, o.y, a, scale);
  return {qo.data, qo.scales, qo.amax, o.rstd};
}

}  // namespace

TORCH_LIBRARY_IMPL(rtcnorm, CUDA, m) { m.impl("rms_norm_gated_quant", &rms_norm_gated_quant<true>); }
TORCH_LIBRARY_IMPL(rtcnorm, CPU, m) { m.impl("rms_norm_gated_quant", &rms_norm_gated_quant<false>); }

}  // namespace rtcnorm
