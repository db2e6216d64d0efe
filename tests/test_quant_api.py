"""The training and inference forms of ``quant=``: straight-through gradients
against the float64 reference, what is saved, F.linear on the output, the
fake impl (shapes and refusals match the op) and torch.compile."""

from __future__ import annotations

import math
import re

import pytest
import rtcnorm
import torch
import torch.nn.functional as F
from quant_checks import assert_compiled_training_matches_eager
from reference import assert_close, ref_layer_norm, ref_rms_norm

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


# ---- the op's training and inference forms ---------------------------------------


def run_grad_case(norm, quant, dtype, device, *, weight=True, zc=False, residual=False, shape=(6, 70), wdtype=None,
                  through_dequantize=False):  # fmt: skip
    n, wdtype = shape[-1], wdtype or dtype
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    w = (torch.randn(n, dtype=wdtype, device=device) * 0.5 + (0 if zc else 1)).requires_grad_() if weight else None
    b = torch.randn(n, dtype=wdtype, device=device, requires_grad=True) if norm == "layer_norm" and weight else None
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
    y = qt.dequantize(torch.float64) if through_dequantize else qt
    torch.autograd.backward([y] + ([h] if residual else []), [dy.to(y.dtype)] + ([dh] if residual else []))
    rows = math.prod(shape[:-1])
    assert_close(x.grad, ref["dx"], what="dx")
    if residual:
        assert_close(h, ref["h"].double(), what="h")
        assert_close(r.grad, ref["dx"], what="d residual")
    if weight:
        assert_close(w.grad, ref["dw"], what="dw", reduce_len=rows)
    if b is not None:
        assert_close(b.grad, ref["db"], what="db", reduce_len=rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("quant", list(QUANTS))
@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_training_grads_straight_through(norm, quant, dtype):
    run_grad_case(norm, QUANTS[quant](), dtype, "cpu")


@pytest.mark.parametrize(("weight", "zc"), [(False, False), (True, True)])
@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_training_grads_weight_variants(norm, weight, zc):
    run_grad_case(norm, QUANTS["mxfp8"](), torch.float32, "cpu", weight=weight, zc=zc, shape=(2, 3, 40))


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_training_grads_float32_weight(norm):
    # bf16 input beside a float32 weight (and bias): dW, dB in float32.
    run_grad_case(norm, QUANTS["nvfp4"](), torch.bfloat16, "cpu", shape=(5, 48), wdtype=torch.float32)


@pytest.mark.parametrize("quant", ["per_tensor_e5m2", "per_token", "mxfp8_blocked", "nvfp4"])
@pytest.mark.parametrize(("norm", "residual", "bias"), [("rms_norm", False, False), ("rms_norm", True, False),
                                                        ("layer_norm", False, True)])  # fmt: skip
def test_opcheck(quant, norm, residual, bias):
    q = QUANTS[quant]()
    x = torch.randn(3, 5, 40, dtype=torch.bfloat16)
    r, b = torch.randn_like(x) if residual else None, torch.randn(40) if bias else None
    args = (x, r, [40], torch.randn(40), b, None, norm, q.recipe, q.dtype, q.scale_tensor(), q.layout)
    torch.library.opcheck(torch.ops.rtcnorm.norm_quant.default, args)


@pytest.mark.parametrize("quant", ["per_tensor", "per_token", "nvfp4_blocked"])
def test_training_grads_residual(quant):
    run_grad_case("rms_norm", QUANTS[quant](), torch.bfloat16, "cpu", residual=True)


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_training_grads_through_dequantize(norm):
    # dequantize() is differentiable: the loss may be taken on the dense value, in another dtype.
    run_grad_case(norm, QUANTS["mxfp8"](), torch.bfloat16, "cpu", through_dequantize=True)
    run_grad_case("rms_norm", QUANTS["per_token"](), torch.float32, "cpu", residual=True, through_dequantize=True)


def quant_for(recipe, dtype, amax, layout, device):
    """A Quant whose given scale maps the tensor's amax to the format's top."""
    top = {E4M3: 448.0, E5M2: 57344.0, FP4: 448.0 * 6}[dtype]
    scale = torch.tensor([top / amax], device=device) if recipe in ("per_tensor", "nvfp4") else None
    return Q(recipe, dtype, scale, layout)


def error_bound(recipe, dtype, y, scale, n):
    """|dequantized - y| allowed by the format: rounding at the value's
    magnitude plus half the subnormal spacing at its scale (y: rows x n)."""
    a = y.abs()
    if recipe == "per_tensor":
        return a * {E4M3: 2**-4, E5M2: 2**-3}[dtype] + {E4M3: 2**-10, E5M2: 2**-17}[dtype] / scale
    if recipe == "per_token":
        return a * 2**-4 + 2**-10 * a.amax(1, keepdim=True) / 448
    block = 32 if recipe == "mxfp8" else 16
    pad = torch.nn.functional.pad(a, (0, -n % block)).view(a.shape[0], -1, block)
    amax = pad.amax(-1).repeat_interleave(block, 1)[:, :n]
    if recipe == "mxfp8":  # [448, 512) times the block scale saturates to 448
        return a * 2**-3 + amax * 2**-16
    return a * 2**-2 + amax / 12  # E2M1 half-spacing, block scale rounded in E4M3


TRACK_CASES = {  # id -> (recipe, data dtype, scale layout)
    "per_tensor_e4m3": ("per_tensor", E4M3, "plain"),
    "per_tensor_e5m2": ("per_tensor", E5M2, "plain"),
    "per_token": ("per_token", E4M3, "plain"),
    "mxfp8": ("mxfp8", E4M3, "plain"),
    "mxfp8_blocked": ("mxfp8", E4M3, "blocked"),
    "nvfp4": ("nvfp4", FP4, "plain"),
    "nvfp4_blocked": ("nvfp4", FP4, "blocked"),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(("recipe", "dtype", "layout"), list(TRACK_CASES.values()), ids=list(TRACK_CASES))
def test_dequantized_output_tracks_the_norm(recipe, dtype, layout, device):
    # Blocks of a row differ in magnitude by powers of two, differently in each
    # row, so a scale read from the wrong block or row breaks the bound. 300 rows
    # and n = 200 leave partial blocks and a partial tile of the blocked layout.
    m, n = 300, 200
    r, j = torch.arange(m)[:, None], torch.arange(n)[None, :]
    x = (torch.randn(m, n) * torch.exp2(((r + j // 16) % 6).float())).to(device)
    w = torch.exp2(((torch.arange(n) // 32) % 4).float() - 2).to(device)
    y = ref_rms_norm(x, [n], w)["y"].cpu()
    amax = float(y.abs().max())
    q = quant_for(recipe, dtype, amax, layout, device)
    qt = rtcnorm.rms_norm(x, n, w, quant=q)
    err = (qt.dequantize(torch.float64).cpu() - y).abs()
    bound = error_bound(recipe, dtype, y, None if q.scale is None else float(q.scale), n)
    worst = int((err - bound).argmax())
    assert bool((err <= bound).all()), (
        f"element {divmod(worst, n)}: error {err.flatten()[worst]:.3g} > {bound.flatten()[worst]:.3g}"
    )
    if recipe in ("per_tensor", "nvfp4"):
        torch.testing.assert_close(float(qt.absmax), amax, rtol=1e-5, atol=0)


def same_tensor(a, b):
    return (a.data_ptr(), a.shape, a.stride(), a.dtype) == (b.data_ptr(), b.shape, b.stride(), b.dtype)


def quant_dtype_or_subclass(t):
    return isinstance(t, rtcnorm.QuantizedTensor) or t.dtype in QUANT_DTYPES or t.dtype == E8M0


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("quant", ["per_tensor", "mxfp8_blocked", "nvfp4"])
def test_saves_no_quantized_tensor(quant, residual):
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


def test_inference_form_saves_nothing():
    x, w = torch.randn(3, 32, requires_grad=True), torch.randn(32, requires_grad=True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        with torch.no_grad():
            a = rtcnorm.layer_norm(x, 32, w, quant=Q("per_token"))
        b = rtcnorm.rms_norm(x.detach(), 32, w.detach(), quant=Q("mxfp8"))
    assert packed == [] and a.grad_fn is None and b.grad_fn is None and not a.requires_grad
    assert isinstance(a, rtcnorm.QuantizedTensor) and isinstance(b, rtcnorm.QuantizedTensor)


@pytest.mark.parametrize("quant", ["per_token", "mxfp8", "nvfp4_blocked"])
def test_linear_on_output(quant):
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


@pytest.mark.parametrize("quant", ["per_token", "mxfp8_blocked", "nvfp4"])
def test_strided_rows(quant):
    # Rows 100 apart in memory: the saved input is the strided view itself.
    x = torch.randn(6, 100, dtype=torch.bfloat16)[:, 10:74].requires_grad_()
    w = torch.randn(64, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(6, 64, dtype=torch.bfloat16)
    qt = rtcnorm.rms_norm(x, 64, w, quant=QUANTS[quant]())
    dense = rtcnorm.rms_norm(x.detach().contiguous(), 64, w.detach(), quant=QUANTS[quant]())
    assert torch.equal(qt.dequantize(), dense.dequantize())
    qt.backward(dy)
    ref = ref_rms_norm(x, [64], w, dy=dy)
    assert_close(x.grad, ref["dx"], what="dx")
    assert_close(w.grad, ref["dw"], what="dw", reduce_len=6)


@pytest.mark.parametrize("quant", list(QUANTS))
def test_zero_rows(quant):
    x = torch.randn(0, 3, 40, requires_grad=True)
    qt = rtcnorm.rms_norm(x, 40, quant=QUANTS[quant]())
    assert qt.shape == (0, 3, 40) and qt.dequantize().shape == (0, 3, 40)
    qt.dequantize().sum().backward()
    assert x.grad.shape == (0, 3, 40)


def test_double_backward_raises():
    x = torch.randn(3, 32, requires_grad=True)
    qt = rtcnorm.rms_norm(x, 32, quant=Q("per_token"))
    (gx,) = torch.autograd.grad(qt, x, torch.randn(3, 32), create_graph=True)
    penalty = gx.pow(2).sum() + x.sum()  # a gradient penalty: x also reaches the loss directly
    with pytest.raises(RuntimeError, match=re.escape("rtcnorm.rms_norm: double backward is not supported with quant=")):
        penalty.backward()


def test_quant_argument_errors():
    x = torch.randn(2, 32)
    with pytest.raises(TypeError, match=re.escape("rtcnorm.rms_norm: quant must be an rtcnorm.Quant or None, got str")):
        rtcnorm.rms_norm(x, 32, quant="mxfp8")
    with pytest.raises(TypeError, match="rtcnorm.layer_norm: normalized_shape must be an int or a sequence of ints"):
        rtcnorm.layer_norm(x, 32.0, quant=Q("mxfp8"))
    with pytest.raises((ValueError, TypeError, RuntimeError), match="input"):
        rtcnorm.rms_norm(x.double(), 32, quant=Q("mxfp8"))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("quant", list(QUANTS))
def test_fake_matches_real(quant, residual):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = QUANTS[quant]()
    tensors = (torch.randn(3, 5, 40), torch.randn(3, 5, 40) if residual else None, torch.randn(40))
    tail = (None, None, "rms_norm", q.recipe, q.dtype)

    def call(convert):
        x, r, w = (None if t is None else convert(t) for t in tensors)
        scale = q.scale_tensor()
        return torch.ops.rtcnorm.norm_quant(x, r, [40], w, *tail, None if scale is None else convert(scale), q.layout)

    real = call(lambda t: t)
    with FakeTensorMode() as mode:
        fake = call(mode.from_tensor)
    for a, b in zip(real, fake, strict=True):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())


def bad(says, recipe="per_token", out=E4M3, *, norm="rms_norm", dtype=torch.float32, residual=False, bias=False,
        scale=None, layout="plain", mode=None):  # fmt: skip
    return dict(says=says, recipe=recipe, out=out, norm=norm, dtype=dtype, residual=residual, bias=bias, scale=scale,
                layout=layout, mode=mode)  # fmt: skip


BAD_CALLS = {  # name -> the call, and what its message says
    "norm": bad("norm must be 'rms_norm' or 'layer_norm'", norm="group_norm"),
    "residual with layer_norm": bad("residual is only taken", norm="layer_norm", residual=True),
    "bias with rms_norm": bad("bias is only taken", bias=True),
    "mode": bad("mode must be None", residual=True, mode="fastest"),
    "float64 input": bad("input must be float32, float16 or bfloat16", dtype=torch.float64),
    "recipe": bad("recipe must be one of", "int8"),
    "fp8 out_dtype": bad("out_dtype must be", "per_tensor", torch.float16, scale=[1.0]),
    "mxfp8 out_dtype": bad("out_dtype must be", "mxfp8", E5M2),
    "nvfp4 out_dtype": bad("out_dtype must be", "nvfp4", E4M3, norm="layer_norm", scale=[1.0]),
    "blocked per_token": bad("scale_layout 'blocked' is for", layout="blocked"),
    "layout": bad("scale_layout must be", "mxfp8", layout="tiled"),
    "scale given": bad("scale must be None", "mxfp8", scale=[1.0]),
    "scale missing": bad("scale (the global encode scale) is required", "nvfp4", FP4),
    "scale shape": bad("scale must be a float32 tensor of one element", "per_tensor", E5M2, scale=[1.0, 2.0]),
    "scale dtype": bad("scale must be a float32 tensor of one element", "per_tensor", scale=torch.ones(1).double()),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_fake_refuses_like_the_op(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    c = BAD_CALLS[case]
    x = torch.randn(2, 32, dtype=c["dtype"])
    r, b = torch.randn_like(x) if c["residual"] else None, torch.ones(32) if c["bias"] else None
    scale = torch.tensor(c["scale"]) if isinstance(c["scale"], list) else c["scale"]

    def call(convert):
        t = [None if v is None else convert(v) for v in (x, r, b, scale)]
        return torch.ops.rtcnorm.norm_quant(t[0], t[1], [32], None, t[2], None, c["norm"], c["recipe"], c["out"],
                                            t[3], c["layout"], False, c["mode"])  # fmt: skip

    with pytest.raises(Exception) as real:
        call(lambda v: v)
    with FakeTensorMode() as fake_mode, pytest.raises(type(real.value)) as fake:
        call(fake_mode.from_tensor)
    assert str(fake.value).splitlines()[0] == str(real.value).splitlines()[0]
    assert c["says"] in str(real.value)


@pytest.mark.parametrize("quant", ["per_token", "mxfp8_blocked", "nvfp4"])
def test_compiled_training_matches_eager(quant):
    def f(x, w, lw):
        return F.linear(rtcnorm.rms_norm(x, 64, w, quant=QUANTS[quant]()), lw)

    leaves = [torch.randn(4, 64), torch.randn(64), torch.randn(8, 64)]
    assert_compiled_training_matches_eager(f, leaves)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", list(QUANTS))
@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_gpu_training_grads_straight_through(norm, quant):
    run_grad_case(norm, QUANTS[quant]("cuda"), torch.bfloat16, "cuda", shape=(300, 1000))
    run_grad_case("rms_norm", QUANTS[quant]("cuda"), torch.bfloat16, "cuda", residual=True, shape=(7, 4096))


@pytest.mark.gpu
@pytest.mark.parametrize("quant", list(QUANTS))
def test_gpu_dequantize_matches_cpu(quant):
    x = torch.randn(300, 1000, dtype=torch.bfloat16, device="cuda")
    qt = rtcnorm.rms_norm(x, 1000, quant=QUANTS[quant]("cuda"))
    moved = qt.to("cpu")
    assert type(moved) is rtcnorm.QuantizedTensor and moved.qdata.device.type == "cpu"
    assert torch.equal(qt.dequantize().cpu(), moved.dequantize())
    w = torch.randn(64, 1000, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(F.linear(qt, w), F.linear(qt.dequantize(), w), rtol=0, atol=0)
