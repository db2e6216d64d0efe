// The softmax planner: enumerate the designs, keep the feasible ones, rank
// them by the cost model, pick the cheapest. Needs no GPU; a persistent
// grid takes its occupancy from the loaded kernel at launch.
//
// Overrides (rtcnorm._tuning.softmax_override) are exactly two: force a
// design, and set knobs that designs declare. A forced design runs every
// problem it is feasible for; the others plan as usual. A knob applies
// where the picked design declares it. Setting overrides clears the memo.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops/softmax/plan/designs.h"

namespace rtcnorm {

// The cost model's estimate for one candidate (cost_model.cpp), in ns.
struct SoftmaxCost {
  int64_t dram_bytes = 0;  // bytes between DRAM and L2
  int64_t l2_bytes = 0;    // bytes re-read from L2 (streamed rows, mask rows)
  int64_t ctas = 0;        // CTAs the grid launches (persistent: at most resident)
  double waves = 0;        // grid CTAs over resident CTAs
  int active_sms = 0;      // SMs the grid occupies
  int round_trips = 0;     // dependent memory round trips a CTA waits for
  int serial_vecs = 0;     // vectors one thread loads and reduces in series
  int64_t sm_vecs = 0;     // vector loads each occupied SM issues
  int64_t lone_exps = 0;   // exponentials of a CTA alone on its SM, per SM, that nothing overlaps
  double ns = 0;           // the estimate the ranking uses
};

struct SoftmaxCandidate {
  SoftmaxDesign design;
  bool feasible = false;
  const char* why_not = "";  // for explain only
  SoftmaxKnobs knobs;
  SoftmaxCost cost;
};

struct SoftmaxPlan {
  SoftmaxDesign design = SoftmaxDesign::kRows;
  SoftmaxKnobs knobs;
  jit::KernelKey key;
  bool cached = false;      // the row stays in registers: one read of each input
  bool persistent = false;  // grid = SMs x min(occupancy, ctas_per_sm); CTAs stride over row blocks
  int ctas_per_sm = 0;
  int64_t row_blocks = 0;
  int reuse_splits = 1;  // kMaskReuse: runs per mask row (SoftmaxFwdParams::reuse_splits)
};

struct SoftmaxTrace {
  SoftmaxProblem problem;
  std::vector<SoftmaxCandidate> candidates;  // catalogue order
  int picked = -1;                           // index into candidates
  bool forced = false;                       // the forced design was feasible and taken
  SoftmaxPlan plan;
};

// The hot path: one memo lookup per call after the first (a copy of the
// plan: a concurrent override may clear the memo).
SoftmaxPlan plan_softmax(const SoftmaxProblem& p);
// Plans afresh, keeping every candidate (explain, tests).
SoftmaxTrace trace_softmax(const SoftmaxProblem& p);
// The trace as text (explain.cpp); nothing reads it back.
std::string describe_trace(const SoftmaxTrace& t);
std::string describe_grid(const SoftmaxPlan& plan);

SoftmaxCost softmax_cost(SoftmaxDesign d, const SoftmaxProblem& p, const SoftmaxKnobs& k);

struct SoftmaxOverrides {
  std::optional<SoftmaxDesign> design;
  SoftmaxKnobOverrides knobs;
};
SoftmaxOverrides softmax_overrides();
// Throws std::invalid_argument naming what is valid; changes nothing then.
void set_softmax_overrides(const std::optional<std::string>& design,
                           const std::vector<std::pair<std::string, int64_t>>& knobs);
std::optional<SoftmaxDesign> softmax_design_named(const std::string& name);

// The grid of a plan: a CTA (or a cluster) per row block, or a persistent one.
inline int64_t fixed_grid(const SoftmaxPlan& plan) { return plan.row_blocks * plan.key.cluster; }
int64_t softmax_grid(const SoftmaxPlan& plan, int sm_count, int blocks_per_sm);

}  // namespace rtcnorm
