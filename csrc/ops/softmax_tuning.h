// Overrides of the softmax planner's rules, for benchmark sweeps through
// rtcnorm._tuning.softmax_override. Process-wide and not synchronised with
// concurrent launches: set them before launching. Every value changes the
// kernel key or the grid, never the result beyond fp32 rounding.
#pragma once

#include <cstdint>
#include <string>

namespace rtcnorm {

// Every field is an override: 0 means "use the planner's rule"
// (softmax_plan.cpp). Switches take 1 = off, 2 = on.
struct SoftmaxTuning {
  // Raw row data a thread keeps, in 32-bit registers: the target a row is
  // split for, and how far a cached row may grow before adding threads.
  int fwd_target_regs = 0;
  int fwd_max_regs = 0;
  int bwd_target_regs = 0;
  int bwd_max_regs = 0;
  // CTA size that rows shorter than a CTA share (a power of two).
  int fwd_cta_threads = 0;
  int bwd_cta_threads = 0;
  // Resident threads per SM the launch bounds reserve registers for:
  // min blocks = max(1, value / CTA threads), so at most 65536 / value
  // registers per thread (rule: 1024, i.e. 64 registers).
  int fwd_resident_threads = 0;
  int bwd_resident_threads = 0;
  // Cached rows on a persistent grid-stride grid instead of one CTA per row
  // block, and L2 prefetch of the next row block on that grid.
  int fwd_persistent = 0;
  int bwd_persistent = 0;
  int fwd_prefetch = 0;
  int bwd_prefetch = 0;
  // Evict-first (.cs) stores of the output (y, dx).
  int fwd_stream_store = 0;
  int bwd_stream_store = 0;
  // Loads of x (forward) or y and dy (backward): 1 = around L1
  // (L1::no_allocate), 2 = through L1 (the rule).
  int fwd_l1_alloc = 0;
  int bwd_l1_alloc = 0;
  // Cached forward rows of at most this many elements per thread keep
  // exp2(z - m) in registers for the write pass (rule: 16).
  int keep_exp_elems = 0;
  // Masked forward: take the rows that share a broadcast mask row
  // consecutively (kSoftmaxHeadsInner).
  int mask_order = 0;
  // Masked forward, broadcast mask, cached rows: a row group reads its mask
  // row once for a run of the rows sharing it (kSoftmaxMaskReuse; rule: on
  // from sk = 2048 where the grid stays large), and the rows per run (rule:
  // 4; an override turns reuse on).
  int mask_reuse = 0;
  int reuse_run = 0;
  // Cap on CTAs per SM of a persistent grid (rule: occupancy for cached
  // rows, kStreamCtasPerSm for streamed ones).
  int ctas_per_sm = 0;
  // Most threads a register-cached row may use (a power of two; rule: 1024
  // or RTCNORM_SOFTMAX_CACHE_THREADS).
  int cache_threads = 0;
  // Streamed rows: registers per thread and tensor of one chunk, CTA size.
  int stream_regs = 0;
  int stream_threads = 0;
  // Few-row grids (rule: at most one row per SM): a CTA per row, threads
  // spread at the register target (see softmax_plan.cpp).
  int few_rows = 0;
  // CTAs of a thread-block cluster that split each row of a few-row grid
  // (sm_90+, not persistent): 1 = never, 2 / 4 / 8 = that many (rule: at
  // most an eighth as many rows as SMs, rows of 4096 vectors or more).
  int fwd_cluster = 0;
  int bwd_cluster = 0;
};

SoftmaxTuning& softmax_tuning();

// The table rtcnorm._tuning reads and writes.
struct SoftmaxTunable {
  const char* name;
  int SoftmaxTuning::*field;
  int lo, hi;  // accepted values besides 0
  bool pow2;
};
extern const SoftmaxTunable kSoftmaxTunables[];
extern const int kNumSoftmaxTunables;

// Empty when `value` is accepted for `t`, else the message naming the field.
std::string check_softmax_tunable(const SoftmaxTunable& t, int64_t value);

}  // namespace rtcnorm
