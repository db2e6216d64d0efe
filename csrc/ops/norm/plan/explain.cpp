// explain(): the planner's trace as text. Built only on request; nothing
// reads this text back.
#include <sstream>
#include <string>

#include "ops/norm/plan/planner.h"

namespace rtcnorm {
namespace {

template <typename Design>
void knobs_text(std::ostringstream& os, Design d, const Knobs& k) {
  bool first = true;
  for (int i = 0; i < kKnobCount; ++i) {
    const Knob knob = static_cast<Knob>(i);
    if (!declares(d, knob)) continue;
    os << (first ? "" : " ") << knob_name(knob) << "=" << k.get(knob);
    first = false;
  }
}

template <typename Design>
std::string trace_text(const PlanTrace& t, const char* what) {
  std::ostringstream os;
  os.precision(3);
  if (t.ranked.empty()) return "";
  for (size_t i = 0; i < t.ranked.size(); ++i) {
    const Candidate& c = t.ranked[i];
    const auto d = static_cast<Design>(c.design);
    os << (i == 0 ? "" : i == 1 ? "; then: " : "; ") << design_name(d) << " (";
    knobs_text(os, d, c.knobs);
    os << ") " << c.us << " us";
    if (i == 0)
      os << ", " << c.bytes / 1e6 << " MB moved at " << int(c.efficiency * 100 + 0.5) << "% of DRAM bandwidth, "
         << c.in_flight / 1024 << " KB in flight an SM, " << c.regs << " registers a thread";
  }
  os << "; " << what << " ranked " << t.considered << " feasible candidates by the cost model";
  if (t.forced_design || t.forced_knobs) os << " (restricted by an override)";
  if (t.tuned) os << " (the measured choice of rtcnorm.tune)";
  return os.str();
}

}  // namespace

std::string explain_fwd(const NormFwdPlan& plan) { return trace_text<FwdDesign>(plan.trace, "forward:"); }
std::string explain_bwd(const NormBwdPlan& plan) { return trace_text<BwdDesign>(plan.trace, "backward:"); }

}  // namespace rtcnorm
