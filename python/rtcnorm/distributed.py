"""rtcnorm under torch.distributed: DTensor sharding rules for every op.

The rules themselves live in :mod:`rtcnorm.distributed_rules`; see
docs/distributed.md for the placements. They are registered with DTensor
without any user code:

- if ``torch.distributed.tensor`` is already imported when rtcnorm is, at once;
- otherwise the moment it is first imported (a one-shot import hook), so that
  ``import rtcnorm`` does not pay for importing DTensor (about a second).

:func:`register_sharding_rules` registers them explicitly (idempotent).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
import warnings

import torch

_DTENSOR = "torch.distributed.tensor"
_lock = threading.Lock()
_registered = False


def register_sharding_rules() -> bool:
    """Register rtcnorm's DTensor sharding strategies; True once registered.

    Imports ``torch.distributed.tensor``. Returns False (and registers
    nothing) when torch was built without distributed support.
    """
    global _registered
    if not torch.distributed.is_available():
        return False
    with _lock:
        if not _registered:
            from . import distributed_rules

            distributed_rules.register()
            _registered = True
    return True


def _register_after_import() -> None:
    try:
        register_sharding_rules()
    except Exception as e:  # an import must not fail because of rtcnorm
        warnings.warn(
            f"rtcnorm: registering DTensor sharding rules failed ({type(e).__name__}: {e}); "
            "rtcnorm ops on DTensors will raise until rtcnorm.distributed.register_sharding_rules() succeeds",
            RuntimeWarning,
            stacklevel=2,
        )


class _DTensorImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of torch.distributed.tensor
    so the rules are registered right after that module has run, then leaves
    sys.meta_path."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _DTENSOR:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        self.remove()
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _register_after_import()

        # The loader object belongs to this one module's spec.
        loader.exec_module = exec_and_register
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def install() -> None:
    """Arrange for the rules to be registered (called by ``import rtcnorm``)."""
    if not torch.distributed.is_available():
        return
    if _DTENSOR in sys.modules:
        _register_after_import()
    elif not any(isinstance(f, _DTensorImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _DTensorImportHook())


install()
