"""Fake (meta) implementations of the torch.ops.rtcnorm norm ops.

Schemas are defined in C++ (csrc/registration.cpp). Each fake impl first runs
the real impls' own argument check (``_C._check_norm_*``, from
csrc/ops/norm_checks.cpp), so torch.compile and export refuse a bad call while
tracing, with the message the op itself gives: dtypes (float32, float16 and
bfloat16; float64 too on CPU), shapes, devices, eps and mode. Symbolic sizes
are checked the way ``torch._check`` checks them, and limits only where a
size is known. Then it returns outputs with the real ones' shapes, dtypes and
(contiguous) strides, so the ops trace without graph breaks.
"""

import functools
import operator

import torch

from . import _C
from .quantized import BLOCK_SCALE_DTYPE, BLOCK_SIZE

_lib = "rtcnorm::"


def _lead_shape(input, normalized_shape):
    return input.shape[: input.dim() - len(normalized_shape)]


def _stat_dtype(input):
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def _empty_like(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _grad_like(param, wanted, input):
    # A gradient not asked for is an empty tensor of input's dtype.
    return param.new_empty(param.shape) if (wanted and param is not None) else input.new_empty((0,))


# ---- fake implementations ---------------------------------------------------


@torch.library.register_fake(_lib + "rms_norm")
def _rms_norm_fake(input, normalized_shape, weight=None, eps=None, mode=None, zero_centered_gamma=False):
    _C._check_norm_forward("rms_norm", input, None, normalized_shape, weight, None, eps, mode)
    lead = _lead_shape(input, normalized_shape)
    return _empty_like(input), input.new_empty(lead, dtype=_stat_dtype(input))


@torch.library.register_fake(_lib + "add_rms_norm")
def _add_rms_norm_fake(input, residual, normalized_shape, weight=None, eps=None, mode=None, zero_centered_gamma=False):
    _C._check_norm_forward("add_rms_norm", input, residual, normalized_shape, weight, None, eps, mode)
    lead = _lead_shape(input, normalized_shape)
    return _empty_like(input), _empty_like(input), input.new_empty(lead, dtype=_stat_dtype(input))


@torch.library.register_fake(_lib + "rms_norm_backward")
def _rms_norm_backward_fake(
    grad_out, input, rstd, weight, normalized_shape, zero_centered_gamma, weight_grad, grad_h=None
):
    _C._check_norm_backward("rms_norm_backward", grad_out, input, None, rstd, weight, None, normalized_shape, grad_h)
    return _empty_like(input), _grad_like(weight, weight_grad, input)


@torch.library.register_fake(_lib + "layer_norm")
def _layer_norm_fake(input, normalized_shape, weight=None, bias=None, eps=1e-5, mode=None, zero_centered_gamma=False):
    _C._check_norm_forward("layer_norm", input, None, normalized_shape, weight, bias, eps, mode)
    lead = _lead_shape(input, normalized_shape)
    stat = input.new_empty(lead, dtype=_stat_dtype(input))
    return _empty_like(input), stat, input.new_empty(lead, dtype=_stat_dtype(input))


@torch.library.register_fake(_lib + "layer_norm_backward")
def _layer_norm_backward_fake(
    grad_out, input, mean, rstd, weight, bias, normalized_shape, zero_centered_gamma, weight_grad, bias_grad
):
    _C._check_norm_backward("layer_norm_backward", grad_out, input, mean, rstd, weight, bias, normalized_shape, None)
    return _empty_like(input), _grad_like(weight, weight_grad, input), _grad_like(bias, bias_grad, input)


# Autograd for rms_norm, add_rms_norm and layer_norm is registered in C++
# (csrc/ops/norm_autograd.cpp): a Python wrapper would dominate small shapes.


# ---- norm_quant ----------------------------------------------------------------
# Its autograd is not registered on the op: rtcnorm.rms_norm / layer_norm with
# quant= wrap it in a Function (_norm_quant.py) whose output is a QuantizedTensor.


@torch.library.register_fake(_lib + "norm_quant")
def _norm_quant_fake(
    input,
    residual,
    normalized_shape,
    weight,
    bias,
    eps,
    norm,
    recipe,
    out_dtype,
    scale=None,
    scale_layout="plain",
    zero_centered_gamma=False,
    mode=None,
):
    _C._check_norm_quant(
        input, residual, normalized_shape, weight, bias, eps, norm, recipe, out_dtype, scale, scale_layout, mode
    )
    lead = _lead_shape(input, normalized_shape)
    n = functools.reduce(operator.mul, normalized_shape, 1)
    data, scales, amax = quant_outputs_fake(input, lead, n, recipe, out_dtype, scale_layout)
    f32 = torch.float32
    h = _empty_like(input) if residual is not None else input.new_empty((0,))
    mean = input.new_empty(lead if norm == "layer_norm" else (0,), dtype=f32)
    return data, scales, amax, h, mean, input.new_empty(lead, dtype=f32)


def quant_outputs_fake(input, lead, n, recipe, out_dtype, scale_layout):
    """(data, scales, amax) of a quantized output over rows ``lead`` of ``n``
    elements, as ops/norm/quant.cpp's quant_outputs allocates them."""
    rows = functools.reduce(operator.mul, lead, 1)
    f32 = torch.float32
    if recipe == "nvfp4":
        data = input.new_empty((*lead, (n + 1) // 2), dtype=out_dtype)
    else:
        data = input.new_empty(input.shape, dtype=out_dtype)
    if recipe == "per_tensor":
        scales = input.new_empty((), dtype=f32)
    elif recipe == "per_token":
        scales = input.new_empty((*lead, 1), dtype=f32)
    else:
        block, sdtype = BLOCK_SIZE[recipe], BLOCK_SCALE_DTYPE[recipe]
        blocks = (n + block - 1) // block
        if scale_layout == "plain":
            scales = input.new_empty((*lead, blocks), dtype=sdtype)
        else:
            scales = input.new_empty((((rows + 127) // 128) * 128 * (((blocks + 3) // 4) * 4),), dtype=sdtype)
    amax = input.new_empty(() if recipe in ("per_tensor", "nvfp4") else (0,), dtype=f32)
    return data, scales, amax
