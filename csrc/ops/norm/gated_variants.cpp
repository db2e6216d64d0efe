// rtcnorm.jit.precompile("rms_norm_gated" / "rms_norm_gated_quant"): the
// kernels a call on rows of N in groups of G launches, as gated_cuda.cpp
// plans them (gated_problem, gated_key, column_reduce_key), for aligned
// tensors whose row strides keep the widest vector (freshly allocated ones
// do): with no weight, a weight of input's dtype and a float32 one; both
// gate orders; silu and sigmoid.
// - rms_norm_gated: the forward, and the backward with and without dW
//   followed by the dW column reduce.
// - rms_norm_gated_quant: the forward of every recipe and scale layout
//   (QuantSpec::flags, as check_quant_args parses them); its backward is
//   rms_norm_gated's.
// Problems gated_key refuses run the ATen composite path, which launches no
// NVRTC kernel: they add no key.
#include <optional>
#include <vector>

#include "kernels/common/quant_math.cuh"
#include "ops/norm/gated.h"
#include "ops/norm/kernel_families.h"
#include "ops/norm/quant.h"
#include "ops/variants.h"

namespace rtcnorm {
namespace {

using jit::DType;
using jit::KernelKey;

// Every problem a call of (dtype, N, G) may plan: weight dtypes, gate
// orders, activations.
std::vector<GatedProblem> gated_problems(DType dtype, int64_t hidden, int64_t group) {
  std::vector<std::optional<DType>> wdtypes = {std::nullopt, dtype};
  if (dtype != DType::kFloat32) wdtypes.push_back(DType::kFloat32);
  std::vector<GatedProblem> out;
  for (const auto& wd : wdtypes)
    for (bool norm_first : {true, false})
      for (bool sigmoid : {false, true}) {
        GatedArgs a;
        a.hidden = hidden;
        a.group = group;
        a.sigmoid = sigmoid;
        out.push_back(gated_problem(dtype, wd, norm_first, a));
      }
  return out;
}

std::vector<KernelKey> gated_keys(DType dtype, int64_t hidden, int64_t group, int arch) {
  std::vector<KernelKey> keys;
  for (const GatedProblem& p : gated_problems(dtype, hidden, group)) {
    if (auto k = gated_key(p, false, false, arch)) keys.push_back(*k);
    for (bool want_dw : {false, true}) {
      if (want_dw && !p.has_weight) continue;
      const auto k = gated_key(p, true, want_dw, arch);
      if (!k.has_value()) continue;
      keys.push_back(*k);
      if (want_dw) keys.push_back(column_reduce_key(p.wdtype, hidden, arch));
    }
  }
  return keys;
}

std::vector<KernelKey> gated_quant_keys(DType dtype, int64_t hidden, int64_t group, int arch) {
  std::vector<KernelKey> keys;
  for (unsigned r = quant::kPerTensorE4M3; r <= quant::kNvfp4; ++r)
    for (bool blocked : {false, true}) {
      QuantSpec q;
      q.recipe = r;
      q.blocked = blocked;
      if (blocked && q.block() == 0) continue;
      for (GatedProblem p : gated_problems(dtype, hidden, group)) {
        p.quant = q.flags();
        if (auto k = gated_key(p, false, false, arch)) keys.push_back(*k);
      }
    }
  return keys;
}

const bool kRegistered = register_grouped_variants("rms_norm_gated", &gated_keys) &&
                         register_grouped_variants("rms_norm_gated_quant", &gated_quant_keys);

}  // namespace
}  // namespace rtcnorm
