// The softmax design catalogue: each design is one kernel structure with a
// feasibility test, the knobs it declares (the ones an override may set)
// and the resources it takes. docs/softmax_designs.md says when each wins.
#pragma once

#include <cstdint>

#include "jit/kernel_key.h"
#include "ops/softmax/plan/problem.h"

namespace rtcnorm {

enum class SoftmaxDesign : uint8_t {
  kClusterRows,  // few long rows, each split over a thread-block cluster (sm_90+)
  kFewRows,      // at most one row per SM: a CTA per row, threads spread wide
  kMaskReuse,    // register rows; a broadcast mask row read once per run of rows
  kRows,         // register rows packed into CTAs, one CTA per row block
  kStreamed,     // rows too long for registers: chunks on a persistent grid
  kFlatRow,      // rows with no 16-byte access: staged through shared memory in 16-byte pieces
};
constexpr int kNumSoftmaxDesigns = 6;

// The knobs an override may set. Each design declares a subset.
enum class SoftmaxKnob : uint8_t {
  kCluster,      // CTAs per cluster: 2, 4 or 8
  kReuseRun,     // rows of one mask row per run: 1 or more
  kCtasPerSm,    // persistent grid cap per SM: 1 to 32
  kHeadsInner,   // rows sharing a broadcast mask row back to back: 0 or 1
  kL1Alloc,      // inputs loaded through L1: 0 or 1
  kStreamStore,  // outputs stored evict-first: 0 or 1
};
constexpr int kNumSoftmaxKnobs = 6;
constexpr unsigned knob_bit(SoftmaxKnob k) { return 1u << static_cast<unsigned>(k); }

// A design's shape for one problem: every field the kernel key, the grid or
// the launch reads.
struct SoftmaxKnobs {
  int vec = 1;              // elements per vector access
  int threads_per_row = 1;  // a power of two
  int vecs_per_thread = 1;  // per thread and tensor; a power of two for cached rows
  int rows_per_cta = 1;
  int cluster = 1;
  int min_blocks = 1;         // launch bounds: CTAs per SM ptxas plans registers for
  int64_t reuse_run = 0;      // kMaskReuse: rows per run of one mask row
  int ctas_per_sm = 0;        // kStreamed: persistent grid cap (0: occupancy)
  bool keep_exp = false;      // cached forward rows keep exp2(z - m) in registers
  bool heads_inner = false;   // rows sharing a mask row taken consecutively
  bool l1_alloc = false;      // x (y and dy) loaded through L1
  bool stream_store = false;  // y (dx) stored evict-first
  int64_t smem_bytes = 0;     // kFlatRow: the stage ring, dynamic shared memory (fixed per kernel)
};

// What a design takes from an SM. Only kFlatRow uses dynamic shared memory
// (its stage ring); every kernel's static reduction scratch is a few hundred
// bytes.
struct SoftmaxResources {
  int threads = 0;          // per CTA
  int regs_per_thread = 0;  // the launch-bounds ceiling: 65536 / (min_blocks x threads), at most 255
  int64_t smem_bytes = 0;   // dynamic shared memory per CTA
  int cluster = 1;          // CTAs per cluster
};

// An override as the planner receives it: a knob value per set bit.
struct SoftmaxKnobOverrides {
  unsigned set = 0;
  bool forced = false;  // the design is forced: its policy rules (not its limits) yield
  int64_t value[kNumSoftmaxKnobs] = {};
  bool has(SoftmaxKnob k) const { return (set & knob_bit(k)) != 0; }
  int64_t get(SoftmaxKnob k) const { return value[static_cast<int>(k)]; }
};

// One catalogue entry. shape() fills the knobs for a problem and returns
// false where the design cannot run it (why_not then says why, for explain).
struct SoftmaxDesignInfo {
  SoftmaxDesign design;
  const char* name;
  unsigned knobs;  // declared knob bits
  bool (*shape)(const SoftmaxProblem&, const SoftmaxKnobOverrides&, SoftmaxKnobs*, const char** why_not);
};

const SoftmaxDesignInfo& design_info(SoftmaxDesign d);
const char* knob_name(SoftmaxKnob k);
// Empty when `value` is valid for `k`, else the accepted values.
const char* knob_range_error(SoftmaxKnob k, int64_t value);

// Elements per vector access for the problem (at most 16 bytes).
int softmax_vec(const SoftmaxProblem& p);
// The row stays in registers (kFlatRow keeps it in shared memory).
bool cached_design(SoftmaxDesign d);
// A persistent grid: CTAs stride over row blocks.
bool persistent_design(SoftmaxDesign d);
SoftmaxResources design_resources(SoftmaxDesign d, const SoftmaxKnobs& k);
// Row blocks the grid covers (a CTA, or a cluster, each) before any persistent cap.
int64_t design_row_blocks(SoftmaxDesign d, const SoftmaxProblem& p, const SoftmaxKnobs& k);
jit::KernelKey design_key(SoftmaxDesign d, const SoftmaxProblem& p, const SoftmaxKnobs& k);

}  // namespace rtcnorm
