"""Quantized norm outputs (issue 61) on CPU: the float64 reference checked on
hand-computed cases, then torch.ops.rtcnorm.norm_quant against it (skipped
until the op is built) and its argument errors. The GPU half is
test_quant_outputs_gpu.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quant_checks import NORMS, RECIPE_IDS, RECIPES, check_norm_quant, make_inputs, needs_op, run_op
from quant_reference import (
    blocked_offset,
    code_values,
    dequantize,
    e8m0_byte,
    fp8_table,
    from_blocked,
    near_boundary,
    near_power_of_two,
    pack_nibbles,
    quantize,
    round_codes,
    to_blocked,
    unpack_nibbles,
)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
NAN, INF = math.nan, math.inf


def _vals(v, fmt):
    return code_values(round_codes(torch.tensor(v, dtype=torch.float64), fmt), fmt).tolist()


# ---- the reference itself ------------------------------------------------------


def test_fp8_tables_are_the_formats():
    e4, e5 = fp8_table(E4M3), fp8_table(E5M2)
    assert len(e4) == 127 and e4[-1] == 448 and e4[1] == 2.0**-9 and e4[8] == 2.0**-6
    assert len(e5) == 124 and e5[-1] == 57344 and e5[1] == 2.0**-16 and e5[4] == 2.0**-14


def test_fp8_round_to_nearest_even_and_saturate():
    # 1.0625 lies halfway between 1 (even code) and 1.125; 1.1875 between 1.125 and 1.25 (even).
    assert _vals([1.0625, 1.1875, 1.0625 + 1e-9, -1.0625], E4M3) == [1.0, 1.25, 1.125, -1.0]
    # Subnormals: 2^-10 is halfway between 0 and 2^-9, 3 * 2^-10 between 2^-9 and 2^-8.
    assert _vals([2.0**-10, 3 * 2.0**-10, 2.0**-11], E4M3) == [0.0, 2.0**-8, 0.0]
    # Saturation: everything past 448 (inf included) goes to +-448.
    assert _vals([448, 449, 464, 480, 1e30, INF, -INF, -500], E4M3) == [448, 448, 448, 448, 448, 448, -448, -448]
    assert _vals([57344, 61440, 1e9, INF, -INF], E5M2) == [57344] * 4 + [-57344]
    # e5m2: 1.125 is halfway between 1 (even) and 1.25; 1.375 between 1.25 and 1.5 (even).
    assert _vals([1.125, 1.375], E5M2) == [1.0, 1.5]


def test_fp8_nan_and_signed_zero_codes():
    codes = round_codes(torch.tensor([NAN, -NAN, 0.0, -0.0, -1e-30]), E4M3).tolist()
    assert codes == [0x7F, 0x7F, 0x00, 0x80, 0x80]
    assert round_codes(torch.tensor([NAN]), E5M2).view(E5M2).float().isnan().all()


def test_fp8_reference_agrees_with_torch_cast_inside_the_range():
    # torch's cast rounds to nearest even too but does not saturate: compare below FMAX.
    for dtype, fmax in ((E4M3, 448.0), (E5M2, 57344.0)):
        v = (torch.randn(20000, dtype=torch.float64) * fmax / 8).clamp(-fmax, fmax).float().double()
        assert torch.equal(round_codes(v, dtype), v.float().to(dtype).view(torch.uint8))


def test_e2m1_ties_to_even_saturation_and_nan():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    assert _vals(ties, "e2m1") == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert _vals([-t for t in ties], "e2m1") == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]
    assert _vals([0.26, 2.6, 5.01, 6.0, 7.0, 1e9, INF, -INF], "e2m1") == [0.5, 3.0, 6.0, 6.0, 6.0, 6.0, 6.0, -6.0]
    codes = round_codes(torch.tensor([NAN, -0.0, -6.0, 6.0, 0.5]), "e2m1").tolist()
    assert codes == [0x7, 0x8, 0xF, 0x7, 0x1]


def test_nibble_packing_low_then_high_and_odd_tail():
    codes = torch.tensor([[0x1, 0x2, 0x3, 0xF, 0x8]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0xF3, 0x08]]
    assert torch.equal(unpack_nibbles(packed, 5), codes)


@pytest.mark.parametrize(
    ("amax", "byte"),
    [
        (0.0, 0),  # zero block
        (1e-40, 0),  # fp32 subnormal
        (2.0**-119, 0),  # E - 8 = -127: the smallest scale, byte 0
        (2.0**-118, 1),
        (1.0, 119),
        (448.0, 127),  # E = 8: scale 1, 448 stays 448
        (449.0, 127),  # still E = 8: 449 saturates to 448
        (511.99, 127),
        (512.0, 128),  # E = 9: scale 2
        (2.0**127 * 1.5, 246),
        (INF, 0xFF),
    ],
)
def test_e8m0_floor_rule(amax, byte):
    assert e8m0_byte(torch.tensor([amax], dtype=torch.float32)).item() == byte


def test_mxfp8_block_values_around_448():
    # One block per row: 449 -> scale 1, data saturates to 448; 512 -> scale 2, 256.
    y = torch.zeros(3, 32, dtype=torch.float64)
    y[0, 0], y[1, 0], y[2, 0] = 449.0, 512.0, 470.0
    y[:, 1] = 3.0
    r = quantize(y, "mxfp8")
    assert r.scales.view(torch.uint8)[:, 0].tolist() == [127, 128, 127]
    assert code_values(r.data[:, :2], E4M3).tolist() == [[448.0, 3.0], [256.0, 1.5], [448.0, 3.0]]
    deq = dequantize("mxfp8", r.data.view(E4M3), r.scales, 32)
    assert deq[:, 0].tolist() == [448.0, 512.0, 448.0]


def test_mxfp8_partial_block_inf_and_nan():
    y = torch.ones(2, 40, dtype=torch.float64)
    y[0, 33] = 6.0  # partial last block of 8: amax 6 -> E = 2, byte 121
    y[1, 3] = INF
    y[1, 35] = NAN
    r = quantize(y, "mxfp8")
    assert r.scales.view(torch.uint8).tolist() == [[119, 121], [0xFF, 119]]
    d = code_values(r.data, E4M3)
    assert bool(d[1, :32].isnan().all()) and d[1, 35].isnan() and d[1, 34] == 2.0**8
    assert d[0, 33] == 6.0 * 2.0**6 and d[0, 32] == 2.0**6


def test_nvfp4_two_level_scale():
    gs = 448.0 * 6.0 / 12.0  # global encode scale for a tensor amax of 12
    y = torch.zeros(1, 20, dtype=torch.float64)
    y[0, :4] = torch.tensor([12.0, -6.0, 1.0, 0.5])
    y[0, 16:19] = torch.tensor([0.3, 0.2, -0.1])
    r = quantize(y, "nvfp4", scale=gs)
    # Block 0: S = cvt_e4m3(12 / 6 * 224) = 448; enc = 224 / 448 = 0.5.
    # Block 1: 0.3 / 6 * 224 = 11.2 -> 11; enc = 224 / 11.
    assert code_values(r.scales.view(torch.uint8), E4M3).tolist() == [[448.0, 11.0]]
    q = code_values(unpack_nibbles(r.data, 20), "e2m1")
    # 0.3, 0.2, -0.1 times fp32(224 / 11) = 20.36: 6.11 -> 6, 4.07 -> 4, -2.04 -> -2.
    assert q[0, :4].tolist() == [6.0, -3.0, 0.5, 0.0]  # 0.25 ties to 0
    assert q[0, 16:19].tolist() == [6.0, 4.0, -2.0]
    deq = dequantize("nvfp4", r.data, r.scales, 20, gs=gs)
    assert deq[0, 0] == 12.0 and deq[0, 1] == -6.0 and r.data.shape == (1, 10)


def test_per_token_zero_row_and_per_tensor_scale():
    y = torch.tensor([[0.0, 0.0], [1.0, -3.0]], dtype=torch.float64)
    r = quantize(y, "per_token", E4M3)
    assert r.scales.tolist() == [[1.0], [torch.tensor(3.0).div(448.0).item()]]
    assert code_values(r.data, E4M3).tolist()[1][1] == -448.0
    p = quantize(y, "per_tensor", E5M2, scale=torch.tensor([3.0]))
    assert p.scales.item() == torch.tensor(1.0, dtype=torch.float32).div(3.0).item() and p.amax.item() == 3.0


def test_near_boundary_flags_midpoints_only():
    v = torch.tensor([1.0625, 1.0625 * (1 + 2.0**-23), 1.0625 * (1 + 2.0**-18), 1.1, 448.0, 500.0, NAN])
    assert near_boundary(v, E4M3).tolist() == [True, True, False, False, False, False, False]
    assert near_boundary(torch.tensor([2.5 * (1 - 2.0**-24), 2.6]), "e2m1").tolist() == [True, False]
    a = torch.tensor([512.0 * (1 - 2.0**-24), 512.0 * (1 + 2.0**-23), 500.0, 0.0, INF])
    assert near_power_of_two(a).tolist() == [True, True, False, False, False]


@pytest.mark.parametrize(("m", "s"), [(1, 1), (5, 3), (128, 4), (130, 5), (257, 9)])
def test_blocked_layout_matches_the_offset_formula(m, s):
    ids = torch.arange(1, m * s + 1, dtype=torch.int64).reshape(m, s)
    flat = to_blocked(ids)
    assert flat.numel() == (-(-m // 128) * 128) * (-(-s // 4) * 4)
    r, c = torch.meshgrid(torch.arange(m), torch.arange(s), indexing="ij")
    pos = blocked_offset(r, c, s)
    assert torch.equal(flat[pos], ids)
    assert int((flat != 0).sum()) == m * s  # everything else is padding 0
    assert torch.equal(from_blocked(flat, m, s), ids)


def test_blocked_offset_hand_computed():
    # 130 x 5 scales: two row tiles and two column tiles of 128 x 4.
    cases = {(0, 0): 0, (0, 3): 3, (1, 0): 16, (31, 3): 499, (32, 0): 4, (127, 3): 511, (0, 4): 512, (129, 4): 1552}
    for (r, c), off in cases.items():
        assert blocked_offset(r, c, 5) == off, (r, c)
    one_byte = torch.tensor([[7, 9]], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    out = to_blocked(one_byte).view(torch.uint8)
    assert out.numel() == 512 and out[:2].tolist() == [7, 9] and int(out[2:].sum()) == 0


# ---- the op against the reference ----------------------------------------------

CPU_SHAPES = [((1, 1), (1,)), ((5, 7), (7,)), ((300, 31), (31,)), ((5, 33), (33,)), ((2, 3, 100), (100,))]
CPU_SHAPES += [((1, 4096), (4096,)), ((3, 4097), (4097,)), ((2, 5, 6), (5, 6))]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@needs_op
@pytest.mark.parametrize(("shape", "ns"), CPU_SHAPES, ids=lambda v: "x".join(map(str, v)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_cpu_matches_reference(recipe, out_dtype, layout, norm, dtype, shape, ns):
    x, r, w, b = make_inputs(shape, ns, dtype, "cpu", norm)
    check_norm_quant(x, ns, norm=norm, recipe=recipe, out_dtype=out_dtype, layout=layout, residual=r, weight=w, bias=b)


@needs_op
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_cpu_strided_rows_zero_centered_gamma_many_tiles(recipe, out_dtype, layout, norm):
    # 300 rows cross the 128-row scale tile; N = 400 gives 13 MX blocks (4 column tiles, the last
    # partial) and 25 NVFP4 blocks.
    shape, ns = (300, 400), (400,)
    x, r, w, b = make_inputs(shape, ns, torch.bfloat16, "cpu", norm, strided=True, zero_centered_gamma=True)
    assert not x.is_contiguous()
    check_norm_quant(x, ns, norm=norm, recipe=recipe, out_dtype=out_dtype, layout=layout, residual=r, weight=w,
                     bias=b, zcg=True, eps=1e-6)  # fmt: skip


@needs_op
@pytest.mark.parametrize("bad", [NAN, INF])
@pytest.mark.parametrize(("recipe", "out_dtype", "layout"), RECIPES, ids=RECIPE_IDS)
def test_cpu_nan_and_inf_columns(recipe, out_dtype, layout, bad):
    # A NaN or inf weight entry makes one column of y non-finite; the others stay finite.
    x, _, w, _ = make_inputs((6, 50), (50,), torch.float32, "cpu", "rms_norm")
    w[3] = bad
    scale = torch.tensor([1.0]) if recipe == "per_tensor" else torch.tensor([100.0]) if recipe == "nvfp4" else None
    check_norm_quant(x, (50,), norm="rms_norm", recipe=recipe, out_dtype=out_dtype, layout=layout, weight=w,
                     scale=scale)  # fmt: skip


@needs_op
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(0, 5), min_size=0, max_size=2),
    ns=st.lists(st.integers(1, 80), min_size=1, max_size=2),
    dtype=st.sampled_from(DTYPES),
    norm=st.sampled_from(NORMS),
    recipe=st.sampled_from(range(len(RECIPES))),
    zcg=st.booleans(),
    strided=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_cpu_property_matches_reference(lead, ns, dtype, norm, recipe, zcg, strided, seed):
    torch.manual_seed(seed)
    recipe, out_dtype, layout = RECIPES[recipe]
    x, r, w, b = make_inputs((*lead, *ns), ns, dtype, "cpu", norm, strided=strided, zero_centered_gamma=zcg)
    check_norm_quant(x, ns, norm=norm, recipe=recipe, out_dtype=out_dtype, layout=layout, residual=r, weight=w,
                     bias=b, zcg=zcg)  # fmt: skip


# ---- argument errors -----------------------------------------------------------


def _base_args():
    x = torch.randn(4, 64)
    return {
        "x": x,
        "residual": None,
        "ns": [64],
        "w": torch.randn(64),
        "b": None,
        "eps": None,
        "norm": "rms_norm",
        "recipe": "per_tensor",
        "out_dtype": E4M3,
        "scale": torch.tensor([2.0]),
        "layout": "plain",
        "zcg": False,
    }


BAD_ARGS = {
    "unknown_recipe": ({"recipe": "int8"}, r"\brecipe\b"),
    "unknown_norm": ({"norm": "group_norm"}, r"\bnorm\b"),
    "unknown_layout": ({"layout": "swizzled"}, r"scale_layout"),
    "per_tensor_fp16_out": ({"out_dtype": torch.float16}, r"out_dtype"),
    "per_token_fp4_out": ({"recipe": "per_token", "scale": None, "out_dtype": torch.float4_e2m1fn_x2}, r"out_dtype"),
    "mxfp8_e5m2_out": ({"recipe": "mxfp8", "scale": None, "out_dtype": E5M2}, r"out_dtype"),
    "nvfp4_fp8_out": ({"recipe": "nvfp4", "out_dtype": E4M3}, r"out_dtype"),
    "per_tensor_no_scale": ({"scale": None}, r"\bscale\b"),
    "nvfp4_no_scale": ({"recipe": "nvfp4", "out_dtype": torch.float4_e2m1fn_x2, "scale": None}, r"\bscale\b"),
    "per_token_with_scale": ({"recipe": "per_token"}, r"\bscale\b"),
    "mxfp8_with_scale": ({"recipe": "mxfp8"}, r"\bscale\b"),
    "scale_two_elements": ({"scale": torch.tensor([1.0, 2.0])}, r"\bscale\b"),
    "scale_fp16": ({"scale": torch.tensor([1.0], dtype=torch.float16)}, r"\bscale\b"),
    "scale_inf": ({"scale": torch.tensor([INF])}, r"\bscale\b"),
    "scale_nan": ({"scale": torch.tensor([NAN])}, r"\bscale\b"),
    "scale_zero": ({"scale": torch.tensor([0.0])}, r"\bscale\b"),
    "scale_negative": ({"scale": torch.tensor([-1.0])}, r"\bscale\b"),
    "nvfp4_scale_inf": (
        {"recipe": "nvfp4", "out_dtype": torch.float4_e2m1fn_x2, "scale": torch.tensor([INF])},
        r"\bscale\b",
    ),  # fmt: skip
    "per_tensor_blocked": ({"layout": "blocked"}, r"scale_layout"),
    "per_token_blocked": ({"recipe": "per_token", "scale": None, "layout": "blocked"}, r"scale_layout"),
    "residual_with_layer_norm": ({"norm": "layer_norm", "residual": torch.randn(4, 64)}, r"\bresidual\b"),
    "bias_with_rms_norm": ({"b": torch.randn(64)}, r"\bbias\b"),
    "float64_input": ({"x": torch.randn(4, 64, dtype=torch.float64), "w": None}, r"\binput\b"),
}


@needs_op
@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_arguments_name_the_argument(case):
    change, pattern = BAD_ARGS[case]
    a = {**_base_args(), **change}
    with pytest.raises((RuntimeError, ValueError, TypeError), match=pattern):
        run_op(a["x"], a["residual"], a["ns"], a["w"], a["b"], a["eps"], a["norm"], a["recipe"], a["out_dtype"],
               a["scale"], a["layout"], a["zcg"])  # fmt: skip


# ---- exact ties through the op ---------------------------------------------------

# With x = 1 and eps = 0, rstd is exactly 1 and y = weight exactly, so these
# weights put y on rounding boundaries, where the random tests tolerate either
# neighbour: here only the even code passes. (recipe, out_dtype, scale, y, want)
_T = [1.0625, 1.1875, -(2.0**-10), 3 * 2.0**-10]  # e4m3 ties: 1, 1.25, -0, 2^-8
TIE_CASES = {
    "per_tensor": ("per_tensor", E4M3, 1.0, _T + [464.0, -1e6], [1.0, 1.25, 0.0, 2.0**-8, 448.0, -448.0]),
    "per_token": ("per_token", E4M3, None, _T + [448.0], [1.0, 1.25, 0.0, 2.0**-8, 448.0]),
    "per_token_e5m2": ("per_token", E5M2, None, [1.125, 1.375, 57344.0], [1.0, 1.5, 57344.0]),
    # Block 0: amax 460 -> scale 1, 460 saturates to 448. Block 1: amax 512 -> scale 2; 2.125 / 2 ties to 1.
    "mxfp8": ("mxfp8", E4M3, None, [460.0, 1.0625] + [1.0] * 30 + [512.0, 2.125], [448.0, 1.0] + [1.0] * 30 + [512.0, 2.0]),
    # gs = 1 and a block amax of 6 make S = 1 and enc = 1: y itself is rounded to E2M1.
    "nvfp4": ("nvfp4", torch.float4_e2m1fn_x2, 1.0, [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0],
              [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.0, -4.0]),
}  # fmt: skip


@needs_op
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", sorted(TIE_CASES))
def test_exact_ties_go_to_even_through_the_op(case, device):
    recipe, out_dtype, scale, y, want = TIE_CASES[case]
    n = 40 if recipe == "nvfp4" else len(y)
    w = torch.tensor(y + [1.0] * (n - len(y)), device=device)
    x = torch.ones(3, n, device=device)
    s = None if scale is None else torch.tensor([scale], device=device)
    data, scales, *_ = run_op(x, None, [n], w, None, 0.0, "rms_norm", recipe, out_dtype, s, "plain", False)
    if recipe == "nvfp4":
        got = code_values(unpack_nibbles(data.cpu(), n), "e2m1")
        deq = dequantize(recipe, data.cpu(), scales.cpu(), n, gs=scale)
    else:
        got = code_values(data.cpu().view(torch.uint8), out_dtype)
        deq = dequantize(recipe, data.cpu(), scales.cpu(), n)
    vals = deq if recipe == "mxfp8" else got
    for row in vals.tolist():
        assert row[: len(want)] == want, f"{case}: {row[: len(want)]} != {want}"
    ref = quantize(w.cpu().double().expand(3, n), recipe, out_dtype, scale=scale)
    assert torch.equal(torch.where(got == 0, 0.0, got), torch.where(ref_vals(ref, n) == 0, 0.0, ref_vals(ref, n)))


def ref_vals(ref, n):
    return code_values(unpack_nibbles(ref.data, n), "e2m1") if ref.fmt == "e2m1" else code_values(ref.data, ref.fmt)
