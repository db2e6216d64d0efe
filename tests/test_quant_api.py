"""The quantized-output API: rtcnorm.Quant, rtcnorm.QuantizedTensor (dequantize
from hand-built data and scales, dispatch), and the training and inference
forms of ``quant=`` (straight-through gradients against the float64
reference, what is saved). Tests that run norm_quant skip where it is absent."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import rtcnorm
import torch
import torch.nn.functional as F
from reference import assert_close, ref_layer_norm, ref_rms_norm
from rtcnorm.quantized import blocked_scales, plain_scales

Q = rtcnorm.Quant
E4M3, E5M2, E8M0, FP4 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2
QUANT_DTYPES = (E4M3, E5M2, FP4)
QUANTS = {  # name -> Quant for a device
    "per_tensor": lambda d="cpu": Q("per_tensor", scale=0.75),
    "per_tensor_e5m2": lambda d="cpu": Q("per_tensor", E5M2, scale=torch.tensor([3.0], device=d)),
    "per_token": lambda d="cpu": Q("per_token"),
    "mxfp8": lambda d="cpu": Q("mxfp8"),
    "mxfp8_blocked": lambda d="cpu": Q("mxfp8", layout="blocked"),
    "nvfp4": lambda d="cpu": Q("nvfp4", scale=448.0 * 6 / 8),
    "nvfp4_blocked": lambda d="cpu": Q("nvfp4", scale=torch.tensor(448.0 * 6 / 8, device=d), layout="blocked"),
}


@pytest.fixture
def norm_quant():
    if not hasattr(torch.ops.rtcnorm, "norm_quant"):
        pytest.skip("needs torch.ops.rtcnorm.norm_quant, which this build of rtcnorm lacks")


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


def e2m1_value(code: int) -> float:
    sign = -1.0 if code & 8 else 1.0
    e, m = (code >> 1) & 3, code & 1
    return sign * (m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2))


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


# ---- the op's training and inference forms ---------------------------------------


def run_grad_case(norm, quant, dtype, device, *, weight=True, zc=False, residual=False, shape=(6, 70)):
    n = shape[-1]
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    w = (torch.randn(n, dtype=dtype, device=device) * 0.5 + (0 if zc else 1)).requires_grad_() if weight else None
    b = torch.randn(n, dtype=dtype, device=device, requires_grad=True) if norm == "layer_norm" and weight else None
    r = torch.randn(shape, dtype=dtype, device=device, requires_grad=True) if residual else None
    dy, dh = torch.randn_like(x), torch.randn_like(x) if residual else None
    if norm == "rms_norm":
        out = rtcnorm.rms_norm(x, n, w, quant=quant, residual=r, zero_centered_gamma=zc)
        qt, h = out if residual else (out, None)
        ref = ref_rms_norm(x, [n], w, zero_centered_gamma=zc, residual=r, dy=dy, dh=dh)
    else:
        qt, h = rtcnorm.layer_norm(x, n, w, b, quant=quant, zero_centered_gamma=zc), None
        ref = ref_layer_norm(x, [n], w, b, zero_centered_gamma=zc, dy=dy)
    assert isinstance(qt, rtcnorm.QuantizedTensor) and qt.shape == x.shape and qt.dtype == dtype
    torch.autograd.backward([qt] + ([h] if residual else []), [dy] + ([dh] if residual else []))
    rows = math.prod(shape[:-1])
    assert_close(x.grad, ref["dx"], what="dx")
    if residual:
        assert_close(h, ref["h"].double(), what="h")
        assert_close(r.grad, ref["dx"], what="d residual")
    if weight:
        assert_close(w.grad, ref["dw"], what="dw", reduce_len=rows)
    if b is not None:
        assert_close(b.grad, ref["db"], what="db", reduce_len=rows)
    return qt, x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("quant", list(QUANTS))
@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_training_grads_straight_through(norm_quant, norm, quant, dtype):
    run_grad_case(norm, QUANTS[quant](), dtype, "cpu")


@pytest.mark.parametrize(("weight", "zc"), [(False, False), (True, True)])
@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_training_grads_weight_variants(norm_quant, norm, weight, zc):
    run_grad_case(norm, QUANTS["mxfp8"](), torch.float32, "cpu", weight=weight, zc=zc, shape=(2, 3, 40))


@pytest.mark.parametrize("quant", ["per_tensor", "per_token", "nvfp4_blocked"])
def test_training_grads_residual(norm_quant, quant):
    run_grad_case("rms_norm", QUANTS[quant](), torch.bfloat16, "cpu", residual=True)


def same_tensor(a, b):
    return (a.data_ptr(), a.shape, a.stride(), a.dtype) == (b.data_ptr(), b.shape, b.stride(), b.dtype)


def quant_dtype_or_subclass(t):
    return isinstance(t, rtcnorm.QuantizedTensor) or t.dtype in QUANT_DTYPES or t.dtype == E8M0


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("quant", ["per_tensor", "mxfp8_blocked", "nvfp4"])
def test_saves_no_quantized_tensor(norm_quant, quant, residual):
    x = torch.randn(4, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    r = torch.randn(4, 64) if residual else None
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = rtcnorm.rms_norm(x, 64, w, quant=QUANTS[quant](), residual=r)
    qt, h = out if residual else (out, None)
    saved = qt.grad_fn.saved_tensors
    assert len(packed) == 4 and not any(quant_dtype_or_subclass(t) for t in packed)
    assert same_tensor(saved[0], h if residual else x) and same_tensor(saved[1], w) and saved[2] is None
    assert [t.dtype for t in saved[3:]] == [torch.float32] * 2 and saved[4].shape == (4,)


def test_inference_form_saves_nothing(norm_quant):
    x, w = torch.randn(3, 32, requires_grad=True), torch.randn(32, requires_grad=True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        with torch.no_grad():
            a = rtcnorm.layer_norm(x, 32, w, quant=Q("per_token"))
        b = rtcnorm.rms_norm(x.detach(), 32, w.detach(), quant=Q("mxfp8"))
    assert packed == [] and a.grad_fn is None and b.grad_fn is None and not a.requires_grad
    assert isinstance(a, rtcnorm.QuantizedTensor) and isinstance(b, rtcnorm.QuantizedTensor)


@pytest.mark.parametrize("quant", ["per_token", "mxfp8", "nvfp4_blocked"])
def test_linear_on_output(norm_quant, quant):
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    lw = torch.randn(24, 64, dtype=torch.bfloat16, requires_grad=True)
    qt = rtcnorm.rms_norm(x, 64, quant=QUANTS[quant]())
    dense = qt.dequantize()
    out = F.linear(qt, lw)
    torch.testing.assert_close(out, F.linear(dense, lw), rtol=0, atol=0)
    dout = torch.randn_like(out)
    out.backward(dout)
    # Straight-through: x's gradient is the unquantized norm's, given dL/dy = dout @ lw.
    ref = ref_rms_norm(x, [64], dy=(dout.double() @ lw.double()).to(torch.bfloat16))
    assert_close(x.grad, ref["dx"], what="dx", scale=2.0)  # dy rounded to bf16 once more here
    assert_close(
        lw.grad, dout.double().flatten(0, 1).T @ dense.double().flatten(0, 1), what="d linear w", reduce_len=10
    )


def test_double_backward_raises(norm_quant):
    x = torch.randn(3, 32, requires_grad=True)
    qt = rtcnorm.rms_norm(x, 32, quant=Q("per_token"))
    (gx,) = torch.autograd.grad(qt, x, torch.randn(3, 32), create_graph=True)
    penalty = gx.pow(2).sum() + x.sum()  # a gradient penalty: x also reaches the loss directly
    with pytest.raises(RuntimeError, match=re.escape("rtcnorm.rms_norm: double backward is not supported with quant=")):
        penalty.backward()


def test_quant_argument_errors(norm_quant):
    x = torch.randn(2, 32)
    with pytest.raises(TypeError, match=re.escape("rtcnorm.rms_norm: quant must be an rtcnorm.Quant or None, got str")):
        rtcnorm.rms_norm(x, 32, quant="mxfp8")
    with pytest.raises(TypeError, match="rtcnorm.layer_norm: normalized_shape must be an int or a sequence of ints"):
        rtcnorm.layer_norm(x, 32.0, quant=Q("mxfp8"))
    with pytest.raises((ValueError, TypeError, RuntimeError), match="input"):
        rtcnorm.rms_norm(x.double(), 32, quant=Q("mxfp8"))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("quant", list(QUANTS))
def test_fake_matches_real(norm_quant, quant, residual):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = QUANTS[quant]()
    tensors = (torch.randn(3, 5, 40), torch.randn(3, 5, 40) if residual else None, torch.randn(40))
    tail = (None, None, "rms_norm", q.recipe, q.dtype)

    def call(convert):
        x, r, w = (None if t is None else convert(t) for t in tensors)
        scale = q.scale_tensor("cpu")
        return torch.ops.rtcnorm.norm_quant(x, r, [40], w, *tail, None if scale is None else convert(scale), q.layout)

    real = call(lambda t: t)
    with FakeTensorMode() as mode:
        fake = call(mode.from_tensor)
    for a, b in zip(real, fake, strict=True):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())


@pytest.mark.parametrize("quant", ["per_token", "mxfp8_blocked", "nvfp4"])
def test_compiled_training_matches_eager(norm_quant, quant):
    # aot_eager: inductor's CPU code generation has no E8M0 or FP4 types.
    def f(x, w, lw):
        return F.linear(rtcnorm.rms_norm(x, 64, w, quant=QUANTS[quant]()), lw)

    leaves = [torch.randn(4, 64), torch.randn(64), torch.randn(8, 64)]
    results = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        ts = [t.clone().requires_grad_() for t in leaves]
        out = fn(*ts)
        out.backward(torch.ones_like(out))
        results.append([out] + [t.grad for t in ts])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", list(QUANTS))
@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_gpu_training_grads_straight_through(norm_quant, norm, quant):
    run_grad_case(norm, QUANTS[quant]("cuda"), torch.bfloat16, "cuda", shape=(300, 1000))
    run_grad_case("rms_norm", QUANTS[quant]("cuda"), torch.bfloat16, "cuda", residual=True, shape=(7, 4096))
