"""The built library is tied to the torch it was built against: importing it
under another torch minor release fails with a message naming both versions."""

import os
import subprocess
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IMPORT_UNDER = """
import sys, types
info = types.ModuleType("rtcnorm._build_info")
info.TORCH_VERSION, info.TORCH_MAJOR_MINOR = {full!r}, {minor!r}
sys.modules["rtcnorm._build_info"] = info
import rtcnorm
print("imported", rtcnorm.__version__)
"""


def run_import(full: str, minor: str) -> subprocess.CompletedProcess:
    code = IMPORT_UNDER.format(full=full, minor=minor)
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_import_under_another_torch_minor_release_fails_clearly():
    run = run_import("1.0.0+cpu", "1.0")
    assert run.returncode != 0
    assert (
        f"rtcnorm was built against torch 1.0.0+cpu and links against that libtorch, but torch {torch.__version__} "
        "is imported: install torch 1.0.x or rebuild rtcnorm" in run.stderr
    ), run.stderr[-2000:]


def test_import_under_the_same_minor_release_with_another_patch_level_works():
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    run = run_import(f"{major}.{minor}.99", f"{major}.{minor}")
    assert run.returncode == 0 and "imported" in run.stdout, run.stderr[-2000:]
