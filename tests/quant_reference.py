"""Float64 references of rtcnorm's quantized norm outputs (issue 61).

Written from the formats' definitions (OCP MX v1.0 for E8M0 and E4M3, NVFP4's
two-level E4M3 + fp32 scaling, E2M1) and rtcnorm's contract, with no rtcnorm
code: value tables come from enumerating the codes of torch's float8 dtypes,
rounding is nearest with ties to the even code, and every finite or infinite
value saturates to the largest finite code. All functions keep their inputs'
device, so the GPU tests run them where the data lies.

Byte-level results are uint8 tensors: FP8 codes as they sit in memory, E2M1
as 4-bit codes (0..15, sign in bit 3) or packed two to a byte.

The op normalizes in fp32 while the reference does so in float64, so a value
that lies within a few fp32 ulps of a rounding boundary may round either way.
``near_boundary`` finds those elements; the tests allow mismatches only there.
Saturation is not such a boundary: the saturating conversion is continuous at
the largest finite value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from reference import ref_layer_norm, ref_rms_norm

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
BLOCK = {"mxfp8": 32, "nvfp4": 16}
# Relative distance from a boundary within which the op's fp32 result may
# round differently from the float64 reference (about four fp32 ulps).
FP32_REL = 2.0**-22


def fp8_table(dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """Magnitudes of the non-negative finite codes of ``dtype`` in code order
    (code i has magnitude table[i]; the codes are monotone), float64."""
    vals = torch.arange(128, dtype=torch.uint8).view(dtype).double()
    finite = int(torch.isfinite(vals).sum())
    assert bool(torch.isfinite(vals[:finite]).all()) and bool((vals[1:finite] > vals[: finite - 1]).all())
    return vals[:finite].to(device)


def e2m1_table(device="cpu") -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float64, device=device)


def table_for(fmt, device="cpu") -> torch.Tensor:
    return e2m1_table(device) if fmt == "e2m1" else fp8_table(fmt, device)


def _rne_index(mag: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Index of the nearest table entry to ``mag`` (>= 0, not NaN), ties to the
    even index, after saturating to the largest entry."""
    mag = torch.clamp(mag, max=float(table[-1]))
    hi = torch.searchsorted(table, mag).clamp(max=len(table) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo = mag - table[lo]
    d_hi = table[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return torch.where(pick_hi, hi, lo)


def round_codes(v: torch.Tensor, fmt) -> torch.Tensor:
    """Round-to-nearest-even, saturating codes of float64 ``v``: uint8 FP8
    bytes for a float8 dtype, 4-bit E2M1 codes for ``"e2m1"``. NaN gives the
    FP8 NaN 0x7F, and +6 (0x7) in E2M1, which has no NaN."""
    v = v.double()
    table = table_for(fmt, v.device)
    nan = torch.isnan(v)
    idx = _rne_index(torch.where(nan, 0.0, v.abs()), table)
    sign_bit = 0x8 if fmt == "e2m1" else 0x80
    code = idx + torch.signbit(v).long() * sign_bit
    code = torch.where(nan, 0x7 if fmt == "e2m1" else 0x7F, code)
    return code.to(torch.uint8)


def code_values(codes: torch.Tensor, fmt) -> torch.Tensor:
    """Float64 values of uint8 codes (FP8 bytes or 4-bit E2M1 codes)."""
    if fmt == "e2m1":
        c = codes.long()
        mag = e2m1_table(codes.device)[c & 0x7]
        return torch.where(c & 0x8 != 0, -mag, mag)
    return codes.contiguous().view(fmt).double()


def near_boundary(scaled: torch.Tensor, fmt, rel: float = FP32_REL, spread=None) -> torch.Tensor:
    """True where ``scaled`` lies within ``rel * max(|mid|, spread)`` of a
    midpoint ``mid`` of two adjacent magnitudes of ``fmt`` (a rounding
    boundary). ``spread`` bounds the magnitude of the terms that formed the
    value (see ``norm_reference``): an fp32 sum that cancels is exact only to
    ``rel`` of its terms, not of its result."""
    table = table_for(fmt, scaled.device)
    mids = (table[1:] + table[:-1]) / 2
    mag = scaled.double().abs()
    width = torch.zeros_like(mag) if spread is None else spread.double().nan_to_num(0.0)
    i = torch.searchsorted(mids, torch.where(torch.isnan(mag), 0.0, mag))
    near = torch.zeros_like(mag, dtype=torch.bool)
    for j in (i - 1, i):
        m = mids[j.clamp(0, len(mids) - 1)]
        near |= (mag - m).abs() <= rel * torch.maximum(m, width)
    return near & ~torch.isnan(mag)


def near_power_of_two(a: torch.Tensor, rel: float = FP32_REL, spread=None) -> torch.Tensor:
    """True where positive finite ``a`` lies within ``rel * max(p, spread)``
    of a power of two p, where floor(log2(a)), and so an E8M0 block scale,
    may differ by one."""
    a = a.double()
    ok = torch.isfinite(a) & (a > 0)
    p = torch.exp2(torch.round(torch.log2(torch.where(ok, a, 1.0))))
    width = p if spread is None else torch.maximum(p, spread.double().nan_to_num(0.0))
    return ok & ((a - p).abs() <= rel * width)


# ---- packing and scale layouts -------------------------------------------------


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(..., N) 4-bit codes -> (..., ceil(N/2)) bytes: element 2k in the low
    nibble of byte k, 2k+1 in the high nibble, an odd N's last high nibble 0."""
    n = codes.shape[-1]
    if n % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor, n: int) -> torch.Tensor:
    b = packed.contiguous().view(torch.uint8)
    both = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)
    return both[..., :n]


