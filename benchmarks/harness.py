"""The shared benchmark harness: timing, copy ceiling, profiler kernel time, tables, shapes, peers.

Timing contract (every bench_<op>.py relies on it):
- `bench(fn)` returns the median milliseconds of one call of `fn`, warmed up, with
  the L2 cache flushed (a 256 MB buffer written) before every timed call. On CUDA it
  uses `triton.testing.do_bench` when triton imports, else CUDA events around each
  call. On CPU (smoke runs only) it falls back to wall-clock.
- `copy_gbps(nbytes)` is the ceiling: a device-to-device `copy_` whose read plus
  write total `nbytes`, timed the same way in the same process.
- `profiler_kernel_ms(fn)` is GPU time only: the time covered by the kernels (and
  memsets or memcpys) of one call, from torch.profiler, with the flush kernel left
  out; kernels that overlap (a programmatic launch starts before its predecessor
  ends) count once. The gap between it and `bench(fn)` is host overhead.
- The flush cannot evict L2 lines a kernel loaded with an evict_last policy
  (`torch.compile`'s kernels do so for inputs they read twice): those lines stay
  until their priority is reset. So every measurement starts with
  `reset_persisting_l2()`, and `profiler_kernel_ms` resets before every timed call,
  so that no call finds its inputs left in L2 by its own or another impl's earlier
  calls. `bench` resets once: triton's loop has no hook between calls, so a kernel
  that marks its own inputs keeps them in L2 for its later calls there.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time
import warnings

import torch

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:  # sibling modules import the same way from a script or a package
    sys.path.insert(0, BENCH_DIR)
from peers import PEER_LOADERS, peer, peer_status, reason  # noqa: E402,F401  (re-exported: part of this API)

REPO_DIR = os.path.dirname(BENCH_DIR)
SHAPES_PATH = os.path.join(BENCH_DIR, "bench_shapes.json")
FLUSH_BYTES = 256 << 20  # well above the 50 MB L2 of an H100

_cfg = {"device": "cuda" if torch.cuda.is_available() else "cpu", "warmup": 10.0, "rep": 40.0}
_cache: dict = {}


def configure(*, device: str | None = None, warmup: float | None = None, rep: float | None = None) -> None:
    """Set the device and the warm-up / measurement budgets (ms per `bench` call)."""
    if device is not None:
        _cfg["device"] = device
    if warmup is not None:
        _cfg["warmup"] = float(warmup)
    if rep is not None:
        _cfg["rep"] = float(rep)


def device() -> torch.device:
    return torch.device(_cfg["device"])


def on_cuda() -> bool:
    return device().type == "cuda"


def sync() -> None:
    if on_cuda():
        torch.cuda.synchronize()


def _flush_buffer() -> torch.Tensor:
    if "flush" not in _cache:
        _cache["flush"] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device())
    return _cache["flush"]


def _do_bench():
    if "do_bench" not in _cache:
        try:
            from triton.testing import do_bench

            _cache["do_bench"] = do_bench
        except Exception:
            _cache["do_bench"] = None
    return _cache["do_bench"]


def reset_persisting_l2() -> None:
    """Wait for the device, then return every L2 line marked persisting to normal
    priority (the driver's cuCtxResetPersistingL2Cache). Loads with an evict_last
    policy mark their lines so and the 256 MB flush does not evict them: on an H100,
    after one `torch.compile` call of RMSNorm 256x8192 had read x that way, every
    later flushed forward of that x, rtcnorm's and Liger's included, ran 1.3-1.5 us
    (a quarter) faster (docs/history.md entry 41). No-op without CUDA."""
    if not on_cuda():
        return
    if "cu_reset" not in _cache:
        import ctypes

        try:
            _cache["cu_reset"] = ctypes.CDLL("libcuda.so.1").cuCtxResetPersistingL2Cache
        except (OSError, AttributeError):
            _cache["cu_reset"] = None
            _warn_no_reset("the driver has no cuCtxResetPersistingL2Cache")
    torch.cuda.synchronize()
    if _cache["cu_reset"] is not None:
        status = _cache["cu_reset"]()
        if status != 0:  # e.g. a GPU without L2 persistence: go on without the reset
            _cache["cu_reset"] = None
            _warn_no_reset(f"cuCtxResetPersistingL2Cache returned CUresult {status}")


def _warn_no_reset(why: str) -> None:
    warnings.warn(f"harness: {why}; L2 lines loaded evict_last may outlive the flush", stacklevel=3)


def timer_name() -> str:
    if not on_cuda():
        return "wall-clock (CPU smoke run; not a benchmark)"
    return "triton.testing.do_bench" if _do_bench() is not None else "CUDA events"


def _event_bench(fn, warmup: float, rep: float) -> float:
    flush = _flush_buffer()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup / est))):
        fn()
    n = min(max(5, int(rep / est)), 10000)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in events:
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _wall_bench(fn, warmup: float, rep: float) -> float:
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + (warmup + rep) / 1e3
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench(fn, *, grad: bool = False) -> float:
    """Median ms of one call of `fn` (L2 flushed, warmed up). `grad` marks a backward
    call; autograd's first calls allocate, so it gets a longer warm-up."""
    warmup, rep = _cfg["warmup"] * (2 if grad else 1), _cfg["rep"]
    if not on_cuda():
        return _wall_bench(fn, warmup, rep)
    fn()  # any lines marked persisting by this set-up call are reset below
    reset_persisting_l2()
    do_bench = _do_bench()
    if do_bench is not None:
        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    return _event_bench(fn, warmup, rep)


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def _copy_rate(nbytes: int, timer, tag: str) -> float:
    """GB/s of `dst.copy_(src)` where read + write total `nbytes` (src holds half),
    timed by `timer` (a callable returning ms); measured once per size."""
    n = max(16, (int(nbytes) // 2 + 15) // 16 * 16)
    key = (tag, n, _cfg["device"])
    if key not in _cache:
        src = torch.empty(n, dtype=torch.uint8, device=device()).random_()
        dst = torch.empty_like(src)
        _cache[key] = gbps(2 * n, timer(lambda: dst.copy_(src)))
        del src, dst
    return _cache[key]


def copy_gbps(nbytes: int) -> float:
    """GB/s of the copy's call (`bench`): the per-call denominator."""
    return _copy_rate(nbytes, bench, "copy")


def copy_kernel_gbps(nbytes: int) -> float:
    """GB/s of the copy's device time (torch.profiler, L2 flushed): the
    denominator for kernels whose calls are host-bound."""
    return _copy_rate(nbytes, profiler_kernel_ms, "copy kernel")


def _is_device_work(e, DeviceType) -> bool:
    """A kernel, memset or memcpy; not a GPU-side mirror of a record_function range
    (autograd and torch.compile open such ranges around the kernels they launch)."""
    return e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)


def _flush_kernel_names() -> set:
    """Names of the device events of one flush, learned once by profiling it alone."""
    if "flush_names" not in _cache:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        flush = _flush_buffer()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                flush.bitwise_not_()
            torch.cuda.synchronize()
        _cache["flush_names"] = {e.name for e in prof.events() if _is_device_work(e, DeviceType)}
    return _cache["flush_names"]


def profiler_kernel_ms(fn, iters: int = 20) -> float:
    """Device time of one call of `fn` from torch.profiler: all kernels, memsets and
    memcpys over `iters` L2-flushed calls, divided by `iters`; persisting L2 lines are
    reset before each call (the wait that needs adds no device time). On CPU: self
    CPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = on_cuda()
    fn()
    sync()
    skip = _flush_kernel_names() if cuda else set()
    flush = _flush_buffer() if cuda else None
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=acts) as prof:
            for _ in range(iters):
                if flush is not None:
                    reset_persisting_l2()
                    flush.bitwise_not_()
                fn()
            sync()
    total_us = 0.0
    spans = []
    for e in prof.events():
        if cuda and _is_device_work(e, DeviceType) and e.name not in skip:
            spans.append((e.time_range.start, e.time_range.end))
        elif not cuda and e.device_type == DeviceType.CPU and e.cpu_parent is None:
            total_us += e.cpu_time_total
    total_us += _busy_us(spans)
    return total_us / iters / 1e3 if total_us > 0 else float("nan")


def _busy_us(spans) -> float:
    """Length of the union of (start, end) intervals. A kernel launched
    programmatically may start (and wait) before the previous one ends; its
    overlap is counted once, so the device time is never more than wall time."""
    busy, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a >= end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return busy


# ---- shapes, environment, progress -------------------------------------------


def load_shapes() -> dict:
    """The standard shapes: the dict stored in benchmarks/bench_shapes.json."""
    with open(SHAPES_PATH) as f:
        return json.load(f)


def environment() -> dict:
    env = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": _cfg["device"],
        "timer": timer_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    for name in ("triton", "rtcnorm"):
        mod = sys.modules.get(name)
        env[name] = getattr(mod, "__version__", None) if mod else None
    if on_cuda():
        props = torch.cuda.get_device_properties(device())
        env["gpu"] = props.name
        env["sm_count"] = props.multi_processor_count
        env["capability"] = f"sm_{props.major}{props.minor}"
    return env


def progress(items, desc: str = "", label=None):
    """Iterate with a progress bar (tqdm or rich) on a terminal, else one short line
    per item on stderr (`label(item)`, default str), so that a captured log stays small."""
    items = list(items)
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm

            return tqdm(items, desc=desc, file=sys.stderr)
        except ImportError:
            pass
        try:
            from rich.progress import track

            return track(items, description=desc)
        except ImportError:
            pass

    def lines():
        for i, item in enumerate(items):
            print(f"[{i + 1}/{len(items)}] {desc} {label(item) if label else item}", file=sys.stderr, flush=True)
            yield item

    return lines()


# ---- tables (benchmarks/tables.py, re-exported: part of this API) ---------------

from tables import RESULTS_DIR, Table, _is_num, _num, set_environment  # noqa: E402,F401

set_environment(environment)
