"""The JIT runtime without a GPU: the disk cache, NVRTC discovery, stats.

Each disk-cache scenario runs in its own process with its own
RTCNORM_CACHE_DIR, and drives compiles through rtcnorm.jit.precompile, which
needs no GPU. A scenario compiles one small, fixed set of kernels.
"""

from __future__ import annotations

import inspect
import os
import shutil
import threading
from pathlib import Path

import pytest
import rtcnorm
import torch
from cache_driver import (
    ARCH,
    SMALL_SPEC,
    SPEC,
    WARNING,
    arch_dir,
    copy_cache,
    entries,
    finish,
    leftovers,
    mode_of,
    run,
    start,
    warning_count,
)


@pytest.fixture(scope="session")
def seeded(tmp_path_factory):
    """A cache filled by one cold run: (root, number of kernels in SPEC, the run's result).
    Tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("seed") / "cache"
    result = run(root)
    assert "error" not in result, result["error"]
    return root, len(result["lines"]), result


def test_cold_process_writes_private_entries_and_warm_process_reads_them(seeded):
    root, k, cold = seeded
    assert k >= 10 and all(line.endswith(f" {ARCH} compiled") for line in cold["lines"])
    assert cold["cache_dir"] == f"{root}/{rtcnorm.__version__}"
    s = cold["stats"]
    assert (s["compiles"], s["disk_writes"], s["disk_hits"], s["disk_corrupt"]) == (k, k, 0, 0)
    for d in (root, root / rtcnorm.__version__, arch_dir(root)):
        assert mode_of(d) == 0o700, f"{d} has mode {oct(mode_of(d))}"
    files = entries(root)
    assert len(files) == k
    assert all(mode_of(f) & 0o077 == 0 for f in files)
    assert leftovers(root) == []
    assert warning_count(cold) == 0

    warm = run(root)
    s = warm["stats"]
    assert (s["compiles"], s["disk_hits"], s["disk_writes"], s["disk_corrupt"]) == (0, k, 0, 0)
    assert all(line.endswith(" cached") for line in warm["lines"])


def _flip_middle(path, _other):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])
    path.write_bytes(bytes(data))


def _flip_last(path, _other):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path, _other):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path, _other):
    path.write_bytes(b"")


def _swap_in_other_entry(path, other):
    path.write_bytes(other.read_bytes())


DAMAGE = [_flip_middle, _flip_last, _truncate, _empty, _swap_in_other_entry]


def test_corrupt_entries_are_recompiled_and_replaced(tmp_path, seeded):
    root = copy_cache(seeded[0], tmp_path / "cache")
    k = seeded[1]
    files = entries(root)
    for damage, path in zip(DAMAGE, files):
        damage(path, files[-1])
    damaged = {p: p.read_bytes() for p in files[: len(DAMAGE)]}

    result = run(root)
    assert "error" not in result, result["error"]
    s = result["stats"]
    assert s["disk_corrupt"] == len(DAMAGE)
    assert s["compiles"] == len(DAMAGE)
    assert s["disk_hits"] == k - len(DAMAGE)
    for path, bad in damaged.items():
        assert path.read_bytes() != bad, f"{path.name} was not replaced"
    assert leftovers(root) == []

    again = run(root)
    s = again["stats"]
    assert (s["compiles"], s["disk_corrupt"], s["disk_hits"]) == (0, 0, k)


def _file_in_the_way(root):
    root.write_text("not a folder")
    return root


def _group_writable(root):
    arch_dir(root).mkdir(parents=True, mode=0o700)
    return root


def _foreign_owner(root):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder to another user")
    arch_dir(root).mkdir(parents=True, mode=0o700)
    return root


def _plant(seed_root, root):
    """Copies valid entries into root's arch folder: they must not be read."""
    for f in entries(seed_root):
        shutil.copy2(f, arch_dir(root) / f.name)


