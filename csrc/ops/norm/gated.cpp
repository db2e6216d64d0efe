// torch.ops.rtcnorm.rms_norm_gated / rms_norm_gated_backward: argument
// checks and the CPU and CUDA entries (ops/norm/gated.h).
#include "ops/norm/gated.h"

#include <c10/core/SymBool.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <limits>
#include <string>
#include <tuple>

#include "ops/norm_checks.h"

namespace rtcnorm {
namespace {

constexpr const char* kOp = "rms_norm_gated";
constexpr const char* kBwdOp = "rms_norm_gated_backward";

bool sym_true(const c10::SymBool& b) {
  const auto v = b.maybe_as_bool();
  return v.has_value() ? *v : b.expect_true(__FILE__, __LINE__);
}

void check_activation(const char* op, c10::string_view activation) {
  TORCH_CHECK_VALUE(activation == "silu" || activation == "sigmoid", "rtcnorm.", op,
                    ": activation must be 'silu' or 'sigmoid', got '", std::string(activation), "'");
}

// input, gate, weight and group_size: what both directions check.
void check_gated_tensors(const char* op, const at::Tensor& input, const at::Tensor& gate,
                         const std::optional<at::Tensor>& weight, const std::optional<c10::SymInt>& group_size,
                         c10::string_view activation, bool cuda) {
  check_activation(op, activation);
  check_norm_dtype(op, input, cuda);
  TORCH_CHECK_VALUE(input.dim() >= 1, "rtcnorm.", op, ": input must have at least one dim, got a 0-dim tensor");
  const c10::SymInt n = input.sym_size(-1);
  const auto nv = n.maybe_as_int();
  TORCH_CHECK_VALUE(!nv.has_value() || (*nv >= 1 && *nv <= kMaxNormHidden), "rtcnorm.", op,
                    ": the last dim of input (N) must be 1 to ", kMaxNormHidden, ", got ", n);
  check_like_input(op, "gate", gate, input);
  if (weight.has_value()) {
    TORCH_CHECK_VALUE(weight->dim() == 1 && sym_equal(weight->sym_size(0), n), "rtcnorm.", op,
                      ": weight must have shape [", n, "] (the last dim of input), got ", weight->sym_sizes());
    check_same_device(op, "weight", *weight, input);
    const at::ScalarType s = input.scalar_type();
    TORCH_CHECK_TYPE(weight->scalar_type() == s || weight->scalar_type() == at::kFloat, "rtcnorm.", op,
                     ": weight must have input's dtype (", s, ") or float32, got ", weight->scalar_type());
  }
  if (group_size.has_value()) {
    const c10::SymInt& g = *group_size;
    const auto gv = g.maybe_as_int();
    TORCH_CHECK_VALUE(!gv.has_value() || *gv >= 1, "rtcnorm.", op, ": group_size must be a positive divisor of N = ", n,
                      " (the last dim of input), got group_size=", g);
    TORCH_CHECK_VALUE(sym_true((n % g).sym_eq(0)), "rtcnorm.", op, ": group_size must be a positive divisor of N = ", n,
                      " (the last dim of input), got group_size=", g);
  }
}

std::optional<c10::SymInt> sym(std::optional<int64_t> g) {
  if (!g.has_value()) return std::nullopt;
  return c10::SymInt(*g);
}

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor> rms_norm_gated(const at::Tensor& input, const at::Tensor& gate,
                                                  const std::optional<at::Tensor>& weight, std::optional<double> eps,
                                                  bool norm_before_gate, std::optional<int64_t> group_size,
                                                  c10::string_view activation) {
  check_gated_forward(input, gate, weight, eps, sym(group_size), activation, kCuda);
  const GatedArgs a = gated_args(input, group_size, activation);
  const double e = rms_norm_eps(input, eps);  // F.rms_norm's default, as rms_norm
  const GatedFwdOut o = kCuda ? gated_forward_cuda(input, gate, weight, e, norm_before_gate, a)
                              : gated_forward_ref(input, gate, weight, e, norm_before_gate, a);
  return {o.y, o.rstd};
}

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_gated_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& gate, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, bool norm_before_gate, std::optional<int64_t> group_size,
    c10::string_view activation, bool weight_grad) {
  check_gated_backward(grad_out, input, gate, rstd, weight, sym(group_size), activation, kCuda);
  const GatedArgs a = gated_args(input, group_size, activation);
  const bool want_dw = weight_grad && weight.has_value();
  const GatedBwdOut o = kCuda ? gated_backward_cuda(grad_out, input, gate, rstd, weight, norm_before_gate, want_dw, a)
                              : gated_backward_ref(grad_out, input, gate, rstd, weight, norm_before_gate, want_dw, a);
  return {o.dx, o.dz, o.dw};
}

}  // namespace

void check_gated_forward(const at::Tensor& input, const at::Tensor& gate, const std::optional<at::Tensor>& weight,
                         std::optional<double> eps, std::optional<c10::SymInt> group_size, c10::string_view activation,
                         bool cuda) {
  check_gated_tensors(kOp, input, gate, weight, group_size, activation, cuda);
  // NaN fails the first comparison.
  TORCH_CHECK_VALUE(!eps.has_value() || (*eps >= 0 && *eps < std::numeric_limits<double>::infinity()), "rtcnorm.", kOp,
                    ": eps must be finite and >= 0, got ", eps.value_or(0));
}

void check_gated_backward(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& gate,
                          const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                          std::optional<c10::SymInt> group_size, c10::string_view activation, bool cuda) {
  check_gated_tensors(kBwdOp, input, gate, weight, group_size, activation, cuda);
  check_like_input(kBwdOp, "grad_out", grad_out, input);
  check_same_device(kBwdOp, "rstd", rstd, input);
  c10::SymInt stats = group_size.has_value() ? input.sym_size(-1) / *group_size : c10::SymInt(1);
  for (int64_t i = 0; i + 1 < input.dim(); ++i) stats = stats * input.sym_size(i);
  const at::ScalarType want = stat_dtype(input);
  TORCH_CHECK_VALUE(rstd.scalar_type() == want && sym_equal(rstd.sym_numel(), stats), "rtcnorm.", kBwdOp,
                    ": rstd must hold one ", want, " per group of a row (", stats, "), got ", rstd.sym_numel(), " of ",
                    rstd.scalar_type());
}

GatedArgs gated_args(const at::Tensor& input, std::optional<int64_t> group_size, c10::string_view activation) {
  GatedArgs a;
  a.hidden = input.size(-1);
  a.group = group_size.value_or(a.hidden);
  a.rows = a.hidden == 0 ? 0 : input.numel() / a.hidden;
  a.sigmoid = activation == "sigmoid";
  return a;
}

std::vector<int64_t> gated_stat_shape(const at::Tensor& input, const GatedArgs& a) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end() - 1);
  shape.push_back(a.hidden / a.group);
  return shape;
}

TORCH_LIBRARY_IMPL(rtcnorm, CUDA, m) {
  m.impl("rms_norm_gated", &rms_norm_gated<true>);
  m.impl("rms_norm_gated_backward", &rms_norm_gated_backward<true>);
}

TORCH_LIBRARY_IMPL(rtcnorm, CPU, m) {
  m.impl("rms_norm_gated", &rms_norm_gated<false>);
  m.impl("rms_norm_gated_backward", &rms_norm_gated_backward<false>);
}

}  // namespace rtcnorm
