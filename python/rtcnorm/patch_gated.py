"""Gated RMSNorm look-alikes for :func:`rtcnorm.patch` (Mamba2, Zamba2, Bamba,
GraniteMoeHybrid, NemotronH, FalconH1, Qwen3-Next, Kimi-Linear, ...).

A candidate is a norm-like module (1-D ``weight``, an eps attribute, nothing
else) whose forward takes ``(hidden_states, gate)``. What it computes is
found by running it against :func:`rtcnorm.rms_norm_gated` under each
:class:`GatedForm` (gate order, activation, where the group size comes
from) on random float32 input; the form that matches is then verified like
the plain norms (outputs and gradients of input, gate and weight in float32
and the module's dtype). A call without a gate runs the module's own forward.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from .patch_verify import TOLERANCE, _closeness, _eps_value, _own_params, outputs_mismatch

# Where a module keeps its group size: columns a group ("group_size"), groups
# a row ("n_groups"), or nowhere (one group a row).
GROUP_ATTRS = ("group_size", "n_groups", None)


@dataclass(frozen=True)
class GatedForm:
    """``eps_attr`` and ``group_attr`` are read at every call; ``promote``:
    the output takes the promoted dtype of input and weight (HF's
    ``weight * x.to(input_dtype)``)."""

    norm_before_gate: bool
    activation: str
    eps_attr: str
    group_attr: str | None = None
    promote: bool = False
    kind: str = "rms_norm"  # patch's rms_norm switch covers gated norms
    shape_attr: str | None = None  # normalized_shape: the weight's

    @property
    def label(self) -> str:
        order = "norm before gate" if self.norm_before_gate else "gate before norm"
        groups = f", groups from {self.group_attr}" if self.group_attr else ""
        return f"rms_norm_gated ({order}, {self.activation}{groups})"


def takes_tensor_and_gate(module: nn.Module) -> bool:
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return len(params) == 2 and all(p.kind in positional for p in params) and params[1].name == "gate"


def group_of(module: nn.Module, form: GatedForm, n: int) -> int | None:
    if form.group_attr is None:
        return None
    v = int(getattr(module, form.group_attr))
    return v if form.group_attr == "group_size" else n // v


def run_gated(form: GatedForm, x, gate, weight, eps, group):
    """rtcnorm's op for ``form``: the patched forward and the verifier share it."""
    y = torch.ops.rtcnorm.rms_norm_gated(x, gate, weight, eps, form.norm_before_gate, group, form.activation)[0]
    if form.promote and weight is not None:
        y = y.to(torch.promote_types(x.dtype, weight.dtype))
    return y


def gated_forward_for(form: GatedForm):
    eps_attr = form.eps_attr

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if gate is None:
            return type(self)._rtcnorm_base.forward(self, hidden_states, gate)
        weight = self.weight
        group = group_of(self, form, weight.shape[0])
        return run_gated(form, hidden_states, gate, weight, getattr(self, eps_attr), group)

    return forward


def _inputs(n, params, dtype, device, eps, gen):
    scales = torch.tensor([1.0, 2.5, 0.3, 30.0, 1e-2, 7.0, 1.0, max(math.sqrt(_eps_value(eps, dtype)), 1e-4)])
    x = (torch.randn(8, n, generator=gen) * scales[:, None]).reshape(2, 4, n)
    z = 2 * torch.randn(2, 4, n, generator=gen)
    new = {
        k: (1.0 + 0.5 * torch.randn(p.shape, generator=gen)).to(device, dtype).requires_grad_()
        for k, p in params.items()
    }
    dy = torch.randn(2, 4, n, generator=gen).to(device, dtype)
    return x.to(device, dtype).requires_grad_(), z.to(device, dtype).requires_grad_(), new, dy


def compare(module: nn.Module, form: GatedForm, dtype: torch.dtype, *, grads: bool, seed: int = 0) -> str | None:
    """None when ``form`` reproduces ``module`` in ``dtype``; else why not."""
    own = _own_params(module)
    device = own["weight"].device
    n = own["weight"].shape[0]
    eps = getattr(module, form.eps_attr)
    x, z, params, dy = _inputs(n, own, dtype, device, eps, torch.Generator().manual_seed(seed))
    try:
        group = group_of(module, form, n)
        if group is not None and (group < 1 or n % group != 0):
            return f"group size {group} does not divide {n}"
    except (TypeError, ValueError, ZeroDivisionError) as e:
        return f"{form.group_attr} is not a usable group count: {e}"
    wrt = (dy, ["input", "gate", "weight"], [x, z, params["weight"]]) if grads else None
    return outputs_mismatch(
        lambda: functional_call(module, params, (x, z)),
        lambda: run_gated(form, x, z, params["weight"], eps, group),
        "rms_norm_gated", form.label, x, dtype, wrt,
    )  # fmt: skip


def identify_gated(module: nn.Module, eps_attr: str) -> tuple[GatedForm | None, str]:
    """The form whose float32 output matches ``module``, or a reason."""
    if set(_own_params(module)) != {"weight"}:
        return None, "a gated norm with parameters besides weight"
    reasons = []
    for attr in GROUP_ATTRS:
        if attr is not None and not isinstance(getattr(module, attr, None), int):
            continue
        for order in (True, False):
            for act in ("silu", "sigmoid"):
                form = GatedForm(order, act, eps_attr, attr)
                why = compare(module, form, torch.float32, grads=False)
                if why is None:
                    return _with_promotion(module, form)
                reasons.append(why)
    return None, f"matches no gated RMSNorm form: {min(reasons, key=_closeness)}"


def _with_promotion(module: nn.Module, form: GatedForm) -> tuple[GatedForm | None, str]:
    """The output dtype rule, from a bf16 input beside a float32 weight."""
    w = torch.ones_like(module.weight, dtype=torch.float32)
    x = torch.randn(2, w.shape[0]).to(w.device, torch.bfloat16)
    try:
        with torch.no_grad():
            out = functional_call(module, {"weight": w}, (x, torch.randn_like(x)))
    except Exception as e:
        return None, f"the original forward failed on a bfloat16 input: {type(e).__name__}: {e}"
    if out.dtype == torch.bfloat16:
        return form, ""
    if out.dtype == torch.float32:
        return GatedForm(form.norm_before_gate, form.activation, form.eps_attr, form.group_attr, True), ""
    return None, f"returns {out.dtype} for a bfloat16 input with a float32 weight"


def verify_gated(module: nn.Module, form: GatedForm) -> str | None:
    """Outputs and gradients in float32 and in the module's dtype."""
    dtypes = [torch.float32]
    pd = module.weight.dtype
    if pd in TOLERANCE and pd not in (torch.float32, torch.float64):
        dtypes.append(pd)
    for dt in dtypes:
        why = compare(module, form, dt, grads=True, seed=1)
        if why is not None:
            return why
    return None
