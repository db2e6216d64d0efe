// Every norm kernel a call may launch for (dtype, N, mode, arch): the forward
// for each weight/bias/zero-centred/residual combination, the backward for
// each gradient combination, and the dW/dB column reducer; forwards for full
// grids, few-row grids and decode-sized ones; each for rows of one stride and
// of two. Assumes aligned tensors (the widest vector access), as freshly
// allocated tensors are. The quantized-output ops (norm_quant) add the
// forwards of every recipe and scale layout; their backward is the plain one.
#include <algorithm>

#include "kernels/common/quant_math.cuh"
#include "ops/norm/kernel_families.h"
#include "ops/norm/launch_geometry.h"
#include "ops/norm/plan/planner.h"
#include "ops/variants.h"

namespace rtcnorm {
namespace {

using jit::DType;
using jit::KernelKey;

// quant: NormProblem::quant of a quantized output (forwards only), or 0.
std::vector<KernelKey> norm_keys(NormKind kind, DType dtype, int64_t hidden, const std::vector<NormMode>& modes,
                                 int arch, unsigned quant = 0) {
  std::vector<KernelKey> keys;
  std::vector<DType> wdtypes = {dtype};
  if (dtype != DType::kFloat32) wdtypes.push_back(DType::kFloat32);
  const bool ln = kind == kLayerNorm;
  for (DType wd : wdtypes) {
    for (int affine = 0; affine < (ln ? 4 : 2); ++affine) {
      const bool has_w = affine & 1, has_b = affine & 2;
      if (!has_w && !has_b && wd != dtype) continue;
      for (int zc = 0; zc <= int(has_w); ++zc) {
        NormProblem p;
        p.kind = kind;
        p.dtype = dtype;
        p.wdtype = wd;
        p.rows = 1 << 16;
        p.hidden = hidden;
        p.max_vec = 16;
        p.has_weight = has_w;
        p.has_bias = has_b;
        p.zero_centered = zc;
        p.quant = quant;
        // Row counts on either side of the planner's breaks: one row, a few
        // row blocks, a wave of the 132-SM part at each power-of-two rows a
        // CTA, many waves, and either side of the size from which x is read
        // through L1 (a row of 40 MB or more has no row count under it).
        const int64_t under_l1 = (kL1AllocMinInputBytes - 1) / (hidden * jit::element_size(dtype));
        std::vector<int64_t> row_counts = {int64_t(1) << 16, 1, 2, 32, std::max<int64_t>(1, under_l1), under_l1 + 1};
        for (int64_t rows_per_cta = 1; rows_per_cta <= 128; rows_per_cta *= 4)
          for (int64_t per_sm : {1, 4}) row_counts.push_back(per_sm * 132 * rows_per_cta);
        // Contiguous rows (one stride, kSingleStride) at every row count; rows
        // of two strides (heads sliced out of a fused projection) at a full
        // grid and at one row.
        for (int res = 0; res <= int(!ln); ++res)
          for (int64_t rows : row_counts)
            for (bool one_stride : {true, false}) {
              if (!one_stride && rows != (int64_t(1) << 16) && rows != 1) continue;
              p.residual = res;
              p.rows = rows;
              p.single_stride = one_stride;
              p.flat = one_stride;
              for (NormMode m : modes) keys.push_back(plan_norm_fwd(p, m, 132, arch).key);
            }
        if (quant != 0) continue;
        p.residual = false;
        p.single_stride = true;
        p.flat = true;
        // Besides the full grid's backward, that of one row (one CTA writing
        // the gradients directly: kDirectGrads), of few rows (column CTAs
        // beside the row CTAs, or a row sliced over a cluster), and of two row
        // blocks and one row block an SM are kernels of their own.
        for (int dw = 0; dw <= int(has_w); ++dw)
          for (int db = 0; db <= int(has_b); ++db)
            for (int dh = 0; dh <= int(!ln); ++dh) {
              p.rows = 1 << 16;
              const NormBwdPlan full = plan_norm_bwd(p, dw, db, dh, 132, arch);
              std::vector<int64_t> bwd_rows = {p.rows, 1, 2, 4, 32};
              for (int64_t blocks : {2, 132}) bwd_rows.push_back(blocks * full.key.rows_per_cta);
              for (int64_t rows : bwd_rows)
                for (bool one_stride : {true, false}) {
                  if (!one_stride && rows != (int64_t(1) << 16) && rows != 1) continue;
                  p.rows = rows;
                  p.single_stride = one_stride;
                  p.flat = one_stride;
                  const NormBwdPlan b = plan_norm_bwd(p, dw, db, dh, 132, arch);
                  keys.push_back(b.key);
                  if (b.split()) keys.push_back(b.coef_key);
                }
              p.single_stride = true;
              p.flat = true;
            }
      }
    }
    if (quant == 0) keys.push_back(column_reduce_key(wd, hidden, arch));
  }
  return keys;
}

// Every recipe (FP8 per tensor / per token in E4M3 and E5M2, MXFP8, NVFP4)
// in each scale layout it takes.
std::vector<KernelKey> quant_keys(NormKind kind, DType dtype, int64_t hidden, const std::vector<NormMode>& modes,
                                  int arch) {
  std::vector<KernelKey> keys;
  for (unsigned r = quant::kPerTensorE4M3; r <= quant::kNvfp4; ++r)
    for (bool blocked : {false, true}) {
      if (blocked && quant::block_of(r) == 0) continue;
      const unsigned q = r << kQuantShift | (blocked ? kBlockedScales : 0u);
      for (const KernelKey& k : norm_keys(kind, dtype, hidden, modes, arch, q)) keys.push_back(k);
    }
  return keys;
}

const bool kRegistered =
    register_variants("rms_norm", [](DType d, int64_t n, const std::vector<NormMode>& m,
                                     int a) { return norm_keys(kRmsNorm, d, n, m, a); }) &&
    register_variants("layer_norm", [](DType d, int64_t n, const std::vector<NormMode>& m,
                                       int a) { return norm_keys(kLayerNorm, d, n, m, a); }) &&
    register_variants("rms_norm_quant", [](DType d, int64_t n, const std::vector<NormMode>& m,
                                           int a) { return quant_keys(kRmsNorm, d, n, m, a); }) &&
    register_variants("layer_norm_quant", [](DType d, int64_t n, const std::vector<NormMode>& m, int a) {
      return quant_keys(kLayerNorm, d, n, m, a);
    });

}  // namespace
}  // namespace rtcnorm
