"""LayerNorm (layer_norm, layer_norm_backward): CPU path, argument errors,
autograd, opcheck and fake impls, and the CUDA kernels (marker gpu)."""

from __future__ import annotations

import math

import pytest
import rtcnorm
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from norm_checks import (
    CPU_DTYPES,
    CPU_SHAPES,
    GPU_DTYPES,
    GPU_N,
    LN_VARIANTS,
    MODES,
    ROW_COUNT_SHAPES,
    check_layer_norm,
    dtype_variant_params,
    gpu_rows,
    ln_inputs,
    noncontiguous_cases,
    variant_applies,
)
from reference import assert_close
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import opcheck

OPS = torch.ops.rtcnorm


# ---- CPU ---------------------------------------------------------------------


@pytest.mark.parametrize("shape_name", list(CPU_SHAPES))
@pytest.mark.parametrize(("dtype", "variant"), dtype_variant_params(CPU_DTYPES, LN_VARIANTS))
def test_cpu_matches_reference(dtype, variant, shape_name):
    shape, ns = CPU_SHAPES[shape_name]
    x, w, b, zcg = ln_inputs(shape, ns, dtype, "cpu", variant)
    check_layer_norm(x, ns, w, b, zero_centered_gamma=zcg)


@pytest.mark.parametrize("n", [7, 1000, 4097])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_large_mean(dtype, n):
    # 1000 + randn: a naive E[x^2] - E[x]^2 in fp32 loses the variance entirely.
    x, w, b, _ = ln_inputs((9, n), [n], dtype, "cpu", "weight_bias", shift=1000.0)
    check_layer_norm(x, [n], w, b)


