#include "ops/norm/quant.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/norm_checks.h"

namespace rtcnorm {
namespace {

constexpr const char* kOp = "rtcnorm.norm_quant: ";

bool takes_scale(unsigned r) { return quant::per_tensor(r) || r == quant::kNvfp4; }

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

int64_t QuantSpec::blocks(int64_t hidden) const { return block() > 0 ? (hidden + block() - 1) / block() : 1; }

int64_t QuantSpec::scale_cols(int64_t hidden) const { return blocked ? round_up(blocks(hidden), 4) : blocks(hidden); }

QuantSpec check_quant_args(const at::Tensor& input, c10::string_view recipe, at::ScalarType out_dtype,
                           const std::optional<at::Tensor>& scale, c10::string_view scale_layout, bool scale_value) {
  const at::ScalarType in = input.scalar_type();
  TORCH_CHECK_TYPE(in == at::kFloat || in == at::kHalf || in == at::kBFloat16, kOp,
                   "input must be float32, float16 or bfloat16 for a quantized output, got ", in);
  const bool e4m3 = out_dtype == at::kFloat8_e4m3fn, e5m2 = out_dtype == at::kFloat8_e5m2;
  QuantSpec q;
  q.data_dtype = out_dtype;
  if (recipe == "per_tensor" || recipe == "per_token") {
    TORCH_CHECK_VALUE(e4m3 || e5m2, kOp, "out_dtype must be torch.float8_e4m3fn or torch.float8_e5m2 for recipe '",
                      std::string(recipe), "', got ", out_dtype);
    const bool tensor = recipe == "per_tensor";
    q.recipe = tensor ? (e4m3 ? quant::kPerTensorE4M3 : quant::kPerTensorE5M2)
                      : (e4m3 ? quant::kPerTokenE4M3 : quant::kPerTokenE5M2);
  } else if (recipe == "mxfp8") {
    TORCH_CHECK_VALUE(e4m3, kOp, "out_dtype must be torch.float8_e4m3fn for recipe 'mxfp8', got ", out_dtype);
    q.recipe = quant::kMxfp8;
  } else if (recipe == "nvfp4") {
    TORCH_CHECK_VALUE(out_dtype == at::kFloat4_e2m1fn_x2, kOp,
                      "out_dtype must be torch.float4_e2m1fn_x2 for recipe 'nvfp4', got ", out_dtype);
    q.recipe = quant::kNvfp4;
  } else {
    TORCH_CHECK_VALUE(false, kOp, "recipe must be one of 'per_tensor', 'per_token', 'mxfp8', 'nvfp4', got '",
                      std::string(recipe), "'");
  }
  if (scale_layout == "blocked") {
    TORCH_CHECK_VALUE(q.block() > 0, kOp, "scale_layout 'blocked' is for the block recipes 'mxfp8' and 'nvfp4', not '",
                      std::string(recipe), "'");
    q.blocked = true;
  } else {
    TORCH_CHECK_VALUE(scale_layout == "plain", kOp, "scale_layout must be 'plain' or 'blocked', got '",
                      std::string(scale_layout), "'");
  }
  const char* what = q.recipe == quant::kNvfp4 ? "the global encode scale" : "the quantize multiplier";
  if (!takes_scale(q.recipe)) {
    TORCH_CHECK_VALUE(!scale.has_value(), kOp, "scale must be None for recipe '", std::string(recipe),
                      "' (its scales come from the data)");
    return q;
  }
  TORCH_CHECK_VALUE(scale.has_value(), kOp, "scale (", what, ") is required for recipe '", std::string(recipe), "'");
  const at::Tensor& s = *scale;
  TORCH_CHECK_VALUE(s.numel() == 1 && s.scalar_type() == at::kFloat, kOp,
                    "scale must be a float32 tensor of one element, got ", s.scalar_type(), " of shape ", s.sizes());
  TORCH_CHECK_VALUE(s.is_cpu() || s.device() == input.device(), kOp, "scale must be on the CPU or on input's device ",
                    input.device(), ", got ", s.device());
  if (s.is_cpu() && scale_value) {
    const float v = s.item<float>();
    TORCH_CHECK_VALUE(std::isfinite(v) && v > 0.f, kOp, "scale must be finite and positive, got ", v);
  }
  return q;
}

QuantCall check_norm_quant(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                           c10::SymIntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, std::optional<double> eps, c10::string_view norm,
                           c10::string_view recipe, at::ScalarType out_dtype, const std::optional<at::Tensor>& scale,
                           c10::string_view scale_layout, const std::optional<c10::string_view>& mode, bool cuda,
                           bool scale_value) {
  const bool rms = norm == "rms_norm";
  TORCH_CHECK_VALUE(rms || norm == "layer_norm", kOp, "norm must be 'rms_norm' or 'layer_norm', got '",
                    std::string(norm), "'");
  TORCH_CHECK_VALUE(rms || !residual.has_value(), kOp, "residual is only taken with norm='rms_norm' (add_rms_norm)");
  TORCH_CHECK_VALUE(!rms || !bias.has_value(), kOp, "bias is only taken with norm='layer_norm'");
  QuantCall c;
  c.op = rms ? (residual.has_value() ? "add_rms_norm" : "rms_norm") : "layer_norm";
  c.kind = rms ? kRmsNorm : kLayerNorm;
  c.mode = check_norm_forward(c.op, input, residual, normalized_shape, weight, bias, eps, mode, cuda);
  c.spec = check_quant_args(input, recipe, out_dtype, scale, scale_layout, scale_value);
  return c;
}

float host_scale(const std::optional<at::Tensor>& scale) { return scale.has_value() ? scale->item<float>() : 1.f; }

QuantLaunch quant_launch(const QuantSpec& q, const QuantOutputs& out, const std::optional<at::Tensor>& scale,
                         int64_t hidden) {
  QuantLaunch l;
  l.flags = q.flags();
  l.data = out.data;
  l.scales = out.scales;
  l.amax = out.amax;
  if (scale.has_value() && scale->is_cuda())
    l.scale_ptr = scale->data_ptr<float>();
  else if (scale.has_value())
    l.scale = host_scale(scale);
  l.scale_cols = q.scale_cols(hidden);
  return l;
}

QuantOutputs quant_outputs(const QuantSpec& q, const at::Tensor& input, int64_t lead, int64_t rows, int64_t hidden,
                           const std::optional<at::Tensor>& scale) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().begin() + lead);
  const auto opts = input.options();
  QuantOutputs o;
  std::vector<int64_t> dshape = shape;
  if (q.recipe == quant::kNvfp4) {
    dshape.push_back((hidden + 1) / 2);
  } else {
    dshape.insert(dshape.end(), input.sizes().begin() + lead, input.sizes().end());
  }
  o.data = at::empty(dshape, opts.dtype(q.data_dtype));
  const auto f32 = opts.dtype(at::kFloat);
  if (quant::per_tensor(q.recipe)) {
    o.scales = scale->to(input.device()).reshape({}).reciprocal();
  } else if (quant::per_token(q.recipe)) {
    std::vector<int64_t> s = shape;
    s.push_back(1);
    o.scales = at::empty(s, f32);
  } else {
    const auto sdt = opts.dtype(q.recipe == quant::kMxfp8 ? at::kFloat8_e8m0fnu : at::kFloat8_e4m3fn);
    if (q.blocked) {
      const int64_t rows_padded = round_up(rows, 128), cols = q.scale_cols(hidden);
      const bool padded = rows_padded != rows || cols != q.blocks(hidden);
      o.scales = padded ? at::zeros({rows_padded * cols}, sdt) : at::empty({rows_padded * cols}, sdt);
    } else {
      std::vector<int64_t> s = shape;
      s.push_back(q.blocks(hidden));
      o.scales = at::empty(s, sdt);
    }
  }
  o.amax = quant::tensor_amax(q.recipe) ? at::zeros({}, f32) : at::empty({0}, f32);
  return o;
}

