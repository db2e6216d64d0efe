#include "ops/norm/launch_geometry.h"

#include <algorithm>

namespace rtcnorm {

int64_t persistent_grid(int64_t row_blocks, int sm_count, int blocks_per_sm) {
  return std::max<int64_t>(1, std::min<int64_t>(row_blocks, int64_t(sm_count) * std::max(1, blocks_per_sm)));
}

SplitGrid split_grid(const NormBwdPlan& plan, int64_t rows, int sm_count) {
  SplitGrid g;
  const int64_t nvec = plan.key.hidden / plan.key.vec;
  g.col_tiles = ceil_div(nvec, plan.key.threads_per_row);
  // About 8 column CTAs an SM, and at least 32 rows a tile, so the partial
  // rows stay a few percent of the traffic; gridDim.y <= 65535.
  const int64_t want = ceil_div(int64_t(sm_count) * 8, g.col_tiles);
  const int64_t tiles = std::max<int64_t>(1, std::min(want, rows / 32));
  g.rows_per_tile = std::max(ceil_div(rows, tiles), ceil_div(rows, 65535));
  g.row_tiles = ceil_div(rows, g.rows_per_tile);
  return g;
}

}  // namespace rtcnorm