def round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def blocked_numel(m: int, s: int) -> int:
    return round_up(m, 128) * round_up(s, 4)


def blocked_offset(r, c, s: int):
    """Position of plain scale (r, c) of an (M, S) matrix in the blocked
    layout: 128x4 tiles in row-major tile order, and inside a tile entry
    (r, c) at (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4."""
    col_tiles = round_up(s, 4) // 4
    tile = (r // 128) * col_tiles + c // 4
    return tile * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4


def _as_raw(t: torch.Tensor) -> torch.Tensor:
    """One-byte floats as uint8 (E8M0 and E4M3 have no zero-fill), others as is."""
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous()


def to_blocked(plain: torch.Tensor) -> torch.Tensor:
    """(M, S) scales -> the 1-D blocked layout, padding entries 0."""
    m, s = plain.shape
    raw = _as_raw(plain)
    pm, ps = round_up(m, 128), round_up(s, 4)
    padded = torch.zeros(pm, ps, dtype=raw.dtype, device=plain.device)
    padded[:m, :s] = raw
    # (row tile, r1 = r % 128 // 32, r0 = r % 32, col tile, c) -> (row tile,
    # col tile, r0, r1, c): the offset formula's digit order.
    t = padded.view(pm // 128, 4, 32, ps // 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(-1).view(plain.dtype)


def from_blocked(flat: torch.Tensor, m: int, s: int) -> torch.Tensor:
    """Inverse of ``to_blocked``: the (M, S) plain scales."""
    pm, ps = round_up(m, 128), round_up(s, 4)
    raw = _as_raw(flat)
    assert raw.numel() == pm * ps, f"blocked scales: {raw.numel()} elements, expected {pm * ps}"
    t = raw.view(pm // 128, ps // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(pm, ps)
    return t[:m, :s].contiguous().view(flat.dtype)


# ---- the normalized output -----------------------------------------------------


def norm_reference(x, residual, normalized_shape, weight, bias, eps, norm, zero_centered_gamma=False):
    """Float64 ``y`` (the op's fp32 output before quantization), with ``h``
    (residual sum in x's dtype, or None), ``mean`` (or None), ``rstd`` and
    ``spread``: per element, the magnitude of the terms that form y, so that
    fp32 evaluation is exact to a few ulps of it. For rms_norm that is |y|;
    layer_norm's x - mean and + bias cancel: (|x| + |mean|) * rstd * |g| + |b|."""
    if norm == "rms_norm":
        r = ref_rms_norm(x, normalized_shape, weight, eps, zero_centered_gamma=zero_centered_gamma, residual=residual)
        return {"y": r["y"], "h": r["h"], "mean": None, "rstd": r["rstd"], "spread": r["y"].abs()}
    assert norm == "layer_norm" and residual is None
    r = ref_layer_norm(
        x, normalized_shape, weight, bias, 1e-5 if eps is None else eps, zero_centered_gamma=zero_centered_gamma
    )
    nd = len(normalized_shape)
    stat = r["rstd"].shape + (1,) * nd
    spread = (x.double().abs() + r["mean"].reshape(stat).abs()) * r["rstd"].reshape(stat)
    if weight is not None:
        spread = spread * (weight.double() + (1 if zero_centered_gamma else 0)).abs()
    if bias is not None:
        spread = spread + bias.double().abs()
    return {"y": r["y"], "h": None, "mean": r["mean"], "rstd": r["rstd"], "spread": spread}


# ---- the recipes ---------------------------------------------------------------


@dataclass
class QuantRef:
    data: torch.Tensor  # uint8: FP8 bytes, or packed E2M1 nibbles
    scales: torch.Tensor  # plain layout, in the contract's dtype
    amax: torch.Tensor  # fp32 (), or empty (0,)
    scaled: torch.Tensor  # float64 values handed to the final conversion (M, N)
    spread: torch.Tensor  # magnitude of the terms behind ``scaled`` (M, N)
    fmt: object  # the data format: a float8 dtype or "e2m1"
    block_amax: torch.Tensor | None = None  # fp32 (M, S) for the block recipes
    block_spread: torch.Tensor | None = None  # block max of the y spread (M, S)


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32)


def nan_ignoring_amax(y: torch.Tensor, dim=None) -> torch.Tensor:
    """max |y| with NaN ignored (fmaxf from 0), rounded to fp32."""
    a = torch.nan_to_num(y.double().abs(), nan=0.0, posinf=math.inf)
    if dim is None:
        return _f32(a.amax() if a.numel() else a.new_zeros(()))
    return _f32(a.amax(dim))


def block_amax(y: torch.Tensor, block: int) -> torch.Tensor:
    """(M, N) -> fp32 (M, ceil(N/block)); absent elements of a partial last
    block count as 0."""
    n = y.shape[-1]
    s = -(-n // block)
    padded = torch.nn.functional.pad(y.double(), (0, s * block - n))
    return nan_ignoring_amax(padded.view(*y.shape[:-1], s, block), dim=-1)


def e8m0_byte(a: torch.Tensor) -> torch.Tensor:
    """MX block scale byte of fp32 block amax ``a``: floor(log2 a) - 8 + 127
    clamped to >= 0; 0 for a == 0 or subnormal; 0xFF (NaN) for a = inf."""
    a = a.double()
    _, e = torch.frexp(torch.where(torch.isfinite(a) & (a > 0), a, 1.0))
    byte = (e.long() - 1 + 127 - 8).clamp(min=0)
    byte = torch.where(a < 2.0**-126, 0, byte)
    byte = torch.where(torch.isinf(a), 0xFF, byte)
    return byte.to(torch.uint8)


def _expand_blocks(per_block: torch.Tensor, block: int, n: int) -> torch.Tensor:
    return per_block.repeat_interleave(block, dim=-1)[..., :n]


def quantize(y, recipe, out_dtype=torch.float8_e4m3fn, scale=None, block_scales=None, spread=None) -> QuantRef:
    """Reference quantization of float64 ``y`` (M, N) under ``recipe``.

    ``scale``: the per_tensor QUANTIZE multiplier, or nvfp4's global ENCODE
    scale (a float or one-element tensor, taken as fp32). ``block_scales``
    (plain, the contract's dtype) replaces the reference's own block scales
    when computing the data, so data can be checked against the op's scales
    where a scale itself sat on a boundary. ``spread`` (M, N): the magnitude
    of the terms behind each y (default |y|), carried to ``QuantRef.spread``.
    """
    y = y.double()
    m, n = y.shape
    dev = y.device
    spread = y.abs() if spread is None else spread.double()
    empty = torch.empty(0, dtype=torch.float32, device=dev)
    scales, amax, ba = None, empty, None
    fmt = "e2m1" if recipe == "nvfp4" else out_dtype
    if recipe == "per_tensor":
        s = _f32(torch.as_tensor(scale, device=dev).reshape(()))
        mult, scales, amax = s.double().expand(m, n), 1.0 / s, nan_ignoring_amax(y)
    elif recipe == "per_token":
        fmax = _f32(torch.tensor(FMAX[out_dtype], device=dev))
        a = nan_ignoring_amax(y, dim=-1)
        one = torch.ones_like(a)
        inv = torch.where(a == 0, one, fmax / a)
        mult, scales = inv.double()[:, None].expand(m, n), torch.where(a == 0, one, a / fmax)[:, None]
    elif recipe == "mxfp8":
        assert out_dtype == torch.float8_e4m3fn
        ba = block_amax(y, 32)
        byte = e8m0_byte(ba) if block_scales is None else block_scales.contiguous().view(torch.uint8)
        per_block = torch.where(byte == 0xFF, math.nan, torch.exp2(127.0 - byte.double()))
        mult, scales = _expand_blocks(per_block, 32, n), byte.view(torch.float8_e8m0fnu)
    elif recipe == "nvfp4":
        gs = _f32(torch.as_tensor(scale, device=dev).reshape(()))
        ba = block_amax(y, 16)
        if block_scales is None:
            s_code = round_codes((ba / 6.0 * gs).double(), torch.float8_e4m3fn)
        else:
            s_code = block_scales.contiguous().view(torch.uint8)
        s_val = _f32(code_values(s_code, torch.float8_e4m3fn))
        enc = torch.where(s_val == 0, torch.zeros_like(s_val), gs / s_val)
        mult, scales, amax = _expand_blocks(enc.double(), 16, n), s_code.view(torch.float8_e4m3fn), nan_ignoring_amax(y)
    else:
        raise ValueError(f"unknown recipe {recipe!r}")
    scaled = y * mult
    codes = round_codes(scaled, fmt)
    data = pack_nibbles(codes) if fmt == "e2m1" else codes
    bs = None if ba is None else block_amax(spread, BLOCK[recipe]).double()
    return QuantRef(data, scales, amax, scaled, spread * mult.abs(), fmt, ba, bs)


def nvfp4_scale_input(a: torch.Tensor, gs) -> torch.Tensor:
    """The fp32 value nvfp4 rounds to its E4M3 block scale: (a / 6) * gs."""
    gs = _f32(torch.as_tensor(gs, device=a.device).reshape(()))
    return a / 6.0 * gs


def dequantize(recipe, data, scales, n, *, gs=None, layout="plain") -> torch.Tensor:
    """Float64 (M, N) values the contract says ``data`` and ``scales`` stand
    for (``scales`` as the op returns them, plain or blocked)."""
    if recipe in ("per_tensor", "per_token"):
        q = data.double().reshape(-1, n)
        return q * (scales.double() if recipe == "per_tensor" else scales.double().reshape(-1, 1))
    block = BLOCK[recipe]
    if recipe == "mxfp8":
        q = data.double().reshape(-1, n)
    else:
        q = code_values(unpack_nibbles(data.reshape(-1, data.shape[-1]), n), "e2m1")
    m, s = q.shape[0], -(-n // block)
    plain = from_blocked(scales, m, s) if layout == "blocked" else scales.reshape(m, s)
    if recipe == "mxfp8":
        mult = torch.exp2(plain.view(torch.uint8).double() - 127.0)
    else:
        gs = float(_f32(torch.as_tensor(gs)))
        mult = plain.double() / gs
    return q * _expand_blocks(mult, block, n)
