// Overrides of the norm planner's rules, for benchmark sweeps through
// rtcnorm._tuning (the rules themselves were fitted to H100 and H200 sweeps, see
// docs/history.md). Overrides are process-wide and are
// not synchronised with concurrent launches: set them before launching.
#pragma once

#include <cstdint>

namespace rtcnorm {

// Every field is an override: 0 means "use the planner's rule" (norm_plan.cpp).
struct NormTuning {
  // Forward: vectors per thread a row is split into, CTA size, and the bytes
  // of raw row a thread may keep in registers.
  int fwd_vecs_target = 0;
  int fwd_cta_threads = 0;
  int fwd_cache_bytes = 0;
  int fwd_min_blocks = 0;
  // Rows of at least this many bytes are kept in shared memory rather than
  // registers (when one fits a CTA); vectors per thread in a chunk there.
  int fwd_smem_row_bytes = 0;
  int fwd_smem_vecs = 0;
  // gamma (+beta) values a persistent CTA's thread may keep in registers.
  int keep_gamma_floats = 0;
  // LayerNorm forward, rows cached in registers by one CTA: 1 = one pass
  // merging (count, mean, M2) triples, 2 = two passes (mean, then squared
  // deviations) for every such row, where the rule keeps the merge for rows
  // of more than two warps in grids of many row blocks per SM.
  int fwd_two_pass = 0;
  // Forward loads of x (and the residual): 1 = around L1 (L1::no_allocate)
  // always, 2 = through L1 always; the rule picks by input size.
  int fwd_l1_alloc = 0;
  // Backward: elements of a row a thread caches (x, dy and fp32 dW/dB
  // accumulators share the registers), CTA size, and launch-bounds CTAs/SM.
  int bwd_cache_elems = 0;
  int bwd_cta_threads = 0;
  int bwd_min_blocks = 0;
  // Rows too long for registers: 1 = re-read each row with the persistent
  // kernel, 2 = the split design (the rule); rows in flight per thread there.
  int bwd_split = 0;
  int bwd_split_rows = 0;
  // Rows at or below this width are "narrow" for the mode heuristic.
  int narrow_row = 0;
  // Memory hints as 1 + bits (kStreamStore, kPrefetchNext >> 10): 1 means
  // none, 4 both.
  int fwd_hints = 0;
  int bwd_hints = 0;
  // Forward: 1 = no L1 prefetch of gamma/beta beside the row's loads, 2 = always,
  // 3 = register-cached rows load them into registers beside the row instead.
  int fwd_affine_prefetch = 0;
  // CTAs of a thread-block cluster that split each row (sm_90+): 1 = never,
  // 2 / 4 / 8 (16 on sm_90 only) = that many wherever the row divides and
  // each slice caches.
  int fwd_cluster = 0;
  int bwd_cluster = 0;
  // Backward cached rows: 1 = x and dy in registers, 2 = staged through a
  // shared-memory ring by cp.async wherever it fits (kStagedRow).
  int bwd_stage = 0;
  // Stages of that ring, 2-5 (the rule: 2).
  int bwd_ring_stages = 0;
  // Cached rows' terms kept as floats between the two passes (kKeepTerms):
  // 1 = never, 2 = always; the rule: rows of at most 16 elements a thread,
  // not narrow, whose terms fit the launch bounds' registers.
  int bwd_keep_terms = 0;
  // Backward persistent grid: the fewest row blocks each CTA (cluster) owns,
  // so that its fp32 partial row stays small beside the rows it reads.
  int bwd_min_row_blocks = 0;
  // Backward's second and third kernels: 1 = plain launches, 2 = launched
  // programmatically (the rule on sm_90+; no effect before sm_90).
  int bwd_programmatic = 0;
  // One row block: 1 = partial row and column reduce as for any grid, 2 = the
  // CTA writes the gradients itself (kDirectGrads, the rule). Grids of more
  // than one row block always take the partial rows.
  int bwd_direct_grads = 0;
  // Kept terms in registers (kKeepTerms, not staged): 1 = gamma loaded before
  // the first row, 2 = beside it (kGammaBesideRow) on any grid; the rule: where
  // each CTA (cluster) has a single row block.
  int bwd_gamma_beside_row = 0;
  // Backward, register-cached or staged rows not split into column slices
  // (sm_90+): CTAs of a row cluster, whose column sums meet in distributed
  // shared memory so that each cluster writes one partial row (the grid's
  // only cluster: the gradients). 1 = never, 2 / 4 / 8 / 16 = that many
  // (16 on sm_90 only) wherever the rows have more than one row block.
  int bwd_row_cluster = 0;
  // Backward, 16-bit column-cluster rows (sm_90+): 1 = the cluster's row sums
  // meet before each row block's dx (slices of 4096), 2 = they are collected
  // one row block later (kDeferStats, a ring of 3 stages; slices of 8192, or
  // with two gradient sets 16384, and 2048 on 256-thread CTAs for rows of at
  // most 16384) wherever that ring fits; the rule: one gradient set, or two
  // on rows past 65536 or of at most 16384 elements.
  int bwd_defer_stats = 0;
  // Backward, register rows of lone CTAs on grids of at most one row block
  // an SM: 1 = the row CTAs sum dW / dB (partial rows and the column reduce,
  // or direct gradients), 2 = column CTAs beside them write dW / dB
  // (kColumnGrads) wherever eligible; the rule picks by rows per row lane.
  int bwd_column_grads = 0;
  // Backward, one-wave column grids (norm_plan.cpp, one_wave_column_plan):
  // 1 = never, 2 = wherever every row and column CTA fits at once, whatever
  // the rows a column lane; the rule: at most 11 rows a lane, float32 scalar
  // rows of at most 24 a thread unless the plan replaced is split, and none
  // of the backward's row-layout overrides above set.
  int bwd_one_wave_columns = 0;
  // Backward, deferred column slices (kDeferStats, sm_90+): 1 = the slices
  // of a row are a thread-block cluster, 2 = consecutive CTAs of a
  // cooperative launch whose row sums meet through global memory
  // (kGridExchange) wherever eligible; the rule picks by slices a row.
  int bwd_grid_exchange = 0;
  // Forward, rows split into column slices (sm_90+): 1 = a thread-block
  // cluster, 2 = consecutive CTAs of a persistent cooperative launch whose
  // statistics meet through global memory (kGridExchange), wherever the
  // mode allows a persistent grid.
  int fwd_grid_exchange = 0;
  // Forward, multi-wave grids of one register-cached LayerNorm row a CTA and
  // one CTA an SM: 1 = no L2 prefetch a device-full of CTAs ahead, 2 = the
  // prefetch for float32 rows too (the rule: 16-bit rows).
  int fwd_prefetch_ahead = 0;
  // Backward, 16-bit rows of 8193-16384 elements: 1 = one CTA stages the row
  // (or, with dW and dB, the 256-thread pair plan), 2 = column slices of at
  // most 8192 wherever eligible (sm_90+, no residual gradient); the rule:
  // sm_90, grids of 128+ rows where the slices fill as many threads (2048+
  // rows with dW and dB, where the pair plan would defer).
  int bwd_staged_slices = 0;
  // Forward, register-cached column slices (sm_90+, no residual): 1 = the
  // slices meet before each row block's y, 2 = the rows are staged through a
  // shared-memory ring and the slices' statistics collected one row block
  // later (kDeferStats, a persistent grid); stages of that ring, 3-5.
  int fwd_defer_stats = 0;
  int fwd_ring_stages = 0;
  // Forward, narrow 16-bit rows at two vectors a thread (RMSNorm, and
  // LayerNorm with gamma and/or beta): 1 = the plans before the dense narrow
  // rule (norm_plan.cpp, dense_narrow_threads), 2 = the rule wherever its
  // static conditions hold, whatever the grid.
  int fwd_dense_narrow = 0;
  // Forward and backward launch bounds: 1 = the bounds before the register
  // headroom rules (norm_plan.cpp, blocks_leaving / regs_at), for A/B runs.
  int reg_headroom = 0;
  // Rows of one stride (NormProblem::single_stride, kSingleStride): 1 = the
  // general row map always, 2 = the single-stride one on every such plan;
  // the rule: grids of at most one register-row CTA an SM, none of them in
  // a cluster (or, backward, staging its rows).
  int fwd_single_stride = 0;
  int bwd_single_stride = 0;
  // 16-bit LayerNorm rows of 64-128 KB in registers at 64 elements a thread,
  // one CTA an SM (wide_ln_register_row): 1 = never (the shared-memory rows
  // and cluster slices before it), 2 = on every such row, whatever the grid
  // or dtype.
  int fwd_wide_ln_regs = 0;
};

NormTuning& norm_tuning();

}  // namespace rtcnorm
