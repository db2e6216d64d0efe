#include "ops/norm_checks.h"

#include <c10/core/SymBool.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include <limits>

#include "ops/norm/modes.h"

namespace rtcnorm {

bool is_kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

bool sym_equal(const c10::SymInt& a, const c10::SymInt& b) {
  const auto x = a.maybe_as_int();
  const auto y = b.maybe_as_int();
  if (x.has_value() && y.has_value()) return *x == *y;
  return a.sym_eq(b).expect_true(__FILE__, __LINE__);
}

void check_norm_dtype(const char* op, const at::Tensor& input, bool cuda) {
  const at::ScalarType s = input.scalar_type();
  if (cuda) {
    TORCH_CHECK_TYPE(is_kernel_dtype(s), "rtcnorm.", op, ": CUDA input must be float32, float16 or bfloat16, got ", s);
  } else {
    TORCH_CHECK_TYPE(is_kernel_dtype(s) || s == at::kDouble, "rtcnorm.", op,
                     ": input must be float32, float16 or bfloat16 (or float64 on CPU), got ", s);
  }
}

namespace {

void check_norm_param(const char* op, const char* name, const at::Tensor& p, const at::Tensor& input,
                      c10::SymIntArrayRef normalized_shape) {
  TORCH_CHECK_VALUE(sym_sizes_equal(p.sym_sizes(), normalized_shape), "rtcnorm.", op, ": ", name, " must have shape ",
                    normalized_shape, " (normalized_shape), got ", p.sym_sizes());
  check_same_device(op, name, p, input);
  TORCH_CHECK_TYPE(p.scalar_type() == input.scalar_type() || p.scalar_type() == at::kFloat, "rtcnorm.", op, ": ", name,
                   " must have input's dtype (", input.scalar_type(), ") or float32, got ", p.scalar_type());
}

// input, normalized_shape, weight, bias and residual: what every norm op checks.
void check_norm_tensors(const char* op, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                        const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                        const std::optional<at::Tensor>& residual, bool cuda) {
  check_norm_dtype(op, input, cuda);
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK_VALUE(nd >= 1, "rtcnorm.", op, ": normalized_shape must name at least one dim");
  TORCH_CHECK_VALUE(input.dim() >= nd && sym_sizes_equal(input.sym_sizes().slice(input.dim() - nd), normalized_shape),
                    "rtcnorm.", op, ": normalized_shape ", normalized_shape,
                    " must match the trailing dims of input, got input of shape ", input.sym_sizes());
  // A row's length, where every entry is known (at most kMaxNormHidden + 1
  // once past the limit, so no product overflows).
  std::optional<int64_t> hidden = 1;
  for (const c10::SymInt& s : normalized_shape) {
    const auto v = s.maybe_as_int();
    TORCH_CHECK_VALUE(!v.has_value() || *v != 0, "rtcnorm.", op, ": normalized_shape must not contain a zero, got ",
                      normalized_shape);
    if (!v.has_value()) {
      hidden.reset();
    } else if (hidden.has_value()) {
      hidden = *hidden > kMaxNormHidden / *v ? kMaxNormHidden + 1 : *hidden * *v;
    }
  }
  TORCH_CHECK_VALUE(!hidden.has_value() || *hidden <= kMaxNormHidden, "rtcnorm.", op, ": rows of more than ",
                    kMaxNormHidden, " elements are not supported, got normalized_shape ", normalized_shape);
  if (weight.has_value()) check_norm_param(op, "weight", *weight, input, normalized_shape);
  if (bias.has_value()) check_norm_param(op, "bias", *bias, input, normalized_shape);
  if (weight.has_value() && bias.has_value())
    TORCH_CHECK_TYPE(weight->scalar_type() == bias->scalar_type(), "rtcnorm.", op,
                     ": weight and bias must share a dtype, got ", weight->scalar_type(), " and ", bias->scalar_type());
  if (residual.has_value()) check_like_input(op, "residual", *residual, input);
}

// rstd or mean: one statistic of stat_dtype(input) per row, on input's device.
void check_norm_stat(const char* op, const char* name, const at::Tensor& s, const at::Tensor& input,
                     const c10::SymInt& rows) {
  check_same_device(op, name, s, input);
  const at::ScalarType want = stat_dtype(input);
  TORCH_CHECK_VALUE(s.scalar_type() == want && sym_equal(s.sym_numel(), rows), "rtcnorm.", op, ": ", name,
                    " must hold one ", want, " per row (", rows, "), got ", s.sym_numel(), " of ", s.scalar_type());
}

}  // namespace

bool sym_sizes_equal(c10::SymIntArrayRef a, c10::SymIntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!sym_equal(a[i], b[i])) return false;
  return true;
}

