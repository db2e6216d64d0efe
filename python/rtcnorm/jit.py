"""The NVRTC kernel cache: where it lives, what it did, and filling it ahead.

Kernels are compiled on first use for the exact configuration asked for,
kept in memory per device, and stored on disk under :func:`cache_dir`
(``$RTCNORM_CACHE_DIR``, default ``~/.cache/rtcnorm/<version>``), one
folder per GPU architecture. Set ``RTCNORM_DISABLE_DISK_CACHE=1`` to keep
kernels in memory only, and ``RTCNORM_NVRTC_PATH`` to choose the NVRTC library.
``RTCNORM_JIT_VERBOSE=1`` prints each compiled kernel's registers, spill bytes
and shared memory (ptxas' report) to stderr; kernels found on disk are not
compiled, so pair it with ``RTCNORM_DISABLE_DISK_CACHE=1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from . import _C
from .modes import MODES, dtype_name


def cache_dir() -> str:
    """The versioned disk-cache folder (per-arch folders ``sm_XX`` live inside)."""
    return _C.cache_dir()


def clear_cache() -> int:
    """Remove every disk entry of this version and the in-memory compiled images.

    Kernels already loaded on a device stay loaded, since queued work may use
    them. Returns the number of disk entries removed.
    """
    return _C.clear_cache()


def stats() -> dict:
    """Counters since process start (or :func:`reset_stats`).

    ``memory_hits``/``memory_misses`` count lookups of loaded kernels;
    ``disk_hits``, ``disk_misses``, ``disk_corrupt`` (entries that failed
    verification and were recompiled) and ``disk_writes`` the disk cache;
    ``compiles`` and ``compile_ms`` NVRTC; ``module_loads`` loads onto a GPU.
    """
    return dict(_C.stats())


def reset_stats() -> None:
    _C.reset_stats()


def nvrtc_info() -> dict:
    """The NVRTC library in use: path, version and the archs it can target."""
    return dict(_C.nvrtc_info())


def _arch_number(arch: str | int) -> int:
    if isinstance(arch, int):
        return arch
    a = str(arch).lower().removeprefix("sm_").removeprefix("compute_")
    if not a.isdigit():
        raise ValueError(f"rtcnorm.jit.precompile: arch must look like 'sm_90', got {arch!r}")
    return int(a)


def precompile(
    op: str = "rms_norm",
    *,
    hidden_sizes: Iterable[int],
    dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float16, torch.float32),
    modes: Sequence[str | None] = (None, *MODES),
    archs: Sequence[str | int] = ("sm_80", "sm_90", "sm_100"),
    threads: int = 0,
) -> list[str]:
    """Compile every kernel ``op`` may launch for these row lengths into the disk cache.

    Needs no GPU. Covers each weight/bias/zero-centred/residual combination,
    forward modes and backward gradient combinations, for aligned tensors.
    Returns one line per kernel: its instantiation, target and whether it was
    compiled now or already cached.
    """
    for m in modes:
        if m is not None and m not in MODES:
            raise ValueError(f"rtcnorm.jit.precompile: mode must be None or one of {MODES}, got {m!r}")
    return list(
        _C.precompile(
            op,
            [dtype_name(d) for d in dtypes],
            [int(n) for n in hidden_sizes],
            list(modes),
            [_arch_number(a) for a in archs],
            int(threads),
        )
    )
