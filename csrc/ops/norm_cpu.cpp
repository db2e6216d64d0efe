#include "ops/norm_cpu.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <limits>
#include <vector>

namespace rtcnorm {
namespace {

std::vector<int64_t> trailing_dims(const at::Tensor& t, int64_t lead) {
  std::vector<int64_t> dims;
  for (int64_t i = lead; i < t.dim(); ++i) dims.push_back(i);
  return dims;
}

// Per-row statistic reshaped to broadcast against the input.
at::Tensor as_column(const at::Tensor& stat, const at::Tensor& input, int64_t lead, at::ScalarType acc) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().begin() + lead);
  shape.resize(input.dim(), 1);
  return stat.to(acc).reshape(shape);
}

at::Tensor scale_of(const std::optional<at::Tensor>& weight, bool zero_centered, at::ScalarType acc) {
  if (!weight.has_value()) return at::Tensor();
  at::Tensor g = weight->to(acc);
  return zero_centered ? g + 1 : g;
}

// Per-row statistics and the normalized rows (before gamma and beta); mean
// and rstd keep the reduced dims.
struct RowNorm {
  at::Tensor xhat, mean, rstd;
};

RowNorm normalize_rows(NormKind kind, const at::Tensor& hf, at::IntArrayRef dims, double eps) {
  RowNorm r;
  at::Tensor centered = hf;
  if (kind == kLayerNorm) {
    r.mean = hf.mean(dims, /*keepdim=*/true);
    centered = hf - r.mean;
  }
  r.rstd = (centered.pow(2).mean(dims, /*keepdim=*/true) + eps).rsqrt();
  r.xhat = centered * r.rstd;
  return r;
}

// Rows whose sums overflow the accumulation type (squares of fp32 values of
// 1e19 and more) get rstd 0 or NaN above, which would zero their outputs.
// Where such a row's values are finite and not all zero, it is normalized
// again on x / max|x|, where nothing overflows; eps scales with the variance
// and mean and rstd are scaled back. Rows holding an inf or a NaN keep the
// plain results. Other rows are unchanged bit for bit.
void rescale_overflowed_rows(NormKind kind, const at::Tensor& hf, at::IntArrayRef dims, double eps, RowNorm& r) {
  const at::Tensor bad = r.rstd.gt(0).logical_not();
  if (!bad.any().item<bool>()) return;
  const at::Tensor amax = hf.abs().amax(dims, /*keepdim=*/true);
  const at::Tensor fix = bad.logical_and(amax.isfinite()).logical_and(amax.gt(0));
  const at::Tensor scale = amax.reciprocal();
  const at::Tensor hs = hf * scale;
  at::Tensor centered = hs;
  at::Tensor mean_s;
  if (kind == kLayerNorm) {
    mean_s = hs.mean(dims, /*keepdim=*/true);
    centered = hs - mean_s;
  }
  const at::Tensor rstd_s = (centered.pow(2).mean(dims, /*keepdim=*/true) + scale * scale * eps).rsqrt();
  r.xhat = (centered * rstd_s).where(fix, r.xhat);
  r.rstd = (rstd_s * scale).where(fix, r.rstd);
  if (kind == kLayerNorm) r.mean = (mean_s / scale).where(fix, r.mean);
}

}  // namespace

NormFwdOutputs norm_forward_cpu(NormKind kind, const char* op, const at::Tensor& input,
                                const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                double eps, bool zero_centered) {
  const NormDims d = check_norm_args(op, input, normalized_shape, weight, bias, residual);
  TORCH_CHECK_VALUE(eps >= 0 && eps < std::numeric_limits<double>::infinity(), "rtcnorm.", op,
                    ": eps must be finite and >= 0, got ", eps);
  const at::ScalarType acc = stat_dtype(input);
  const auto dims = trailing_dims(input, d.lead);
  NormFwdOutputs out;
  at::Tensor h = input;
  if (residual.has_value()) {
    h = (input.to(acc) + residual->to(acc)).to(input.scalar_type());
    out.h = h.contiguous();
  }
  const at::Tensor hf = h.to(acc);
  RowNorm r = normalize_rows(kind, hf, dims, eps);
  rescale_overflowed_rows(kind, hf, dims, eps, r);
  if (kind == kLayerNorm) out.mean = r.mean.reshape(stat_shape(input, d.lead)).to(acc);
  at::Tensor y = r.xhat;
  const at::Tensor g = scale_of(weight, zero_centered, acc);
  if (g.defined()) y = y * g;
  if (bias.has_value()) y = y + bias->to(acc);
  out.y = y.to(input.scalar_type()).contiguous();
  out.rstd = r.rstd.reshape(stat_shape(input, d.lead)).contiguous();
  return out;
}

NormBwdOutputs norm_backward_cpu(NormKind kind, const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                                 const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                                 const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                 at::IntArrayRef normalized_shape, bool zero_centered, bool want_dw, bool want_db,
                                 const std::optional<at::Tensor>& grad_h) {
  const NormDims d = check_norm_bwd_args(kind, op, grad_out, input, mean, rstd, weight, bias, normalized_shape, grad_h,
                                         stat_dtype(input));
  const at::ScalarType acc = stat_dtype(input);
  const auto dims = trailing_dims(input, d.lead);
  const at::Tensor xf = input.to(acc);
  const at::Tensor dyf = grad_out.to(acc);
  const at::Tensor rs = as_column(rstd, input, d.lead, acc);
  const at::Tensor mu = kind == kLayerNorm ? as_column(*mean, input, d.lead, acc) : at::Tensor();
  const at::Tensor xhat = (kind == kLayerNorm ? xf - mu : xf) * rs;
  const at::Tensor g = scale_of(weight, zero_centered, acc);
  const at::Tensor wdy = g.defined() ? dyf * g : dyf;
  at::Tensor inner = wdy - xhat * (wdy * xhat).mean(dims, /*keepdim=*/true);
  if (kind == kLayerNorm) inner = inner - wdy.mean(dims, /*keepdim=*/true);
  at::Tensor dx = rs * inner;
  if (grad_h.has_value()) dx = dx + grad_h->to(acc);
  NormBwdOutputs out;
  out.dx = dx.to(input.scalar_type()).contiguous();
  if (want_dw && weight.has_value()) {
    const at::Tensor s = (dyf * xhat).reshape({d.rows, d.hidden}).sum(0);
    out.dw = s.reshape(weight->sizes()).to(weight->scalar_type());
  } else {
    out.dw = no_grad_placeholder(input);
  }
  if (want_db && bias.has_value()) {
    out.db = dyf.reshape({d.rows, d.hidden}).sum(0).reshape(bias->sizes()).to(bias->scalar_type());
  } else {
    out.db = no_grad_placeholder(input);
  }
  return out;
}

}  // namespace rtcnorm
