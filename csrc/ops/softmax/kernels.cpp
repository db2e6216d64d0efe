#include "ops/softmax/kernels.h"

#include <sstream>
#include <string>

namespace rtcnorm {
namespace {

std::string softmax_expression(const char* kernel, const jit::KernelKey& k) {
  std::ostringstream os;
  os << "rtcnorm::" << kernel << "<" << jit::kernel_type_name(k.dtype) << ", " << k.vec << ", " << k.threads_per_row
     << ", " << k.rows_per_cta << ", " << k.vecs_per_thread << ", ";
  if (k.family == &kSoftmaxFwd)
    os << k.variant;
  else
    os << (k.variant != 0 ? "true" : "false");
  os << ", " << ((k.flags & kSoftmaxCachedFlag) != 0 ? "true" : "false") << ", "
     << ((k.flags >> kSoftmaxMinBlocksShift) & 0xffu) << ", " << ((k.flags >> kSoftmaxOptsShift) & 0xffu) << "u>";
  return os.str();
}

// softmax_{fwd,bwd}_flat<T, N, VEC, TPR, ROWS, KIND or CAUSAL, MINB, OPTS>.
std::string flat_expression(const char* kernel, const jit::KernelKey& k) {
  std::ostringstream os;
  os << "rtcnorm::" << kernel << "<" << jit::kernel_type_name(k.dtype) << ", " << k.hidden << ", " << k.vec << ", "
     << k.threads_per_row << ", " << k.rows_per_cta << ", ";
  if (k.family == &kSoftmaxFwdFlat)
    os << k.variant;
  else
    os << (k.variant != 0 ? "true" : "false");
  os << ", " << ((k.flags >> kSoftmaxMinBlocksShift) & 0xffu) << ", " << ((k.flags >> kSoftmaxOptsShift) & 0xffu)
     << "u>";
  return os.str();
}

}  // namespace

const jit::KernelFamily kSoftmaxFwd{"softmax_fwd", "softmax.cuh",
                                    [](const jit::KernelKey& k) { return softmax_expression("softmax_fwd", k); }};
const jit::KernelFamily kSoftmaxBwd{"softmax_bwd", "softmax.cuh",
                                    [](const jit::KernelKey& k) { return softmax_expression("softmax_bwd", k); }};

const jit::KernelFamily kSoftmaxFwdFlat{"softmax_fwd_flat", "softmax.cuh",
                                        [](const jit::KernelKey& k) { return flat_expression("softmax_fwd_flat", k); }};
const jit::KernelFamily kSoftmaxBwdFlat{"softmax_bwd_flat", "softmax.cuh",
                                        [](const jit::KernelKey& k) { return flat_expression("softmax_bwd_flat", k); }};

}  // namespace rtcnorm
