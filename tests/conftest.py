"""Shared test set-up.

- ``gpu`` tests run only where CUDA and an sm_80+ device are present; they are
  skipped cleanly elsewhere.
- ``slow`` tests run only with ``--run-slow`` (or RTCNORM_TEST_SLOW=1).
- Unless RTCNORM_CACHE_DIR is already set, the session uses a private,
  temporary kernel cache, so tests neither read nor fill the user's cache.
- Every test starts from a seed derived from its own id: inputs are fresh
  random data, and a failure reproduces.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zlib

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    if not os.environ.get("RTCNORM_CACHE_DIR"):
        d = tempfile.mkdtemp(prefix="rtcnorm-test-cache-")
        os.environ["RTCNORM_CACHE_DIR"] = d
        config._rtcnorm_private_cache = d


def pytest_unconfigure(config):
    d = getattr(config, "_rtcnorm_private_cache", None)
    if d:
        shutil.rmtree(d, ignore_errors=True)


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "needs CUDA"
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        return "needs a GPU of compute capability 8.0 or newer"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_reason = _gpu_skip_reason()
    run_slow = config.getoption("--run-slow") or os.environ.get("RTCNORM_TEST_SLOW") == "1"
    for item in items:
        if gpu_reason and "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=gpu_reason))
        if not run_slow and "slow" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="slow: run with --run-slow"))


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def poison():
    """Returns ``poison(nbytes)``: empties the CUDA caching allocator, then
    fills ``nbytes`` of its large pool and 8 MiB of its small pool with 0xFF
    bytes (NaN in fp16, bf16 and fp32) and frees them. The only cached blocks
    left are poisoned, and outputs allocated next reuse them, so an element a
    kernel fails to write stays NaN and fails reference.assert_close."""

    def fill(nbytes: int) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        keep = [torch.empty(max(int(nbytes), 4 << 20), dtype=torch.uint8, device="cuda").fill_(0xFF)]
        keep += [torch.empty(1 << 19, dtype=torch.uint8, device="cuda").fill_(0xFF) for _ in range(16)]
        torch.cuda.synchronize()
        del keep

    return fill


@pytest.fixture
def require_gpu_memory():
    """Returns ``require(nbytes)``: skips the test unless the device has at
    least ``nbytes`` free (the tests of more than 2^31 elements)."""

    def require(nbytes: int) -> None:
        free, _ = torch.cuda.mem_get_info()
        if free < nbytes:
            pytest.skip(f"needs {nbytes / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} free")

    return require


@pytest.fixture(scope="session")
def gpu_kernels():
    """Compiles (or loads from the disk cache) every aligned-tensor kernel the
    GPU matrix tests launch, on all CPU cores at once, before they run.
    RTCNORM_TEST_PRECOMPILE=0 skips it: runs sharded over many processes
    compile on demand, each only what its tests launch."""
    if os.environ.get("RTCNORM_TEST_PRECOMPILE", "1") == "0":
        return
    import rtcnorm
    from norm_checks import GPU_DTYPES, GPU_N, MODES

    major, minor = torch.cuda.get_device_capability()
    for op in ("rms_norm", "layer_norm"):
        rtcnorm.jit.precompile(
            op,
            hidden_sizes=GPU_N,
            dtypes=GPU_DTYPES,
            modes=MODES,
            archs=[f"sm_{major}{minor}"],
            threads=os.cpu_count() or 0,
        )
