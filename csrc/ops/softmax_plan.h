// Launch planning for the softmax kernels: which instantiation runs, with
// which grid, and why. Needs no GPU; the streamed kernel's persistent grid
// takes its occupancy from the loaded kernel at launch.
#pragma once

#include <cstdint>
#include <string>

#include "jit/kernel_key.h"
#include "kernels/common/softmax_params.cuh"
#include "ops/softmax_tuning.h"

namespace rtcnorm {

struct SoftmaxProblem {
  jit::DType dtype = jit::DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;                  // sk
  int max_vec = 1;                   // widest access every pointer and stride allows (elements)
  SoftmaxKind kind = kSoftmaxPlain;  // forward; the backward only asks "causal or not"
  // Causal rows: queries per (sq x sk) matrix (0: unknown). A single query
  // sees every key, so it runs the plain kernels.
  int64_t sq = 0;
  bool backward = false;
  // Masked forward: the mask is constant along a dim that has rows of its
  // own below it (e.g. (b, 1, sq, sk) against (b, h, sq, sk)).
  bool mask_bcast = false;
  int64_t bcast = 1;  // mask_bcast: rows sharing each mask row (the broadcast dim's size)
  // SMs of the device (0: unknown, e.g. kernel variants listed ahead of
  // time); grids of at most one CTA per SM take launch bounds of one.
  int sm_count = 0;
};

struct SoftmaxPlan {
  jit::KernelKey key;
  bool cached = false;      // the row stays in registers: one read of each input
  bool persistent = false;  // grid = SMs x min(occupancy, ctas_per_sm); CTAs stride over row blocks
  int ctas_per_sm = 0;      // persistent: the cap (0: occupancy)
  int64_t row_blocks = 0;
  int reuse_splits = 1;  // kSoftmaxMaskReuse: runs per mask row (SoftmaxFwdParams::reuse_splits)
};

SoftmaxPlan plan_softmax(const SoftmaxProblem& p, int arch);

// Why the plan is what it is, for explain(); not used on the launch path.
std::string describe_plan(const SoftmaxProblem& p, const SoftmaxPlan& plan);

// Streamed rows re-read their input from L2; capping the CTAs per SM keeps
// the rows in flight (SMs x cap x row bytes) well inside L2.
constexpr int kStreamCtasPerSm = 2;

// The grid of a plan that is not persistent: a CTA, or a cluster of them,
// per row block.
inline int64_t fixed_grid(const SoftmaxPlan& plan) { return plan.row_blocks * plan.key.cluster; }
int64_t softmax_grid(const SoftmaxPlan& plan, int sm_count, int blocks_per_sm);
// The grid as explain() shows it before a kernel is loaded.
std::string describe_grid(const SoftmaxPlan& plan);

extern const jit::KernelFamily kSoftmaxFwd, kSoftmaxBwd;

}  // namespace rtcnorm
