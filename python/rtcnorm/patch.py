"""Swap the norm modules of any model for rtcnorm's ops, in place, after checking them.

Candidates are ``torch.nn.RMSNorm``, ``torch.nn.LayerNorm``, and any module
that looks like a norm: no children, a 1-D ``weight`` parameter (and maybe a
``bias`` of the same size) and nothing else, a numeric ``eps`` /
``variance_epsilon`` / ``epsilon`` attribute, and a forward taking one
tensor. What a look-alike computes (RMSNorm or LayerNorm, scale ``weight`` or
``1 + weight``, output dtype rule) is found by running it; with
``verify=True`` every candidate's outputs and gradients are then compared
with rtcnorm's in float32 and in the module's dtype (see
:mod:`rtcnorm.patch_verify`). A module that does not match is left alone
and listed, with the reason, in the returned :class:`PatchSummary`.
Gated look-alikes, whose forward takes ``(hidden_states, gate)``, are matched
to :func:`rtcnorm.rms_norm_gated` the same way (:mod:`rtcnorm.patch_gated`).

A swap changes only the instance's class, to a subclass of its own that
overrides ``forward``: parameters, buffers, hooks, ``state_dict`` keys and
``isinstance`` checks are unchanged, and :func:`unpatch` restores the class.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from . import modules as _rtc_modules
from .modes import check_mode
from .patch_gated import GatedForm, gated_forward_for, identify_gated, takes_tensor_and_gate, verify_gated
from .patch_verify import Form, identify, module_shape, run_form, verify

_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")
_CLASSES: dict[tuple[type, Form], type] = {}


@dataclass(frozen=True)
class Swapped:
    """A swapped module: its qualified name, original class name and what it runs as."""

    name: str
    cls: str
    kind: str


@dataclass(frozen=True)
class Skipped:
    """A candidate left alone: its qualified name, class name and why."""

    name: str
    cls: str
    reason: str


@dataclass
class PatchSummary:
    """What :func:`patch` did: ``swapped``, ``skipped`` (with reasons) and
    ``already`` (names of modules patched before this call)."""

    swapped: list[Swapped] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    already: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"rtcnorm.patch: {len(self.swapped)} swapped, {len(self.skipped)} skipped, "
            f"{len(self.already)} already patched"
        ]
        groups: dict[tuple[str, str], list[str]] = {}
        for s in self.swapped:
            groups.setdefault((s.cls, s.kind), []).append(s.name)
        for (cls, kind), names in groups.items():
            lines.append(f"  swapped  {cls} as {kind}: {_names(names)}")
        why: dict[tuple[str, str], list[str]] = {}
        for s in self.skipped:
            why.setdefault((s.cls, s.reason), []).append(s.name)
        for (cls, reason), names in why.items():
            lines.append(f"  skipped  {cls}: {_names(names)}\n           {reason}")
        return "\n".join(lines)


def _names(names: list[str]) -> str:
    shown = ", ".join(n or "<root>" for n in names[:3])
    return f"{len(names)} ({shown}{', ...' if len(names) > 3 else ''})"


def _forward_for(form: Form):
    # The form is baked into a closure of constants, so torch.compile traces
    # straight to the rtcnorm op with no guard on a Python object.
    if isinstance(form, GatedForm):
        return gated_forward_for(form)
    shape_attr, eps_attr = form.shape_attr, form.eps_attr

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        shape = tuple(getattr(self, shape_attr)) if shape_attr is not None else tuple(weight.shape)
        return run_form(form, input, weight, getattr(self, "bias", None), shape, getattr(self, eps_attr))

    return forward


def _rebuild(base: type, form: Form):
    cls = _patched_class(base, form)
    return cls.__new__(cls)


def _patched_class(base: type, form: Form) -> type:
    key = (base, form)
    if key in _CLASSES:
        return _CLASSES[key]

    def extra_repr(self) -> str:
        s = base.extra_repr(self)
        return (s + ", " if s else "") + f"rtcnorm={form.label}"

    def __reduce_ex__(self, protocol):
        # pickle and deepcopy rebuild the patched class from (base, form).
        rv = base.__reduce_ex__(self, protocol)
        return (_rebuild, (base, form), *rv[2:])

    ns = {
        "forward": _forward_for(form),
        "extra_repr": extra_repr,
        "__reduce_ex__": __reduce_ex__,
        "_rtcnorm_base": base,
        "_rtcnorm_form": form,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    }
    # Same name as the base: name-keyed lists (e.g. no-split module classes) still match.
    cls = type(base.__name__, (base,), ns)
    _CLASSES[key] = cls
    return cls


def is_patched(module: nn.Module) -> bool:
    """Whether ``module`` itself runs rtcnorm's forward (see :func:`patch`)."""
    return "_rtcnorm_base" in type(module).__dict__


def _eps_attr(module: nn.Module) -> str | None:
    for a in _EPS_ATTRS:
        v = getattr(module, a, None)
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            return a
    return None