def test_cpu_n_is_1_gives_the_bias():
    x, w, b, _ = ln_inputs((9, 1), [1], torch.float32, "cpu", "weight_bias")
    y = check_layer_norm(x, [1], w, b)
    assert torch.equal(y, b.expand_as(y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_noncontiguous_rows(dtype):
    for name, x, ns, _ in noncontiguous_cases("cpu", dtype):
        assert not x.is_contiguous() or x.storage_offset() % 2, name
        w, b = torch.randn(ns, dtype=dtype), torch.randn(ns, dtype=dtype)
        check_layer_norm(x, ns, w, b)


@pytest.mark.parametrize("shape", [(0, 64), (3, 0, 16)])
def test_cpu_zero_rows(shape):
    x, w, b, _ = ln_inputs(shape, [shape[-1]], torch.float32, "cpu", "weight_bias")
    check_layer_norm(x, [shape[-1]], w, b)
    xl, wl, bl = (t.clone().requires_grad_() for t in (x, w, b))
    rtcnorm.layer_norm(xl, shape[-1], wl, bl).sum().backward()
    assert torch.equal(wl.grad, torch.zeros_like(w)) and torch.equal(bl.grad, torch.zeros_like(b))


@pytest.mark.parametrize("mode", MODES)
def test_cpu_matches_torch_layer_norm(mode):
    x, w, b = torch.randn(6, 5, 48), torch.randn(48), torch.randn(48)
    y = rtcnorm.layer_norm(x, 48, w, b, 1e-3, mode=mode)
    assert_close(y, F.layer_norm(x.double(), [48], w.double(), b.double(), 1e-3), what="y vs F.layer_norm")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    ns=st.lists(st.integers(1, 70), min_size=1, max_size=2),
    dtype=st.sampled_from(CPU_DTYPES),
    variant=st.sampled_from(LN_VARIANTS),
    eps=st.sampled_from([1e-5, 1e-2]),
    shift=st.sampled_from([0.0, 3.0]),
    seed=st.integers(0, 2**31 - 1),
)
@example(lead=[2, 2], ns=[2], dtype=torch.float32, variant="weight_bias", eps=1e-5, shift=3.0, seed=154879)
@example(lead=[], ns=[2], dtype=torch.float32, variant="weight_bias", eps=1e-5, shift=0.0, seed=573)
def test_cpu_property_matches_reference(lead, ns, dtype, variant, eps, shift, seed):
    if not variant_applies(variant, dtype):
        variant = "weight_bias"
    torch.manual_seed(seed)
    x, w, b, zcg = ln_inputs((*lead, *ns), ns, dtype, "cpu", variant, shift=shift)
    # x - mean loses |mean| / std of relative accuracy in any fp32 kernel (a row
    # of two values near 3.0 is as ill-conditioned as it gets, and unshifted
    # rows of two values can be too: [-0.7153, -0.6505] has |mean| / std 21),
    # so the tolerance grows with the rows' worst |mean| / std.
    rows = x.double().reshape(-1, math.prod(ns))
    cond = (rows.mean(-1).abs() / rows.std(-1, correction=0).clamp_min(1e-12)).max().item() if rows.numel() else 0.0
    check_layer_norm(x, ns, w, b, eps, zero_centered_gamma=zcg, stat_scale=1.0 + cond)


# ---- autograd, opcheck, fake ---------------------------------------------------


@pytest.mark.parametrize("variant", ["weight_bias", "weight", "bias", "no_affine", "zero_centered"])
def test_gradcheck_fp64(variant):
    x, w, b, zcg = ln_inputs((3, 4, 6), [4, 6], torch.float64, "cpu", variant)
    names = [n for n, t in (("x", x), ("w", w), ("b", b)) if t is not None]
    args = [t.requires_grad_() for t in (x, w, b) if t is not None]

    def fn(*ts):
        got = dict(zip(names, ts))
        return rtcnorm.layer_norm(got["x"], (4, 6), got.get("w"), got.get("b"), 1e-5, zero_centered_gamma=zcg)

    assert torch.autograd.gradcheck(fn, args)


def opcheck_cases(device):
    x, w, b, _ = ln_inputs((3, 5, 64), [64], torch.float32, device, "weight_bias")
    g = lambda t: t.clone().requires_grad_()  # noqa: E731
    _, mean, rstd = OPS.layer_norm(x, [64], w, b, 1e-5, None, False)
    dy = torch.randn_like(x)
    return {
        "layer_norm": (OPS.layer_norm.default, (g(x), [64], g(w), g(b), 1e-5, None, False)),
        "weight_only": (OPS.layer_norm.default, (g(x), [64], g(w), None, 1e-5, "static_persistent", False)),
        "bias_only": (OPS.layer_norm.default, (g(x), [64], None, g(b), 1e-5, None, False)),
        "no_affine_2d_shape": (OPS.layer_norm.default, (g(x), [5, 64], None, None, 1e-5, None, False)),
        "zcg_mixed": (OPS.layer_norm.default, (g(x.bfloat16()), [64], g(w), g(b), 1e-5, None, True)),
        "backward": (OPS.layer_norm_backward.default, (dy, x, mean, rstd, w, b, [64], False, True, True)),
        "backward_dx_only": (OPS.layer_norm_backward.default, (dy, x, mean, rstd, w, b, [64], True, False, False)),
    }


@pytest.mark.parametrize("case", list(opcheck_cases("cpu")))
def test_opcheck_cpu(case):
    op, args = opcheck_cases("cpu")[case]
    opcheck(op, args)


def test_fake_impls_match_real_outputs():
    x = torch.randn(4, 6, 32, dtype=torch.float16)
    xt = torch.randn(6, 4, 32, dtype=torch.float64).transpose(0, 1)
    w32, b32 = torch.randn(32), torch.randn(32)
    _, mean, rstd = OPS.layer_norm(x, [32], w32, b32, 1e-5, None, False)
    cases = [
        (OPS.layer_norm, (x, [32], w32, b32, 1e-5, None, False)),
        (OPS.layer_norm, (xt, [6, 32], None, None, 1e-5, None, False)),
        (OPS.layer_norm_backward, (torch.randn_like(x), x, mean, rstd, w32, b32, [32], False, True, True)),
        (OPS.layer_norm_backward, (torch.randn_like(x), x, mean, rstd, w32, None, [32], True, False, False)),
    ]
    for op, args in cases:
        real = op(*args)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        for r, f in zip(real, fake):
            assert (f.shape, f.dtype, f.stride(), f.device) == (r.shape, r.dtype, r.stride(), r.device), op


# ---- argument errors ---------------------------------------------------------


def error_cases():
    x = torch.randn(4, 8)
    w = torch.ones(8)
    return {
        "integer_input": (lambda: rtcnorm.layer_norm(torch.ones(4, 8, dtype=torch.int64), 8), TypeError, "input"),
        "normalized_shape": (lambda: rtcnorm.layer_norm(x, [2, 8]), ValueError, "normalized_shape"),
        "zero_in_normalized_shape": (lambda: rtcnorm.layer_norm(torch.randn(3, 0), 0), ValueError, "normalized_shape"),
        "weight_shape": (lambda: rtcnorm.layer_norm(x, 8, torch.ones(4, 2)), ValueError, "weight"),
        "bias_shape": (lambda: rtcnorm.layer_norm(x, 8, w, torch.ones(9)), ValueError, "bias"),
        "weight_dtype": (lambda: rtcnorm.layer_norm(x.half(), 8, w.bfloat16()), TypeError, "weight"),
        "bias_dtype": (lambda: rtcnorm.layer_norm(x, 8, w, w.double()), TypeError, "bias"),
        "weight_bias_dtypes_differ": (
            lambda: rtcnorm.layer_norm(x.half(), 8, w, w.half()),
            TypeError,
            "weight and bias",
        ),
        "bias_device": (lambda: rtcnorm.layer_norm(x, 8, w, torch.ones(8, device="meta")), RuntimeError, "bias"),
        "negative_eps": (lambda: rtcnorm.layer_norm(x, 8, eps=-1.0), ValueError, "eps"),
        "op_mode": (lambda: OPS.layer_norm(x, [8], None, None, 1e-5, "multi_wave", False), ValueError, "mode"),
    }


@pytest.mark.parametrize("case", list(error_cases()))
def test_bad_arguments_name_the_argument(case):
    fn, exc, name = error_cases()[case]
    with pytest.raises(exc, match=rf"rtcnorm\.layer_norm: .*{name}"):
        fn()


def test_bad_mode_lists_the_valid_modes():
    with pytest.raises(ValueError) as info:
        rtcnorm.layer_norm(torch.randn(2, 8), 8, mode="welford")
    assert "'welford'" in str(info.value) and all(m in str(info.value) for m in rtcnorm.MODES)


# ---- GPU -----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "auto")
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize(("dtype", "variant"), dtype_variant_params(GPU_DTYPES, LN_VARIANTS))
def test_gpu_matches_reference(gpu_kernels, poison, dtype, variant, n, mode):
    x, w, b, zcg = ln_inputs((gpu_rows(n), n), [n], dtype, "cuda", variant)
    check_layer_norm(x, [n], w, b, zero_centered_gamma=zcg, mode=mode, poison=poison)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "auto")
