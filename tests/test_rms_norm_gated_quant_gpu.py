"""Quantized gated RMSNorm outputs on the GPU (marker gpu): the output fed to
torch._scaled_mm, a call of more than 2^31 elements against the float64
reference on sampled rows, and calls after rtcnorm.jit.precompile finding
every kernel precompiled."""

from __future__ import annotations

import math
import traceback

import pytest
import rtcnorm
import torch
from gated_checks import gated_inputs, gated_reference
from quant_checks import (
    GEMM_CASES,
    RECIPES,
    check_quantized,
    check_scaled_mm,
    default_scale,
    gemm_scales,
    rel_for,
)
from quant_reference import from_blocked
from reference import assert_close

pytestmark = pytest.mark.gpu

OPS = torch.ops.rtcnorm
E4M3, FP4 = torch.float8_e4m3fn, torch.float4_e2m1fn_x2
EPS = 1e-5
ORDERS = [True, False]
ORDER_IDS = ["norm_before_gate", "gate_before_norm"]


def run(x, z, w, order, group, recipe, out_dtype, scale, layout, activation="silu"):
    return OPS.rms_norm_gated_quant(x, z, w, EPS, order, group, activation, recipe, out_dtype, scale=scale,
                                    scale_layout=layout)  # fmt: skip


# ---- torch._scaled_mm eats the outputs -------------------------------------------


@pytest.mark.parametrize("order", ORDERS, ids=ORDER_IDS)
@pytest.mark.parametrize(("recipe", "layout", "cap"), GEMM_CASES, ids=[c[0] for c in GEMM_CASES])
def test_gpu_scaled_mm_consumes_gated_quantized_output(recipe, layout, cap, order):
    if torch.cuda.get_device_capability() < cap:
        pytest.skip(f"torch._scaled_mm with {recipe} scales needs compute capability {cap[0]}.{cap[1]}")
    # GEMM dims multiples of 16; 272 rows cross a 128-row scale tile; four groups a row.
    m, k, nout, group = 272, 2048, 256, 512
    x, z, w = gated_inputs((m, k), torch.bfloat16, "cuda")
    w64 = torch.randn(nout, k, device="cuda", dtype=torch.float64) / math.sqrt(k)
    y64, _ = gated_reference(x, z, w, EPS, order, group, "silu")
    scale, gs = gemm_scales(recipe, y64)
    data, scales, _, _ = run(x, z, w, order, group, recipe, FP4 if recipe == "nvfp4" else E4M3, scale, layout)
    check_scaled_mm(data, scales, y64, w64, recipe=recipe, layout=layout, gs=gs)


# ---- more than 2^31 elements -----------------------------------------------------

# (recipe, out_dtype, layout, group_size, norm_before_gate)
BIG = [("per_token", E4M3, "plain", None, True), ("nvfp4", FP4, "blocked", 1024, False)]


