"""RMSNorm (rms_norm, add_rms_norm, rms_norm_backward): CPU path, argument
errors, autograd, opcheck and fake impls, and the CUDA kernels (marker gpu)."""

from __future__ import annotations

import pytest
import rtcnorm
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from norm_checks import (
    CPU_DTYPES,
    CPU_SHAPES,
    GPU_DTYPES,
    GPU_N,
    MODES,
    RMS_VARIANTS,
    ROW_COUNT_SHAPES,
    check_rms_norm,
    dtype_variant_params,
    gpu_rows,
    noncontiguous_cases,
    rms_inputs,
    variant_applies,
)
from reference import assert_close
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import opcheck

OPS = torch.ops.rtcnorm


# ---- CPU ---------------------------------------------------------------------


@pytest.mark.parametrize("shape_name", list(CPU_SHAPES))
@pytest.mark.parametrize(("dtype", "variant"), dtype_variant_params(CPU_DTYPES, RMS_VARIANTS))
def test_cpu_matches_reference(dtype, variant, shape_name):
    shape, ns = CPU_SHAPES[shape_name]
    x, w, zcg, r = rms_inputs(shape, ns, dtype, "cpu", variant)
    check_rms_norm(x, ns, w, zero_centered_gamma=zcg, residual=r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_noncontiguous_rows(dtype):
    for name, x, ns, _ in noncontiguous_cases("cpu", dtype):
        assert not x.is_contiguous() or x.storage_offset() % 2, name
        w = torch.randn(ns, dtype=dtype)
        check_rms_norm(x, ns, w)
        check_rms_norm(x, ns, w, residual=torch.randn_like(x))


@pytest.mark.parametrize("shape", [(0, 64), (3, 0, 16)])
def test_cpu_zero_rows(shape):
    x, w, _, _ = rms_inputs(shape, [shape[-1]], torch.float32, "cpu", "weight")
    check_rms_norm(x, [shape[-1]], w)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    rtcnorm.rms_norm(xl, shape[-1], wl).sum().backward()
    assert torch.equal(wl.grad, torch.zeros_like(w))


def test_cpu_default_eps_is_the_dtype_epsilon_and_matches_torch():
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(6, 48, dtype=dtype) * 1e-3, torch.randn(48, dtype=dtype)
        y = rtcnorm.rms_norm(x, 48, w)
        assert torch.equal(y, rtcnorm.rms_norm(x, 48, w, torch.finfo(dtype).eps))
        assert not torch.equal(y, rtcnorm.rms_norm(x, 48, w, 1e-2))
        check_rms_norm(x, [48], w, 1e-2, backward=False)
        expected = F.rms_norm(x.double(), [48], w.double(), eps=torch.finfo(dtype).eps)
        assert_close(y, expected, what="y vs F.rms_norm")


@pytest.mark.parametrize("mode", MODES)
def test_cpu_accepts_every_mode(mode):
    x, w = torch.randn(5, 64), torch.randn(64)
    assert torch.equal(rtcnorm.rms_norm(x, 64, w, mode=mode), rtcnorm.rms_norm(x, 64, w))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    ns=st.lists(st.integers(1, 70), min_size=1, max_size=2),
    dtype=st.sampled_from(CPU_DTYPES),
    variant=st.sampled_from(RMS_VARIANTS),
    eps=st.sampled_from([None, 1e-6, 0.1]),
    seed=st.integers(0, 2**31 - 1),
)
def test_cpu_property_matches_reference(lead, ns, dtype, variant, eps, seed):
    if not variant_applies(variant, dtype):
        variant = "weight"
    torch.manual_seed(seed)
    x, w, zcg, r = rms_inputs((*lead, *ns), ns, dtype, "cpu", variant)
    check_rms_norm(x, ns, w, eps, zero_centered_gamma=zcg, residual=r)


# ---- autograd, opcheck, fake ---------------------------------------------------


