// The cost model (docs/designs.md): it ranks, it does not time. Constants are hardware figures of sm_80 - sm_100.
#include <algorithm>
#include <cmath>

#include "ops/norm/plan/designs.h"

namespace rtcnorm {
namespace {

constexpr double kLatencyUs = 1.2;        // a row block's load - reduce - store chain
constexpr double kBarrierUs = 0.15;       // a cross-warp reduction round of up to 8 warps
constexpr double kExchangeUs = 0.6;       // slices' statistics meeting (cluster or global memory)
constexpr double kLaunchUs = 1.5;         // a dependent kernel's launch and ramp
constexpr double kSmemPass = 0.10;        // a row's pass through shared memory, relative to its DRAM time
constexpr double kPartialOverlap = 0.25;  // the share of the shorter of streaming and the chain not hidden
constexpr double kBarrierBytes = 13.0;    // a barrier round costs a thread the time of loading this many bytes
constexpr double kL2TripUs = 0.3;         // gamma fetched after the reduction (not preloaded)
constexpr double kFwdElementUs = 0.02;    // a thread's work an element it holds: statistics and normalize
constexpr double kBwdElementUs = 0.05;    // the same for two row dots, dx and the dW / dB sums
constexpr double kRawTerms = 4.0 / 3.0;   // its factor where dx converts x and dy again (no kKeepTerms: 40 vs 30 ops)
constexpr double kChunkedElementUs = 0.04, kChunkedDuty = 0.5;  // a row read in chunks: its work, share loading
constexpr double kSplitEfficiency = 0.45;                       // the split column kernel walks rows down columns
constexpr double kHideWarpsPerUs = 240;   // warps an SM needs to stream at full rate, a us of work an element
constexpr double kPersistentLoop = 0.97;  // a persistent CTA's gap between one row block and the next
constexpr double kSmAlone = 2.5;          // an SM streaming alone: times its DRAM share (H200: ~70 GB/s against 27)
// Forward slices: the rate they keep waiting on each other's statistics every row block, a reduction; a deferred ring's
// fixed work a row's slice and reduction, in bytes it could have loaded meanwhile.
constexpr double kSliceWait = 0.80, kRingSliceBytes = 2304;
// Rows read in narrow accesses (narrow_access) reach this much of copy, plus the rest in proportion to an access's
// bytes: the forward's one stream, once a row reduction (issue-bound: LayerNorm's second pass compounds it), the
// backward's two (x and dy) with their loads a thread.
constexpr double kNarrowFwd = 0.8, kNarrowBwd = 0.35;
constexpr int64_t kSmemPerSm = 228 * 1024;

// DRAM bandwidth as `active` SMs (a wave's CTAs, one an SM) draw it: a grid of few CTAs is bound by its SMs.
double dram_bytes_per_us(const Gpu& gpu, double active) {
  const double per_sm = gpu.arch >= 100 ? 60e3 : gpu.arch >= 90 ? 27e3 : 19e3;
  return per_sm * std::min<double>(gpu.sm_count, kSmAlone * std::max(1.0, active));
}
struct Shape {
  double bytes = 0;              // DRAM traffic of the call
  double row_block_bytes = 0;    // bytes one row block has requested at once
  int launches = 1;              // kernels in the call
  double reductions = 1;         // row reductions a row block waits on (LayerNorm's two passes: 2)
  double after_reduction = 0;    // latency on a row block's path after its reduction
  double element_us = 0;         // a thread's work an element it holds, per row block
  double tail_us = 0;            // work after the last row block (column CTAs' sums)
  double design_efficiency = 1;  // a design's own ceiling below copy bandwidth
  bool walks_rows = false;       // a CTA loads row after row even in one wave
  bool smem_pass = false;        // the rows pass through shared memory
  bool loads_ahead = false;      // the next row block's loads fly while a CTA works on this one
  double duty = 0;               // a CTA's share of time loading (0: from its bytes and barriers)
  bool forward = false;          // exchange hidden only behind a next row block; kSliceWait, kRingSliceBytes apply
  int64_t row_blocks = 0;        // row blocks spread over the slots (0: the candidate's)
};

// Spreads the row blocks over the resident slots and prices the result.
void finish(const NormProblem& p, const Shape& s, const Gpu& gpu, Candidate& c) {
  const int slices = std::max(1, c.knobs.slices), threads = c.key.threads(), tpr = c.key.threads_per_row;
  // CTAs an SM holds by registers, shared memory and 2048 threads; launch bounds are a floor.
  const int regs_allow = blocks_leaving(threads, std::max(1, 2048 / std::max(1, threads)), c.regs);
  const int resident = std::max(fit_smem(regs_allow, static_cast<int64_t>(c.smem), kSmemPerSm), c.knobs.blocks_per_sm);
  const double slots = std::max(1.0, double(gpu.sm_count) * resident / slices);
  const double blocks = double(s.row_blocks > 0 ? s.row_blocks : c.row_blocks);
  const double busy = std::min<double>(blocks, slots);
  const double rounds = std::ceil(blocks / busy);
  c.grid = static_cast<int64_t>(busy) * slices;
  // A CTA loads between its barriers (`duty`), a ring further ahead; an SM idles while all its CTAs wait.
  const double ahead = c.knobs.ring_stages > 1 ? c.knobs.ring_stages - 1 : 1.0;
  const double ctas_per_sm = busy * slices / gpu.sm_count, cta_bytes = s.row_block_bytes / slices;
  c.in_flight = ctas_per_sm * cta_bytes * ahead;
  const double thread_bytes = cta_bytes / std::max(1, threads);
  const double warps = std::log2(1.0 + std::max(1, tpr) / 32.0) + s.reductions;
  const double duty = s.duty > 0 ? s.duty : thread_bytes / (thread_bytes + kBarrierBytes * warps);
  // In one wave every CTA requests its rows at launch; one whose next row blocks' loads fly as it works, for two.
  const bool one_shot = rounds <= 1 && !s.walks_rows, ring = s.forward && (c.key.flags & kDeferStats) != 0;
  const double requesters = std::max(1.0, ctas_per_sm) * (s.loads_ahead || ring ? 2.0 : 1.0);
  const double overlap = one_shot ? 1.0 : 1.0 - std::pow(1.0 - duty, requesters);
  const double balance = blocks / (rounds * busy), loop = c.knobs.persistent && rounds > 1 ? kPersistentLoop : 1.0;
  const double sm_warps = std::max(1.0, ctas_per_sm) * ceil_div(threads, 32), hide = kHideWarpsPerUs * s.element_us;
  c.efficiency = overlap * balance * s.design_efficiency * loop * std::min(1.0, sm_warps / std::max(1.0, hide));
  // The dependent chain: each slot's row blocks in turn, a thread's own work exposed once at the end.
  const double sync = tpr > 32 ? kBarrierUs * s.reductions * std::max(1.0, tpr / 256.0) : 0.0;
  // Deferred statistics hide the exchange: the forward's behind a next row block, the backward's behind dW / dB too.
  const bool hidden = (c.key.flags & kDeferStats) != 0 && (rounds > 1 || !s.forward);
  if (s.forward && slices > 1 && !hidden && rounds > 1) c.efficiency *= std::pow(kSliceWait, s.reductions);
  if (ring) c.efficiency /= 1.0 + kRingSliceBytes * s.reductions * slices / double(p.row_bytes());  // no residual
  const double exchange = slices > 1 && !hidden ? kExchangeUs : 0.0;
  const double wait = kLatencyUs + sync + exchange + s.after_reduction;
  // A thread's serial work: every chunk of its slice, idle slots included (in the backward, a share of the rate).
  const int64_t chunk = int64_t{tpr} * std::max(1, c.knobs.vecs_per_thread), slice = ceil_div(p.nvec(), slices);
  const int64_t chunks = ceil_div(slice, chunk);
  if (!s.forward && c.design != int(BwdDesign::kSplitRow)) c.efficiency *= double(slice) / double(chunks * chunk);
  const double serial = double(chunks * std::max(1, c.knobs.vecs_per_thread) * c.key.vec) * s.element_us;
  const double chain = wait * (1.0 + (rounds - 1.0) / ahead) + serial + s.tail_us;
  const double pass = s.smem_pass || (c.key.flags & (kStagedRow | kSmemRow)) != 0 ? 1.0 + kSmemPass : 1.0;
  const double stream = pass * s.bytes / (dram_bytes_per_us(gpu, busy * slices) * c.efficiency);  // overlaps the chain
  c.bytes = s.bytes;
  c.us = std::max(stream, chain) + kPartialOverlap * std::min(stream, chain) + kLaunchUs * (s.launches - 1);
}

// The rows' access width: flat_row reads 16-byte pieces whatever N is (through shared memory, a barrier before its
// stores, the next row block's copies in flight); other designs read vectors dividing N, priced below copy if narrow.
void price_access(const NormProblem& p, bool forward, bool flat, Shape& s) {
  const double narrow = forward ? std::pow(kNarrowFwd, s.reductions) : kNarrowBwd;
  if (flat) {
    s.smem_pass = true;
    s.loads_ahead = s.duty == 0;  // a row read in chunks (duty set): a ring of one stage, loaded then worked on
    s.after_reduction += kBarrierUs;
  } else if (narrow_access(p, forward)) {
    s.design_efficiency *= narrow + (1.0 - narrow) * p.vec() * p.esize() / 16.0;
  }
}

}  // namespace

void cost_fwd(const NormProblem& p, const Gpu& gpu, Candidate& c) {
  const double m = double(p.rows), row = double(p.row_bytes()), streams = p.residual ? 4.0 : 2.0;  // x, y (+ r, h)
  const auto d = static_cast<FwdDesign>(c.design);
  Shape s;
  s.bytes = m * row * streams + double(p.hidden) * p.wsize() * p.affine_tensors() + m * 8.0;
  if (d == FwdDesign::kReloadRow) s.bytes += m * row * (p.residual ? 2.0 : 1.0);
  const double rows = double(std::min<int64_t>(c.key.rows_per_cta, p.rows));  // a CTA's rows that exist
  const double loaded = d == FwdDesign::kReloadRow || d == FwdDesign::kSmemRow
                            ? rows * c.key.threads_per_row * c.knobs.vecs_per_thread * c.key.vec * p.esize()
                            : rows * row / std::max(1, c.knobs.slices);
  s.row_block_bytes = loaded * (p.residual ? 2.0 : 1.0) * std::max(1, c.knobs.slices);
  s.reductions = p.kind == kLayerNorm ? 2 : 1;
  if (p.affine_tensors() > 0 && (c.key.flags & (kPreloadAffine | kKeepGamma)) == 0) s.after_reduction = kL2TripUs;
  const bool chunked = d == FwdDesign::kFlatRow && int64_t{c.knobs.vecs_per_thread} * c.key.threads_per_row < p.nvec();
  s.element_us = chunked ? kChunkedElementUs : kFwdElementUs;
  s.duty = chunked ? kChunkedDuty : 0.0;
  s.forward = true;
  price_access(p, true, d == FwdDesign::kFlatRow, s);
  finish(p, s, gpu, c);
}
void cost_bwd(const NormProblem& p, const BwdWants& w, const Gpu& gpu, Candidate& c) {
  const double m = double(p.rows), row = double(p.row_bytes()), n = double(p.hidden), streams = w.dh ? 4.0 : 3.0;
  const auto d = static_cast<BwdDesign>(c.design);
  Shape s;
  s.bytes = m * row * streams + m * 8.0 + n * p.wsize() * (1 + w.accums());
  // Each persistent unit writes an fp32 partial row a gradient, read back (split_row: each row tile, priced below).
  const bool direct = (c.key.flags & (kDirectGrads | kColumnGrads)) != 0;
  const bool partials = d != BwdDesign::kSplitRow && !direct && w.accums() > 0;
  if (d == BwdDesign::kSplitRow) {
    // The coefficient kernel re-reads x and dy; row tiles (32+ rows) write partial rows.
    s.bytes += m * row * 2.0;
    const double tiles = std::max(
        1.0, std::min(std::ceil(m / 32.0), 8.0 * gpu.sm_count / std::ceil(double(p.nvec()) / c.key.threads_per_row)));
    s.bytes += tiles * n * 4.0 * w.accums() * 2.0;
    s.launches = 3;
    s.design_efficiency = kSplitEfficiency;
    s.walks_rows = true;
    s.row_block_bytes = double(c.key.threads_per_row) * c.knobs.vecs_per_thread * c.key.vec * p.esize() * 2.0;
    // Its chain: the coefficient kernel, then rows_in_flight rows a round trip.
    s.tail_us = kLatencyUs * (1.0 + std::ceil(std::ceil(m / tiles) / c.knobs.vecs_per_thread));
    s.row_blocks = std::max<int64_t>(1, ceil_div(p.nvec(), c.key.threads_per_row) * static_cast<int64_t>(tiles));
  } else {
    s.launches = partials ? 2 : 1;
    s.reductions = p.kind == kLayerNorm ? 2 : 1;
    if (d == BwdDesign::kColumnGrads) {
      // Column CTAs re-read x and dy from L2, a load latency per few rows.
      const double lanes = std::max(1.0, double(c.key.threads()) / c.col_vecs);
      s.bytes += m * row * 2.0 * 0.5;
      s.tail_us = kLatencyUs * std::ceil(m / lanes) / 4.0;
    }
    const double rows = double(std::min<int64_t>(c.key.rows_per_cta, p.rows));  // a CTA's rows that exist
    s.row_block_bytes = rows * row * (streams - 1.0);
    const bool raw = (d == BwdDesign::kRegisterRow || d == BwdDesign::kStagedRow) && (c.key.flags & kKeepTerms) == 0;
    s.element_us = kBwdElementUs * (raw ? kRawTerms : 1.0);
  }
  price_access(p, false, d == BwdDesign::kFlatRow, s);
  finish(p, s, gpu, c);
  if (partials) {
    const double partial = double(c.grid) / c.knobs.slices * n * 4.0 * w.accums() * 2.0;
    c.bytes += partial;
    c.us += partial / (dram_bytes_per_us(gpu, gpu.sm_count) * std::max(0.05, c.efficiency));
  }
}

}  // namespace rtcnorm
