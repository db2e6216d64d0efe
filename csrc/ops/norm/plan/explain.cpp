// explain(): the planner's trace as text. Built only on request; nothing
// reads this text back.
#include <sstream>
#include <string>

#include "ops/norm/plan/planner.h"

namespace rtcnorm {
namespace {

std::string trace_text(const PlanTrace& t, bool forward) {
  std::ostringstream os;
  os.precision(3);
  if (t.ranked.empty()) return "";
  for (size_t i = 0; i < t.ranked.size(); ++i) {
    const Candidate& c = t.ranked[i];
    os << (i == 0 ? "" : i == 1 ? "; then: " : "; ") << design_name(forward, c.design) << " (";
    const char* sep = "";
    for (int k = 0; k < kKnobCount; ++k) {
      if ((declared_knobs(forward, c.design) >> k & 1u) == 0) continue;
      os << sep << knob_name(static_cast<Knob>(k)) << "=" << c.knobs.get(static_cast<Knob>(k));
      sep = " ";
    }
    os << ") " << c.us << " us";
    if (i == 0)
      os << ", " << c.bytes / 1e6 << " MB moved at " << int(c.efficiency * 100 + 0.5) << "% of DRAM bandwidth, "
         << c.in_flight / 1024 << " KB in flight an SM, " << c.regs << " registers a thread";
  }
  os << "; " << (forward ? "forward:" : "backward:") << " ranked " << t.considered
     << " feasible candidates by the cost model";
  if (t.forced) os << " (restricted by an override)";
  if (t.tuned) os << " (the measured choice of rtcnorm.tune)";
  return os.str();
}

}  // namespace

std::string explain_fwd(const NormFwdPlan& plan) { return trace_text(plan.trace, true); }
std::string explain_bwd(const NormBwdPlan& plan) { return trace_text(plan.trace, false); }

}  // namespace rtcnorm
