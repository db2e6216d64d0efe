// Argument checks of the softmax family (ops/softmax/softmax.h): the same calls are
// refused with the same messages by the CPU and CUDA impls and the fake impls.
#include <c10/core/SymBool.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/norm_checks.h"
#include "ops/softmax/softmax.h"

namespace rtcnorm {
namespace {

void check_softmax_dtype(const char* op, const char* name, const at::Tensor& t, bool cuda) {
  const at::ScalarType s = t.scalar_type();
  if (cuda) {
    TORCH_CHECK_TYPE(is_kernel_dtype(s), "rtcnorm.", op, ": ", name,
                     " must be float16, bfloat16 or float32 on CUDA, got ", s);
  } else {
    TORCH_CHECK_TYPE(is_kernel_dtype(s) || s == at::kDouble, "rtcnorm.", op, ": ", name,
                     " must be float16, bfloat16, float32 or float64 (float64 on CPU only), got ", s);
  }
}

// a <= b where known; a symbolic pair as torch._check would (ops/norm_checks.h).
bool sym_at_most(const c10::SymInt& a, const c10::SymInt& b) {
  const auto x = a.maybe_as_int();
  const auto y = b.maybe_as_int();
  if (x.has_value() && y.has_value()) return *x <= *y;
  return a.sym_le(b).expect_true(__FILE__, __LINE__);
}

// A mask dim broadcasts to input's: 1 or equal.
bool sym_broadcasts(const c10::SymInt& m, const c10::SymInt& in) {
  const auto x = m.maybe_as_int();
  const auto y = in.maybe_as_int();
  if (x.has_value() && (*x == 1 || (y.has_value() && *x == *y))) return true;
  if (x.has_value() && y.has_value()) return false;
  return m.sym_eq(1).sym_or(m.sym_eq(in)).expect_true(__FILE__, __LINE__);
}

// The CUDA kernels index rows and columns with 32-bit integers; checked
// where the sizes are known.
void check_softmax_launch(const char* op, const at::Tensor& t) {
  const auto cols = t.sym_size(-1).maybe_as_int();
  const auto numel = t.sym_numel().maybe_as_int();
  if (!cols.has_value() || !numel.has_value()) return;
  const int64_t rows = *cols == 0 ? 0 : *numel / *cols;
  TORCH_CHECK_VALUE(rows <= std::numeric_limits<int32_t>::max(), "rtcnorm.", op,
                    ": at most 2^31 - 1 rows (the product of all dims but the last) are supported on CUDA, got ", rows);
  TORCH_CHECK_VALUE(*cols <= std::numeric_limits<int32_t>::max() - 16, "rtcnorm.", op,
                    ": rows of at most 2^31 - 17 elements are supported on CUDA, got ", *cols);
}

void check_softmax_mask(const char* op, const at::Tensor& mask, const at::Tensor& input) {
  TORCH_CHECK_TYPE(mask.scalar_type() == at::kBool, "rtcnorm.", op,
                   ": mask must be a bool tensor (True = masked out), got ", mask.scalar_type());
  check_same_device(op, "mask", mask, input);
  bool ok = mask.dim() <= input.dim();
  for (int64_t i = 1; ok && i <= mask.dim(); ++i) ok = sym_broadcasts(mask.sym_size(-i), input.sym_size(-i));
  TORCH_CHECK_VALUE(ok, "rtcnorm.", op, ": mask of shape ", mask.sym_sizes(),
                    " is not broadcastable to input of shape ", input.sym_sizes());
}

}  // namespace

SoftmaxDims softmax_dims(const at::Tensor& t, bool causal) {
  SoftmaxDims d;
  d.cols = t.size(-1);
  d.sq = causal ? t.size(-2) : 1;
  d.rows = d.cols == 0 ? 0 : t.numel() / d.cols;
  return d;
}

void check_softmax_forward(SoftmaxOp op, const at::Tensor& input, const at::Tensor* mask, double scale, bool cuda) {
  const char* name = softmax_op_name(op);
  check_softmax_dtype(name, "input", input, cuda);
  const bool causal = softmax_kind(op) == kSoftmaxCausal;
  if (causal) {
    TORCH_CHECK_VALUE(input.dim() >= 2, "rtcnorm.", name, ": input must have at least 2 dims (..., sq, sk), got shape ",
                      input.sym_sizes());
  } else {
    TORCH_CHECK_VALUE(input.dim() >= 1, "rtcnorm.", name,
                      ": input must have at least 1 dim (the softmax runs over the last), got a 0-dim tensor");
  }
  TORCH_CHECK_VALUE(std::isfinite(scale), "rtcnorm.", name, ": scale must be finite, got ", scale);
  if (op == SoftmaxOp::kUpperTriang)
    TORCH_CHECK_VALUE(sym_equal(input.sym_size(-2), input.sym_size(-1)), "rtcnorm.", name,
                      ": needs sq == sk (the last two dims), got sq = ", input.sym_size(-2),
                      " and sk = ", input.sym_size(-1), "; for sq < sk use scaled_aligned_causal_masked_softmax");
  if (op == SoftmaxOp::kAlignedCausal)
    TORCH_CHECK_VALUE(sym_at_most(input.sym_size(-2), input.sym_size(-1)), "rtcnorm.", name,
                      ": needs sq <= sk (the last two dims), got sq = ", input.sym_size(-2),
                      " and sk = ", input.sym_size(-1));
  if (mask != nullptr) check_softmax_mask(name, *mask, input);
  if (cuda) check_softmax_launch(name, input);
}

void check_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, double scale, bool causal,
                            bool cuda) {
  const char* op = "scaled_softmax_backward";
  check_softmax_dtype(op, "output", output, cuda);
  TORCH_CHECK_VALUE(sym_sizes_equal(grad_output.sym_sizes(), output.sym_sizes()), "rtcnorm.", op,
                    ": grad_output must have output's shape ", output.sym_sizes(), ", got ", grad_output.sym_sizes());
  TORCH_CHECK_TYPE(grad_output.scalar_type() == output.scalar_type(), "rtcnorm.", op,
                   ": grad_output must have output's dtype ", output.scalar_type(), ", got ",
                   grad_output.scalar_type());
  TORCH_CHECK(grad_output.device() == output.device(), "rtcnorm.", op, ": grad_output is on ", grad_output.device(),
              " but output is on ", output.device());
  TORCH_CHECK_VALUE(output.dim() >= (causal ? 2 : 1), "rtcnorm.", op, ": output must have at least ",
                    causal ? "2 dims (..., sq, sk) when causal" : "1 dim", ", got shape ", output.sym_sizes());
  TORCH_CHECK_VALUE(std::isfinite(scale), "rtcnorm.", op, ": scale must be finite, got ", scale);
  TORCH_CHECK_VALUE(!causal || sym_at_most(output.sym_size(-2), output.sym_size(-1)), "rtcnorm.", op,
                    ": causal output needs sq <= sk, got sq = ", output.sym_size(-2),
                    " and sk = ", output.sym_size(-1));
  if (cuda) check_softmax_launch(op, output);
}

}  // namespace rtcnorm
