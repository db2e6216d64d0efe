// Launch planning for the norm kernels (RMSNorm and LayerNorm alike): which
// instantiation runs, with which grid, and why. Needs no GPU: the persistent
// grid's occupancy factor is applied at launch from the loaded kernel.
#pragma once

#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <string>

#include "jit/kernel_key.h"
#include "kernels/common/params.cuh"
#include "ops/norm_tuning.h"
#include "ops/plan_util.h"

namespace rtcnorm {

enum class NormMode : int { kAuto = 0, kStaticPersistent, kMultiWaveReload, kMultiWaveCached };

// Parses the user's mode string; throws naming `op` and listing valid values.
NormMode parse_mode(const std::optional<c10::string_view>& mode, const char* op);
const char* mode_name(NormMode m);

struct NormProblem {
  NormKind kind = kRmsNorm;
  jit::DType dtype = jit::DType::kFloat32;
  jit::DType wdtype = jit::DType::kFloat32;
  int64_t rows = 0;    // M
  int64_t hidden = 0;  // N
  int max_vec = 1;     // widest access every pointer and stride allows (elements)
  bool has_weight = false;
  bool has_bias = false;
  bool zero_centered = false;
  bool residual = false;
  // Every row map the kernel reads (x; in the forward also the residual)
  // has one group: row r starts at r * stride (RowMap::inner_rows >= rows).
  // False for leading dims that need two strides (e.g. (B, S, H, D) heads
  // sliced out of a fused projection).
  bool single_stride = true;
};

// The most rows for which a wide (non-narrow) forward takes the few-rows,
// latency-bound layout of 2 vectors a thread (the rule is in norm_plan.cpp).
int64_t few_rows_max(const NormProblem& p, int sm_count);

struct NormFwdPlan {
  jit::KernelKey key;
  NormMode mode = NormMode::kAuto;  // resolved, never kAuto
  bool persistent = false;
  bool cached = false;  // x is read once: kept in registers, or in shared memory (smem > 0)
  int64_t row_blocks = 0;
  size_t smem = 0;  // dynamic shared memory: the CTA's rows when cached there
  // A multi-wave grid whose CTAs prefetch (kPrefetchNext) the row block a
  // device-full of CTAs ahead (NormFwdParams::prefetch_ahead, set at launch).
  bool prefetch_ahead = false;
  std::string reason;
};

struct NormBwdPlan {
  jit::KernelKey key;   // the persistent kernel, or the split design's column kernel
  bool cached = false;  // x and dy read once: kept in registers, or staged in shared memory (kStagedRow)
  // Rows too long for registers: a per-row coefficient kernel (coef_key),
  // then a column-split kernel over row tiles (key); see norm_bwd_split.cuh.
  bool split = false;
  jit::KernelKey coef_key;
  int64_t row_blocks = 0;
  size_t smem = 0;  // dynamic shared memory: the staging ring, or the CTA's partial-row combine (the larger)
  // The kernels after the first (the split design's column kernel, the column
  // reduce) are launched programmatically (sm_90+, kernels/common/grid_dep.cuh).
  bool programmatic = false;
  // kColumnGrads: column CTAs after the row_blocks row CTAs, each owning
  // col_vecs vectors of columns (common/norm_bwd_columns.cuh).
  int col_vecs = 0;
  int64_t col_ctas = 0;
  // One row block on a CTA sized to its rows (RMSNorm's few 16-bit rows):
  // that CTA writes the gradients itself, without column CTAs.
  bool lone_sized_cta = false;
  std::string reason;
};

// `explain` fills the plans' reason text; launches leave it off (no strings
// are built on the hot path).
NormFwdPlan plan_norm_fwd(const NormProblem& p, NormMode requested, int sm_count, int arch, bool explain = false);
NormBwdPlan plan_norm_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int sm_count, int arch,
                          bool explain = false);
// The dW / dB column reducer (column_reduce.cuh): each thread owns
// column_reduce_width(cols) columns, 4 for rows of 16384+ (a multiple of 4),
// where a grid of 4-column threads still has a CTA an SM, else 1.
constexpr int64_t kColumnReduceWideCols = 16384;
inline int column_reduce_width(int64_t cols) { return cols % 4 == 0 && cols >= kColumnReduceWideCols ? 4 : 1; }
jit::KernelKey column_reduce_key(jit::DType out, int64_t cols, int arch);

// The split backward's column-kernel grid: col_tiles x row_tiles CTAs, row
// tiles of rows_per_tile rows; row_tiles is also the partial rows' count.
struct SplitGrid {
  int64_t col_tiles = 0;
  int64_t row_tiles = 0;
  int64_t rows_per_tile = 0;
};
SplitGrid split_grid(const NormBwdPlan& plan, int64_t rows, int sm_count);

// Persistent grid: every SM full at the kernel's occupancy, never more CTAs
// than row blocks (each CTA must own at least one row block).
int64_t persistent_grid(int64_t row_blocks, int sm_count, int blocks_per_sm);

// The most CTAs (clusters) the backward's persistent grid may have: fewer
// than resident where rows are few, so that fewer fp32 partial rows are
// written and reduced (the rule is in norm_plan.cpp). `why`, when given,
// receives the reason text where the cap is below the row blocks.
int64_t bwd_max_units(const NormBwdPlan& plan, int sm_count, std::string* why = nullptr);

// CTAs that split each row's columns (kClusterBits / kCluster16): a
// thread-block cluster, or with kGridExchange a group of a cooperative launch.
inline int column_slices(unsigned flags) {
  return (flags & kCluster16) != 0 ? 16 : 1 << ((flags & kClusterBits) >> kClusterShift);
}
// CTAs of a launch's grid group (kGridExchange: a row's slices, forward or
// backward), 1 for any other plan: the norm_grid argument.
inline int grid_group_ctas(const jit::KernelKey& k) {
  return (k.flags & kGridExchange) != 0 ? column_slices(k.flags) : 1;
}
// CTAs a persistent backward grid counts as one unit (one partial row):
// the grid group's, else the hardware cluster's.
inline int grid_unit_ctas(const jit::KernelKey& k) {
  return (k.flags & kGridExchange) != 0 ? column_slices(k.flags) : k.cluster;
}

// Row blocks as the backward's persistent grid counts them (norm_grid): a
// row cluster's CTAs each walk row blocks, so its clusters count shares of
// k.cluster row blocks.
int64_t bwd_grid_row_blocks(const NormBwdPlan& plan);

// Kernel families, for callers that enumerate keys (precompile).
extern const jit::KernelFamily kRmsNormFwd, kRmsNormBwd, kLayerNormFwd, kLayerNormBwd, kColumnReduce;
extern const jit::KernelFamily kRmsNormBwdCoef, kRmsNormBwdCols, kLayerNormBwdCoef, kLayerNormBwdCols;

}  // namespace rtcnorm
