// The softmax kernel templates (kernels/softmax.cuh) as the JIT names them,
// and the layout of their keys' flag word.
#pragma once

#include "jit/kernel_key.h"

namespace rtcnorm {

// Key flags: bit 0 cached (CACHED), bits 8..15 the launch-bounds min blocks
// (MINB), bits 16..23 the SoftmaxOpt bits (OPTS); every bit reaches the
// name expression, so equal keys name the same code.
constexpr unsigned kSoftmaxCachedFlag = 1u;
constexpr int kSoftmaxMinBlocksShift = 8, kSoftmaxOptsShift = 16;

extern const jit::KernelFamily kSoftmaxFwd, kSoftmaxBwd;
// flat_row (kernels/softmax/flat.cuh): the row length is the key's hidden,
// compiled in (it sizes the stage ring, and a kernel's shared memory is fixed).
extern const jit::KernelFamily kSoftmaxFwdFlat, kSoftmaxBwdFlat;

}  // namespace rtcnorm
