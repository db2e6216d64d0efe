"""flat_row on what only it meets: 16-bit rows of odd width, read as 16-byte
pieces of the flat tensor.

Row blocks share pieces with their neighbours and the tensor's last piece
runs past its end, so each case compares every row with the float64
reference, outputs poisoned beforehand; the residual forward (h and y from
one staging buffer each) and the backward's dh; inputs the design cannot
read flat (an unaligned base, strided rows) must plan another design and
still be right; and a tensor of more than 2^31 elements.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from reference import assert_close, ref_layer_norm, ref_rms_norm
from rtcnorm import _tuning

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]  # the forward stages 16-bit rows of odd width


def _design(op, x, direction, **kw):
    e = rtcnorm.explain(op, tuple(x.shape), x.dtype, device="cuda", **kw)
    return (e if direction == "fwd" else e["backward"])["design"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("m,n", [(1, 1973), (3, 3), (517, 1973), (129, 2705), (64, 1145), (9, 37)])
def test_residual_sum_and_its_gradient(m, n, dtype, poison):
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    dy, dh = torch.randn(m, n, device="cuda", dtype=dtype), torch.randn(m, n, device="cuda", dtype=dtype)
    with _tuning.norm_override("fwd", "flat_row"), _tuning.norm_override("bwd", "flat_row"):
        assert _design("rms_norm", x, "fwd", residual=True) == "flat_row"
        assert _design("rms_norm", x, "bwd", residual=True) == "flat_row"
        poison(6 * m * n * 4)
        y, h = rtcnorm.rms_norm(x, n, w, 1e-6, residual=r)
        ref = ref_rms_norm(x, [n], w, 1e-6, residual=r, dy=dy, dh=dh)
        assert torch.equal(h, ref["h"])
        assert_close(y, ref["y"], what="y")
        dx, dr, dw = torch.autograd.grad((y, h), (x, r, w), (dy, dh))
    assert_close(dx, ref["dx"], what="dx")
    assert torch.equal(dx, dr)
    assert_close(dw, ref["dw"], what="dw", reduce_len=m)


# 4-byte accesses: fp32 rows of odd width, 16-bit rows of width 2 mod 4.
WIDE4 = [
    (torch.float32, 517, 1973),
    (torch.float32, 3, 3),
    (torch.float32, 1, 1145),
    (torch.bfloat16, 129, 2294),
    (torch.float16, 9, 38),
    (torch.bfloat16, 1, 2094),
]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype,m,n", WIDE4, ids=[f"{str(d)[6:]}-{m}x{n}" for d, m, n in WIDE4])
def test_backward_of_4_byte_widths(op, dtype, m, n, poison):
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    if op == "rms_norm":
        y, ref, leaves = rtcnorm.rms_norm(x, n, w, 1e-6), ref_rms_norm(x, [n], w, 1e-6, dy=dy), (x, w)
    else:
        y, ref, leaves = rtcnorm.layer_norm(x, n, w, b, 1e-5), ref_layer_norm(x, [n], w, b, 1e-5, dy=dy), (x, w, b)
    with _tuning.norm_override("bwd", "flat_row"):
        assert _design(op, x, "bwd") == "flat_row"
        poison(4 * m * n * 4)
        grads = torch.autograd.grad(y, leaves, dy)
    assert_close(grads[0], ref["dx"], what="dx")
    assert_close(grads[1], ref["dw"], what="dw", reduce_len=m)
    if op == "layer_norm":
        assert_close(grads[2], ref["db"], what="db", reduce_len=m)


# Rows wider than a CTA's registers hold, read from a one-stage ring in
# chunks: every CTA size the planner offers, rows whose width leaves a short
# last chunk, float32 gamma / beta, and (RMSNorm) the residual sum in its own
# stage.
WIDE = [(torch.bfloat16, 3, 112459), (torch.float16, 5, 40001), (torch.bfloat16, 1, 65537), (torch.bfloat16, 7, 33333)]


@pytest.mark.parametrize("threads", [256, 512, 1024])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("dtype,m,n", WIDE, ids=[f"{str(d)[6:]}-{m}x{n}" for d, m, n in WIDE])
def test_rows_read_from_the_stage_in_chunks(op, dtype, m, n, threads, poison):
    if op == "add_rms_norm" and (2 * n * dtype.itemsize > 200 * 1024 or threads == 1024):
        pytest.skip("x and the residual do not fit one stage, or 1024 threads' registers")
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 3 + 1
    r = torch.randn(m, n, device="cuda", dtype=dtype) if op == "add_rms_norm" else None
    wdtype = torch.float32 if dtype == torch.float16 else dtype  # float32 gamma / beta loaded as used too
    w, b = torch.randn(n, device="cuda", dtype=wdtype), torch.randn(n, device="cuda", dtype=wdtype)
    base = "layer_norm" if op == "layer_norm" else "rms_norm"
    with _tuning.norm_override("fwd", "flat_row", cta_threads=threads):
        e = rtcnorm.explain(base, (m, n), dtype, device="cuda", residual=r is not None, weight_dtype=wdtype)
        assert (e["design"], e["knobs"]["cta_threads"]) == ("flat_row", threads), e["reason"]
        assert e["knobs"]["vecs_per_thread"] * threads < n  # the row is read in chunks
        poison(4 * m * n * 4)
        if op == "layer_norm":
            y, ref = rtcnorm.layer_norm(x, n, w, b, 1e-5), ref_layer_norm(x, [n], w, b, 1e-5)
        else:
            y, ref = rtcnorm.rms_norm(x, n, w, 1e-6, residual=r), ref_rms_norm(x, [n], w, 1e-6, residual=r)
    if r is not None:
        y, h = y
        assert torch.equal(h, ref["h"])
    assert_close(y, ref["y"], what="y")


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_unaligned_and_strided_rows_plan_another_design(op, poison):
    n = 1973
    base = torch.randn(300 * (n + 5) + 1, device="cuda", dtype=torch.bfloat16)
    unaligned = base[1 : 1 + 300 * n].view(300, n)  # 2 bytes past a 16-byte boundary
    strided = base[: 300 * (n + 5)].view(300, n + 5)[:, :n]
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for x in (unaligned, strided):
        with _tuning.norm_override("fwd", "flat_row"):
            poison(4 * x.numel() * 4)
            if op == "rms_norm":
                y, ref = rtcnorm.rms_norm(x, n, w, 1e-6), ref_rms_norm(x, [n], w, 1e-6)
            else:
                y, ref = rtcnorm.layer_norm(x, n, w, None, 1e-5), ref_layer_norm(x, [n], w, None, 1e-5)
        assert_close(y, ref["y"], what=f"{op} y")
    with _tuning.norm_override("fwd", "flat_row"):
        e = rtcnorm.explain(op, (300, n), torch.bfloat16, device="cuda", strides=(n + 5, 1))
    assert e["design"] != "flat_row"


@pytest.mark.slow
def test_more_than_2_to_the_31_elements():
    n = 1973
    m = (1 << 31) // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    assert _design("rms_norm", x, "fwd") == "flat_row"
    y = rtcnorm.rms_norm(x, n, w, 1e-6)
    for rows in (slice(0, 2), slice(m // 2, m // 2 + 2), slice(m - 3, m)):
        assert_close(y[rows], ref_rms_norm(x[rows], [n], w, 1e-6)["y"], what=f"y rows {rows}")
