"""Forward modes of the norm ops, and `explain`, which shows what would run."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch


class Modes(tuple):
    """``rtcnorm.MODES``: the forward modes of the norm ops, a tuple of names.

    Valid values of ``mode`` besides None (None lets the planner choose among
    every design); ``mode in rtcnorm.MODES`` tests one, and iterating lists them.

    - ``static_persistent``: a grid of SMs x occupancy CTAs striding over row
      blocks (register rows, sliced rows of a cooperative group, or re-read
      rows).
    - ``multi_wave_reload``: one CTA per row block; x is read once for the
      statistics and again for the normalize pass (the re-read mostly hits L2).
    - ``multi_wave_cached``: one CTA per row block; the row stays on chip
      between the two passes (registers, shared memory, or a cluster's slices),
      so x is read once; a row no cached design holds is re-read.

    The designs behind each mode, how the planner ranks them and how to force
    one: docs/designs.md; ``rtcnorm.explain(...)`` shows the ranked candidates.
    """

    __slots__ = ()


MODES = Modes(("static_persistent", "multi_wave_reload", "multi_wave_cached"))


_OPS = ("rms_norm", "layer_norm")


def check_mode(mode: str | None, op: str = "rms_norm") -> None:
    if mode is not None and mode not in MODES:
        raise ValueError(
            f"rtcnorm.{op}: mode must be None, 'static_persistent', 'multi_wave_reload' or "
            f"'multi_wave_cached', got {mode!r}"
        )


def dtype_name(dtype: torch.dtype) -> str:
    names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
    if dtype not in names:
        raise TypeError(f"rtcnorm: dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype}")
    return names[dtype]


def explain(
    op: str,
    shape: Sequence[int],
    dtype: torch.dtype = torch.bfloat16,
    *,
    normalized_shape: Sequence[int] | int | None = None,
    mode: str | None = None,
    weight_dtype: torch.dtype | None = None,
    elementwise_affine: bool = True,
    bias: bool | None = None,
    zero_centered_gamma: bool = False,
    residual: bool = False,
    strides: Sequence[int] | None = None,
    device: torch.device | str | int | None = None,
    sm_count: int = 132,
    arch: str = "sm_90",
    resources: bool = False,
    quant: str | None = None,
    quant_dtype: torch.dtype | None = None,
    scale_layout: str = "plain",
) -> dict:
    """Return the forward and backward launch plan for a norm call, and why.

    ``shape`` is the input's shape; rows are normalized over ``normalized_shape``
    (default: the last dim). The arguments get the op's own checks and
    messages (dtype, shapes, mode). With a CUDA device (the current one by
    default, when present) the kernel is loaded to report its real occupancy
    and grid; without one the plan is made for ``sm_count`` SMs of ``arch``.

    ``"device"`` names the device explained ("cuda:0", "cpu", or None when no
    GPU is visible) and ``"assumed"`` the GPU the plan is made for when it is
    not a loaded device, e.g. ``"sm_90, 132 SMs (no GPU visible)"``; the
    forward ``"reason"`` then ends with it too. ``device="cpu"`` describes
    the CPU path under ``"cpu_path"`` (CPU tensors run ATen reference code;
    no kernel is compiled), beside the plan a GPU of ``arch`` would run;
    float64, which only the CPU path takes, gets the CPU path alone.

    ``strides`` are the input's (default: contiguous). Rows whose leading
    dims need two strides, such as heads sliced out of a fused projection,
    take the general row map where a single stride lets a few-row grid skip
    its test (``"rows of one stride"`` in the reasons).

    ``resources=True`` also compiles each planned kernel afresh for that arch
    (no GPU needed, nothing cached) and adds ptxas' report under ``"ptxas"``
    (forward), ``["backward"]["ptxas"]`` and, for a split backward,
    ``["backward"]["coef_ptxas"]``: ``registers`` a thread, ``spill_stores``,
    ``spill_loads`` and ``stack_frame`` in bytes a thread. The value is None
    where NVRTC emits only PTX for the arch (the driver compiles it at load).

    ``quant`` (a recipe of ``rtcnorm.norm_quant``: "per_tensor",
    "per_token", "mxfp8", "nvfp4"), with ``quant_dtype`` (default: the
    recipe's) and ``scale_layout``, plans the forward with that quantized
    output (docs/quantized_outputs.md).

    ``"forced"`` (forward, and under ``"backward"``) is True where an
    override of ``rtcnorm._tuning`` restricted the candidates; an override
    that matches no candidate of the problem leaves it False. ``"tuned"`` is
    True where a measured choice of ``rtcnorm.tune`` was taken.
    """
    if op not in _OPS:
        raise ValueError(f"rtcnorm.explain: op must be one of {_OPS}, got {op!r}")
    shape = _sizes("shape", shape)
    if normalized_shape is None:
        normalized_shape = shape[-1:]
    elif isinstance(normalized_shape, int):
        normalized_shape = [normalized_shape]
    normalized_shape = _sizes("normalized_shape", normalized_shape, allow_negative=True)
    nd = len(normalized_shape)
    if strides is not None:
        strides = _sizes("strides", strides)
        if len(strides) != len(shape):
            raise ValueError(f"rtcnorm.explain: strides {strides} must have one entry per dim of {shape}")
    if bias is None:
        bias = op == "layer_norm" and elementwise_affine
    arch_number = _arch_number(arch)
    if int(sm_count) < 1:
        raise ValueError(f"rtcnorm.explain: sm_count must be at least 1, got {sm_count}")
    on_cpu = device is not None and torch.device(device).type == "cpu"
    dev_index = -1
    if not on_cpu and (device is not None or torch.cuda.is_available()):
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if dev.type == "cuda":
            dev_index = dev.index if dev.index is not None else torch.cuda.current_device()
    from . import _C

    _check_call(_C, op, shape, dtype, normalized_shape, mode, weight_dtype, elementwise_affine, bias, residual, on_cpu)
    where = "cpu" if on_cpu else (f"cuda:{dev_index}" if dev_index >= 0 else None)
    cpu_path = (
        "CPU tensors run rtcnorm's ATen reference code (float32 math, float64 for float64 input): "
        "no kernel is compiled or launched"
    )
    if dtype == torch.float64:
        return {"op": op, "device": where, "assumed": None, "cpu_path": cpu_path}
    plan = _C.explain_norm(
        op,
        math.prod(shape[: len(shape) - nd]),
        math.prod(normalized_shape),
        dtype_name(dtype),
        dtype_name(weight_dtype or dtype),
        mode,
        bool(elementwise_affine),
        bool(bias),
        bool(zero_centered_gamma),
        bool(residual),
        dev_index,
        int(sm_count),
        arch_number,
        bool(resources),
        _rows_layout(_C, shape, strides, nd),
        quant,
        quant_dtype,
        scale_layout,
    )
    plan["device"] = where
    plan["assumed"] = None
    if dev_index < 0:
        why = "device='cpu': a GPU of this arch" if on_cpu else "no GPU visible"
        plan["assumed"] = f"{plan['arch']}, {plan['sm_count']} SMs ({why})"
        plan["reason"] += f"; planned for an assumed GPU: {plan['assumed']}"
    if on_cpu:
        plan["cpu_path"] = cpu_path
    return plan


def _arch_number(arch: str) -> int:
    """80 for "sm_80"; the kernels need compute capability 8.0 or newer."""
    text = str(arch).lower().removeprefix("sm_")
    if not text.isdigit() or int(text) < 80:
        raise ValueError(f"rtcnorm.explain: arch must name sm_80 or newer (e.g. 'sm_90'), got {arch!r}")
    return int(text)


def _sizes(name: str, values, allow_negative: bool = False) -> list[int]:
    """Integers (``operator.index``: 8.5 is refused, not truncated), >= 0."""
    try:
        out = [operator.index(v) for v in values]
    except TypeError:
        raise TypeError(f"rtcnorm.explain: {name} must be a sequence of ints, got {values!r}") from None
    if not allow_negative and any(v < 0 for v in out):
        raise ValueError(f"rtcnorm.explain: {name} must not hold a negative entry, got {out}")
    return out


def _rows_layout(_C, shape, strides, nd: int) -> int:
    """2: contiguous rows (as a fresh tensor's), 1: rows of one stride, 0: of two."""
    if strides is None:
        return 2
    lead = len(shape) - nd
    if not _C.rows_single_stride(shape, strides, lead):
        return 0
    inner = math.prod(shape[lead:])
    dense = all(strides[d] == math.prod(shape[d + 1 :]) for d in range(lead, len(shape)) if shape[d] > 1)
    rows_dense = lead == 0 or math.prod(shape[:lead]) == 1 or strides[lead - 1] == inner
    return 2 if dense and rows_dense else 1


def _check_call(_C, op, shape, dtype, normalized_shape, mode, weight_dtype, affine, bias, residual, on_cpu):
    """The op's own argument checks (csrc/ops/norm_checks.cpp) on meta
    tensors of the call's shapes and dtypes, for the CUDA or the CPU path."""
    meta = {"device": "meta"}
    x = torch.empty(shape, dtype=dtype, **meta)
    # A negative entry fails the trailing-dims check before parameters are read.
    params = min(normalized_shape, default=0) >= 0
    w = torch.empty(normalized_shape, dtype=weight_dtype or dtype, **meta) if affine and params else None
    b = torch.empty(normalized_shape, dtype=weight_dtype or dtype, **meta) if bias and params else None
    r = torch.empty(shape, dtype=dtype, **meta) if residual else None
    name = "add_rms_norm" if (op == "rms_norm" and residual) else op
    _C._check_norm_forward(name, x, r, normalized_shape, w, b, None, mode, cuda=not on_cpu)
