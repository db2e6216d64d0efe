// torch.ops.rtcnorm.scaled_softmax, scaled_masked_softmax,
// scaled_upper_triang_masked_softmax, scaled_aligned_causal_masked_softmax
// and scaled_softmax_backward: the CUDA path and each op's entry, which
// checks the arguments (ops/softmax/softmax_checks.cpp) before either path. Schemas
// live in csrc/registration.cpp; autograd and fake implementations in
// python/rtcnorm/_softmax_ops.py.
#include "ops/softmax/softmax.h"

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "jit/kernel_cache.h"
#include "ops/norm_common.h"
#include "ops/softmax/plan/planner.h"

namespace rtcnorm {

static_assert(sizeof(FastDiv) == 16 && sizeof(RowIndex) == 88, "RowIndex layout must match the device's");
static_assert(sizeof(SoftmaxFwdParams) == 272 && sizeof(SoftmaxBwdParams) == 152,
              "softmax parameter blocks must match the device layout");

const char* softmax_op_name(SoftmaxOp op) {
  switch (op) {
    case SoftmaxOp::kScaled:
      return "scaled_softmax";
    case SoftmaxOp::kMasked:
      return "scaled_masked_softmax";
    case SoftmaxOp::kUpperTriang:
      return "scaled_upper_triang_masked_softmax";
    case SoftmaxOp::kAlignedCausal:
      return "scaled_aligned_causal_masked_softmax";
  }
  return "?";
}

SoftmaxKind softmax_kind(SoftmaxOp op) {
  switch (op) {
    case SoftmaxOp::kScaled:
      return kSoftmaxPlain;
    case SoftmaxOp::kMasked:
      return kSoftmaxMasked;
    default:
      return kSoftmaxCausal;
  }
}

SoftmaxVariant softmax_variant(SoftmaxOp op) {
  switch (op) {
    case SoftmaxOp::kScaled:
      return SoftmaxVariant::kPlain;
    case SoftmaxOp::kMasked:
      return SoftmaxVariant::kMasked;
    case SoftmaxOp::kUpperTriang:
      return SoftmaxVariant::kCausal;
    case SoftmaxOp::kAlignedCausal:
      return SoftmaxVariant::kAlignedCausal;
  }
  return SoftmaxVariant::kPlain;
}

namespace {

FastDiv make_fast_div(int64_t d) {
  TORCH_INTERNAL_ASSERT(d >= 1 && d <= std::numeric_limits<int32_t>::max());
  unsigned shift = 0;
  while ((int64_t(1) << shift) < d) ++shift;
  const uint64_t mul = ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(d))) / uint64_t(d) + 1;
  TORCH_INTERNAL_ASSERT(mul <= std::numeric_limits<uint32_t>::max());
  return {static_cast<unsigned>(d), static_cast<unsigned>(mul), shift, 0};
}

// Describes where each row (all dims but the last) of t starts, without a
// copy, when its leading dims collapse into at most kMaxRowGroups strided
// groups. Size-1 dims vanish and a broadcast (stride 0) run is one group.
bool row_index_of(const at::Tensor& t, RowIndex* ri) {
  std::vector<std::pair<int64_t, int64_t>> groups;  // {size, stride}, innermost first
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    const int64_t size = t.size(d), stride = t.stride(d);
    if (size == 1) continue;
    if (!groups.empty() && stride == groups.back().second * groups.back().first) {
      groups.back().first *= size;
      continue;
    }
    groups.emplace_back(size, stride);
  }
  if (groups.empty()) groups.emplace_back(1, 0);
  if (groups.size() > static_cast<size_t>(kMaxRowGroups)) return false;
  *ri = RowIndex{};
  ri->groups = static_cast<int>(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    ri->stride[g] = groups[g].second;
    if (g + 1 < groups.size()) ri->size[g] = make_fast_div(groups[g].first);
  }
  return true;
}

// Rows of t as the kernels read them: unit stride along the last dim and
// leading dims a RowIndex can describe, copying only when t has neither.
at::Tensor as_rows(const at::Tensor& t, RowIndex* ri) {
  at::Tensor r = t.size(-1) > 1 && t.stride(-1) != 1 ? t.contiguous() : t;
  if (!row_index_of(r, ri)) {
    r = r.contiguous();
    row_index_of(r, ri);
  }
  return r;
}