@pytest.mark.parametrize("setup", [_file_in_the_way, _group_writable, _foreign_owner])
def test_unusable_cache_dir_warns_once_and_stays_in_memory(tmp_path, seeded, setup):
    root = setup(tmp_path / "cache")
    if setup is _group_writable:
        _plant(seeded[0], root)
        os.chmod(arch_dir(root), 0o770)
    if setup is _foreign_owner:
        _plant(seeded[0], root)
        for p in [arch_dir(root), *arch_dir(root).iterdir()]:
            os.chown(p, 54321, 54321)
    before = sorted(p.name for p in arch_dir(root).iterdir()) if arch_dir(root).is_dir() else []

    result = run(root)
    assert "error" not in result, result["error"]
    s = result["stats"]
    assert (s["compiles"], s["disk_hits"], s["disk_writes"]) == (seeded[1], 0, 0)
    assert warning_count(result) == 1, result["stderr"]
    after = sorted(p.name for p in arch_dir(root).iterdir()) if arch_dir(root).is_dir() else []
    assert after == before


def test_racing_processes_leave_one_valid_entry_per_key(tmp_path, seeded):
    root = tmp_path / "cache"
    procs = [start(root), start(root)]
    results = [finish(p) for p in procs]
    k = seeded[1]
    for r in results:
        r.update(r["steps"][0])
        assert "error" not in r, r["error"]
        assert r["stats"]["compiles"] + r["stats"]["disk_hits"] == k
    # The entry lock makes a waiter re-check the disk instead of compiling again.
    assert sum(r["stats"]["compiles"] for r in results) == k
    assert len(entries(root)) == k
    assert leftovers(root) == []
    s = run(root)["stats"]
    assert (s["compiles"], s["disk_hits"], s["disk_corrupt"]) == (0, k, 0)


def test_disabled_disk_cache_neither_reads_nor_writes(tmp_path, seeded):
    root = copy_cache(seeded[0], tmp_path / "cache")
    fresh = tmp_path / "never-created"
    snapshot = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    spec = dict(SPEC, steps=[{"do": "precompile"}, {"do": "precompile", "cache_dir": str(fresh)}])
    result = run(root, spec, RTCNORM_DISABLE_DISK_CACHE=1)
    assert "error" not in result, result["error"]
    s = result["stats"]
    assert (s["compiles"], s["disk_hits"], s["disk_writes"]) == (seeded[1], 0, 0)
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == snapshot
    assert not fresh.exists()
    assert warning_count(result) == 0


@pytest.mark.parametrize("kind", ["missing", "not_a_library"])
def test_bogus_nvrtc_path_is_a_clear_error_naming_the_variable(tmp_path, kind):
    target = tmp_path / "nvrtc"
    if kind == "not_a_library":
        target.write_text("not an ELF file")
    result = run(tmp_path / "cache", RTCNORM_NVRTC_PATH=target)
    assert "error" in result
    assert "RTCNORM_NVRTC_PATH" in result["error"]
    assert str(target) in result["error"]


def test_a_library_without_nvrtc_symbols_is_named_in_the_error(tmp_path):
    """A loadable library that is not NVRTC (here torch's libc10): the error
    names the file that was loaded."""
    target = Path(torch.__file__).parent / "lib" / "libc10.so"
    result = run(tmp_path / "cache", dict(SPEC, steps=[{"do": "info"}]), RTCNORM_NVRTC_PATH=target)
    assert "error" in result
    assert "has no symbol nvrtcVersion" in result["error"]
    assert str(target) in result["error"], result["error"]


@pytest.mark.parametrize("use_folder", [True, False], ids=["folder", "file"])
def test_nvrtc_path_pointing_at_the_real_library_works(tmp_path, use_folder):
    lib = rtcnorm.jit.nvrtc_info()["path"]
    target = os.path.dirname(lib) if use_folder else lib
    # Compiling once proves the folder form; loading the library the file form.
    spec = dict(SPEC, steps=[{"do": "precompile" if use_folder else "info"}])
    result = run(tmp_path / "cache", spec, RTCNORM_NVRTC_PATH=target)
    assert "error" not in result, result["error"]
    assert os.path.realpath(result["nvrtc"]["path"]).startswith(os.path.realpath(os.path.dirname(lib)))
    if use_folder:
        assert result["stats"]["compiles"] == len(result["lines"]) > 0


