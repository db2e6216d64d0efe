"""``rms_norm_gated(..., quant=q)``: the gated forward with a quantized output,
in the training and inference forms of the plain norms' ``quant=``
(``_norm_quant.py``).

Training form (grad mode on and x, z or weight requires grad): an autograd
Function around ``torch.ops.rtcnorm.rms_norm_gated_quant`` whose backward
takes the gradient of the dequantized output straight through and runs
``rms_norm_gated_backward`` on the saved x, z, weight and rstd; the
quantized values are never saved. Inference form: the op alone, nothing
saved.
"""

from __future__ import annotations

import torch

from . import _C
from ._norm_quant import needs_node, quantized_tensor, raise_if_differentiated
from ._ops import quant_outputs_fake
from .quantized import Quant, QuantizedTensor

GATED_QUANT = torch.ops.rtcnorm.rms_norm_gated_quant.default
GATED_BACKWARD = torch.ops.rtcnorm.rms_norm_gated_backward.default


@torch.library.register_fake("rtcnorm::rms_norm_gated_quant")
def _rms_norm_gated_quant_fake(
    input, gate, weight, eps, norm_before_gate, group_size, activation, recipe, out_dtype, scale=None,
    scale_layout="plain",
):  # fmt: skip
    _C._check_rms_norm_gated_quant(
        input, gate, weight, eps, group_size, activation, recipe, out_dtype, scale, scale_layout
    )
    lead, n = input.shape[:-1], input.shape[-1]
    data, scales, amax = quant_outputs_fake(input, lead, n, recipe, out_dtype, scale_layout)
    groups = n // (n if group_size is None else group_size)
    return data, scales, amax, input.new_empty((*lead, groups), dtype=torch.float32)


def _forward(x, z, weight, eps, norm_before_gate, group_size, activation, quant):
    """Runs the op; returns (QuantizedTensor, rstd)."""
    scale = quant.scale_tensor(x.device)
    data, scales, amax, rstd = GATED_QUANT(
        x, z, weight, eps, norm_before_gate, group_size, activation, quant.recipe, quant.dtype, scale, quant.layout
    )
    return quantized_tensor(data, scales, amax, quant, scale, x, x.shape[-1]), rstd


class _GatedQuantFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, weight, eps, norm_before_gate, group_size, activation, quant):
        qt, rstd = _forward(x, z, weight, eps, norm_before_gate, group_size, activation, quant)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, z, weight, rstd)
        ctx.args = (norm_before_gate, group_size, activation)
        return qt

    @staticmethod
    def backward(ctx, grad_y):
        if grad_y is None:
            return (None,) * 8
        x, z, weight, rstd = ctx.saved_tensors
        want_w = weight is not None and ctx.needs_input_grad[2]
        with torch.no_grad():
            dy = grad_y.dequantize() if isinstance(grad_y, QuantizedTensor) else grad_y
            dx, dz, dw = GATED_BACKWARD(dy, x, z, rstd, weight, *ctx.args, want_w)
        grads = (
            dx if ctx.needs_input_grad[0] else None,
            dz if ctx.needs_input_grad[1] else None,
            dw if want_w else None,
        ) + (None,) * 5
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (grad_y, x, z, weight)):
            return raise_if_differentiated(grads, "rms_norm_gated")
        return grads


def gated_quant(x, z, weight, eps, norm_before_gate, group_size, activation, quant) -> QuantizedTensor:
    """``rms_norm_gated`` with ``quant`` given: a QuantizedTensor of x's
    shape and dtype."""
    if not isinstance(quant, Quant):
        raise TypeError(f"rtcnorm.rms_norm_gated: quant must be an rtcnorm.Quant or None, got {type(quant).__name__}")
    args = (x, z, weight, eps, norm_before_gate, group_size, activation, quant)
    if needs_node(x, z, weight):
        return _GatedQuantFn.apply(*args)
    return _forward(*args)[0]
