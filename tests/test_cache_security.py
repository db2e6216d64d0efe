"""The disk cache against a hostile or broken file system (issue 58, D1-D6).

A cache entry is code that is loaded onto the GPU, so the trust rules are
tested with the layouts an attacker or an accident creates, in temp folders:
symlinked levels, folders of another user (tests run as root in CI: os.chown
to a spare uid; runs as an ordinary user fork and drop root), FIFOs,
/dev/zero, folders in the place of entries, read-only folders, and a level
swapped for a symlink in a loop while entries are read.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest
import rtcnorm
from cache_driver import (
    ARCH,
    SMALL_SPEC,
    SPARE_UID,
    WRITE_WARNING,
    arch_dir,
    copy_cache,
    entries,
    entry_name,
    finish,
    leftovers,
    make_entry,
    parse_entry,
    run,
    snapshot,
    start,
    warning_count,
)

VERSION = rtcnorm.__version__
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root to create files of another user")


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """A cache of SMALL_SPEC's kernels: (root, number of kernels)."""
    root = tmp_path_factory.mktemp("seed") / "cache"
    result = run(root, SMALL_SPEC)
    assert "error" not in result, result["error"]
    k = len(result["lines"])
    assert k == len(entries(root)) >= 8
    return root, k


@pytest.fixture
def open_tmp():
    """A temp folder every user may traverse (root's tmp_path is not), for runs as another user."""
    d = Path(tempfile.mkdtemp(prefix="rtcnorm-security-"))
    os.chmod(d, 0o755)
    yield d
    for p in [d, *d.rglob("*")]:
        if not p.is_symlink() and p.is_dir():
            os.chmod(p, 0o700)
    shutil.rmtree(d, ignore_errors=True)


def victim_folder(path: Path) -> Path:
    """A folder of the user's that the cache must never touch."""
    path.mkdir(mode=0o700, parents=True)
    (path / "id_rsa").write_text("PRIVATE KEY")
    (path / ("0" * 40 + ".bin")).write_bytes(b"named like an entry")
    return path


def chown_tree(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, uid)


def test_a_symlinked_arch_folder_is_neither_written_nor_cleared(tmp_path, seed):
    """D1a: <version>/sm_80 -> a folder of the victim's. precompile must not
    write there and clear_cache must not delete there."""
    victim = victim_folder(tmp_path / "victim")
    root = tmp_path / "cache"
    (root / VERSION).mkdir(parents=True, mode=0o700)
    os.symlink(victim, arch_dir(root))
    before = snapshot(victim)
    result = run(root, dict(SMALL_SPEC, steps=[{"do": "precompile"}, {"do": "clear"}]))
    compile_step, clear_step = result["steps"]
    assert "error" not in compile_step and "error" not in clear_step, result
    s = compile_step["stats"]
    assert (s["compiles"], s["disk_hits"], s["disk_writes"]) == (seed[1], 0, 0)
    assert clear_step["removed"] == 0
    assert snapshot(victim) == before
    assert warning_count(result) == 1
    assert any(f"{arch_dir(root)} is a symbolic link" in w for w in compile_step["warnings"])


def _hostile_levels():
    cases = [(level, what) for level in ("root", "version", "arch") for what in ("symlink", "group", "world")]
    return cases + ([(level, "foreign") for level in ("root", "version", "arch")] if IS_ROOT else [])