def _check_big(recipe, out_dtype, layout, group, order, poison):
    m, n, rows = 524289, 4096, 1024  # the last row lies wholly past element 2^31
    assert m * n > 2**31
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    z = torch.randn(m, n, dtype=torch.bfloat16, device="cuda").mul_(2)
    w = (1 + 0.5 * torch.randn(n, device="cuda")).to(torch.bfloat16)
    starts = (0, m // 2, m - rows)  # the first, a middle and the last rows
    refs = {s: gated_reference(x[s : s + rows], z[s : s + rows], w, EPS, order, group, "silu") for s in starts}
    scale = want_amax = None
    if recipe == "nvfp4":  # the global amax, reduced over row chunks of the reference; the usual global scale
        chunk = 1 << 14
        want_amax = max(
            float(gated_reference(x[i : i + chunk], z[i : i + chunk], w, EPS, order, group, "silu")[0].abs().max())
            for i in range(0, m, chunk)
        )
        scale = torch.tensor([448.0 * 6.0 / want_amax], device="cuda")
    poison(2 * m * n)
    data, scales, amax, rstd = run(x, z, w, order, group, recipe, out_dtype, scale, layout)
    torch.cuda.synchronize()
    if recipe != "nvfp4":  # an unwritten FP8 byte is still 0xFF, a NaN
        assert not bool(data.view(torch.uint8).eq(0xFF).any()), "data has unwritten (poisoned) bytes"
    s_blocks = -(-n // 16) if recipe == "nvfp4" else 1
    plain = from_blocked(scales, m, s_blocks) if layout == "blocked" else scales
    for s, (y, rstd_ref) in refs.items():
        part = slice(s, s + rows)
        check_quantized(data[part], plain[part], amax, y, y.abs(), (rows,), (rows, n), recipe=recipe,
                        out_dtype=out_dtype, layout="plain", scale=scale, check_amax=False,
                        rel=4 * rel_for(n))  # fmt: skip
        assert_close(rstd[part], rstd_ref, what=f"rstd of rows {s}+")
    if want_amax is not None:
        assert amax.shape == () and amax.dtype == torch.float32
        assert abs(float(amax) - want_amax) <= 4 * rel_for(n) * want_amax, f"amax {float(amax)} != {want_amax}"


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "out_dtype", "layout", "group", "order"), BIG, ids=[b[0] for b in BIG])
def test_gpu_more_than_2_pow_31_elements(recipe, out_dtype, layout, group, order, poison, require_gpu_memory):
    # x and z (bf16), the FP8 data, the poisoned pool it reuses, and the references.
    require_gpu_memory(7 * 524289 * 4096 + (8 << 30))
    try:
        _check_big(recipe, out_dtype, layout, group, order, poison)
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)  # a failure's frames hold GBs of tensors: drop them
        raise
    finally:
        torch.cuda.empty_cache()


# ---- precompiled kernels are the launched ones -------------------------------------

# Widths no other GPU test takes, so that their kernels are first loaded here:
# an odd one, and one of whole 32-blocks alone and in 37 groups of 32 (no
# whole warps for a per-token row: that recipe runs the composite path).
PRECOMPILE_SHAPES = [(999, None), (1184, None), (1184, 32)]


def test_gpu_calls_after_precompile_compile_nothing():
    major, minor = torch.cuda.get_device_capability()
    names = set()
    for n, g in PRECOMPILE_SHAPES:
        for op in ("rms_norm_gated", "rms_norm_gated_quant"):
            lines = rtcnorm.jit.precompile(op, hidden_sizes=[n], dtypes=[torch.bfloat16], archs=[major * 10 + minor],
                                           group_sizes=[g])  # fmt: skip
            names |= {ln.rsplit(" ", 2)[0] for ln in lines}
    rtcnorm.jit.reset_stats()
    for n, g in PRECOMPILE_SHAPES:
        for wd in (None, torch.bfloat16, torch.float32):
            for order in ORDERS:
                for act in ("silu", "sigmoid"):
                    x, z, w = gated_inputs((3, n), torch.bfloat16, "cuda", weight=wd is not None, weight_dtype=wd)
                    y, rstd = OPS.rms_norm_gated(x, z, w, EPS, order, g, act)
                    dy = torch.randn_like(y)
                    for want_w in (False, True) if w is not None else (False,):
                        OPS.rms_norm_gated_backward(dy, x, z, rstd, w, order, g, act, want_w)
                    for recipe, out_dtype, layout in RECIPES:
                        scale = default_scale(recipe, out_dtype, y.float())
                        run(x, z, w, order, g, recipe, out_dtype, scale, layout, activation=act)
    torch.cuda.synchronize()
    s = rtcnorm.jit.stats()
    # Every kernel the calls loaded was precompiled, and every precompiled
    # gated kernel was loaded (the dW column reduces, shared with other
    # widths, may have been loaded before).
    assert s["compiles"] == 0, s
    assert s["memory_misses"] == s["image_hits"] + s["disk_hits"], s
    gated = {k for k in names if k.startswith("rtcnorm::rms_norm_gated")}
    assert len(gated) <= s["memory_misses"] <= len(names), (len(gated), len(names), s)
