"""Forward modes of the norm ops, and `explain`, which shows what would run."""

from __future__ import annotations

from collections.abc import Sequence

import torch

MODES = ("static_persistent", "multi_wave_reload", "multi_wave_cached")
"""Valid values of `mode` besides None (None lets a heuristic choose).

- ``static_persistent``: a grid of SMs x occupancy CTAs striding over rows.
  For narrow rows whose thread holds at most 16 gamma (and beta) values, they
  stay in registers for the CTA's lifetime.
- ``multi_wave_reload``: one CTA per block of rows; x is read once for the
  statistics and again for the normalize pass (the re-read mostly hits L2).
- ``multi_wave_cached``: one CTA per block of rows; the row stays on chip
  between the two passes, so x is read once: in registers, or in shared memory
  for long rows beside a residual or a bias (see below).

Where the row stays: in registers up to 64 bf16/fp16 or 32 fp32 values per
thread at 1024 threads. In shared memory (``explain(...)["smem"]`` bytes per
CTA) for rows of 16 KB or more with a residual, LayerNorm rows of more than
64 KB with a bias (and fp32 ones of 32 KB cached by 256 threads: N = 8192),
and any row too wide for registers that fits the CTA's shared memory (227 KB
on sm_90/sm_100, 163 KB on sm_80, 99 KB on sm_86/sm_89). ``static_persistent``
keeps rows the same way.

Rows that fit neither (e.g. N = 131072 in bf16, 65536 in fp32) are split on
sm_90 and newer across a thread-block cluster of up to 8 CTAs, each caching
a slice of at most 32 KB, whose statistics meet through distributed shared
memory (``explain(...)["cluster"]`` CTAs per row): x is still read once. On
older GPUs, and for rows too wide even for 8 slices, they are re-read in
every mode.

The backward (one design whatever the forward mode) keeps each row's x and dy
on chip too: in registers, or, for 16-bit rows of 7168 elements or more,
staged through a two-stage shared-memory ring whose next row is already
being copied while the current one is reduced (``explain(...)["backward"]
["staged"]``). On sm_90 and newer, staged rows run as row clusters of two CTAs
(LayerNorm from half the SMs' row blocks up; one gradient on rows of 8192 or
more, up to 8 row blocks an SM) whose dW / dB column sums meet in distributed
shared memory, so each pair writes one partial row (``["backward"]
["row_cluster"]``); elsewhere, with few rows, staged rows share at most
max(SMs / 2, row blocks / k) CTAs (k = 2 for dW alone, 8 for dW and dB), which
write fewer partial dW rows (``["backward"]["max_ctas"]``). When one row block holds every row, its
CTA (or cluster) writes dW / dB itself and no column reduce runs
(``["backward"]["direct_grads"]``). Grids of more than one register row
(past 512 elements; not one CTA sized to its few rows) with at most one row
block an SM and a few rows to sum (at most 4 per row lane of a CTA) add
column CTAs to the same launch: the row CTAs compute dx only, and the column
CTAs sum dW / dB over every row from the saved statistics and write them, so
no partial rows or column reduce exist (``["backward"]["column_grads"]``,
``["column_ctas"]``); such grids run on 256-thread CTAs.
On sm_90 and newer it splits float32 rows of more than 8192
elements, and 16-bit rows of up to 65536 that one CTA does not hold, across a
cluster the same way (16-bit slices of 4096 elements, staged). Wider rows
run a split design that streams them twice. On sm_90 and newer the kernels
that follow the first (the column reduce of the dW/dB partials, and the split
design's column kernel) are launched programmatically: their CTAs are
scheduled while the previous kernel drains and wait for it on the GPU, which
hides the launch gap between them (``["backward"]["programmatic_launch"]``).
"""

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
) -> dict:
    """Return the forward and backward launch plan for a norm call, and why.

    ``shape`` is the input's shape; rows are normalized over ``normalized_shape``
    (default: the last dim). With a CUDA device (the current one by default,
    when present) the kernel is loaded to report its real occupancy and grid;
    without one the plan is made for ``sm_count`` SMs of ``arch``.

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
    """
    if op not in _OPS:
        raise ValueError(f"rtcnorm.explain: op must be one of {_OPS}, got {op!r}")
    check_mode(mode, op)
    shape = [int(s) for s in shape]
    if normalized_shape is None:
        normalized_shape = shape[-1:]
    elif isinstance(normalized_shape, int):
        normalized_shape = [normalized_shape]
    normalized_shape = [int(s) for s in normalized_shape]
    nd = len(normalized_shape)
    if nd == 0 or shape[len(shape) - nd :] != normalized_shape:
        raise ValueError(
            f"rtcnorm.explain: normalized_shape {normalized_shape} must match the trailing dims of {shape}"
        )
    hidden = 1
    for s in normalized_shape:
        hidden *= s
    rows = 1
    for s in shape[: len(shape) - nd]:
        rows *= s
    if strides is not None:
        strides = [int(s) for s in strides]
        if len(strides) != len(shape):
            raise ValueError(f"rtcnorm.explain: strides {strides} must have one entry per dim of {shape}")
    if bias is None:
        bias = op == "layer_norm" and elementwise_affine
    dev_index = -1
    if device is not None or torch.cuda.is_available():
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if dev.type == "cuda":
            dev_index = dev.index if dev.index is not None else torch.cuda.current_device()
    from . import _C

    return _C.explain_norm(
        op,
        rows,
        hidden,
        dtype_name(dtype),
        dtype_name(weight_dtype or dtype),
        mode,
        bool(elementwise_affine),
        bool(bias),
        bool(zero_centered_gamma),
        bool(residual),
        dev_index,
        int(sm_count),
        int(arch.removeprefix("sm_")),
        bool(resources),
        strides is None or _C.rows_single_stride(shape, strides, len(shape) - nd),
    )
