"""References, tolerances and test-case helpers for the softmax family tests.

The reference is ``torch.softmax`` on the fp32-upcast input (fp64 for fp64
input) after ``masked_fill(hidden, -inf)``, with fully hidden rows set to 0
(where ``torch.softmax`` gives NaN). The backward reference is the exact
formula on the reference output, with the incoming gradient zeroed past a
causal diagonal (the kernels never read it).
"""

from __future__ import annotations

import rtcnorm
import torch

OPS = (
    "scaled_softmax",
    "scaled_masked_softmax",
    "scaled_upper_triang_masked_softmax",
    "scaled_aligned_causal_masked_softmax",
)
CAUSAL_OPS = OPS[2:]
SKS = (1, 7, 100, 1000, 4097, 16385, 65536)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# dtype -> {"fwd": (rtol, atol_row), "bwd": (rtol, k)}.
# Forward: |y - ref| <= rtol * |ref| + atol_row * max|ref| of the row, so long
# rows of tiny probabilities are still held to the dtype's precision.
# Backward: |dx - ref| <= rtol * |ref| + k * |scale| * y_ref * max|dy| of the
# row. The kernel's y carries the dtype's rounding (unit roundoff u), and
# dx = scale * y * (dy - sum(dy * y)) turns that into an error of about
# scale * y * u * (|dy - sum| + max|dy|), which does not shrink with |dx|
# when dy - sum cancels; k is a few u.
TOLERANCE = {
    torch.float32: {"fwd": (1e-5, 1e-6), "bwd": (1e-5, 1e-5)},
    torch.float16: {"fwd": (2e-3, 1e-4), "bwd": (4e-3, 4e-3)},
    torch.bfloat16: {"fwd": (8e-3, 1e-3), "bwd": (1.6e-2, 1.6e-2)},
    torch.float64: {"fwd": (1e-10, 1e-12), "bwd": (1e-10, 1e-10)},
}


def hidden_mask(shape, mask=None, causal: bool = False, device=None) -> torch.Tensor:
    """Bool tensor of ``shape``: True where an element is excluded."""
    hidden = torch.zeros(shape, dtype=torch.bool, device=device)
    if mask is not None:
        hidden = hidden | mask.to(device)
    if causal:
        sq, sk = shape[-2], shape[-1]
        hidden = hidden | torch.ones(sq, sk, dtype=torch.bool, device=device).triu(sk - sq + 1)
    return hidden


def reference_softmax(x: torch.Tensor, scale: float = 1.0, mask=None, causal: bool = False) -> torch.Tensor:
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    hidden = hidden_mask(x.shape, mask, causal, x.device)
    z = (x.to(acc) * scale).masked_fill(hidden, float("-inf"))
    y = torch.softmax(z, dim=-1)
    return torch.where(hidden.all(-1, keepdim=True), torch.zeros_like(y), y)


def reference_softmax_backward(dy: torch.Tensor, y: torch.Tensor, scale: float, causal: bool = False) -> torch.Tensor:
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    y = y.to(acc)
    dy = dy.to(acc).masked_fill(hidden_mask(y.shape, None, causal, y.device), 0.0)
    return scale * y * (dy - (dy * y).sum(-1, keepdim=True))


def assert_within(actual: torch.Tensor, expected: torch.Tensor, tol: torch.Tensor, what: str = ""):
    """|actual - expected| <= tol everywhere; NaN or inf anywhere fails (so
    does an element left unwritten in a NaN-poisoned output)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a = actual.double()
    e = expected.double()
    finite = torch.isfinite(a)
    if not bool(finite.all()):
        raise AssertionError(
            f"{what}: {int((~finite).sum())} non-finite elements, first at {(~finite).nonzero()[0].tolist()}"
        )
    bad = (a - e).abs() > tol.double()
    if bool(bad.any()):
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements out of tolerance; first at {list(i)}: "
            f"got {a[i].item():.8g}, expected {e[i].item():.8g}, tolerance {tol.double().expand_as(e)[i].item():.3g}"
        )


def subnormal_step(dtype: torch.dtype) -> float:
    """Spacing of the dtype's subnormals: the rounding floor of tiny outputs."""
    fi = torch.finfo(dtype)
    return fi.smallest_normal * fi.eps


def assert_forward_close(y: torch.Tensor, y_ref: torch.Tensor, what: str = ""):
    rtol, atol_row = TOLERANCE[y.dtype]["fwd"]
    e = y_ref.double().abs()
    row_max = e.amax(dim=-1, keepdim=True) if e.numel() else e
    assert_within(y, y_ref, rtol * e + atol_row * row_max + subnormal_step(y.dtype), what)


def assert_backward_close(dx, dx_ref, y_ref, dy, scale: float, what: str = ""):
    rtol, k = TOLERANCE[dx.dtype]["bwd"]
    dy_max = dy.double().abs().amax(dim=-1, keepdim=True) if dy.numel() else dy.double()
    # The kernel's y is off by u * y or, where y is subnormal, by half a step.
    step = subnormal_step(dx.dtype)
    tol = rtol * dx_ref.double().abs() + abs(scale) * dy_max * (k * y_ref.double().abs() + 2 * step) + step
    assert_within(dx, dx_ref, tol, what)


# ---- test cases ---------------------------------------------------------------


def random_input(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype).to(device)


def random_mask(shape, device, seed, p=0.3):
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.rand(shape, generator=g) < p).to(device)


def default_shape(op, sk):
    """A 4-D (b, h, sq, sk) input of modest size for each op and row length."""
    if op == "scaled_upper_triang_masked_softmax":
        sq = min(sk, 130)
        return (1, 2, sq, sq)
    sq = 3 if op == "scaled_aligned_causal_masked_softmax" else 5
    return (2, 3, min(sq, sk), sk)


def poison_next_alloc(t_like: torch.Tensor):
    """Fill a freed block of t_like's size with 0xFF bytes (NaN in every float
    dtype), so the op's output most likely lands on it: an element the kernel
    fails to write stays NaN."""
    if t_like.is_cuda:
        torch.empty(t_like.numel() * t_like.element_size(), dtype=torch.uint8, device=t_like.device).fill_(0xFF)


def call(op, x, mask=None, scale=1.0):
    if op == "scaled_masked_softmax":
        return getattr(rtcnorm, op)(x, mask, scale)
    return getattr(rtcnorm, op)(x, scale)


def check_op(op, x, mask=None, scale=0.37, seed=0):
    """Forward, backward op and autograd of `op` on x against the reference."""
    causal = op in CAUSAL_OPS
    poison_next_alloc(x)
    y = call(op, x, mask, scale)
    y_ref = reference_softmax(x, scale, mask, causal)
    assert y.dtype == x.dtype and y.is_contiguous()
    assert_forward_close(y, y_ref, what=f"{op} forward {tuple(x.shape)} {x.dtype}")

    dy = random_input(x.shape, x.dtype, x.device, seed + 7)
    poison_next_alloc(x)
    dx = torch.ops.rtcnorm.scaled_softmax_backward(dy, y, scale, causal)
    dx_ref = reference_softmax_backward(dy, y_ref, scale, causal)
    assert_backward_close(dx, dx_ref, y_ref, dy, scale, what=f"{op} backward {tuple(x.shape)} {x.dtype}")

    xg = x.detach().clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(call(op, xg, mask, scale), xg, dy)
    # Autograd hands the backward dy in x's layout, which may change the
    # vector width and so the order of the row sum: compare to the reference.
    assert_backward_close(gx, dx_ref, y_ref, dy, scale, what=f"{op} autograd {tuple(x.shape)} {x.dtype}")
    return y
