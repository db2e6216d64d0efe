"""The NVRTC kernel cache: where it lives, what it did, and filling it ahead.

Kernels are compiled on first use for the exact configuration asked for,
kept in memory per device, and stored on disk under :func:`cache_dir`, one
folder per GPU architecture. See ``docs/cache.md`` for the layout, the trust
model and the failure behaviour. Environment variables:

- ``RTCNORM_CACHE_DIR``: the cache root (a relative path is taken from the
  working directory); default ``$XDG_CACHE_HOME/rtcnorm``, else
  ``~/.cache/rtcnorm``, else ``/tmp/rtcnorm-<uid>``. It must be a real folder
  owned by you and not writable by group or others, or the disk cache is not
  used (one warning).
- ``RTCNORM_DISABLE_DISK_CACHE``: ``1``/``true``/``yes``/``on`` (any case)
  keeps kernels in memory only; ``0``/``false``/``no``/``off`` or empty keep
  the disk cache on.
- ``RTCNORM_NVRTC_PATH``: the NVRTC library, or a folder holding it.
- ``RTCNORM_JIT_VERBOSE=1``: each compiled kernel's registers, spill bytes and
  shared memory (ptxas' report) go to stderr; kernels found on disk are not
  compiled, so pair it with ``RTCNORM_DISABLE_DISK_CACHE=1``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence

import torch

from . import _C
from .modes import MODES, dtype_name

# The longest row the ops accept (normalized_shape's product).
_MAX_HIDDEN = 1 << 24


def cache_dir() -> str:
    """The versioned disk-cache folder, ``<root>/<version>``, as an absolute path.

    The per-architecture folders ``sm_XX`` holding the entries live inside.
    The path is resolved from the environment on each call and is not created.
    """
    return _C.cache_dir()


def clear_cache() -> int:
    """Remove this version's disk entries and the in-memory compiled images.

    Only entry files (``<sha1>.bin``) inside verified cache folders are
    deleted; lock files and temp files another process may be writing stay.
    Kernels already loaded on a device stay loaded, since queued work may use
    them. Safe to call while other processes use the cache. Returns the number
    of disk entries removed.
    """
    return _C.clear_cache()


def stats() -> dict:
    """Counters since process start (or :func:`reset_stats`), as a new dict.

    - ``memory_hits``/``memory_misses``: lookups of kernels loaded on a device
      (the launch path).
    - ``image_hits``: compiled kernels found in this process's memory, for
      instance by a repeated :func:`precompile` or a second device.
    - ``disk_hits``, ``disk_misses``, ``disk_corrupt`` (entries that failed
      verification and were recompiled) and ``disk_writes``: the disk cache.
    - ``compiles`` and ``compile_ms``: NVRTC; ``disk_load_ms``: reading entries;
      ``module_loads`` and ``module_load_ms``: loads onto a GPU.

    Each line :func:`precompile` returns is counted once, in ``compiles``,
    ``disk_hits`` or ``image_hits``.
    """
    return dict(_C.stats())


def reset_stats() -> None:
    """Set every counter of :func:`stats` back to zero.

    Use it to measure one phase, e.g. ``reset_stats(); model(x);
    print(stats()["compiles"])`` shows how many kernels that call compiled.
    Caches are not touched.
    """
    _C.reset_stats()


def nvrtc_info() -> dict:
    """The NVRTC library in use: ``path``, ``version`` and ``archs`` (the sm_XX it targets).

    Loads NVRTC if needed; raises ``RuntimeError`` listing every place tried
    when none is found (set ``RTCNORM_NVRTC_PATH`` then).
    """
    return dict(_C.nvrtc_info())


def _arch_number(arch: str | int) -> int:
    if isinstance(arch, int):
        return arch
    a = str(arch).lower().removeprefix("sm_").removeprefix("compute_")
    if not a.isdigit():
        raise ValueError(f"rtcnorm.jit.precompile: arch must look like 'sm_90', got {arch!r}")
    return int(a)


def _integer(v, message: str) -> int:
    """``v`` as an int (bools refused); otherwise TypeError(message)."""
    if isinstance(v, bool):
        raise TypeError(message)
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(message) from None


def _hidden_size(n) -> int:
    value = _integer(n, f"rtcnorm.jit.precompile: hidden_sizes must hold integers, got {n!r}")
    if not 1 <= value <= _MAX_HIDDEN:
        raise ValueError(
            f"rtcnorm.jit.precompile: hidden_sizes must hold row lengths from 1 to {_MAX_HIDDEN} "
            f"(the longest row the ops accept), got {value}"
        )
    return value


def _group_size(g) -> int | None:
    if g is None:
        return None
    value = _integer(g, f"rtcnorm.jit.precompile: group_sizes must hold integers or None, got {g!r}")
    if value < 1:
        raise ValueError(f"rtcnorm.jit.precompile: group_sizes must hold positive integers or None, got {value}")
    return value


def precompile(
    op: str = "rms_norm",
    *,
    hidden_sizes: Iterable[int],
    dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float16, torch.float32),
    modes: Sequence[str | None] = (None, *MODES),
    archs: Sequence[str | int] = ("sm_80", "sm_90", "sm_100"),
    threads: int = 0,
    progress: Callable[[int, int], None] | None = None,
    group_sizes: Sequence[int | None] = (None,),
) -> list[str]:
    """Compile every kernel ``op`` may launch for these row lengths into the disk cache.

    Needs no GPU. Covers each weight/bias/zero-centred/residual combination,
    forward modes and backward gradient combinations, for aligned tensors.
    ``op`` is ``"rms_norm"``, ``"layer_norm"``, a softmax op, or
    ``"rms_norm_quant"`` / ``"layer_norm_quant"``: the forwards of
    :func:`rtcnorm.rms_norm` / :func:`rtcnorm.layer_norm` with ``quant=``, every
    recipe and scale layout (their backward is the plain op's).
    ``threads`` compiler threads run at once (0: one per CPU core).

    ``op`` may also be ``"rms_norm_gated"`` (forward and backward of
    :func:`rtcnorm.rms_norm_gated`: with and without a weight, of the input's
    dtype or float32, both ``norm_before_gate`` values, silu and sigmoid) or
    ``"rms_norm_gated_quant"`` (its forwards with ``quant=``, every recipe and
    scale layout; the backward is ``rms_norm_gated``'s). Their kernels depend
    on the group size: ``group_sizes`` lists those to cover, each dividing
    every hidden size (``None``: ``group_size=None``, one group a row); the
    other ops take only ``(None,)``. ``modes`` does not apply to them.

    ``progress``, when given, is called as ``progress(done, total)`` after
    each kernel, on the calling thread, e.g. to drive a progress bar; an
    exception it raises stops the run (so does Ctrl-C). Warnings raised while
    compiling (an unusable cache folder, ...) go through :mod:`warnings`.

    Returns one line per distinct kernel: its instantiation, its target and
    whether it was ``compiled`` now or already ``cached`` (on disk or in this
    process); :func:`stats` counts each line once.

    Example::

        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[4096], dtypes=[torch.bfloat16], archs=["sm_90"])
        rtcnorm.jit.precompile("rms_norm_gated", hidden_sizes=[4096], group_sizes=[None, 512])
    """
    for m in modes:
        if m is not None and m not in MODES:
            raise ValueError(f"rtcnorm.jit.precompile: mode must be None or one of {MODES}, got {m!r}")
    if progress is not None and not callable(progress):
        raise TypeError(
            f"rtcnorm.jit.precompile: progress must be None or a callable taking (done, total), got {progress!r}"
        )
    if isinstance(hidden_sizes, (str, bytes)) or not isinstance(hidden_sizes, Iterable):
        raise TypeError(f"rtcnorm.jit.precompile: hidden_sizes must be an iterable of integers, got {hidden_sizes!r}")
    sizes = [_hidden_size(n) for n in hidden_sizes]
    if isinstance(group_sizes, (str, bytes)) or not isinstance(group_sizes, Iterable):
        raise TypeError(
            f"rtcnorm.jit.precompile: group_sizes must be an iterable of integers or None, got {group_sizes!r}"
        )
    groups = [_group_size(g) for g in group_sizes]
    try:
        workers = operator.index(threads)
    except TypeError:
        raise TypeError(
            f"rtcnorm.jit.precompile: threads must be an integer (0: one per CPU core), got {threads!r}"
        ) from None
    return list(
        _C.precompile(
            op,
            [dtype_name(d) for d in dtypes],
            sizes,
            list(modes),
            [_arch_number(a) for a in archs],
            workers,
            progress,
            groups,
        )
    )
