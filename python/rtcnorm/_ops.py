"""Fake (meta) implementations of the torch.ops.rtcnorm ops.

Schemas are defined in C++ (csrc/registration.cpp). Fake implementations
mirror the real ones' output shapes, dtypes and (contiguous) strides, so the
ops trace under torch.compile without graph breaks.
"""

import torch

from .modes import check_mode

_lib = "rtcnorm::"


def _lead_shape(input, normalized_shape):
    return input.shape[: input.dim() - len(normalized_shape)]


def _stat_dtype(input):
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def _empty_like(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _check_shape(op, input, normalized_shape):
    nd = len(normalized_shape)
    torch._check(
        nd >= 1 and input.dim() >= nd and list(input.shape[input.dim() - nd :]) == list(normalized_shape),
        lambda: (
            f"rtcnorm.{op}: normalized_shape {list(normalized_shape)} must match the trailing dims of input, "
            f"got input of shape {list(input.shape)}"
        ),
    )


def _check_devices(op, input, **tensors):
    # The real implementations refuse mixed devices; without this check a
    # meta (or fake) argument beside a real input would silently trace.
    for name, t in tensors.items():
        torch._check(
            t is None or t.device == input.device,
            lambda name=name, t=t: f"rtcnorm.{op}: {name} is on {t.device} but input is on {input.device}",
        )


# ---- fake implementations ---------------------------------------------------


@torch.library.register_fake(_lib + "rms_norm")
def _rms_norm_fake(input, normalized_shape, weight=None, eps=None, mode=None, zero_centered_gamma=False):
    check_mode(mode, "rms_norm")
    _check_shape("rms_norm", input, normalized_shape)
    _check_devices("rms_norm", input, weight=weight)
    lead = _lead_shape(input, normalized_shape)
    return _empty_like(input), input.new_empty(lead, dtype=_stat_dtype(input))


@torch.library.register_fake(_lib + "add_rms_norm")
def _add_rms_norm_fake(input, residual, normalized_shape, weight=None, eps=None, mode=None, zero_centered_gamma=False):
    check_mode(mode, "add_rms_norm")
    _check_shape("add_rms_norm", input, normalized_shape)
    _check_devices("add_rms_norm", input, residual=residual, weight=weight)
    lead = _lead_shape(input, normalized_shape)
    return _empty_like(input), _empty_like(input), input.new_empty(lead, dtype=_stat_dtype(input))


@torch.library.register_fake(_lib + "rms_norm_backward")
def _rms_norm_backward_fake(
    grad_out, input, rstd, weight, normalized_shape, zero_centered_gamma, weight_grad, grad_h=None
):
    _check_devices("rms_norm_backward", input, grad_out=grad_out, rstd=rstd, weight=weight, grad_h=grad_h)
    dw = weight.new_empty(weight.shape) if (weight_grad and weight is not None) else input.new_empty((0,))
    return _empty_like(input), dw


@torch.library.register_fake(_lib + "layer_norm")
def _layer_norm_fake(input, normalized_shape, weight=None, bias=None, eps=1e-5, mode=None, zero_centered_gamma=False):
    check_mode(mode, "layer_norm")
    _check_shape("layer_norm", input, normalized_shape)
    _check_devices("layer_norm", input, weight=weight, bias=bias)
    lead = _lead_shape(input, normalized_shape)
    stat = input.new_empty(lead, dtype=_stat_dtype(input))
    return _empty_like(input), stat, input.new_empty(lead, dtype=_stat_dtype(input))


@torch.library.register_fake(_lib + "layer_norm_backward")
def _layer_norm_backward_fake(
    grad_out, input, mean, rstd, weight, bias, normalized_shape, zero_centered_gamma, weight_grad, bias_grad
):
    _check_devices("layer_norm_backward", input, grad_out=grad_out, mean=mean, rstd=rstd, weight=weight, bias=bias)
    dw = weight.new_empty(weight.shape) if (weight_grad and weight is not None) else input.new_empty((0,))
    db = bias.new_empty(bias.shape) if (bias_grad and bias is not None) else input.new_empty((0,))
    return _empty_like(input), dw, db


# Autograd for rms_norm, add_rms_norm and layer_norm is registered in C++
# (csrc/ops/norm_autograd.cpp): a Python wrapper would dominate small shapes.
