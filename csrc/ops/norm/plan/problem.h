// What decides a norm kernel: the problem and the GPU's limits. Plain data, no GPU needed.
#pragma once

#include <cstdint>

#include "jit/dtype.h"
#include "kernels/common/params.cuh"
#include "ops/plan_util.h"

namespace rtcnorm {

// The forward's user-facing modes (their names: ops/norm/modes.h): kAuto, or designs of one kind of grid.
enum class NormMode : int { kAuto = 0, kStaticPersistent, kMultiWaveReload, kMultiWaveCached };
struct NormProblem {
  NormKind kind = kRmsNorm;
  jit::DType dtype = jit::DType::kFloat32, wdtype = jit::DType::kFloat32;
  int64_t rows = 0, hidden = 0;  // M, N
  int max_vec = 1;               // widest access every pointer and stride allows (elements)
  bool has_weight = false, has_bias = false, zero_centered = false, residual = false;
  bool single_stride = true;  // every row map read (x; forward: also the residual) starts row r at r * stride
  bool flat = false;          // rows contiguous from a 16-byte aligned base: one flat array (flat_row)
  unsigned quant = 0;         // forward: kQuantBits | kBlockedScales of the flag word (0: y in the input dtype)
  int esize() const { return jit::element_size(dtype); }
  int wsize() const { return jit::element_size(wdtype); }
  int affine_tensors() const { return int(has_weight) + int(has_bias); }
  int vec() const { return widest_vec(dtype, max_vec, hidden); }  // one access's elements: at most 16 bytes, dividing N
  int64_t nvec() const { return hidden / vec(); }
  int64_t row_bytes() const { return hidden * esize(); }
  unsigned recipe() const { return (quant & kQuantBits) >> kQuantShift; }
  unsigned fwd_flags() const { return (has_bias ? kHasBias : 0u) | (residual ? kResidual : 0u) | quant; }
};
// What the backward computes besides dx (dh: the residual sum's incoming gradient, added to dx).
struct BwdWants {
  bool dw = false, db = false, dh = false;
  int accums() const { return int(dw) + int(db); }
  unsigned flags() const { return (dh ? kGradDh : 0u) | (dw ? kWantDw : 0u) | (db ? kWantDb : 0u); }
};
// The device's limits, fixed by arch: a GPU-less precompile plans as the device does.
struct Gpu {
  int sm_count = 132, arch = 90;
  int64_t smem_per_cta() const { return max_smem_per_block(arch); }
};

}  // namespace rtcnorm
