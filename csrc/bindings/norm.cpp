#include "bindings/norm.h"

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <limits>
#include <optional>
#include <string>

#include "jit/kernel_cache.h"
#include "ops/norm/kernel_families.h"
#include "ops/norm/launch_geometry.h"
#include "ops/norm/modes.h"
#include "ops/norm/quant.h"
#include "ops/norm/tuned_plans.h"
#include "ops/norm_common.h"
#include "ops/norm_plan_memo.h"

namespace py = pybind11;

namespace rtcnorm {
namespace {

py::object (*g_ptxas)(const jit::KernelKey&) = nullptr;

// The knobs in `mask` (bit k: Knob k) and their values.
py::dict knobs_dict(unsigned mask, const Knobs& k) {
  py::dict out;
  for (int i = 0; i < kKnobCount; ++i)
    if ((mask >> i & 1u) != 0) out[knob_name(static_cast<Knob>(i))] = k.get(static_cast<Knob>(i));
  return out;
}

// The ranked candidates of a trace: the fields plan tests assert on.
py::list candidates_list(const PlanTrace& t, bool forward) {
  py::list out;
  for (const Candidate& c : t.ranked) {
    py::dict d;
    d["design"] = design_name(forward, c.design);
    d["knobs"] = knobs_dict(declared_knobs(forward, c.design), c.knobs);
    d["us"] = c.us;
    d["bytes"] = c.bytes;
    d["efficiency"] = c.efficiency;
    d["in_flight"] = c.in_flight;
    d["registers"] = c.regs;
    d["grid"] = c.grid;
    out.append(d);
  }
  return out;
}

void put_launch(py::dict& d, const jit::KernelKey& k, int64_t row_blocks) {
  d["kernel"] = k.name_expression();
  d["vec"] = k.vec;
  d["threads_per_row"] = k.threads_per_row;
  d["rows_per_cta"] = k.rows_per_cta;
  d["vecs_per_thread"] = k.vecs_per_thread;
  d["block"] = k.threads();
  d["row_blocks"] = row_blocks;
  d["cluster"] = k.cluster;
  d["launch_bounds"] = k.variant;
  d["grid_exchange"] = (k.flags & kGridExchange) != 0;
  d["column_slices"] = column_slices(k.flags);
}

// rows_layout: 0 rows of two strides, 1 of one stride, 2 contiguous rows
// (from an aligned base, as a fresh tensor's).
NormProblem problem_of(const std::string& op, int64_t rows, int64_t hidden, const std::string& dtype,
                       const std::string& wdtype, bool has_weight, bool has_bias, bool zero_centered, bool residual,
                       int rows_layout) {
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
  p.single_stride = rows_layout >= 1;
  p.flat = rows_layout == 2;
  return p;
}

// The epilogue flags of a quantized output, checked as norm_quant checks them.
unsigned quant_flags(const std::string& recipe, std::optional<at::ScalarType> out_dtype, const std::string& layout,
                     jit::DType dtype) {
  const at::ScalarType in = dtype == jit::DType::kBFloat16  ? at::kBFloat16
                            : dtype == jit::DType::kFloat16 ? at::kHalf
                                                            : at::kFloat;
  const at::ScalarType od = out_dtype.value_or(recipe == "nvfp4" ? at::kFloat4_e2m1fn_x2 : at::kFloat8_e4m3fn);
  const auto meta = at::TensorOptions().device(at::kMeta);
  std::optional<at::Tensor> scale;
  if (recipe == "per_tensor" || recipe == "nvfp4") scale = at::empty({1}, meta.dtype(at::kFloat));
  return check_quant_args(at::empty({1}, meta.dtype(in)), recipe, od, scale, layout, /*scale_value=*/false).flags();
}

py::dict explain_norm(const std::string& op, int64_t rows, int64_t hidden, const std::string& dtype,
                      const std::string& wdtype, std::optional<std::string> mode, bool has_weight, bool has_bias,
                      bool zero_centered, bool residual, int device, int sm_count, int arch, bool resources,
                      int rows_layout, const std::optional<std::string>& quant_recipe,
                      std::optional<at::ScalarType> quant_dtype, const std::string& scale_layout) {
  if (rows < 0 || hidden < 1 || hidden > kMaxNormHidden || sm_count < 1)
    throw py::value_error("rtcnorm.explain: needs rows >= 0, a row of 1 to 2^24 elements and sm_count >= 1, got rows " +
                          std::to_string(rows) + ", row " + std::to_string(hidden) + ", sm_count " +
                          std::to_string(sm_count));
  const NormProblem pb =
      problem_of(op, rows, hidden, dtype, wdtype, has_weight, has_bias, zero_centered, residual, rows_layout);
  NormProblem p = pb;  // the forward's, with its output epilogue
  if (quant_recipe.has_value()) p.quant = quant_flags(*quant_recipe, quant_dtype, scale_layout, pb.dtype);
  std::optional<c10::string_view> mv;
  if (mode.has_value()) mv = c10::string_view(mode->data(), mode->size());
  const NormMode requested = parse_mode(mv, op.c_str());
  std::optional<c10::DeviceGuard> guard;  // loading a kernel makes its device current
  if (device >= 0) {
    guard.emplace(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    sm_count = jit::device_info(device).sm_count;
    arch = jit::device_info(device).arch;
  }
  // On a device, a measured choice (rtcnorm.tune) is taken as the launch path takes it.
  std::optional<TunedChoice> tf, tb;
  if (device >= 0) {
    tf = find_tuned(true, p, static_cast<unsigned>(requested), jit::device_info(device));
    tb = find_tuned(false, pb, (has_weight ? 1u : 0u) | (has_bias ? 2u : 0u) | (residual ? 4u : 0u),
                    jit::device_info(device));
  }
  const NormFwdPlan f = plan_norm_fwd(p, requested, sm_count, arch, /*explain=*/true, tf ? &*tf : nullptr);
  const NormBwdPlan b =
      plan_norm_bwd(pb, has_weight, has_bias, residual, sm_count, arch, /*explain=*/true, tb ? &*tb : nullptr);
  py::dict d;
  d["op"] = op;
  d["requested_mode"] = mode.has_value() ? py::cast(*mode) : py::none();
  d["design"] = design_name(true, static_cast<int>(f.design));
  d["knobs"] = knobs_dict(declared_knobs(true, static_cast<int>(f.design)), f.knobs);
  d["mode"] = mode_name(f.mode);
  d["reason"] = explain_trace(f.trace, true);
  d["candidates"] = candidates_list(f.trace, true);
  d["cost_us"] = f.cost_us;
  d["tuned"] = f.trace.tuned;
  d["forced"] = f.trace.forced;
  d["cached_row"] = f.cached;
  d["persistent"] = f.persistent;
  d["smem"] = f.smem;
  put_launch(d, f.key, f.row_blocks);
  d["sm_count"] = sm_count;
  d["arch"] = "sm_" + std::to_string(arch);
  if (resources) d["ptxas"] = g_ptxas(f.key);
  const bool live = device >= 0 && rows > 0;
  if (live) {
    const jit::LoadedKernel& k = jit::get_kernel(f.key, device, jit::current_stream(device), f.smem);
    d["blocks_per_sm"] = k.blocks_per_sm;
    d["registers"] = k.registers;
    d["grid"] =
        norm_grid(f.row_blocks, f.persistent, sm_count, k, std::numeric_limits<int64_t>::max(), grid_group_ctas(f.key));
  } else {
    d["grid"] =
        f.persistent ? py::cast("SMs x occupancy (resolved at launch)") : py::cast(f.row_blocks * f.key.cluster);
  }
  py::dict bd;
  bd["design"] = design_name(false, static_cast<int>(b.design));
  bd["knobs"] = knobs_dict(declared_knobs(false, static_cast<int>(b.design)), b.knobs);
  bd["reason"] = explain_trace(b.trace, false);
  bd["candidates"] = candidates_list(b.trace, false);
  bd["cost_us"] = b.cost_us;
  bd["tuned"] = b.trace.tuned;
  bd["forced"] = b.trace.forced;
  bd["cached_row"] = !b.split();
  bd["split"] = b.split();
  put_launch(bd, b.key, b.row_blocks);
  if (resources) bd["ptxas"] = g_ptxas(b.key);
  const bool staged = (b.key.flags & kStagedRow) != 0;
  bd["staged"] = staged;
  bd["ring_stages"] = staged ? 2 + int((b.key.flags & kRingExtraBits) >> kRingExtraShift) : 0;
  bd["deferred_stats"] = (b.key.flags & kDeferStats) != 0;
  bd["keep_terms"] = (b.key.flags & kKeepTerms) != 0;
  bd["direct_grads"] = (b.key.flags & kDirectGrads) != 0;
  bd["smem"] = b.smem;
  bd["programmatic_launch"] = jit::programmatic_arch(b.key.arch);
  if (b.split()) {
    bd["coef_kernel"] = b.coef_key.name_expression();
    if (resources) bd["coef_ptxas"] = g_ptxas(b.coef_key);
    const SplitGrid g = split_grid(b, rows, sm_count);
    bd["grid"] = py::make_tuple(g.col_tiles, g.row_tiles);
    bd["rows_per_tile"] = g.rows_per_tile;
  } else if ((b.key.flags & kDirectGrads) != 0) {
    bd["grid"] = int64_t(b.key.cluster);
  } else if (live) {
    const jit::LoadedKernel& k = jit::get_kernel(b.key, device, jit::current_stream(device), b.smem);
    bd["grid"] = norm_grid(b.row_blocks, true, sm_count, k, b.max_units, grid_group_ctas(b.key));
  } else {
    bd["grid"] = b.max_units * grid_unit_ctas(b.key);
  }
  d["backward"] = bd;
  return d;
}

// Parses ("fwd" | "bwd", design name or None, {knob: value}) into an
// override, checking everything before anything is set.
NormOverride parse_override(bool forward, const std::optional<std::string>& design, const py::dict& knobs) {
  const char* dir = forward ? "forward" : "backward";
  NormOverride o;
  if (design.has_value()) {
    o.design = design_from_name(forward, *design);
    if (o.design < 0) {
      std::string valid;
      for (int i = 0; i < design_count(forward); ++i) valid += std::string(i ? ", " : "") + design_name(forward, i);
      throw py::value_error(std::string("rtcnorm._tuning: unknown ") + dir + " norm design '" + *design +
                            "'; valid: " + valid);
    }
  }
  for (auto [k, v] : knobs) {
    const std::string name = py::cast<std::string>(k);
    int knob = -1;
    for (int i = 0; i < kKnobCount; ++i)
      if (name == knob_name(static_cast<Knob>(i))) knob = i;
    bool declared = false;
    for (int d = 0; knob >= 0 && d < design_count(forward); ++d)
      if ((o.design < 0 || o.design == d) && (declared_knobs(forward, d) >> knob & 1u) != 0) declared = true;
    if (!declared)
      throw py::value_error("rtcnorm._tuning: the " + std::string(dir) + " knob '" + name + "' is not declared by " +
                            (o.design >= 0 ? std::string("the forced design") : std::string("any design")) +
                            " (rtcnorm._tuning.norm_designs() lists each design's knobs)");
    if (!py::isinstance<py::int_>(v)) throw py::type_error("rtcnorm._tuning: knob " + name + " must be an int or bool");
    const int64_t val = py::cast<int64_t>(v);
    if (val < 0 || val > 1024)
      throw py::value_error("rtcnorm._tuning: knob " + name + " must be in [0, 1024], got " + std::to_string(val));
    o.knobs.set(static_cast<Knob>(knob), static_cast<int>(val));
    o.set |= 1u << knob;
  }
  return o;
}

// A measured choice of a named design, its knobs checked as an override's.
TunedChoice tuned_choice(bool forward, const std::string& design, const py::dict& knobs) {
  const NormOverride o = parse_override(forward, design, knobs);
  TunedChoice c;
  c.design = o.design;
  c.knobs = o.knobs;
  return c;
}

bool parse_direction(const std::string& d) {
  if (d == "fwd" || d == "bwd") return d == "fwd";
  throw py::value_error("rtcnorm._tuning: direction must be 'fwd' or 'bwd', got '" + d + "'");
}

}  // namespace

void bind_norm(py::module_& m, py::object (*ptxas)(const jit::KernelKey&)) {
  g_ptxas = ptxas;
  m.def("explain_norm", &explain_norm);
  m.def("norm_designs", [](const std::string& direction) {
    const bool fwd = parse_direction(direction);
    py::dict d;
    for (int i = 0; i < design_count(fwd); ++i) {
      py::list knobs;
      for (int j = 0; j < kKnobCount; ++j)
        if ((declared_knobs(fwd, i) >> j & 1u) != 0) knobs.append(knob_name(static_cast<Knob>(j)));
      d[design_name(fwd, i)] = knobs;
    }
    return d;
  });
  m.def("_norm_override", [](const std::string& direction) {
    const bool fwd = parse_direction(direction);
    const NormOverride& o = norm_override(fwd);
    py::dict d;
    d["design"] = o.design < 0 ? py::none() : py::cast(design_name(fwd, o.design));
    d["knobs"] = knobs_dict(o.set, o.knobs);
    return d;
  });
  // rtcnorm.tune: keeps a measured choice for one exact problem on `device`'s GPU model.
  m.def("_norm_store_tuned",
        [](const std::string& direction, const std::string& op, int64_t rows, int64_t hidden, const std::string& dtype,
           const std::string& wdtype, bool has_weight, bool has_bias, bool zero_centered, bool residual,
           bool single_stride, int extra, const std::string& design, const py::dict& knobs, int device, bool persist) {
          const bool fwd = parse_direction(direction);
          const NormProblem p = problem_of(op, rows, hidden, dtype, wdtype, has_weight, has_bias, zero_centered,
                                           residual, single_stride ? 2 : 0);
          const bool stored = store_tuned(fwd, p, static_cast<unsigned>(extra), jit::device_info(device),
                                          tuned_choice(fwd, design, knobs), persist);
          clear_norm_plan_memo();
          return stored;
        });
  // rtcnorm.tuned_table: a shipped choice for a GPU model named by the caller
  // (no device is touched), kept in memory only and only where this process
  // knows no measured choice (its own tuning, in memory or on disk, wins).
  m.def("_norm_seed_tuned", [](const std::string& gpu, int sm_count, int arch, const std::string& direction,
                               const std::string& op, int64_t rows, int64_t hidden, const std::string& dtype,
                               bool has_bias, int extra, const std::string& design, const py::dict& knobs) {
    const bool fwd = parse_direction(direction);
    jit::DeviceInfo info;
    info.name = gpu;
    info.sm_count = sm_count;
    info.arch = arch;
    // Contiguous rows from an aligned base (rows_layout 2), as the tensors tune() times.
    const NormProblem p = problem_of(op, rows, hidden, dtype, dtype, true, has_bias, false, false, 2);
    const unsigned bits = static_cast<unsigned>(extra);
    if (find_tuned(fwd, p, bits, info)) return false;
    store_tuned(fwd, p, bits, info, tuned_choice(fwd, design, knobs), /*persist=*/false);
    clear_norm_plan_memo();
    return true;
  });
  m.def("_norm_forget_tuned", [] {
    forget_tuned();
    clear_norm_plan_memo();
  });
  m.def("_set_norm_override",
        [](const std::string& direction, const std::optional<std::string>& design, const py::dict& knobs) {
          const bool fwd = parse_direction(direction);
          set_norm_override(fwd, parse_override(fwd, design, knobs));
          clear_norm_plan_memo();
        });
}

}  // namespace rtcnorm
