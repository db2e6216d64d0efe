"""Runs torch.ops.rtcnorm.norm_quant and checks every output against
quant_reference, for the CPU and GPU test files of quantized outputs.

Data and block scales must equal the reference exactly, except for elements
whose value lies within fp32 rounding of a rounding boundary (the op
normalizes in fp32, the reference in float64). There the op may pick the
other neighbouring code; such cases are counted, must be rare, and nothing
else may differ.
"""

from __future__ import annotations

import math

import pytest
import rtcnorm  # noqa: F401  (loads the op library)
import torch
from quant_reference import (
    BLOCK,
    FMAX,
    blocked_numel,
    blocked_offset,
    code_values,
    dequantize,
    from_blocked,
    nan_ignoring_amax,
    near_boundary,
    near_power_of_two,
    norm_reference,
    nvfp4_scale_input,
    quantize,
    table_for,
    to_blocked,
    unpack_nibbles,
)
from reference import assert_close

HAS_OP = hasattr(torch.ops.rtcnorm, "norm_quant")
needs_op = pytest.mark.skipif(not HAS_OP, reason="torch.ops.rtcnorm.norm_quant is not built into this rtcnorm yet")

# (recipe, out_dtype, scale_layout) for every combination the contract allows.
RECIPES = [
    ("per_tensor", torch.float8_e4m3fn, "plain"),
    ("per_tensor", torch.float8_e5m2, "plain"),
    ("per_token", torch.float8_e4m3fn, "plain"),
    ("per_token", torch.float8_e5m2, "plain"),
    ("mxfp8", torch.float8_e4m3fn, "plain"),
    ("mxfp8", torch.float8_e4m3fn, "blocked"),
    ("nvfp4", torch.float4_e2m1fn_x2, "plain"),
    ("nvfp4", torch.float4_e2m1fn_x2, "blocked"),
]
RECIPE_IDS = [f"{r}-{str(d).split('_', 1)[1]}-{lay}" for r, d, lay in RECIPES]
NORMS = ["rms_norm", "rms_norm+residual", "layer_norm"]
# fp32 y differs from float64 y by a few ulps (reduction, rsqrt, products).
REL = 2.0**-20


def rel_for(n: int) -> float:
    """The relative error, of its terms, that an fp32 value computed from
    statistics of a row of n elements may carry: the row sums' rounding
    grows like sqrt(n) ulps (a LayerNorm mean of 4096 fp16 values was off
    by 4e-6 of the row's magnitude, past 2^-20 of the terms)."""
    return REL * max(1.0, math.sqrt(n) / 8)


def allowed_mismatches(numel: int) -> int:
    """Near-boundary mismatches tolerated: 0.1% of the elements plus 16.
    Low-precision inputs put values exactly on boundaries more often than
    chance: per_token of bf16 rms_norm cancels rstd, leaving ratios of 16-bit
    products that are ties in exact arithmetic (about 1.5e-4 of elements,
    bunched in rows whose amax has trailing zero bits)."""
    return 16 + numel // 1000


def make_inputs(shape, ns, dtype, device, norm, *, strided=False, zero_centered_gamma=False):
    """Fresh random inputs; ``strided`` gives rows with a stride wider than N."""
    n = math.prod(ns)

    def draw(scale=1.0):
        if not strided:
            return (torch.randn(shape, device=device, dtype=torch.float64) * scale).to(dtype)
        wide = torch.randn(*shape[:-1], shape[-1] + 5, device=device, dtype=torch.float64) * scale
        return wide.to(dtype)[..., : shape[-1]]

    x = draw(2.0)
    residual = draw() if norm == "rms_norm+residual" else None
    wscale = 0.5 if zero_centered_gamma else 1.0
    w = (torch.randn(ns, device=device, dtype=torch.float64) * wscale + (0 if zero_centered_gamma else 1)).to(dtype)
    b = (torch.randn(ns, device=device, dtype=torch.float64) * 0.3).to(dtype) if norm == "layer_norm" else None
    assert w.numel() == n
    return x, residual, w, b


