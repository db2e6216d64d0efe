"""nn.Module drop-ins for torch.nn.RMSNorm and torch.nn.LayerNorm.

Same constructor arguments, parameter names and state_dict layout as the
torch modules, plus ``mode`` (and ``zero_centered_gamma``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from . import tuning
from ._norm_quant import norm_quant
from .functional import ADD_RMS_NORM, LAYER_NORM, RMS_NORM, checked_mode, checked_shape
from .quantized import Quant


def _checked_quant(quant, cls: str):
    if quant is not None and not isinstance(quant, Quant):
        raise TypeError(f"rtcnorm.{cls}: quant must be an rtcnorm.Quant or None, got {type(quant).__name__}")
    return quant


class RMSNorm(nn.Module):
    r"""Drop-in for :class:`torch.nn.RMSNorm` running rtcnorm's fused kernels.

    Normalizes the trailing ``normalized_shape`` dims of the input:
    ``y = x / sqrt(mean(x^2) + eps) * g``, where ``g`` is ``weight``, or
    ``1 + weight`` with ``zero_centered_gamma=True``, or 1 without a weight.
    The statistics are computed in fp32 (fp64 for fp64 input, on CPU);
    rows of huge magnitude (fp32 near 1e30, bf16 near 1e38) are still
    normalized, not zeroed.

    Args:
        normalized_shape: the trailing dims to normalize, an int or a sequence
            of ints (any other type is a TypeError); the input's last dims must
            match it.
        eps: added to the mean square. ``None`` (the default, as in torch)
            means ``torch.finfo(x.dtype).eps`` of each call's input.
        elementwise_affine: learn a ``weight`` of shape ``normalized_shape``
            (initialised to ones, or zeros with ``zero_centered_gamma``).
        mode: the forward kernel design, None (a planner chooses) or one of
            :data:`rtcnorm.MODES`; ``rtcnorm.explain`` shows what runs. It
            never changes the result beyond rounding.
        zero_centered_gamma: scale by ``1 + weight`` (weight decay then pulls
            the scale towards 1 rather than 0).
        device, dtype: of the weight. It may be float32 beside bf16 or fp16
            input (mixed precision); the output has the input's dtype.

    ``forward(x, residual=None)`` returns ``y``; with a ``residual`` of x's
    shape and dtype it computes ``h = x + residual`` (rounded to x's dtype)
    in the same kernel and returns ``(y, h)``, gradients flowing to both.
    With ``quant`` (an :class:`rtcnorm.Quant`, also settable later as the
    ``quant`` attribute) ``y`` is an :class:`rtcnorm.QuantizedTensor`
    (docs/quantized_outputs.md); it is not part of the state_dict.

    Inputs may be CUDA tensors (float32, float16, bfloat16; kernels are
    compiled on first use for each shape and cached on disk) or CPU tensors
    (a reference implementation, float64 too). Rows may be strided. The
    state_dict matches torch.nn.RMSNorm's, and :meth:`from_torch` converts
    one. The backward is once differentiable: a second derivative (double
    backward) raises a RuntimeError; use torch.nn.RMSNorm where one is needed.

    Example::

        norm = rtcnorm.RMSNorm(4096, device="cuda", dtype=torch.bfloat16)
        y = norm(x)                   # x: (..., 4096)
        y, h = norm(x, residual=r)    # pre-norm block: h = x + r
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        *,
        mode: str | None = None,
        zero_centered_gamma: bool = False,
        quant: Quant | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.normalized_shape = checked_shape(normalized_shape, "RMSNorm")
        checked_mode(mode, "RMSNorm")
        self.quant = _checked_quant(quant, "RMSNorm")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.mode = mode
        self.zero_centered_gamma = zero_centered_gamma
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            if self.zero_centered_gamma:
                nn.init.zeros_(self.weight)
            else:
                nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        # The op checks the mode and shape itself; __init__ already did.
        if self.quant is not None:
            return norm_quant("rms_norm", x, self.normalized_shape, self.weight, None, self.eps,
                              _checked_quant(self.quant, "RMSNorm"), residual=residual, mode=self.mode,
                              zero_centered_gamma=self.zero_centered_gamma)  # fmt: skip
        if tuning.AUTOTUNE:
            tuning.maybe_autotune("rms_norm", x, self.weight, None, residual, self.mode, self.zero_centered_gamma)
        if residual is None:
            return RMS_NORM(x, self.normalized_shape, self.weight, self.eps, self.mode, self.zero_centered_gamma)[0]
        y, h, _ = ADD_RMS_NORM(
            x, residual, self.normalized_shape, self.weight, self.eps, self.mode, self.zero_centered_gamma
        )
        return y, h

    def extra_repr(self) -> str:
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, mode={self.mode}"
        s += ", zero_centered_gamma=True" if self.zero_centered_gamma else ""
        return s + (f", quant={self.quant}" if self.quant is not None else "")

    @classmethod
    def from_torch(cls, module: nn.RMSNorm, *, mode: str | None = None) -> RMSNorm:
        """A copy of a torch.nn.RMSNorm (parameters copied, same device and dtype)."""
        w = module.weight
        new = cls(
            module.normalized_shape,
            module.eps,
            module.elementwise_affine,
            mode=mode,
            device=w.device if w is not None else None,
            dtype=w.dtype if w is not None else None,
        )
        new.load_state_dict(module.state_dict())
        return new


class LayerNorm(nn.Module):
    r"""Drop-in for :class:`torch.nn.LayerNorm` running rtcnorm's fused kernels.

    Normalizes the trailing ``normalized_shape`` dims of the input:
    ``y = (x - mean) / sqrt(var + eps) * g + bias``, with the biased variance
    and ``g`` = ``weight``, ``1 + weight`` (``zero_centered_gamma=True``) or 1.
    The statistics are computed in fp32 (fp64 for fp64 input, on CPU) without
    E[x^2] - E[x]^2, so a large mean does not cancel the variance; rows of
    huge magnitude (fp32 near 1e30, bf16 near 1e38) are still normalized,
    not zeroed.

    Args:
        normalized_shape: the trailing dims to normalize, an int or a sequence
            of ints (any other type is a TypeError); the input's last dims must
            match it.
        eps: added to the variance (default 1e-5, as in torch); finite, >= 0.
        elementwise_affine: learn ``weight`` (ones, or zeros with
            ``zero_centered_gamma``) and, with ``bias=True``, ``bias`` (zeros),
            both of shape ``normalized_shape``.
        bias: learn a bias (only with ``elementwise_affine``).
        mode: the forward kernel design, None (a planner chooses) or one of
            :data:`rtcnorm.MODES`; ``rtcnorm.explain`` shows what runs. It
            never changes the result beyond rounding.
        zero_centered_gamma: scale by ``1 + weight``.
        device, dtype: of the parameters. They may be float32 beside bf16 or
            fp16 input (mixed precision); the output has the input's dtype.

    Inputs may be CUDA tensors (float32, float16, bfloat16; kernels are
    compiled on first use for each shape and cached on disk) or CPU tensors
    (a reference implementation, float64 too). Rows may be strided. The
    state_dict matches torch.nn.LayerNorm's, and :meth:`from_torch` converts
    one. The backward is once differentiable: a second derivative (double
    backward) raises a RuntimeError; use torch.nn.LayerNorm where one is
    needed. With ``quant`` (an :class:`rtcnorm.Quant`, also settable later as
    the ``quant`` attribute) the output is an :class:`rtcnorm.QuantizedTensor`.

    Example::

        norm = rtcnorm.LayerNorm(1024, device="cuda", dtype=torch.bfloat16)
        y = norm(x)                   # x: (..., 1024)
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        mode: str | None = None,
        zero_centered_gamma: bool = False,
        quant: Quant | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.normalized_shape = checked_shape(normalized_shape, "LayerNorm")
        checked_mode(mode, "LayerNorm")
        self.quant = _checked_quant(quant, "LayerNorm")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.mode = mode
        self.zero_centered_gamma = zero_centered_gamma
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            if self.zero_centered_gamma:
                nn.init.zeros_(self.weight)
            else:
                nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return norm_quant("layer_norm", x, self.normalized_shape, self.weight, self.bias, self.eps,
                              _checked_quant(self.quant, "LayerNorm"), residual=None, mode=self.mode,
                              zero_centered_gamma=self.zero_centered_gamma)  # fmt: skip
        if tuning.AUTOTUNE:
            tuning.maybe_autotune("layer_norm", x, self.weight, self.bias, None, self.mode, self.zero_centered_gamma)
        return LAYER_NORM(
            x, self.normalized_shape, self.weight, self.bias, self.eps, self.mode, self.zero_centered_gamma
        )[0]

    def extra_repr(self) -> str:
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, mode={self.mode}"
        s += ", zero_centered_gamma=True" if self.zero_centered_gamma else ""
        return s + (f", quant={self.quant}" if self.quant is not None else "")

    @classmethod
    def from_torch(cls, module: nn.LayerNorm, *, mode: str | None = None) -> LayerNorm:
        """A copy of a torch.nn.LayerNorm (parameters copied, same device and dtype)."""
        w = module.weight
        new = cls(
            module.normalized_shape,
            module.eps,
            module.elementwise_affine,
            bias=module.bias is not None,
            mode=mode,
            device=w.device if w is not None else None,
            dtype=w.dtype if w is not None else None,
        )
        new.load_state_dict(module.state_dict())
        return new


class RMSNormGated(nn.Module):
    r"""Gated RMSNorm module (Mamba2, Qwen3-Next): ``forward(x, z)`` is
    :func:`rtcnorm.rms_norm_gated` with this module's weight and settings.

    Args:
        hidden_size: N, the last dim of the input.
        eps: added to each group's mean square (1e-6, as Mamba2's).
        group_size: a divisor of N; the RMS is taken within each group of
            that many consecutive columns (None: the whole row).
        norm_before_gate: ``y = norm(x) * w * act(z)`` when True, else
            ``y = norm(x * act(z)) * w``.
        activation: "silu" or "sigmoid".
        elementwise_affine: learn a ``weight`` of N elements (ones at start).
        quant: an :class:`rtcnorm.Quant`: ``forward(x, z)`` returns the
            gated output as a :class:`rtcnorm.QuantizedTensor` (as
            :class:`RMSNorm` does with ``quant``).

    ``z=None`` normalizes without a gate (per group), as Mamba2's module does;
    it is never quantized.
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        group_size: int | None = None,
        norm_before_gate: bool = True,
        activation: str = "silu",
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        quant: Quant | None = None,
    ) -> None:
        super().__init__()
        self.quant = _checked_quant(quant, "RMSNormGated")
        self.hidden_size = int(hidden_size)
        self.eps = eps
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.activation = activation
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        from .gated import rms_norm_gated

        if z is not None:
            return rms_norm_gated(
                x,
                z,
                self.weight,
                self.eps,
                norm_before_gate=self.norm_before_gate,
                group_size=self.group_size,
                activation=self.activation,
                quant=_checked_quant(self.quant, "RMSNormGated"),
            )
        g = self.group_size or x.shape[-1]
        y = RMS_NORM(x.unflatten(-1, (x.shape[-1] // g, g)), (g,), None, self.eps)[0].flatten(-2)
        return y if self.weight is None else y * self.weight.to(y.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.hidden_size}, eps={self.eps}, group_size={self.group_size}, "
            f"norm_before_gate={self.norm_before_gate}, activation={self.activation!r}"
        ) + (f", quant={self.quant}" if self.quant is not None else "")
