// The CUDA path of the gated RMSNorm (ops/norm/gated.h): the register-row
// plan, and the launches of rms_norm_gated.cuh's kernels and of the dW
// column reduce. Shapes no plan covers run the ATen composite path.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>

#include "jit/kernel_cache.h"
#include "kernels/common/params.cuh"
#include "kernels/common/quant_math.cuh"
#include "kernels/norm/gated_params.cuh"
#include "ops/norm/gated.h"
#include "ops/norm/kernel_families.h"
#include "ops/norm/launch_geometry.h"
#include "ops/norm_common.h"
#include "ops/plan_util.h"

namespace rtcnorm {
namespace {

static_assert(sizeof(GatedFwdParams) == 112 && sizeof(GatedBwdParams) == 96, "gated params layout");

// KernelKey: hidden = N, variant = S (segments of a row; G = N / S),
// threads_per_row = threads of a row slot, rows_per_cta = row slots.
std::string gated_expression(const char* kernel, const jit::KernelKey& k) {
  std::ostringstream os;
  os << "rtcnorm::" << kernel << "<" << jit::kernel_type_name(k.dtype) << ", " << jit::kernel_type_name(k.wdtype)
     << ", " << k.hidden << ", " << k.hidden / k.variant << ", " << k.vec << ", " << k.threads_per_row << ", "
     << k.rows_per_cta << ", " << k.vecs_per_thread << ", " << k.flags << "u>";
  return os.str();
}

const jit::KernelFamily kGatedFwd{"rms_norm_gated_fwd", "rms_norm_gated.cuh",
                                  [](const jit::KernelKey& k) { return gated_expression("rms_norm_gated_fwd", k); }};
const jit::KernelFamily kGatedBwd{"rms_norm_gated_bwd", "rms_norm_gated.cuh",
                                  [](const jit::KernelKey& k) { return gated_expression("rms_norm_gated_bwd", k); }};

// Threads a CTA may have: the launch bounds then leave 128 registers a thread.
constexpr int kMaxThreads = 512;
// Elements a thread keeps of a segment (NV * VEC), for 16-bit rows and
// half that for float32 ones: the forward keeps x and z packed (or h), the
// backward x, z, dy and its dW sums, within 128 registers.
constexpr int kFwdMaxElems = 64, kBwdMaxElems = 32;
// Vectors a thread takes before a segment gets more threads. The forward's
// two make 16-bit rows CTAs of up to 512 threads at about 40 registers,
// three of them an SM: more warps to cover each row's reduction and act(z)
// than four vectors at 256 threads (H200, docs/history.md entry 92).
constexpr int kFwdTargetVecs = 2, kBwdTargetVecs = 4;
// Threads a CTA has at least (whole warps, row slots added to reach them).
constexpr int kMinThreads = 128;
// Registers a thread of a one-segment row takes (ptxas, bf16, sm_90:
// forward 40-44, backward 104-135), and an SM's threads and registers: how
// many CTAs of a launch shape an SM holds.
constexpr int64_t kFwdRegs = 40, kBwdRegs = 128, kSmThreads = 2048, kSmRegs = 65536;
// The backward's row slots sum their dW through ROWS x N floats of static
// shared memory: at most 32 KB.
constexpr int64_t kMaxCombineFloats = 8192;

// A row's x or gate as (tensor, row stride): the leading dims collapse into
// one stride and the last dim is contiguous, else a contiguous copy.
std::pair<at::Tensor, int64_t> row_strided(const at::Tensor& t, int64_t n) {
  const int64_t nd = t.dim();
  bool ok = n == 1 || t.stride(nd - 1) == 1;
  int64_t stride = n, span = 0;  // span: rows covered by the dims seen so far
  for (int64_t d = nd - 2; d >= 0 && ok; --d) {
    if (t.size(d) == 1) continue;
    if (span == 0) {
      stride = t.stride(d);
      span = t.size(d);
    } else {
      ok = t.stride(d) == stride * span;
      span *= t.size(d);
    }
  }
  if (ok) return {t, stride};
  return {t.contiguous(), n};
}

}  // namespace

std::optional<jit::KernelKey> gated_key(const GatedProblem& p, bool backward, bool want_dw, int arch) {
  const int esize = jit::element_size(p.dtype);
  int vec = std::min(16 / esize, p.max_vec);
  while (vec > 1 && p.group % vec != 0) vec /= 2;
  const int64_t sv = p.group / vec;  // vectors of a segment
  const int64_t s = p.hidden / p.group;
  if (s > kMaxThreads) return std::nullopt;
  // A quantized forward (quant_epilogue.cuh): a block lies within one
  // segment, its vectors on lanes of one group; a per-token row's amax is
  // reduced over whole warps or a power-of-two lane group.
  const unsigned qflags = backward ? 0u : p.quant;
  const unsigned recipe = (qflags & kQuantBits) >> kQuantShift;
  const int block = quant::block_of(recipe);
  if (block > 0 && s > 1 && p.group % block != 0) return std::nullopt;
  // Block recipes keep at most two vectors a thread too: with four 8-wide
  // vectors (RT 128) sm_80's software conversions spilled a few bytes.
  const int64_t min_tpr = block > 0 ? block / vec : 1;
  const int64_t target = backward ? kBwdTargetVecs : kFwdTargetVecs;
  int64_t tpr = 1;
  while ((tpr < min_tpr || ceil_div(sv, tpr) > target) && tpr * 2 * s <= kMaxThreads) tpr *= 2;
  if (tpr < min_tpr) return std::nullopt;
  // One segment of at least kMinThreads: the fewest whole warps that keep
  // `target` vectors a thread, where that fits more CTAs (rows) an SM than
  // the power of two. 5120 wide: 320 forward threads, 4 CTAs an SM instead of
  // 3 at 512 (1.12-1.55x on H200). Where both fit as many (6256 and 6912
  // wide), the power of two's extra warps ran 1-5% faster. Narrower rows keep
  // a power of two: two slots of three warps ran 5-8% slower than one of four
  // (docs/history.md entries 94-95).
  if (s == 1) {
    const int64_t whole = std::max<int64_t>(kMinThreads, ceil_div(ceil_div(sv, target), 32) * 32);
    const int64_t regs = backward ? kBwdRegs : kFwdRegs;
    const auto ctas = [regs](int64_t t) { return std::min(kSmThreads / t, kSmRegs / (regs * t)); };
    if (whole < tpr && ctas(whole) > ctas(tpr)) tpr = whole;
  }
  if (quant::per_token(recipe)) {
    const auto lane_group = [s](int64_t t) { return t * s % 32 == 0 || (t * s < 32 && (t * s & (t * s - 1)) == 0); };
    while (!lane_group(tpr) && tpr * 2 * s <= kMaxThreads) tpr *= 2;
    if (!lane_group(tpr)) return std::nullopt;
  }
  const int64_t nv = ceil_div(sv, tpr);
  const int64_t max_elems = (backward ? kBwdMaxElems : kFwdMaxElems) / (esize == 4 ? 2 : 1);
  if (nv * vec > max_elems) return std::nullopt;
  const int64_t rt = tpr * s;
  int64_t rows = 1;
  while ((rt * rows < kMinThreads || rt * rows % 32 != 0) && rt * rows <= kMaxThreads) ++rows;
  if (rt * rows > kMaxThreads) return std::nullopt;
  if (backward && rows > 1 && rows * p.hidden > kMaxCombineFloats) return std::nullopt;
  jit::KernelKey k;
  k.family = backward ? &kGatedBwd : &kGatedFwd;
  k.dtype = p.dtype;
  k.wdtype = p.has_weight ? p.wdtype : p.dtype;
  k.hidden = static_cast<int32_t>(p.hidden);
  k.variant = static_cast<int16_t>(s);
  k.vec = static_cast<int16_t>(vec);
  k.threads_per_row = static_cast<int16_t>(rt);
  k.rows_per_cta = static_cast<int16_t>(rows);
  k.vecs_per_thread = static_cast<int16_t>(nv);
  k.flags = (p.has_weight ? kGatedWeight : 0u) | (p.norm_first ? kGatedNormFirst : 0u) |
            (p.sigmoid ? kGatedSigmoid : 0u) | (backward && want_dw && p.has_weight ? kGatedWantDw : 0u) | qflags;
  k.arch = static_cast<int16_t>(arch);
  return k;
}

GatedProblem gated_problem(jit::DType dtype, std::optional<jit::DType> wdtype, bool norm_first, const GatedArgs& a) {
  GatedProblem p;
  p.dtype = dtype;
  p.wdtype = wdtype.value_or(dtype);
  p.hidden = a.hidden;
  p.group = a.group;
  p.has_weight = wdtype.has_value();
  p.norm_first = norm_first;
  p.sigmoid = a.sigmoid;
  return p;
}

namespace {

GatedProblem problem_of(const at::Tensor& x, const std::optional<at::Tensor>& weight, bool norm_first,
                        const GatedArgs& a) {
  const std::optional<jit::DType> wd =
      weight.has_value() ? std::optional<jit::DType>(to_dtype(weight->scalar_type())) : std::nullopt;
  return gated_problem(to_dtype(x.scalar_type()), wd, norm_first, a);
}

int vec_of(int v, const at::Tensor& t, int64_t stride) {
  v = vec_for_ptr(t.data_ptr(), static_cast<int>(t.element_size()), v);
  return vec_for_stride(stride, v);
}

}  // namespace

namespace {

// The planned forward kernel into y (or q's outputs), and rstd; false where
// no plan covers the problem.
bool launch_forward(const at::Tensor& input, const at::Tensor& gate, const std::optional<at::Tensor>& weight,
                    double eps, bool norm_first, const GatedArgs& a, const at::Tensor& y, const at::Tensor& rstd,
                    const QuantLaunch* q) {
  const auto [x, xs] = row_strided(input, a.hidden);
  const auto [z, zs] = row_strided(gate, a.hidden);
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  GatedProblem p = problem_of(input, weight, norm_first, a);
  int v = vec_of(vec_of(16, x, xs), z, zs);
  if (w.defined()) v = vec_of(v, w, 0);
  p.max_vec = v;
  p.quant = q != nullptr ? q->flags : 0u;
  const int dev = check_device_arch(input, "rms_norm_gated");
  const auto& info = jit::device_info(dev);
  const auto key = gated_key(p, false, false, info.arch);
  if (!key.has_value()) return false;

  const jit::CUstream stream = jit::current_stream(dev);
  const jit::LoadedKernel& k = jit::get_kernel(*key, dev, stream, 0);
  GatedFwdParams prm{};
  prm.x = x.data_ptr();
  prm.z = z.data_ptr();
  prm.x_stride = xs;
  prm.z_stride = zs;
  prm.rows = a.rows;
  prm.row_blocks = ceil_div(a.rows, key->rows_per_cta);
  prm.weight = w.defined() ? w.data_ptr() : nullptr;
  prm.y = q != nullptr ? q->data.data_ptr() : y.data_ptr();
  prm.rstd = rstd.data_ptr<float>();
  prm.eps = static_cast<float>(eps);
  if (q != nullptr) {
    prm.scales = q->scales.data_ptr();
    prm.amax = q->amax.numel() > 0 ? q->amax.data_ptr<float>() : nullptr;
    prm.qscale_ptr = q->scale_ptr;
    prm.qscale = q->scale;
    prm.scale_cols = static_cast<int>(q->scale_cols);
  }
  const int64_t grid = std::min<int64_t>(prm.row_blocks, std::numeric_limits<int32_t>::max());
  jit::launch(k, static_cast<unsigned>(grid), 1, static_cast<unsigned>(key->threads()), 1, stream, &prm);
  return true;
}

}  // namespace

GatedFwdOut gated_forward_cuda(const at::Tensor& input, const at::Tensor& gate, const std::optional<at::Tensor>& weight,
                               double eps, bool norm_first, const GatedArgs& a) {
  c10::DeviceGuard guard(input.device());
  GatedFwdOut out{at::empty(input.sizes(), input.options()),
                  at::empty(gated_stat_shape(input, a), input.options().dtype(at::kFloat))};
  if (a.rows == 0) return out;
  if (!launch_forward(input, gate, weight, eps, norm_first, a, out.y, out.rstd, nullptr))
    return gated_forward_ref(input, gate, weight, eps, norm_first, a);
  return out;
}

std::optional<at::Tensor> gated_quant_forward_cuda(const at::Tensor& input, const at::Tensor& gate,
                                                   const std::optional<at::Tensor>& weight, double eps, bool norm_first,
                                                   const GatedArgs& a, const QuantLaunch& q) {
  c10::DeviceGuard guard(input.device());
  at::Tensor rstd = at::empty(gated_stat_shape(input, a), input.options().dtype(at::kFloat));
  if (a.rows == 0) return rstd;
  if (!launch_forward(input, gate, weight, eps, norm_first, a, at::Tensor(), rstd, &q)) return std::nullopt;
  return rstd;
}

GatedBwdOut gated_backward_cuda(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& gate,
                                const at::Tensor& rstd, const std::optional<at::Tensor>& weight, bool norm_first,
                                bool want_dw, const GatedArgs& a) {
  c10::DeviceGuard guard(input.device());
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  GatedBwdOut out;
  if (a.rows == 0) {
    out.dx = at::empty(input.sizes(), input.options());
    out.dz = at::empty(input.sizes(), input.options());
    out.dw = want_dw ? at::zeros({a.hidden}, w.options()) : at::empty({0}, input.options());
    return out;
  }
  const auto [x, xs] = row_strided(input, a.hidden);
  const auto [z, zs] = row_strided(gate, a.hidden);
  const at::Tensor dy = grad_out.contiguous();
  const at::Tensor rs = rstd.contiguous();
  GatedProblem p = problem_of(input, weight, norm_first, a);
  int v = vec_of(vec_of(vec_of(16, x, xs), z, zs), dy, a.hidden);
  if (w.defined()) v = vec_of(v, w, 0);
  p.max_vec = v;
  const int dev = check_device_arch(input, "rms_norm_gated_backward");
  const auto& info = jit::device_info(dev);
  const auto key = gated_key(p, true, want_dw, info.arch);
  if (!key.has_value()) return gated_backward_ref(grad_out, input, gate, rstd, weight, norm_first, want_dw, a);

  out.dx = at::empty(input.sizes(), input.options());
  out.dz = at::empty(input.sizes(), input.options());
  out.dw = want_dw ? at::empty({a.hidden}, w.options()) : at::empty({0}, input.options());
  const jit::CUstream stream = jit::current_stream(dev);
  const jit::LoadedKernel& k = jit::get_kernel(*key, dev, stream, 0);
  const int64_t row_blocks = ceil_div(a.rows, key->rows_per_cta);
  const int64_t grid = persistent_grid(row_blocks, info.sm_count, k.blocks_per_sm);
  at::Tensor partials;
  if (want_dw) partials = at::empty({grid, a.hidden}, input.options().dtype(at::kFloat));
  GatedBwdParams prm{};
  prm.x = x.data_ptr();
  prm.z = z.data_ptr();
  prm.x_stride = xs;
  prm.z_stride = zs;
  prm.rows = a.rows;
  prm.row_blocks = row_blocks;
  prm.dy = dy.data_ptr();
  prm.rstd = rs.data_ptr<float>();
  prm.weight = w.defined() ? w.data_ptr() : nullptr;
  prm.dx = out.dx.data_ptr();
  prm.dz = out.dz.data_ptr();
  prm.partial_w = want_dw ? partials.data_ptr<float>() : nullptr;
  jit::launch(k, static_cast<unsigned>(grid), 1, static_cast<unsigned>(key->threads()), 1, stream, &prm);
  if (want_dw) {
    ColumnReduceParams rp{};
    rp.partial[0] = partials.data_ptr<float>();
    rp.out[0] = out.dw.data_ptr();
    rp.parts = static_cast<int>(grid);
    rp.cols = static_cast<int>(a.hidden);
    const jit::KernelKey rk = column_reduce_key(p.wdtype, a.hidden, info.arch);
    const jit::LoadedKernel& rkern = jit::get_kernel(rk, dev, stream, 0);
    const int64_t col_threads = a.hidden / rk.vec;
    jit::launch(rkern, static_cast<unsigned>((col_threads + 31) / 32), 1, 32, 16, stream, &rp);
  }
  return out;
}

}  // namespace rtcnorm
