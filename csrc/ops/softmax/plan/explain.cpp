// The planner's trace as text, for rtcnorm.softmax.explain. Only explain
// calls this; no logic reads the text back.
#include <sstream>
#include <string>

#include "ops/plan_util.h"
#include "ops/softmax/plan/planner.h"

namespace rtcnorm {

std::string describe_grid(const SoftmaxPlan& plan) {
  if (!plan.persistent) return std::to_string(fixed_grid(plan));
  return plan.ctas_per_sm > 0 ? "SMs x min(occupancy, " + std::to_string(plan.ctas_per_sm) + ")" : "SMs x occupancy";
}

namespace {

void describe_shape(std::ostringstream& os, const SoftmaxProblem& p, const SoftmaxPlan& plan) {
  const jit::KernelKey& k = plan.key;
  const char* data = p.backward ? "y and dy" : "x";
  if (plan.design == SoftmaxDesign::kFlatRow) {
    os << "rows of " << p.cols << " allow no 16-byte access: blocks of " << k.rows_per_cta << " rows of " << data
       << " staged through shared memory in 16-byte pieces (" << plan.knobs.smem_bytes << " bytes of stages), "
       << k.threads_per_row << " threads per row in vectors of " << k.vec << ", the output written in place and "
       << "flushed in 16-byte pieces; grid = " << describe_grid(plan);
    return;
  }
  if (!plan.cached) {
    os << "row of " << p.cols << " too long for registers: streamed in chunks of "
       << k.threads_per_row * k.vecs_per_thread * k.vec << " elements, " << data << " re-read (mostly from L2) for the "
       << (p.backward ? "dx pass" : "normalize pass") << "; grid = " << describe_grid(plan);
    return;
  }
  os << "row of " << p.cols << " kept in registers (" << data << " read once): " << k.threads_per_row
     << " threads per row, " << k.vecs_per_thread << " vectors of " << k.vec << " per thread, " << k.rows_per_cta
     << " rows per CTA; kernel serves rows of up to " << k.hidden << " elements; grid = " << fixed_grid(plan)
     << (k.cluster > 1 ? " (a cluster per row block)" : " (a CTA per row block)");
  if (k.cluster > 1)
    os << "; row split across a cluster of " << k.cluster << " CTAs, each holding interleaved pieces of "
       << k.threads_per_row << " vectors (" << k.hidden / k.cluster
       << " elements of the row), statistics merged through distributed shared memory";
}

}  // namespace

std::string describe_trace(const SoftmaxTrace& t) {
  const SoftmaxProblem& p = t.problem;
  const SoftmaxPlan& plan = t.plan;
  const SoftmaxKnobs& kn = plan.knobs;
  std::ostringstream os;
  os << design_info(plan.design).name << (t.forced ? " (forced)" : "") << ": ";
  describe_shape(os, p, plan);
  os << "; launch bounds: " << kn.min_blocks << (kn.min_blocks == 1 ? " CTA per SM" : " CTAs per SM");
  if (kn.keep_exp) os << "; exp2 kept in registers";
  if (kn.stream_store) os << "; output stored evict-first";
  if (kn.l1_alloc) os << "; " << (p.backward ? "y and dy" : "x") << " loaded through L1";
  if (plan.design == SoftmaxDesign::kMaskReuse)
    os << "; each row group reads its mask row once for a run of " << kn.reuse_run << " rows sharing it ("
       << plan.reuse_splits << (plan.reuse_splits == 1 ? " run" : " runs") << " per mask row)";
  else if (kn.heads_inner)
    os << "; rows sharing a mask row taken consecutively";
  if (p.kernel_kind() == kSoftmaxCausal)
    os << "; causal: keys past the diagonal are neither read nor computed";
  else if (p.causal())
    os << "; causal with a single query: every key is visible, so the plain kernel runs";
  os << ". Candidates:";
  for (const SoftmaxCandidate& c : t.candidates) {
    os << " " << design_info(c.design).name;
    if (c.feasible)
      os << " " << static_cast<int64_t>(c.cost.ns) << " ns;";
    else
      os << " infeasible (" << c.why_not << ");";
  }
  return os.str();
}

}  // namespace rtcnorm
