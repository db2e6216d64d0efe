"""Reference RMSNorm / LayerNorm in float64, and the one tolerance table.

Every reference upcasts its (possibly low-precision) inputs to float64 and
does all math there, so it measures the op's error and nothing else. The only
rounding the references reproduce is part of the ops' contract: the fused
residual sum ``h = input + residual`` is rounded to input's dtype before it is
normalized (and returned).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tol:
    atol: float
    rtol: float


# Keyed by the dtype of the tensor being checked (y, dx: input's dtype; dw, db:
# the weight's dtype; mean, rstd: float32, or float64 for float64 input).
# Each low-precision entry allows about two units in the last place on top of
# one rounding of an fp32 result.
TOLERANCES = {
    torch.float64: Tol(atol=1e-9, rtol=1e-9),
    torch.float32: Tol(atol=1e-5, rtol=2e-5),
    torch.float16: Tol(atol=1e-3, rtol=4e-3),
    torch.bfloat16: Tol(atol=8e-3, rtol=1.6e-2),
}


def tol(dtype: torch.dtype, reduce_len: int = 1) -> Tol:
    """Tolerance for a tensor of ``dtype``; sums over ``reduce_len`` terms (dW,
    dB) get an absolute tolerance that grows like a random walk."""
    t = TOLERANCES[dtype]
    return Tol(atol=t.atol * math.sqrt(max(1, reduce_len)), rtol=t.rtol)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, *, what: str, reduce_len: int = 1, dtype=None, scale: float = 1.0
):
    """``actual`` must be finite everywhere (poisoned or NaN outputs never
    pass) and within the table's tolerance of the float64 ``expected``;
    ``scale`` widens it for ill-conditioned data, and says why at the call."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    finite = torch.isfinite(actual)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: {int((~finite).sum())} non-finite elements, first at {bad}")
    t = tol(dtype or actual.dtype, reduce_len)
    t = Tol(atol=t.atol * scale, rtol=t.rtol * scale)
    torch.testing.assert_close(
        actual.double(), expected.double(), atol=t.atol, rtol=t.rtol, equal_nan=False, msg=lambda m: f"{what}: {m}"
    )


def default_rms_eps(dtype: torch.dtype, eps: float | None) -> float:
    return torch.finfo(dtype).eps if eps is None else eps


def residual_sum(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``x + residual`` computed in fp32 (fp64 for fp64) and rounded to x's dtype."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (x.to(acc) + residual.to(acc)).to(x.dtype)


def _dims(x: torch.Tensor, normalized_shape) -> list[int]:
    nd = len(normalized_shape)
    return list(range(x.dim() - nd, x.dim()))


def _scale(weight, zero_centered_gamma):
    if weight is None:
        return None
    g = weight.double()
    return g + 1 if zero_centered_gamma else g


def rms_norm_f64(h64, normalized_shape, weight, eps, zero_centered_gamma=False):
    """Differentiable float64 RMSNorm of an already-upcast input."""
    dims = _dims(h64, normalized_shape)
    rstd = torch.rsqrt(h64.pow(2).mean(dims, keepdim=True) + eps)
    y = h64 * rstd
    g = _scale(weight, zero_centered_gamma)
    return (y if g is None else y * g), rstd


def layer_norm_f64(x64, normalized_shape, weight, bias, eps, zero_centered_gamma=False):
    """Differentiable float64 LayerNorm (biased variance) of an upcast input."""
    dims = _dims(x64, normalized_shape)
    mean = x64.mean(dims, keepdim=True)
    var = (x64 - mean).pow(2).mean(dims, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (x64 - mean) * rstd
    g = _scale(weight, zero_centered_gamma)
    if g is not None:
        y = y * g
    if bias is not None:
        y = y + bias.double()
    return y, mean, rstd


def _lead(x, normalized_shape):
    return x.shape[: x.dim() - len(normalized_shape)]


def ref_rms_norm(
    x, normalized_shape, weight=None, eps=None, *, zero_centered_gamma=False, residual=None, dy=None, dh=None
):
    """Forward (and, given ``dy``, backward) reference of rtcnorm.rms_norm.

    Returns float64 tensors: ``y``, ``rstd`` (leading dims), ``h`` (residual
    sum, in x's dtype, or None) and with ``dy``: ``dx`` (also the residual's
    gradient), ``dw``.
    """
    normalized_shape = list(normalized_shape)
    eps = default_rms_eps(x.dtype, eps)
    h = residual_sum(x, residual) if residual is not None else None
    h64 = (h if h is not None else x).detach().double().requires_grad_(dy is not None)
    w64 = weight.detach().double().requires_grad_(dy is not None) if weight is not None else None
    y, rstd = rms_norm_f64(h64, normalized_shape, w64, eps, zero_centered_gamma)
    out = {"y": y.detach(), "rstd": rstd.detach().reshape(_lead(x, normalized_shape)), "h": h}
    if dy is not None:
        inputs = [h64] + ([w64] if w64 is not None else [])
        grads = torch.autograd.grad(y, inputs, dy.double())
        dx = grads[0] + (dh.double() if dh is not None else 0)
        out["dx"] = dx
        out["dw"] = grads[1] if w64 is not None else None
    return out


def ref_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, zero_centered_gamma=False, dy=None):
    """Forward (and, given ``dy``, backward) reference of rtcnorm.layer_norm.

    Returns float64 ``y``, ``mean``, ``rstd`` and with ``dy``: ``dx``, ``dw``, ``db``.
    """
    normalized_shape = list(normalized_shape)
    need = dy is not None
    x64 = x.detach().double().requires_grad_(need)
    w64 = weight.detach().double().requires_grad_(need) if weight is not None else None
    b64 = bias.detach().double().requires_grad_(need) if bias is not None else None
    y, mean, rstd = layer_norm_f64(x64, normalized_shape, w64, b64, eps, zero_centered_gamma)
    lead = _lead(x, normalized_shape)
    out = {"y": y.detach(), "mean": mean.detach().reshape(lead), "rstd": rstd.detach().reshape(lead)}
    if need:
        inputs = [t for t in (x64, w64, b64) if t is not None]
        grads = list(torch.autograd.grad(y, inputs, dy.double()))
        out["dx"] = grads.pop(0)
        out["dw"] = grads.pop(0) if w64 is not None else None
        out["db"] = grads.pop(0) if b64 is not None else None
    return out


def rows_of(x: torch.Tensor, normalized_shape) -> int:
    return math.prod(_lead(x, normalized_shape))


def stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32