@pytest.mark.parametrize("variant", ["weight", "no_weight", "zero_centered", "residual"])
def test_gradcheck_fp64(variant):
    x, w, zcg, r = rms_inputs((3, 4, 6), [4, 6], torch.float64, "cpu", variant)
    args = [t.requires_grad_() for t in (x, w, r) if t is not None]

    def fn(x, *rest):
        w = rest[0] if variant != "no_weight" else None
        r = rest[-1] if variant == "residual" else None
        out = rtcnorm.rms_norm(x, (4, 6), w, 1e-5, zero_centered_gamma=zcg, residual=r)
        return out if r is None else torch.cat([out[0].flatten(), out[1].flatten()])

    assert torch.autograd.gradcheck(fn, args)


def opcheck_cases(device):
    x, w, _, r = rms_inputs((3, 5, 64), [64], torch.float32, device, "residual")
    xb, wf = x.bfloat16(), w.float()
    g = lambda t: t.clone().requires_grad_()  # noqa: E731
    _, rstd = OPS.rms_norm(x, [64], w, 1e-6, None, False)
    dy = torch.randn_like(x)
    return {
        "rms_norm": (OPS.rms_norm.default, (g(x), [64], g(w), 1e-6, None, False)),
        "rms_norm_no_weight": (OPS.rms_norm.default, (g(x), [64], None, None, "multi_wave_reload", False)),
        "rms_norm_zcg_mixed": (OPS.rms_norm.default, (g(xb), [64], g(wf), None, None, True)),
        "rms_norm_2d_shape": (OPS.rms_norm.default, (g(x), [5, 64], None, 1e-5, None, False)),
        "add_rms_norm": (OPS.add_rms_norm.default, (g(x), g(r), [64], g(w), 1e-6, None, False)),
        "backward": (OPS.rms_norm_backward.default, (dy, x, rstd, w, [64], False, True, None)),
        "backward_grad_h": (OPS.rms_norm_backward.default, (dy, x, rstd, w, [64], True, False, torch.randn_like(x))),
        "backward_no_weight": (OPS.rms_norm_backward.default, (dy, x, rstd, None, [64], False, True, None)),
    }


@pytest.mark.parametrize("case", list(opcheck_cases("cpu")))
def test_opcheck_cpu(case):
    op, args = opcheck_cases("cpu")[case]
    opcheck(op, args)


def fake_cases():
    x = torch.randn(4, 6, 32, dtype=torch.bfloat16)
    xt = torch.randn(6, 4, 32, dtype=torch.float64).transpose(0, 1)
    w32 = torch.randn(32)
    _, rstd = OPS.rms_norm(x, [32], w32, None, None, False)
    return [
        (OPS.rms_norm, (x, [32], w32, None, None, False)),
        (OPS.rms_norm, (xt, [6, 32], None, None, None, False)),
        (OPS.add_rms_norm, (x, torch.randn_like(x), [32], w32, None, None, True)),
        (OPS.rms_norm_backward, (torch.randn_like(x), x, rstd, w32, [32], False, True, None)),
        (OPS.rms_norm_backward, (torch.randn_like(x), x, rstd, w32, [32], False, False, torch.randn_like(x))),
    ]


def test_fake_impls_match_real_outputs():
    for op, args in fake_cases():
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fake_args)
        for r, f in zip(real, fake):
            assert (f.shape, f.dtype, f.stride(), f.device) == (r.shape, r.dtype, r.stride(), r.device), op


# ---- argument errors ---------------------------------------------------------


