"""Optional peers of the benchmarks: import them if present, and remember why not.

`peer(name)` returns a namespace (or None) and never raises; `peer_status()` maps
each name asked for to its version or to the one-line reason it is missing. The
norm peers expose `rms_norm` and `layer_norm` (a function for Liger, an nn.Module
class for Apex and TransformerEngine, Quack's function or forward/backward pair,
None where the peer lacks the op). A benchmark
for another op adds its own loader to PEER_LOADERS.

A pure-Python peer that is not installed may still be used from a wheel in
$RTCNORM_BENCH_WHEELS (default: <repo>/.whl, filled by
`pip download liger-kernel --no-deps -d .whl`): it is unpacked into .whl/site and
put first on sys.path for this process only; nothing is installed.
"""

from __future__ import annotations

import glob
import importlib
import os
import sys
import zipfile
from types import SimpleNamespace

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL_DIR = os.environ.get("RTCNORM_BENCH_WHEELS", os.path.join(REPO_DIR, ".whl"))


def reason(e: BaseException) -> str:
    """One line saying why something failed."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def _import(module: str, dist: str):
    """Import `module`; when it is missing but a pure-Python wheel of `dist` lies in
    WHEEL_DIR (e.g. from `pip download --no-deps -d .whl`), unpack it there and retry."""
    try:
        return importlib.import_module(module), "installed"
    except ImportError:
        wheels = sorted(glob.glob(os.path.join(WHEEL_DIR, f"{dist}-*-py3-none-any.whl")))
        if not wheels:
            raise
    site = os.path.join(WHEEL_DIR, "site")
    if not os.path.isdir(os.path.join(site, dist)):
        with zipfile.ZipFile(wheels[-1]) as z:
            z.extractall(site)
    sys.path.insert(0, site)
    importlib.invalidate_caches()
    return importlib.import_module(module), os.path.basename(wheels[-1])


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def _load_liger():
    fn, src = _import("liger_kernel.transformers.functional", "liger_kernel")
    ver = _version("liger-kernel") + ("" if src == "installed" else f" from {src}")
    return SimpleNamespace(rms_norm=fn.liger_rms_norm, layer_norm=fn.liger_layer_norm, version=ver)


def _load_apex_fused():
    from apex.normalization import FusedLayerNorm, FusedRMSNorm

    return SimpleNamespace(rms_norm=FusedRMSNorm, layer_norm=FusedLayerNorm, version=_version("apex"))


def _load_apex_fast():
    from apex.contrib.layer_norm import FastLayerNorm

    return SimpleNamespace(rms_norm=None, layer_norm=FastLayerNorm, version=_version("apex"))


def _load_te():
    import transformer_engine.pytorch as te

    return SimpleNamespace(rms_norm=te.RMSNorm, layer_norm=te.LayerNorm, version=_version("transformer_engine"))


def _load_quack():
    from quack.rmsnorm import layernorm_bwd, layernorm_fwd, rmsnorm
    from quack.softmax import softmax

    # Quack's LayerNorm is two functions (no autograd): the benchmark pairs them.
    # Its softmax is 2-D, unscaled and unmasked, with autograd.
    return SimpleNamespace(
        rms_norm=rmsnorm,
        layer_norm=(layernorm_fwd, layernorm_bwd),
        softmax=softmax,
        version=_version("quack-kernels"),
    )


PEER_LOADERS = {
    "liger": _load_liger,
    "quack": _load_quack,
    "apex_fused": _load_apex_fused,
    "apex_fast": _load_apex_fast,
    "te": _load_te,
}
_peers: dict = {}


def peer(name: str):
    """The optional peer `name` (a namespace), or None when it cannot be imported;
    `peer_status()` then says why. New peers go into PEER_LOADERS."""
    if name not in _peers:
        try:
            obj = PEER_LOADERS[name]()
            _peers[name] = (obj, f"{getattr(obj, 'version', '')}".strip() or "ok")
        except Exception as e:
            _peers[name] = (None, reason(e))
    return _peers[name][0]


def peer_status() -> dict:
    """{name: version or the reason it is missing} for every peer asked for so far."""
    return {name: info for name, (_, info) in _peers.items()}
