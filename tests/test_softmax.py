"""The softmax family: scaled, scaled-masked, upper-triangular causal and aligned causal.

CPU: semantics through the CPU implementation, opcheck, gradcheck, fake
implementations, torch.compile, argument errors, the module, and NVRTC
compilation of every kernel variant for sm_80, sm_90 and sm_100.
GPU (marked ``gpu``): the kernels against the reference on fresh random data
with NaN-poisoned outputs, over every size class, layout and mask form.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from softmax_reference import (
    assert_backward_close,
    assert_forward_close,
    reference_softmax,
    reference_softmax_backward,
)

OPS = (
    "scaled_softmax",
    "scaled_masked_softmax",
    "scaled_upper_triang_masked_softmax",
    "scaled_aligned_causal_masked_softmax",
)
CAUSAL_OPS = OPS[2:]
SKS = (1, 7, 100, 1000, 4097, 16385, 65536)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu_test(fn):
    return pytest.mark.gpu(requires_cuda(fn))


# ---- helpers ----------------------------------------------------------------


def random_input(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype).to(device)


def random_mask(shape, device, seed, p=0.3):
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.rand(shape, generator=g) < p).to(device)


def default_shape(op, sk):
    """A 4-D (b, h, sq, sk) input of modest size for each op and row length."""
    if op == "scaled_upper_triang_masked_softmax":
        sq = min(sk, 130)
        return (1, 2, sq, sq)
    sq = 3 if op == "scaled_aligned_causal_masked_softmax" else 5
    return (2, 3, min(sq, sk), sk)


def poison_next_alloc(t_like: torch.Tensor):
    """Fill a freed block of t_like's size with 0xFF bytes (NaN in every float
    dtype), so the op's output most likely lands on it: an element the kernel
    fails to write stays NaN."""
    if t_like.is_cuda:
        torch.empty(t_like.numel() * t_like.element_size(), dtype=torch.uint8, device=t_like.device).fill_(0xFF)


def call(op, x, mask=None, scale=1.0):
    if op == "scaled_masked_softmax":
        return getattr(rtcnorm, op)(x, mask, scale)
    return getattr(rtcnorm, op)(x, scale)


def check_op(op, x, mask=None, scale=0.37, seed=0):
    """Forward, backward op and autograd of `op` on x against the reference."""
    causal = op in CAUSAL_OPS
    poison_next_alloc(x)
    y = call(op, x, mask, scale)
    y_ref = reference_softmax(x, scale, mask, causal)
    assert y.dtype == x.dtype and y.is_contiguous()
    assert_forward_close(y, y_ref, what=f"{op} forward {tuple(x.shape)} {x.dtype}")

    dy = random_input(x.shape, x.dtype, x.device, seed + 7)
    poison_next_alloc(x)
    dx = torch.ops.rtcnorm.scaled_softmax_backward(dy, y, scale, causal)
    dx_ref = reference_softmax_backward(dy, y_ref, scale, causal)
    assert_backward_close(dx, dx_ref, y_ref, dy, scale, what=f"{op} backward {tuple(x.shape)} {x.dtype}")

    xg = x.detach().clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(call(op, xg, mask, scale), xg, dy)
    torch.testing.assert_close(gx, dx, rtol=0, atol=0)
    return y


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
        with pytest.raises(RuntimeError, match="mask must be a bool tensor"):
            torch.ops.rtcnorm.scaled_masked_softmax(x, torch.empty(1, 1, 5, 7))
        with pytest.raises(RuntimeError, match="sq <= sk"):
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


@gpu_test
def test_gpu_bad_arguments():
    x = torch.randn(2, 3, 4, 5, device="cuda")
    with pytest.raises(TypeError, match=r"input must be float16, bfloat16 or float32 on CUDA, got Double"):
        rtcnorm.scaled_softmax(x.double())
    with pytest.raises(RuntimeError, match=r"mask is on cpu but input is on cuda"):
        rtcnorm.scaled_masked_softmax(x, torch.zeros(4, 5, dtype=torch.bool))


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


@pytest.mark.parametrize("op", OPS)
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
    e = rtcnorm.softmax.explain("scaled_masked_softmax", (1, 4, 2, 1 << 18))
    assert not e["forward"]["cached_row"] and "streamed" in e["forward"]["reason"]
    e = rtcnorm.softmax.explain("scaled_masked_softmax", (4, 32, 1024, 1024))
    assert e["forward"]["cached_row"] and e["forward"]["vec"] == 8


# ---- GPU ----------------------------------------------------------------------


@gpu_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sk", SKS)
@pytest.mark.parametrize("op", OPS)
def test_gpu_matches_reference(op, sk, dtype):
    shape = default_shape(op, sk)
    x = random_input(shape, dtype, "cuda", seed=sk)
    mask = None
    if op == "scaled_masked_softmax":
        mask = random_mask((shape[0], 1, shape[2], sk), "cuda", seed=sk)
        mask[0, 0, 1] = True
    check_op(op, x, mask)


@gpu_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [(1, 4, 1, 8192), (2, 3, 1, 100), (1, 2, 7, 4097), (1, 1, 512, 4096), (2, 1, 64, 65536), (1, 1, 3, 131075)],
)
def test_gpu_aligned_causal(shape, dtype):
    check_op("scaled_aligned_causal_masked_softmax", random_input(shape, dtype, "cuda", seed=11))


@gpu_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s", [1, 2, 31, 1000, 2049, 4097])
def test_gpu_upper_triang(s, dtype):
    check_op("scaled_upper_triang_masked_softmax", random_input((1, 2, s, s), dtype, "cuda", seed=s))


@gpu_test
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sk", [2048, 8192, 16384, 32768, 65536, 65544, 131072, 262144, 65537])
@pytest.mark.parametrize("op", ["scaled_softmax", "scaled_masked_softmax", "scaled_aligned_causal_masked_softmax"])
def test_gpu_long_rows(op, sk, dtype):
    shape = (1, 3, 2, sk)
    mask = random_mask((1, 1, 2, sk), "cuda", seed=sk) if op == "scaled_masked_softmax" else None
    check_op(op, random_input(shape, dtype, "cuda", seed=sk), mask)


@gpu_test
@pytest.mark.parametrize("sk", [1, 3, 8, 64, 128, 1000])
def test_gpu_many_rows(sk):
    x = random_input((65537, sk), torch.bfloat16, "cuda", seed=12)
    check_op("scaled_softmax", x)
    check_op("scaled_masked_softmax", x, random_mask((65537, sk), "cuda", seed=12))


@gpu_test
@pytest.mark.parametrize(
    "mask_shape",
    [(2, 3, 5, 72), (2, 1, 5, 72), (1, 1, 5, 72), (5, 72), (72,), (1, 3, 1, 72), (2, 3, 5, 1), (2, 1, 1, 1), ()],
)
def test_gpu_broadcast_masks(mask_shape):
    x = random_input((2, 3, 5, 72), torch.bfloat16, "cuda", seed=13)
    check_op("scaled_masked_softmax", x, random_mask(mask_shape, "cuda", seed=13, p=0.4))


@gpu_test
def test_gpu_mask_layouts():
    x = random_input((2, 3, 5, 64), torch.float16, "cuda", seed=14)
    m = random_mask((2, 1, 64, 5), "cuda", seed=14).transpose(-1, -2)  # keys not contiguous
    check_op("scaled_masked_softmax", x, m)
    m = random_mask((2, 1, 5, 65), "cuda", seed=15)[..., 1:]  # mask rows misaligned
    check_op("scaled_masked_softmax", x, m)
    x5 = random_input((2, 3, 2, 5, 40), torch.bfloat16, "cuda", seed=16)
    m5 = random_mask((2, 1, 2, 1, 40), "cuda", seed=16).expand(2, 1, 2, 5, 40)
    check_op("scaled_masked_softmax", x5, m5)
    m6 = random_mask((2, 3, 2, 5, 40), "cuda", seed=17).permute(2, 0, 3, 1, 4).contiguous().permute(1, 3, 0, 2, 4)
    check_op("scaled_masked_softmax", x5, m6)


@gpu_test
@pytest.mark.parametrize("op", OPS)
def test_gpu_strided_and_unaligned_inputs(op):
    base = random_input((4, 3, 36, 37), torch.bfloat16, "cuda", seed=18)
    mask = random_mask((4, 1, 36, 36), "cuda", seed=18) if op == "scaled_masked_softmax" else None
    check_op(op, base[..., 1:], mask)  # rows start 2 bytes past alignment
    check_op(op, base[..., :36].transpose(0, 1), mask.transpose(0, 1) if mask is not None else None)
    wide = random_input((4, 3, 36, 72), torch.float32, "cuda", seed=19)
    check_op(op, wide[..., ::2], mask)  # non-unit stride along keys


@gpu_test
@pytest.mark.parametrize("op", CAUSAL_OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_causal_ignores_hidden_region(op, dtype):
    """Values past the diagonal, in x or dy, never reach the result."""
    shape = (2, 2, 45, 45) if op == "scaled_upper_triang_masked_softmax" else (2, 2, 9, 45)
    x = random_input(shape, dtype, "cuda", seed=20)
    sq, sk = shape[-2:]
    hidden = torch.ones(sq, sk, dtype=torch.bool, device="cuda").triu(sk - sq + 1)
    y = call(op, x.masked_fill(hidden, float("nan")), None, 0.5)
    y_ref = reference_softmax(x, 0.5, None, True)
    assert_forward_close(y, y_ref, what="forward")
    dy = random_input(shape, dtype, "cuda", seed=21)
    dx = torch.ops.rtcnorm.scaled_softmax_backward(dy.masked_fill(hidden, float("nan")), y, 0.5, True)
    dx_ref = reference_softmax_backward(dy, y_ref, 0.5, True)
    assert_backward_close(dx, dx_ref, y_ref, dy, 0.5, what="backward")


@gpu_test
def test_gpu_rows_sum_to_one_with_large_logits():
    x = random_input((8, 3000), torch.float32, "cuda", seed=22) * 1e4
    y = rtcnorm.scaled_softmax(x, 1.0)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.sum(-1), torch.ones(8, device="cuda"))


@gpu_test
def test_gpu_empty_inputs():
    assert rtcnorm.scaled_softmax(torch.empty(0, 5, device="cuda")).shape == (0, 5)
    assert rtcnorm.scaled_softmax(torch.empty(3, 0, device="cuda")).shape == (3, 0)


@gpu_test
def test_gpu_compile_fullgraph():
    x = random_input((2, 4, 64, 64), torch.bfloat16, "cuda", seed=23).requires_grad_(True)
    mask = random_mask((2, 1, 64, 64), "cuda", seed=23)
    f = rtcnorm.FusedScaleMaskSoftmax("padding", scale=0.125)
    y = torch.compile(f, fullgraph=True)(x, mask)
    assert_forward_close(y, reference_softmax(x.detach(), 0.125, mask))
    y.float().sum().backward()
    assert torch.isfinite(x.grad).all()


@gpu_test
def test_gpu_cuda_graph_after_warmup():
    x = random_input((2, 4, 32, 96), torch.bfloat16, "cuda", seed=24)
    rtcnorm.scaled_upper_triang_masked_softmax(x[..., :32, :32], 0.5)  # warm-up: compiles and loads
    static_x = x[..., :32, :32].clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            out = rtcnorm.scaled_upper_triang_masked_softmax(static_x, 0.5)
    static_x.copy_(random_input(static_x.shape, torch.bfloat16, "cuda", seed=25))
    g.replay()
    torch.cuda.synchronize()
    assert_forward_close(out, reference_softmax(static_x, 0.5, None, True))
