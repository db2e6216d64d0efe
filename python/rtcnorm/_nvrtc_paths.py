"""Tells the native library where torch's CUDA wheels keep NVRTC.

Only paths are computed here; nothing is loaded until a kernel is compiled.
"""

import importlib.util
import os

import torch


def candidate_dirs():
    """Folders that may hold libnvrtc, the one matching torch's CUDA first."""
    cuda = torch.version.cuda or ""
    subdirs = ["cu13/lib", "cuda_nvrtc/lib"]
    if cuda.startswith("12"):
        subdirs.reverse()
    dirs = []
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for sub in subdirs:
        for root in roots:
            d = os.path.join(root, sub)
            if os.path.isdir(d):
                dirs.append(d)
    dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
    return dirs


def register():
    from . import _C

    _C.set_nvrtc_search_dirs(candidate_dirs())