int vec_for_rows(const at::Tensor& t, const RowIndex& ri, int esize, int vmax) {
  int v = vec_for_ptr(t.data_ptr(), esize, vmax);
  for (int g = 0; g < ri.groups; ++g) v = vec_for_stride(ri.stride[g], v);
  return v;
}

// Finds the innermost broadcast (stride 0) group of the mask's rows that has
// rows of its own below it: rows = outer x bcast x inner with the mask row a
// function of (outer, inner) only. Taking the bcast rows of one mask row
// consecutively reads that mask row from DRAM once.
bool mask_broadcast_split(const RowIndex& mr, int64_t rows, int64_t* inner, int64_t* bcast) {
  int64_t below = 1;
  for (int g = 0; g < mr.groups; ++g) {
    const bool outermost = g + 1 == mr.groups;
    const int64_t size = outermost ? rows / below : mr.size[g].d;
    if (g > 0 && mr.stride[g] == 0 && size > 1 && below > 1) {
      *inner = below;
      *bcast = size;
      return true;
    }
    if (outermost) break;
    below *= size;
  }
  return false;
}

// Whether t is one flat array of rows from a 16-byte aligned base (flat_row).
bool staged_rows(const at::Tensor& t) {
  return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Plans, loads and launches one softmax kernel; prm's row_blocks is filled in
// from the plan before the launch reads the block.
template <typename Params>
void launch_softmax(const char* op, const at::Tensor& like, const SoftmaxProblem& prob, Params& prm) {
  const int dev = check_device_arch(like, op);
  const auto& info = jit::device_info(dev);
  SoftmaxProblem p = prob;
  p.arch = SoftmaxArch(info.arch, info.sm_count);
  const SoftmaxPlan plan = plan_softmax(p);
  const jit::CUstream stream = jit::current_stream(dev);
  const jit::LoadedKernel& k = jit::get_kernel(plan.key, dev, stream, static_cast<size_t>(plan.knobs.smem_bytes));
  prm.row_blocks = static_cast<int>(plan.row_blocks);
  if constexpr (std::is_same_v<Params, SoftmaxFwdParams>) prm.reuse_splits = plan.reuse_splits;
  const int64_t grid = softmax_grid(plan, info.sm_count, k.blocks_per_sm);
  jit::launch(k, static_cast<unsigned>(grid), 1, static_cast<unsigned>(plan.key.threads()), 1, stream, &prm);
}

at::Tensor softmax_forward_cuda(SoftmaxOp op, const at::Tensor& input, const at::Tensor* mask, double scale) {
  const char* name = softmax_op_name(op);
  const SoftmaxDims d = softmax_dims(input, softmax_kind(op) == kSoftmaxCausal);
  c10::DeviceGuard guard(input.device());
  at::Tensor y = at::empty(input.sizes(), input.options());
  if (d.rows == 0) return y;

  SoftmaxFwdParams prm{};
  const at::Tensor x = as_rows(input, &prm.x_rows);
  const int esize = jit::element_size(to_dtype(input.scalar_type()));
  int vec = vec_for_rows(x, prm.x_rows, esize, 16 / esize);
  at::Tensor m;
  if (mask != nullptr) {
    m = mask->dim() == 0 ? mask->reshape({1}) : *mask;
    if (m.size(-1) == 1 && d.cols > 1) {
      // Broadcast along keys: materialise that one dim so rows are contiguous;
      // broadcasts over the leading dims stay strides of 0.
      std::vector<int64_t> shape(m.sizes().begin(), m.sizes().end());
      shape.back() = d.cols;
      m = m.expand(shape).contiguous();
    }
    m = as_rows(m.expand(input.sizes()), &prm.mask_rows);
    vec = vec_for_rows(m, prm.mask_rows, 1, vec);
  }

  SoftmaxProblem prob;
  prob.dtype = to_dtype(input.scalar_type());
  prob.rows = d.rows;
  prob.cols = d.cols;
  prob.max_vec = vec;
  prob.variant = softmax_variant(op);
  prob.sq = d.sq;
  int64_t inner = 1, bcast = 1;
  if (m.defined() && mask_broadcast_split(prm.mask_rows, d.rows, &inner, &bcast)) prob.mask_bcast = bcast;
  prob.flat = staged_rows(x);
  prm.inner = make_fast_div(inner);
  prm.bcast = make_fast_div(bcast);

  prm.x = x.data_ptr();
  prm.mask = m.defined() ? static_cast<const unsigned char*>(m.data_ptr()) : nullptr;
  prm.y = y.data_ptr();
  prm.sq = make_fast_div(d.sq);
  prm.rows = static_cast<int>(d.rows);
  prm.cols = static_cast<int>(d.cols);
  prm.diag = static_cast<int>(d.cols - d.sq);
  prm.scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // log2(e)
  launch_softmax(name, input, prob, prm);
  return y;
}

at::Tensor scaled_softmax_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output, double scale,
                                        bool causal) {
  const char* name = "scaled_softmax_backward";
  const SoftmaxDims d = softmax_dims(output, causal);
  c10::DeviceGuard guard(output.device());
  at::Tensor dx = at::empty(output.sizes(), output.options());
  if (d.rows == 0) return dx;

  SoftmaxBwdParams prm{};
  const at::Tensor y = output.contiguous();
  const at::Tensor dy = as_rows(grad_output, &prm.dy_rows);
  const int esize = jit::element_size(to_dtype(output.scalar_type()));
  int vec = vec_for_ptr(y.data_ptr(), esize, 16 / esize);
  vec = vec_for_rows(dy, prm.dy_rows, esize, vec);

  SoftmaxProblem prob;
  prob.dtype = to_dtype(output.scalar_type());
  prob.rows = d.rows;
  prob.cols = d.cols;
  prob.max_vec = vec;
  prob.variant = causal ? SoftmaxVariant::kCausal : SoftmaxVariant::kPlain;
  prob.sq = d.sq;
  prob.backward = true;
  prob.flat = staged_rows(y) && staged_rows(dy);

  prm.y = y.data_ptr();
  prm.dy = dy.data_ptr();
  prm.dx = dx.data_ptr();
  prm.sq = make_fast_div(d.sq);
  prm.rows = static_cast<int>(d.rows);
  prm.cols = static_cast<int>(d.cols);
  prm.diag = static_cast<int>(d.cols - d.sq);
  prm.scale = static_cast<float>(scale);
  launch_softmax(name, output, prob, prm);
  return dx;
}

