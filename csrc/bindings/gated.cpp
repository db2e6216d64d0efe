#include "bindings/gated.h"

#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "jit/kernel_cache.h"
#include "ops/norm/gated.h"
#include "ops/norm/kernel_families.h"

namespace py = pybind11;

namespace rtcnorm {
namespace {

py::object (*g_ptxas)(const jit::KernelKey&) = nullptr;

using OptTensor = std::optional<at::Tensor>;

void check_forward(const at::Tensor& input, const at::Tensor& gate, const OptTensor& weight, std::optional<double> eps,
                   std::optional<c10::SymInt> group_size, const std::string& activation, std::optional<bool> cuda) {
  check_gated_forward(input, gate, weight, eps, group_size, activation, cuda.value_or(input.is_cuda()));
}

void check_backward(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& gate, const at::Tensor& rstd,
                    const OptTensor& weight, std::optional<c10::SymInt> group_size, const std::string& activation,
                    std::optional<bool> cuda) {
  check_gated_backward(grad_out, input, gate, rstd, weight, group_size, activation, cuda.value_or(input.is_cuda()));
}

// Fake tensors have no value: a CPU scale's is the real op's to check.
void check_quant(const at::Tensor& input, const at::Tensor& gate, const OptTensor& weight, std::optional<double> eps,
                 std::optional<c10::SymInt> group_size, const std::string& activation, const std::string& recipe,
                 at::ScalarType out_dtype, const OptTensor& scale, const std::string& scale_layout,
                 std::optional<bool> cuda) {
  check_gated_quant(input, gate, weight, eps, group_size, activation, recipe, out_dtype, scale, scale_layout,
                    cuda.value_or(input.is_cuda()), /*scale_value=*/false);
}

// The kernels a problem plans (None: the ATen composite path), with ptxas'
// report when `resources` (compiled for `arch`, no GPU needed). `compile`:
// also build the images a launch on an `arch` device loads (both kernels
// and, with a weight, the dW column reduce) into the in-process and disk
// caches, with the GIL released, so that callers may warm them in parallel.
// `quant`: the forward's quantized-output flags (QuantSpec::flags()).
py::dict plan(const std::string& dtype, const std::string& wdtype, int64_t hidden, int64_t group, bool has_weight,
              bool norm_first, bool sigmoid, int arch, bool resources, bool compile, unsigned quant) {
  if (hidden < 1 || group < 1 || hidden % group != 0)
    throw py::value_error("rtcnorm: needs hidden >= 1 and a group size dividing it");
  GatedProblem p;
  p.dtype = jit::dtype_from_name(dtype);
  p.wdtype = jit::dtype_from_name(wdtype);
  p.hidden = hidden;
  p.group = group;
  p.has_weight = has_weight;
  p.norm_first = norm_first;
  p.sigmoid = sigmoid;
  p.quant = quant;
  py::dict out;
  for (const char* dir : {"forward", "backward"}) {
    const bool bwd = std::string(dir) == "backward";
    const auto key = gated_key(p, bwd, true, arch);
    if (!key.has_value()) {
      out[dir] = py::none();
      continue;
    }
    py::dict d;
    d["kernel"] = key->name_expression();
    d["block"] = key->threads();
    d["vec"] = key->vec;
    d["vecs_per_thread"] = key->vecs_per_thread;
    if (resources) d["ptxas"] = g_ptxas(*key);
    if (compile) {
      py::gil_scoped_release release;
      jit::compiled_image(*key);
      if (bwd && has_weight) jit::compiled_image(column_reduce_key(p.wdtype, hidden, arch));
    }
    out[dir] = d;
  }
  return out;
}

}  // namespace

void bind_gated(py::module_& m, py::object (*ptxas)(const jit::KernelKey&)) {
  g_ptxas = ptxas;
  m.def("_check_rms_norm_gated", torch::wrap_pybind_function(check_forward), py::arg("input"), py::arg("gate"),
        py::arg("weight"), py::arg("eps"), py::arg("group_size"), py::arg("activation"), py::arg("cuda") = py::none());
  m.def("_check_rms_norm_gated_backward", torch::wrap_pybind_function(check_backward), py::arg("grad_out"),
        py::arg("input"), py::arg("gate"), py::arg("rstd"), py::arg("weight"), py::arg("group_size"),
        py::arg("activation"), py::arg("cuda") = py::none());
  m.def("_gated_plan", &plan, py::arg("dtype"), py::arg("wdtype"), py::arg("hidden"), py::arg("group"),
        py::arg("has_weight"), py::arg("norm_first"), py::arg("sigmoid"), py::arg("arch"), py::arg("resources") = false,
        py::arg("compile") = false, py::arg("quant") = 0u);
  m.def("_check_rms_norm_gated_quant", torch::wrap_pybind_function(check_quant), py::arg("input"), py::arg("gate"),
        py::arg("weight"), py::arg("eps"), py::arg("group_size"), py::arg("activation"), py::arg("recipe"),
        py::arg("out_dtype"), py::arg("scale"), py::arg("scale_layout"), py::arg("cuda") = py::none());
}

}  // namespace rtcnorm
