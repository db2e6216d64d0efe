// rtcnorm._C: loading this module registers the torch.ops.rtcnorm library
// (static initializers in registration.cpp and ops/*.cpp) and exposes the JIT
// administration API used by python/rtcnorm/jit.py and explain().
#include <c10/core/DeviceGuard.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arg_check_bindings.h"
#include "bindings/gated.h"
#include "bindings/norm.h"
#include "bindings/softmax.h"
#include "jit/disk_cache.h"
#include "jit/kernel_cache.h"
#include "jit/nvrtc.h"
#include "jit/py_jit.h"
#include "ops/grid_exchange_buffers.h"
#include "ops/norm/modes.h"
#include "ops/norm_common.h"
#include "ops/norm_plan_memo.h"
#include "ops/softmax/softmax.h"
#include "ops/variants.h"

namespace py = pybind11;
using namespace rtcnorm;

namespace {

std::vector<NormMode> parse_modes(const std::vector<std::optional<std::string>>& modes) {
  std::vector<NormMode> out;
  for (const auto& m : modes) {
    std::optional<c10::string_view> v;
    if (m.has_value()) v = c10::string_view(m->data(), m->size());
    out.push_back(parse_mode(v, "jit.precompile"));
  }
  return out;
}

// ptxas' registers and spill bytes of a planned kernel (explain's
// resources=True), compiled for the key's arch without a GPU; None where
// NVRTC emits only PTX for that arch.
py::object ptxas_dict(const jit::KernelKey& k) {
  jit::PtxasUsage u;
  {
    py::gil_scoped_release release;
    u = jit::ptxas_usage(k);
  }
  if (!u.reported) return py::none();
  py::dict d;
  d["target"] = u.target;
  d["registers"] = u.registers;
  d["spill_stores"] = u.spill_stores;
  d["spill_loads"] = u.spill_loads;
  d["stack_frame"] = u.stack_frame;
  return d;
}

std::vector<std::string> precompile(const std::string& op, const std::vector<std::string>& dtypes,
                                    const std::vector<int64_t>& hidden_sizes,
                                    const std::vector<std::optional<std::string>>& modes, const std::vector<int>& archs,
                                    int threads, const py::object& progress,
                                    const std::vector<std::optional<int64_t>>& group_sizes) {
  const std::vector<NormMode> m = parse_modes(modes);
  std::vector<jit::KernelKey> keys;
  for (int arch : archs)
    for (const auto& dt : dtypes)
      for (int64_t n : hidden_sizes) {
        if (n < 1) throw py::value_error("rtcnorm.jit.precompile: hidden sizes must be >= 1");
        for (const auto& g : group_sizes) {
          auto k = variant_keys(op, jit::dtype_from_name(dt), n, m, arch, g);
          keys.insert(keys.end(), k.begin(), k.end());
        }
      }
  return jit::precompile_for_python(keys, threads, progress);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "rtcnorm native module: op registration and the NVRTC JIT runtime";
  m.def("set_nvrtc_search_dirs", &jit::set_nvrtc_search_dirs);
  m.def("nvrtc_info", [] {
    const jit::NvrtcInfo& i = jit::nvrtc_info();
    py::dict d;
    d["path"] = i.path;
    d["version"] = std::to_string(i.major) + "." + std::to_string(i.minor);
    d["archs"] = i.archs;
    return d;
  });
  m.def("driver_version", &jit::driver_version_string);
  jit::bind_cache(m);
  m.def("variant_ops", &variant_ops);
  m.def("precompile", &precompile, py::arg("op"), py::arg("dtypes"), py::arg("hidden_sizes"), py::arg("modes"),
        py::arg("archs"), py::arg("threads") = 0, py::arg("progress") = py::none(),
        py::arg("group_sizes") = std::vector<std::optional<int64_t>>{std::nullopt});
  bind_arg_checks(m);
  m.def("rows_single_stride", [](const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t lead) {
    return rows_single_stride(sizes, strides, lead);
  });
  // Tests only: the grid-exchange tag counter of the current stream of a device.
  m.def("_grid_exchange_next_tag",
        [](int device) { return next_grid_exchange_tag(device, jit::current_stream(device)); });
  m.def("_advance_grid_exchange_tags",
        [](int device, uint32_t next) { advance_grid_exchange_tags(device, jit::current_stream(device), next); });
  bind_softmax(m, &ptxas_dict);
  bind_norm(m, &ptxas_dict);
  bind_gated(m, &ptxas_dict);
}
