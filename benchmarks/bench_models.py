"""One training step of Hugging Face decoder models with each norm implementation.

    python benchmarks/bench_models.py --family qwen3 --out-dir OUT/parts --profile   # one GPU
    python benchmarks/bench_models.py --merge OUT/parts --out OUT/models             # table + plot
    python benchmarks/bench_models.py --smoke --family gpt2 --out-dir /tmp/m         # CPU smoke test
    benchmarks/run_models_gpu.sh OUT        # four families on four GPUs at once, then the merge

Models are built from transformers' config classes with random weights (nothing
is downloaded): Qwen3, Llama, Gemma3 (text) and GPT-2, hidden 2048, 4 layers,
16 heads of 128 (8 KV heads), MLP 8192, vocabulary 32000, sequence 2048, batch 4,
bf16, SDPA attention, no KV cache (``--smoke``: hidden 64, 1 layer, sequence 16).
A step is forward with the LM loss, backward and an AdamW step. Implementations:

- ``torch``: the model as transformers builds it;
- ``rtcnorm``: after ``rtcnorm.patch(model)`` (the row keeps its summary);
- ``liger``: after Liger's ``apply_liger_kernel_to_<family>(model=..., rms_norm=True)``
  with every other switch off; GPT-2, which Liger has no patch for, gets its
  ``nn.LayerNorm`` swapped for ``LigerLayerNorm`` by hand. Skipped, with the
  reason, where Liger is missing.

Each runs eager, and with ``torch.compile`` on every decoder layer (one shared
graph; embeddings, LM head and loss stay eager). Step time is the median of
``--steps`` steps after ``--warmup`` (the first compiles rtcnorm's kernels, Triton's
and torch.compile's graphs; its seconds are kept as ``first_step_s``), timed with
CUDA events; ``host_ms`` is how long the host took to queue a step. Peak memory is
``max_memory_allocated`` over the timed steps.

Budget: each family gets ``--budget`` seconds. Variants run eager first, then
compiled, in worker processes (a fresh one after Liger, which patches
transformers' classes for the whole process). Each variant gets a share of the
time left; one that overruns it is killed and recorded as skipped with the
reason, one that fails records its error, and the rest go on. ``<family>.json``
is rewritten after every variant, so a killed run still leaves its rows.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models_step import FAMILIES, FULL, IMPLS, MODES, SMOKE  # noqa: E402

# Share of the time left that a variant may use, by mode, and the least time
# worth starting one with (seconds; a cold torch.compile of one layer takes tens).
WEIGHT = dict(eager=1.0, compile=3.0)
FLOOR = dict(eager=60.0, compile=90.0)
STARTUP_S = 60.0  # a worker must import torch and transformers within this
MIN_START_S = 30.0  # a variant is not started with less time than this left


def write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


# -- worker: runs the variants its parent sends on stdin, one JSON row per line on stdout --


def worker(a) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # library prints go to the log, not into the protocol
    sys.stdout = sys.stderr
    import transformers
    from models_step import Skip, release_memory, run_variant

    transformers.logging.set_verbosity_error()
    s = SMOKE if a.smoke else FULL
    proto.write("READY\n")
    for line in sys.stdin:
        job = json.loads(line)
        row = dict(family=a.worker, impl=job["impl"], mode=job["mode"])
        o = SimpleNamespace(**vars(a), deadline=time.perf_counter() + job["cap_s"] - 10)
        try:
            fields, text = run_variant(a.worker, job["impl"], job["mode"], s, o)
            row.update(fields, status="ok")
            if text is not None:
                name = f"profile_{a.worker}_{job['impl']}_{job['mode']}.txt"
                with open(os.path.join(a.out_dir, name), "w") as f:
                    f.write(text)
                row["profile_file"] = name
        except Skip as e:
            row.update(status="skipped", reason=str(e))
        except Exception as e:  # a failed variant is a table cell, not the end of the run
            row.update(status="failed", reason=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
            traceback.print_exc()
        release_memory()
        proto.write("ROW " + json.dumps(row) + "\n")


# -- family runner: starts workers, gives each variant its time, keeps the JSON current --


class Worker:
    def __init__(self, family: str, a):
        self.proc = subprocess.Popen(
            self.argv(family, a), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        LIVE.add(self)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = False

    @staticmethod
    def argv(family: str, a) -> list[str]:
        argv = [sys.executable, os.path.abspath(__file__), "--worker", family, "--out-dir", a.out_dir]
        argv += ["--device", a.device, "--dtype", a.dtype, "--backend", a.backend]
        argv += ["--warmup", str(a.warmup), "--steps", str(a.steps)]
        return argv + ["--smoke"] * a.smoke + ["--profile"] * a.profile

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix: str, until: float):
        """The next protocol line starting with ``prefix``; None at EOF, TimeoutError past ``until``."""
        while True:
            try:
                line = self.lines.get(timeout=max(until - time.monotonic(), 0.01))
            except queue.Empty:
                raise TimeoutError from None
            if line is None or line.startswith(prefix):
                return line

    def run(self, impl: str, mode: str, cap: float) -> dict:
        until = time.monotonic() + cap
        if not self.ready:
            self.ready = self.expect("READY", min(until, time.monotonic() + STARTUP_S)) is not None
            if not self.ready:
                raise EOFError("worker exited while starting")
        try:
            self.proc.stdin.write(json.dumps(dict(impl=impl, mode=mode, cap_s=until - time.monotonic())) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EOFError(f"worker exited with {self.proc.wait()}") from None
        line = self.expect("ROW ", until)
        if line is None:
            raise EOFError(f"worker exited with {self.proc.wait()}")
        return json.loads(line[4:])

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # with torch.compile's worker pool
        except ProcessLookupError:
            pass

    def close(self, kill: bool = False):
        if kill:
            self.kill()
        else:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        LIVE.discard(self)


LIVE: set[Worker] = set()


def _on_term(signum, frame):
    # Workers run in sessions of their own: end them with the runner, so that an
    # outer timeout leaves no process on the GPU.
    for w in list(LIVE):
        w.kill()
    sys.exit(128 + signum)


def variant_cap(left: float, todo: list[tuple[str, str]]) -> float:
    """Seconds for the first of ``todo``: its weighted share of ``left``, at least its floor."""
    mode = todo[0][1]
    share = left * WEIGHT[mode] / sum(WEIGHT[m] for _, m in todo)
    return min(left, max(share, FLOOR[mode]))


def run_family(family: str, a, meta: dict) -> list[dict]:
    path = os.path.join(a.out_dir, f"{family}.json")
    todo = [(impl, mode) for mode in a.modes for impl in a.impls]
    rows: list[dict] = []
    fam_meta = dict(
        meta, family=family, budget_s=a.budget, started=time.strftime("%Y-%m-%dT%H:%M:%S"), variants=todo[:]
    )
    write_json(path, dict(meta=fam_meta, rows=rows))
    start = time.monotonic()
    w = None
    while todo:
        impl, mode = todo[0]
        left = a.budget - (time.monotonic() - start)
        cap = variant_cap(left, todo)
        t0 = time.monotonic()
        fam_meta["running"] = dict(impl=impl, mode=mode, cap_s=round(cap, 1))
        write_json(path, dict(meta=fam_meta, rows=rows))
        if cap < min(FLOOR[mode], MIN_START_S):
            row = dict(
                status="skipped", reason=f"budget: {left:.0f} s of {a.budget:.0f} s left for {len(todo)} variants"
            )
        else:
            w = w or Worker(family, a)
            try:
                row = w.run(impl, mode, cap)
            except TimeoutError:
                w.close(kill=True)
                w = None
                phase = "torch.compile and " if mode == "compile" else ""
                row = dict(status="skipped", reason=f"budget: {phase}steps did not finish within {cap:.0f} s; killed")
            except EOFError as e:
                w.close(kill=True)
                w = None
                row = dict(status="failed", reason=f"worker process died: {e}")
        row = dict(dict(family=family, impl=impl, mode=mode), **row, wall_s=round(time.monotonic() - t0, 1))
        rows.append(row)
        todo.pop(0)
        # Liger may have patched transformers' classes in that process; a failure
        # may have left its CUDA context unusable: the next variant gets a fresh one.
        fresh = row["status"] == "failed" or (impl == "liger" and row["status"] != "skipped")
        if w is not None and fresh and todo:
            w.close()
            w = None
        fam_meta.pop("running")
        fam_meta["wall_s"] = round(time.monotonic() - start, 1)
        write_json(path, dict(meta=fam_meta, rows=rows))
        done = f"{row['step_ms']:.1f} ms a step" if row["status"] == "ok" else row["reason"]
        print(f"{family} {impl} {mode}: {row['status']} in {row['wall_s']:.0f} s, {done}", file=sys.stderr, flush=True)
    if w is not None:
        w.close()
    return rows


def run_meta(a) -> dict:
    import torch
    import transformers

    meta = dict(device=a.device, dtype=a.dtype, backend=a.backend, steps=a.steps, warmup=a.warmup)
    meta.update(torch=torch.__version__, transformers=transformers.__version__, shape=SMOKE if a.smoke else FULL)
    meta["gpu"] = torch.cuda.get_device_name(a.device) if a.device.startswith("cuda") else "CPU"
    try:
        import rtcnorm

        meta["rtcnorm"] = getattr(rtcnorm, "__version__", "?")
    except ImportError as e:
        meta["rtcnorm"] = f"not importable: {e}"
    return meta


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", nargs="+", choices=FAMILIES, default=None, help="families run one after another")
    p.add_argument("--out-dir", default=None, help="folder for <family>.json and the profile files")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--budget", type=float, default=None, help="seconds per family (default 270; --smoke: 300)")
    p.add_argument("--smoke", action="store_true", help="tiny models (hidden 64, 1 layer, sequence 16)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None, help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--backend", default="inductor", help="torch.compile backend of the compile mode")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps, the first included (default 3; --smoke 1)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; --smoke 2)")
    p.add_argument("--profile", action="store_true", help="profile one more step of each variant (torch.profiler)")
    p.add_argument("--merge", default=None, metavar="DIR", help="merge DIR/<family>.json into --out .json/.md/.png")
    p.add_argument("--out", default=None, help="path prefix of the merged results (with --merge)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.smoke else 3)
    a.steps = a.steps if a.steps is not None else (2 if a.smoke else 10)
    a.budget = a.budget if a.budget is not None else (300.0 if a.smoke else 270.0)
    if a.warmup < 1 or a.steps < 1:
        p.error(f"--warmup and --steps must be at least 1, got {a.warmup} and {a.steps}")
    if a.merge:
        if not a.out:
            p.error("--merge needs --out (a path prefix)")
        return a
    if not a.worker and not (a.family and a.out_dir):
        p.error("give --family and --out-dir (or --merge DIR --out PREFIX)")
    if not a.device:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    a.dtype = a.dtype or ("bf16" if a.device.startswith("cuda") else "fp32")
    return a


def main(argv=None) -> None:
    a = parse_args(argv)
    if a.merge:
        import models_report

        print(models_report.merge(a.merge, a.out))
        return
    if a.worker:
        worker(a)
        return
    os.makedirs(a.out_dir, exist_ok=True)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    meta = run_meta(a)
    for family in a.family:
        run_family(family, a, meta)


if __name__ == "__main__":
    main()
