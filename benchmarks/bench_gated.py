"""Gated RMSNorm benchmark: rtcnorm.rms_norm_gated against torch.compile of the reference.

For each (M, N), group size (None: the whole row; 1024) and gate order, the
forward and the backward (torch.autograd.grad of y for x, z and weight) are
timed side by side in one run with the shared harness: the per-call median
with L2 flushed (``bench``) and the device time from torch.profiler
(``profiler_kernel_ms``), each against a device-to-device copy of the same
bytes measured in this run.

Bytes counted (the fewest the op must move, E = the input's element size):
- forward:  x + z + y (3 M N E) + weight;
- backward: x + z + dy + dx + dz (5 M N E) + rstd + weight + dW.

    python benchmarks/bench_gated.py [--dtype bf16] [--out gated_h200] [--dry-run]

``--out NAME`` writes benchmarks/results/NAME.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import rtcnorm  # noqa: E402

SHAPES = [(4096, 4096), (16384, 8192), (8192, 2048)]
SMOKE_SHAPES = [(64, 2048)]
GROUPS = (None, 1024)
ORDERS = (True, False)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = 1e-6


def reference(x, z, w, norm_before_gate: bool, group_size: int | None):
    """The gated RMSNorm in fp32 math, y in x's dtype (what torch.compile fuses)."""
    n = x.shape[-1]
    g = group_size or n
    xf, act = x.float(), F.silu(z.float())
    h = (xf if norm_before_gate else xf * act).unflatten(-1, (n // g, g))
    y = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).flatten(-2) * w.float()
    return (y * act if norm_before_gate else y).to(x.dtype)


def impls(order, group):
    # A fresh dynamo state per case: every case recompiles `reference`, and
    # past torch._dynamo.config.recompile_limit it would silently run eager.
    torch._dynamo.reset()
    compiled = torch.compile(reference, dynamic=False)
    return {
        "rtcnorm": lambda x, z, w: rtcnorm.rms_norm_gated(x, z, w, EPS, norm_before_gate=order, group_size=group),
        "compile": lambda x, z, w: compiled(x, z, w, order, group),
    }


def nbytes(phase, m, n, g, dtype):
    e = torch.empty((), dtype=dtype).element_size()
    if phase == "fwd":
        return 3 * m * n * e + n * e
    return 5 * m * n * e + 4 * m * (n // (g or n)) + 2 * n * e


def measure(m, n, group, order, dtype, prof_iters):
    dev = H.device()
    x = torch.randn(m, n, device=dev, dtype=dtype, requires_grad=True)
    z = torch.randn(m, n, device=dev, dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n, device=dev)).to(dtype).requires_grad_()
    dy = torch.randn(m, n, device=dev, dtype=dtype)
    rows, outs = [], {}
    for name, fn in impls(order, group).items():
        with torch.no_grad():
            outs[name] = fn(x, z, w)
        y = fn(x, z, w)
        for phase in ("fwd", "bwd"):
            if phase == "fwd":

                def call(fn=fn):
                    with torch.no_grad():
                        return fn(x, z, w)

            else:

                def call(y=y):
                    return torch.autograd.grad(y, (x, z, w), dy, retain_graph=True)

            b = nbytes(phase, m, n, group, dtype)
            ms = H.bench(call, grad=phase == "bwd")
            kms = H.profiler_kernel_ms(call, iters=prof_iters)
            rows.append(
                {
                    "shape": f"{m}x{n}",
                    "group": group or n,
                    "norm_before_gate": order,
                    "phase": phase,
                    "impl": name,
                    "ms": ms,
                    "GB/s": H.gbps(b, ms),
                    "% copy": 100 * H.gbps(b, ms) / H.copy_gbps(b),
                    "kernel us": 1e3 * kms,
                    "kernel % copy": 100 * H.gbps(b, kms) / H.copy_kernel_gbps(b),
                }
            )
    err = (outs["rtcnorm"].float() - outs["compile"].float()).abs().max().item()
    return rows, err


def markdown(rows, errs, env) -> str:
    lines = [
        f"# Gated RMSNorm, {env.get('gpu', env['device'])} ({env['date']})",
        "",
        "rtcnorm.rms_norm_gated against torch.compile of the fp32 reference; medians with L2 flushed.",
        "Call time: per call (host included); kernel: torch.profiler device time. % copy: against a",
        "device-to-device copy of the same bytes in this run. speedup: compile's time over rtcnorm's.",
        "",
        "| shape | G | norm first | phase | rtcnorm us | GB/s | % copy | kernel % copy | compile us | "
        "compile % copy | speedup (call) | speedup (kernel) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    key = lambda r: (r["shape"], r["group"], r["norm_before_gate"], r["phase"])  # noqa: E731
    by = {}
    for r in rows:
        by.setdefault(key(r), {})[r["impl"]] = r
    for k, d in by.items():
        a, c = d["rtcnorm"], d["compile"]
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {1e3 * a['ms']:.1f} | {a['GB/s']:.0f} | {a['% copy']:.1f} | "
            f"{a['kernel % copy']:.1f} | {1e3 * c['ms']:.1f} | {c['% copy']:.1f} | {c['ms'] / a['ms']:.2f} | "
            f"{c['kernel us'] / a['kernel us']:.2f} |"
        )
    lines += ["", "Largest |rtcnorm - compile| of y per case: " + ", ".join(f"{k} {v:.3g}" for k, v in errs.items())]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--dry-run", action="store_true", help="CPU smoke run: one small shape, wall-clock timer")
    p.add_argument("--out", default=None, help="write benchmarks/results/<OUT>.md and .json")
    a = p.parse_args(argv)
    H.configure(device="cpu" if a.dry_run else None, warmup=1 if a.dry_run else 10, rep=5 if a.dry_run else 40)
    torch.manual_seed(0)
    dtype = DTYPES[a.dtype]
    shapes = SMOKE_SHAPES if a.dry_run else SHAPES
    cases = [(s, g, o) for s in shapes for g in GROUPS for o in ORDERS if g is None or s[1] % g == 0]
    rows, errs = [], {}
    for (m, n), g, o in H.progress(cases, desc="rms_norm_gated", label=lambda c: f"{c[0]} G={c[1]} first={c[2]}"):
        r, err = measure(m, n, g, o, dtype, 3 if a.dry_run else 20)
        rows += r
        errs[f"{m}x{n}/G{g or n}/{'first' if o else 'gate'}"] = err
    env = H.environment()
    text = markdown(rows, errs, env)
    print(text)
    if a.out:
        os.makedirs(H.RESULTS_DIR, exist_ok=True)
        with open(os.path.join(H.RESULTS_DIR, f"{a.out}.md"), "w") as f:
            f.write(text)
        with open(os.path.join(H.RESULTS_DIR, f"{a.out}.json"), "w") as f:
            json.dump({"environment": env, "rows": rows, "max_abs_diff": errs}, f, indent=1)


if __name__ == "__main__":
    main()
