// Measured tuning results: the (design, knobs) that timed fastest for one
// exact problem on one GPU model (rtcnorm.tune). They live in memory and in
// the disk cache beside the kernels, under the same rules: private folders,
// atomic writes, a checksum and the full key checked on every read, so an
// entry of another problem, GPU or version is never used.
#pragma once

#include <optional>
#include <string>

#include "jit/kernel_cache.h"
#include "ops/norm/plan/designs.h"

namespace rtcnorm {

// `extra`: the forward's mode, or the backward's gradient bits (dw 1, db 2, dh 4).
std::optional<TunedChoice> find_tuned(bool forward, const NormProblem& p, unsigned extra, const jit::DeviceInfo& dev);
// Keeps `c` for this process, and on disk when `persist` (false where the disk cache is off).
bool store_tuned(bool forward, const NormProblem& p, unsigned extra, const jit::DeviceInfo& dev, const TunedChoice& c,
                 bool persist);
// Forgets the results held in memory (disk entries stay; tests and rtcnorm.tune).
void forget_tuned();

}  // namespace rtcnorm