void check_same_device(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input) {
  TORCH_CHECK(t.device() == input.device(), "rtcnorm.", op, ": ", name, " is on ", t.device(), " but input is on ",
              input.device());
}

void check_like_input(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input) {
  TORCH_CHECK_VALUE(sym_sizes_equal(t.sym_sizes(), input.sym_sizes()), "rtcnorm.", op, ": ", name,
                    " must have input's shape ", input.sym_sizes(), ", got ", t.sym_sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == input.scalar_type(), "rtcnorm.", op, ": ", name, " must have input's dtype ",
                   input.scalar_type(), ", got ", t.scalar_type());
  check_same_device(op, name, t, input);
}

NormMode check_norm_forward(const char* op, const at::Tensor& input, const std::optional<at::Tensor>& residual,
                            c10::SymIntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, std::optional<double> eps,
                            const std::optional<c10::string_view>& mode, bool cuda) {
  const NormMode m = parse_mode(mode, op);
  check_norm_tensors(op, input, normalized_shape, weight, bias, residual, cuda);
  // NaN fails the first comparison.
  TORCH_CHECK_VALUE(!eps.has_value() || (*eps >= 0 && *eps < std::numeric_limits<double>::infinity()), "rtcnorm.", op,
                    ": eps must be finite and >= 0, got ", eps.value_or(0));
  return m;
}

void check_norm_backward(NormKind kind, const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                         const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         c10::SymIntArrayRef normalized_shape, const std::optional<at::Tensor>& grad_h, bool cuda) {
  check_norm_tensors(op, input, normalized_shape, weight, bias, std::nullopt, cuda);
  check_like_input(op, "grad_out", grad_out, input);
  if (grad_h.has_value()) check_like_input(op, "grad_h", *grad_h, input);
  c10::SymInt rows = 1;
  for (int64_t i = 0; i < input.dim() - static_cast<int64_t>(normalized_shape.size()); ++i) rows *= input.sym_size(i);
  check_norm_stat(op, "rstd", rstd, input, rows);
  if (kind == kLayerNorm) {
    TORCH_CHECK_VALUE(mean.has_value(), "rtcnorm.", op, ": mean is required");
    check_norm_stat(op, "mean", *mean, input, rows);
  }
}

NormDims norm_dims(const at::Tensor& input, at::IntArrayRef normalized_shape) {
  NormDims d;
  d.lead = input.dim() - static_cast<int64_t>(normalized_shape.size());
  d.hidden = 1;
  for (int64_t s : normalized_shape) d.hidden *= s;
  d.rows = 1;
  for (int64_t i = 0; i < d.lead; ++i) d.rows *= input.size(i);
  return d;
}

NormDims check_norm_args(const char* op, const at::Tensor& input, at::IntArrayRef normalized_shape,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& residual) {
  check_norm_tensors(op, input, c10::fromIntArrayRefSlow(normalized_shape), weight, bias, residual, input.is_cuda());
  return norm_dims(input, normalized_shape);
}

NormDims check_norm_bwd_args(NormKind kind, const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                             const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                             const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                             at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& grad_h,
                             at::ScalarType stats) {
  check_norm_backward(kind, op, grad_out, input, mean, rstd, weight, bias, c10::fromIntArrayRefSlow(normalized_shape),
                      grad_h, input.is_cuda());
  TORCH_INTERNAL_ASSERT(stats == stat_dtype(input), "rtcnorm.", op, ": statistics are ", stat_dtype(input));
  return norm_dims(input, normalized_shape);
}

std::vector<int64_t> stat_shape(const at::Tensor& input, int64_t lead) {
  return std::vector<int64_t>(input.sizes().begin(), input.sizes().begin() + lead);
}

at::ScalarType stat_dtype(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// torch.nn.functional.rms_norm's default: the input dtype's machine epsilon.
double rms_norm_eps(const at::Tensor& input, std::optional<double> eps) {
  if (eps.has_value()) return *eps;
  switch (input.scalar_type()) {
    case at::kHalf:
      return 0.0009765625;  // 2^-10
    case at::kBFloat16:
      return 0.0078125;  // 2^-7
    case at::kDouble:
      return std::numeric_limits<double>::epsilon();
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

}  // namespace rtcnorm
