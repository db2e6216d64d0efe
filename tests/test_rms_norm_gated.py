"""Gated RMSNorm (rms_norm_gated, rms_norm_gated_backward): the CPU path
against the float64 reference, argument errors, autograd, opcheck, fake
impls and torch.compile, the module, and the CUDA kernels' NVRTC compiles
for sm_80, sm_90 and sm_100 (no GPU needed). The GPU runs are in
test_rms_norm_gated_gpu.py."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import rtcnorm
import torch
from gated_checks import ACTIVATIONS, CASES, ORDERS, check_gated, gated_inputs, gated_reference
from reference import assert_close
from rtcnorm import _C
from torch.library import opcheck

OPS = torch.ops.rtcnorm
CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# ---- CPU against the reference -------------------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("norm_before_gate", ORDERS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cpu_matches_reference(dtype, norm_before_gate, activation):
    for n, groups in CASES:
        for g in groups:
            for weight in (True, False):
                for shape in ((5, n), (1, n), (2, 3, n)):
                    x, z, w = gated_inputs(shape, dtype, "cpu", weight=weight)
                    check_gated(x, z, w, norm_before_gate=norm_before_gate, group_size=g, activation=activation)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_float32_weight_and_strided_rows(dtype):
    base_x = torch.randn(6, 2 * 96).to(dtype)
    base_z = torch.randn(6, 3 * 96).to(dtype)
    x, z = base_x[:, 96:], base_z[:, :96]
    assert not x.is_contiguous() and not z.is_contiguous()
    w = torch.randn(96)
    for order in ORDERS:
        check_gated(x, z, w, norm_before_gate=order, group_size=32)


def test_cpu_default_eps_is_rms_norms():
    x, z, w = gated_inputs((4, 32), torch.bfloat16, "cpu")
    y = rtcnorm.rms_norm_gated(x, z, w)
    ref, _ = gated_reference(x, z, w, torch.finfo(torch.bfloat16).eps, True, None, "silu")
    assert_close(y, ref, what="y")


def test_cpu_zero_rows():
    x, z, w = gated_inputs((0, 16), torch.float32, "cpu")
    w.requires_grad_()
    y = rtcnorm.rms_norm_gated(x, z, w, group_size=4)
    assert y.shape == (0, 16)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_gradcheck_float64():
    x, z, w = (t.requires_grad_() for t in gated_inputs((3, 12), torch.float64, "cpu"))
    for order in ORDERS:
        for act in ACTIVATIONS:

            def f(x, z, w, order=order, act=act):
                return rtcnorm.rms_norm_gated(x, z, w, 1e-5, norm_before_gate=order, group_size=4, activation=act)

            assert torch.autograd.gradcheck(f, (x, z, w))


def test_backward_op_skips_unwanted_weight_grad():
    x, z, w = gated_inputs((3, 8), torch.float32, "cpu")
    y, rstd = OPS.rms_norm_gated(x, z, w, 1e-6, True, 4, "silu")
    dx, dz, dw = OPS.rms_norm_gated_backward(torch.randn_like(y), x, z, rstd, w, True, 4, "silu", False)
    assert dx.shape == x.shape and dz.shape == z.shape and dw.numel() == 0
    assert rstd.shape == (3, 2)
    xr = x.clone().requires_grad_()
    rtcnorm.rms_norm_gated(xr, z, w.clone().requires_grad_(False)).sum().backward()
    assert xr.grad is not None


# ---- bad input -------------------------------------------------------------------


def _call(x=None, z=None, w=None, eps=None, g=None, act="silu"):
    x = torch.randn(4, 12) if x is None else x
    z = torch.randn(4, 12) if z is None else z
    return OPS.rms_norm_gated(x, z, w, eps, True, g, act)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"g": 5}, ValueError, r"group_size must be a positive divisor of N = 12 .*got group_size=5"),
        ({"g": 0}, ValueError, r"group_size must be a positive divisor of N = 12 .*got group_size=0"),
        ({"g": -3}, ValueError, r"group_size must be a positive divisor"),
        ({"act": "relu"}, ValueError, r"activation must be 'silu' or 'sigmoid', got 'relu'"),
        ({"z": torch.randn(4, 6)}, ValueError, r"gate must have input's shape"),
        ({"z": torch.randn(4, 12, dtype=torch.float64)}, TypeError, r"gate must have input's dtype"),
        ({"w": torch.randn(6)}, ValueError, r"weight must have shape \[12\]"),
        ({"w": torch.randn(12, dtype=torch.float16)}, TypeError, r"weight must have input's dtype .* or float32"),
        ({"eps": -1.0}, ValueError, r"eps must be finite and >= 0"),
        ({"eps": float("nan")}, ValueError, r"eps must be finite and >= 0"),
        (
            {"x": torch.ones(4, 12, dtype=torch.int32), "z": torch.ones(4, 12, dtype=torch.int32)},
            TypeError,
            r"input must be float32, float16 or bfloat16",
        ),
        ({"x": torch.randn(4, 0), "z": torch.randn(4, 0)}, ValueError, r"last dim of input \(N\) must be 1 to"),
    ],
)
def test_bad_input_names_the_argument(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        _call(**kwargs)


def test_functional_bad_input_names_the_argument():
    x = torch.randn(2, 10)
    with pytest.raises(ValueError, match="group_size"):
        rtcnorm.rms_norm_gated(x, x, group_size=4)
    with pytest.raises(ValueError, match="activation"):
        rtcnorm.rms_norm_gated(x, x, activation="gelu")


def test_backward_bad_rstd_names_it():
    x = torch.randn(4, 12)
    with pytest.raises(ValueError, match=r"rstd must hold one Float per group of a row \(12\)"):
        OPS.rms_norm_gated_backward(x, x, x, torch.ones(4), None, True, 4, "silu", False)
    with pytest.raises(ValueError, match=r"grad_out must have input's shape"):
        OPS.rms_norm_gated_backward(torch.randn(4, 6), x, x, torch.ones(4, 3), None, True, 4, "silu", False)


# ---- opcheck, fake impls, torch.compile ----------------------------------------


@pytest.mark.parametrize("order", ORDERS)
def test_opcheck(order):
    x, z, w = gated_inputs((3, 16), torch.float32, "cpu")
    opcheck(
        OPS.rms_norm_gated.default, (x.requires_grad_(), z.requires_grad_(), w.requires_grad_(), 1e-5, order, 4, "silu")
    )
    x, z, w = x.detach(), z.detach(), w.detach()
    y, rstd = OPS.rms_norm_gated(x, z, w, 1e-5, order, 4, "sigmoid")
    opcheck(OPS.rms_norm_gated_backward.default, (torch.randn_like(y), x, z, rstd, w, order, 4, "sigmoid", True))


def test_fake_impl_checks_like_the_op():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 12)
        y, rstd = OPS.rms_norm_gated(x, x, None, None, False, 3, "silu")
        assert y.shape == (4, 12) and rstd.shape == (4, 4) and rstd.dtype == torch.float32
        with pytest.raises(ValueError, match="group_size must be a positive divisor"):
            OPS.rms_norm_gated(x, x, None, None, False, 5, "silu")


@pytest.mark.parametrize("backend,dynamic", [("eager", False), ("aot_eager", False), ("aot_eager", True)])
def test_compile_fullgraph(backend, dynamic):
    torch._dynamo.reset()

    def f(x, z, w):
        return rtcnorm.rms_norm_gated(x, z, w, 1e-5, norm_before_gate=False, group_size=8).sum(-1) * 2

    compiled = torch.compile(f, backend=backend, fullgraph=True, dynamic=dynamic)
    for shape in ((6, 32), (3, 64), (5, 16)):
        x, z, w = (t.requires_grad_() for t in gated_inputs(shape, torch.float32, "cpu"))
        out = compiled(x, z, w)
        grads = torch.autograd.grad(out.sum(), (x, z, w))
        ref = f(x, z, w)
        ref_grads = torch.autograd.grad(ref.sum(), (x, z, w))
        torch.testing.assert_close(out, ref)
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b)


# ---- the module --------------------------------------------------------------------


def test_module_matches_functional():
    m = rtcnorm.RMSNormGated(24, group_size=8, norm_before_gate=False)
    with torch.no_grad():
        m.weight.normal_()
    assert m.eps == 1e-6 and set(m.state_dict()) == {"weight"}
    x, z, _ = gated_inputs((3, 24), torch.float32, "cpu")
    torch.testing.assert_close(
        m(x, z), rtcnorm.rms_norm_gated(x, z, m.weight, 1e-6, norm_before_gate=False, group_size=8)
    )
    # No gate: a per-group RMSNorm.
    ref, _ = gated_reference(x, torch.full_like(x, 40.0), m.weight.detach(), 1e-6, True, 8, "sigmoid")
    assert_close(m(x), ref, what="y (no gate)")


# ---- NVRTC compiles (no GPU) -----------------------------------------------------------

ARCHS = (80, 90, 100)
DTYPES = ("float32", "float16", "bfloat16")


def _plan(dtype, n, g, order, sigmoid, arch, wdtype=None):
    return _C._gated_plan(dtype, wdtype or dtype, n, g, True, order, sigmoid, arch, True)


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_for_each_arch_and_dtype(arch):
    jobs = [
        (dt, n, g, order, sigmoid, arch)
        for dt in DTYPES
        for (n, g, order, sigmoid) in (
            (4096, 4096, True, False),
            (4096, 1024, False, True),
            (33, 11, True, True),
            (4097, 4097, False, False),
        )
    ]
    jobs.append(("bfloat16", 4096, 4096, False, False, arch, "float32"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        plans = list(pool.map(lambda j: _plan(*j), jobs))
    for job, plan in zip(jobs, plans):
        for phase in ("forward", "backward"):
            r = plan[phase]["ptxas"]
            assert r is not None and r["target"] == f"sm_{arch}", (job, phase, r)
            assert 16 <= r["registers"] <= 255 and r["spill_stores"] >= 0, (job, phase, r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_do_not_spill_at_4096_and_8192(dtype):
    jobs = [(dtype, n, g, order, False, 90) for n in (4096, 8192) for g in (n, 1024) for order in ORDERS]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        plans = list(pool.map(lambda j: _plan(*j), jobs))
    for job, plan in zip(jobs, plans):
        for phase in ("forward", "backward"):
            r = plan[phase]["ptxas"]
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack_frame"] == 0, (job, phase, r)


def test_plans_fall_back_only_past_the_register_rows():
    # Rows the register plans cover, and two they leave to the ATen path.
    assert _C._gated_plan("bfloat16", "bfloat16", 16384, 16384, True, True, False, 90)["backward"] is not None
    assert _C._gated_plan("bfloat16", "bfloat16", 131072, 131072, True, True, False, 90)["backward"] is None
    assert _C._gated_plan("float32", "float32", 4096, 2, True, True, False, 90)["forward"] is None
    # Odd widths take one-element vectors, more of them a thread.
    odd = _C._gated_plan("float16", "float16", 4097, 4097, True, True, False, 90)
    assert odd["forward"]["vec"] == 1 and odd["backward"]["vecs_per_thread"] == 9


@pytest.mark.parametrize(
    "n, g, phase, block, vecs",
    [
        # The forward gives a thread at most two 16-byte vectors of a segment.
        (8192, 8192, "forward", 512, 2),
        (8192, 1024, "forward", 512, 2),
        (2048, 2048, "forward", 128, 2),
        (1024, 1024, "forward", 128, 2),  # two row slots of 64 threads
        # The backward keeps four (of x, z and dy each) at 256 threads.
        (8192, 8192, "backward", 256, 4),
        (8192, 1024, "backward", 256, 4),
        # One segment of 128 threads or more takes whole warps, not a power
        # of two: no idle lanes. Narrower ones keep a power of two.
        (5120, 5120, "forward", 320, 2),
        (5120, 5120, "backward", 160, 4),
        (3072, 3072, "forward", 192, 2),
        (3072, 3072, "backward", 128, 3),
        (1536, 1536, "forward", 128, 2),
        # Segments of a row keep power-of-two groups.
        (5120, 1024, "forward", 320, 2),
    ],
)
def test_launch_shapes(n, g, phase, block, vecs):
    plan = _C._gated_plan("bfloat16", "bfloat16", n, g, True, True, False, 90)[phase]
    assert (plan["block"], plan["vec"], plan["vecs_per_thread"]) == (block, 8, vecs), plan


def test_plan_compile_fills_the_cache():
    rtcnorm.jit.reset_stats()
    _C._gated_plan("float16", "float32", 96, 32, True, False, True, 80, compile=True)
    # The forward and the backward are new here; the dW column reduce (keyed by
    # dtype and vector width only) may have been compiled by an earlier test.
    first = rtcnorm.jit.stats()["compiles"]
    assert first in (2, 3), rtcnorm.jit.stats()
    _C._gated_plan("float16", "float32", 96, 32, True, False, True, 80, compile=True)
    assert rtcnorm.jit.stats()["compiles"] == first


# ---- rtcnorm.patch on transformers' gated norms ----------------------------------------


def _gated_hf_modules():
    transformers = pytest.importorskip("transformers")
    models = transformers.models
    return {
        "mamba2": models.mamba2.modeling_mamba2.MambaRMSNormGated(64, group_size=16),
        "falcon_h1_first": models.falcon_h1.modeling_falcon_h1.FalconH1RMSNormGated(64, n_groups=4),
        "falcon_h1_gate": models.falcon_h1.modeling_falcon_h1.FalconH1RMSNormGated(
            64, n_groups=2, norm_before_gate=False
        ),
        "qwen3_next": models.qwen3_next.modeling_qwen3_next.Qwen3NextRMSNormGated(64),
        "kimi_linear": models.kimi_linear.modeling_kimi_linear.KimiLinearRMSNormGated(64),
    }


EXPECTED_LABELS = {
    "mamba2": "rms_norm_gated (gate before norm, silu, groups from group_size)",
    "falcon_h1_first": "rms_norm_gated (norm before gate, silu, groups from n_groups)",
    "falcon_h1_gate": "rms_norm_gated (gate before norm, silu, groups from n_groups)",
    "qwen3_next": "rms_norm_gated (norm before gate, silu)",
    "kimi_linear": "rms_norm_gated (norm before gate, sigmoid)",
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch_transformers_gated_norms_match_their_forward(dtype):
    import copy

    from rtcnorm.patch import is_patched

    mods = torch.nn.ModuleDict(_gated_hf_modules())
    with torch.no_grad():
        for m in mods.values():
            m.weight.normal_()
    mods = mods.to(dtype)
    orig = copy.deepcopy(mods)
    summary = rtcnorm.patch(mods)
    assert {s.name: s.kind for s in summary.swapped} == EXPECTED_LABELS and not summary.skipped, str(summary)
    for name, m in mods.items():
        assert is_patched(m), name
        x = torch.randn(3, 5, 64, dtype=dtype, requires_grad=True)
        z = torch.randn(3, 5, 64, dtype=dtype, requires_grad=True)
        dy = torch.randn(3, 5, 64, dtype=dtype)
        outs = []
        for mod in (m, orig[name]):
            y = mod(x, z)
            outs.append((y, *torch.autograd.grad(y, (x, z, mod.weight), dy)))
        scale = 4.0 if dtype == torch.bfloat16 else 1.0  # the originals round twice in bf16
        for what, a, b in zip(("y", "dx", "dz", "dw"), *outs):
            assert a.dtype == b.dtype, (name, what)
            assert_close(a, b.double(), what=f"{name} {what}", reduce_len=15, scale=scale)
    # Without a gate the module's own forward runs.
    x = torch.randn(4, 64, dtype=dtype)
    torch.testing.assert_close(mods["mamba2"](x), orig["mamba2"](x))
    assert sorted(rtcnorm.unpatch(mods)) == sorted(EXPECTED_LABELS)
