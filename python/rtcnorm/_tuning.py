"""Planner overrides of the norm and softmax kernels, for benchmark sweeps.

Norm: ``get()`` returns the tunables and ``override(**values)`` sets some
for a ``with`` block (0 means "the planner's rule").

Softmax: exactly two controls, through ``softmax_override(design=None,
**knobs)``: force a design of the catalogue (``softmax_designs()``), and set
knobs that designs declare. Everything is checked before anything is set: an
unknown design or a knob no design (or not the forced one) declares raises
ValueError naming what is valid; a value out of range raises ValueError
naming the knob. Setting overrides clears the plan memo.

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


def softmax_designs() -> dict:
    """The softmax design catalogue: each design's name and the knobs it declares."""
    return {name: list(knobs) for name, knobs in _C.softmax_designs().items()}


def softmax_get() -> dict:
    """The softmax overrides in force: ``{"design": name or None, "knobs": {name: value}}``."""
    values = _C._softmax_tuning()
    return {"design": values["design"], "knobs": dict(values["knobs"])}


@contextmanager
def softmax_override(design: str | None = None, **knobs):
    """Force a softmax design and/or set knobs, restoring the previous overrides afterwards.

    ``design`` is one of :func:`softmax_designs`; it runs every problem it is
    feasible for (the others plan as usual). Each knob must be declared by
    ``design``, or by some design when none is forced, and applies where the
    picked design declares it.
    """
    before = softmax_get()
    _C._set_softmax_tuning(design, knobs)
    try:
        yield
    finally:
        _C._set_softmax_tuning(before["design"], before["knobs"])
