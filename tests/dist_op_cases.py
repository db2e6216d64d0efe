"""DTensor-level checks of every rtcnorm op, run on each rank of a gloo pool
(tests/test_distributed.py). Every rank builds the same full tensors (fixed
seeds), shards them, and compares the DTensor results with the op on the full
tensors; float64 throughout, so only summation order may differ."""

from __future__ import annotations

import rtcnorm
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

F64 = torch.float64
TIGHT = {"rtol": 1e-10, "atol": 1e-10}


def mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),))


def leaf(t: torch.Tensor, placements) -> DTensor:
    return distribute_tensor(t.detach().clone(), mesh(), placements).requires_grad_()


def full_leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def close(actual, expected, what: str) -> None:
    if isinstance(actual, DTensor):
        actual = actual.full_tensor()
    torch.testing.assert_close(actual, expected, **TIGHT, msg=lambda m: f"{what}: {m}")


def counted(fn, *args):
    """fn(*args) under CommDebugMode: (result, number of collectives it issued)."""
    with CommDebugMode() as comm:
        out = fn(*args)
    return out, comm.get_total_counts()


def _rms_case(shape, normalized_shape, placements):
    torch.manual_seed(1)
    x, dy, w = torch.randn(shape, dtype=F64), torch.randn(shape, dtype=F64), torch.randn(normalized_shape, dtype=F64)
    xf, wf = full_leaf(x), full_leaf(w)
    yf, rstd_f = torch.ops.rtcnorm.rms_norm(xf, list(normalized_shape), wf, 1e-6)
    yf.backward(dy)
    xd, wd = leaf(x, placements), leaf(w, [Replicate()])
    (y, rstd), comms = counted(lambda: torch.ops.rtcnorm.rms_norm(xd, list(normalized_shape), wd, 1e-6))
    return xf, wf, yf, rstd_f, xd, wd, y, rstd, comms, dy


def rms_norm_leading_dims():
    # Even, uneven (5 and 3 over 2 ranks) and empty-on-some-rank (1 row) shards.
    for shape, p in [((4, 3, 16), Shard(0)), ((5, 3, 16), Shard(0)), ((4, 3, 16), Shard(1)), ((1, 16), Shard(0))]:
        xf, wf, yf, rstd_f, xd, wd, y, rstd, comms, dy = _rms_case(shape, shape[-1:], [p])
        assert comms == 0, f"{shape} {p}: forward issued {comms} collectives"
        assert y.placements == (p,) and rstd.placements == (p,), (y.placements, rstd.placements)
        close(y, yf, f"y {shape} {p}")
        close(rstd, rstd_f, f"rstd {shape} {p}")
        dyd = distribute_tensor(dy, mesh(), [p])
        _, comms = counted(y.backward, dyd)
        assert comms == 0, f"{shape} {p}: backward issued {comms} collectives"
        assert wd.grad.placements == (Partial("sum"),), wd.grad.placements
        close(xd.grad, xf.grad, f"dx {shape} {p}")
        close(wd.grad, wf.grad, f"dw {shape} {p}")


def rms_norm_replicated():
    xf, wf, yf, _, xd, wd, y, _, comms, dy = _rms_case((3, 8), (8,), [Replicate()])
    y.backward(distribute_tensor(dy, mesh(), [Replicate()]))
    assert comms == 0 and y.placements == (Replicate(),) and wd.grad.placements == (Replicate(),)
    close(y, yf, "y")
    close(wd.grad, wf.grad, "dw")


def rms_norm_normalized_dim_is_gathered():
    # normalized_shape (6, 8): a Shard(1) input is all-gathered once, never
    # normalized over half a row.
    xf, wf, yf, rstd_f, xd, wd, y, rstd, comms, dy = _rms_case((4, 6, 8), (6, 8), [Shard(1)])
    assert comms == 1, f"expected one all-gather, got {comms} collectives"
    assert y.placements == (Replicate(),), y.placements
    close(y, yf, "y")
    close(rstd, rstd_f, "rstd")
    y.backward(distribute_tensor(dy, mesh(), [Replicate()]))
    close(xd.grad, xf.grad, "dx")
    close(wd.grad, wf.grad, "dw")