def default_scale(recipe, out_dtype, y):
    """per_tensor: a multiplier that saturates the top ~10% of |y|'s range;
    nvfp4: the usual global scale 448 * 6 / amax."""
    a = float(nan_ignoring_amax(y))
    a = a if math.isfinite(a) and a > 0 else 1.0
    if recipe == "per_tensor":
        return torch.tensor([FMAX[out_dtype] / (0.9 * a)], dtype=torch.float32, device=y.device)
    if recipe == "nvfp4":
        return torch.tensor([448.0 * 6.0 / a], dtype=torch.float32, device=y.device)
    return None


def run_op(x, residual, ns, w, b, eps, norm, recipe, out_dtype, scale, layout, zcg):
    return torch.ops.rtcnorm.norm_quant(
        x,
        residual,
        list(ns),
        w,
        b,
        eps,
        norm,
        recipe,
        out_dtype,
        scale=scale,
        scale_layout=layout,
        zero_centered_gamma=zcg,
    )


def _values(codes, fmt):
    v = code_values(codes, fmt)
    return torch.where(v == 0, 0.0, v)  # -0 and +0 both stand for zero


def _adjacent(a, b, fmt):
    """True where magnitudes a and b are neighbouring entries of the table."""
    table = table_for(fmt, a.device)
    ia = torch.searchsorted(table, a.abs().nan_to_num(0.0))
    ib = torch.searchsorted(table, b.abs().nan_to_num(0.0))
    same_sign = (torch.sign(a) == torch.sign(b)) | (a == 0) | (b == 0)
    return ((ia - ib).abs() == 1) & same_sign


def _reachable(va, scaled, fmt, rel, spread):
    """True where the op's value va is the rounding of some value within the
    fp32 error of ``scaled`` (rel of its terms' magnitude ``spread``): where
    a sum cancels to a value small beside its terms, that error can span
    several codes near zero, not only the neighbour across one boundary."""
    if spread is None:
        return torch.zeros_like(va, dtype=torch.bool)
    table = table_for(fmt, va.device).double()
    mids = (table[1:] + table[:-1]) / 2
    mag = va.double().abs()
    i = torch.searchsorted(table, mag.nan_to_num(0.0)).clamp(max=len(table) - 1)
    lo = torch.where(i > 0, mids[(i - 1).clamp(min=0)], 0.0)  # va's rounding interval [lo, hi]
    hi = torch.where(i < len(mids), mids[i.clamp(max=len(mids) - 1)], float("inf"))
    tol = rel * torch.maximum(scaled.double().abs(), spread.double().nan_to_num(0.0))
    s = scaled.double() * torch.where(va < 0, -1.0, 1.0)  # in va's sign
    return (s + tol >= lo) & (s - tol <= hi) & ~torch.isnan(scaled)


