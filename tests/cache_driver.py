"""Runs rtcnorm's disk cache in a fresh process, for tests/test_jit.py and
tests/test_cache_security.py.

Each scenario runs the driver below with its own RTCNORM_CACHE_DIR and drives
compiles through rtcnorm.jit.precompile, which needs no GPU. The driver
reports every step's result, Python warnings and stats() as JSON. With
``as_uid`` it drops root after loading NVRTC (a forked child runs the steps
as that user), so the checks that depend on who owns what are tested for an
ordinary user too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import rtcnorm

PYTHON_DIR = str(Path(rtcnorm.__file__).resolve().parent.parent)
ARCH = "sm_80"
SPEC = {"op": "layer_norm", "n": [1], "dtypes": ["float32"], "modes": ["static_persistent"], "archs": [ARCH]}
# Twelve kernels, compiled in about a second: for the security scenarios.
SMALL_SPEC = {"op": "scaled_softmax", "n": [1, 2, 3], "dtypes": ["float32"], "modes": [None], "archs": [ARCH]}
WARNING = "kernel disk cache is unavailable"
WRITE_WARNING = "could not be stored in the disk cache"
SPARE_UID = 12345

_DRIVER = r"""
import json, os, sys, time, warnings
import torch
import rtcnorm

spec = json.loads(sys.argv[1])
out = {"cache_dir": rtcnorm.jit.cache_dir(), "steps": []}
x = torch.randn(3, 8)
out["cpu_op_ok"] = bool(torch.isfinite(rtcnorm.rms_norm(x, 8)).all())
uid = spec.get("as_uid")
if uid is not None:
    # NVRTC and its builtins are loaded while their folders are readable.
    os.environ["RTCNORM_DISABLE_DISK_CACHE"] = "1"
    rtcnorm.jit.precompile("scaled_softmax", hidden_sizes=[5], dtypes=[torch.float32], modes=[None], archs=["sm_80"])
    del os.environ["RTCNORM_DISABLE_DISK_CACHE"]
    rtcnorm.jit.reset_stats()
    sys.stdout.flush()
    child = os.fork()
    if child:
        sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except PermissionError as e:
        print("RESULT " + json.dumps({"skip": f"cannot become uid {uid}: {e}"}))
        sys.stdout.flush()
        os._exit(0)
    out["cache_dir"] = rtcnorm.jit.cache_dir()
for step in spec.get("steps", [{"do": "precompile"}]):
    rec = {"do": step["do"]}
    if "cache_dir" in step:
        os.environ["RTCNORM_CACHE_DIR"] = step["cache_dir"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if step["do"] == "precompile":
                rec["lines"] = rtcnorm.jit.precompile(
                    spec["op"], hidden_sizes=spec["n"], dtypes=[getattr(torch, d) for d in spec["dtypes"]],
                    modes=spec["modes"], archs=spec["archs"])
            elif step["do"] == "clear":
                rec["removed"] = rtcnorm.jit.clear_cache()
            elif step["do"] == "clear_until":
                rec["removed"] = 0
                while not os.path.exists(step["path"]):
                    rec["removed"] += rtcnorm.jit.clear_cache()
            rec["nvrtc"] = rtcnorm.jit.nvrtc_info()
        rec["warnings"] = [str(w.message) for w in caught]
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["stats"] = rtcnorm.jit.stats()
    rtcnorm.jit.reset_stats()
    out["steps"].append(rec)
print("RESULT " + json.dumps(out))
sys.stdout.flush()
if uid is not None:
    os._exit(0)
"""


def env_for(cache_dir, **extra):
    """The test's environment without RTCNORM_*; cache_dir None also drops
    HOME and XDG_CACHE_HOME (the /tmp/rtcnorm-<uid> fallback)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTCNORM_")}
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    if cache_dir is None:
        env.pop("HOME", None)
        env.pop("XDG_CACHE_HOME", None)
    else:
        env["RTCNORM_CACHE_DIR"] = str(cache_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(cache_dir, spec=None, cwd=None, **env):
    return subprocess.Popen(
        [sys.executable, "-c", _DRIVER, json.dumps(spec or SPEC)],
        env=env_for(cache_dir, **env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc, timeout=300):
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{stderr[-4000:]}"
    line = next(ln for ln in stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    if "skip" in result:
        pytest.skip(result["skip"])
    result["stderr"] = stderr
    assert result["cpu_op_ok"]
    return result


def run(cache_dir, spec=None, cwd=None, timeout=300, **env):
    """Runs the driver; returns its result, with the first step's fields on top.
    Stats are per step (each step resets them)."""
    result = finish(start(cache_dir, spec, cwd, **env), timeout)
    if result["steps"]:
        result.update(result["steps"][0])
    return result


def warning_count(result, text=WARNING):
    return result["stderr"].count(text) + sum(text in w for s in result["steps"] for w in s.get("warnings", []))


def arch_dir(root):
    return Path(root) / rtcnorm.__version__ / ARCH


def entries(root):
    d = arch_dir(root)
    return sorted(d.glob("*.bin")) if d.is_dir() else []


def leftovers(root):
    return [p for p in Path(root).rglob("*") if ".tmp" in p.name]


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def copy_cache(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def snapshot(root):
    """Every path under root (not following symlinks) with its kind and bytes."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode):
            out[str(p)] = ("file", p.read_bytes(), st.st_uid)
        elif stat.S_ISLNK(st.st_mode):
            out[str(p)] = ("link", os.readlink(p), st.st_uid)
        else:
            out[str(p)] = ("other", stat.S_IFMT(st.st_mode), st.st_uid)
    return out


def parse_entry(data: bytes):
    """The fields of an entry file: (key_text, lowered_name, target, is_cubin, image)."""
    assert data[:8] == b"RTCNORM1"
    pos, fields = 8, []
    for _ in range(3):
        (n,) = struct.unpack_from("<I", data, pos)
        fields.append(data[pos + 4 : pos + 4 + n].decode())
        pos += 4 + n
    is_cubin = data[pos]
    (size,) = struct.unpack_from("<Q", data, pos + 1)
    image = data[pos + 9 : pos + 9 + size]
    assert hashlib.sha1(data[:-40]).hexdigest().encode() == data[-40:], "checksum format"
    return (*fields, is_cubin, image)


def make_entry(key_text: str, image: bytes, lowered="forged", target="sm_80", is_cubin=1) -> bytes:
    """A well-formed entry whose checksum matches its content."""
    body = b"RTCNORM1"
    for f in (key_text, lowered, target):
        body += struct.pack("<I", len(f.encode())) + f.encode()
    body += bytes([is_cubin]) + struct.pack("<Q", len(image)) + image
    return body + hashlib.sha1(body).hexdigest().encode()


def entry_name(key_text: str) -> str:
    return hashlib.sha1(key_text.encode()).hexdigest() + ".bin"
