// Argument checks of the norm ops: ONE implementation for the CPU and CUDA
// impls, the fake impls (python/rtcnorm/_ops.py, through rtcnorm._C) and
// explain(), so every path refuses the same calls with the same message.
//
// Sizes may be symbolic (fake tensors under torch.compile or export):
// - an equality between sizes is checked as torch._check checks it
//   (SymBool::expect_true: a guard on backed sizes, a deferred runtime
//   assert on unbacked ones), which the fake impls did before;
// - a limit on a size (rows of at most 2^24 elements) only where the size is
//   known, so no new guard or specialization comes from a check.
//
// `cuda` selects the CUDA path's rules (kernel dtypes only); the real impls
// pass input.is_cuda(). dtypes: float32, float16 and bfloat16 everywhere,
// float64 also on the CPU path (the reference path gradcheck runs on).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ops/norm/plan/planner.h"

namespace rtcnorm {

// float32, float16 and bfloat16: the element types kernels are built for.
bool is_kernel_dtype(at::ScalarType t);

// Longest row (product of normalized_shape) any path accepts.
constexpr int64_t kMaxNormHidden = int64_t{1} << 24;

// Every check of a norm forward call (rms_norm, add_rms_norm, layer_norm):
// mode, input's dtype, normalized_shape, weight, bias, residual, eps (nullopt:
// the op's default). Every message names the op and the argument. Returns
// the parsed mode.
NormMode check_norm_forward(const char* op, const at::Tensor& input, const std::optional<at::Tensor>& residual,
                            c10::SymIntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, std::optional<double> eps,
                            const std::optional<c10::string_view>& mode, bool cuda);

// Every check of a norm backward call: the forward's on input, weight and
// bias; grad_out and grad_h like input; rstd (and mean for LayerNorm) one
// statistic of stat_dtype(input) per row on input's device.
void check_norm_backward(NormKind kind, const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                         const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         c10::SymIntArrayRef normalized_shape, const std::optional<at::Tensor>& grad_h, bool cuda);

// eps of an RMSNorm call: as given, else torch.nn.functional.rms_norm's
// default, the input dtype's machine epsilon.
double rms_norm_eps(const at::Tensor& input, std::optional<double> eps);

struct NormDims {
  int64_t rows = 0;    // product of the leading dims
  int64_t hidden = 0;  // product of normalized_shape
  int64_t lead = 0;    // number of leading dims
};

// The dims of a call whose arguments were checked.
NormDims norm_dims(const at::Tensor& input, at::IntArrayRef normalized_shape);

// check_norm_forward without mode and eps, then the dims.
NormDims check_norm_args(const char* op, const at::Tensor& input, at::IntArrayRef normalized_shape,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& residual);

// check_norm_backward, then the dims; `stats` is stat_dtype(input) on every path.
NormDims check_norm_bwd_args(NormKind kind, const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                             const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                             const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                             at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& grad_h,
                             at::ScalarType stats);

// Checks a gradient (or other per-element tensor) against input's shape/dtype/device.
void check_like_input(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input);

// input's dtype: a kernel dtype, or float64 too on the CPU path.
void check_norm_dtype(const char* op, const at::Tensor& input, bool cuda);

// t is on input's device; the message names both.
void check_same_device(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input);

// Sizes equal where known; symbolic pairs as torch._check would (see above).
bool sym_equal(const c10::SymInt& a, const c10::SymInt& b);
bool sym_sizes_equal(c10::SymIntArrayRef a, c10::SymIntArrayRef b);

// Per-row statistics: leading dims of input; float64 for float64 input (CPU
// gradcheck), float32 otherwise.
std::vector<int64_t> stat_shape(const at::Tensor& input, int64_t lead);
at::ScalarType stat_dtype(const at::Tensor& input);

}  // namespace rtcnorm