def _takes_one_tensor(module: nn.Module) -> bool:
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return False
    params = list(sig.parameters.values())
    return len(params) == 1 and params[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def _candidate(module: nn.Module, mode) -> tuple[Form | None, str] | None:
    """None: not a norm. Else (form, "") to swap, or (None, reason) to skip."""
    if isinstance(module, (_rtc_modules.RMSNorm, _rtc_modules.LayerNorm)):
        return None
    if isinstance(module, (nn.modules.batchnorm._NormBase, nn.GroupNorm)):
        return None
    t = type(module)
    if t is nn.RMSNorm:
        return Form("rms_norm", False, "eps", "normalized_shape", mode=mode), ""
    if t is nn.LayerNorm:
        return Form("layer_norm", False, "eps", "normalized_shape", mode=mode), ""
    weight = getattr(module, "weight", None)
    eps_attr = _eps_attr(module)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or eps_attr is None:
        return None
    if next(module.children(), None) is not None:
        return None, "has submodules"
    own = {k for k, v in module.named_parameters(recurse=False)}
    if not own <= {"weight", "bias"}:
        return None, f"has parameters besides weight and bias: {sorted(own - {'weight', 'bias'})}"
    bias = getattr(module, "bias", None)
    if bias is not None and (not isinstance(bias, nn.Parameter) or bias.shape != weight.shape):
        return None, "bias is not a parameter of the weight's shape"
    buffers = [k for k, _ in module.named_buffers(recurse=False)]
    if buffers:
        return None, f"has buffers: {buffers}"
    if takes_tensor_and_gate(module):
        return identify_gated(module, eps_attr) if not weight.is_meta else (None, "parameters are on the meta device")
    if not _takes_one_tensor(module):
        return None, f"forward takes other arguments: {inspect.signature(module.forward)}"
    if weight.is_meta:
        return None, "parameters are on the meta device: materialize them first"
    return identify(module, eps_attr, bias is not None, mode)


def patch(
    model: nn.Module,
    *,
    rms_norm: bool = True,
    layer_norm: bool = True,
    mode: str | None = None,
    verify: bool = True,
) -> PatchSummary:
    """Swap every norm module of ``model`` that rtcnorm reproduces, in place.

    ``rms_norm`` / ``layer_norm`` choose which kinds to swap; ``mode`` is
    passed to the ops (see :data:`rtcnorm.MODES`). With ``verify=True``
    (the default) each candidate's outputs and weight gradients must match
    rtcnorm's in float32 and in its own dtype, on its own device, at that
    dtype's tolerance; with ``verify=False`` torch's own classes are swapped
    unchecked and look-alikes are only identified by one float32 forward.
    Modules already patched are left as they are (patch twice = once; call
    :func:`unpatch` first to change ``mode``). Returns a :class:`PatchSummary`.
    """
    check_mode(mode, "patch")
    if not isinstance(model, nn.Module):
        raise TypeError(f"rtcnorm.patch: model must be a torch.nn.Module, got {type(model).__name__}")
    summary = PatchSummary()
    wanted = {"rms_norm": rms_norm, "layer_norm": layer_norm}
    seen: dict[tuple, tuple[Form | None, str]] = {}
    for name, module in model.named_modules():
        if is_patched(module):
            summary.already.append(name)
            continue
        key = _likeness(module)
        found = seen[key] if key in seen else _candidate(module, mode)
        if found is None:
            continue
        if key not in seen:
            form, reason = found
            if form is not None and not wanted[form.kind]:
                form, reason = None, f"{form.kind}=False"
            if form is not None and verify:
                reason = _verify_here(module, form)
                form = None if reason else form
            seen[key] = found = (form, reason)
        cls_name = type(module).__name__
        form, reason = found
        if form is None:
            summary.skipped.append(Skipped(name, cls_name, reason))
            continue
        module.__class__ = _patched_class(type(module), form)
        summary.swapped.append(Swapped(name, cls_name, form.label))
    return summary


def _likeness(module: nn.Module) -> tuple:
    """Modules with equal keys compute the same function of their input and
    parameters: same class, parameter shapes, dtypes and devices, and the same
    plain attributes (eps, training, ...). Each is identified and verified once."""
    params = tuple((k, tuple(p.shape), p.dtype, p.device) for k, p in module.named_parameters(recurse=False))
    attrs = tuple(
        sorted(
            (k, v)
            for k, v in vars(module).items()
            if not k.startswith("_") and isinstance(v, (bool, int, float, str, tuple, type(None))) and _hashable(v)
        )
    )
    return (type(module), params, attrs)


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _verify_here(module: nn.Module, form: Form) -> str | None:
    params = [p for p in module.parameters(recurse=False) if p is not None]
    if any(p.is_meta for p in params):
        return "parameters are on the meta device: cannot verify (materialize them, or verify=False)"
    if module_shape(module, form) == ():
        return "empty normalized_shape"
    return verify_gated(module, form) if isinstance(form, GatedForm) else verify(module, form)


def unpatch(model: nn.Module) -> list[str]:
    """Restore the original class of every patched module in ``model``; returns their names."""
    restored = []
    for name, module in model.named_modules():
        if is_patched(module):
            module.__class__ = type(module)._rtcnorm_base
            restored.append(name)
    return restored


@contextlib.contextmanager
def patched(model: nn.Module, **kwargs) -> Iterator[PatchSummary]:
    """``with rtcnorm.patched(model) as summary:`` patches for the block only.

    On exit it restores just the modules this block swapped; those patched
    before it stay patched. Keyword arguments are :func:`patch`'s.
    """
    summary = patch(model, **kwargs)
    try:
        yield summary
    finally:
        swapped = {s.name for s in summary.swapped}
        for name, module in model.named_modules():
            if name in swapped and is_patched(module):
                module.__class__ = type(module)._rtcnorm_base