void quantize_rows_cpu(const QuantSpec& q, const at::Tensor& y, float scale, QuantOutputs& out) {
  const int64_t rows = y.size(0), n = y.size(1);
  const float* src = y.data_ptr<float>();
  auto* data = static_cast<unsigned char*>(out.data.data_ptr());
  auto* scales = out.scales.numel() > 0 ? static_cast<unsigned char*>(out.scales.data_ptr()) : nullptr;
  const unsigned r = q.recipe;
  const int block = q.block();
  const int64_t cols = q.scale_cols(n);
  const bool e5 = quant::e5m2(r);
  std::vector<float> row_amax(static_cast<size_t>(rows), 0.f);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const float* yr = src + i * n;
      float amax = 0.f;
      for (int64_t j = 0; j < n; ++j) amax = std::fmax(amax, std::fabs(yr[j]));
      row_amax[static_cast<size_t>(i)] = amax;
      if (block == 0) {
        float mult = scale;
        if (quant::per_token(r)) {
          const float fmax = quant::fp8_max(e5);
          reinterpret_cast<float*>(scales)[i] = amax > 0.f ? amax / fmax : 1.f;
          mult = amax > 0.f ? fmax / amax : 1.f;
        }
        for (int64_t j = 0; j < n; ++j)
          data[i * n + j] =
              static_cast<unsigned char>(e5 ? quant::e5m2_code(yr[j] * mult) : quant::e4m3_code(yr[j] * mult));
        continue;
      }
      for (int64_t b = 0; b * block < n; ++b) {
        const int64_t j0 = b * block, j1 = std::min<int64_t>(n, j0 + block);
        float a = 0.f;
        for (int64_t j = j0; j < j1; ++j) a = std::fmax(a, std::fabs(yr[j]));
        const int64_t at = q.blocked ? quant::blocked_scale_offset(i, b, cols) : i * cols + b;
        if (r == quant::kMxfp8) {
          const unsigned code = quant::e8m0_of_amax(a);
          scales[at] = static_cast<unsigned char>(code);
          const float mult = quant::e8m0_inverse(code);
          for (int64_t j = j0; j < j1; ++j)
            data[i * n + j] = static_cast<unsigned char>(quant::e4m3_code(yr[j] * mult));
        } else {
          const unsigned code = quant::nvfp4_scale_code(a, scale);
          scales[at] = static_cast<unsigned char>(code);
          const float enc = quant::nvfp4_encode(code, scale);
          const int64_t pitch = (n + 1) / 2;
          for (int64_t j = j0; j < j1; j += 2) {
            const unsigned lo = quant::e2m1_code(yr[j] * enc);
            const unsigned hi = j + 1 < n ? quant::e2m1_code(yr[j + 1] * enc) : 0u;
            data[i * pitch + j / 2] = static_cast<unsigned char>(lo | hi << 4);
          }
        }
      }
    }
  });
  if (quant::tensor_amax(r)) {
    float a = 0.f;
    for (float v : row_amax) a = std::fmax(a, v);
    out.amax.fill_(a);
  }
}

}  // namespace rtcnorm
