#include "bindings/softmax.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/softmax/plan/planner.h"
#include "ops/softmax/softmax.h"

namespace py = pybind11;

namespace rtcnorm {
namespace {

py::dict softmax_knobs_dict(const SoftmaxKnobs& k) {
  py::dict d;
  d["vec"] = k.vec;
  d["threads_per_row"] = k.threads_per_row;
  d["vecs_per_thread"] = k.vecs_per_thread;
  d["rows_per_cta"] = k.rows_per_cta;
  d["cluster"] = k.cluster;
  d["min_blocks"] = k.min_blocks;
  d["reuse_run"] = k.reuse_run;
  d["ctas_per_sm"] = k.ctas_per_sm;
  d["keep_exp"] = k.keep_exp;
  d["heads_inner"] = k.heads_inner;
  d["l1_alloc"] = k.l1_alloc;
  d["stream_store"] = k.stream_store;
  d["smem_bytes"] = k.smem_bytes;
  return d;
}

// The planner's trace as data: every candidate with its feasibility, knobs,
// resources and cost, and the pick.
py::list softmax_candidates(const SoftmaxTrace& t) {
  py::list out;
  for (const SoftmaxCandidate& c : t.candidates) {
    py::dict e;
    e["design"] = design_info(c.design).name;
    e["feasible"] = c.feasible;
    if (c.feasible) {
      e["knobs"] = softmax_knobs_dict(c.knobs);
      const SoftmaxResources r = design_resources(c.design, c.knobs);
      e["resources"] = py::dict(py::arg("threads") = r.threads, py::arg("regs_per_thread") = r.regs_per_thread,
                                py::arg("smem_bytes") = r.smem_bytes, py::arg("cluster") = r.cluster);
      e["cost"] = py::dict(py::arg("ns") = c.cost.ns, py::arg("dram_bytes") = c.cost.dram_bytes,
                           py::arg("l2_bytes") = c.cost.l2_bytes, py::arg("ctas") = c.cost.ctas,
                           py::arg("waves") = c.cost.waves, py::arg("active_sms") = c.cost.active_sms,
                           py::arg("round_trips") = c.cost.round_trips, py::arg("serial_vecs") = c.cost.serial_vecs,
                           py::arg("sm_vecs") = c.cost.sm_vecs, py::arg("lone_exps") = c.cost.lone_exps);
    }
    out.append(e);
  }
  return out;
}

py::dict explain_softmax(const std::string& op, int64_t rows, int64_t cols, const std::string& dtype, int arch,
                         int64_t mask_bcast, int sm_count, int64_t sq, bool resources,
                         py::object (*ptxas)(const jit::KernelKey&)) {
  if (sm_count < 1) throw py::value_error("rtcnorm.softmax.explain: sm_count must be at least 1");
  SoftmaxProblem p;
  p.arch = SoftmaxArch(arch, sm_count);
  p.mask_bcast = std::max<int64_t>(1, mask_bcast);
  p.dtype = jit::dtype_from_name(dtype);
  p.rows = rows;
  p.cols = cols;
  p.sq = sq;
  p.max_vec = 16;
  p.flat = true;
  bool known = false;
  for (SoftmaxOp o : {SoftmaxOp::kScaled, SoftmaxOp::kMasked, SoftmaxOp::kUpperTriang, SoftmaxOp::kAlignedCausal}) {
    if (op != softmax_op_name(o)) continue;
    p.variant = softmax_variant(o);
    known = true;
  }
  if (!known) throw py::value_error("rtcnorm.softmax.explain: unknown op '" + op + "'");
  py::dict d;
  for (bool backward : {false, true}) {
    p.backward = backward;
    const SoftmaxTrace t = trace_softmax(p);
    const SoftmaxPlan& plan = t.plan;
    py::dict e;
    const jit::KernelKey& k = plan.key;
    e["kernel"] = k.name_expression();
    e["vec"] = k.vec;
    e["threads_per_row"] = k.threads_per_row;
    e["rows_per_cta"] = k.rows_per_cta;
    e["vecs_per_thread"] = k.vecs_per_thread;
    e["block"] = k.threads();
    e["row_blocks"] = plan.row_blocks;
    e["cluster"] = k.cluster;
    e["design"] = design_info(plan.design).name;
    e["forced"] = t.forced;
    e["knobs"] = softmax_knobs_dict(plan.knobs);
    e["candidates"] = softmax_candidates(t);
    e["reuse_splits"] = plan.reuse_splits;
    e["cached_row"] = plan.cached;
    e["persistent"] = plan.persistent;
    e["grid"] = plan.persistent ? py::cast(describe_grid(plan)) : py::cast(fixed_grid(plan));
    e["reason"] = describe_trace(t);
    if (resources) e["ptxas"] = ptxas(plan.key);
    d[backward ? "backward" : "forward"] = e;
  }
  d["op"] = op;
  d["arch"] = "sm_" + std::to_string(arch);
  return d;
}

}  // namespace

void bind_softmax(py::module_& m, py::object (*ptxas)(const jit::KernelKey&)) {
  m.def(
      "explain_softmax",
      [ptxas](const std::string& op, int64_t rows, int64_t cols, const std::string& dtype, int arch, int64_t mask_bcast,
              int sm_count, int64_t sq, bool resources) {
        return explain_softmax(op, rows, cols, dtype, arch, mask_bcast, sm_count, sq, resources, ptxas);
      },
      py::arg("op"), py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("arch"), py::arg("mask_bcast") = 1,
      py::arg("sm_count") = 132, py::arg("sq") = 0, py::arg("resources") = false);
  m.def("softmax_designs", [] {
    py::dict d;
    for (int i = 0; i < kNumSoftmaxDesigns; ++i) {
      const SoftmaxDesignInfo& info = design_info(static_cast<SoftmaxDesign>(i));
      py::list knobs;
      for (int j = 0; j < kNumSoftmaxKnobs; ++j)
        if (info.knobs & (1u << j)) knobs.append(knob_name(static_cast<SoftmaxKnob>(j)));
      d[info.name] = knobs;
    }
    return d;
  });
  m.def("_softmax_tuning", [] {
    const SoftmaxOverrides ov = softmax_overrides();
    py::dict knobs;
    for (int j = 0; j < kNumSoftmaxKnobs; ++j)
      if (ov.knobs.has(static_cast<SoftmaxKnob>(j))) knobs[knob_name(static_cast<SoftmaxKnob>(j))] = ov.knobs.value[j];
    py::dict d;
    d["design"] = ov.design ? py::cast(design_info(*ov.design).name) : py::none();
    d["knobs"] = knobs;
    return d;
  });
  // Checks everything before setting anything, so a bad value changes nothing.
  m.def("_set_softmax_tuning", [](const std::optional<std::string>& design, const py::dict& knobs) {
    std::vector<std::pair<std::string, int64_t>> values;
    for (auto [k, v] : knobs) {
      const std::string key = py::cast<std::string>(k);
      if (!py::isinstance<py::int_>(v))
        throw py::type_error("rtcnorm._tuning: softmax knob " + key + " must be an int or a bool");
      values.emplace_back(key, py::cast<int64_t>(v));
    }
    set_softmax_overrides(design, values);
  });
}

}  // namespace rtcnorm
