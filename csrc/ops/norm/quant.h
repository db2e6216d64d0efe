// Quantized norm outputs (torch.ops.rtcnorm.norm_quant): a call's recipe,
// its checks, its outputs and the CPU quantizer. The recipes' arithmetic is
// kernels/common/quant_math.cuh, shared by the CUDA epilogue and the CPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>

#include "kernels/common/params.cuh"
#include "kernels/common/quant_math.cuh"
#include "ops/norm/plan/problem.h"

namespace rtcnorm {

struct QuantSpec {
  unsigned recipe = quant::kNone;
  bool blocked = false;  // block scales in cuBLAS's blocked layout
  at::ScalarType data_dtype = at::kFloat8_e4m3fn;
  // NormProblem::quant and the kernel's flag bits.
  unsigned flags() const { return recipe << kQuantShift | (blocked ? kBlockedScales : 0u); }
  int block() const { return quant::block_of(recipe); }
  // Scales a row has (blocks), and the scale matrix's row pitch.
  int64_t blocks(int64_t hidden) const;
  int64_t scale_cols(int64_t hidden) const;
};

// Parses and checks the quantization arguments of a call (every message
// names rtcnorm.norm_quant and the argument): recipe, out_dtype, scale
// (a one-element float32 tensor where the recipe takes one; finite and
// positive when it is on the CPU and `scale_value`: a fake tensor has no
// value to read), scale_layout; input's dtype.
QuantSpec check_quant_args(const at::Tensor& input, c10::string_view recipe, at::ScalarType out_dtype,
                           const std::optional<at::Tensor>& scale, c10::string_view scale_layout,
                           bool scale_value = true);

// Every check of a norm_quant call, for the real impls and the fake one
// (rtcnorm._C._check_norm_quant): norm, residual / bias against it, the
// forward's own checks (check_norm_forward), then check_quant_args.
struct QuantCall {
  const char* op;  // "rms_norm", "add_rms_norm" or "layer_norm"
  NormKind kind;
  NormMode mode;
  QuantSpec spec;
};
QuantCall check_norm_quant(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                           c10::SymIntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, std::optional<double> eps, c10::string_view norm,
                           c10::string_view recipe, at::ScalarType out_dtype, const std::optional<at::Tensor>& scale,
                           c10::string_view scale_layout, const std::optional<c10::string_view>& mode, bool cuda,
                           bool scale_value = true);

struct QuantOutputs {
  at::Tensor data, scales, amax;
};

// The outputs of a call with `rows` rows of `hidden` elements (`lead`
// leading dims of input); amax zeroed where the recipe returns it, and the
// blocked layout's padding zeroed.
QuantOutputs quant_outputs(const QuantSpec& q, const at::Tensor& input, int64_t lead, int64_t rows, int64_t hidden,
                           const std::optional<at::Tensor>& scale);

// The host value of a CPU scale tensor (1 when the recipe takes none).
float host_scale(const std::optional<at::Tensor>& scale);

// A quantized output as a kernel writes it: the flag bits, the outputs, and
// the per-tensor or global scale (a device tensor's pointer, else the host
// value), for rows of `hidden` elements.
struct QuantLaunch {
  unsigned flags = 0;
  at::Tensor data, scales, amax;
  const float* scale_ptr = nullptr;
  float scale = 1.f;
  int64_t scale_cols = 0;
};
QuantLaunch quant_launch(const QuantSpec& q, const QuantOutputs& out, const std::optional<at::Tensor>& scale,
                         int64_t hidden);

// Quantizes y (rows x hidden, contiguous float32) into `out` (CPU tensors).
void quantize_rows_cpu(const QuantSpec& q, const at::Tensor& y, float scale, QuantOutputs& out);

}  // namespace rtcnorm
