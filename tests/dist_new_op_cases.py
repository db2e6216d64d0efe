"""DTensor checks of the quantized and gated norm ops (norm_quant,
rms_norm_gated, rms_norm_gated_quant), run on each rank of a gloo pool (tests/test_distributed.py):
sharded results against the op on the full tensors, float32 on CPU."""

from __future__ import annotations

import rtcnorm  # noqa: F401  (loads the ops)
import torch
import torch.distributed as dist
from dist_op_cases import close, counted, full_leaf, leaf, mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

F32 = torch.float32


def _quant(x, w, recipe, dtype, scale, layout):
    return torch.ops.rtcnorm.norm_quant(x, None, [x.shape[-1]], w, None, None, "rms_norm", recipe, dtype, scale, layout)


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _mine(full, placements):
    """This rank's rows of ``full`` under ``placements`` (Shard(0) or Replicate)."""
    if placements != (Shard(0),) or full.dim() == 0:
        return full
    return torch.chunk(full, dist.get_world_size(), dim=0)[dist.get_rank()]


def _check_quant_shards(recipe, layout, comms, sharded, full):
    """(data, scales, amax, rstd) of a sharded quantized call against the
    full call's: codes and row scales stay with the rows and need no
    collective, the amax is a Partial("max"), blocked scales gather."""
    data, scales, amax, rstd = sharded
    row = (Replicate(),) if layout == "blocked" else (Shard(0),)
    assert data.placements == row and rstd.placements == row, (recipe, data.placements)
    assert (comms == 0) == (layout == "plain"), (recipe, comms)
    # gloo moves no 8-bit float dtypes: each rank checks its own rows.
    assert torch.equal(_bytes(data.to_local()), _bytes(_mine(full[0], data.placements))), recipe
    assert torch.equal(_bytes(scales.to_local()), _bytes(_mine(full[1], scales.placements))), recipe
    if recipe in ("per_tensor", "nvfp4"):
        if layout == "plain":
            assert amax.placements == (Partial("max"),), amax.placements
        close(amax, full[2], f"amax {recipe}")
    close(rstd, full[3], f"rstd {recipe}")


def norm_quant_row_shards():
    """Codes and per-row / plain block scales stay sharded with the rows and
    need no collective; the tensor's amax is a Partial("max"); blocked
    scales gather the rows first (their tiles span the whole tensor)."""
    torch.manual_seed(5)
    x, w = torch.randn(6, 64, dtype=F32), torch.randn(64, dtype=F32)
    scale = torch.tensor([4.0])
    cases = [
        ("per_tensor", torch.float8_e4m3fn, scale, "plain"),
        ("per_token", torch.float8_e5m2, None, "plain"),
        ("mxfp8", torch.float8_e4m3fn, None, "plain"),
        ("nvfp4", torch.float4_e2m1fn_x2, scale, "blocked"),
    ]
    for recipe, dtype, s, layout in cases:
        full = _quant(x, w, recipe, dtype, s, layout)
        xd, wd = distribute_tensor(x, mesh(), [Shard(0)]), distribute_tensor(w, mesh(), [Replicate()])
        sd = distribute_tensor(s, mesh(), [Replicate()]) if s is not None else None
        (data, scales, amax, _, _, rstd), comms = counted(_quant, xd, wd, recipe, dtype, sd, layout)
        _check_quant_shards(recipe, layout, comms, (data, scales, amax, rstd), (full[0], full[1], full[2], full[5]))


def rms_norm_gated_row_shards():
    torch.manual_seed(6)
    shape = (3, 5, 32)
    x, z, dy = (torch.randn(shape, dtype=F32) for _ in range(3))
    w = torch.randn(32, dtype=F32)
    xf, zf, wf = full_leaf(x), full_leaf(z), full_leaf(w)
    yf = rtcnorm.rms_norm_gated(xf, zf, wf, 1e-6, norm_before_gate=False, group_size=8)
    yf.backward(dy)
    p = [Shard(1)]
    xd, zd, wd = leaf(x, p), leaf(z, p), leaf(w, [Replicate()])
    y, comms = counted(lambda: rtcnorm.rms_norm_gated(xd, zd, wd, 1e-6, norm_before_gate=False, group_size=8))
    assert comms == 0 and y.placements == tuple(p), (comms, y.placements)
    torch.testing.assert_close(y.full_tensor(), yf, rtol=1e-5, atol=1e-5)
    y.backward(distribute_tensor(dy, mesh(), p))
    assert wd.grad.placements == (Partial("sum"),), wd.grad.placements
    for name, a, b in [("dx", xd, xf), ("dz", zd, zf), ("dw", wd, wf)]:
        torch.testing.assert_close(a.grad.full_tensor(), b.grad, rtol=1e-5, atol=1e-5, msg=name)


def _gated_quant(x, z, w, recipe, dtype, scale, layout):
    return torch.ops.rtcnorm.rms_norm_gated_quant(x, z, w, 1e-6, True, 16, "silu", recipe, dtype, scale, layout)


def rms_norm_gated_quant_row_shards():
    """As norm_quant: codes, per-row and plain block scales follow the rows
    with no collective, the amax is a Partial("max"), blocked scales gather."""
    torch.manual_seed(7)
    x, z, w = torch.randn(6, 64, dtype=F32), torch.randn(6, 64, dtype=F32), torch.randn(64, dtype=F32)
    scale = torch.tensor([4.0])
    cases = [
        ("per_tensor", torch.float8_e4m3fn, scale, "plain"),
        ("per_token", torch.float8_e4m3fn, None, "plain"),
        ("mxfp8", torch.float8_e4m3fn, None, "blocked"),
        ("nvfp4", torch.float4_e2m1fn_x2, scale, "plain"),
    ]
    for recipe, dtype, s, layout in cases:
        full = _gated_quant(x, z, w, recipe, dtype, s, layout)
        xd, zd = (distribute_tensor(t, mesh(), [Shard(0)]) for t in (x, z))
        wd = distribute_tensor(w, mesh(), [Replicate()])
        sd = distribute_tensor(s, mesh(), [Replicate()]) if s is not None else None
        (data, scales, amax, rstd), comms = counted(_gated_quant, xd, zd, wd, recipe, dtype, sd, layout)
        _check_quant_shards(recipe, layout, comms, (data, scales, amax, rstd), (full[0], full[1], full[2], full[3]))