def test_every_level_from_the_root_down_must_be_private(tmp_path, seed):
    """D1a: each level (root, version, sm_80) made a symlink, group- or
    world-writable, or another user's, over valid entries: nothing is read,
    written or deleted, with one warning for the process."""
    steps = []
    for i, (level, what) in enumerate(_hostile_levels()):
        root = copy_cache(seed[0], tmp_path / f"case{i}" / "cache")
        target = {"root": root, "version": root / VERSION, "arch": arch_dir(root)}[level]
        if what == "symlink":
            moved = tmp_path / f"case{i}" / "elsewhere"
            target.rename(moved)
            os.symlink(moved, target)
        elif what == "foreign":
            os.chown(target, SPARE_UID, SPARE_UID)
        else:
            os.chmod(target, 0o770 if what == "group" else 0o777)
        # A clear drops the images compiled in the step before, so each case compiles again.
        steps += [{"do": "clear", "cache_dir": str(root)}, {"do": "precompile"}]
    before = snapshot(tmp_path)
    result = run(tmp_path / "unused", dict(SMALL_SPEC, steps=steps))
    assert snapshot(tmp_path) == before
    for case, clear_step, compile_step in zip(_hostile_levels(), result["steps"][::2], result["steps"][1::2]):
        assert "error" not in compile_step and "error" not in clear_step, (case, result)
        assert clear_step["removed"] == 0, case
        s = compile_step["stats"]
        assert (s["compiles"], s["disk_hits"], s["disk_writes"]) == (seed[1], 0, 0), case
    assert warning_count(result) == 1, result["stderr"]


@needs_root
@pytest.mark.parametrize("how", ["foreign_folder", "symlink"])
def test_the_no_home_fallback_taken_by_another_user_is_refused(tmp_path, how):
    """D1a: with no HOME, /tmp/rtcnorm-<uid> made first by another user (a
    folder of theirs, or their symlink to a folder of the victim's)."""
    fallback = Path(f"/tmp/rtcnorm-{os.geteuid()}")
    if fallback.exists() or fallback.is_symlink():
        pytest.skip(f"{fallback} exists")
    victim = victim_folder(tmp_path / "victim" / VERSION / ARCH).parent.parent
    try:
        if how == "symlink":
            os.symlink(victim, fallback)
            os.lchown(fallback, SPARE_UID, SPARE_UID)
        else:
            fallback.mkdir(mode=0o755)
            (fallback / VERSION).mkdir(mode=0o755)
            os.symlink(victim / VERSION / ARCH, fallback / VERSION / ARCH)
            chown_tree(fallback, SPARE_UID)
        before = snapshot(victim), snapshot(fallback)
        result = run(None, dict(SMALL_SPEC, steps=[{"do": "precompile"}, {"do": "clear"}]))
        assert result["cache_dir"] == f"{fallback}/{VERSION}"
        assert "error" not in result, result["error"]
        assert result["stats"]["disk_writes"] == 0 and result["steps"][1]["removed"] == 0
        assert (snapshot(victim), snapshot(fallback)) == before
        assert warning_count(result) == 1
    finally:
        if fallback.is_symlink():
            fallback.unlink()
        else:
            shutil.rmtree(fallback, ignore_errors=True)


@needs_root
def test_an_ordinary_user_refuses_a_level_owned_by_root(open_tmp, seed):
    """D1a for a non-root user: the sm_80 folder and its entries are the
    user's, but the version folder above it is root's."""
    root = copy_cache(seed[0], open_tmp / "cache")
    chown_tree(root, SPARE_UID)
    os.chown(root / VERSION, 0, 0)
    os.chmod(root / VERSION, 0o755)  # readable: the owner alone makes it unsafe
    result = run(root, dict(SMALL_SPEC, as_uid=SPARE_UID))
    assert "error" not in result, result["error"]
    s = result["stats"]
    assert (s["compiles"], s["disk_hits"], s["disk_writes"]) == (seed[1], 0, 0)
    assert any(f"is owned by uid 0, not by this user (uid {SPARE_UID})" in w for w in result["warnings"]), result[
        "warnings"
    ]
    assert warning_count(result) == 1


AT_FDCWD, RENAME_EXCHANGE = -100, 2
_libc = ctypes.CDLL(None, use_errno=True)


_atomic_exchange = [hasattr(_libc, "renameat2")]


