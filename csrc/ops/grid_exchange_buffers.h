// Exchange words of grid-group launches (kGridExchange; the device side is
// kernels/common/grid_exchange.cuh): one buffer per (device, stream), kept
// from launch to launch, whose tags keep counting up instead of being zeroed
// before every launch (a fill kernel and its launch, 1-2 us of GPU time and
// 10+ us of host time a call).
//
// Invariants:
// - A launch polls for and publishes tags base + 1 .. base + row_blocks only
//   (its calls are row block indices of one group, fewer than row_blocks).
//   The next lease on the same buffer starts at base + row_blocks: no two
//   launches on a buffer share a tag, so a word an earlier launch left never
//   matches a tag a later launch polls for, and stream order makes that
//   earlier launch finish first.
// - A buffer is used on the stream it was allocated on only, so the caching
//   allocator recycles a dropped one behind every launch that used it.
// - When a launch needs more words than the buffer holds, or its tags would
//   pass 2^32 - 1, the entry takes a fresh zeroed buffer at base 0; the old
//   one is never leased again (a lease still holding it keeps it alive until
//   its launch is enqueued).
// - A stream capturing a CUDA graph gets a zeroed buffer of its own at base 0
//   (the zeroing is captured with the launch): a replay repeats the same
//   parameters, so tags baked into a graph cannot keep counting.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "jit/cuda_driver.h"

namespace rtcnorm {

struct GridExchangeLease {
  unsigned* words = nullptr;
  unsigned tag_base = 0;
  at::Tensor hold;  // keeps the buffer alive until the launch is enqueued
};

// A buffer of at least `words32` 32-bit words on `like`'s device and the
// current stream (`stream`, its driver handle), with a tag range for a launch
// of `row_blocks` row blocks.
GridExchangeLease lease_grid_exchange(int64_t words32, int64_t row_blocks, const at::Tensor& like,
                                      jit::CUstream stream);

// Tests only: the next lease of `device`'s buffer for `stream` starts at tag
// base `next` or later (a base only ever moves forward).
void advance_grid_exchange_tags(int device, jit::CUstream stream, uint32_t next);

// The tag base the next lease on that buffer would start from (0 with none).
uint32_t next_grid_exchange_tag(int device, jit::CUstream stream);

}  // namespace rtcnorm
