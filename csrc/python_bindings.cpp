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
#include "bindings/softmax.h"
#include "jit/disk_cache.h"
#include "jit/kernel_cache.h"
#include "jit/nvrtc.h"
#include "jit/py_jit.h"
#include "ops/grid_exchange_buffers.h"
#include "ops/norm_common.h"
#include "ops/norm_plan.h"
#include "ops/norm_plan_memo.h"
#include "ops/softmax.h"
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

// The planner tunables rtcnorm._tuning reads and overrides; values above
// `max` are clamped to it.
struct Tunable {
  const char* name;
  int NormTuning::*field;
  int64_t max;
};
constexpr int64_t kNoCap = std::numeric_limits<int>::max();
constexpr Tunable kTunables[] = {
    {"fwd_vecs_target", &NormTuning::fwd_vecs_target, kNoCap},
    {"fwd_cta_threads", &NormTuning::fwd_cta_threads, 1024},
    {"fwd_cache_bytes", &NormTuning::fwd_cache_bytes, kNoCap},
    {"fwd_min_blocks", &NormTuning::fwd_min_blocks, kNoCap},
    {"fwd_smem_row_bytes", &NormTuning::fwd_smem_row_bytes, kNoCap},
    {"fwd_smem_vecs", &NormTuning::fwd_smem_vecs, 16},
    {"keep_gamma_floats", &NormTuning::keep_gamma_floats, kNoCap},
    {"fwd_two_pass", &NormTuning::fwd_two_pass, 2},
    {"fwd_l1_alloc", &NormTuning::fwd_l1_alloc, 2},
    {"bwd_cache_elems", &NormTuning::bwd_cache_elems, kNoCap},
    {"bwd_cta_threads", &NormTuning::bwd_cta_threads, 1024},
    {"bwd_min_blocks", &NormTuning::bwd_min_blocks, kNoCap},
    {"bwd_split", &NormTuning::bwd_split, 2},
    {"bwd_split_rows", &NormTuning::bwd_split_rows, 16},
    {"narrow_row", &NormTuning::narrow_row, kNoCap},
    {"fwd_hints", &NormTuning::fwd_hints, 4},
    {"bwd_hints", &NormTuning::bwd_hints, 4},
    {"fwd_affine_prefetch", &NormTuning::fwd_affine_prefetch, 3},
    {"fwd_cluster", &NormTuning::fwd_cluster, 16},
    {"bwd_cluster", &NormTuning::bwd_cluster, 16},
    {"bwd_stage", &NormTuning::bwd_stage, 2},
    {"bwd_ring_stages", &NormTuning::bwd_ring_stages, 5},
    {"bwd_keep_terms", &NormTuning::bwd_keep_terms, 2},
    {"bwd_min_row_blocks", &NormTuning::bwd_min_row_blocks, kNoCap},
    {"bwd_programmatic", &NormTuning::bwd_programmatic, 2},
    {"bwd_direct_grads", &NormTuning::bwd_direct_grads, 2},
    {"bwd_gamma_beside_row", &NormTuning::bwd_gamma_beside_row, 2},
    {"bwd_row_cluster", &NormTuning::bwd_row_cluster, 16},
    {"bwd_defer_stats", &NormTuning::bwd_defer_stats, 2},
    {"bwd_column_grads", &NormTuning::bwd_column_grads, 2},
    {"bwd_one_wave_columns", &NormTuning::bwd_one_wave_columns, 2},
    {"bwd_grid_exchange", &NormTuning::bwd_grid_exchange, 2},
    {"fwd_grid_exchange", &NormTuning::fwd_grid_exchange, 2},
    {"fwd_prefetch_ahead", &NormTuning::fwd_prefetch_ahead, 2},
    {"bwd_staged_slices", &NormTuning::bwd_staged_slices, 2},
    {"fwd_defer_stats", &NormTuning::fwd_defer_stats, 2},
    {"fwd_ring_stages", &NormTuning::fwd_ring_stages, 5},
    {"fwd_dense_narrow", &NormTuning::fwd_dense_narrow, 2},
    {"reg_headroom", &NormTuning::reg_headroom, 2},
    {"fwd_single_stride", &NormTuning::fwd_single_stride, 2},
    {"bwd_single_stride", &NormTuning::bwd_single_stride, 2},
    {"fwd_wide_ln_regs", &NormTuning::fwd_wide_ln_regs, 2},
};

// The launch configuration explain() reports for a kernel key.
void put_launch(py::dict& d, const jit::KernelKey& k, int64_t row_blocks) {
  d["kernel"] = k.name_expression();
  d["vec"] = k.vec;
  d["threads_per_row"] = k.threads_per_row;
  d["rows_per_cta"] = k.rows_per_cta;
  d["vecs_per_thread"] = k.vecs_per_thread;
  d["block"] = k.threads();
  d["row_blocks"] = row_blocks;
  d["cluster"] = k.cluster;
}

