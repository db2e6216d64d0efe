"""nn.Module drop-ins for torch.nn.RMSNorm and torch.nn.LayerNorm.

Same constructor arguments, parameter names and state_dict layout as the
torch modules, plus ``mode`` (and ``zero_centered_gamma``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import nn

from . import functional as F
from .modes import check_mode


def _shape_tuple(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


class RMSNorm(nn.Module):
    """Drop-in for :class:`torch.nn.RMSNorm` running rtcnorm's fused kernels.

    ``eps=None`` means ``torch.finfo(x.dtype).eps``. With
    ``zero_centered_gamma=True`` the scale is ``1 + weight`` and the weight is
    initialised to zeros. ``forward(x, residual=None)`` returns ``(y, x +
    residual)`` when a residual is given.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        *,
        mode: str | None = None,
        zero_centered_gamma: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_mode(mode, "RMSNorm")
        self.normalized_shape = _shape_tuple(normalized_shape)
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
        return F.rms_norm(
            x,
            self.normalized_shape,
            self.weight,
            self.eps,
            mode=self.mode,
            zero_centered_gamma=self.zero_centered_gamma,
            residual=residual,
        )

    def extra_repr(self) -> str:
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, mode={self.mode}"
        return s + (", zero_centered_gamma=True" if self.zero_centered_gamma else "")

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
    """Drop-in for :class:`torch.nn.LayerNorm` running rtcnorm's fused kernels."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        mode: str | None = None,
        zero_centered_gamma: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_mode(mode, "LayerNorm")
        self.normalized_shape = _shape_tuple(normalized_shape)
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
        return F.layer_norm(
            x,
            self.normalized_shape,
            self.weight,
            self.bias,
            self.eps,
            mode=self.mode,
            zero_centered_gamma=self.zero_centered_gamma,
        )

    def extra_repr(self) -> str:
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, mode={self.mode}"
        return s + (", zero_centered_gamma=True" if self.zero_centered_gamma else "")

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
