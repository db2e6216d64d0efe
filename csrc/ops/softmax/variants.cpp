// The softmax ops' kernel variants for ahead-of-time compilation
// (rtcnorm.jit.precompile), planned as the ops would plan them.
#include "ops/variants.h"

#include <algorithm>
#include <vector>

#include "ops/softmax/plan/planner.h"

namespace rtcnorm {
namespace {

// Every kernel an op may launch for (dtype, sk, arch): its forward and the
// backward its autograd calls. Assumes aligned tensors (the widest vector
// access), as freshly allocated tensors are, both contiguous (flat rows) and
// not; masks both full and broadcast; large grids, and decode-sized ones on
// 132 SMs (32 rows: a CTA per row; 8 rows: long ones split over clusters),
// causal ones also with one query.
void add_keys(SoftmaxVariant variant, jit::DType dtype, int64_t cols, int arch, bool flat,
              std::vector<jit::KernelKey>& keys) {
  SoftmaxProblem p;
  p.variant = variant;
  p.dtype = dtype;
  p.rows = 1 << 16;
  p.cols = cols;
  p.max_vec = 16;
  p.flat = flat;
  p.arch = SoftmaxArch(arch, 0);
  const auto add = [&keys](const jit::KernelKey& k) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  };
  add(plan_softmax(p).key);
  if (variant == SoftmaxVariant::kMasked) {  // and a mask broadcast over 16 heads
    p.mask_bcast = 16;
    add(plan_softmax(p).key);
    p.mask_bcast = 1;
  }
  p.backward = true;
  add(plan_softmax(p).key);
  p.arch = SoftmaxArch(arch, 132);
  for (int64_t rows : {32, 8})
    for (int64_t sq : {int64_t{0}, int64_t{1}})
      for (bool backward : {false, true}) {
        if (sq == 1 && !p.causal()) continue;
        p.rows = rows;
        p.sq = sq;
        p.backward = backward;
        add(plan_softmax(p).key);
      }
}

std::vector<jit::KernelKey> softmax_keys(SoftmaxVariant variant, jit::DType dtype, int64_t cols, int arch) {
  std::vector<jit::KernelKey> keys;
  for (bool flat : {true, false}) add_keys(variant, dtype, cols, arch, flat, keys);
  return keys;
}

template <SoftmaxVariant kVariant>
std::vector<jit::KernelKey> keys_of(jit::DType dtype, int64_t cols, const std::vector<NormMode>& /*modes*/, int arch) {
  return softmax_keys(kVariant, dtype, cols, arch);
}

const bool kRegistered =
    register_variants("scaled_softmax", keys_of<SoftmaxVariant::kPlain>) &&
    register_variants("scaled_masked_softmax", keys_of<SoftmaxVariant::kMasked>) &&
    register_variants("scaled_upper_triang_masked_softmax", keys_of<SoftmaxVariant::kCausal>) &&
    register_variants("scaled_aligned_causal_masked_softmax", keys_of<SoftmaxVariant::kAlignedCausal>);

}  // namespace
}  // namespace rtcnorm
