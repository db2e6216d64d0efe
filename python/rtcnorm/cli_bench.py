"""``rtcnorm bench``: effective GB/s of rtcnorm and torch for a few shapes (GPU only).

Bytes counted: forward reads x and writes y; backward reads x and dy and
writes dx (parameters and statistics are ignored: they are one row).
Times are medians from ``triton.testing.do_bench`` when triton imports, else
from CUDA events over repeated calls after a warm-up.
"""

from __future__ import annotations

import statistics

import torch

from . import functional as rf


def _timer():
    try:
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")
    except Exception:
        return _events_ms


def _events_ms(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _fns(op: str, x, w, b):
    n = x.shape[-1]
    if op == "rms_norm":
        return (
            lambda t: rf.rms_norm(t, [n], w, 1e-6),
            lambda t: torch.nn.functional.rms_norm(t, [n], w, 1e-6),
        )
    return (
        lambda t: rf.layer_norm(t, [n], w, b, 1e-5),
        lambda t: torch.nn.functional.layer_norm(t, [n], w, b, 1e-5),
    )


def run(shapes: list[tuple[int, int]], ops: list[str], dtype: torch.dtype) -> list[dict]:
    """One row per (op, shape): GB/s forward and backward for rtcnorm and torch."""
    time_ms = _timer()
    rows = []
    for op in ops:
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
            b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
            dy = torch.randn_like(x)
            nbytes = x.numel() * x.element_size()
            row = {"op": op, "shape": f"{m}x{n}"}
            for name, fn in zip(("rtcnorm", "torch"), _fns(op, x, w, b)):
                with torch.no_grad():
                    fwd = time_ms(lambda fn=fn, x=x: fn(x))
                y = fn(x)
                params = [x, w] if op == "rms_norm" else [x, w, b]
                bwd = time_ms(lambda y=y, p=params, dy=dy: torch.autograd.grad(y, p, dy, retain_graph=True))
                row[f"{name}_fwd"] = 2 * nbytes / fwd / 1e6
                row[f"{name}_bwd"] = 3 * nbytes / bwd / 1e6
            rows.append(row)
    return rows


def table(rows: list[dict], device: str) -> str:
    head = f"{'op':<11} {'shape':>12} {'fwd rtcnorm':>12} {'fwd torch':>10} {'bwd rtcnorm':>12} {'bwd torch':>10}"
    lines = [f"GB/s on {device}", head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['op']:<11} {r['shape']:>12} {r['rtcnorm_fwd']:>12.0f} {r['torch_fwd']:>10.0f} "
            f"{r['rtcnorm_bwd']:>12.0f} {r['torch_bwd']:>10.0f}"
        )
    return "\n".join(lines)
