"""Planner overrides of the norm and softmax kernels, for tuning and tests.

Each planner takes exactly two controls: force a design of its catalogue, and
set knobs that design declares. Norm: ``norm_override(direction, design=None,
**knobs)`` with direction ``"fwd"`` or ``"bwd"`` (``norm_designs(direction)``
lists each design's knobs). Softmax: ``softmax_override(design=None,
**knobs)``. Everything is checked before anything is set: an unknown design
or a knob the design (or, with none forced, every design) does not declare
raises ValueError naming what is valid. A problem the forced design cannot
run, or with no candidate matching the knobs, is planned by the cost model
alone, and ``explain(...)["forced"]`` is False there. With a design forced
it then ranks every design of the catalogue, those the planner leaves out
as dominated included, so its pick may differ from the plan without the
override. Setting overrides clears the plan memo.

Process-wide: do not change them while other threads launch rtcnorm ops.
"""

from contextlib import contextmanager

from . import _C


def norm_designs(direction: str) -> dict:
    """The norm design catalogue of ``"fwd"`` or ``"bwd"``: each design's name and the knobs it declares."""
    return {name: list(knobs) for name, knobs in _C.norm_designs(direction).items()}


def norm_get(direction: str) -> dict:
    """The norm overrides in force for a direction: ``{"design": name or None, "knobs": {name: value}}``."""
    values = _C._norm_override(direction)
    return {"design": values["design"], "knobs": dict(values["knobs"])}


@contextmanager
def norm_override(direction: str, design: str | None = None, **knobs):
    """Force a norm design and/or set knobs for ``direction``, restoring the previous overrides afterwards."""
    before = norm_get(direction)
    _C._set_norm_override(direction, design, knobs)
    try:
        yield
    finally:
        _C._set_norm_override(direction, before["design"], before["knobs"])


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
