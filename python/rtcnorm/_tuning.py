"""Planner tunables of the norm kernels, for benchmark sweeps.

``get()`` returns the current values; ``override(**values)`` is a context
manager that sets some and restores them afterwards. Process-wide: do not
change them while other threads launch rtcnorm ops.
"""

from contextlib import contextmanager

from . import _C


def get() -> dict:
    return dict(_C._norm_tuning())


@contextmanager
def override(**values):
    before = get()
    _C._set_norm_tuning(values)
    try:
        yield
    finally:
        _C._set_norm_tuning(before)