// The four forward ops, per device: unmasked ones take (input, scale).
template <SoftmaxOp kOp, bool kCuda>
at::Tensor forward_op(const at::Tensor& input, double scale) {
  check_softmax_forward(kOp, input, nullptr, scale, input.is_cuda());
  return (kCuda ? softmax_forward_cuda : softmax_forward_cpu)(kOp, input, nullptr, scale);
}

template <bool kCuda>
at::Tensor masked_op(const at::Tensor& input, const at::Tensor& mask, double scale) {
  check_softmax_forward(SoftmaxOp::kMasked, input, &mask, scale, input.is_cuda());
  return (kCuda ? softmax_forward_cuda : softmax_forward_cpu)(SoftmaxOp::kMasked, input, &mask, scale);
}

template <bool kCuda>
at::Tensor backward_op(const at::Tensor& grad_output, const at::Tensor& output, double scale, bool causal) {
  check_softmax_backward(grad_output, output, scale, causal, output.is_cuda());
  return (kCuda ? scaled_softmax_backward_cuda : softmax_backward_cpu)(grad_output, output, scale, causal);
}

}  // namespace

TORCH_LIBRARY_IMPL(rtcnorm, CUDA, m) {
  m.impl("scaled_softmax", &forward_op<SoftmaxOp::kScaled, true>);
  m.impl("scaled_masked_softmax", &masked_op<true>);
  m.impl("scaled_upper_triang_masked_softmax", &forward_op<SoftmaxOp::kUpperTriang, true>);
  m.impl("scaled_aligned_causal_masked_softmax", &forward_op<SoftmaxOp::kAlignedCausal, true>);
  m.impl("scaled_softmax_backward", &backward_op<true>);
}

TORCH_LIBRARY_IMPL(rtcnorm, CPU, m) {
  m.impl("scaled_softmax", &forward_op<SoftmaxOp::kScaled, false>);
  m.impl("scaled_masked_softmax", &masked_op<false>);
  m.impl("scaled_upper_triang_masked_softmax", &forward_op<SoftmaxOp::kUpperTriang, false>);
  m.impl("scaled_aligned_causal_masked_softmax", &forward_op<SoftmaxOp::kAlignedCausal, false>);
  m.impl("scaled_softmax_backward", &backward_op<false>);
}

}  // namespace rtcnorm
