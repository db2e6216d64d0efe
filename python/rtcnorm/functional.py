"""Functional forms of the ops, shaped like their torch.nn.functional twins."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .modes import check_mode


def _as_shape(normalized_shape) -> list[int]:
    if isinstance(normalized_shape, int):
        return [normalized_shape]
    return [int(s) for s in normalized_shape]


def rms_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    mode: str | None = None,
    zero_centered_gamma: bool = False,
    residual: torch.Tensor | None = None,
):
    """RMSNorm over the trailing ``normalized_shape`` dims, like ``F.rms_norm``.

    ``y = x / sqrt(mean(x^2) + eps) * g`` with ``g = weight`` (or
    ``1 + weight`` when ``zero_centered_gamma``, or 1 without a weight).
    ``eps=None`` means ``torch.finfo(input.dtype).eps``. The weight may be in
    input's dtype or float32; the output has input's dtype; all math is fp32.

    With ``residual``, computes ``h = input + residual`` (rounded to input's
    dtype) and returns ``(rms_norm(h), h)``; gradients flow to both.
    ``mode`` picks the forward kernel (see :data:`rtcnorm.MODES`).
    """
    check_mode(mode, "rms_norm")
    shape = _as_shape(normalized_shape)
    if residual is None:
        return torch.ops.rtcnorm.rms_norm(input, shape, weight, eps, mode, zero_centered_gamma)[0]
    y, h, _ = torch.ops.rtcnorm.add_rms_norm(input, residual, shape, weight, eps, mode, zero_centered_gamma)
    return y, h


def layer_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    mode: str | None = None,
    zero_centered_gamma: bool = False,
) -> torch.Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims, like ``F.layer_norm``.

    ``y = (x - mean) / sqrt(var + eps) * g + bias`` with the biased variance,
    computed in fp32 without E[x^2] - E[x]^2 (two passes over a row held in
    registers, Chan-merged chunk moments otherwise), and
    ``g = weight``, ``1 + weight`` (``zero_centered_gamma``) or 1.
    """
    check_mode(mode, "layer_norm")
    shape = _as_shape(normalized_shape)
    return torch.ops.rtcnorm.layer_norm(input, shape, weight, bias, eps, mode, zero_centered_gamma)[0]
