"""Fake (meta) implementations of the softmax ops.

Schemas are defined in C++ (csrc/registration.cpp). The fake implementations
check what can be checked from shapes and dtypes (with ``torch._check``, so
symbolic sizes trace) and return a contiguous tensor like the real ones.

Autograd (in C++) saves only the output: ``dx = scale * y * (dy - sum(dy * y))``
needs neither the input nor the mask. The backward op is not differentiable
itself (no double backward).
"""

import torch

_lib = "rtcnorm::"
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_input(op, input, causal):
    torch._check(
        input.dtype in _FLOAT_DTYPES,
        lambda: f"rtcnorm.{op}: input must be float16, bfloat16 or float32 (float64 on CPU), got {input.dtype}",
    )
    if causal:
        torch._check(
            input.dim() >= 2,
            lambda: f"rtcnorm.{op}: input must have at least 2 dims (..., sq, sk), got shape {list(input.shape)}",
        )
    else:
        torch._check(input.dim() >= 1, lambda: f"rtcnorm.{op}: input must have at least 1 dim, got a 0-dim tensor")


def _contiguous_like(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.register_fake(_lib + "scaled_softmax")
def _scaled_softmax_fake(input, scale=1.0):
    _check_input("scaled_softmax", input, causal=False)
    return _contiguous_like(input)


@torch.library.register_fake(_lib + "scaled_masked_softmax")
def _scaled_masked_softmax_fake(input, mask, scale=1.0):
    op = "scaled_masked_softmax"
    _check_input(op, input, causal=False)
    torch._check(
        mask.dtype == torch.bool,
        lambda: f"rtcnorm.{op}: mask must be a bool tensor (True = masked out), got {mask.dtype}",
    )
    torch._check(
        mask.dim() <= input.dim(),
        lambda: (
            f"rtcnorm.{op}: mask of shape {list(mask.shape)} is not broadcastable to input of shape {list(input.shape)}"
        ),
    )
    for i in range(1, mask.dim() + 1):
        torch._check(
            (mask.shape[-i] == 1) | (mask.shape[-i] == input.shape[-i]),
            lambda: (
                f"rtcnorm.{op}: mask of shape {list(mask.shape)} is not broadcastable to input of shape "
                f"{list(input.shape)}"
            ),
        )
    return _contiguous_like(input)


@torch.library.register_fake(_lib + "scaled_upper_triang_masked_softmax")
def _scaled_upper_triang_masked_softmax_fake(input, scale=1.0):
    op = "scaled_upper_triang_masked_softmax"
    _check_input(op, input, causal=True)
    torch._check(
        input.shape[-2] == input.shape[-1],
        lambda: f"rtcnorm.{op}: needs sq == sk (the last two dims), got shape {list(input.shape)}",
    )
    return _contiguous_like(input)


@torch.library.register_fake(_lib + "scaled_aligned_causal_masked_softmax")
def _scaled_aligned_causal_masked_softmax_fake(input, scale=1.0):
    op = "scaled_aligned_causal_masked_softmax"
    _check_input(op, input, causal=True)
    torch._check(
        input.shape[-2] <= input.shape[-1],
        lambda: f"rtcnorm.{op}: needs sq <= sk (the last two dims), got shape {list(input.shape)}",
    )
    return _contiguous_like(input)


@torch.library.register_fake(_lib + "scaled_softmax_backward")
def _scaled_softmax_backward_fake(grad_output, output, scale, causal=False):
    torch._check(
        grad_output.shape == output.shape,
        lambda: (
            f"rtcnorm.scaled_softmax_backward: grad_output must have output's shape {list(output.shape)}, "
            f"got {list(grad_output.shape)}"
        ),
    )
    return _contiguous_like(output)


# Autograd for the four softmax ops is registered in C++
# (csrc/ops/softmax_autograd.cpp): a Python wrapper would add host time per call.
