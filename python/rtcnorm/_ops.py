"""Fake (meta) implementations and autograd for the torch.ops.rtcnorm ops.

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
        lambda: f"rtcnorm.{op}: normalized_shape {list(normalized_shape)} must match the trailing dims of input, "
        f"got input of shape {list(input.shape)}",
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
def _add_rms_norm_fake(
    input, residual, normalized_shape, weight=None, eps=None, mode=None, zero_centered_gamma=False
):
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
def _layer_norm_fake(
    input, normalized_shape, weight=None, bias=None, eps=1e-5, mode=None, zero_centered_gamma=False
):
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


# ---- autograd ---------------------------------------------------------------


def _rms_norm_setup(ctx, inputs, output):
    input, normalized_shape, weight, _eps, _mode, zero_centered_gamma = inputs
    ctx.save_for_backward(input, weight, output[1])
    ctx.normalized_shape = list(normalized_shape)
    ctx.zero_centered_gamma = zero_centered_gamma


def _rms_norm_backward(ctx, grad_y, _grad_rstd):
    input, weight, rstd = ctx.saved_tensors
    need_w = weight is not None and ctx.needs_input_grad[2]
    dx, dw = torch.ops.rtcnorm.rms_norm_backward(
        grad_y, input, rstd, weight, ctx.normalized_shape, ctx.zero_centered_gamma, need_w
    )
    return dx, None, dw if need_w else None, None, None, None


torch.library.register_autograd(_lib + "rms_norm", _rms_norm_backward, setup_context=_rms_norm_setup)


def _add_rms_norm_setup(ctx, inputs, output):
    _input, _residual, normalized_shape, weight, _eps, _mode, zero_centered_gamma = inputs
    ctx.save_for_backward(output[1], weight, output[2])
    ctx.normalized_shape = list(normalized_shape)
    ctx.zero_centered_gamma = zero_centered_gamma


def _add_rms_norm_backward(ctx, grad_y, grad_h, _grad_rstd):
    h, weight, rstd = ctx.saved_tensors
    need_w = weight is not None and ctx.needs_input_grad[3]
    dh, dw = torch.ops.rtcnorm.rms_norm_backward(
        grad_y, h, rstd, weight, ctx.normalized_shape, ctx.zero_centered_gamma, need_w, grad_h
    )
    return dh, dh, None, dw if need_w else None, None, None, None


torch.library.register_autograd(_lib + "add_rms_norm", _add_rms_norm_backward, setup_context=_add_rms_norm_setup)


def _layer_norm_setup(ctx, inputs, output):
    input, normalized_shape, weight, bias, _eps, _mode, zero_centered_gamma = inputs
    ctx.save_for_backward(input, weight, bias, output[1], output[2])
    ctx.normalized_shape = list(normalized_shape)
    ctx.zero_centered_gamma = zero_centered_gamma


def _layer_norm_backward(ctx, grad_y, _grad_mean, _grad_rstd):
    input, weight, bias, mean, rstd = ctx.saved_tensors
    need_w = weight is not None and ctx.needs_input_grad[2]
    need_b = bias is not None and ctx.needs_input_grad[3]
    dx, dw, db = torch.ops.rtcnorm.layer_norm_backward(
        grad_y, input, mean, rstd, weight, bias, ctx.normalized_shape, ctx.zero_centered_gamma, need_w, need_b
    )
    return dx, None, dw if need_w else None, db if need_b else None, None, None, None


torch.library.register_autograd(_lib + "layer_norm", _layer_norm_backward, setup_context=_layer_norm_setup)
