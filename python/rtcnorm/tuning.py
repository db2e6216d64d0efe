"""Measured tuning: time the cost model's best candidates for one exact norm
problem on the GPU, and keep the fastest for later calls and processes.

``tune(op, shape, ...)`` times, forward and backward, the planner's own pick
and the cheapest candidates of every design (device time, L2 flushed between
calls, median of ``reps``). The winner is kept for this process and, with
``persist=True``, in the disk cache beside the kernels, under the same rules
(private folders, atomic writes, checksummed, the full key checked on read:
an entry of another problem, GPU model or rtcnorm version is never used).
From then on every call of that exact problem on that GPU model launches the
winner; ``rtcnorm.explain(..., device=...)`` reports ``"tuned": True``.

``RTCNORM_AUTOTUNE=1`` tunes each new problem the first time the functional
ops or modules meet it (never inside ``torch.compile`` tracing or CUDA-graph
capture, where the call runs the cost model's pick instead). The planner
never needs tuning to be correct; tuning only picks among its candidates.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence

import torch

from . import _C, tuned_table
from ._tuning import norm_get, norm_override
from .modes import dtype_name, explain

_OPS = ("rms_norm", "layer_norm")
_MODE_BITS = {None: 0, "static_persistent": 1, "multi_wave_reload": 2, "multi_wave_cached": 3}
_FLUSH_BYTES = 256 << 20
AUTOTUNE = os.environ.get("RTCNORM_AUTOTUNE", "").strip().lower() in ("1", "true", "yes", "on")
_autotuned: set = set()


def _refuse_inside_capture() -> None:
    if torch.compiler.is_compiling():
        raise RuntimeError("rtcnorm.tune: cannot tune inside torch.compile tracing; tune before compiling")
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("rtcnorm.tune: cannot tune during CUDA-graph capture; tune before capturing")


def _device_ms(fn, reps: int, flush: torch.Tensor) -> float:
    fn()
    fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda._sleep(20_000_000)  # the host queues every call before the first runs
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _candidates(direction: str, picked: dict, plan_of) -> list[dict]:
    """The planner's pick and its ranked runners-up (`picked`, the plan in
    force), and the cheapest of every design (`plan_of()` under an override)."""
    seen, out = set(), []

    def add(c):
        sig = (c["design"], tuple(sorted(c["knobs"].items())))
        if sig not in seen:
            seen.add(sig)
            out.append({"design": c["design"], "knobs": dict(c["knobs"]), "model_us": c["us"]})

    for c in picked["candidates"]:
        add(c)
    for design in _C.norm_designs(direction):
        with norm_override(direction, design):
            for c in [c for c in plan_of()["candidates"] if c["design"] == design][:2]:
                add(c)
    return out


def tune(
    op: str,
    shape: Sequence[int],
    dtype: torch.dtype = torch.bfloat16,
    *,
    weight_dtype: torch.dtype | None = None,
    bias: bool | None = None,
    zero_centered_gamma: bool = False,
    residual: bool = False,
    mode: str | None = None,
    device: torch.device | str | int | None = None,
    directions: Sequence[str] = ("fwd", "bwd"),
    reps: int = 10,
    persist: bool = True,
) -> dict:
    """Time the candidates of ``op`` on ``shape`` (rows x N, leading dims
    flattened) and keep the fastest forward and backward plan.

    Returns, per direction, ``{"picked": {...}, "best": {...}, "candidates":
    [...]}``: each entry names the design and knobs with its ``ms``;
    ``speedup`` is the planner's pick's time over the winner's.
    """
    if op not in _OPS:
        raise ValueError(f"rtcnorm.tune: op must be one of {_OPS}, got {op!r}")
    if mode not in _MODE_BITS:
        raise ValueError(f"rtcnorm.tune: mode must be one of {tuple(_MODE_BITS)}, got {mode!r}")
    bad = [d for d in directions if d not in ("fwd", "bwd")]
    if bad or not directions:
        raise ValueError(f"rtcnorm.tune: directions must be a non-empty subset of ('fwd', 'bwd'), got {directions!r}")
    if residual and op != "rms_norm":
        raise ValueError("rtcnorm.tune: residual=True is an rms_norm feature (add_rms_norm)")
    if not torch.cuda.is_available():
        raise RuntimeError("rtcnorm.tune: needs a CUDA device; tuning times kernels on the GPU")
    _refuse_inside_capture()
    dev = torch.device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise ValueError(f"rtcnorm.tune: device must be a CUDA device, got {dev}")
    dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    shape = tuple(int(s) for s in shape)
    if len(shape) < 1 or any(s < 1 for s in shape):
        raise ValueError(f"rtcnorm.tune: shape must be positive sizes, got {shape}")
    rows, n = math.prod(shape[:-1]), shape[-1]
    bias = op == "layer_norm" if bias is None else bool(bias)
    wdtype = weight_dtype or dtype
    for direction in directions:
        if norm_get(direction)["design"] is not None or norm_get(direction)["knobs"]:
            raise RuntimeError(f"rtcnorm.tune: a {direction} override is set (rtcnorm._tuning); clear it first")

    with torch.cuda.device(dev):
        x = torch.randn(rows, n, device=dev, dtype=dtype, requires_grad=True)
        w = torch.randn(n, device=dev, dtype=wdtype, requires_grad=True)
        b = torch.randn(n, device=dev, dtype=wdtype, requires_grad=True) if bias else None
        r = torch.randn(rows, n, device=dev, dtype=dtype, requires_grad=True) if residual else None
        flush = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
        ops = torch.ops.rtcnorm

        def forward():  # the ops the functional forms and modules call
            if op == "layer_norm":
                return ops.layer_norm(x, (n,), w, b, 1e-5, mode, zero_centered_gamma)[0]
            if residual:
                return ops.add_rms_norm(x, r, (n,), w, 1e-6, mode, zero_centered_gamma)[0]
            return ops.rms_norm(x, (n,), w, 1e-6, mode, zero_centered_gamma)[0]

        params = tuple(t for t in (x, w, b, r) if t is not None)
        grad = torch.randn(rows, n, device=dev, dtype=dtype)

        def plan_of(direction):
            e = explain(
                op,
                (rows, n),
                dtype,
                mode=mode,
                weight_dtype=wdtype,
                bias=bias,
                zero_centered_gamma=zero_centered_gamma,
                residual=residual,
                device=dev,
            )
            return e if direction == "fwd" else e["backward"]

        report = {"op": op, "shape": (rows, n), "dtype": str(dtype), "device": torch.cuda.get_device_name(dev)}
        _C._norm_forget_tuned()
        for direction in directions:
            if direction == "fwd":

                def run():
                    with torch.no_grad():
                        forward()
            else:
                y = forward()

                def run(y=y):
                    torch.autograd.grad(y, params, grad, retain_graph=True)

            picked = plan_of(direction)
            timed = []
            for c in _candidates(direction, picked, lambda d=direction: plan_of(d)):
                with norm_override(direction, c["design"], **c["knobs"]):
                    timed.append({**c, "ms": _device_ms(run, reps, flush)})
            default_ms = _device_ms(run, reps, flush)
            best = min(timed, key=lambda t: t["ms"])
            extra = _MODE_BITS[mode] if direction == "fwd" else (1 | (2 if bias else 0) | (4 if residual else 0))
            stored = _C._norm_store_tuned(
                direction,
                op,
                rows,
                n,
                dtype_name(dtype),
                dtype_name(wdtype),
                True,
                bias,
                zero_centered_gamma,
                residual,
                True,
                extra,
                best["design"],
                best["knobs"],
                dev.index,
                persist,
            )
            report[direction] = {
                "picked": {"design": picked["design"], "knobs": picked["knobs"], "ms": default_ms},
                "best": best,
                "speedup": default_ms / best["ms"],
                "stored_on_disk": bool(stored),
                "candidates": timed,
            }
    tuned_table.seed(refresh=True)  # the shipped choices forgotten above, where this tuning set none
    return report


def maybe_autotune(op: str, input: torch.Tensor, weight, bias, residual, mode, zero_centered_gamma) -> None:
    """RTCNORM_AUTOTUNE=1: tune a CUDA problem the first time it is met (outside tracing and capture)."""
    if weight is None or input.device.type != "cuda" or input.dim() < 1 or torch.compiler.is_compiling():
        return
    if torch.cuda.is_current_stream_capturing():
        return
    key = (
        op,
        tuple(input.shape),
        input.dtype,
        None if weight is None else weight.dtype,
        bias is not None,
        residual is not None,
        mode,
        bool(zero_centered_gamma),
        input.device,
    )
    if key in _autotuned:
        return
    _autotuned.add(key)
    tune(
        op,
        (input.numel() // input.shape[-1], input.shape[-1]),
        input.dtype,
        weight_dtype=None if weight is None else weight.dtype,
        bias=bias is not None,
        zero_centered_gamma=zero_centered_gamma,
        residual=residual is not None,
        mode=mode,
        device=input.device,
    )
