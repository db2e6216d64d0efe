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
from .quantized import BLOCK_SCALE_DTYPE, BLOCK_SIZE, RECIPE_DTYPES

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


# c10's names of dtypes, as the C++ checks print them.
_C10_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
}


def _c10_name(dtype):
    name = str(dtype).removeprefix("torch.")
    return _C10_NAMES.get(dtype, name[:1].upper() + name[1:])


def _check_norm_quant_py(
    input, residual, normalized_shape, weight, bias, eps, norm, recipe, out_dtype, scale, scale_layout, mode
):
    """norm_quant's argument check (csrc/ops/norm/quant_op.cpp, quant.cpp) for
    tracing, where the extension binds none: the same rules in the same order,
    with the same messages. A CPU scale's value is the real op's to check."""
    op = "rtcnorm.norm_quant: "
    if norm not in ("rms_norm", "layer_norm"):
        raise ValueError(f"{op}norm must be 'rms_norm' or 'layer_norm', got '{norm}'")
    if residual is not None and norm != "rms_norm":
        raise ValueError(f"{op}residual is only taken with norm='rms_norm' (add_rms_norm)")
    if bias is not None and norm != "layer_norm":
        raise ValueError(f"{op}bias is only taken with norm='layer_norm'")
    base = "add_rms_norm" if residual is not None else norm
    _C._check_norm_forward(base, input, residual, normalized_shape, weight, bias, eps, mode)
    if input.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(
            f"{op}input must be float32, float16 or bfloat16 for a quantized output, got {_c10_name(input.dtype)}"
        )
    if recipe not in RECIPE_DTYPES:
        raise ValueError(f"{op}recipe must be one of {', '.join(map(repr, RECIPE_DTYPES))}, got '{recipe}'")
    allowed = RECIPE_DTYPES[recipe]
    if out_dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise ValueError(f"{op}out_dtype must be {names} for recipe '{recipe}', got {_c10_name(out_dtype)}")
    if scale_layout == "blocked":
        if recipe not in BLOCK_SIZE:
            raise ValueError(f"{op}scale_layout 'blocked' is for the block recipes 'mxfp8' and 'nvfp4', not '{recipe}'")
    elif scale_layout != "plain":
        raise ValueError(f"{op}scale_layout must be 'plain' or 'blocked', got '{scale_layout}'")
    if recipe not in ("per_tensor", "nvfp4"):
        if scale is not None:
            raise ValueError(f"{op}scale must be None for recipe '{recipe}' (its scales come from the data)")
        return
    if scale is None:
        what = "the global encode scale" if recipe == "nvfp4" else "the quantize multiplier"
        raise ValueError(f"{op}scale ({what}) is required for recipe '{recipe}'")
    if scale.numel() != 1 or scale.dtype != torch.float32:
        raise ValueError(
            f"{op}scale must be a float32 tensor of one element, got {_c10_name(scale.dtype)} of shape {list(scale.shape)}"
        )
    if scale.device.type != "cpu" and scale.device != input.device:
        raise ValueError(f"{op}scale must be on the CPU or on input's device {input.device}, got {scale.device}")


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
    # The extension's own check where it binds one (same arguments), else the Python twin.
    check = getattr(_C, "_check_norm_quant", _check_norm_quant_py)
    check(input, residual, normalized_shape, weight, bias, eps, norm, recipe, out_dtype, scale, scale_layout, mode)
    lead = _lead_shape(input, normalized_shape)
    n = functools.reduce(operator.mul, normalized_shape, 1)
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
    h = _empty_like(input) if residual is not None else input.new_empty((0,))
    mean = input.new_empty(lead if norm == "layer_norm" else (0,), dtype=f32)
    return data, scales, amax, h, mean, input.new_empty(lead, dtype=f32)