def test_clear_cache_removes_entries_and_compiled_images(tmp_path, seeded):
    root = copy_cache(seeded[0], tmp_path / "cache")
    spec = dict(SPEC, steps=[{"do": "precompile"}, {"do": "clear"}, {"do": "precompile"}])
    result = run(root, spec)
    first, clear, second = result["steps"]
    k = seeded[1]
    assert first["stats"]["disk_hits"] == k and first["stats"]["compiles"] == 0
    assert clear["removed"] == k
    # The in-memory images went too: the kernels compile again, and are stored again.
    assert second["stats"]["compiles"] == k
    assert len(entries(root)) == k


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    version = rtcnorm.__version__
    monkeypatch.setenv("RTCNORM_CACHE_DIR", str(tmp_path / "explicit"))
    assert rtcnorm.jit.cache_dir() == f"{tmp_path}/explicit/{version}"
    monkeypatch.delenv("RTCNORM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rtcnorm.jit.cache_dir() == f"{tmp_path}/xdg/rtcnorm/{version}"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert rtcnorm.jit.cache_dir() == f"{tmp_path}/home/.cache/rtcnorm/{version}"
    monkeypatch.delenv("HOME")
    assert rtcnorm.jit.cache_dir() == f"/tmp/rtcnorm-{os.geteuid()}/{version}"
    # A relative folder is taken from the working directory (D4), "." and "//" dropped.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RTCNORM_CACHE_DIR", "rel/./x//")
    assert rtcnorm.jit.cache_dir() == f"{os.getcwd()}/rel/x/{version}"


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("1", False), ("true", False), ("TRUE", False), ("Yes", False), (" on ", False)]
    + [("", True), ("0", True), ("false", True), ("No", True), ("OFF", True)],
)
def test_disable_disk_cache_accepts_the_usual_spellings(monkeypatch, value, enabled):
    monkeypatch.setenv("RTCNORM_DISABLE_DISK_CACHE", value)
    assert rtcnorm.jit._C.disk_cache_enabled() is enabled


def test_a_misspelt_disable_disk_cache_value_warns_and_keeps_the_cache(tmp_path):
    result = run(tmp_path / "cache", SMALL_SPEC, RTCNORM_DISABLE_DISK_CACHE="maybe")
    assert "error" not in result, result["error"]
    assert result["stats"]["disk_writes"] == len(result["lines"]) > 0
    assert any("RTCNORM_DISABLE_DISK_CACHE='maybe' is not understood" in w for w in result["warnings"])


MEMORY_KW = dict(hidden_sizes=[3], dtypes=[torch.float32], modes=["static_persistent"], archs=["sm_90"])


def test_second_precompile_in_a_process_is_served_from_memory():
    first = rtcnorm.jit.precompile("layer_norm", **MEMORY_KW)
    before = rtcnorm.jit.stats()
    second = rtcnorm.jit.precompile("layer_norm", **MEMORY_KW)
    after = rtcnorm.jit.stats()
    assert len(second) == len(first) > 0
    assert all(line.endswith(" sm_90 cached") for line in second)
    for counter in ("compiles", "disk_hits", "disk_misses", "disk_writes"):
        assert after[counter] == before[counter], counter
    # The cached checks show in stats(): one image hit a line.
    assert after["image_hits"] - before["image_hits"] == len(second)
    rtcnorm.jit.reset_stats()
    assert all(v == 0 for v in rtcnorm.jit.stats().values())


