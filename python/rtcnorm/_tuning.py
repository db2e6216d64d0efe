"""Planner tunables of the norm and softmax kernels, for benchmark sweeps.

``get()`` / ``softmax_get()`` return the current values; ``override(**values)``
/ ``softmax_override(**values)`` are context managers that set some and
restore them afterwards. 0 means "the planner's rule"; softmax switches take
1 (off) or 2 (on). Softmax values are checked before any is set: an unknown
name raises KeyError, a bad value ValueError naming the field.
Process-wide: do not change them while other threads launch rtcnorm ops.
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


def softmax_get() -> dict:
    return dict(_C._softmax_tuning())


@contextmanager
def softmax_override(**values):
    before = softmax_get()
    _C._set_softmax_tuning(values)
    try:
        yield
    finally:
        _C._set_softmax_tuning(before)