def compare_codes(actual, expected, scaled, fmt, what, rel=REL, spread=None) -> int:
    """Codes must match except neighbours at near-boundary elements; returns
    the count of those."""
    va, ve = _values(actual, fmt), _values(expected, fmt)
    diff = ~((va == ve) | (torch.isnan(va) & torch.isnan(ve)))
    if not bool(diff.any()):
        return 0
    ok = (near_boundary(scaled, fmt, rel, spread) & _adjacent(va, ve, fmt)) | _reachable(va, scaled, fmt, rel, spread)
    bad = diff & ~ok
    if bool(bad.any()):
        idx = bad.nonzero()[:5].tolist()
        first = tuple(idx[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {diff.numel()} codes differ from the reference away from a "
            f"rounding boundary; first at {idx}: op {va[first].item()} ref {ve[first].item()} "
            f"(value before rounding {scaled[first].item()!r})"
        )
    return int(diff.sum())


def check_scales(recipe, actual_plain, ref, gs, rel=REL) -> int:
    """Returns the count of block scales that took the neighbouring value
    because the block amax sat within fp32 rounding of a boundary."""
    if recipe == "per_tensor":
        assert torch.equal(actual_plain, ref.scales), f"scales {actual_plain} != 1/scale {ref.scales}"
        return 0
    if recipe == "per_token":
        torch.testing.assert_close(actual_plain.double(), ref.scales.double(), rtol=rel, atol=0, msg="per_token scales")
        return 0
    if recipe == "mxfp8":
        a, e = actual_plain.view(torch.uint8).long(), ref.scales.view(torch.uint8).long()
        ok = (a == e) | (((a - e).abs() == 1) & near_power_of_two(ref.block_amax, rel, ref.block_spread))
        assert bool(ok.all()), f"mxfp8 scales differ at {(~ok).nonzero()[:5].tolist()}"
        return int((a != e).sum())
    s_in = nvfp4_scale_input(ref.block_amax, gs)
    s_spread = nvfp4_scale_input(ref.block_spread, gs)
    e4m3 = torch.float8_e4m3fn
    return compare_codes(actual_plain.view(torch.uint8), ref.scales.view(torch.uint8), s_in, e4m3, "nvfp4 scales",
                         rel, s_spread)  # fmt: skip


def check_norm_quant(
    x, ns, *, norm, recipe, out_dtype, layout="plain", residual=None, weight=None, bias=None, eps=None,
    zcg=False, scale=None, poison=None,
):  # fmt: skip
    """Runs the op and checks all six outputs; returns (elements, data
    near-boundary mismatches, scale near-boundary mismatches)."""
    base = "rms_norm" if norm.startswith("rms_norm") else norm
    if scale is None:
        y = norm_reference(x, residual, list(ns), weight, bias, eps, base, zcg)["y"]
        scale = default_scale(recipe, out_dtype, y)
    if poison is not None:
        poison(8 * x.numel() + (64 << 20))
    outs = run_op(x, residual, ns, weight, bias, eps, base, recipe, out_dtype, scale, layout, zcg)
    if x.is_cuda:
        torch.cuda.synchronize()
    return check_outputs(outs, x, ns, norm=base, recipe=recipe, out_dtype=out_dtype, layout=layout, residual=residual,
                         weight=weight, bias=bias, eps=eps, zcg=zcg, scale=scale)  # fmt: skip


def check_outputs(
    outs, x, ns, *, norm, recipe, out_dtype, layout, residual, weight, bias, eps, zcg, scale, check_amax=True
):  # fmt: skip
    """Checks the op's outputs ``outs`` for input ``x`` (also usable on a
    slice of rows of a call, with plain scales of those rows and
    ``check_amax=False``)."""
    data, scales, amax, h, mean, rstd = outs
    base = norm
    n = math.prod(ns)
    lead = tuple(x.shape[: x.dim() - len(ns)])
    m = math.prod(lead)
    ref_n = norm_reference(x, residual, list(ns), weight, bias, eps, base, zcg)
    y, spread = ref_n["y"].reshape(m, n), ref_n["spread"].reshape(m, n)
    n_data, n_scale = check_quantized(data, scales, amax, y, spread, lead, tuple(x.shape), recipe=recipe,
                                      out_dtype=out_dtype, layout=layout, scale=scale, check_amax=check_amax)  # fmt: skip
    if residual is not None:
        assert h.dtype == x.dtype and torch.equal(h, ref_n["h"]), "h != input + residual in input's dtype"
    else:
        assert h.shape == (0,) and h.dtype == x.dtype, f"h must be empty {x.dtype}, got {h.shape} {h.dtype}"
    if base == "layer_norm":
        assert_close(mean, ref_n["mean"], what="mean")
    else:
        assert mean.shape == (0,) and mean.dtype == torch.float32, f"mean must be empty fp32, got {mean.shape}"
    assert_close(rstd, ref_n["rstd"], what="rstd")
    return m * n, n_data, n_scale


def check_quantized(
    data, scales, amax, y, spread, lead, shape, *, recipe, out_dtype, layout, scale, check_amax=True, rel=None
):  # fmt: skip
    """Checks a quantized output (data, scales, amax) of rows ``lead`` (the
    unquantized output's ``shape``) against the float64 output ``y`` (M, N)
    and its terms' magnitude ``spread``; ``rel``: the relative error of the
    op's fp32 y (default rel_for(N)). Returns (data, scale) near-boundary
    mismatch counts."""
    m, n = y.shape
    amax_rel = REL if rel is None else max(REL, rel)
    rel = rel_for(n) if rel is None else rel

    # ---- shapes, dtypes
    assert data.dtype == out_dtype, f"data dtype {data.dtype}"
    exp_data_shape = lead + ((n + 1) // 2,) if recipe == "nvfp4" else shape
    assert tuple(data.shape) == exp_data_shape, f"data shape {tuple(data.shape)} != {exp_data_shape}"
    s_blocks = -(-n // BLOCK[recipe]) if recipe in BLOCK else 1

    # ---- scales (plain view), then data given the op's own block scales
    ref = quantize(y, recipe, out_dtype, scale=scale, spread=spread)
    if layout == "blocked":
        assert scales.dim() == 1 and scales.numel() == blocked_numel(m, s_blocks), f"blocked scales {scales.shape}"
        plain = from_blocked(scales, m, s_blocks)
        pad = scales.view(torch.uint8).clone()
        pad.view(-1)[_blocked_positions(m, s_blocks, scales.device)] = 0
        assert not bool(pad.any()), "blocked scales: padding entries are not 0"
    else:
        exp_scale_shape = {"per_tensor": (), "per_token": lead + (1,)}.get(recipe, lead + (s_blocks,))
        assert tuple(scales.shape) == exp_scale_shape, f"scales shape {tuple(scales.shape)} != {exp_scale_shape}"
        plain = scales.reshape(ref.scales.shape)
    assert plain.dtype == ref.scales.dtype, f"scales dtype {plain.dtype} != {ref.scales.dtype}"
    n_scale = check_scales(recipe, plain, ref, scale, rel=rel)
    if recipe in BLOCK and n_scale:
        ref = quantize(y, recipe, out_dtype, scale=scale, block_scales=plain, spread=spread)

    if recipe == "nvfp4":
        raw = data.reshape(m, (n + 1) // 2).view(torch.uint8)
        if n % 2:
            assert not bool((raw[:, -1] >> 4).any()), "nvfp4: an odd N's last high nibble is not 0"
        got = unpack_nibbles(raw, n)
        want = unpack_nibbles(ref.data, n)
    else:
        got = data.reshape(m, n).view(torch.uint8)
        want = ref.data
    n_data = compare_codes(got, want, ref.scaled, ref.fmt, f"{recipe} data", rel=rel, spread=ref.spread)
    cap = allowed_mismatches(m * n)
    assert n_data <= cap and n_scale <= cap, f"near-boundary mismatches: data {n_data}, scales {n_scale}, cap {cap}"

    # ---- amax
    if not check_amax:
        pass
    elif recipe in ("per_tensor", "nvfp4"):
        assert amax.dtype == torch.float32 and amax.shape == (), f"amax {amax.dtype} {tuple(amax.shape)}"
        torch.testing.assert_close(amax.double(), ref.amax.double(), rtol=amax_rel, atol=0, msg="amax")
    else:
        assert amax.shape == (0,) and amax.dtype == torch.float32, f"amax must be empty fp32, got {amax.shape}"
    return n_data, n_scale


def _blocked_positions(m, s, device):
    r = torch.arange(m, device=device)[:, None]
    c = torch.arange(s, device=device)[None, :]
    return blocked_offset(r, c, s).reshape(-1)


def assert_compiled_training_matches_eager(f, leaves):
    """f's output and the leaves' gradients, eager and under
    torch.compile(fullgraph, aot_eager: inductor's CPU code generation has no
    E8M0 or FP4 types), bitwise equal."""
    results = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        ts = [t.clone().requires_grad_() for t in leaves]
        out = fn(*ts)
        out.backward(torch.ones_like(out))
        results.append([out] + [t.grad for t in ts])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- torch._scaled_mm eats a quantized output (GPU tests) ------------------------

# (recipe, layout, minimum compute capability). The block recipes need
# block-scaled GEMMs (sm_100), and then the weight is block-quantized too:
# _scaled_mm takes one scaling kind for both operands.
GEMM_CASES = [("per_tensor", "plain", (8, 9)), ("per_token", "plain", (8, 9))]
GEMM_CASES += [("mxfp8", "blocked", (10, 0)), ("nvfp4", "blocked", (10, 0))]
# Relative Frobenius error of the quantized GEMM against the bf16 GEMM of the
# unquantized operands: FP8 rounds each operand to 2^-4 at worst, E2M1 to 1/6.
FORMAT_TOL = {"per_tensor": 0.08, "per_token": 0.08, "mxfp8": 0.08, "nvfp4": 0.3}


def gemm_scales(recipe, y64):
    """The op's scale argument for a GEMM operand whose float64 value is y64:
    per_tensor maps its amax to 448, nvfp4's global scale to 448 * 6.
    Returns (scale tensor or None, nvfp4 global scale or None)."""
    amax = float(y64.abs().max())
    gs = 448.0 * 6.0 / amax if recipe == "nvfp4" else None
    scale = {"per_tensor": 448.0 / amax, "nvfp4": gs}.get(recipe)
    scale = None if scale is None else torch.tensor([scale], device=y64.device, dtype=torch.float32)
    return scale, gs


def quantize_gemm_weight(w64, recipe):
    """The GEMM's other operand, quantized by the reference: per-tensor e4m3
    for the FP8 recipes, the same block recipe for the block ones. Returns
    (data as _scaled_mm takes it, its scale argument, dequantized float64,
    global scale or None)."""
    k = w64.shape[1]
    amax = float(w64.abs().max())
    if recipe in ("per_tensor", "per_token"):
        ws = torch.tensor(448.0 / amax, dtype=torch.float32, device=w64.device)
        ref = quantize(w64, "per_tensor", torch.float8_e4m3fn, scale=ws)
        data = ref.data.view(torch.float8_e4m3fn)
        inv = ref.scales.reshape(())
        sb = inv if recipe == "per_tensor" else inv.expand(1, w64.shape[0]).contiguous()
        return data, sb, dequantize("per_tensor", data, inv, k), None
    gs = 448.0 * 6.0 / amax if recipe == "nvfp4" else None
    ref = quantize(w64, recipe, torch.float8_e4m3fn, scale=gs)
    data = ref.data.view(torch.float4_e2m1fn_x2 if recipe == "nvfp4" else torch.float8_e4m3fn)
    return data, to_blocked(ref.scales), dequantize(recipe, data, ref.scales, k, gs=gs), gs


def check_scaled_mm(data, scales, y64, w64, *, recipe, layout, gs):
    """torch._scaled_mm of an op's quantized output (data, scales) of the
    float64 value y64 (M, K) with w64 (Nout, K), quantized by the reference:
    equal to the GEMM of the dequantized operands up to bf16 rounding, and
    within the format's tolerance of the bf16 GEMM of y64 and w64."""
    k = y64.shape[1]
    wq, sb, w_deq, w_gs = quantize_gemm_weight(w64, recipe)
    out = torch._scaled_mm(data, wq.t(), scales, sb, out_dtype=torch.bfloat16).double()
    if recipe == "nvfp4":
        out = out / (gs * w_gs)  # the global scales stay outside the GEMM
    a_deq = dequantize(recipe, data, scales, k, gs=gs, layout=layout)
    want = a_deq @ w_deq.t()
    err = float((out - want).abs().max() / want.abs().max())
    assert err < 2.0**-7, f"_scaled_mm vs GEMM of the dequantized operands: max rel error {err:.3g}"
    exact = (y64 @ w64.t()).to(torch.bfloat16).double()
    frob = float(torch.linalg.norm(out - exact) / torch.linalg.norm(exact))
    assert frob < FORMAT_TOL[recipe], f"quantized GEMM vs bf16 GEMM: relative error {frob:.3g}"