@pytest.mark.parametrize("n", [7, 1000, 4097, 7168, 65536, 262144])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_large_mean(gpu_kernels, poison, dtype, n, mode):
    x, w, b, _ = ln_inputs((gpu_rows(n, 1 << 20), n), [n], dtype, "cuda", "weight_bias", shift=1000.0)
    # fp32 statistics of data with |mean| / std ~ 1000 are good to ~1000 fp32
    # ulps (any fp32 algorithm, the reference's float64 aside); the outputs
    # keep the usual 16-bit tolerance.
    check_layer_norm(x, [n], w, b, mode=mode, poison=poison, stat_scale=10.0)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "auto")
@pytest.mark.parametrize(
    ("n", "dtype", "variant"),
    [(32768, torch.bfloat16, "weight_bias"), (32768, torch.float16, "mixed"), (32768, torch.bfloat16, "zero_centered"),
     (24576, torch.bfloat16, "weight_bias"), (16384, torch.float32, "weight_bias"), (20480, torch.float16, "bias")],
)  # fmt: skip
def test_gpu_wide_rows_in_registers(poison, n, dtype, variant, mode):
    """LayerNorm rows of up to 64 KB cached in registers (register_row) by
    CTAs of more than 256 threads: float32 or 16-bit gamma and beta, a grid of
    a few waves and one of fewer row blocks than SMs, contiguous and
    row-strided. Rows with 16-bit gradients sit around a mean of 1000; float32 dW of such rows is only
    good to the float32 rounding of the mean (about 1e-4 relative), past its
    tolerance, so float32 and mixed rows keep mean 0."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = rtcnorm.explain(
        "layer_norm", (4 * sms + 37, n), dtype, weight_dtype=torch.float32 if variant == "mixed" else None
    )
    assert plan["design"] == "register_row" and plan["smem"] == 0 and plan["block"] > 256, plan
    shift = 1000.0 if dtype != torch.float32 and variant != "mixed" else 0.0
    for rows in (4 * sms + 37, 2 * (sms // 2 - 1) + 1):
        x, w, b, zcg = ln_inputs((2 * rows, n), [n], dtype, "cuda", variant, shift=shift)
        check_layer_norm(x[::2], [n], w, b, mode=mode, zero_centered_gamma=zcg, poison=poison, stat_scale=10.0)
        check_layer_norm(x[:rows], [n], w, b, mode=mode, zero_centered_gamma=zcg, poison=poison, stat_scale=10.0)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "multi_wave_reload"], ids=lambda m: m or "auto")
@pytest.mark.parametrize(("m", "n"), ROW_COUNT_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_row_counts(poison, dtype, m, n, mode):
    x, w, b, _ = ln_inputs((m, n), [n], dtype, "cuda", "weight_bias")
    check_layer_norm(x, [n], w, b, mode=mode, poison=poison)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 37, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_n_is_1_gives_the_bias_and_no_input_grad(poison, dtype, m):
    """Rows of one element: y is beta and dx is exactly 0 whatever x and dy
    are (the kernel's rearranged dx formula would otherwise leave rounding)."""
    x, w, b, _ = ln_inputs((m, 1), [1], dtype, "cuda", "weight_bias")
    dy = torch.randn_like(x)
    xl, wl, bl = (t.clone().requires_grad_() for t in (x, w, b))
    poison(4 * x.numel() * x.element_size())
    y = rtcnorm.layer_norm(xl, [1], wl, bl)
    assert torch.equal(y, b.expand_as(y))
    y.backward(dy)
    assert torch.equal(xl.grad, torch.zeros_like(x))
    assert torch.equal(wl.grad, torch.zeros_like(w))
    assert_close(bl.grad, dy.double().sum(0), what="dB", reduce_len=m)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 4096), (2, 0, 128)])
