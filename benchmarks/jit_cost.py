"""What the run-time compilation costs: cold compile, warm load from disk, host overhead.

Each measurement runs in fresh subprocesses sharing a temporary RTCNORM_CACHE_DIR:
- cold: an empty cache, so the first call compiles with NVRTC. `compile_ms` and
  `kernels` come from rtcnorm.jit.stats() (the first call does forward and backward,
  so it compiles the forward, backward and dW-reduce kernels);
- warm: the populated cache, so the first call loads cubins from disk;
  `warm_load_ms` is stats' disk_load_ms + module_load_ms;
- host overhead: in the warm process, `calls` back-to-back no-grad forward calls of a
  small (rows x hidden) input, CUDA synchronized only at the end: wall-clock per call,
  next to torch eager doing the same. The GPU time of such a call is a few µs, so this
  is the launch path's cost.

Without a GPU (smoke runs) the cold and warm steps call rtcnorm.jit.precompile for
`arch` instead of a first call, and host overhead is that of the CPU path.

    python benchmarks/jit_cost.py --op rms_norm --hidden 128,4096,8192 --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Table, reason  # noqa: E402

PROBE = r"""
import json, sys, time
import torch
import torch.nn.functional as F
import rtcnorm

a = json.loads(sys.argv[1])
dev, dt = torch.device(a["device"]), getattr(torch, a["dtype"])
m, n, op, mode = a["rows"], a["hidden"], a["op"], a["mode"]
cuda = dev.type == "cuda"


def sync():
    if cuda:
        torch.cuda.synchronize()


def rtc(t, w, b):
    if op == "rms_norm":
        return rtcnorm.rms_norm(t, (n,), w, 1e-6, mode=mode)
    return rtcnorm.layer_norm(t, (n,), w, b, 1e-5, mode=mode)


def ref(t, w, b):
    if op == "rms_norm":
        return F.rms_norm(t, (n,), w, 1e-6)
    return F.layer_norm(t, (n,), w, b, 1e-5)


x = torch.randn(m, n, device=dev, dtype=dt)
w = torch.randn(n, device=dev, dtype=dt)
b = torch.randn(n, device=dev, dtype=dt)
dy = torch.randn_like(x)
sync()
rtcnorm.jit.reset_stats()
t0 = time.perf_counter()
if cuda:
    leaves = [t.detach().requires_grad_(True) for t in (x, w, b)]
    y = rtc(*leaves)
    y.backward(dy)
    sync()
else:
    lines = rtcnorm.jit.precompile(op, hidden_sizes=[n], dtypes=[dt], modes=[mode], archs=[a["arch"]])
out = {"first_ms": (time.perf_counter() - t0) * 1e3, "stats": rtcnorm.jit.stats(), "host_us": {}}
with torch.no_grad():
    for name, fn in (("rtcnorm", rtc), ("torch", ref)):
        for _ in range(20):
            fn(x, w, b)
        sync()
        t0 = time.perf_counter()
        for _ in range(a["calls"]):
            fn(x, w, b)
        sync()
        out["host_us"][name] = (time.perf_counter() - t0) * 1e6 / a["calls"]
print("RTCNORM_JIT " + json.dumps(out))
"""


def _env(cache_dir: str) -> dict:
    env = dict(os.environ, RTCNORM_CACHE_DIR=cache_dir)
    env.pop("RTCNORM_DISABLE_DISK_CACHE", None)
    mod = sys.modules.get("rtcnorm")
    if mod is not None and getattr(mod, "__file__", None):
        root = os.path.dirname(os.path.dirname(os.path.abspath(mod.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _probe(args: dict, env: dict, timeout: float) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], env=env, capture_output=True, text=True, timeout=timeout
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RTCNORM_JIT "):
            return json.loads(line[len("RTCNORM_JIT ") :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"probe exited {proc.returncode}: {tail[:200]}")


def jit_cost(
    op: str = "rms_norm",
    hidden: int = 4096,
    *,
    rows: int = 32,
    dtype: str = "bfloat16",
    mode: str | None = None,
    device: str | None = None,
    arch: str = "sm_90",
    calls: int = 2000,
    timeout: float = 300.0,
) -> dict:
    """One row of JIT cost for (op, hidden, dtype, mode); 'error' says what failed."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    args = {"op": op, "hidden": int(hidden), "rows": int(rows), "dtype": dtype, "mode": mode}
    args.update(device=device, arch=arch, calls=int(calls))
    row = {"op": op, "hidden": int(hidden), "dtype": dtype, "mode": mode or "heuristic"}
    try:
        with tempfile.TemporaryDirectory(prefix="rtcnorm-jit-") as tmp:
            env = _env(tmp)
            cold = _probe(args, env, timeout)
            warm = _probe(args, env, timeout)
    except Exception as e:
        return {**row, "error": reason(e)}
    cs, ws = cold["stats"], warm["stats"]
    kernels = int(cs.get("compiles", 0))
    row.update(
        kernels=kernels,
        cold_compile_ms=cs.get("compile_ms"),
        ms_per_kernel=cs.get("compile_ms", 0.0) / kernels if kernels else None,
        cold_first_call_ms=cold["first_ms"],
        warm_load_ms=ws.get("disk_load_ms", 0.0) + ws.get("module_load_ms", 0.0),
        warm_first_call_ms=warm["first_ms"],
        warm_compiles=ws.get("compiles"),
        rtcnorm_host_us=warm["host_us"].get("rtcnorm"),
        torch_host_us=warm["host_us"].get("torch"),
    )
    return row


JIT_COLUMNS = (
    "op hidden dtype mode kernels cold_compile_ms ms_per_kernel cold_first_call_ms warm_load_ms "
    "warm_first_call_ms warm_compiles rtcnorm_host_us torch_host_us"
).split()


def jit_table(op: str, hiddens, dtype: str = "bfloat16", *, mode: str | None = None, **kwargs) -> Table:
    """JIT cost rows for several hidden sizes (each: two fresh subprocesses)."""
    dev = kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = kwargs.get("rows", 32)
    title = f"JIT cost on {dev}: cold NVRTC compile, warm disk load, host µs/call at {rows} rows (no grad)"
    table = Table(title, JIT_COLUMNS)
    for n in hiddens:
        table.add(jit_cost(op, n, dtype=dtype, mode=mode, **kwargs))
    return table


def main(argv=None) -> None:
    names = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="rms_norm", choices=("rms_norm", "layer_norm"))
    p.add_argument("--hidden", default="4096", help="comma list of row lengths")
    p.add_argument("--dtype", default="bf16", choices=sorted(names))
    p.add_argument("--mode", default=None, help="forward mode; default: the heuristic")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--out", default=None, help="results/<out>.csv/.json (default jit_<op>)")
    a = p.parse_args(argv)
    hiddens = [int(h) for h in a.hidden.replace(",", " ").split()]
    kw = {"rows": a.rows, "calls": a.calls, "device": a.device}
    table = jit_table(a.op, hiddens, names[a.dtype], mode=a.mode, **kw)
    table.save(a.out or f"jit_{a.op}")
    table.print()


if __name__ == "__main__":
    main()
