"""The quantized norm forward, in its training and inference forms.

Training form (grad mode on and some tensor argument requires grad): an
autograd Function around ``torch.ops.rtcnorm.norm_quant``. Its backward takes
the gradient of the dequantized output, straight-through: a dense tensor of
input's dtype, as if the output had not been quantized. dx, dW and dB come
from the existing backward ops, fed from the saved input (h with a residual),
weight, bias, mean and rstd; the quantized values are never saved.

Inference form (otherwise): the op runs directly and nothing is saved.
"""

from __future__ import annotations

import math

import torch
from torch._C import _functions

from .quantized import Quant, QuantizedTensor

NORM_QUANT = torch.ops.rtcnorm.norm_quant.default
RMS_NORM_BACKWARD = torch.ops.rtcnorm.rms_norm_backward.default
LAYER_NORM_BACKWARD = torch.ops.rtcnorm.layer_norm_backward.default


def _forward(input, residual, weight, bias, norm, shape, eps, quant, mode, zero_centered_gamma):
    """Runs the op; returns (QuantizedTensor, h, mean, rstd)."""
    scale = quant.scale_tensor(input.device)
    data, scales, amax, h, mean, rstd = NORM_QUANT(
        input, residual, shape, weight, bias, eps, norm, quant.recipe, quant.dtype, scale, quant.layout,
        zero_centered_gamma, mode,
    )  # fmt: skip
    return quantized_tensor(data, scales, amax, quant, scale, input, math.prod(shape)), h, mean, rstd


def quantized_tensor(data, scales, amax, quant, scale, input, n) -> QuantizedTensor:
    """The QuantizedTensor of an op's (data, scales, amax) for ``input``'s
    rows of ``n`` elements; ``scale``: the tensor the op was given."""
    global_scale = None
    if quant.recipe == "nvfp4":
        # A copy: the caller may update its scale in place before this output is used.
        global_scale = scale.detach().reshape(()).clone()
    return QuantizedTensor(
        data,
        scales,
        amax,
        recipe=quant.recipe,
        scale_layout=quant.layout,
        orig_dtype=input.dtype,
        n=n,
        shape=input.shape,
        global_scale=global_scale,
    )


class _NormQuantFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, residual, weight, bias, norm, shape, eps, quant, mode, zero_centered_gamma):
        qt, h, mean, rstd = _forward(input, residual, weight, bias, norm, shape, eps, quant, mode, zero_centered_gamma)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(input if residual is None else h, weight, bias, mean, rstd)
        ctx.norm, ctx.shape, ctx.zero_centered_gamma = norm, shape, zero_centered_gamma
        ctx.has_residual = residual is not None
        if residual is None:
            ctx.mark_non_differentiable(h)
        return qt, h

    @staticmethod
    def backward(ctx, grad_y, grad_h):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        if not ctx.has_residual:
            grad_h = None  # h is then an empty non-differentiable output (compile may pass zeros for it)
        if grad_y is None and grad_h is None:
            return (None,) * 10
        with torch.no_grad():
            grads = _backward(ctx, grad_y, grad_h, x, weight, bias, mean, rstd)
        if torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (grad_y, grad_h, x, weight, bias)
        ):
            return raise_if_differentiated(grads, ctx.norm)
        return grads


def _backward(ctx, grad_y, grad_h, x, weight, bias, mean, rstd):
    if isinstance(grad_y, QuantizedTensor):
        grad_y = grad_y.dequantize()
    if grad_y is None:
        grad_y = torch.zeros_like(x)
    want_w = weight is not None and ctx.needs_input_grad[2]
    dw = db = None
    if ctx.norm == "rms_norm":
        dx, dw = RMS_NORM_BACKWARD(grad_y, x, rstd, weight, ctx.shape, ctx.zero_centered_gamma, want_w, grad_h)
    else:
        want_b = bias is not None and ctx.needs_input_grad[3]
        dx, dw, db = LAYER_NORM_BACKWARD(
            grad_y, x, mean, rstd, weight, bias, ctx.shape, ctx.zero_centered_gamma, want_w, want_b
        )
        db = db if want_b else None
    dres = dx if ctx.has_residual and ctx.needs_input_grad[1] else None
    return dx, dres, dw if want_w else None, db, None, None, None, None, None, None


def raise_if_differentiated(grads, norm):
    """The gradients, each behind a node that raises if a second backward
    reaches it (create_graph=True): without it they would carry no history
    through rstd and mean, and a second derivative would be silently wrong."""
    msg = (
        f"rtcnorm.{norm}: double backward is not supported with quant= (the backward is once differentiable); "
        "use the unquantized op or torch.nn.functional where a second derivative is needed"
    )
    live = [i for i, g in enumerate(grads) if g is not None]
    err = _functions.DelayedError(msg.encode(), len(live))
    wrapped = err(*[grads[i].detach().requires_grad_() for i in live])
    wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
    out = list(grads)
    for i, g in zip(live, wrapped, strict=True):
        out[i] = g
    return tuple(out)


def needs_node(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def norm_quant(norm, input, shape, weight, bias, eps, quant, *, residual, mode, zero_centered_gamma):
    """``rms_norm`` / ``layer_norm`` with ``quant`` given: a QuantizedTensor,
    or (QuantizedTensor, h) with a residual. ``shape`` is a tuple of ints."""
    if not isinstance(quant, Quant):
        raise TypeError(f"rtcnorm.{norm}: quant must be an rtcnorm.Quant or None, got {type(quant).__name__}")
    if needs_node(input, residual, weight, bias):
        qt, h = _NormQuantFn.apply(input, residual, weight, bias, norm, shape, eps, quant, mode, zero_centered_gamma)
    else:
        qt, h, _, _ = _forward(input, residual, weight, bias, norm, shape, eps, quant, mode, zero_centered_gamma)
    return qt if residual is None else (qt, h)
