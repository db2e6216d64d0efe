"""The cost model's pick against the measured best, on every standard and random norm shape.

For each op (rms_norm, layer_norm), shape of bench_shapes.json's "norm" sets
(standard: bandwidth, narrow_rows, model, latency; and random) and dtype, this
runs ``rtcnorm.tune`` (persist=False) and keeps, per direction, the default
pick and the tuned pick with their device times. tune() picks the winner;
then the default and the winner are timed again in the same process on the
same GPU, alternating ``--confirm-rounds`` times (the fastest of some fifteen
noisy candidates is biased low), with tune()'s own timing: CUDA events after
a GPU spin that lets the host queue every call, L2 flushed before each call,
median of ``--reps``. tune()'s own two times are kept too (``tune_us``).

NVRTC dominates: tune() times about 9 forward and 7 backward candidates a
problem, 1,487 over the 94 bf16 problems, in 1,256 distinct kernels of about
0.2 s of NVRTC each. rtcnorm compiles a kernel when a launch first needs it,
and jit.precompile covers the planner's picks for fixed row counts, not
tuning's runners-up for these shapes; so the compile phase runs tune() with
one repetition in ``--compile-workers`` processes on the same GPU: every
candidate kernel reaches the disk cache (RTCNORM_CACHE_DIR, shared by the
processes, locked per entry), and the timing phase loads them from there.

Each shard appends one JSON line per (problem, direction) to
``<out>.shard<i>of<n>.jsonl`` as soon as it is measured, so a killed run keeps
its rows; a rerun skips the problems already there. ``--budget-s`` stops
cleanly before a problem that would not fit. One shard a GPU (the timing
phase must have its GPU alone); run_tune_table_gpu.sh runs the compile phase
of every shard, then the timing phase, then the report. By hand, on 2 GPUs:

    CUDA_VISIBLE_DEVICES=0 python benchmarks/tune_table.py --shard 0/2 --budget-s 540 &
    CUDA_VISIBLE_DEVICES=1 python benchmarks/tune_table.py --shard 1/2 --budget-s 540 &
    wait; python benchmarks/tune_table.py --report

``--report`` merges the shards into benchmarks/results/default_vs_tuned_<gpu>.md
and .json (tune_table_report.py); ``--export-package`` also writes the tuned
choices to python/rtcnorm/data/tuned_<gpu>.json (see rtcnorm.tuned_table).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

from tune_problems import DIRECTIONS, SETS, SHAPES_PATH, problems  # noqa: F401 (re-exported)

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(BENCH_DIR, "results", "tune_table")
OPS = ("rms_norm", "layer_norm")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
COMPILE_SHARE = 0.6  # of --budget-s at most for the compile phase; the rest compiles inline


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` with 0 <= i < n, else an ArgumentTypeError naming --shard."""
    try:
        i, n = (int(p) for p in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard must look like i/n (e.g. 0/2), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard i/n needs n >= 1 and 0 <= i < n, got {text!r}")
    return i, n


def parse_budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget-s must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--budget-s must be positive, got {text!r}")
    return value


def parse_list(allowed):
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(allowed)}, got {text!r}")
        return list(dict.fromkeys(items))

    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="shard files are <out>.shard<i>of<n>.jsonl")
    ap.add_argument("--shard", type=parse_shard, default=(0, 1), help="i/n: run every n-th problem from the i-th")
    ap.add_argument("--budget-s", type=parse_budget, default=None, help="stop cleanly before this many seconds")
    ap.add_argument("--dtypes", type=parse_list(tuple(DTYPES)), default=["bf16"])
    ap.add_argument("--ops", type=parse_list(OPS), default=list(OPS))
    ap.add_argument("--sets", type=parse_list(tuple(SETS)), default=list(SETS))
    ap.add_argument("--reps", type=int, default=10, help="timed calls per candidate (median)")
    ap.add_argument("--confirm-rounds", type=int, default=3, help="default and tuned timed again, alternating")
    ap.add_argument("--compile-workers", type=int, default=None, help="compile-phase processes (0: none)")
    ap.add_argument("--phase", choices=("all", "compile", "time"), default="all")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--report", action="store_true", help="merge the shard files and write the tables")
    ap.add_argument("--results-dir", default=os.path.join(BENCH_DIR, "results"))
    ap.add_argument("--export-package", action="store_true", help="with --report: write the shipped table")
    ap.add_argument("--package-dir", default=None, help="where --export-package writes (default: the package's data)")
    ap.add_argument("--export-min-ratio", type=float, default=1.02, help="ship cells whose default/tuned reaches this")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def shard_of(items: list, shard: tuple[int, int]) -> list:
    i, n = shard
    return items[i::n]