// A persistent grid without a device: resident CTAs are known only once the
// kernel is loaded on one.
const char* unresolved_grid(const jit::KernelKey& k, bool capped) {
  if ((k.flags & kGridExchange) != 0)
    return capped ? "SMs x occupancy in whole groups of column_slices CTAs, at most max_ctas (resolved at launch)"
                  : "SMs x occupancy in whole groups of column_slices CTAs (resolved at launch)";
  if (k.cluster > 1)
    return capped ? "resident clusters x cluster size, at most max_ctas (resolved at launch)"
                  : "resident clusters x cluster size (resolved at launch)";
  return capped ? "SMs x occupancy, at most max_ctas (resolved at launch)" : "SMs x occupancy (resolved at launch)";
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
                                    int threads, const py::object& progress) {
  const std::vector<NormMode> m = parse_modes(modes);
  std::vector<jit::KernelKey> keys;
  for (int arch : archs)
    for (const auto& dt : dtypes)
      for (int64_t n : hidden_sizes) {
        if (n < 1) throw py::value_error("rtcnorm.jit.precompile: hidden sizes must be >= 1");
        auto k = variant_keys(op, jit::dtype_from_name(dt), n, m, arch);
        keys.insert(keys.end(), k.begin(), k.end());
      }
  return jit::precompile_for_python(keys, threads, progress);
}

