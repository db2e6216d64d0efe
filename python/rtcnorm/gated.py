"""Gated RMSNorm: ``rms_norm_gated`` (Mamba2, Qwen3-Next), its fake impls and autograd.

Per group of ``group_size`` consecutive columns (the whole last dim when None),
with ``act`` = silu or sigmoid:

- ``norm_before_gate=True``:  ``y = rms_norm(x) * weight * act(z)``
- ``norm_before_gate=False``: ``y = rms_norm(x * act(z)) * weight``

The ops (``torch.ops.rtcnorm.rms_norm_gated`` and ``rms_norm_gated_backward``)
are defined in C++ (csrc/ops/norm/gated.cpp). The fake impls run the ops' own
argument checks (``_C._check_rms_norm_gated*``), so torch.compile refuses a bad
call while tracing with the op's message; autograd is registered here with
``torch.library.register_autograd``, so compiled graphs trace through both
directions without graph breaks.
"""

from __future__ import annotations

import torch

from . import _C
from ._gated_quant import gated_quant  # also registers rms_norm_gated_quant's fake impl
from .quantized import Quant

_FWD = torch.ops.rtcnorm.rms_norm_gated.default
_BWD = torch.ops.rtcnorm.rms_norm_gated_backward.default
ACTIVATIONS = ("silu", "sigmoid")


def _stat_dtype(input):
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def _stat_shape(input, group_size):
    n = input.shape[-1]
    return (*input.shape[:-1], n // (n if group_size is None else group_size))


@torch.library.register_fake("rtcnorm::rms_norm_gated")
def _rms_norm_gated_fake(input, gate, weight=None, eps=None, norm_before_gate=True, group_size=None, activation="silu"):
    _C._check_rms_norm_gated(input, gate, weight, eps, group_size, activation)
    y = torch.empty_like(input, memory_format=torch.contiguous_format)
    return y, input.new_empty(_stat_shape(input, group_size), dtype=_stat_dtype(input))


@torch.library.register_fake("rtcnorm::rms_norm_gated_backward")
def _rms_norm_gated_backward_fake(
    grad_out, input, gate, rstd, weight, norm_before_gate, group_size, activation, weight_grad
):
    _C._check_rms_norm_gated_backward(grad_out, input, gate, rstd, weight, group_size, activation)
    dx = torch.empty_like(input, memory_format=torch.contiguous_format)
    dz = torch.empty_like(input, memory_format=torch.contiguous_format)
    dw = weight.new_empty(weight.shape) if (weight_grad and weight is not None) else input.new_empty((0,))
    return dx, dz, dw


def _setup_context(ctx, inputs, output):
    input, gate, weight, _eps, norm_before_gate, group_size, activation = inputs
    ctx.save_for_backward(input, gate, weight, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.args = (norm_before_gate, group_size, activation)


def _backward(ctx, grad_y, _grad_rstd):
    input, gate, weight, rstd = ctx.saved_tensors
    norm_before_gate, group_size, activation = ctx.args
    want_w = weight is not None and ctx.needs_input_grad[2]
    if grad_y is None:
        grad_y = torch.zeros_like(input)
    dx, dz, dw = _BWD(grad_y, input, gate, rstd, weight, norm_before_gate, group_size, activation, want_w)
    return (
        dx if ctx.needs_input_grad[0] else None,
        dz if ctx.needs_input_grad[1] else None,
        dw if want_w else None,
        None,
        None,
        None,
        None,
    )


torch.library.register_autograd("rtcnorm::rms_norm_gated", _backward, setup_context=_setup_context)


def rms_norm_gated(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    norm_before_gate: bool = True,
    group_size: int | None = None,
    activation: str = "silu",
    quant: Quant | None = None,
) -> torch.Tensor:
    """Gated RMSNorm over the last dim of ``x``, gated by ``z`` (same shape and dtype).

    ``weight``: N elements, ``x``'s dtype or float32. ``eps``: None takes
    ``rms_norm``'s default (the dtype's machine epsilon). ``group_size``: a
    divisor G of N; the RMS is taken within each group of G consecutive
    columns. ``activation``: "silu" or "sigmoid". Math in float32, the output
    in ``x``'s dtype; differentiable in ``x``, ``z`` and ``weight``.

    With ``quant`` (an :class:`rtcnorm.Quant`), the output is an
    :class:`rtcnorm.QuantizedTensor` of the fp32 gated output, as
    ``rms_norm(..., quant=)`` gives; its gradient is taken straight through,
    as if it had not been quantized (docs/quantized_outputs.md).
    """
    if quant is not None:
        return gated_quant(x, z, weight, eps, norm_before_gate, group_size, activation, quant)
    return _FWD(x, z, weight, eps, norm_before_gate, group_size, activation)[0]
