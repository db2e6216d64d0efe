"""Quantized outputs of the gated RMSNorm (rms_norm_gated_quant, quant= of
rtcnorm.rms_norm_gated): the CPU path against the float64 gated output
quantized by quant_reference, the straight-through backward, argument
errors, fake impl, opcheck, torch.compile, the module, and the NVRTC
compiles of the quantizing gated kernels for sm_80, sm_90 and sm_100 (no
GPU needed). The GPU section (marker gpu) runs the kernels and their
fallback against the same reference."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import rtcnorm
import torch
import torch.nn.functional as F
from gated_checks import gated_inputs, gated_reference
from quant_checks import (
    RECIPE_IDS,
    RECIPES,
    allowed_mismatches,
    assert_compiled_training_matches_eager,
    check_quantized,
    default_scale,
    rel_for,
)
from reference import assert_close
from rtcnorm import _C
from torch.library import opcheck

OPS = torch.ops.rtcnorm
Q = rtcnorm.Quant
E4M3, E5M2, FP4 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2
# (N, group sizes): odd widths, partial last MXFP8 / NVFP4 blocks, groups a
# block straddles (25, 11) and groups of whole blocks (32).
CASES = [(7, (None,)), (50, (None, 25)), (33, (11,)), (96, (None, 32)), (300, (60,))]
EPS = 1e-5


def run_gated_quant(x, z, w, *, norm_before_gate, group_size, recipe, out_dtype, layout, scale, activation="silu"):
    return OPS.rms_norm_gated_quant(x, z, w, EPS, norm_before_gate, group_size, activation, recipe, out_dtype,
                                    scale=scale, scale_layout=layout)  # fmt: skip


def check_gated_quant(x, z, w, *, norm_before_gate, group_size, recipe, out_dtype, layout, activation="silu"):
    """Runs the op and checks data, scales, amax and rstd against the
    float64 gated output; returns (elements, data and scale near-boundary
    mismatches)."""
    y, rstd_ref = gated_reference(x, z, w, EPS, norm_before_gate, group_size, activation)
    n = x.shape[-1]
    y2 = y.reshape(-1, n)
    scale = default_scale(recipe, out_dtype, y2)
    data, scales, amax, rstd = run_gated_quant(x, z, w, norm_before_gate=norm_before_gate, group_size=group_size,
                                               recipe=recipe, out_dtype=out_dtype, layout=layout, scale=scale,
                                               activation=activation)  # fmt: skip
    if x.is_cuda:
        torch.cuda.synchronize()
    # y's terms are products: |y| bounds their rounding. The kernels' fast
    # exp in act(z) errs by up to 2 + 1.17 |z| ulps (CUDA's __expf bound),
    # past rel_for(N)'s 16 ulps for |z| > 10: four times that allows |z| < 45.
    n_data, n_scale = check_quantized(data, scales, amax, y2, y2.abs(), tuple(x.shape[:-1]), tuple(x.shape),
                                      recipe=recipe, out_dtype=out_dtype, layout=layout, scale=scale,
                                      rel=4 * rel_for(n))  # fmt: skip
    assert rstd.dtype == torch.float32 and rstd.shape == rstd_ref.shape
    assert_close(rstd, rstd_ref, what="rstd")
    return y2.numel(), n_data, n_scale


def strided_inputs(m, n, dtype, device):
    """Rows with a stride wider than N, as aligned as contiguous ones (the
    kernels then take the same vectors)."""
    x = (torch.randn(m, n + 16, device=device)).to(dtype)[:, 8 : 8 + n]
    z = (2 * torch.randn(m, 2 * n, device=device)).to(dtype)[:, n:]
    assert not x.is_contiguous() and not z.is_contiguous()
    return x, z, (1 + 0.5 * torch.randn(n, device=device)).to(dtype)


def run_matrix(device, recipe, out_dtype, layout, dtypes, shapes):
    """Every case, gate order and shape; returns the mismatch totals."""
    total = data = scales = 0
    for i, (n, groups) in enumerate(CASES):
        for g in groups:
            for order in (True, False):
                for shape in shapes:
                    dtype = dtypes[(i + len(shape)) % len(dtypes)]
                    if shape == "strided":
                        x, z, w = strided_inputs(5, n, dtype, device)
                    else:
                        x, z, w = gated_inputs((*shape, n), dtype, device, weight=(n % 2 == 1 or g is None))
                    c = check_gated_quant(x, z, w, norm_before_gate=order, group_size=g, recipe=recipe,
                                          out_dtype=out_dtype, layout=layout)  # fmt: skip
                    total, data, scales = total + c[0], data + c[1], scales + c[2]
    return total, data, scales


# ---- CPU against the reference ----------------------------------------------------


@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_cpu_matches_reference(recipe, out_dtype, layout):
    dtypes = (torch.bfloat16, torch.float32, torch.float16)
    total, data, scales = run_matrix("cpu", recipe, out_dtype, layout, dtypes, [(1,), (6,), (2, 3), "strided"])
    # Near-boundary cases stay rare over the whole matrix, not only per call.
    assert data + scales <= allowed_mismatches(total) // 4, (data, scales, total)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_cpu_sigmoid_and_no_weight(activation):
    x, z, _ = gated_inputs((4, 64), torch.bfloat16, "cpu")
    for recipe, out_dtype, layout in RECIPES[::2]:
        check_gated_quant(x, z, None, norm_before_gate=False, group_size=16, recipe=recipe, out_dtype=out_dtype,
                          layout=layout, activation=activation)  # fmt: skip


def test_cpu_zero_rows():
    x, z, w = gated_inputs((0, 32), torch.float32, "cpu")
    qt = rtcnorm.rms_norm_gated(x, z, w, quant=Q("mxfp8", layout="blocked"))
    assert qt.shape == (0, 32) and qt.dequantize().shape == (0, 32)


# ---- training and inference forms -----------------------------------------------

QUANTS = {
    "per_tensor": lambda: Q("per_tensor", scale=0.75),
    "per_token_e5m2": lambda: Q("per_token", E5M2),
    "mxfp8_blocked": lambda: Q("mxfp8", layout="blocked"),
    "nvfp4": lambda: Q("nvfp4", scale=torch.tensor([448.0 * 6 / 8])),
}


def grads_both_ways(quant, dtype, device, *, order, group_size, weight=True, n=70):
    """Grads of x, z, w through quant= and through the unquantized op, for the same dy."""
    x, z, w = gated_inputs((6, n), dtype, device, weight=weight)
    dy = torch.randn_like(x)
    out = []
    for q in (quant, None):
        leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, z, w)]
        y = rtcnorm.rms_norm_gated(*leaves, EPS, norm_before_gate=order, group_size=group_size, quant=q)
        assert isinstance(y, rtcnorm.QuantizedTensor) == (q is not None)
        y.backward(dy)
        out.append([t.grad for t in leaves if t is not None])
    return out[0], out[1], (x, z, w, dy)


@pytest.mark.parametrize("quant", list(QUANTS))
@pytest.mark.parametrize("order", [True, False])
def test_straight_through_backward_is_the_gated_backward(quant, order):
    for dtype, g, weight in ((torch.float32, None, True), (torch.bfloat16, 35, True), (torch.float16, 14, False)):
        got, want, _ = grads_both_ways(QUANTS[quant](), dtype, "cpu", order=order, group_size=g, weight=weight)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)


def test_training_form_saves_no_quantized_tensor_and_inference_saves_nothing():
    x, z, w = gated_inputs((4, 64), torch.float32, "cpu")
    qt = rtcnorm.rms_norm_gated(x, z, w.requires_grad_(), quant=Q("mxfp8"))
    saved = qt.grad_fn.saved_tensors
    assert len(saved) == 4 and not any(isinstance(t, rtcnorm.QuantizedTensor) for t in saved)
    with torch.no_grad():
        assert rtcnorm.rms_norm_gated(x, z, w, quant=Q("mxfp8")).grad_fn is None
    assert rtcnorm.rms_norm_gated(x, z, w.detach(), quant=Q("mxfp8")).grad_fn is None


def test_double_backward_raises():
    x, z, w = (t.requires_grad_() for t in gated_inputs((3, 32), torch.float32, "cpu"))
    y = rtcnorm.rms_norm_gated(x, z, w, quant=Q("per_token"))
    (gx,) = torch.autograd.grad(y.dequantize().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported with quant="):
        gx.sum().backward()


def test_module_quant_matches_functional():
    m = rtcnorm.RMSNormGated(64, group_size=16, norm_before_gate=False, quant=Q("nvfp4", scale=100.0))
    assert "quant=Quant(recipe='nvfp4'" in repr(m)
    x, z, _ = gated_inputs((3, 64), torch.float32, "cpu")
    got = m(x, z)
    want = rtcnorm.rms_norm_gated(x, z, m.weight, 1e-6, group_size=16, norm_before_gate=False, quant=m.quant)
    assert torch.equal(got.qdata.view(torch.uint8), want.qdata.view(torch.uint8))
    assert torch.equal(got.dequantize(), want.dequantize())
    got.dequantize().sum().backward()
    assert m.weight.grad is not None
    with pytest.raises(TypeError, match=r"rtcnorm.RMSNormGated: quant must be an rtcnorm.Quant or None"):
        rtcnorm.RMSNormGated(64, quant="mxfp8")


# ---- bad input -------------------------------------------------------------------


def bad(says, recipe="per_token", out=E4M3, *, dtype=torch.float32, scale=None, layout="plain", g=None):
    return dict(says=says, recipe=recipe, out=out, dtype=dtype, scale=scale, layout=layout, g=g)


BAD_CALLS = {  # norm_quant's messages where the check is the same; the gated op's own otherwise
    "float64 input": bad("input must be float32, float16 or bfloat16 for a quantized output", dtype=torch.float64),
    "recipe": bad("recipe must be one of 'per_tensor', 'per_token', 'mxfp8', 'nvfp4'", "int8"),
    "fp8 out_dtype": bad(
        "out_dtype must be torch.float8_e4m3fn or torch.float8_e5m2", "per_tensor", torch.float16, scale=[1.0]
    ),
    "mxfp8 out_dtype": bad("out_dtype must be torch.float8_e4m3fn for recipe 'mxfp8'", "mxfp8", E5M2),
    "nvfp4 out_dtype": bad("out_dtype must be torch.float4_e2m1fn_x2 for recipe 'nvfp4'", "nvfp4", E4M3, scale=[1.0]),
    "blocked per_token": bad("scale_layout 'blocked' is for the block recipes", layout="blocked"),
    "layout": bad("scale_layout must be 'plain' or 'blocked'", "mxfp8", layout="tiled"),
    "scale given": bad("scale must be None for recipe 'mxfp8'", "mxfp8", scale=[1.0]),
    "scale missing": bad("scale (the global encode scale) is required for recipe 'nvfp4'", "nvfp4", FP4),
    "scale shape": bad("scale must be a float32 tensor of one element", "per_tensor", E5M2, scale=[1.0, 2.0]),
    "group_size": bad("group_size must be a positive divisor of N = 32", g=5),
}
VALUE_ONLY = {  # checks that need the scale's value: the real op's alone
    "scale inf": bad("scale must be finite and positive, got inf", "per_tensor", scale=[math.inf]),
    "scale nan": bad("scale must be finite and positive", "nvfp4", FP4, scale=[math.nan]),
    "scale zero": bad("scale must be finite and positive, got 0", "per_tensor", scale=[0.0]),
}


def _bad_call(c, convert):
    x = torch.randn(2, 32, dtype=c["dtype"])
    scale = torch.tensor(c["scale"]) if c["scale"] is not None else None
    t = [None if v is None else convert(v) for v in (x, torch.randn_like(x), scale)]
    return OPS.rms_norm_gated_quant(t[0], t[1], None, None, True, c["g"], "silu", c["recipe"], c["out"], t[2],
                                    c["layout"])  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_CALLS) + list(VALUE_ONLY))
def test_bad_arguments_name_the_argument(case):
    c = {**BAD_CALLS, **VALUE_ONLY}[case]
    with pytest.raises((ValueError, TypeError)) as real:
        _bad_call(c, lambda v: v)
    assert c["says"] in str(real.value)
    if case in BAD_CALLS:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as mode, pytest.raises(type(real.value)) as fake:
            _bad_call(c, mode.from_tensor)
        assert str(fake.value).splitlines()[0] == str(real.value).splitlines()[0]


def test_quant_must_be_a_quant():
    x = torch.randn(2, 8)
    with pytest.raises(TypeError, match=r"rtcnorm.rms_norm_gated: quant must be an rtcnorm.Quant or None, got str"):
        rtcnorm.rms_norm_gated(x, x, quant="mxfp8")


# ---- fake impl, opcheck, torch.compile ---------------------------------------------


@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_fake_matches_real_and_opcheck(recipe, out_dtype, layout):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, z, w = gated_inputs((3, 5, 40), torch.bfloat16, "cpu")
    scale = default_scale(recipe, out_dtype, x.double().reshape(-1, 40))
    args = (x, z, w, None, False, 20, "silu", recipe, out_dtype, scale, layout)
    real = OPS.rms_norm_gated_quant(*args)
    with FakeTensorMode() as mode:
        fake = OPS.rms_norm_gated_quant(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    for a, b in zip(real, fake, strict=True):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
    if layout == "plain":
        opcheck(OPS.rms_norm_gated_quant, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("quant", ["per_token_e5m2", "mxfp8_blocked", "nvfp4"])
def test_compiled_training_matches_eager(quant):
    def f(x, z, w, lw):
        return F.linear(rtcnorm.rms_norm_gated(x, z, w, group_size=16, quant=QUANTS[quant]()), lw)

    leaves = [torch.randn(4, 64), torch.randn(4, 64), torch.randn(64), torch.randn(8, 64)]
    assert_compiled_training_matches_eager(f, leaves)


# ---- the quantizing kernels' plans and NVRTC compiles (no GPU) -----------------

RECIPE_CODES = {"per_tensor": (1, 2), "per_token": (3, 4), "mxfp8": (5,), "nvfp4": (6,)}  # quant_math.cuh
QUANT_SHIFT, BLOCKED = 25, 1 << 28  # params.cuh kQuantShift, kBlockedScales


def quant_flags(recipe, out_dtype, layout):
    code = RECIPE_CODES[recipe][1 if out_dtype == E5M2 else 0]
    return code << QUANT_SHIFT | (BLOCKED if layout == "blocked" else 0)


def gated_plan(dtype, n, g, recipe, out_dtype, layout, arch=90, resources=False):
    return _C._gated_plan(dtype, dtype, n, g, True, True, False, arch, resources,
                          quant=quant_flags(recipe, out_dtype, layout))["forward"]  # fmt: skip


@pytest.mark.parametrize("recipe, out_dtype, layout", [("per_token", E4M3, "plain"), ("nvfp4", FP4, "blocked")])
def test_quantized_forward_takes_the_plain_launch_shape(recipe, out_dtype, layout):
    plan = gated_plan("bfloat16", 8192, 8192, recipe, out_dtype, layout)
    assert (plan["block"], plan["vecs_per_thread"]) == (512, 2), plan


def test_plans_carry_or_refuse_a_recipe():
    assert gated_plan("bfloat16", 96, 32, "mxfp8", E4M3, "plain") is not None
    assert gated_plan("bfloat16", 50, 25, "mxfp8", E4M3, "plain") is None  # a block straddles two groups
    assert gated_plan("bfloat16", 50, 50, "nvfp4", FP4, "blocked") is not None  # one group: a partial last block
    assert gated_plan("bfloat16", 48, 16, "nvfp4", FP4, "plain") is not None
    assert gated_plan("bfloat16", 48, 16, "per_token", E4M3, "plain")["kernel"].split(", ")[5] == "96"  # whole warps
    assert gated_plan("bfloat16", 272, 16, "per_token", E4M3, "plain") is None  # 17 groups: no whole warps in 512
    assert gated_plan("bfloat16", 4096, 1024, "per_token", E4M3, "plain") is not None
    flags = int(gated_plan("float16", 4096, 4096, "nvfp4", FP4, "blocked")["kernel"].split(", ")[-1].rstrip("u>"))
    assert flags >> QUANT_SHIFT == (6 | 8)


ARCHS = (80, 90, 100)
# (dtype, N, G): one element a thread (odd N), full vectors with groups of
# whole blocks, and a narrow row of whole warps.
COMPILE_SHAPES = (("float32", 7, 7), ("bfloat16", 4096, 1024), ("float16", 128, 32))


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="a compile check for GPU-less CI; the GPU tests run these kernels"
)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_recipe_compiles_for_each_arch(arch):
    jobs = [(d, n, g, *r) for d, n, g in COMPILE_SHAPES for r in RECIPES]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        plans = list(pool.map(lambda j: gated_plan(*j, arch=arch, resources=True), jobs))
    for job, plan in zip(jobs, plans, strict=True):
        assert plan is not None, job
        r = plan["ptxas"]
        assert r is not None and r["target"] == f"sm_{arch}", (job, r)
        assert 16 <= r["registers"] <= 255 and r["spill_stores"] == 0, (job, r)


# ---- the GPU: kernels and fallback against the reference -----------------------
# (50, 25) and (272, 16) take the fallback for block recipes, (272, 16) for per-token too.

GPU_CASES = CASES + [
    (2048, (None, 64)),
    (4096, (1024,)),
    (4097, (None,)),
    (272, (16,)),
    (5120, (None,)),
    (3072, (None,)),
]
GPU_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@pytest.fixture(scope="module")
def warm_quant_kernels():
    """Compiles every quantizing kernel the matrix below plans, on all CPU
    cores at once, instead of one at a time inside the test."""
    major, minor = torch.cuda.get_device_capability()
    jobs = [
        (name, name, n, g or n, True, order, False, major * 10 + minor, False, True, quant_flags(*r))
        for name in GPU_DTYPES.values()
        for n, groups in GPU_CASES
        for g in groups
        for order in (True, False)
        for r in RECIPES
    ]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda j: _C._gated_plan(*j), jobs))


@pytest.mark.gpu
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_gpu_matches_reference(recipe, out_dtype, layout, poison, warm_quant_kernels):
    total = data = scales = 0
    for dtype in GPU_DTYPES:
        for n, groups in GPU_CASES:
            for g in groups:
                for order in (True, False):
                    for m in (1, 5, 257):
                        x, z, w = gated_inputs((m, n), dtype, "cuda")
                        poison(8 * x.numel() + (1 << 20))
                        c = check_gated_quant(x, z, w, norm_before_gate=order, group_size=g, recipe=recipe,
                                              out_dtype=out_dtype, layout=layout)  # fmt: skip
                        total, data, scales = total + c[0], data + c[1], scales + c[2]
                    x, z, w = strided_inputs(7, n, dtype, "cuda")
                    check_gated_quant(x, z, w, norm_before_gate=order, group_size=g, recipe=recipe,
                                      out_dtype=out_dtype, layout=layout)  # fmt: skip
    assert data + scales <= allowed_mismatches(total) // 4, (data, scales, total)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", list(QUANTS))
def test_gpu_straight_through_backward_is_the_gated_backward(quant):
    for order in (True, False):
        for g in (None, 35):
            q = QUANTS[quant]()
            got, plain, (x, z, w, dy) = grads_both_ways(q, torch.bfloat16, "cuda", order=order, group_size=g)
            # Exactly the backward op on the quantized forward's own rstd ...
            scale = q.scale_tensor("cuda")
            rstd = OPS.rms_norm_gated_quant(x, z, w, EPS, order, g, "silu", q.recipe, q.dtype, scale, q.layout)[3]
            want = OPS.rms_norm_gated_backward(dy, x, z, rstd, w, order, g, "silu", True)
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b)
            # ... whose plan may sum rstd in another order than the unquantized one.
            for a, b, what in zip(got, plain, ("dx", "dz", "dw"), strict=True):
                assert_close(a, b, what=what, reduce_len=x.shape[0] if what == "dw" else 1)


@pytest.mark.gpu
def test_gpu_device_scale_matches_cpu():
    x, z, w = gated_inputs((9, 256), torch.bfloat16, "cuda")
    q = Q("per_tensor", scale=torch.tensor([2.0], device="cuda"))
    y = rtcnorm.rms_norm_gated(x, z, w, group_size=64, quant=q)
    ref, _ = gated_reference(x, z, w, torch.finfo(torch.bfloat16).eps, True, 64, "silu")
    torch.testing.assert_close(y.absmax.double(), ref.abs().max(), rtol=2.0**-18, atol=0)
    cpu = rtcnorm.rms_norm_gated(x.cpu(), z.cpu(), w.cpu(), group_size=64, quant=Q("per_tensor", scale=2.0))
    same = (y.qdata.cpu().view(torch.uint8) == cpu.qdata.view(torch.uint8)).float().mean()
    assert same > 0.999
