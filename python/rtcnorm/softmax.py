"""Fused scaled, masked and causal softmax over the last dim, forward and backward.

All four ops compute ``softmax(scale * x)`` over the last dim in fp32 (fp64
for fp64 CPU input) and return the input's dtype (float16, bfloat16 or
float32 on CUDA). Masked-out elements are excluded from the softmax and are
exactly 0 in the output.

- Any row length ``sk`` >= 1 and any number of rows: no multiple-of-8,
  power-of-two or length caps. Rows too long to keep in registers are
  streamed (an online max/sum pass, then a normalize pass). Contiguous rows
  whose width is not a multiple of 16 bytes (odd ``sk``) are staged through
  shared memory in 16-byte pieces.
- A row with no visible element (a fully masked row) is all zeros, never
  NaN, and its gradient is zero. (``torch.softmax`` gives NaN there; Megatron's
  fused kernels, which fill with -10000, give ``1/sk``.)
- Causal ops take ``(..., sq, sk)`` and never read keys past the diagonal.
- The backward, ``dx = scale * y * (dy - sum(dy * y))``, reads only the saved
  output and the incoming gradient: never the mask or x.
"""

from __future__ import annotations

import torch
from torch import nn

from .modes import dtype_name


def scaled_softmax(input: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``softmax(input * scale)`` over the last dim, in one kernel.

    Args:
        input: scores of any shape with at least one dim; float16, bfloat16 or
            float32 on CUDA (float64 too on the CPU). Any last-dim length.
        scale: multiplies ``input`` before the softmax (e.g. ``1 / sqrt(head_dim)``).

    Returns:
        A tensor of ``input``'s shape and dtype; the math is float32 inside.
        Differentiable: the backward reads only this output and the incoming
        gradient.

    Example::

        scores = torch.randn(2, 16, 128, 128, device="cuda", dtype=torch.bfloat16)
        probs = rtcnorm.scaled_softmax(scores, 128**-0.5)
        # equals torch.softmax(scores.float() * 128**-0.5, -1).bfloat16() to bf16 rounding
    """
    return torch.ops.rtcnorm.scaled_softmax(input, float(scale))


def scaled_masked_softmax(input: torch.Tensor, mask: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``softmax(input * scale)`` over the last dim with ``mask`` True = masked out.

    ``mask`` is bool and broadcastable to ``input``, e.g. ``(b or 1, 1, sq, sk)``
    against ``(b, h, sq, sk)``. It is read through its broadcast strides, never
    materialised (except a mask broadcast along the last dim, which is expanded
    along that dim only).

    A row whose every element is masked out is all zeros with zero gradient
    (``torch.softmax`` after ``masked_fill(mask, -inf)`` gives NaN there);
    elsewhere the result equals that masked_fill-then-softmax.

    Example::

        pad = torch.zeros(b, 1, sq, sk, dtype=torch.bool, device=x.device)
        pad[..., sk - 4 :] = True                      # hide the last 4 keys of every query
        probs = rtcnorm.scaled_masked_softmax(x, pad, 0.125)   # x: (b, h, sq, sk)
    """
    return torch.ops.rtcnorm.scaled_masked_softmax(input, mask, float(scale))


def scaled_upper_triang_masked_softmax(input: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Causal softmax over ``(..., sq, sk)`` with ``sq == sk``: query i sees keys ``j <= i``.

    The masked upper triangle is never read and is written as zeros, so the
    op moves about half the bytes of a full softmax. ``input`` needs at least
    two dims, and its last two must be equal; for a KV cache longer than the
    queries use :func:`scaled_aligned_causal_masked_softmax`.
    """
    return torch.ops.rtcnorm.scaled_upper_triang_masked_softmax(input, float(scale))


def scaled_aligned_causal_masked_softmax(input: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Causal softmax aligned to the bottom right, over ``(..., sq, sk)`` with ``sq <= sk``.

    Query i sees keys ``j <= i + (sk - sq)``: the last query sees every key.
    Covers decode (``sq == 1``) and chunked prefill; equals
    :func:`scaled_upper_triang_masked_softmax` when ``sq == sk``. Keys past
    each query's diagonal are never read and are written as zeros.

    Example::

        q_scores = torch.randn(1, 32, 1, 4096, device="cuda", dtype=torch.float16)  # one new token
        probs = rtcnorm.scaled_aligned_causal_masked_softmax(q_scores, 0.125)   # sees all 4096 keys
    """
    return torch.ops.rtcnorm.scaled_aligned_causal_masked_softmax(input, float(scale))


MASK_TYPES = ("padding", "causal", "aligned_causal", "none")


class FusedScaleMaskSoftmax(nn.Module):
    """Scale, mask and softmax attention scores ``(b, h, sq, sk)`` in one kernel.

    ``mask_type``:

    - ``"padding"``: ``forward(x, mask)`` with a bool mask (True = masked out)
      broadcastable to ``x``; ``mask=None`` is a plain scaled softmax.
    - ``"causal"``: upper-triangular causal mask, ``sq == sk``.
    - ``"aligned_causal"``: causal aligned to the bottom right, ``sq <= sk``
      (decode, chunked prefill).
    - ``"none"``: no mask; passing one is an error.

    ``scale=None`` means 1. Input may be float16, bfloat16 or float32; math is
    fp32 and the output has the input's dtype.

    From Megatron-core's ``FusedScaleMaskSoftmax(input_in_fp16, input_in_bf16,
    attn_mask_type, scaled_masked_softmax_fusion, mask_func, softmax_in_fp32,
    scale)``:

    - ``input_in_fp16`` / ``input_in_bf16``: drop; the dtype is read from the input.
    - ``attn_mask_type``: ``AttnMaskType.padding`` -> ``"padding"``;
      ``AttnMaskType.causal`` -> ``"causal"`` (or ``"aligned_causal"`` when
      sq < sk, e.g. with a KV cache); ``AttnMaskType.no_mask`` -> ``"none"``;
      ``AttnMaskType.arbitrary`` -> ``"padding"`` with the mask.
    - ``scaled_masked_softmax_fusion``: drop; always fused, for every shape
      (no ``sk <= 4096``/``16384``, ``sk % 8`` or ``sq % 4`` conditions, so
      no silent fallback to an unfused path).
    - ``mask_func``: drop; masked elements are excluded exactly, as with
      ``masked_fill(mask, -inf)``. Megatron's ``attention_mask_func`` fills
      -10000: results agree except on fully masked rows, which are zeros here
      (Megatron: ``1/sk``).
    - ``softmax_in_fp32``: drop; always fp32 inside.
    - ``scale``: same meaning (``None`` = 1); allowed with any input dtype.
    - ``window_size`` and ``softmax_offset`` are not supported.
    - ``forward(input, mask)`` -> ``forward(x, mask=None)``. As in Megatron's
      fused path, the causal types ignore ``mask``.
    """

    def __init__(self, mask_type: str = "padding", scale: float | None = None) -> None:
        super().__init__()
        if mask_type not in MASK_TYPES:
            raise ValueError(f"rtcnorm.FusedScaleMaskSoftmax: mask_type must be one of {MASK_TYPES}, got {mask_type!r}")
        self.mask_type = mask_type
        self.scale = scale

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        scale = 1.0 if self.scale is None else float(self.scale)
        if self.mask_type == "causal":
            return scaled_upper_triang_masked_softmax(x, scale)
        if self.mask_type == "aligned_causal":
            return scaled_aligned_causal_masked_softmax(x, scale)
        if mask is None:
            return scaled_softmax(x, scale)
        if self.mask_type == "none":
            raise ValueError("rtcnorm.FusedScaleMaskSoftmax: mask_type='none' takes no mask; use mask_type='padding'")
        return scaled_masked_softmax(x, mask, scale)

    def extra_repr(self) -> str:
        return f"mask_type={self.mask_type!r}, scale={self.scale}"


def _mask_bcast(mask_shape, shape) -> int:
    """Rows sharing one mask row along the innermost leading dims of ``shape``
    where a mask of ``mask_shape`` is constant (e.g. heads), counted only when
    a non-broadcast leading dim of size > 1 lies inside them; else 0."""
    lead = shape[:-1]
    m = [1] * (len(shape) - len(mask_shape)) + list(mask_shape)
    m = m[:-1]
    seen_inner = False
    size = 0
    for d in range(len(lead) - 1, -1, -1):
        if lead[d] == 1:
            continue
        if m[d] == 1 and seen_inner:
            size = max(size, 1) * lead[d]
        elif size:
            break
        seen_inner = seen_inner or m[d] != 1
    return size


def explain(
    op: str,
    shape,
    dtype: torch.dtype = torch.bfloat16,
    *,
    arch: str = "sm_90",
    mask_shape=None,
    sm_count: int = 132,
    resources: bool = False,
) -> dict:
    """The forward and backward launch plans of a softmax op for an input of ``shape``, and why.

    Each phase holds the launch (``kernel``, ``grid``, ``cluster``, ...), the
    picked ``design`` with its ``knobs``, whether an override ``forced`` it,
    and the planner's trace: ``candidates``, one per design of the catalogue
    with ``feasible`` and, where feasible, its ``knobs``, ``resources`` and
    ``cost`` (the cost model's terms and its ``ns`` estimate). ``reason`` is
    the same trace as text. ``op`` is one of the four forward op names. Assumes aligned tensors (the
    widest vector access), as freshly allocated ones are. ``mask_shape``
    (scaled_masked_softmax) tells whether the mask is broadcast over a dim
    such as heads. The plan is made for ``sm_count`` SMs (132: H100 SXM);
    it matters only to grids of at most one row per SM (decode), which take
    a CTA per row, or on sm_90+ split long rows over a thread-block cluster
    (the ``cluster`` field). Needs no GPU. ``resources=True`` compiles each
    planned kernel afresh and adds ptxas' report (``registers`` a thread,
    ``spill_stores``, ``spill_loads``, ``stack_frame`` in bytes) under each
    phase's ``"ptxas"``, as ``rtcnorm.explain`` does.
    """
    shape = [int(s) for s in shape]
    if not shape:
        raise ValueError("rtcnorm.softmax.explain: shape must have at least 1 dim")
    rows = 1
    for s in shape[:-1]:
        rows *= s
    bcast = _mask_bcast([int(s) for s in mask_shape], shape) if mask_shape is not None else 0
    from . import _C

    arch_number = int(str(arch).lower().removeprefix("sm_"))
    sq = shape[-2] if len(shape) >= 2 else 0
    return _C.explain_softmax(
        op, rows, shape[-1], dtype_name(dtype), arch_number, bcast, int(sm_count), sq, bool(resources)
    )
