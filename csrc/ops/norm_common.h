// Host launch code shared by RMSNorm and LayerNorm; their argument checks
// are in ops/norm_checks.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "ops/norm/kernel_families.h"
#include "ops/norm/launch_geometry.h"
#include "ops/norm/plan/planner.h"
#include "ops/norm/quant.h"
#include "ops/norm_checks.h"

namespace rtcnorm::jit {
struct LoadedKernel;
}

namespace rtcnorm {

// ---- shared by every op's CUDA path ----
jit::DType to_dtype(at::ScalarType t);
// Widest access (elements, <= vmax) a base pointer allows for elements of esize bytes.
int vec_for_ptr(const void* p, int esize, int vmax);
// Widest access (elements, <= vmax) dividing an element stride.
int vec_for_stride(int64_t stride, int vmax);
// input's CUDA device index; throws naming `op` for a GPU older than sm_80.
int check_device_arch(const at::Tensor& input, const char* op);

// Whether the rows of an input of these sizes and strides (dims from `lead`
// on normalized) reach the kernel as one stride (NormProblem::single_stride):
// leading dims that collapse into one group, or rows that are copied
// contiguous first because no row map describes them.
bool rows_single_stride(at::IntArrayRef sizes, at::IntArrayRef strides, int64_t lead);

struct NormFwdOutputs {
  at::Tensor y, h, mean, rstd;
};

// The CUDA paths; the op entries check the arguments first
// (check_norm_forward / check_norm_backward). With `quant`, y is not
// allocated: the kernel writes quant->data and its scales instead.
NormFwdOutputs norm_forward_cuda(NormKind kind, const char* op, const at::Tensor& input,
                                 const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
                                 const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                 double eps, NormMode mode, bool zero_centered, const QuantLaunch* quant = nullptr);

struct NormBwdOutputs {
  at::Tensor dx, dw, db;
};

NormBwdOutputs norm_backward_cuda(NormKind kind, const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                                  const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                                  const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                  at::IntArrayRef normalized_shape, bool zero_centered, bool want_dw, bool want_db,
                                  const std::optional<at::Tensor>& grad_h);

// CTAs of a norm launch: one per row block, or, for a persistent grid, as
// many as are resident at once and never more than row blocks. A cluster
// kernel (k.cluster CTAs per row block) counts clusters, resident ones by
// the driver's count; the result is a multiple of k.cluster below 2^31.
// A persistent grid has at most max_units CTAs (clusters). group_ctas > 1:
// units are groups of that many CTAs of a cooperative launch (kGridExchange),
// as many groups as are resident at k's occupancy (at least one).
int64_t norm_grid(int64_t row_blocks, bool persistent, int sm_count, const jit::LoadedKernel& k,
                  int64_t max_units = std::numeric_limits<int64_t>::max(), int group_ctas = 1);

// Empty placeholder returned for a gradient that was not requested.
at::Tensor no_grad_placeholder(const at::Tensor& like);

}  // namespace rtcnorm