def test_gpu_zero_rows(shape):
    x, w, b, _ = ln_inputs(shape, [shape[-1]], torch.bfloat16, "cuda", "weight_bias")
    check_layer_norm(x, [shape[-1]], w, b)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "auto")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_noncontiguous_rows_need_no_copy(poison, dtype, mode):
    for name, x, ns, copy_free in noncontiguous_cases("cuda", dtype):
        w, b = (torch.randn(ns, device="cuda").to(dtype) for _ in range(2))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            OPS.layer_norm(x, ns, w, b, 1e-5, mode, False)
        copies = {e.name for e in prof.events()} & {"aten::copy_", "aten::clone", "aten::contiguous"}
        assert (not copies) == copy_free, f"{name}: {copies}"
        check_layer_norm(x, ns, w, b, mode=mode, poison=poison)


@pytest.mark.gpu
def test_gpu_argument_errors():
    x = torch.randn(4, 64, device="cuda")
    w = torch.ones(64, device="cuda")
    with pytest.raises(RuntimeError, match=r"rtcnorm\.layer_norm: bias is on cpu"):
        rtcnorm.layer_norm(x, 64, w, torch.zeros(64))
    with pytest.raises(TypeError, match=r"rtcnorm\.layer_norm: CUDA input must be"):
        rtcnorm.layer_norm(x.double(), 64)
    with pytest.raises(ValueError, match=r"rtcnorm\.layer_norm: eps must be finite"):
        rtcnorm.layer_norm(x, 64, eps=float("nan"))


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(opcheck_cases("cpu")))
def test_opcheck_cuda(case):
    op, args = opcheck_cases("cuda")[case]
    opcheck(op, args)
