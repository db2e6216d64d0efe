// The ops' argument checks (ops/norm_checks.h, ops/softmax/softmax.h) as rtcnorm._C
// functions: the fake impls in python/rtcnorm/_ops.py and _softmax_ops.py
// and explain() call them, so torch.compile and export refuse a call with
// the message the real impl gives. Tensors may be fake (symbolic sizes);
// errors reach Python as from a torch op (ValueError, TypeError, RuntimeError).
#include "arg_check_bindings.h"

#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

#include "ops/norm/quant.h"
#include "ops/norm_checks.h"
#include "ops/softmax/softmax.h"

namespace py = pybind11;

namespace rtcnorm {
namespace {

using OptTensor = std::optional<at::Tensor>;

bool cuda_rules(const at::Tensor& t, std::optional<bool> cuda) { return cuda.value_or(t.is_cuda()); }

NormKind norm_kind(const std::string& op) {
  if (op.rfind("layer_norm", 0) == 0) return kLayerNorm;
  if (op.rfind("rms_norm", 0) == 0 || op.rfind("add_rms_norm", 0) == 0) return kRmsNorm;
  throw py::value_error("rtcnorm: unknown norm op '" + op + "'");
}

SoftmaxOp softmax_op(const std::string& op) {
  for (SoftmaxOp o : {SoftmaxOp::kScaled, SoftmaxOp::kMasked, SoftmaxOp::kUpperTriang, SoftmaxOp::kAlignedCausal})
    if (op == softmax_op_name(o)) return o;
  throw py::value_error("rtcnorm: unknown softmax op '" + op + "'");
}

std::optional<c10::string_view> view_of(const std::optional<std::string>& s) {
  if (!s.has_value()) return std::nullopt;
  return c10::string_view(s->data(), s->size());
}

void norm_forward(const std::string& op, const at::Tensor& input, const OptTensor& residual,
                  const std::vector<c10::SymInt>& normalized_shape, const OptTensor& weight, const OptTensor& bias,
                  std::optional<double> eps, const std::optional<std::string>& mode, std::optional<bool> cuda) {
  norm_kind(op);
  check_norm_forward(op.c_str(), input, residual, normalized_shape, weight, bias, eps, view_of(mode),
                     cuda_rules(input, cuda));
}

void norm_backward(const std::string& op, const at::Tensor& grad_out, const at::Tensor& input, const OptTensor& mean,
                   const at::Tensor& rstd, const OptTensor& weight, const OptTensor& bias,
                   const std::vector<c10::SymInt>& normalized_shape, const OptTensor& grad_h,
                   std::optional<bool> cuda) {
  check_norm_backward(norm_kind(op), op.c_str(), grad_out, input, mean, rstd, weight, bias, normalized_shape, grad_h,
                      cuda_rules(input, cuda));
}

// Fake tensors have no value: a CPU scale's is the real op's to check.
void norm_quant(const at::Tensor& input, const OptTensor& residual, const std::vector<c10::SymInt>& normalized_shape,
                const OptTensor& weight, const OptTensor& bias, std::optional<double> eps, const std::string& norm,
                const std::string& recipe, at::ScalarType out_dtype, const OptTensor& scale,
                const std::string& scale_layout, const std::optional<std::string>& mode) {
  check_norm_quant(input, residual, normalized_shape, weight, bias, eps, norm, recipe, out_dtype, scale, scale_layout,
                   view_of(mode), input.is_cuda(), /*scale_value=*/false);
}

void softmax_forward(const std::string& op, const at::Tensor& input, const OptTensor& mask, double scale,
                     std::optional<bool> cuda) {
  check_softmax_forward(softmax_op(op), input, mask.has_value() ? &*mask : nullptr, scale, cuda_rules(input, cuda));
}

void softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, double scale, bool causal,
                      std::optional<bool> cuda) {
  check_softmax_backward(grad_output, output, scale, causal, cuda_rules(output, cuda));
}

}  // namespace

void bind_arg_checks(py::module_& m) {
  m.def("_check_norm_forward", torch::wrap_pybind_function(norm_forward), py::arg("op"), py::arg("input"),
        py::arg("residual"), py::arg("normalized_shape"), py::arg("weight"), py::arg("bias"), py::arg("eps"),
        py::arg("mode"), py::arg("cuda") = py::none());
  m.def("_check_norm_backward", torch::wrap_pybind_function(norm_backward), py::arg("op"), py::arg("grad_out"),
        py::arg("input"), py::arg("mean"), py::arg("rstd"), py::arg("weight"), py::arg("bias"),
        py::arg("normalized_shape"), py::arg("grad_h"), py::arg("cuda") = py::none());
  m.def("_check_norm_quant", torch::wrap_pybind_function(norm_quant), py::arg("input"), py::arg("residual"),
        py::arg("normalized_shape"), py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("norm"),
        py::arg("recipe"), py::arg("out_dtype"), py::arg("scale"), py::arg("scale_layout"), py::arg("mode"));
  m.def("_check_softmax_forward", torch::wrap_pybind_function(softmax_forward), py::arg("op"), py::arg("input"),
        py::arg("mask"), py::arg("scale"), py::arg("cuda") = py::none());
  m.def("_check_softmax_backward", torch::wrap_pybind_function(softmax_backward), py::arg("grad_output"),
        py::arg("output"), py::arg("scale"), py::arg("causal"), py::arg("cuda") = py::none());
}

}  // namespace rtcnorm
