"""Quantized norm outputs (issue 61) on the GPU: norm_quant's kernels against
the float64 reference with poisoned outputs, the scales fed to
torch._scaled_mm, and a call of more than 2^31 elements."""

from __future__ import annotations

import math

import pytest
import rtcnorm
import torch
from quant_checks import (
    GEMM_CASES,
    NORMS,
    RECIPE_IDS,
    RECIPES,
    check_norm_quant,
    check_outputs,
    check_scaled_mm,
    gemm_scales,
    make_inputs,
    needs_op,
    run_op,
)
from quant_reference import from_blocked, nan_ignoring_amax, norm_reference
from rtcnorm import _tuning

pytestmark = [pytest.mark.gpu, needs_op]

GPU_N = [1, 7, 31, 33, 100, 4096, 4097]
GPU_M = [1, 5, 300]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("m", GPU_M)
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_gpu_matches_reference(recipe, out_dtype, layout, norm, dtype, n, m, poison):
    x, r, w, b = make_inputs((m, n), (n,), dtype, "cuda", norm)
    check_norm_quant(x, (n,), norm=norm, recipe=recipe, out_dtype=out_dtype, layout=layout, residual=r, weight=w,
                     bias=b, poison=poison)  # fmt: skip


@pytest.mark.parametrize("n", [100, 4097, 8192])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_gpu_strided_rows_zero_centered_gamma(recipe, out_dtype, layout, norm, n, poison):
    x, r, w, b = make_inputs((300, n), (n,), torch.bfloat16, "cuda", norm, strided=True, zero_centered_gamma=True)
    assert not x.is_contiguous()
    check_norm_quant(x, (n,), norm=norm, recipe=recipe, out_dtype=out_dtype, layout=layout, residual=r, weight=w,
                     bias=b, zcg=True, eps=1e-6, poison=poison)  # fmt: skip


# flat_row carries the epilogue for 16-bit rows of odd width: one row block
# (1, 3 rows), many blocks with a partial last one, a row shorter than a block,
# rows read from their stage in chunks.
@pytest.mark.parametrize(("m", "n"), [(1, 1973), (3, 4097), (517, 1973), (129, 33), (64, 5), (3, 40001)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_gpu_flat_rows_forced(recipe, out_dtype, layout, norm, dtype, m, n, poison):
    x, r, w, b = make_inputs((m, n), (n,), dtype, "cuda", norm)
    base = "rms_norm" if norm.startswith("rms_norm") else norm
    with _tuning.norm_override("fwd", "flat_row"):
        kw = {"quant": recipe, "quant_dtype": out_dtype, "scale_layout": layout}
        plan = rtcnorm.explain(base, (m, n), dtype, device="cuda", residual=r is not None, **kw)
        assert plan["design"] == "flat_row", plan["reason"]
        check_norm_quant(x, (n,), norm=norm, recipe=recipe, out_dtype=out_dtype, layout=layout, residual=r, weight=w,
                         bias=b, poison=poison)  # fmt: skip


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_gpu_nan_and_inf_columns(recipe, out_dtype, layout, bad, poison):
    x, _, w, _ = make_inputs((6, 50), (50,), torch.float32, "cuda", "rms_norm")
    w[3] = bad
    scale = {"per_tensor": 1.0, "nvfp4": 100.0}.get(recipe)
    scale = None if scale is None else torch.tensor([scale], device="cuda")
    check_norm_quant(x, (50,), norm="rms_norm", recipe=recipe, out_dtype=out_dtype, layout=layout, weight=w,
                     scale=scale, poison=poison)  # fmt: skip


# ---- torch._scaled_mm eats the outputs -------------------------------------------


@pytest.mark.parametrize(("recipe", "layout", "cap"), GEMM_CASES, ids=[c[0] for c in GEMM_CASES])
def test_gpu_scaled_mm_consumes_quantized_output(recipe, layout, cap):
    if torch.cuda.get_device_capability() < cap:
        pytest.skip(f"torch._scaled_mm with {recipe} scales needs compute capability {cap[0]}.{cap[1]}")
    m, k, nout = 272, 2048, 256  # GEMM dims multiples of 16; 272 rows cross a 128-row scale tile
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 2
    g = (torch.randn(k, device="cuda") * 0.2 + 1).to(torch.bfloat16)
    w64 = torch.randn(nout, k, device="cuda", dtype=torch.float64) / math.sqrt(k)
    y64 = norm_reference(x, None, [k], g, None, None, "rms_norm")["y"]
    scale, gs = gemm_scales(recipe, y64)
    data, scales, *_ = run_op(x, None, [k], g, None, None, "rms_norm", recipe,
                              torch.float4_e2m1fn_x2 if recipe == "nvfp4" else torch.float8_e4m3fn, scale, layout,
                              False)  # fmt: skip
    check_scaled_mm(data, scales, y64, w64, recipe=recipe, layout=layout, gs=gs)


# ---- more than 2^31 elements -----------------------------------------------------

BIG = [("per_token", torch.float8_e4m3fn, "plain"), ("mxfp8", torch.float8_e4m3fn, "plain")]
BIG += [("nvfp4", torch.float4_e2m1fn_x2, "blocked")]


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), BIG, ids=[b[0] for b in BIG])
def test_gpu_more_than_2_pow_31_elements(recipe, out_dtype, layout, poison, require_gpu_memory):
    m, n = 524289, 4096  # the last row lies wholly past element 2^31
    assert m * n > 2**31
    require_gpu_memory(4 * m * n + (8 << 30))
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    w = (torch.randn(n, device="cuda") * 0.5 + 1).to(torch.bfloat16)
    scale = torch.tensor([448.0 * 6.0 / 16.0], device="cuda") if recipe == "nvfp4" else None
    poison(2 * m * n)
    outs = run_op(x, None, [n], w, None, None, "rms_norm", recipe, out_dtype, scale, layout, False)
    torch.cuda.synchronize()
    data, scales, amax, h, mean, rstd = outs
    if recipe != "nvfp4":  # an unwritten FP8 byte is still 0xFF, a NaN
        assert not bool(data.view(torch.uint8).eq(0xFF).any()), "data has unwritten (poisoned) bytes"
    s_blocks = -(-n // (16 if recipe == "nvfp4" else 32))
    plain = from_blocked(scales, m, s_blocks) if layout == "blocked" else scales
    for start in (0, m // 2, m - 1024):  # the first, a middle and the last rows
        rows = slice(start, start + 1024)
        part = (data[rows], plain[rows], amax, h, mean, rstd[rows])
        check_outputs(part, x[rows], (n,), norm="rms_norm", recipe=recipe, out_dtype=out_dtype, layout="plain",
                      residual=None, weight=w, bias=None, eps=None, zcg=False, scale=scale,
                      check_amax=False)  # fmt: skip
    if recipe == "nvfp4":  # the global amax, reduced over row chunks of the reference
        chunk = 1 << 14
        want = max(
            float(nan_ignoring_amax(norm_reference(x[i : i + chunk], None, [n], w, None, None, "rms_norm")["y"]))
            for i in range(0, m, chunk)
        )
        assert amax.shape == () and amax.dtype == torch.float32
        assert abs(float(amax) - want) <= 2.0**-20 * want, f"amax {float(amax)} != {want}"
