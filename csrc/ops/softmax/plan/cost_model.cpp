// The softmax cost model: a time estimate per (design, knobs) from bytes
// moved, waves, the SMs a grid occupies and the serial work of a thread.
// It ranks candidates; it does not predict absolute times. The constants
// are H100-class round numbers; only their ratios matter to the ranking.
#include <algorithm>
#include <cmath>

#include "ops/plan_util.h"
#include "ops/softmax/plan/planner.h"

namespace rtcnorm {
namespace {

constexpr double kHbmBytesPerNs = 3000;  // DRAM bandwidth of the whole device
constexpr double kSmBytesPerNs = 100;    // what one SM can draw: 64 bytes a clock from L2
constexpr double kL2BytesPerNs = 8000;   // L2 re-reads
constexpr double kRoundTripNs = 800;     // a dependent DRAM round trip under load
constexpr double kVecNs = 60;            // a thread's exp, FMAs and shuffles for one vector
constexpr double kIssueNs = 0.15;        // an SM issues about a vector load a clock per scheduler
constexpr double kClusterNs = 400;       // per wave: cluster launch, barriers and the DSMEM exchange
constexpr double kLaunchNs = 2000;       // one kernel launch
constexpr double kExpsPerNs = 28;        // ex2 an SM's special-function units retire: 16 a clock
constexpr int kNominalSms = 132;         // SMs assumed where the problem does not say

}  // namespace

SoftmaxCost softmax_cost(SoftmaxDesign d, const SoftmaxProblem& p, const SoftmaxKnobs& k) {
  SoftmaxCost c;
  const int sms = p.arch.sm_count > 0 ? p.arch.sm_count : kNominalSms;
  const int64_t elems = p.rows * p.cols;
  const int esize = jit::element_size(p.dtype);
  const int tensors = p.backward ? 2 : 1;  // inputs: x; or y and dy
  c.dram_bytes = elems * esize * (tensors + 1);

  // The mask (masked forward): each row reads its mask row; rows sharing one
  // taken back to back read it from DRAM once, and a reuse run reads it once.
  if (!p.backward && p.variant == SoftmaxVariant::kMasked) {
    const int64_t reads = d == SoftmaxDesign::kMaskReuse ? elems / std::max<int64_t>(1, k.reuse_run) : elems;
    const int64_t distinct = elems / std::max<int64_t>(1, p.mask_bcast);
    const int64_t from_dram = k.heads_inner ? distinct : reads;
    c.dram_bytes += from_dram;
    c.l2_bytes += std::max<int64_t>(0, reads - from_dram);
  }

  const int threads = k.threads_per_row * k.rows_per_cta;
  const int64_t vecs = p.cols / k.vec;
  if (cached_design(d)) {
    c.ctas = design_row_blocks(d, p, k) * k.cluster;
    const int64_t resident = int64_t(sms) * std::max(1, k.min_blocks);
    c.waves = static_cast<double>(c.ctas) / static_cast<double>(resident);
    c.round_trips = static_cast<int>(std::ceil(c.waves));
    c.serial_vecs = k.vecs_per_thread * c.round_trips;
    // A CTA alone on its SM for wave after wave (launch bounds of one) runs
    // its loads, exponentials and stores in series: no other CTA's traffic
    // hides its exponentials, two an element unless it keeps them.
    if (!p.backward && k.min_blocks == 1 && c.waves > 1)
      c.lone_exps = int64_t(c.round_trips) * threads * k.vecs_per_thread * k.vec * (k.keep_exp ? 1 : 2);
  } else if (d == SoftmaxDesign::kFlatRow) {
    // flat_row's persistent CTAs take their row blocks one after another,
    // the ring hiding each block's copies behind the work on the one before:
    // a round trip and a thread's vectors per block. Its global accesses are
    // 16-byte pieces whatever the row's width (the issue term below); the
    // passes over the stage run from shared memory and go uncharged. So it
    // wins where the others' accesses are narrower than 16 bytes, the only
    // problems it is feasible for.
    const int64_t blocks = design_row_blocks(d, p, k);
    const int per_sm = k.ctas_per_sm > 0 ? k.ctas_per_sm : std::max(1, k.min_blocks);
    c.ctas = std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t(sms) * per_sm));
    c.waves = 1;
    const int64_t per_cta = ceil_div(blocks, c.ctas);
    c.round_trips = static_cast<int>(std::min<int64_t>(1 << 30, per_cta));
    c.serial_vecs = static_cast<int>(std::min<int64_t>(1 << 30, per_cta * k.vecs_per_thread));
  } else {
    // A persistent grid: each CTA loops over its rows, two passes of chunks each.
    const int per_sm = k.ctas_per_sm > 0 ? std::min(k.ctas_per_sm, std::max(1, k.min_blocks)) : k.min_blocks;
    c.ctas = std::max<int64_t>(1, std::min<int64_t>(p.rows, int64_t(sms) * std::max(1, per_sm)));
    c.waves = 1;
    const int64_t chunks = ceil_div(vecs, int64_t(threads) * k.vecs_per_thread);
    const int64_t rows_per_cta = ceil_div(p.rows, c.ctas);
    c.round_trips = static_cast<int>(std::min<int64_t>(1 << 30, 2 * chunks * rows_per_cta));
    const int64_t useful = std::min<int64_t>(k.vecs_per_thread, ceil_div(vecs, threads));
    c.serial_vecs = static_cast<int>(std::min<int64_t>(1 << 30, c.round_trips * useful));
    c.l2_bytes += elems * esize * tensors;  // the normalize (dx) pass re-reads the inputs
  }
  c.active_sms = static_cast<int>(std::min<int64_t>(sms, c.ctas));
  // Vector loads each occupied SM issues: every input vector once, twice when
  // streamed; flat_row's are 16-byte pieces.
  c.sm_vecs = p.rows * vecs * tensors * (cached_design(d) ? 1 : 2) / c.active_sms;
  if (d == SoftmaxDesign::kFlatRow) c.sm_vecs = ceil_div(elems * esize, 16) * tensors / c.active_sms;
  const double bw = std::min(kHbmBytesPerNs, c.active_sms * kSmBytesPerNs);
  c.ns = kLaunchNs + c.round_trips * kRoundTripNs + c.serial_vecs * kVecNs + static_cast<double>(c.dram_bytes) / bw +
         static_cast<double>(c.l2_bytes) / kL2BytesPerNs + static_cast<double>(c.sm_vecs) * kIssueNs +
         (k.cluster > 1 ? c.round_trips * kClusterNs : 0) + static_cast<double>(c.lone_exps) / kExpsPerNs;
  return c;
}

}  // namespace rtcnorm