def add_rms_norm_sequence_shards():
    torch.manual_seed(2)
    shape = (3, 5, 16)  # 5 rows of sequence over 2 ranks: 3 and 2
    x, r, dy, dh = (torch.randn(shape, dtype=F64) for _ in range(4))
    w = torch.randn(16, dtype=F64)
    xf, rf, wf = full_leaf(x), full_leaf(r), full_leaf(w)
    yf, hf = rtcnorm.rms_norm(xf, 16, wf, residual=rf)
    ((yf * dy).sum() + (hf * dh).sum()).backward()
    p = [Shard(1)]
    xd, rd, wd = leaf(x, p), leaf(r, p), leaf(w, [Replicate()])
    (y, h), comms = counted(lambda: rtcnorm.rms_norm(xd, 16, wd, residual=rd))
    assert comms == 0 and y.placements == tuple(p) and h.placements == tuple(p)
    close(y, yf, "y")
    close(h, hf, "h")
    dyd, dhd = distribute_tensor(dy, mesh(), p), distribute_tensor(dh, mesh(), p)
    ((y * dyd).sum() + (h * dhd).sum()).backward()
    for name, a, b in [("dx", xd, xf), ("dresidual", rd, rf), ("dw", wd, wf)]:
        close(a.grad, b.grad, name)


def layer_norm_leading_dims():
    torch.manual_seed(3)
    for shape, p, affine in [((5, 2, 12), Shard(0), True), ((2, 7, 12), Shard(1), True), ((5, 12), Shard(0), False)]:
        x, dy = torch.randn(shape, dtype=F64), torch.randn(shape, dtype=F64)
        w, b = torch.randn(12, dtype=F64), torch.randn(12, dtype=F64)
        xf = full_leaf(x)
        wf, bf = (full_leaf(w), full_leaf(b)) if affine else (None, None)
        yf, mean_f, rstd_f = torch.ops.rtcnorm.layer_norm(xf, [12], wf, bf, 1e-5)
        yf.backward(dy)
        xd = leaf(x, [p])
        wd, bd = (leaf(w, [Replicate()]), leaf(b, [Replicate()])) if affine else (None, None)
        (y, mean, rstd), comms = counted(torch.ops.rtcnorm.layer_norm, xd, [12], wd, bd, 1e-5)
        assert comms == 0 and {y.placements, mean.placements, rstd.placements} == {(p,)}
        close(y, yf, f"y {shape}")
        close(mean, mean_f, f"mean {shape}")
        close(rstd, rstd_f, f"rstd {shape}")
        dyd = distribute_tensor(dy, mesh(), [p])
        _, comms = counted(y.backward, dyd)
        assert comms == 0, f"{shape}: backward issued {comms} collectives"
        close(xd.grad, xf.grad, f"dx {shape}")
        if affine:
            assert wd.grad.placements == (Partial("sum"),) and bd.grad.placements == (Partial("sum"),)
            close(wd.grad, wf.grad, f"dw {shape}")
            close(bd.grad, bf.grad, f"db {shape}")


def layer_norm_normalized_dim_is_gathered():
    torch.manual_seed(4)
    x, w, b = torch.randn(3, 10, dtype=F64), torch.randn(10, dtype=F64), torch.randn(10, dtype=F64)
    yf = rtcnorm.layer_norm(x, 10, w, b)
    xd, wd, bd = leaf(x, [Shard(1)]), leaf(w, [Replicate()]), leaf(b, [Replicate()])
    y, comms = counted(lambda: rtcnorm.layer_norm(xd, 10, wd, bd))
    assert comms == 1 and y.placements == (Replicate(),), (comms, y.placements)
    close(y, yf, "y")


# ---- softmax ----------------------------------------------------------------


def _softmax_check(fn, x, placements, expect_placements, expect_comms, mask=None, mask_placements=None):
    dy = torch.randn_like(x)
    xf = full_leaf(x)
    yf = fn(xf) if mask is None else fn(xf, mask)
    yf.backward(dy)
    xd = leaf(x, placements)
    args = (xd,) if mask is None else (xd, distribute_tensor(mask, mesh(), mask_placements))
    y, comms = counted(lambda: fn(*args))
    what = f"{getattr(fn, '__name__', fn)} {tuple(x.shape)} {placements}"
    assert comms == expect_comms, f"{what}: {comms} collectives, expected {expect_comms}"
    assert y.placements == tuple(expect_placements), f"{what}: {y.placements}"
    close(y, yf, f"y {what}")
    y.backward(distribute_tensor(dy, mesh(), y.placements))
    close(xd.grad, xf.grad, f"dx {what}")