def test_precompile_lists_and_counts_each_distinct_kernel_once():
    """Repeated sizes and dtypes (and the float32 dW reducer that float16 and
    bfloat16 input share) give each kernel one line and one count."""
    kw = dict(MEMORY_KW, hidden_sizes=[3, 3, 3], dtypes=[torch.float32, torch.float32])
    before = rtcnorm.jit.stats()
    lines = rtcnorm.jit.precompile("layer_norm", **kw)
    after = rtcnorm.jit.stats()
    assert len(lines) == len(set(lines)) == len(rtcnorm.jit.precompile("layer_norm", **MEMORY_KW))
    counted = sum(after[c] - before[c] for c in ("compiles", "disk_hits", "image_hits"))
    assert counted == len(lines)


def test_precompile_reports_progress_on_the_calling_thread():
    calls = []
    lines = rtcnorm.jit.precompile(
        "layer_norm", **MEMORY_KW, threads=2, progress=lambda d, t: calls.append((d, t, threading.get_ident()))
    )
    assert [(d, t) for d, t, _ in calls] == [(i, len(lines)) for i in range(1, len(lines) + 1)]
    assert {ident for _, _, ident in calls} == {threading.get_ident()}


def test_an_exception_in_progress_stops_precompile():
    class Stop(Exception):
        pass

    def progress(done, total):
        raise Stop(f"{done}/{total}")

    before = rtcnorm.jit.stats()["compiles"]
    kw = dict(MEMORY_KW, hidden_sizes=[5], archs=["sm_80"])
    with pytest.raises(Stop, match=r"^1/\d+$"):
        rtcnorm.jit.precompile("layer_norm", **kw, threads=1, progress=progress)
    # The one worker finishes at most the kernel it had started.
    assert rtcnorm.jit.stats()["compiles"] - before <= 2
    with pytest.raises(TypeError, match="progress must be None or a callable"):
        rtcnorm.jit.precompile("layer_norm", **kw, progress=3)


def test_precompile_warnings_go_through_python_warnings(tmp_path):
    """The unusable-cache warning raised on a compiler thread reaches the
    caller's warnings filter, not stderr."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o770)
    result = run(root, SMALL_SPEC)
    assert "error" not in result, result["error"]
    assert sum(WARNING in w for w in result["warnings"]) == 1
    assert WARNING not in result["stderr"]


def test_every_public_name_of_jit_has_a_docstring():
    names = [n for n in dir(rtcnorm.jit) if not n.startswith("_")]
    funcs = [
        n for n in names if callable(getattr(rtcnorm.jit, n)) and getattr(rtcnorm.jit, n).__module__ == "rtcnorm.jit"
    ]
    assert {"cache_dir", "clear_cache", "stats", "reset_stats", "nvrtc_info", "precompile"} <= set(funcs)
    for n in funcs:
        doc = inspect.getdoc(getattr(rtcnorm.jit, n)) or ""
        assert len(doc.split()) >= 15, f"rtcnorm.jit.{n} has too short a docstring: {doc!r}"
    assert len((inspect.getdoc(rtcnorm.jit) or "").split()) >= 50


def test_nvrtc_info_reports_a_usable_library():
    info = rtcnorm.jit.nvrtc_info()
    assert os.path.exists(info["path"])
    major, minor = (int(p) for p in info["version"].split("."))
    assert major >= 11 and minor >= 0
    assert {80, 90} <= set(info["archs"])


def test_import_registers_every_norm_op_and_needs_no_gpu():
    for name in ("rms_norm", "add_rms_norm", "rms_norm_backward", "layer_norm", "layer_norm_backward"):
        schema = str(getattr(torch.ops.rtcnorm, name).default._schema)
        assert schema.startswith(f"rtcnorm::{name}("), schema
    assert {"rms_norm", "layer_norm"} <= set(rtcnorm.jit._C.variant_ops())
    assert set(rtcnorm.__all__) <= set(dir(rtcnorm))
    # No GPU and no driver here is fine; a broken NVRTC path only matters once
    # something is compiled (the bogus-path tests run a CPU op first).
    result = run(Path("/nonexistent-cache"), dict(SPEC, steps=[]), CUDA_VISIBLE_DEVICES="")
    assert result["cpu_op_ok"] and result["steps"] == []
