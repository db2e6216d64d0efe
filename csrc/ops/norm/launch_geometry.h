// Launch geometry of norm plans: grids, column slices and the split
// backward's tiles, shared by the launcher, explain() and precompile.
#pragma once

#include <cstdint>

#include "ops/norm/plan/planner.h"

namespace rtcnorm {

// The split backward's column-kernel grid: col_tiles x row_tiles CTAs.
struct SplitGrid {
  int64_t col_tiles = 0;
  int64_t row_tiles = 0;
  int64_t rows_per_tile = 0;
};
SplitGrid split_grid(const NormBwdPlan& plan, int64_t rows, int sm_count);

// Persistent grid: every SM full at the kernel's occupancy, never more CTAs
// than row blocks.
int64_t persistent_grid(int64_t row_blocks, int sm_count, int blocks_per_sm);

// CTAs that split each row's columns (kClusterBits / kCluster16).
inline int column_slices(unsigned flags) {
  return (flags & kCluster16) != 0 ? 16 : 1 << ((flags & kClusterBits) >> kClusterShift);
}
// CTAs of a launch's grid group (kGridExchange), 1 for any other plan.
inline int grid_group_ctas(const jit::KernelKey& k) {
  return (k.flags & kGridExchange) != 0 ? column_slices(k.flags) : 1;
}
// CTAs a persistent backward grid counts as one unit (one partial row).
inline int grid_unit_ctas(const jit::KernelKey& k) {
  return (k.flags & kGridExchange) != 0 ? column_slices(k.flags) : k.cluster;
}

}  // namespace rtcnorm
