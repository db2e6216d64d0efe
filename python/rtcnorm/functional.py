"""Functional forms of the ops, shaped like their torch.nn.functional twins.

The wrappers cost no more host time than ``F.rms_norm`` / ``F.layer_norm``:
the op overloads are bound once here, the mode is checked by one set lookup,
and ``normalized_shape`` goes to the op as given (an int becomes a 1-tuple).
The op's own argument parser checks its items; only when it refuses them is
the shape examined, to raise a TypeError that names ``normalized_shape``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from . import tuning
from ._norm_quant import norm_quant
from .modes import MODES, check_mode
from .quantized import Quant

RMS_NORM = torch.ops.rtcnorm.rms_norm.default
ADD_RMS_NORM = torch.ops.rtcnorm.add_rms_norm.default
LAYER_NORM = torch.ops.rtcnorm.layer_norm.default
VALID_MODES = frozenset(MODES)


def checked_mode(mode, op: str):
    """``mode`` if it is None or one of MODES, else the ValueError naming ``op``."""
    if mode is not None and not (type(mode) is str and mode in VALID_MODES):
        check_mode(mode, op)
    return mode


def checked_shape(normalized_shape, op: str) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of ints: an int (or any integer scalar)
    or a sequence of them. Anything else (8.5, "8", None) is a TypeError
    naming the argument, never a truncated shape."""
    try:
        return (operator.index(normalized_shape),)
    except TypeError:
        pass
    try:
        if isinstance(normalized_shape, (str, bytes)):
            raise TypeError
        return tuple(operator.index(s) for s in normalized_shape)
    except TypeError:
        raise TypeError(
            f"rtcnorm.{op}: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        ) from None


def _retry_shape(normalized_shape, passed, op: str):
    """After the op refused a call: the shape to call it again with, or None
    when the shape was not the cause (the caller then re-raises)."""
    shape = checked_shape(normalized_shape, op)
    return None if isinstance(passed, (list, tuple)) and tuple(passed) == shape else shape


def rms_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    mode: str | None = None,
    zero_centered_gamma: bool = False,
    residual: torch.Tensor | None = None,
    quant: Quant | None = None,
):
    """RMSNorm over the trailing ``normalized_shape`` dims, like ``F.rms_norm``.

    ``y = x / sqrt(mean(x^2) + eps) * g`` with ``g = weight`` (or
    ``1 + weight`` when ``zero_centered_gamma``, or 1 without a weight).
    ``eps=None`` means ``torch.finfo(input.dtype).eps``. The weight may be in
    input's dtype or float32; the output has input's dtype; all math is fp32.

    With ``residual``, computes ``h = input + residual`` (rounded to input's
    dtype) and returns ``(rms_norm(h), h)``; gradients flow to both.
    ``mode`` picks the forward kernel (see :data:`rtcnorm.MODES`). The
    backward is once differentiable: a second derivative raises.

    With ``quant`` (an :class:`rtcnorm.Quant`), the output is an
    :class:`rtcnorm.QuantizedTensor` (and ``h`` stays dense); its gradient is
    taken straight through, as if it had not been quantized.
    """
    if quant is not None:
        shape = checked_shape(normalized_shape, "rms_norm")
        return norm_quant("rms_norm", input, shape, weight, None, eps, quant, residual=residual, mode=mode,
                          zero_centered_gamma=zero_centered_gamma)  # fmt: skip
    checked_mode(mode, "rms_norm")
    if tuning.AUTOTUNE:
        tuning.maybe_autotune("rms_norm", input, weight, None, residual, mode, zero_centered_gamma)
    shape = (normalized_shape,) if type(normalized_shape) is int else normalized_shape
    try:
        if residual is None:
            return RMS_NORM(input, shape, weight, eps, mode, zero_centered_gamma)[0]
        y, h, _ = ADD_RMS_NORM(input, residual, shape, weight, eps, mode, zero_centered_gamma)
        return y, h
    except RuntimeError:
        shape = _retry_shape(normalized_shape, shape, "rms_norm")
        if shape is None:
            raise
    return rms_norm(input, shape, weight, eps, mode=mode, zero_centered_gamma=zero_centered_gamma, residual=residual)


def layer_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    mode: str | None = None,
    zero_centered_gamma: bool = False,
    quant: Quant | None = None,
) -> torch.Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims, like ``F.layer_norm``.

    ``y = (x - mean) / sqrt(var + eps) * g + bias`` with the biased variance,
    computed in fp32 without E[x^2] - E[x]^2 (two passes over a row held in
    registers, Chan-merged chunk moments otherwise), and
    ``g = weight``, ``1 + weight`` (``zero_centered_gamma``) or 1. The
    backward is once differentiable: a second derivative raises.

    With ``quant`` (an :class:`rtcnorm.Quant`), the output is an
    :class:`rtcnorm.QuantizedTensor`, its gradient taken straight through.
    """
    if quant is not None:
        shape = checked_shape(normalized_shape, "layer_norm")
        return norm_quant("layer_norm", input, shape, weight, bias, eps, quant, residual=None, mode=mode,
                          zero_centered_gamma=zero_centered_gamma)  # fmt: skip
    checked_mode(mode, "layer_norm")
    if tuning.AUTOTUNE:
        tuning.maybe_autotune("layer_norm", input, weight, bias, None, mode, zero_centered_gamma)
    shape = (normalized_shape,) if type(normalized_shape) is int else normalized_shape
    try:
        return LAYER_NORM(input, shape, weight, bias, eps, mode, zero_centered_gamma)[0]
    except RuntimeError:
        shape = _retry_shape(normalized_shape, shape, "layer_norm")
        if shape is None:
            raise
    return LAYER_NORM(input, shape, weight, bias, eps, mode, zero_centered_gamma)[0]
