// The ATen composite paths of the gated RMSNorm (ops/norm/gated.h): the CPU
// implementation the kernels are tested against, and the CUDA fallback for
// shapes no register-row plan covers. Upcast inputs, fp32 math (fp64 for
// fp64 input), outputs rounded once to the input's dtype.
#include <ATen/ATen.h>

#include <vector>

#include "ops/norm/gated.h"
#include "ops/norm_checks.h"

namespace rtcnorm {
namespace {

// A tensor of input's shape viewed as lead dims + (N / G, G).
at::Tensor grouped(const at::Tensor& t, const GatedArgs& a) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end() - 1);
  shape.push_back(a.hidden / a.group);
  shape.push_back(a.group);
  return t.reshape(shape);
}

// act(z) and, when asked, its derivative.
at::Tensor activation(const at::Tensor& zf, bool sigmoid, at::Tensor* dact) {
  const at::Tensor s = zf.sigmoid();
  if (sigmoid) {
    if (dact != nullptr) *dact = s * (1 - s);
    return s;
  }
  if (dact != nullptr) *dact = s * (1 + zf * (1 - s));
  return zf * s;
}

}  // namespace

GatedFwdOut gated_forward_ref(const at::Tensor& x, const at::Tensor& z, const std::optional<at::Tensor>& weight,
                              double eps, bool norm_first, const GatedArgs& a, bool keep_float) {
  const at::ScalarType acc = stat_dtype(x);
  const at::Tensor xf = x.to(acc);
  const at::Tensor act = activation(z.to(acc), a.sigmoid, nullptr);
  const at::Tensor h = grouped(norm_first ? xf : xf * act, a);
  const at::Tensor rstd = (h.pow(2).mean(-1, /*keepdim=*/true) + eps).rsqrt();
  at::Tensor y = (h * rstd).reshape(x.sizes());
  if (weight.has_value()) y = y * weight->to(acc);
  if (norm_first) y = y * act;
  return {(keep_float ? y : y.to(x.scalar_type())).contiguous(), rstd.squeeze(-1).contiguous()};
}

GatedBwdOut gated_backward_ref(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& z, const at::Tensor& rstd,
                               const std::optional<at::Tensor>& weight, bool norm_first, bool want_dw,
                               const GatedArgs& a) {
  const at::ScalarType acc = stat_dtype(x);
  const at::Tensor xf = x.to(acc);
  const at::Tensor zf = z.to(acc);
  const at::Tensor dyf = dy.to(acc);
  at::Tensor dact;
  const at::Tensor act = activation(zf, a.sigmoid, &dact);
  const at::Tensor rs = rstd.to(acc).reshape(gated_stat_shape(x, a)).unsqueeze(-1);
  const at::Tensor n = grouped(norm_first ? xf : xf * act, a) * rs;
  const at::Tensor nf = n.reshape(x.sizes());
  const at::Tensor wdy = weight.has_value() ? dyf * weight->to(acc) : dyf;
  const at::Tensor dn = grouped(norm_first ? wdy * act : wdy, a);
  const at::Tensor c = (dn * n).mean(-1, /*keepdim=*/true);
  const at::Tensor dh = (rs * (dn - n * c)).reshape(x.sizes());
  GatedBwdOut out;
  if (norm_first) {
    out.dx = dh;
    out.dz = wdy * nf * dact;
  } else {
    out.dx = dh * act;
    out.dz = dh * xf * dact;
  }
  out.dx = out.dx.to(x.scalar_type()).contiguous();
  out.dz = out.dz.to(x.scalar_type()).contiguous();
  if (want_dw) {
    const at::Tensor term = norm_first ? dyf * nf * act : dyf * nf;
    out.dw = term.reshape({a.rows, a.hidden}).sum(0).to(weight->scalar_type());
  } else {
    out.dw = at::empty({0}, x.options());
  }
  return out;
}

}  // namespace rtcnorm
