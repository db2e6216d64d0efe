"""Double backward of the norm ops: a clear error, never a wrong number.

The norm backward is once differentiable. Its first-order gradients are
exact under create_graph=True too; differentiating them again raises an
error that names the op. Softmax's double backward works and is tested in
test_softmax.py.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from norm_checks import randn
from reference import assert_close, ref_layer_norm, ref_rms_norm

F64, F32 = torch.float64, torch.float32
N = 6
OPS = ("rms_norm", "add_rms_norm", "layer_norm")


def _inputs(op, dtype, rows=3):
    x = randn((rows, N), dtype, "cpu").requires_grad_()
    w = randn((N,), dtype, "cpu", scale=0.5, shift=1.0).requires_grad_()
    extra = randn((rows, N), dtype, "cpu") if op == "add_rms_norm" else randn((N,), dtype, "cpu", scale=0.5)
    return x, w, extra.requires_grad_()


def _fn(op):
    """The op as a function of (x, w, extra) returning one tensor; extra is
    the residual of add_rms_norm and the bias of layer_norm."""
    if op == "rms_norm":
        return lambda x, w, extra: rtcnorm.rms_norm(x, N, w, 1e-5) * extra
    if op == "add_rms_norm":
        return lambda x, w, extra: rtcnorm.rms_norm(x, N, w, 1e-5, residual=extra)[0]
    return lambda x, w, extra: rtcnorm.layer_norm(x, N, w, extra)


def _message(op):
    return rf"rtcnorm\.{op}: double backward is not supported"


@pytest.mark.parametrize("op", OPS)
def test_first_order_gradcheck_float64(op):
    assert torch.autograd.gradcheck(_fn(op), _inputs(op, F64))


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
def test_gradgradcheck_raises_the_clear_error(op, dtype):
    tol = {} if dtype == F64 else {"eps": 1e-3, "atol": 1e-2, "rtol": 1e-2}
    with pytest.raises(RuntimeError, match=_message(op)):
        torch.autograd.gradgradcheck(_fn(op), _inputs(op, dtype), **tol)


@pytest.mark.parametrize("op", OPS)
def test_create_graph_gives_exact_first_order_then_refuses_the_second(op):
    """create_graph=True still gives the float64 reference's first-order
    gradients; a second backward through them raises, naming the op."""
    x, w, extra = _inputs(op, F64, rows=4)
    dy = randn((4, N), F64, "cpu")
    y = _fn(op)(x, w, extra)
    gx, gw = torch.autograd.grad(y, (x, w), dy, create_graph=True)
    if op == "layer_norm":
        ref = ref_layer_norm(x, [N], w, extra, 1e-5, dy=dy)
    elif op == "add_rms_norm":
        ref = ref_rms_norm(x, [N], w, 1e-5, residual=extra, dy=dy)
    else:
        ref = ref_rms_norm(x, [N], w, 1e-5, dy=dy * extra.detach())
    assert_close(gx, ref["dx"], what=f"{op} dx under create_graph")
    assert_close(gw, ref["dw"], what=f"{op} dw under create_graph", reduce_len=4)
    assert gx.requires_grad and gw.requires_grad
    with pytest.raises(RuntimeError, match=_message(op)):
        (gx.square().sum() + gw.sum()).backward()


def test_create_graph_through_other_ops_is_unaffected():
    """A second derivative that does not pass through the norm's backward
    (here: of the loss with respect to a scale applied after the norm) still
    works under create_graph=True, and matches torch's own ops."""
    x, w, _ = _inputs("rms_norm", F64)
    s = torch.tensor(1.5, dtype=F64, requires_grad=True)
    y = rtcnorm.rms_norm(x.detach(), N, w.detach(), 1e-5)
    (gs,) = torch.autograd.grad((s * y).pow(2).sum(), s, create_graph=True)
    (hs,) = torch.autograd.grad(gs, s)
    expected = 2 * torch.nn.functional.rms_norm(x.detach(), (N,), w.detach(), 1e-5).pow(2).sum()
    assert_close(hs, expected, what="second derivative through the scale")


@pytest.mark.parametrize("op", OPS)
def test_plain_backward_gradients_carry_no_graph(op):
    x, w, extra = _inputs(op, F64)
    _fn(op)(x, w, extra).sum().backward()
    assert x.grad is not None and not x.grad.requires_grad and x.grad.grad_fn is None
    assert not w.grad.requires_grad


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_gpu_create_graph_refuses_the_second_backward(op):
    x, w, extra = (t.detach().to("cuda", torch.bfloat16).requires_grad_() for t in _inputs(op, F32, rows=64))
    (gx,) = torch.autograd.grad(_fn(op)(x, w, extra).float().sum(), x, create_graph=True)
    assert torch.isfinite(gx).all()
    with pytest.raises(RuntimeError, match=_message(op)):
        gx.float().square().sum().backward()