def _scaled(fn, scale=0.37):
    def call(x, *mask):
        return fn(x, *mask, scale)

    call.__name__ = fn.__name__
    return call


def softmax_batch_head_query_shards():
    torch.manual_seed(5)
    x = torch.randn(2, 3, 5, 7, dtype=F64)  # (b, h, sq, sk); h and sq split unevenly
    for d in range(3):
        _softmax_check(_scaled(rtcnorm.scaled_softmax), x, [Shard(d)], [Shard(d)], 0)
    # a shard along the softmax dim is gathered first (one all-gather)
    _softmax_check(_scaled(rtcnorm.scaled_softmax), x, [Shard(3)], [Replicate()], 1)


def masked_softmax_mask_follows_input():
    torch.manual_seed(6)
    x = torch.randn(2, 3, 5, 7, dtype=F64)
    full = torch.rand(2, 3, 5, 7) < 0.3
    op = _scaled(rtcnorm.scaled_masked_softmax)
    for d in range(3):
        _softmax_check(op, x, [Shard(d)], [Shard(d)], 0, full, [Shard(d)])
    # A mask broadcast over heads is replicated when the input is split by heads.
    per_batch = torch.rand(2, 1, 5, 7) < 0.3
    _softmax_check(op, x, [Shard(1)], [Shard(1)], 0, per_batch, [Replicate()])
    # ... and split with the input by batch.
    _softmax_check(op, x, [Shard(0)], [Shard(0)], 0, per_batch, [Shard(0)])
    # A 2-D (sq, sk) mask follows a query split (a local slice, no collective).
    _softmax_check(op, x, [Shard(2)], [Shard(2)], 0, torch.rand(5, 7) < 0.3, [Replicate()])


def causal_softmax_keeps_queries_whole():
    torch.manual_seed(7)
    tri = _scaled(rtcnorm.scaled_upper_triang_masked_softmax)
    aligned = _scaled(rtcnorm.scaled_aligned_causal_masked_softmax)
    x_sq, x_wide = torch.randn(2, 3, 6, 6, dtype=F64), torch.randn(2, 3, 4, 7, dtype=F64)
    for fn, x in [(tri, x_sq), (aligned, x_wide)]:
        _softmax_check(fn, x, [Shard(0)], [Shard(0)], 0)
        _softmax_check(fn, x, [Shard(1)], [Shard(1)], 0)
        # the query offset is global: a query split is gathered, not computed locally
        _softmax_check(fn, x, [Shard(2)], [Replicate()], 1)


def ops_on_a_2d_mesh():
    """(dp, tp) = (2, 2): rows split over both mesh dims, one of them a
    normalized-dim split that must be gathered."""
    torch.manual_seed(8)
    mesh2 = init_device_mesh("cpu", (2, dist.get_world_size() // 2))
    x, dy, w = torch.randn(5, 3, 16, dtype=F64), torch.randn(5, 3, 16, dtype=F64), torch.randn(16, dtype=F64)
    xf, wf = full_leaf(x), full_leaf(w)
    yf = rtcnorm.rms_norm(xf, 16, wf)
    yf.backward(dy)
    for placements, comms_expected in [((Shard(0), Shard(1)), 0), ((Shard(1), Shard(2)), 1)]:
        xd = distribute_tensor(x, mesh2, placements).requires_grad_()
        wd = distribute_tensor(w, mesh2, [Replicate(), Replicate()]).requires_grad_()
        y, comms = counted(rtcnorm.rms_norm, xd, 16, wd)
        assert comms == comms_expected, (placements, comms)
        rows = tuple(p if p.dim < 2 else Replicate() for p in placements)
        assert y.placements == rows, (placements, y.placements)
        y.backward(distribute_tensor(dy, mesh2, y.placements))
        assert wd.grad.placements == tuple(Partial("sum") if p.is_shard() else p for p in rows), wd.grad.placements
        close(y, yf, f"y {placements}")
        close(xd.grad, xf.grad, f"dx {placements}")
        close(wd.grad, wf.grad, f"dw {placements}")
    s = torch.randn(4, 3, 5, 7, dtype=F64)
    sd = distribute_tensor(s, mesh2, [Shard(0), Shard(1)])
    y, comms = counted(rtcnorm.scaled_softmax, sd, 0.5)
    assert comms == 0 and y.placements == (Shard(0), Shard(1)), (comms, y.placements)
    close(y, rtcnorm.scaled_softmax(s, 0.5), "softmax on a 2-D mesh")
