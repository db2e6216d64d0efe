"""The GPU test suite in parallel shards on one machine: ``make test-gpu-shards``.

    python3 tests/run_gpu_shards.py [--shards K] [--timeout S] [--logs DIR] [-- PYTEST_ARGS...]

Every shard is one pytest process on the same GPU. Three choices keep the run
short:
- All shards share one kernel cache folder (RTCNORM_CACHE_DIR, a fresh 0700
  temporary folder), so a kernel compiled by one shard is loaded from disk by
  the others; a private cache a shard (conftest.py's default) compiles nearly
  every kernel once per shard.
- Shards compile on demand (RTCNORM_TEST_PRECOMPILE=0): conftest.py's
  session precompile of the whole matrix on every core, run by several
  shards at once, would oversubscribe the CPU once per shard.
- Tests are dealt out by file, in chunks of at most an even share, largest
  chunk first to the least loaded shard: a shard meets few files, so its
  in-process kernel and `torch.compile` caches are reused.

Exit status: 0 when every shard passed (pytest 0), else 1; each shard's log is
kept under --logs (default: a temporary folder, printed).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYTEST_GPU = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu"]
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def collect(extra: list[str]) -> list[str]:
    """Node ids of the GPU tests, in collection order."""
    out = subprocess.run(
        [*PYTEST_GPU, "--collect-only", *extra, "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        sys.exit(f"run_gpu_shards: no GPU test collected:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return ids


def deal(ids: list[str], shards: int) -> list[list[str]]:
    """Ids split by file into chunks of at most an even share, largest first to the least loaded shard."""
    by_file: dict[str, list[str]] = {}
    for i in ids:
        by_file.setdefault(i.split("::", 1)[0], []).append(i)
    share = -(-len(ids) // shards)
    chunks = [f[k : k + share] for f in by_file.values() for k in range(0, len(f), share)]
    out: list[list[str]] = [[] for _ in range(shards)]
    for chunk in sorted(chunks, key=len, reverse=True):
        min(out, key=len).extend(chunk)
    return [s for s in out if s]


def shard_env(cache_dir: str) -> dict[str, str]:
    """The environment of every shard: one shared kernel cache, compiles on demand."""
    return dict(os.environ, RTCNORM_CACHE_DIR=cache_dir, RTCNORM_TEST_PRECOMPILE="0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=min(16, os.cpu_count() or 1), help="pytest processes at once")
    ap.add_argument("--timeout", type=float, default=None, help="seconds before a shard is stopped")
    ap.add_argument("--logs", default=None, help="folder for the shards' logs")
    ap.add_argument("pytest_args", nargs="*", help="passed to every pytest (after --)")
    a = ap.parse_args()
    if a.shards < 1:
        ap.error(f"--shards must be at least 1, got {a.shards}")
    ids = collect(a.pytest_args)
    shards = deal(ids, a.shards)
    logs = pathlib.Path(a.logs or tempfile.mkdtemp(prefix="rtcnorm-gpu-shards-"))
    logs.mkdir(parents=True, exist_ok=True)
    env = shard_env(tempfile.mkdtemp(prefix="rtcnorm-shared-cache-"))
    print(f"{len(ids)} GPU tests in {len(shards)} shards; logs in {logs}", flush=True)
    start = time.monotonic()
    procs = []
    for k, shard in enumerate(shards):
        log = open(logs / f"shard{k:02d}.log", "w")
        cmd = [*PYTEST_GPU, *a.pytest_args, *shard]
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    codes, totals = [], {}
    for k, (p, log) in enumerate(procs):
        left = None if a.timeout is None else max(1.0, a.timeout - (time.monotonic() - start))
        try:
            codes.append(p.wait(timeout=left))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
        log.close()
        last = (logs / f"shard{k:02d}.log").read_text().strip().splitlines()[-1:] or ["(no output)"]
        for n, what in COUNTS.findall(last[0]):
            totals[what] = totals.get(what, 0) + int(n)
        print(f"shard {k:2d}: exit {codes[-1]}: {last[0]}", flush=True)
    print(f"total: {totals} in {time.monotonic() - start:.0f} s")
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