def exchange(a: Path, b: Path) -> None:
    """Swaps two names atomically (renameat2), or by three renames where the
    C library or the file system lacks it."""
    if _atomic_exchange[0]:
        if _libc.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, "renameat2", str(a))
        _atomic_exchange[0] = False
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def test_a_level_swapped_for_a_symlink_in_a_loop_never_yields_a_forged_entry(tmp_path, monkeypatch):
    """D1b: sm_80 is exchanged with a symlink to a folder holding a forged
    entry (well-formed, checksum matching) for 2 s while the entry is read
    through the loader's own path, then while the cache is cleared."""
    key = "rtcnorm swap test\nkernel any\n"
    root = tmp_path / "cache"
    real = arch_dir(root)
    real.mkdir(parents=True, mode=0o700)
    (real / entry_name(key)).write_bytes(make_entry(key, b"GENUINE " * 64))
    forged = tmp_path / "forged"
    forged.mkdir(mode=0o700)
    (forged / entry_name(key)).write_bytes(make_entry(key, b"FORGED! " * 64))
    if IS_ROOT:
        chown_tree(forged, SPARE_UID)
    link = real.with_name("swap")
    os.symlink(forged, link)
    monkeypatch.setenv("RTCNORM_CACHE_DIR", str(root))
    monkeypatch.delenv("RTCNORM_DISABLE_DISK_CACHE", raising=False)

    def swapping(action, seconds):
        stop, swaps = threading.Event(), [0]

        def swapper():
            while not stop.is_set():
                exchange(real, link)
                swaps[0] += 1

        t = threading.Thread(target=swapper)
        t.start()
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                action()
        finally:
            stop.set()
            t.join()
        return swaps[0]

    outcomes = collections.Counter()

    def read():
        status, image = rtcnorm.jit._C._disk_cache_read(80, key)
        assert b"FORGED" not in image
        outcomes[status] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tree is reported unsafe whenever the symlink is in place
        assert swapping(read, 2.0) > 100
        assert outcomes["hit"] > 0 and set(outcomes) <= {"hit", "disabled", "miss"}, outcomes
        swapping(rtcnorm.jit.clear_cache, 1.0)
    assert (forged / entry_name(key)).read_bytes() == make_entry(key, b"FORGED! " * 64)


DAMAGE = ["folder", "proc_self_mem", "fifo", "dev_zero", "symlink_to_valid", "oversize"]


def test_entries_that_are_not_regular_files_are_replaced_or_skipped(tmp_path, seed):
    """D2, D3: an entry path that is a folder, a symlink to /proc/self/mem or
    /dev/zero or to a valid entry elsewhere, a FIFO, or a file past the size
    bound is a bad entry: recompiled, replaced (the folder: skipped), the run
    finishes."""
    root = copy_cache(seed[0], tmp_path / "cache")
    files = entries(root)
    elsewhere = tmp_path / "elsewhere.bin"
    shutil.copy(files[-1], elsewhere)
    for what, path in zip(DAMAGE, files):
        valid = path.read_bytes()
        path.unlink()
        if what == "folder":
            path.mkdir()
            (path / "inside").write_bytes(valid)
        elif what == "fifo":
            os.mkfifo(path, 0o600)
        elif what == "oversize":
            path.write_bytes(valid)
            os.truncate(path, (64 << 20) + 1)
        else:
            target = {"proc_self_mem": "/proc/self/mem", "dev_zero": "/dev/zero", "symlink_to_valid": elsewhere}
            os.symlink(target[what], path)
    result = run(root, SMALL_SPEC, timeout=120)
    assert "error" not in result, result["error"]
    s = result["stats"]
    n = len(DAMAGE)
    assert (s["disk_corrupt"], s["compiles"], s["disk_hits"]) == (n, n, seed[1] - n)
    assert s["disk_writes"] == n - 1
    for what, path in zip(DAMAGE, files):
        if what == "folder":
            assert path.is_dir() and (path / "inside").exists()
        else:
            assert path.is_file() and not path.is_symlink(), what
            assert parse_entry(path.read_bytes())[0].startswith("rtcnorm "), what
    assert warning_count(result, WRITE_WARNING) == 1 and warning_count(result) == 0
    assert elsewhere.read_bytes() == files[-1].read_bytes()


