"""Behavioural checks behind :func:`rtcnorm.patch`.

A candidate norm module is run through its own forward (``functional_call``
with fresh random parameters, so the module itself is never changed) and
through rtcnorm's op under one :class:`Form`; the two must agree in output
dtype, values and gradients (input, weight, bias). Inputs hold rows of very
different scales, one of them near ``sqrt(eps)``, so a different eps
placement (``x / (rms + eps)``) or a missing ``1 +`` on the scale shows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

# Relative to each row's largest reference value. Two roundings to the
# storage dtype are allowed: HF's Llama family rounds the normalized row
# before multiplying by the weight, rtcnorm rounds once at the end.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 8e-3, torch.bfloat16: 3.2e-2, torch.float64: 1e-9}

KINDS = ("rms_norm", "layer_norm")


@dataclass(frozen=True)
class Form:
    """What a module computes, in rtcnorm's terms.

    ``eps_attr`` names the module attribute holding eps (read at every call);
    ``shape_attr`` the one holding normalized_shape (None: the weight's shape);
    ``promote``: the output takes the promoted dtype of input and weight (HF
    ``weight * x.to(input_dtype)``) rather than the input's.
    """

    kind: str
    zero_centered: bool
    eps_attr: str
    shape_attr: str | None = None
    promote: bool = False
    mode: str | None = None

    @property
    def label(self) -> str:
        return self.kind + (" (1 + weight)" if self.zero_centered else "")


def run_form(form: Form, x, weight, bias, shape, eps):
    """rtcnorm's op for ``form``: the patched forward and the verifier share it.

    Calls the registered ops directly: ``form.mode`` was checked when the
    form was made, and a patched forward should cost as little host time as
    the op itself.
    """
    shape = list(shape)
    if form.kind == "rms_norm":
        y = torch.ops.rtcnorm.rms_norm(x, shape, weight, eps, form.mode, form.zero_centered)[0]
    else:
        y = torch.ops.rtcnorm.layer_norm(x, shape, weight, bias, eps, form.mode, form.zero_centered)[0]
    if form.promote and weight is not None:
        y = y.to(torch.promote_types(x.dtype, weight.dtype))
    return y


def module_shape(module: nn.Module, form: Form) -> tuple[int, ...]:
    if form.shape_attr is not None:
        return tuple(getattr(module, form.shape_attr))
    return tuple(module.weight.shape)


def _eps_value(eps, dtype) -> float:
    return float(eps) if eps is not None else torch.finfo(dtype).eps


def _inputs(shape, params: dict, dtype, device, eps, gen):
    """Random input, parameters and upstream gradient, drawn on the CPU."""
    n = math.prod(shape)
    rows = 8
    scales = torch.tensor([1.0, 2.5, 0.3, 30.0, 1e-2, 7.0, 1.0, max(math.sqrt(_eps_value(eps, dtype)), 1e-4)])
    x = torch.randn(rows, n, generator=gen) * scales[:, None]
    x[2] += 3.0  # an offset row: LayerNorm's mean matters
    x = x.reshape(2, rows // 2, *shape)
    new = {}
    for name, p in params.items():
        base = 1.0 if name == "weight" else 0.0
        new[name] = (base + 0.5 * torch.randn(p.shape, generator=gen)).to(device, dtype).requires_grad_(True)
    dy = torch.randn(x.shape, generator=gen).to(device, dtype)
    return x.to(device, dtype).requires_grad_(True), new, dy


def _mismatch(what: str, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> str | None:
    """Why rtcnorm's ``a`` is not the original's ``b``, or None when within tolerance."""
    if a.shape != b.shape:
        return f"{what} has shape {tuple(b.shape)}, rtcnorm gives {tuple(a.shape)}"
    if not bool(torch.isfinite(b).all()):
        return f"{what} of the original is not finite in {dtype}"
    if not bool(torch.isfinite(a).all()):
        return f"{what} of rtcnorm is not finite in {dtype}"
    err, tol = _row_error(a, b), TOLERANCE[dtype]
    if err > tol:
        return f"{what} differs in {dtype} (relative error {err:.2g} > {tol:g})"
    return None


def _row_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest error relative to the row's largest reference value."""
    a = a.detach().double().reshape(-1, a.shape[-1] if a.dim() else 1)
    b = b.detach().double().reshape(a.shape)
    denom = b.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    return float(((a - b).abs() / denom).max()) if a.numel() else 0.0


def _own_params(module: nn.Module) -> dict:
    return {k: v for k, v in module.named_parameters(recurse=False) if v is not None}


def compare(module: nn.Module, form: Form, dtype: torch.dtype, *, grads: bool, seed: int = 0) -> str | None:
    """None when ``form`` reproduces ``module`` in ``dtype``; else why not."""
    device = next(iter(_own_params(module).values())).device if _own_params(module) else torch.device("cpu")
    shape = module_shape(module, form)
    eps = getattr(module, form.eps_attr)
    gen = torch.Generator().manual_seed(seed)
    x, params, dy = _inputs(shape, _own_params(module), dtype, device, eps, gen)
    return outputs_mismatch(
        lambda: functional_call(module, params, (x,)),
        lambda: run_form(form, x, params.get("weight"), params.get("bias"), shape, eps),
        form.kind, form.label, x, dtype, (dy, ["input", *params], [x, *params.values()]) if grads else None,
    )  # fmt: skip


def outputs_mismatch(original, ours, what: str, label: str, x, dtype, grads) -> str | None:
    """Why ``ours()`` does not reproduce ``original()`` (the module's forward on
    ``x``) in ``dtype``, or None. ``what`` names rtcnorm's op, ``label`` the form;
    ``grads``, when given, is (dy, names, tensors) whose gradients must match too."""
    try:
        with torch.enable_grad():
            ref = original()
    except Exception as e:  # any failure of the original means: do not touch it
        return f"the original forward failed on a {tuple(x.shape)} {dtype} input: {type(e).__name__}: {e}"
    if not isinstance(ref, torch.Tensor):
        return f"the original forward returns {type(ref).__name__}, not a tensor"
    try:
        with torch.enable_grad():
            out = ours()
    except Exception as e:  # e.g. no NVRTC on a GPU machine: report, do not swap
        return f"rtcnorm's {what} failed on a {tuple(x.shape)} {dtype} input: {type(e).__name__}: {e}"
    if out.dtype != ref.dtype:
        return f"output dtype {ref.dtype} for {dtype} input, rtcnorm gives {out.dtype}"
    why = _mismatch(f"output as {label}", out, ref, dtype)
    if why or grads is None:
        return why
    return grads_mismatch(out, ref, *grads, dtype)


def grads_mismatch(out, ref, dy, names, wrt, dtype) -> str | None:
    """Why the gradients of ``out`` and ``ref`` (given ``dy``) with respect to
    ``wrt`` differ past the tolerance of ``dtype``, or None."""
    g_ref = torch.autograd.grad(ref, wrt, dy, allow_unused=True)
    g_out = torch.autograd.grad(out, wrt, dy, allow_unused=True)
    for name, a, b in zip(names, g_out, g_ref):
        if (a is None) != (b is None):
            return f"gradient of {name} is {'missing' if a is None else 'unexpected'} in {dtype}"
        if a is not None and (why := _mismatch(f"gradient of {name}", a, b, dtype)):
            return why
    return None


def identify(module: nn.Module, eps_attr: str, has_bias: bool, mode) -> tuple[Form | None, str]:
    """The form whose fp32 output matches ``module`` (forward only), or a reason."""
    kinds = ("layer_norm",) if has_bias else KINDS
    reasons = []
    for kind in kinds:
        for zc in (False, True):
            form = Form(kind, zc, eps_attr, mode=mode)
            why = compare(module, form, torch.float32, grads=False)
            if why is None:
                return _with_promotion(module, form)
            reasons.append(why)
    best = min(reasons, key=_closeness)
    return None, f"matches no RMSNorm / LayerNorm form: {best}"


def _closeness(reason: str) -> float:
    """The relative error a reason states (inf if none): the closest form explains best."""
    m = re.search(r"relative error ([0-9.e+-]+)", reason)
    return float(m.group(1)) if m else math.inf


def _with_promotion(module: nn.Module, form: Form) -> tuple[Form | None, str]:
    """Learn the output dtype rule from a bf16 input beside float32 parameters."""
    probe = _dtype_probe(module)
    if probe is None:
        return form, ""
    out_dtype, why = probe
    if why:
        return None, why
    if out_dtype == torch.bfloat16:
        return form, ""
    if out_dtype == torch.float32:
        return Form(form.kind, form.zero_centered, form.eps_attr, form.shape_attr, True, form.mode), ""
    return None, f"returns {out_dtype} for a bfloat16 input with float32 parameters"


def _dtype_probe(module: nn.Module):
    params = {k: torch.ones_like(v, dtype=torch.float32) for k, v in _own_params(module).items()}
    if not params:
        return None
    device = next(iter(params.values())).device
    x = torch.randn(2, *params["weight"].shape).to(device, torch.bfloat16)
    try:
        with torch.no_grad():
            return functional_call(module, params, (x,)).dtype, ""
    except Exception as e:
        return None, f"the original forward failed on a bfloat16 input: {type(e).__name__}: {e}"


def verify(module: nn.Module, form: Form) -> str | None:
    """Outputs and gradients in float32 and in the module's dtype."""
    params = _own_params(module)
    dtypes = [torch.float32]
    if params:
        pd = next(iter(params.values())).dtype
        if pd in TOLERANCE and pd != torch.float32:
            dtypes.append(pd)
    for dt in dtypes:
        why = compare(module, form, dt, grads=True, seed=1)
        if why is not None:
            return why
    return None
