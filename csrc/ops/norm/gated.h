// Gated RMSNorm (rtcnorm.rms_norm_gated): argument checks, the kernel plan,
// and the CPU (reference, any device) and CUDA paths. Schemas in
// csrc/registration.cpp; autograd and fake impls in python/rtcnorm/gated.py.
//
// Semantics, per group of G consecutive columns of a row (G = group_size,
// N when absent), with act = silu or sigmoid and w = weight (1 when absent):
//   norm_before_gate:  y = x * rstd * w * act(z)
//   otherwise:         y = h * rstd * w with h = x * act(z)
// where rstd = rsqrt(mean over the group of x^2 (resp. h^2) + eps), returned
// as rows x (N / G) statistics (float32; float64 for float64 input on CPU).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "jit/kernel_key.h"
#include "ops/norm/quant.h"

namespace rtcnorm {

struct GatedArgs {
  int64_t rows = 0;
  int64_t hidden = 0;  // N
  int64_t group = 0;   // G
  bool sigmoid = false;
};

// Every check of a forward call; every message names the argument. Sizes
// may be symbolic (fake tensors): equalities are checked as torch._check does.
void check_gated_forward(const at::Tensor& input, const at::Tensor& gate, const std::optional<at::Tensor>& weight,
                         std::optional<double> eps, std::optional<c10::SymInt> group_size, c10::string_view activation,
                         bool cuda);
void check_gated_backward(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& gate,
                          const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                          std::optional<c10::SymInt> group_size, c10::string_view activation, bool cuda);
// A rms_norm_gated_quant call: the forward's checks, then norm_quant's
// quantization arguments (check_quant_args, same messages).
QuantSpec check_gated_quant(const at::Tensor& input, const at::Tensor& gate, const std::optional<at::Tensor>& weight,
                            std::optional<double> eps, std::optional<c10::SymInt> group_size,
                            c10::string_view activation, c10::string_view recipe, at::ScalarType out_dtype,
                            const std::optional<at::Tensor>& scale, c10::string_view scale_layout, bool cuda,
                            bool scale_value);
// The dims of a checked call.
GatedArgs gated_args(const at::Tensor& input, std::optional<int64_t> group_size, c10::string_view activation);
// lead dims + (N / G,).
std::vector<int64_t> gated_stat_shape(const at::Tensor& input, const GatedArgs& a);

struct GatedFwdOut {
  at::Tensor y, rstd;
};
struct GatedBwdOut {
  at::Tensor dx, dz, dw;
};

// ATen composite paths: the CPU implementation, and the CUDA fallback for
// shapes no kernel plan covers. Math in fp32 (fp64 for fp64 input).
// keep_float: y stays in the math dtype (the quantized path's input).
GatedFwdOut gated_forward_ref(const at::Tensor& x, const at::Tensor& z, const std::optional<at::Tensor>& weight,
                              double eps, bool norm_first, const GatedArgs& a, bool keep_float = false);
GatedBwdOut gated_backward_ref(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& z, const at::Tensor& rstd,
                               const std::optional<at::Tensor>& weight, bool norm_first, bool want_dw,
                               const GatedArgs& a);

// The kernel of a gated problem, if a register-row plan covers it: forward,
// or backward (want_dw: write dW partial rows). max_vec: the widest access
// the pointers and strides allow (elements).
struct GatedProblem {
  jit::DType dtype = jit::DType::kFloat32;
  jit::DType wdtype = jit::DType::kFloat32;
  int64_t hidden = 0;
  int64_t group = 0;
  bool has_weight = false;
  bool norm_first = true;
  bool sigmoid = false;
  int max_vec = 16;
  unsigned quant = 0;  // forward: QuantSpec::flags() of a quantized output
};
std::optional<jit::KernelKey> gated_key(const GatedProblem& p, bool backward, bool want_dw, int arch);
// The problem of a call on input of `dtype` with a weight of `wdtype`
// (std::nullopt: no weight), for aligned tensors (max_vec 16).
GatedProblem gated_problem(jit::DType dtype, std::optional<jit::DType> wdtype, bool norm_first, const GatedArgs& a);

GatedFwdOut gated_forward_cuda(const at::Tensor& x, const at::Tensor& z, const std::optional<at::Tensor>& weight,
                               double eps, bool norm_first, const GatedArgs& a);
// Writes the quantized y into q and returns rstd; std::nullopt where no
// kernel plan carries the recipe on this shape (the caller falls back).
std::optional<at::Tensor> gated_quant_forward_cuda(const at::Tensor& x, const at::Tensor& z,
                                                   const std::optional<at::Tensor>& weight, double eps, bool norm_first,
                                                   const GatedArgs& a, const QuantLaunch& q);
GatedBwdOut gated_backward_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& z, const at::Tensor& rstd,
                                const std::optional<at::Tensor>& weight, bool norm_first, bool want_dw,
                                const GatedArgs& a);

}  // namespace rtcnorm
