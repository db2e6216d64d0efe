"""rtcnorm.Quant (checks at construction) and rtcnorm.QuantizedTensor built by
hand: dequantize against the formats' rules in float64 for every recipe and
scale layout, dispatch (what stays quantized, what runs dense), flattening.
No test here runs norm_quant."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import rtcnorm
import torch
import torch.nn.functional as F
from rtcnorm.quantized import blocked_scales, plain_scales

Q = rtcnorm.Quant
E4M3, E5M2, E8M0, FP4 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2


# ---- Quant -----------------------------------------------------------------------

BAD_QUANTS = [
    (dict(recipe="int8"), ValueError, "recipe must be one of 'per_tensor', 'per_token', 'mxfp8', 'nvfp4', got 'int8'"),
    (dict(recipe=None), ValueError, "recipe must be one of 'per_tensor', 'per_token', 'mxfp8', 'nvfp4', got None"),
    (dict(recipe="mxfp8", dtype=E5M2), ValueError, "dtype for recipe 'mxfp8' must be one of torch.float8_e4m3fn, got"),
    (dict(recipe="per_token", dtype=torch.bfloat16), ValueError, "dtype for recipe 'per_token' must be one of"),
    (dict(recipe="nvfp4", dtype=E4M3, scale=1.0), ValueError, "must be one of torch.float4_e2m1fn_x2, got"),
    (dict(recipe="per_tensor"), ValueError, "scale is required for recipe 'per_tensor'"),
    (dict(recipe="nvfp4"), ValueError, "scale is required for recipe 'nvfp4'"),
    (dict(recipe="per_token", scale=1.0), ValueError, "scale must be None for recipe 'per_token'"),
    (dict(recipe="mxfp8", scale=torch.ones(1)), ValueError, "scale must be None for recipe 'mxfp8'"),
    (dict(recipe="per_tensor", scale=torch.ones(2)), ValueError, "got a tensor of dtype torch.float32 and shape (2,)"),
    (dict(recipe="per_tensor", scale=torch.ones(1, dtype=torch.float64)), ValueError, "dtype torch.float64 and"),
    (dict(recipe="per_tensor", scale=0.0), ValueError, "scale must be finite and > 0, got 0.0"),
    (dict(recipe="nvfp4", scale=-2.0), ValueError, "scale must be finite and > 0, got -2.0"),
    (dict(recipe="per_tensor", scale=math.inf), ValueError, "scale must be finite and > 0, got inf"),
    (dict(recipe="per_tensor", scale="1"), TypeError, "scale must be a float or a one-element float32 tensor"),
    (dict(recipe="per_tensor", scale=True), TypeError, "scale must be a float or a one-element float32 tensor"),
    (dict(recipe="mxfp8", layout="swizzled"), ValueError, "layout must be one of 'plain', 'blocked', got 'swizzled'"),
    (dict(recipe="per_token", layout="blocked"), ValueError, "layout 'blocked' is only for recipes 'mxfp8', 'nvfp4'"),
    (dict(recipe="per_tensor", scale=1.0, layout="blocked"), ValueError, "not 'per_tensor'; use layout='plain'"),
]


@pytest.mark.parametrize(("kwargs", "exc", "msg"), BAD_QUANTS)
def test_quant_refuses(kwargs, exc, msg):
    with pytest.raises(exc, match="^rtcnorm.Quant: .*" + re.escape(msg)):
        Q(**kwargs)


def test_quant_defaults_and_frozen():
    assert Q("per_token").dtype == E4M3 and Q("mxfp8").dtype == E4M3 and Q("nvfp4", scale=2).dtype == FP4
    assert Q("per_tensor", E5M2, 2.0).dtype == E5M2
    assert Q("mxfp8") == Q("mxfp8", E4M3, None, "plain")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Q("mxfp8").layout = "blocked"


# ---- QuantizedTensor from hand-built data ----------------------------------------


def random_codes(shape, dtype):
    """Random finite values of an 8-bit float dtype, every code but NaN."""
    b = torch.randint(0, 256, shape, dtype=torch.uint8)
    nan = {E4M3: (0x7F, 0xFF), E5M2: ()}[dtype]
    for v in nan:
        b[b == v] = 0
    if dtype == E5M2:  # exponent 31: inf and NaN
        b[(b & 0x7C) == 0x7C] = 0
    return b.view(dtype)


E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0-7; bit 3 is the sign


def e2m1_value(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1_MAGNITUDES[code & 7]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    rows, n = codes.shape
    out = torch.zeros(rows, (n + 1) // 2, dtype=torch.uint8)
    for j in range(n):
        out[:, j // 2] |= (codes[:, j] << (4 * (j % 2))).to(torch.uint8)
    return out.view(FP4)


def blocked_by_loop(plain: torch.Tensor) -> torch.Tensor:
    """The blocked layout of the spec, one entry at a time."""
    rows, blocks = plain.shape
    ct = -(-blocks // 4)
    out = torch.zeros(-(-rows // 128) * 128 * ct * 4, dtype=torch.uint8)
    src = plain.view(torch.uint8)
    for r in range(rows):
        for c in range(blocks):
            tile = (r // 128) * ct + c // 4
            out[tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4] = src[r, c]
    return out.view(plain.dtype)


def hand_built(recipe, shape, n, layout="plain", qdtype=E4M3, orig=torch.float32):
    """A QuantizedTensor of random codes and scales, and its float64 value by the spec."""
    rows = math.prod(shape) // n
    kw = dict(recipe=recipe, scale_layout=layout, orig_dtype=orig, n=n, shape=shape)
    amax = torch.empty(0)
    if recipe == "nvfp4":
        codes = torch.randint(0, 16, (rows, n), dtype=torch.uint8)
        q = torch.tensor([[e2m1_value(int(c)) for c in row] for row in codes], dtype=torch.float64)
        qdata = pack_fp4(codes).reshape(*shape[:-1], -1)  # nvfp4 cases normalize the last dim only
        kw["global_scale"] = torch.tensor(448.0 * 6 / 5.0)
    else:
        qdata = random_codes(shape, qdtype)
        q = qdata.reshape(rows, n).double()
    if recipe == "per_tensor":
        scale = torch.tensor(0.37)
        expect = q * scale.double()
    elif recipe == "per_token":
        scale = torch.rand(rows, 1) + 0.01
        expect = q * scale.double()
        scale = scale.reshape(*shape[:-1], 1) if n == shape[-1] else scale
    else:
        block = 32 if recipe == "mxfp8" else 16
        cols = torch.arange(n) // block
        if recipe == "mxfp8":
            scale = torch.randint(100, 150, (rows, -(-n // block)), dtype=torch.uint8).view(E8M0)
            expect = q * torch.exp2(scale.view(torch.uint8).double() - 127)[:, cols]
        else:
            scale = (torch.rand(rows, -(-n // block)) * 400).to(E4M3)
            expect = q * scale.double()[:, cols] / kw["global_scale"].double()
        scale = blocked_by_loop(scale) if layout == "blocked" else scale
    return rtcnorm.QuantizedTensor(qdata, scale, amax, **kw), expect.reshape(shape)


@pytest.mark.parametrize("layout", ["plain", "blocked"])
@pytest.mark.parametrize(("rows", "n"), [(1, 16), (3, 70), (130, 37), (129, 96)])
@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_dequantize_block_recipes(recipe, layout, rows, n):
    qt, expect = hand_built(recipe, (rows, n), n, layout)
    assert qt.shape == (rows, n) and qt.dtype == torch.float32
    torch.testing.assert_close(qt.dequantize().double(), expect, rtol=2**-24, atol=0)


@pytest.mark.parametrize("qdtype", [E4M3, E5M2])
@pytest.mark.parametrize("recipe", ["per_tensor", "per_token"])
def test_dequantize_fp8_recipes(recipe, qdtype):
    qt, expect = hand_built(recipe, (5, 48), 48, qdtype=qdtype)
    torch.testing.assert_close(qt.dequantize().double(), expect, rtol=2**-24, atol=0)


def test_dequantize_many_dims_to_input_dtype():
    # normalized_shape (4, 10): rows are the flattened leading dims (2, 3), n = 40.
    qt, expect = hand_built("mxfp8", (2, 3, 4, 10), 40, orig=torch.bfloat16)
    out = qt.dequantize()
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 4, 10)
    torch.testing.assert_close(out, expect.float().to(torch.bfloat16), rtol=0, atol=0)
    torch.testing.assert_close(qt.dequantize(torch.float64), expect, rtol=2**-24, atol=0)


def test_blocked_scales_helpers():
    plain = torch.randint(0, 255, (200, 7), dtype=torch.uint8).view(E8M0)
    blocked = blocked_scales(plain)
    assert torch.equal(blocked.view(torch.uint8), blocked_by_loop(plain).view(torch.uint8))
    assert torch.equal(plain_scales(blocked, 200, 7).view(torch.uint8), plain.view(torch.uint8))
    with pytest.raises(
        ValueError,
        match=re.escape("blocked scales must be 1-D with 2048 elements for 200 rows of 7 blocks, got shape (2047,)"),
    ):
        plain_scales(blocked[:-1], 200, 7)


def test_mxfp8_nan_scale_gives_nan():
    qt, _ = hand_built("mxfp8", (2, 64), 64)
    qt.scale.view(torch.uint8)[1, 0] = 0xFF
    out = qt.dequantize()
    assert out[1, :32].isnan().all() and not out[1, 32:].isnan().any() and not out[0].isnan().any()


def test_constructor_refuses():
    with pytest.raises(ValueError, match="qdata for recipe 'mxfp8' must be torch.float8_e4m3fn, got torch.float32"):
        rtcnorm.QuantizedTensor(torch.zeros(2, 32), None, None, recipe="mxfp8", orig_dtype=torch.float32, n=32,
                                shape=(2, 32))  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("n (48) must be a positive divisor of shape (2, 32)'s size")):
        rtcnorm.QuantizedTensor(torch.zeros(2, 32).to(E4M3), torch.ones(2, 1), None, recipe="per_token",
                                orig_dtype=torch.float32, n=48, shape=(2, 32))  # fmt: skip
    with pytest.raises(ValueError, match="global_scale is required for nvfp4 and only for it"):
        rtcnorm.QuantizedTensor(torch.zeros(2, 16, dtype=torch.uint8).view(FP4), None, None, recipe="nvfp4",
                                orig_dtype=torch.float32, n=32, shape=(2, 32))  # fmt: skip


def test_dispatch_keeps_or_dequantizes():
    qt, expect = hand_built("nvfp4", (4, 48), 48, "blocked", orig=torch.float32)
    dense = qt.dequantize()
    for kept in (qt.detach(), qt.clone(), qt.to("cpu"), qt.view(4, 48), qt.to(torch.float32)):
        assert type(kept) is rtcnorm.QuantizedTensor and kept.scale_layout == "blocked"
        assert torch.equal(kept.dequantize(), dense)
    for out, want in ((qt + 1, dense + 1), (qt.view(2, 96), dense.view(2, 96)), (qt.double(), expect)):
        assert type(out) is torch.Tensor
        torch.testing.assert_close(out, want.to(out.dtype), rtol=2**-24, atol=0)
    with pytest.raises(RuntimeError, match="QuantizedTensor is read-only: aten.add_.Tensor would write to it"):
        qt.add_(1)
    assert repr(qt).startswith("QuantizedTensor(recipe='nvfp4', scale_layout='blocked', shape=(4, 48)")


def test_flatten_unflatten():
    qt, _ = hand_built("nvfp4", (3, 33), 33)
    names, ctx = qt.__tensor_flatten__()
    back = rtcnorm.QuantizedTensor.__tensor_unflatten__({k: getattr(qt, k) for k in names}, ctx, qt.shape, None)
    assert names == ["qdata", "scale", "absmax", "global_scale"]
    assert torch.equal(back.dequantize(), qt.dequantize()) and back.n == 33


def test_linear_on_hand_built():
    qt, _ = hand_built("per_token", (6, 32), 32, orig=torch.float32)
    w = torch.randn(5, 32)
    torch.testing.assert_close(F.linear(qt, w), F.linear(qt.dequantize(), w), rtol=0, atol=0)


@pytest.mark.parametrize(("recipe", "layout"), [("per_token", "plain"), ("mxfp8", "blocked"), ("nvfp4", "plain")])
def test_compiled_function_takes_it(recipe, layout):
    # Flattened into its held tensors; aot_eager because inductor's CPU code has no E8M0 or FP4 types.
    qt, _ = hand_built(recipe, (6, 64), 64, layout)
    w = torch.randn(5, 64)
    out = torch.compile(F.linear, fullgraph=True, backend="aot_eager")(qt, w)
    torch.testing.assert_close(out, F.linear(qt.dequantize(), w), rtol=0, atol=0)