def test_a_relative_cache_dir_is_taken_from_the_working_directory(tmp_path, seed):
    """D4: RTCNORM_CACHE_DIR=rel/cache from tmp_path is tmp_path/rel/cache."""
    result = run(Path("rel/cache"), SMALL_SPEC, cwd=tmp_path)
    assert "error" not in result, result["error"]
    assert result["cache_dir"] == f"{tmp_path}/rel/cache/{VERSION}"
    assert result["stats"]["disk_writes"] == seed[1]
    assert len(entries(tmp_path / "rel" / "cache")) == seed[1]
    assert warning_count(result) == 0


def test_clear_removes_only_entry_files(tmp_path, seed):
    """D5: a clear leaves another process's fresh temp file and the lock
    files; it removes entries and temp files a day old."""
    root = copy_cache(seed[0], tmp_path / "cache")
    d = arch_dir(root)
    name = "f" * 40 + ".bin"
    keep = [d / f"{name}.tmp.4242.7", d / f"{name}.lock", d / "notes.txt", d / ("F" * 40 + ".bin")]
    for p in keep:
        p.write_bytes(b"x")
    (d / ("a" * 40 + ".bin")).mkdir()
    stale = d / f"{name}.tmp.4242.8"
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * 86400,) * 2)
    result = run(root, dict(SMALL_SPEC, steps=[{"do": "clear"}]))
    assert result["removed"] == seed[1]
    left = {p.name for p in d.iterdir()}
    assert left - {f.name + ".lock" for f in entries(seed[0])} == {*(p.name for p in keep), "a" * 40 + ".bin"}


def test_a_failed_store_does_not_turn_the_disk_cache_off(tmp_path, seed):
    """D5: a store that fails (a folder in the entry's place) warns once; the
    other kernels are still stored, and read by the next run."""
    root = tmp_path / "cache"
    arch_dir(root).mkdir(parents=True, mode=0o700)
    for p in (root, root / VERSION):
        os.chmod(p, 0o700)
    (arch_dir(root) / entries(seed[0])[0].name).mkdir()
    result = run(root, SMALL_SPEC)
    assert "error" not in result, result["error"]
    k = seed[1]
    assert (result["stats"]["compiles"], result["stats"]["disk_writes"]) == (k, k - 1)
    assert warning_count(result, WRITE_WARNING) == 1 and warning_count(result) == 0
    assert run(root, SMALL_SPEC)["stats"]["disk_hits"] == k - 1


def test_clearing_in_a_loop_never_breaks_a_concurrent_writer(tmp_path, seed):
    """D5: one process clears the cache without pause while another compiles
    and stores every kernel: every store succeeds, nothing is left over."""
    root = tmp_path / "cache"
    done = tmp_path / "writer-done"
    clearer = start(root, dict(SMALL_SPEC, steps=[{"do": "clear_until", "path": str(done)}]))
    try:
        writer = run(root, SMALL_SPEC)
    finally:
        done.touch()
    cleared = finish(clearer)
    assert "error" not in cleared["steps"][0], cleared
    assert "error" not in writer, writer["error"]
    assert writer["stats"]["disk_writes"] == writer["stats"]["compiles"] == seed[1]
    assert warning_count(writer, WRITE_WARNING) == 0 and warning_count(writer) == 0
    assert leftovers(root) == []


def test_a_read_only_cache_is_still_read(open_tmp, seed):
    """D6: valid entries in folders the user cannot write are read; nothing
    is recompiled. As root (who may write anywhere) the run drops to a spare
    uid that owns the tree."""
    root = copy_cache(seed[0], open_tmp / "cache")
    spec = dict(SMALL_SPEC)
    if IS_ROOT:
        chown_tree(root, SPARE_UID)
        spec["as_uid"] = SPARE_UID
    for p in (arch_dir(root), root / VERSION, root):
        os.chmod(p, 0o500)
    result = run(root, spec)
    assert "error" not in result, result["error"]
    s = result["stats"]
    assert (s["disk_hits"], s["compiles"], s["disk_writes"]) == (seed[1], 0, 0)
    assert warning_count(result) == 0 and warning_count(result, WRITE_WARNING) == 0
