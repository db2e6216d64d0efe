#include "ops/norm_common.h"

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <limits>

#include "jit/kernel_cache.h"
#include "kernels/common/quant_math.cuh"
#include "ops/grid_exchange_buffers.h"
#include "ops/norm_plan_memo.h"

namespace rtcnorm {

jit::DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return jit::DType::kFloat16;
    case at::kBFloat16:
      return jit::DType::kBFloat16;
    default:
      return jit::DType::kFloat32;
  }
}

int vec_for_ptr(const void* p, int esize, int vmax) {
  int v = vmax;
  while (v > 1 && reinterpret_cast<uintptr_t>(p) % std::min(16, v * esize) != 0) v /= 2;
  return v;
}

int vec_for_stride(int64_t stride, int vmax) {
  int v = vmax;
  while (v > 1 && stride % v != 0) v /= 2;
  return v;
}

namespace {

// Describes rows of a tensor (dims from `lead` on normalized) without a copy
// when its trailing block is contiguous and its leading dims collapse into
// at most two strided groups. Returns false otherwise.
bool row_map_of(at::IntArrayRef sizes, at::IntArrayRef strides, int64_t lead, RowMap* m) {
  int64_t expect = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= lead; --d) {
    if (sizes[d] != 1 && strides[d] != expect) return false;
    expect *= sizes[d];
  }
  // Groups of leading dims, innermost first: {rows in group, stride of its innermost dim}.
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (int64_t d = lead - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (!groups.empty() && strides[d] == groups.back().second * groups.back().first) {
      groups.back().first *= sizes[d];
      continue;
    }
    groups.push_back({sizes[d], strides[d]});
  }
  const int64_t big = std::numeric_limits<int64_t>::max();
  if (groups.empty()) {
    *m = {0, 0, big};
  } else if (groups.size() == 1) {
    *m = {0, groups[0].second, big};
  } else if (groups.size() == 2) {
    *m = {groups[1].second, groups[0].second, groups[0].first};
  } else {
    return false;
  }
  return true;
}

bool row_map_of(const at::Tensor& t, int64_t lead, RowMap* m) { return row_map_of(t.sizes(), t.strides(), lead, m); }

// Whether a map's `rows` rows are one stride (NormProblem::single_stride).
bool one_stride(const RowMap& m, int64_t rows) { return m.inner_rows >= rows; }