py::dict explain_norm(const std::string& op, int64_t rows, int64_t hidden, const std::string& dtype,
                      const std::string& wdtype, std::optional<std::string> mode, bool has_weight, bool has_bias,
                      bool zero_centered, bool residual, int device, int sm_count, int arch, bool resources,
                      bool single_stride) {
  // rtcnorm.explain checks its arguments as the ops do (csrc/ops/norm_checks.h);
  // this guards direct calls.
  if (rows < 0 || hidden < 1 || hidden > kMaxNormHidden || sm_count < 1)
    throw py::value_error("rtcnorm.explain: needs rows >= 0, a row of 1 to 2^24 elements and sm_count >= 1, got rows " +
                          std::to_string(rows) + ", row " + std::to_string(hidden) + ", sm_count " +
                          std::to_string(sm_count));
  NormProblem p;
  p.kind = op == "layer_norm" ? kLayerNorm : kRmsNorm;
  p.dtype = jit::dtype_from_name(dtype);
  p.wdtype = jit::dtype_from_name(wdtype);
  p.rows = rows;
  p.hidden = hidden;
  p.max_vec = 16;
  p.has_weight = has_weight;
  p.has_bias = has_bias;
  p.zero_centered = zero_centered;
  p.residual = residual;
  p.single_stride = single_stride;
  std::optional<c10::string_view> mv;
  if (mode.has_value()) mv = c10::string_view(mode->data(), mode->size());
  const NormMode requested = parse_mode(mv, op.c_str());
  // Loading a kernel makes its device's context current; the guard gives the
  // caller back its own current device.
  std::optional<c10::DeviceGuard> guard;
  if (device >= 0) guard.emplace(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  if (device >= 0) {
    sm_count = jit::device_info(device).sm_count;
    arch = jit::device_info(device).arch;
  }
  const NormFwdPlan f = plan_norm_fwd(p, requested, sm_count, arch, /*explain=*/true);
  const NormBwdPlan b = plan_norm_bwd(p, has_weight, has_bias, residual, sm_count, arch, /*explain=*/true);
  py::dict d;
  d["op"] = op;
  d["requested_mode"] = mode.has_value() ? py::cast(*mode) : py::none();
  d["mode"] = mode_name(f.mode);
  d["reason"] = f.reason;
  d["cached_row"] = f.cached;
  d["persistent"] = f.persistent;
  d["smem"] = f.smem;
  put_launch(d, f.key, f.row_blocks);
  d["grid_exchange"] = (f.key.flags & kGridExchange) != 0;
  d["column_slices"] = column_slices(f.key.flags);
  d["sm_count"] = sm_count;
  d["arch"] = "sm_" + std::to_string(arch);
  if (resources) d["ptxas"] = ptxas_dict(f.key);
  if (device >= 0 && rows > 0) {
    const jit::LoadedKernel& k = jit::get_kernel(f.key, device, jit::current_stream(device), f.smem);
    d["blocks_per_sm"] = k.blocks_per_sm;
    d["registers"] = k.registers;
    d["grid"] =
        norm_grid(f.row_blocks, f.persistent, sm_count, k, std::numeric_limits<int64_t>::max(), grid_group_ctas(f.key));
  } else {
    d["grid"] = f.persistent ? py::cast(unresolved_grid(f.key, false)) : py::cast(f.row_blocks * f.key.cluster);
  }
  py::dict bd;
  bd["reason"] = b.reason;
  bd["cached_row"] = b.cached;
  bd["split"] = b.split;
  if (b.split) {
    bd["coef_kernel"] = b.coef_key.name_expression();
    if (resources) bd["coef_ptxas"] = ptxas_dict(b.coef_key);
    const SplitGrid g = split_grid(b, rows, sm_count);
    bd["grid"] = py::make_tuple(g.col_tiles, g.row_tiles);
    bd["rows_per_tile"] = g.rows_per_tile;
  }
  bd["kernel"] = b.key.name_expression();
  if (resources) bd["ptxas"] = ptxas_dict(b.key);
  bd["block"] = b.key.threads();
  bd["cluster"] = b.key.cluster;
  bd["row_cluster"] = (b.key.flags & kRowClusterBits) != 0;
  const bool staged = (b.key.flags & kStagedRow) != 0;
  bd["staged"] = staged;
  bd["ring_stages"] = staged ? 2 + int((b.key.flags & kRingExtraBits) >> kRingExtraShift) : 0;
  bd["deferred_stats"] = (b.key.flags & kDeferStats) != 0;
  bd["grid_exchange"] = (b.key.flags & kGridExchange) != 0;
  bd["column_slices"] = column_slices(b.key.flags);
  bd["keep_terms"] = (b.key.flags & kKeepTerms) != 0;
  const bool direct = (b.key.flags & kDirectGrads) != 0;
  bd["direct_grads"] = direct;
  const bool column_grads = (b.key.flags & kColumnGrads) != 0;
  bd["column_grads"] = column_grads;
  if (column_grads) bd["column_ctas"] = b.col_ctas;
  bd["smem"] = b.smem;
  bd["programmatic_launch"] = b.programmatic;
  if (!b.split) {
    bd["row_blocks"] = b.row_blocks;
    std::string cap_why;
    const int64_t cap = bwd_max_units(b, sm_count, &cap_why);
    const bool capped = cap < bwd_grid_row_blocks(b);
    if (capped) {
      bd["max_ctas"] = cap * grid_unit_ctas(b.key);
      bd["reason"] = b.reason + cap_why;
    }
    if (column_grads) {
      bd["grid"] = b.row_blocks + b.col_ctas;  // a CTA per row block, then the column CTAs
    } else if (direct) {
      bd["grid"] = int64_t(b.key.cluster);  // one row block: one CTA (cluster)
    } else if (device >= 0 && rows > 0) {
      const jit::LoadedKernel& k = jit::get_kernel(b.key, device, jit::current_stream(device), b.smem);
      bd["grid"] = norm_grid(bwd_grid_row_blocks(b), true, sm_count, k, cap, grid_group_ctas(b.key));
    } else {
      bd["grid"] = py::cast(unresolved_grid(b.key, capped));
    }
  }
  d["backward"] = bd;
  return d;
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
        py::arg("archs"), py::arg("threads") = 0, py::arg("progress") = py::none());
  m.def("explain_norm", &explain_norm);
  bind_arg_checks(m);
  m.def("rows_single_stride", [](const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t lead) {
    return rows_single_stride(sizes, strides, lead);
  });
  m.def("_norm_tuning", [] {
    py::dict d;
    for (const Tunable& x : kTunables) d[x.name] = norm_tuning().*x.field;
    return d;
  });
  m.def("_set_norm_tuning", [](const py::dict& d) {
    for (auto [k, v] : d) {
      const std::string key = py::cast<std::string>(k);
      const int64_t val = py::cast<int64_t>(v);
      if (val < 0) throw py::value_error("rtcnorm._tuning: " + key + " must be >= 0 (0: the planner's rule)");
      const Tunable* x =
          std::find_if(std::begin(kTunables), std::end(kTunables), [&](const Tunable& t) { return key == t.name; });
      if (x == std::end(kTunables)) throw py::key_error("rtcnorm._tuning: unknown tunable '" + key + "'");
      norm_tuning().*x->field = static_cast<int>(std::min(val, x->max));
    }
    clear_norm_plan_memo();
  });
  // Tests only: the grid-exchange tag counter of the current stream of a device.
  m.def("_grid_exchange_next_tag",
        [](int device) { return next_grid_exchange_tag(device, jit::current_stream(device)); });
  m.def("_advance_grid_exchange_tags",
        [](int device, uint32_t next) { advance_grid_exchange_tags(device, jit::current_stream(device), next); });
  bind_softmax(m, &ptxas_dict);
}