def problem_key(p: dict) -> tuple:
    return (p["op"], p["dtype"], p["rows"], p["n"])


def shard_path(out: str, shard: tuple[int, int]) -> str:
    return f"{out}.shard{shard[0]}of{shard[1]}.jsonl"


def done_problems(path: str) -> set:
    """Problems whose two directions are in `path` already (a truncated last line is ignored)."""
    seen: dict = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "error" not in r:  # a failed problem runs again
                    seen.setdefault(problem_key(r), set()).add(r.get("direction"))
    return {k for k, dirs in seen.items() if set(DIRECTIONS) <= dirs}


class Budget:
    """Seconds left before a deadline; `fits()` refuses a step longer than the longest seen."""

    def __init__(self, seconds: float | None, clock=None):
        self.clock = clock or time.monotonic
        self.start = self.clock()
        self.deadline = None if seconds is None else self.start + seconds
        self.longest = 0.0

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - self.clock()

    def fits(self) -> bool:
        return self.left() > self.longest * 1.2

    def took(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)


def _torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name])


def _worker_init() -> None:
    os.environ["RTCNORM_TUNED_TABLE"] = "0"


def _warm(task) -> str | None:
    """Compile-phase worker: tune() once with one repetition, so that every candidate kernel reaches the disk cache."""
    p, device = task
    try:
        import rtcnorm

        rtcnorm.tune(p["op"], (p["rows"], p["n"]), _torch_dtype(p["dtype"]), device=device, reps=1, persist=False)
        return None
    except Exception as e:  # reported by the parent; the timing phase compiles what is left
        return f"{p['op']} {p['rows']}x{p['n']} {p['dtype']}: {type(e).__name__}: {e}"


