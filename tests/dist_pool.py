"""A pool of CPU worker processes joined in one gloo process group.

Starting a process and importing torch costs seconds, so one pool serves
every distributed test: ``pool.run("module:function")`` runs that function on
every rank and returns the rank results, or raises with the failing rank's
traceback. Every wait is bounded: a rank that hangs (a collective one rank
never joined) fails the test after ``timeout`` seconds and the pool is torn
down, so later tests fail fast instead of hanging.
"""

from __future__ import annotations

import importlib
import os
import queue
import tempfile
import time
import traceback

import torch.multiprocessing as mp


def _worker(rank: int, world_size: int, init_file: str, tasks, results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # ranks share the machine's cores
    os.environ.setdefault("RTCNORM_TEST_WORKER", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        while True:
            name = tasks.get()
            if name is None:
                break
            module, fn = name.split(":")
            try:
                value = getattr(importlib.import_module(module), fn)()
                results.put((rank, name, True, value))
            except BaseException:
                results.put((rank, name, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class Pool:
    def __init__(self, world_size: int, start_timeout: float = 120.0) -> None:
        self.world_size = world_size
        ctx = mp.get_context("spawn")
        fd, self._init_file = tempfile.mkstemp(prefix="rtcnorm-dist-")
        os.close(fd)
        os.unlink(self._init_file)  # the FileStore creates it
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_worker, args=(r, world_size, self._init_file, self._tasks[r], self._results), daemon=True
            )
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self.broken = None
        self.run("dist_pool:_ready", timeout=start_timeout)

    def run(self, name: str, timeout: float = 60.0) -> list:
        """Run ``module:function`` on every rank; the per-rank return values."""
        if self.broken:
            raise RuntimeError(f"the worker pool is down: {self.broken}")
        for q in self._tasks:
            q.put(name)
        got: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.world_size:
            try:
                rank, got_name, ok, value = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    why = f"ranks {dead} died" if dead else f"timed out after {timeout:.0f}s"
                    self.broken = f"{name}: {why}; ranks that answered: {sorted(got)}"
                    self.close()
                    errors = "".join(f"\nrank {r}:\n{v}" for r, (ok, v) in sorted(got.items()) if not ok)
                    raise TimeoutError(self.broken + errors) from None
                continue
            assert got_name == name, (got_name, name)
            got[rank] = (ok, value)
        failed = [(r, v) for r, (ok, v) in sorted(got.items()) if not ok]
        if failed:
            rank, tb = failed[0]
            raise AssertionError(f"{name} failed on rank {rank} of {self.world_size}:\n{tb}")
        return [got[r][1] for r in range(self.world_size)]

    def close(self) -> None:
        if not self.broken:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=10)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        if os.path.exists(self._init_file):
            os.unlink(self._init_file)


def _ready():
    import torch.distributed as dist

    return dist.get_rank()