// Rows r at r * hidden from a 16-byte aligned base (NormProblem::flat).
bool flat_rows(const void* base, const RowMap& m, int64_t rows, int64_t hidden) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && one_stride(m, rows) && (rows == 1 || m.inner_stride == hidden);
}
bool flat_rows(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace

bool rows_single_stride(at::IntArrayRef sizes, at::IntArrayRef strides, int64_t lead) {
  RowMap m{};
  // Rows no map describes are copied contiguous first: one stride.
  if (!row_map_of(sizes, strides, lead, &m)) return true;
  int64_t rows = 1;
  for (int64_t d = 0; d < lead; ++d) rows *= sizes[d];
  return one_stride(m, rows);
}

int check_device_arch(const at::Tensor& input, const char* op) {
  const int dev = input.get_device();
  const auto& info = jit::device_info(dev);
  TORCH_CHECK(info.arch >= 80, "rtcnorm.", op, ": needs a GPU of compute capability 8.0 or newer; cuda:", dev,
              " is sm_", info.arch);
  return dev;
}

at::Tensor no_grad_placeholder(const at::Tensor& like) { return at::empty({0}, like.options()); }

// The kernels read x, its row map and the row counts before their first load;
// params.cuh keeps them at the head of each block.
static_assert(offsetof(NormFwdParams, row_blocks) == 40 && sizeof(NormFwdParams) == 184, "NormFwdParams layout");
static_assert(offsetof(NormBwdParams, row_blocks) == 40 && sizeof(NormBwdParams) == 160, "NormBwdParams layout");

int64_t norm_grid(int64_t row_blocks, bool persistent, int sm_count, const jit::LoadedKernel& k, int64_t max_units,
                  int group_ctas) {
  const int64_t cl = group_ctas > 1 ? group_ctas : k.cluster;
  int64_t units = row_blocks;
  if (persistent) {
    const int64_t resident_units = group_ctas > 1 ? int64_t{sm_count} * k.blocks_per_sm / group_ctas : k.max_clusters;
    units = cl > 1 ? std::max<int64_t>(1, std::min<int64_t>(row_blocks, resident_units))
                   : persistent_grid(row_blocks, sm_count, k.blocks_per_sm);
    units = std::max<int64_t>(1, std::min(units, max_units));
  }
  return std::min<int64_t>(units, std::numeric_limits<int32_t>::max() / cl) * cl;
}

// A grid group's CTAs must all be resident at once (a cooperative launch);
// `tunable` is the rtcnorm._tuning override that turns groups off.
static void check_grid_group_fits(const char* op, const jit::KernelKey& key, const jit::LoadedKernel& k, int sm_count,
                                  const char* tunable) {
  const int group_ctas = grid_group_ctas(key);
  const int64_t resident = int64_t{sm_count} * k.blocks_per_sm;
  TORCH_CHECK(group_ctas == 1 || resident >= group_ctas, "rtcnorm.", op, ": kernel ", key.describe(), " needs ",
              group_ctas, " CTAs resident at once; this device holds ", resident, " (set rtcnorm._tuning ", tunable,
              "=1)");
}

// p.exchange of a kGridExchange launch (kernels/common/grid_exchange.cuh's
// layout): kGridExchangeSlots slots per (CTA, row group), each of 2 tagged
// 8-byte words for partials of up to two floats or 4 for three, leased with a
// tag range of the launch's own (ops/grid_exchange_buffers.h). An empty
// lease for other launches.
static GridExchangeLease grid_exchange_words(const jit::KernelKey& key, int64_t grid, int floats, int64_t row_blocks,
                                             const at::Tensor& like, jit::CUstream stream) {
  if ((key.flags & kGridExchange) == 0) return {};
  const int64_t words = grid_slot_words_for(floats);
  const int64_t slots = int64_t{kGridExchangeSlots} * grid * key.rows_per_cta;
  return lease_grid_exchange(slots * words * 2, row_blocks, like, stream);
}

NormFwdOutputs norm_forward_cuda(NormKind kind, const char* op, const at::Tensor& input,
                                 const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
                                 const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                 double eps, NormMode mode, bool zero_centered, const QuantLaunch* quant) {
  const NormDims d = norm_dims(input, normalized_shape);
  c10::DeviceGuard guard(input.device());
  NormFwdOutputs out;
  if (quant == nullptr) out.y = at::empty(input.sizes(), input.options());
  out.rstd = at::empty(stat_shape(input, d.lead), input.options().dtype(at::kFloat));
  if (kind == kLayerNorm) out.mean = at::empty(stat_shape(input, d.lead), input.options().dtype(at::kFloat));
  if (residual.has_value()) out.h = at::empty(input.sizes(), input.options());
  if (d.rows == 0) return out;

  at::Tensor x = input;
  RowMap xmap{};
  if (!row_map_of(x, d.lead, &xmap)) {
    x = input.contiguous();
    row_map_of(x, d.lead, &xmap);
  }
  at::Tensor r;
  RowMap rmap{};
  if (residual.has_value()) {
    r = *residual;
    if (!row_map_of(r, d.lead, &rmap)) {
      r = residual->contiguous();
      row_map_of(r, d.lead, &rmap);
    }
  }
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();

  NormProblem p;
  p.kind = kind;
  p.dtype = to_dtype(input.scalar_type());
  p.wdtype = w.defined() ? to_dtype(w.scalar_type()) : (b.defined() ? to_dtype(b.scalar_type()) : p.dtype);
  p.rows = d.rows;
  p.hidden = d.hidden;
  p.has_weight = w.defined();
  p.has_bias = b.defined();
  p.zero_centered = zero_centered && w.defined();
  p.residual = residual.has_value();
  p.single_stride = one_stride(xmap, d.rows) && (!r.defined() || one_stride(rmap, d.rows));
  p.flat = flat_rows(x.data_ptr(), xmap, d.rows, d.hidden) &&
           (!r.defined() || flat_rows(r.data_ptr(), rmap, d.rows, d.hidden));
  p.quant = quant != nullptr ? quant->flags : 0u;
  const int esize = jit::element_size(p.dtype);
  const int wsize = jit::element_size(p.wdtype);
  int v = 16 / esize;
  v = vec_for_ptr(x.data_ptr(), esize, v);
  v = vec_for_stride(xmap.inner_stride, vec_for_stride(xmap.outer_stride, v));
  if (r.defined()) {
    v = vec_for_ptr(r.data_ptr(), esize, v);
    v = vec_for_stride(rmap.inner_stride, vec_for_stride(rmap.outer_stride, v));
  }
  if (w.defined()) v = vec_for_ptr(w.data_ptr(), wsize, v);
  if (b.defined()) v = vec_for_ptr(b.data_ptr(), wsize, v);
  p.max_vec = v;

  const int dev = check_device_arch(input, op);
  const auto& info = jit::device_info(dev);
  const NormFwdPlan plan = memo_plan_norm_fwd(p, mode, dev);
  const jit::CUstream stream = jit::current_stream(dev);
  const jit::LoadedKernel& k = jit::get_kernel(plan.key, dev, stream, plan.smem);
  const int group_ctas = grid_group_ctas(plan.key);
  check_grid_group_fits(op, plan.key, k, info.sm_count, "fwd_grid_exchange");
  const int64_t grid =
      norm_grid(plan.row_blocks, plan.persistent, info.sm_count, k, std::numeric_limits<int64_t>::max(), group_ctas);

  NormFwdParams prm{};
  prm.x = x.data_ptr();
  prm.x_map = xmap;
  prm.residual = r.defined() ? r.data_ptr() : nullptr;
  prm.residual_map = rmap;
  prm.weight = w.defined() ? w.data_ptr() : nullptr;
  prm.bias = b.defined() ? b.data_ptr() : nullptr;
  prm.y = quant != nullptr ? quant->data.data_ptr() : out.y.data_ptr();
  if (quant != nullptr) {
    prm.scales = quant::per_tensor(p.recipe()) ? nullptr : quant->scales.data_ptr();
    prm.amax = quant->amax.numel() > 0 ? quant->amax.data_ptr<float>() : nullptr;
    prm.qscale_ptr = quant->scale_ptr;
    prm.qscale = quant->scale;
    prm.scale_cols = static_cast<int>(quant->scale_cols);
  }
  prm.h = out.h.defined() ? out.h.data_ptr() : nullptr;
  prm.mean = out.mean.defined() ? out.mean.data_ptr<float>() : nullptr;
  prm.rstd = out.rstd.data_ptr<float>();
  prm.rows = d.rows;
  prm.row_blocks = plan.row_blocks;
  prm.eps = static_cast<float>(eps);
  const bool grid_exchange = (plan.key.flags & kGridExchange) != 0;
  const GridExchangeLease exchange =
      grid_exchange_words(plan.key, grid, kind == kLayerNorm ? 3 : 1, plan.row_blocks, input, stream);
  prm.exchange = exchange.words;
  prm.exchange_base = exchange.tag_base;
  jit::launch(k, static_cast<unsigned>(grid), 1, static_cast<unsigned>(plan.key.threads()), 1, stream, &prm, false,
              grid_exchange);
  return out;
}

NormBwdOutputs norm_backward_cuda(NormKind kind, const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                                  const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                                  const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                  at::IntArrayRef normalized_shape, bool zero_centered, bool want_dw, bool want_db,
                                  const std::optional<at::Tensor>& grad_h) {
  const NormDims d = norm_dims(input, normalized_shape);
  want_dw = want_dw && weight.has_value();
  want_db = want_db && bias.has_value();
  c10::DeviceGuard guard(input.device());
  NormBwdOutputs out;
  out.dx = at::empty(input.sizes(), input.options());
  out.dw = want_dw ? at::empty(weight->sizes(), weight->options()) : no_grad_placeholder(input);
  if (kind == kLayerNorm) out.db = want_db ? at::empty(bias->sizes(), bias->options()) : no_grad_placeholder(input);
  if (d.rows == 0) {
    if (want_dw) out.dw.zero_();
    if (want_db) out.db.zero_();
    return out;
  }
  at::Tensor x = input;
  RowMap xmap{};
  if (!row_map_of(x, d.lead, &xmap)) {
    x = input.contiguous();
    row_map_of(x, d.lead, &xmap);
  }
  const at::Tensor dy = grad_out.contiguous();
  const at::Tensor dh = grad_h.has_value() ? grad_h->contiguous() : at::Tensor();
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  const at::Tensor rs = rstd.contiguous();
  const at::Tensor mu = mean.has_value() ? mean->contiguous() : at::Tensor();

  NormProblem p;
  p.kind = kind;
  p.dtype = to_dtype(input.scalar_type());
  p.wdtype = w.defined() ? to_dtype(w.scalar_type()) : (bias.has_value() ? to_dtype(bias->scalar_type()) : p.dtype);
  p.rows = d.rows;
  p.hidden = d.hidden;
  p.has_weight = w.defined();
  p.has_bias = bias.has_value();
  p.zero_centered = zero_centered && w.defined();
  p.single_stride = one_stride(xmap, d.rows);
  p.flat = flat_rows(x.data_ptr(), xmap, d.rows, d.hidden) && flat_rows(dy) && (!dh.defined() || flat_rows(dh));
  const int esize = jit::element_size(p.dtype);
  int v = 16 / esize;
  v = vec_for_ptr(x.data_ptr(), esize, v);
  v = vec_for_stride(xmap.inner_stride, vec_for_stride(xmap.outer_stride, v));
  v = vec_for_ptr(dy.data_ptr(), esize, v);
  if (dh.defined()) v = vec_for_ptr(dh.data_ptr(), esize, v);
  if (w.defined()) v = vec_for_ptr(w.data_ptr(), jit::element_size(p.wdtype), v);
  p.max_vec = v;

  const int dev = check_device_arch(input, op);
  const auto& info = jit::device_info(dev);
  const NormBwdPlan plan = memo_plan_norm_bwd(p, want_dw, want_db, dh.defined(), dev);
  const jit::CUstream stream = jit::current_stream(dev);
  const jit::LoadedKernel& k = jit::get_kernel(plan.key, dev, stream, plan.smem);
  // Partial rows: one per persistent CTA (or cluster), or one per row tile when split.
  SplitGrid split;
  if (plan.split()) split = split_grid(plan, d.rows, info.sm_count);
  // kColumnGrads: a row CTA per row block, then the column CTAs.
  const bool column_grads = (plan.key.flags & kColumnGrads) != 0;
  // kGridExchange: a row's slices are a group of CTAs of a cooperative launch.
  const bool grid_exchange = (plan.key.flags & kGridExchange) != 0;
  const int group_ctas = grid_group_ctas(plan.key);
  check_grid_group_fits(op, plan.key, k, info.sm_count, "bwd_grid_exchange");
  const int64_t grid = plan.split()   ? split.col_tiles
                       : column_grads ? plan.row_blocks + plan.col_ctas
                                      : norm_grid(plan.row_blocks, true, info.sm_count, k, plan.max_units, group_ctas);
  const int64_t parts = plan.split() ? split.row_tiles : grid / grid_unit_ctas(plan.key);
  // kDirectGrads: one CTA (cluster) owns every row and writes dW / dB itself.
  const bool direct = (plan.key.flags & kDirectGrads) != 0;
  TORCH_INTERNAL_ASSERT(!direct || parts == 1, op, ": direct gradients need a grid of one row block");
  // The backward kernel writes dW / dB itself (that CTA, or the column CTAs):
  // no partial rows, no column reduce.
  const bool grads_in_kernel = direct || column_grads;
  // dW's and dB's partial rows (parts x N floats each) share one allocation.
  at::Tensor partials, coef;
  float* pw = nullptr;
  float* pb = nullptr;
  const int64_t partial_sets = grads_in_kernel ? 0 : int64_t{want_dw} + int64_t{want_db};
  if (partial_sets > 0) {
    partials = at::empty({partial_sets * parts * d.hidden}, input.options().dtype(at::kFloat));
    float* base = partials.data_ptr<float>();
    if (want_dw) pw = base;
    if (want_db) pb = base + (partial_sets - 1) * parts * d.hidden;
  }

  NormBwdParams prm{};
  prm.dy = dy.data_ptr();
  prm.dh = dh.defined() ? dh.data_ptr() : nullptr;
  prm.x = x.data_ptr();
  prm.x_map = xmap;
  prm.weight = w.defined() ? w.data_ptr() : nullptr;
  prm.mean = mu.defined() ? mu.data_ptr<float>() : nullptr;
  prm.rstd = rs.data_ptr<float>();
  prm.dx = out.dx.data_ptr();
  prm.partial_w = pw;
  prm.partial_b = pb;
  prm.dw = grads_in_kernel && want_dw ? out.dw.data_ptr() : nullptr;
  prm.db = grads_in_kernel && want_db ? out.db.data_ptr() : nullptr;
  prm.rows = d.rows;
  prm.row_blocks = plan.row_blocks;
  prm.col_vecs = static_cast<int>(plan.col_vecs);
  if (plan.split()) {
    coef = at::empty({d.rows, 2}, input.options().dtype(at::kFloat));
    prm.row_coef = coef.data_ptr<float>();
    prm.rows_per_tile = split.rows_per_tile;
    const jit::LoadedKernel& ck = jit::get_kernel(plan.coef_key, dev, stream, 0);
    jit::launch(ck, static_cast<unsigned>(d.rows), 1, static_cast<unsigned>(plan.coef_key.threads()), 1, stream, &prm);
  }
  const GridExchangeLease exchange = grid_exchange_words(plan.key, grid, 2, plan.row_blocks, input, stream);
  prm.exchange = exchange.words;
  prm.exchange_base = exchange.tag_base;
  // After the coefficient kernel, the column kernel may launch programmatically (jit::launch: on sm_90+).
  jit::launch(k, static_cast<unsigned>(grid), static_cast<unsigned>(plan.split() ? split.row_tiles : 1),
              static_cast<unsigned>(plan.key.threads()), 1, stream, &prm, plan.split(), grid_exchange);

  if (partial_sets > 0) {
    ColumnReduceParams rp{};
    unsigned outputs = 0;
    for (auto [partial, result] : {std::pair<float*, at::Tensor*>{pw, &out.dw}, {pb, &out.db}}) {
      if (partial == nullptr) continue;
      rp.partial[outputs] = partial;
      rp.out[outputs] = result->data_ptr();
      ++outputs;
    }
    rp.parts = static_cast<int>(parts);
    rp.cols = static_cast<int>(d.hidden);
    // dW and dB share a dtype (checked with the arguments).
    const jit::KernelKey rk = column_reduce_key(p.wdtype, d.hidden, info.arch);
    const jit::LoadedKernel& rkern = jit::get_kernel(rk, dev, stream, 0);
    const int64_t col_threads = d.hidden / rk.vec;
    jit::launch(rkern, static_cast<unsigned>((col_threads + 31) / 32), outputs, 32, 16, stream, &rp, true);
  }
  return out;
}

}  // namespace rtcnorm