def compile_phase(todo: list[dict], args, budget: Budget, bar) -> None:
    workers = args.compile_workers
    if workers is None:
        workers = max(1, min(8, (os.cpu_count() or 2) // (2 * args.shard[1])))
    if workers < 1 or not todo:
        return
    share = budget.left() * (COMPILE_SHARE if args.phase == "all" else 1.0)
    deadline = None if share == float("inf") else time.monotonic() + share
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, initializer=_worker_init) as pool:
        results = pool.imap_unordered(_warm, [(p, args.device) for p in todo])
        for _ in todo:
            try:
                err = results.next(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except mp.TimeoutError:
                print("compile phase: out of its budget share; the rest compiles while timing", file=sys.stderr)
                pool.terminate()
                break
            if err:
                print("compile phase:", err, file=sys.stderr)
            bar.update(1)


def measure(p: dict, args, meta: dict) -> list[dict]:
    """One problem's records, one a direction: tune() picks the winner, then
    confirm() times the default and the winner again, interleaved."""
    import rtcnorm
    from rtcnorm import _C

    dtype = _torch_dtype(p["dtype"])
    _C._norm_forget_tuned()
    e = rtcnorm.explain(p["op"], (p["rows"], p["n"]), dtype, device=args.device)
    if e["tuned"] or e["backward"]["tuned"]:
        raise RuntimeError("the disk cache holds a tuned choice for this problem; use a fresh RTCNORM_CACHE_DIR")
    r = rtcnorm.tune(p["op"], (p["rows"], p["n"]), dtype, device=args.device, reps=args.reps, persist=False)
    _C._norm_forget_tuned()
    picks = {d: (_choice(r[d]["picked"]), _choice(r[d]["best"])) for d in DIRECTIONS}
    again = confirm(p, picks, args.device, args.reps, args.confirm_rounds) if args.confirm_rounds > 0 else {}
    out = []
    for d in DIRECTIONS:
        t = r[d]
        default_us, tuned_us = t["picked"]["ms"] * 1e3, t["best"]["ms"] * 1e3
        us = again.get(d, {"default": default_us, "tuned": tuned_us})
        out.append(
            {
                **p,
                **meta,
                "direction": d,
                "default": {**picks[d][0], "us": us["default"]},
                "tuned": {**picks[d][1], "us": us["tuned"]},
                "ratio": us["default"] / us["tuned"],
                "tune_us": {"default": default_us, "tuned": tuned_us},
                "candidates": [[c["design"], c["knobs"], c["ms"] * 1e3] for c in t["candidates"]],
            }
        )
    return out


def confirm(p: dict, picks: dict, device: str, reps: int, rounds: int) -> dict:
    """The default and tuned picks of each direction timed again, alternating,
    `rounds` times each (tune()'s timing, each forced as tune() forces its
    candidates); µs medians. The fastest of some fifteen noisy candidates is
    biased low; this pair is not. Identical picks are timed once: ratio 1."""
    import torch
    from rtcnorm._tuning import norm_override
    from rtcnorm.tuning import _FLUSH_BYTES, _device_ms

    dev, dtype = torch.device(device), _torch_dtype(p["dtype"])
    rows, n, ln = p["rows"], p["n"], p["op"] == "layer_norm"
    ops, out = torch.ops.rtcnorm, {}
    with torch.cuda.device(dev):
        x = torch.randn(rows, n, device=dev, dtype=dtype, requires_grad=True)
        w = torch.randn(n, device=dev, dtype=dtype, requires_grad=True)
        b = torch.randn(n, device=dev, dtype=dtype, requires_grad=True) if ln else None
        grad = torch.randn(rows, n, device=dev, dtype=dtype)
        flush = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
        params = tuple(t for t in (x, w, b) if t is not None)

        def forward():  # as tune() calls the ops: weight, bias for layer_norm, auto mode
            if ln:
                return ops.layer_norm(x, (n,), w, b, 1e-5, None, False)[0]
            return ops.rms_norm(x, (n,), w, 1e-6, None, False)[0]

        def fwd():
            with torch.no_grad():
                forward()

        for d, (default, tuned) in picks.items():
            y = forward() if d == "bwd" else None

            def run(y=y):
                if y is None:
                    fwd()
                else:
                    torch.autograd.grad(y, params, grad, retain_graph=True)

            same = default == tuned
            times: dict = {"default": [], "tuned": []}
            for _ in range(rounds):
                for which, c in (("default", default), ("tuned", tuned)):
                    if same and which == "tuned":
                        continue
                    with norm_override(d, c["design"], **c["knobs"]):
                        times[which].append(_device_ms(run, reps, flush))
            us = {k: statistics.median(v) * 1e3 for k, v in times.items() if v}
            out[d] = {"default": us["default"], "tuned": us["default"] if same else us["tuned"]}
    return out


def _choice(c: dict) -> dict:
    return {"design": c["design"], "knobs": dict(c["knobs"])}


def device_meta(device: str) -> dict:
    import rtcnorm
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "arch": f"sm_{props.major}{props.minor}",
        "rtcnorm": rtcnorm.__version__,
        "torch": torch.__version__,
    }


def run(args) -> int:
    from tqdm import tqdm

    os.environ["RTCNORM_TUNED_TABLE"] = "0"  # the default must be the cost model's own pick
    budget = Budget(args.budget_s)
    path = shard_path(args.out, args.shard)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    done = done_problems(path)
    todo = [p for p in shard_of(problems(args.dtypes, args.ops, args.sets), args.shard) if problem_key(p) not in done]
    print(f"shard {args.shard[0]}/{args.shard[1]}: {len(todo)} problems to run, {len(done)} already in {path}")
    if args.phase in ("all", "compile"):
        with tqdm(total=len(todo), desc="compile", unit="problem", disable=args.no_progress) as bar:
            compile_phase(todo, args, budget, bar)
    if args.phase == "compile":
        return 0
    meta = {**device_meta(args.device), "reps": args.reps, "shard": f"{args.shard[0]}/{args.shard[1]}"}
    stopped = 0
    with open(path, "a") as f, tqdm(todo, desc="tune", unit="problem", disable=args.no_progress) as bar:
        for i, p in enumerate(bar):
            if not budget.fits():
                stopped = len(todo) - i
                break
            bar.set_postfix_str(f"{p['op']} {p['rows']}x{p['n']} {p['dtype']}")
            t0 = time.monotonic()
            try:
                records = measure(p, args, meta)
            except Exception as e:
                records = [{**p, **meta, "direction": d, "error": f"{type(e).__name__}: {e}"} for d in DIRECTIONS]
                print(f"{p['op']} {p['rows']}x{p['n']} {p['dtype']}: {records[0]['error']}", file=sys.stderr)
            budget.took(time.monotonic() - t0)
            for r in records:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())
    if stopped:
        print(f"budget: stopped with {stopped} problems left; rerun the same command to continue")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.report:
        from tune_table_report import report

        return report(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
