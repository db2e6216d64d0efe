"""Host cost of one call: rtcnorm's wrappers against the raw op and torch's own.

Two timings per case, forward and forward+backward:
- ``call_us``: ``harness.bench`` (``triton.testing.do_bench``, L2 flushed before
  every call, median): what one call costs, host and device together.
- ``host_us``: a loop of ``--iters`` calls timed on the host, synchronized only
  at its end: the host's time per call wherever the host is slower than the
  kernels (small shapes); otherwise the device's.

Forward calls run under ``torch.no_grad()``; forward+backward calls take the
gradients of every input that requires one with ``torch.autograd.grad`` (no
accumulation into ``.grad``). On CPU (``--device cpu``) only ``host_us`` is
measured, as the minimum of ``--repeats`` loops, on tiny tensors by default.

    python benchmarks/host_cost.py results/host_cost_h100.json
    python benchmarks/host_cost.py /tmp/host_cost_cpu.json --device cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import harness
import rtcnorm
import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RAW_RMS = torch.ops.rtcnorm.rms_norm.default
RAW_LN = torch.ops.rtcnorm.layer_norm.default


def cases(n: int, dtype: torch.dtype, device: str) -> dict:
    """name -> (callable of x, the parameters it differentiates besides x)."""
    w = torch.randn(n, dtype=dtype, device=device).requires_grad_()
    b = torch.randn(n, dtype=dtype, device=device).requires_grad_()
    mods = {
        "rtcnorm.RMSNorm": rtcnorm.RMSNorm(n, device=device, dtype=dtype),
        "nn.RMSNorm": torch.nn.RMSNorm(n, device=device, dtype=dtype),
        "rtcnorm.LayerNorm": rtcnorm.LayerNorm(n, device=device, dtype=dtype),
        "nn.LayerNorm": torch.nn.LayerNorm(n, device=device, dtype=dtype),
    }
    out = {
        "rtcnorm.rms_norm": (lambda x: rtcnorm.rms_norm(x, n, w), (w,)),
        "raw rtcnorm::rms_norm": (lambda x: RAW_RMS(x, (n,), w, None, None, False)[0], (w,)),
        "F.rms_norm": (lambda x: F.rms_norm(x, (n,), w), (w,)),
        "rtcnorm.layer_norm": (lambda x: rtcnorm.layer_norm(x, n, w, b), (w, b)),
        "raw rtcnorm::layer_norm": (lambda x: RAW_LN(x, (n,), w, b, 1e-5, None, False)[0], (w, b)),
        "F.layer_norm": (lambda x: F.layer_norm(x, (n,), w, b), (w, b)),
    }
    for name, m in mods.items():
        out[name] = (m, tuple(m.parameters()))
    return out


def phases(fn, params, x, dy):
    """(forward, forward+backward) callables of one case."""

    def fwd():
        with torch.no_grad():
            return fn(x)

    def fwd_bwd():
        return torch.autograd.grad(fn(x), (x, *params), dy)

    return fwd, fwd_bwd


def host_loop_us(fn, iters: int, repeats: int, cuda: bool) -> float:
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def measure(shape, dtype, device, iters, repeats) -> list[dict]:
    rows_, n = shape
    cuda = device == "cuda"
    x = torch.randn(rows_, n, dtype=dtype, device=device).requires_grad_()
    dy = torch.randn(rows_, n, dtype=dtype, device=device)
    results = []
    for name, (fn, params) in cases(n, dtype, device).items():
        for phase, call in zip(("fwd", "fwd+bwd"), phases(fn, params, x, dy)):
            for _ in range(max(20, iters // 10)):
                call()  # warm-up: kernels compiled and loaded, plans memoized
            row = {"shape": f"{rows_}x{n}", "case": name, "phase": phase}
            row["host_us"] = host_loop_us(call, iters, repeats, cuda)
            row["call_us"] = harness.bench(call, grad=phase != "fwd") * 1e3 if cuda else None
            results.append(row)
    return results


def table(results) -> str:
    lines = [f"{'shape':>10} {'phase':>8} {'case':>24} {'host us':>9} {'call us':>9}"]
    for r in results:
        call = f"{r['call_us']:9.2f}" if r["call_us"] is not None else f"{'-':>9}"
        lines.append(f"{r['shape']:>10} {r['phase']:>8} {r['case']:>24} {r['host_us']:9.2f} {call}")
    return "\n".join(lines)


def parse_shape(text: str) -> tuple[int, int]:
    rows_, n = (int(v) for v in text.lower().split("x"))
    return rows_, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="path of the JSON results")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--shapes", default=None, help="comma-separated RxN; default 4096x1024,32x4096 (CUDA), 2x8 (CPU)")
    ap.add_argument("--iters", type=int, default=2000, help="calls per host-timed loop")
    ap.add_argument("--repeats", type=int, default=5, help="host-timed loops; the fastest counts")
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda needs a GPU")
    harness.configure(device=args.device)
    dtype = DTYPES[args.dtype or ("bf16" if cuda else "fp32")]
    shapes = [parse_shape(s) for s in (args.shapes or ("4096x1024,32x4096" if cuda else "2x8")).split(",")]
    if not cuda:
        torch.set_num_threads(1)
    results = []
    for shape in shapes:
        results += measure(shape, dtype, args.device, args.iters, args.repeats)
    print(table(results))
    doc = {"environment": harness.environment(), "dtype": str(dtype), "iters": args.iters, "results": results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