def error_cases():
    x = torch.randn(4, 8)
    h = x.half()
    return {
        "integer_input": (lambda: rtcnorm.rms_norm(torch.ones(4, 8, dtype=torch.int32), 8), TypeError, "input"),
        "normalized_shape": (lambda: rtcnorm.rms_norm(x, 7), ValueError, "normalized_shape"),
        "empty_normalized_shape": (lambda: rtcnorm.rms_norm(x, []), ValueError, "normalized_shape"),
        "weight_shape": (lambda: rtcnorm.rms_norm(x, 8, torch.ones(7)), ValueError, "weight"),
        "weight_dtype": (lambda: rtcnorm.rms_norm(h, 8, torch.ones(8, dtype=torch.bfloat16)), TypeError, "weight"),
        "weight_fp64": (lambda: rtcnorm.rms_norm(x, 8, torch.ones(8, dtype=torch.float64)), TypeError, "weight"),
        "weight_device": (lambda: rtcnorm.rms_norm(x, 8, torch.ones(8, device="meta")), RuntimeError, "weight"),
        "residual_shape": (lambda: rtcnorm.rms_norm(x, 8, residual=torch.randn(4, 7)), ValueError, "residual"),
        "residual_dtype": (lambda: rtcnorm.rms_norm(x, 8, residual=h), TypeError, "residual"),
        "negative_eps": (lambda: rtcnorm.rms_norm(x, 8, eps=-1e-6), ValueError, "eps"),
        "infinite_eps": (lambda: rtcnorm.rms_norm(x, 8, eps=float("inf")), ValueError, "eps"),
        "op_mode": (lambda: OPS.rms_norm(x, [8], None, None, "fast", False), ValueError, "mode"),
    }


@pytest.mark.parametrize("case", list(error_cases()))
def test_bad_arguments_name_the_argument(case):
    fn, exc, name = error_cases()[case]
    with pytest.raises(exc, match=rf"rtcnorm\.(add_)?rms_norm: .*{name}"):
        fn()


def test_bad_mode_lists_the_valid_modes():
    with pytest.raises(ValueError) as info:
        rtcnorm.rms_norm(torch.randn(2, 8), 8, mode="fastest")
    assert "'fastest'" in str(info.value)
    assert all(m in str(info.value) for m in rtcnorm.MODES)


# ---- GPU -----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "auto")
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize(("dtype", "variant"), dtype_variant_params(GPU_DTYPES, RMS_VARIANTS))
def test_gpu_matches_reference(gpu_kernels, poison, dtype, variant, n, mode):
    x, w, zcg, r = rms_inputs((gpu_rows(n), n), [n], dtype, "cuda", variant)
    check_rms_norm(x, [n], w, zero_centered_gamma=zcg, residual=r, mode=mode, poison=poison)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "static_persistent"], ids=lambda m: m or "auto")
@pytest.mark.parametrize(("m", "n"), ROW_COUNT_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_row_counts(poison, dtype, m, n, mode):
    x, w, _, r = rms_inputs((m, n), [n], dtype, "cuda", "residual")
    check_rms_norm(x, [n], w, residual=r, mode=mode, poison=poison)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 4096), (2, 0, 128)])
def test_gpu_zero_rows(shape):
    x, w, _, r = rms_inputs(shape, [shape[-1]], torch.bfloat16, "cuda", "residual")
    check_rms_norm(x, [shape[-1]], w)
    check_rms_norm(x, [shape[-1]], w, residual=r)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "auto")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_noncontiguous_rows_need_no_copy(poison, dtype, mode):
    for name, x, ns, copy_free in noncontiguous_cases("cuda", dtype):
        w = torch.randn(ns, device="cuda").to(dtype)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            OPS.rms_norm(x, ns, w, None, mode, False)
        copies = {e.name for e in prof.events()} & {"aten::copy_", "aten::clone", "aten::contiguous"}
        assert (not copies) == copy_free, f"{name}: {copies}"
        check_rms_norm(x, ns, w, mode=mode, poison=poison)
        check_rms_norm(x, ns, w, mode=mode, residual=torch.randn_like(x), poison=poison)


@pytest.mark.gpu
def test_gpu_argument_errors():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(RuntimeError, match=r"rtcnorm\.rms_norm: weight is on cpu"):
        rtcnorm.rms_norm(x, 64, torch.ones(64))
    with pytest.raises(RuntimeError, match=r"rtcnorm\.add_rms_norm: residual is on cpu"):
        rtcnorm.rms_norm(x, 64, residual=torch.randn(4, 64))
    with pytest.raises(TypeError, match=r"rtcnorm\.rms_norm: CUDA input must be"):
        rtcnorm.rms_norm(x.double(), 64)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(opcheck_cases("cpu")))
def test_opcheck_cuda(case):
    op, args = opcheck_cases("cuda")[case]
    opcheck(op, args)
