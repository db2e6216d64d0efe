"""The softmax family on CPU: scaled, scaled-masked, upper-triangular causal and aligned causal.

Semantics through the CPU implementation, opcheck, gradcheck, fake
implementations, torch.compile, argument errors, the module, and NVRTC
compilation of every kernel variant for sm_80, sm_90 and sm_100. The CUDA
kernels are tested in test_softmax_gpu.py.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from softmax_reference import (
    DTYPES,
    OPS,
    SKS,
    check_op,
    default_shape,
    random_input,
    random_mask,
    reference_softmax,
)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# ---- CPU semantics ----------------------------------------------------------


@pytest.mark.parametrize("dtype", (*DTYPES, torch.float64))
@pytest.mark.parametrize("sk", SKS)
@pytest.mark.parametrize("op", OPS)
def test_cpu_matches_reference(op, sk, dtype):
    shape = default_shape(op, sk)
    x = random_input(shape, dtype, "cpu", seed=sk)
    mask = random_mask((shape[0], 1, shape[2], sk), "cpu", seed=sk) if op == "scaled_masked_softmax" else None
    check_op(op, x, mask)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_cuda])])
def test_fully_masked_row_is_zero_with_zero_grad(device):
    x = random_input((2, 3, 4, 33), torch.float32, device, seed=1).requires_grad_(True)
    mask = random_mask((2, 1, 4, 33), device, seed=1)
    mask[1, 0, 2] = True
    y = rtcnorm.scaled_masked_softmax(x, mask, 0.5)
    assert torch.equal(y[1, :, 2], torch.zeros_like(y[1, :, 2]))
    assert torch.isfinite(y).all()
    rows = y.sum(-1)
    assert torch.allclose(rows[1, :, 2], torch.zeros(3, device=device))
    keep = torch.ones_like(rows, dtype=torch.bool)
    keep[1, :, 2] = False
    assert torch.allclose(rows[keep], torch.ones_like(rows[keep]), atol=1e-5)
    assert torch.equal(y.masked_select(mask.expand_as(y)), torch.zeros(int(mask.expand_as(y).sum()), device=device))
    (g,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert torch.isfinite(g).all()
    assert torch.equal(g[1, :, 2], torch.zeros_like(g[1, :, 2]))


@pytest.mark.parametrize(
    "mask_shape",
    [(2, 3, 5, 16), (2, 1, 5, 16), (1, 1, 5, 16), (5, 16), (16,), (1, 3, 1, 16), (2, 3, 5, 1), ()],
)
def test_cpu_broadcast_masks(mask_shape):
    x = random_input((2, 3, 5, 16), torch.float32, "cpu", seed=3)
    check_op("scaled_masked_softmax", x, random_mask(mask_shape, "cpu", seed=3, p=0.4))


@pytest.mark.parametrize("shape", [(2, 4, 1, 37), (1, 2, 3, 8), (3, 5, 5), (6, 9)])
def test_cpu_aligned_causal_shapes(shape):
    x = random_input(shape, torch.float32, "cpu", seed=4)
    y = check_op("scaled_aligned_causal_masked_softmax", x)
    sq, sk = shape[-2:]
    for q in range(sq):
        assert torch.equal(y[..., q, q + sk - sq + 1 :], torch.zeros_like(y[..., q, q + sk - sq + 1 :]))
    if sq == sk:
        torch.testing.assert_close(y, rtcnorm.scaled_upper_triang_masked_softmax(x, 0.37), rtol=0, atol=0)


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_fp64(op):
    shape = (2, 2, 5, 5) if op == "scaled_upper_triang_masked_softmax" else (2, 2, 4, 6)
    x = random_input(shape, torch.float64, "cpu", seed=5).requires_grad_(True)
    mask = random_mask((2, 1, *shape[2:]), "cpu", seed=5)
    mask[0, 0, 1] = True
    fn = (lambda t: rtcnorm.scaled_masked_softmax(t, mask, 0.7)) if op == "scaled_masked_softmax" else None
    fn = fn or (lambda t: getattr(rtcnorm, op)(t, 0.7))
    assert torch.autograd.gradcheck(fn, (x,))


def _opcheck_args(op, device="cpu"):
    x = random_input((2, 3, 4, 4), torch.float32, device, seed=6).requires_grad_(True)
    if op == "scaled_masked_softmax":
        return (x, random_mask((2, 1, 4, 4), device, seed=6), 0.5)
    return (x, 0.5)


@pytest.mark.parametrize("op", OPS)
def test_opcheck(op):
    torch.library.opcheck(getattr(torch.ops.rtcnorm, op).default, _opcheck_args(op))


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_backward(causal):
    y = torch.softmax(torch.randn(2, 3, 4, 4), -1)
    torch.library.opcheck(torch.ops.rtcnorm.scaled_softmax_backward.default, (torch.randn(2, 3, 4, 4), y, 0.5, causal))


def test_fake_shapes_and_checks():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 3, 5, 7, dtype=torch.bfloat16).transpose(0, 1)
        for op in OPS:
            args = (x, torch.empty(1, 1, 5, 7, dtype=torch.bool)) if op == "scaled_masked_softmax" else (x,)
            if op == "scaled_upper_triang_masked_softmax":
                args = (torch.empty(2, 7, 7, dtype=torch.bfloat16),)
            y = getattr(torch.ops.rtcnorm, op)(*args)
            assert y.shape == args[0].shape and y.dtype == torch.bfloat16 and y.is_contiguous()
        with pytest.raises(TypeError, match="mask must be a bool tensor"):
            torch.ops.rtcnorm.scaled_masked_softmax(x, torch.empty(1, 1, 5, 7))
        with pytest.raises(ValueError, match="sq <= sk"):
            torch.ops.rtcnorm.scaled_aligned_causal_masked_softmax(torch.empty(2, 8, 7))


def test_compile_fullgraph_all_ops():
    x = random_input((2, 3, 6, 6), torch.float32, "cpu", seed=8)
    mask = random_mask((2, 1, 6, 6), "cpu", seed=8)

    def f(t):
        return (
            rtcnorm.scaled_softmax(t, 0.5)
            + rtcnorm.scaled_masked_softmax(t, mask, 0.5)
            + rtcnorm.scaled_upper_triang_masked_softmax(t, 0.5)
            + rtcnorm.scaled_aligned_causal_masked_softmax(t[..., 2:, :], 0.5).sum(-2, keepdim=True)
        )

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ye, yc = f(xe), compiled(xc)
    torch.testing.assert_close(yc, ye)
    dy = torch.randn_like(ye)
    torch.testing.assert_close(torch.autograd.grad(yc, xc, dy)[0], torch.autograd.grad(ye, xe, dy)[0])


def test_compile_inductor_masked():
    x = random_input((2, 2, 4, 12), torch.float32, "cpu", seed=9).requires_grad_(True)
    mask = random_mask((2, 1, 4, 12), "cpu", seed=9)
    module = rtcnorm.FusedScaleMaskSoftmax("padding", scale=0.25)
    compiled = torch.compile(module, fullgraph=True)
    y = compiled(x, mask)
    torch.testing.assert_close(y, reference_softmax(x.detach(), 0.25, mask))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


# ---- argument errors ----------------------------------------------------------

_x = torch.randn(2, 3, 4, 5)
_bad_calls = [
    (lambda: rtcnorm.scaled_softmax(_x.int()), TypeError, r"scaled_softmax: input must be float16.*got Int"),
    (lambda: rtcnorm.scaled_softmax(torch.tensor(1.0)), ValueError, r"scaled_softmax: input must have at least 1 dim"),
    (lambda: rtcnorm.scaled_softmax(_x, float("nan")), ValueError, r"scale must be finite"),
    (
        lambda: rtcnorm.scaled_masked_softmax(_x, torch.zeros(2, 1, 4, 5)),
        TypeError,
        r"scaled_masked_softmax: mask must be a bool tensor \(True = masked out\), got Float",
    ),
    (
        lambda: rtcnorm.scaled_masked_softmax(_x, torch.zeros(2, 2, 4, 5, dtype=torch.bool)),
        ValueError,
        r"mask of shape \[2, 2, 4, 5\] is not broadcastable to input of shape \[2, 3, 4, 5\]",
    ),
    (
        lambda: rtcnorm.scaled_masked_softmax(_x, torch.zeros(1, 2, 3, 4, 5, dtype=torch.bool)),
        ValueError,
        r"is not broadcastable",
    ),
    (
        lambda: rtcnorm.scaled_upper_triang_masked_softmax(_x),
        ValueError,
        r"scaled_upper_triang_masked_softmax: needs sq == sk .* sq = 4 and sk = 5; for sq < sk use "
        r"scaled_aligned_causal_masked_softmax",
    ),
    (
        lambda: rtcnorm.scaled_aligned_causal_masked_softmax(_x.transpose(-1, -2)),
        ValueError,
        r"scaled_aligned_causal_masked_softmax: needs sq <= sk .* sq = 5 and sk = 4",
    ),
    (
        lambda: rtcnorm.scaled_aligned_causal_masked_softmax(torch.randn(5)),
        ValueError,
        r"input must have at least 2 dims \(\.\.\., sq, sk\), got shape \[5\]",
    ),
    (
        lambda: rtcnorm.scaled_upper_triang_masked_softmax(torch.randn(5)),
        ValueError,
        r"input must have at least 2 dims",
    ),
    (
        lambda: torch.ops.rtcnorm.scaled_softmax_backward(torch.randn(2, 3), torch.randn(3, 2), 1.0),
        ValueError,
        r"grad_output must have output's shape \[3, 2\], got \[2, 3\]",
    ),
    (
        lambda: torch.ops.rtcnorm.scaled_softmax_backward(torch.randn(3, 2).half(), torch.randn(3, 2), 1.0),
        TypeError,
        r"grad_output must have output's dtype Float, got Half",
    ),
    (
        lambda: torch.ops.rtcnorm.scaled_softmax_backward(torch.randn(4, 3), torch.randn(4, 3), 1.0, True),
        ValueError,
        r"causal output needs sq <= sk",
    ),
    (
        lambda: rtcnorm.FusedScaleMaskSoftmax("sliding"),
        ValueError,
        r"mask_type must be one of",
    ),
    (
        lambda: rtcnorm.FusedScaleMaskSoftmax("none")(_x, torch.zeros(1, 1, 4, 5, dtype=torch.bool)),
        ValueError,
        r"mask_type='none' takes no mask",
    ),
]


@pytest.mark.parametrize("fn,exc,match", _bad_calls)
def test_bad_arguments(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


# ---- module -------------------------------------------------------------------


def test_module_dispatch():
    x = random_input((2, 3, 5, 5), torch.float32, "cpu", seed=10)
    mask = random_mask((2, 1, 5, 5), "cpu", seed=10)
    f = rtcnorm.FusedScaleMaskSoftmax
    torch.testing.assert_close(f("padding", 0.5)(x, mask), rtcnorm.scaled_masked_softmax(x, mask, 0.5))
    torch.testing.assert_close(f("padding", 0.5)(x), rtcnorm.scaled_softmax(x, 0.5))
    torch.testing.assert_close(f("none")(x), rtcnorm.scaled_softmax(x, 1.0))
    torch.testing.assert_close(f("causal", 0.5)(x, mask), rtcnorm.scaled_upper_triang_masked_softmax(x, 0.5))
    xa = x[..., 2:, :]
    torch.testing.assert_close(f("aligned_causal")(xa), rtcnorm.scaled_aligned_causal_masked_softmax(xa))
    assert "mask_type='causal'" in repr(f("causal"))


# ---- NVRTC: every variant, every arch -------------------------------------------

PRECOMPILE_SIZES = (1, 7, 100, 1000, 2048, 4097, 16385, 32768, 65536, 131072)


# The masked op on every run; the other ops' sweeps (100+ s each on 2 cores) are slow.
@pytest.mark.parametrize(
    "op", [op if op == "scaled_masked_softmax" else pytest.param(op, marks=pytest.mark.slow) for op in OPS]
)
def test_precompile_every_variant(op):
    lines = rtcnorm.jit.precompile(op, hidden_sizes=PRECOMPILE_SIZES, archs=("sm_80", "sm_90", "sm_100"))
    kernels = {line.rsplit(" ", 2)[0] for line in lines}
    assert any("softmax_fwd" in k for k in kernels) and any("softmax_bwd" in k for k in kernels)
    targets = {line.rsplit(" ", 2)[1] for line in lines}
    assert {"sm_80", "sm_90"} <= {t.replace("compute_", "sm_") for t in targets}


def test_growing_lengths_share_kernels():
    """A decode loop whose key length grows by one reuses a few kernels."""
    kernels = set()
    for sk in range(1, 4097):
        plan = rtcnorm.softmax.explain("scaled_aligned_causal_masked_softmax", (1, 32, 1, sk))
        kernels.add(plan["forward"]["kernel"])
        kernels.add(plan["backward"]["kernel"])
    assert len(kernels) <= 100, len(kernels)


def test_explain_long_rows_stream():
    e = rtcnorm.softmax.explain("scaled_masked_softmax", (1, 4, 64, 1 << 18))
    assert not e["forward"]["cached_row"] and e["forward"]["design"] == "streamed"
    # Eight such rows split over clusters of 8 CTAs on sm_90 (32768 elements
    # each) stay in registers; sm_80 has no clusters and streams them.
    e = rtcnorm.softmax.explain("scaled_masked_softmax", (1, 4, 2, 1 << 18))
    assert e["forward"]["cached_row"] and e["forward"]["cluster"] == 8 and e["forward"]["grid"] == 64
    e = rtcnorm.softmax.explain("scaled_masked_softmax", (1, 4, 2, 1 << 18), arch="sm_80")
    assert not e["forward"]["cached_row"] and e["forward"]["cluster"] == 1
    e = rtcnorm.softmax.explain("scaled_masked_softmax", (4, 32, 1024, 1024))
    assert e["forward"]["cached_row"] and e["forward"]["vec"] == 8
