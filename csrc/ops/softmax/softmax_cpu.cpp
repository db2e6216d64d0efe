// CPU implementations of the softmax family, with ATen ops in fp32 (fp64 for
// fp64 input). They define the semantics the CUDA kernels are tested against
// (see ops/softmax/softmax.h) and serve CPU tensors, gradcheck included.
#include <ATen/TensorOperators.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include <limits>

#include "ops/softmax/softmax.h"

namespace rtcnorm {
namespace {

at::ScalarType acc_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// True where key j is hidden from query q: j > q + (sk - sq). Shape (sq, sk).
at::Tensor causal_hidden(const SoftmaxDims& d, const at::Tensor& like) {
  return at::ones({d.sq, d.cols}, like.options().dtype(at::kBool)).triu(d.cols - d.sq + 1);
}

}  // namespace

at::Tensor softmax_forward_cpu(SoftmaxOp op, const at::Tensor& input, const at::Tensor* mask, double scale) {
  const SoftmaxDims d = softmax_dims(input, softmax_kind(op) == kSoftmaxCausal);
  if (input.numel() == 0) return at::empty(input.sizes(), input.options());
  const double neg_inf = -std::numeric_limits<double>::infinity();
  at::Tensor z = input.to(acc_type(input)) * scale;
  if (mask != nullptr) z = z.masked_fill(*mask, neg_inf);
  if (softmax_kind(op) == kSoftmaxCausal) z = z.masked_fill(causal_hidden(d, input), neg_inf);
  // A row with nothing visible has max -inf: shift by 0 instead, so every
  // exp is 0, the sum is 0 and the row comes out as zeros, not NaN.
  const at::Tensor m = z.amax({-1}, /*keepdim=*/true);
  const at::Tensor e = (z - at::where(m == neg_inf, at::zeros_like(m), m)).exp();
  const at::Tensor s = e.sum({-1}, /*keepdim=*/true);
  const at::Tensor y = e / at::where(s > 0, s, at::ones_like(s));
  return y.to(input.scalar_type()).contiguous();
}

at::Tensor softmax_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output, double scale, bool causal) {
  const SoftmaxDims d = softmax_dims(output, causal);
  if (output.numel() == 0) return at::empty(output.sizes(), output.options());
  const at::Tensor y = output.to(acc_type(output));
  at::Tensor dy = grad_output.to(acc_type(output));
  // The causal kernels never read dy past the diagonal: whatever is there
  // (even inf or NaN) leaves dx, which is 0 there, untouched.
  if (causal) dy = dy.masked_fill(causal_hidden(d, output), 0.0);
  const at::Tensor dot = (dy * y).sum({-1}, /*keepdim=*/true);
  const at::Tensor dx = y * (dy - dot) * scale;
  return dx.to(output.scalar_type()).contiguous();
}

}  // namespace rtcnorm
