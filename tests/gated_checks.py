"""The float64 reference of the gated RMSNorm and a checker that runs
rtcnorm.rms_norm_gated forward and backward on any device and compares y,
rstd, dx, dz and dW with it. Shared by the CPU and GPU tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from reference import assert_close

# (N, group sizes): narrow, odd and model widths, each with a divisor.
CASES = [
    (1, (None, 1)),
    (7, (None, 7, 1)),
    (33, (None, 11, 3)),
    (64, (None, 16)),
    (4097, (None, 241, 17)),
]
ORDERS = (True, False)
ACTIVATIONS = ("silu", "sigmoid")


def gated_reference(x, z, weight, eps, norm_before_gate, group_size, activation):
    """(y, rstd) in float64 from the upcast inputs; differentiable."""
    xd, zd = x.double(), z.double()
    act = F.silu(zd) if activation == "silu" else torch.sigmoid(zd)
    n = x.shape[-1]
    g = n if group_size is None else group_size
    h = (xd if norm_before_gate else xd * act).unflatten(-1, (n // g, g))
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    y = (h * rstd).flatten(-2)
    if weight is not None:
        y = y * weight.double()
    if norm_before_gate:
        y = y * act
    return y, rstd.squeeze(-1)


def gated_inputs(shape, dtype, device, *, weight=True, weight_dtype=None):
    x = torch.randn(shape, device=device).to(dtype)
    z = (2 * torch.randn(shape, device=device)).to(dtype)
    w = None
    if weight:
        w = (1 + 0.5 * torch.randn(shape[-1], device=device)).to(weight_dtype or dtype)
    return x, z, w


def check_gated(x, z, w, *, eps=1e-5, norm_before_gate=True, group_size=None, activation="silu", backward=True):
    """Runs the op on (x, z, w) and checks every output against the reference."""
    import rtcnorm

    kw = dict(norm_before_gate=norm_before_gate, group_size=group_size, activation=activation)
    y, rstd = torch.ops.rtcnorm.rms_norm_gated(x, z, w, eps, norm_before_gate, group_size, activation)
    ref_y, ref_rstd = gated_reference(x, z, w, eps, norm_before_gate, group_size, activation)
    assert y.dtype == x.dtype and y.is_contiguous()
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    assert rstd.dtype == stat
    assert_close(y, ref_y, what="y")
    assert_close(rstd, ref_rstd, what="rstd")
    if not backward:
        return
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, z, w)]
    out = rtcnorm.rms_norm_gated(leaves[0], leaves[1], leaves[2], eps, **kw)
    dy = torch.randn_like(out)
    out.backward(dy)
    refs = [t.detach().double().requires_grad_() if t is not None else None for t in (x, z, w)]
    ref_out, _ = gated_reference(refs[0], refs[1], refs[2], eps, norm_before_gate, group_size, activation)
    ref_out.backward(dy.double())
    rows = max(1, x.numel() // max(1, x.shape[-1]))
    # Groups of one element: dx = rstd * dn * (1 - n^2) cancels in fp32 as
    # n^2 nears 1 (as rms_norm's rows of one element do); so does dz where
    # the gate comes first (dz = dx-like term * x * act').
    scale = 10.0 if (x.shape[-1] if group_size is None else group_size) == 1 else 1.0
    assert_close(leaves[0].grad, refs[0].grad, what="dx", scale=scale)
    assert_close(leaves[1].grad, refs[1].grad, what="dz", scale=scale)
    if w is not None:
        assert_close(leaves[2].grad, refs[2].grad, what="dw", reduce_len=rows)
