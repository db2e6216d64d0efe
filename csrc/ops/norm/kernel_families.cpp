#include "ops/norm/kernel_families.h"

#include <sstream>
#include <string>

namespace rtcnorm {
namespace {

std::string norm_expression(const char* kernel, const jit::KernelKey& k) {
  std::ostringstream os;
  os << "rtcnorm::" << kernel << "<" << jit::kernel_type_name(k.dtype) << ", " << jit::kernel_type_name(k.wdtype)
     << ", " << k.hidden << ", " << k.vec << ", " << k.threads_per_row << ", " << k.rows_per_cta << ", "
     << k.vecs_per_thread << ", " << k.flags << "u, " << k.variant << ">";
  return os.str();
}

std::string column_reduce_expression(const jit::KernelKey& k) {
  return std::string("rtcnorm::column_reduce<") + jit::kernel_type_name(k.wdtype) + ", " + std::to_string(k.vec) + ">";
}

}  // namespace

#define RTCNORM_NORM_FAMILY(var, name, header) \
  const jit::KernelFamily var{name, header, [](const jit::KernelKey& k) { return norm_expression(name, k); }};
RTCNORM_NORM_FAMILY(kRmsNormFwd, "rms_norm_fwd", "rms_norm.cuh")
RTCNORM_NORM_FAMILY(kRmsNormBwd, "rms_norm_bwd", "rms_norm.cuh")
RTCNORM_NORM_FAMILY(kLayerNormFwd, "layer_norm_fwd", "layer_norm.cuh")
RTCNORM_NORM_FAMILY(kLayerNormBwd, "layer_norm_bwd", "layer_norm.cuh")
RTCNORM_NORM_FAMILY(kRmsNormBwdCoef, "rms_norm_bwd_coef", "rms_norm.cuh")
RTCNORM_NORM_FAMILY(kRmsNormBwdCols, "rms_norm_bwd_cols", "rms_norm.cuh")
RTCNORM_NORM_FAMILY(kLayerNormBwdCoef, "layer_norm_bwd_coef", "layer_norm.cuh")
RTCNORM_NORM_FAMILY(kLayerNormBwdCols, "layer_norm_bwd_cols", "layer_norm.cuh")
RTCNORM_NORM_FAMILY(kRmsNormFwdFlat, "rms_norm_fwd_flat", "rms_norm.cuh")
RTCNORM_NORM_FAMILY(kRmsNormBwdFlat, "rms_norm_bwd_flat", "rms_norm.cuh")
RTCNORM_NORM_FAMILY(kLayerNormFwdFlat, "layer_norm_fwd_flat", "layer_norm.cuh")
RTCNORM_NORM_FAMILY(kLayerNormBwdFlat, "layer_norm_bwd_flat", "layer_norm.cuh")
#undef RTCNORM_NORM_FAMILY
const jit::KernelFamily kColumnReduce{"column_reduce", "column_reduce.cuh", column_reduce_expression};

const jit::KernelFamily* fwd_family(NormKind k) { return k == kRmsNorm ? &kRmsNormFwd : &kLayerNormFwd; }
const jit::KernelFamily* bwd_family(NormKind k) { return k == kRmsNorm ? &kRmsNormBwd : &kLayerNormBwd; }
const jit::KernelFamily* fwd_flat_family(NormKind k) { return k == kRmsNorm ? &kRmsNormFwdFlat : &kLayerNormFwdFlat; }
const jit::KernelFamily* bwd_flat_family(NormKind k) { return k == kRmsNorm ? &kRmsNormBwdFlat : &kLayerNormBwdFlat; }
const jit::KernelFamily* split_coef_family(NormKind k) { return k == kRmsNorm ? &kRmsNormBwdCoef : &kLayerNormBwdCoef; }
const jit::KernelFamily* split_cols_family(NormKind k) { return k == kRmsNorm ? &kRmsNormBwdCols : &kLayerNormBwdCols; }

jit::KernelKey column_reduce_key(jit::DType out, int64_t cols, int arch) {
  jit::KernelKey k;
  k.family = &kColumnReduce;
  k.dtype = jit::DType::kFloat32;
  k.wdtype = out;
  k.vec = static_cast<int16_t>(column_reduce_width(cols));
  k.threads_per_row = 32;
  k.rows_per_cta = 16;
  k.arch = static_cast<int16_t>(arch);
  return k;
}

}  // namespace rtcnorm
