"""Fake (meta) implementations of the softmax ops.

Schemas are defined in C++ (csrc/registration.cpp). Each fake impl first runs
the real impls' own argument check (``_C._check_softmax_*``, from
csrc/ops/softmax/softmax_checks.cpp), so torch.compile and export refuse a bad call
while tracing, with the op's own message (symbolic sizes are checked the way
``torch._check`` checks them), then returns a contiguous tensor like the real
ones.

Autograd (in C++) saves only the output: ``dx = scale * y * (dy - sum(dy * y))``
needs neither the input nor the mask. The backward op is not differentiable
itself (no double backward).
"""

import torch

from . import _C

_lib = "rtcnorm::"


def _contiguous_like(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.register_fake(_lib + "scaled_softmax")
def _scaled_softmax_fake(input, scale=1.0):
    _C._check_softmax_forward("scaled_softmax", input, None, scale)
    return _contiguous_like(input)


@torch.library.register_fake(_lib + "scaled_masked_softmax")
def _scaled_masked_softmax_fake(input, mask, scale=1.0):
    _C._check_softmax_forward("scaled_masked_softmax", input, mask, scale)
    return _contiguous_like(input)


@torch.library.register_fake(_lib + "scaled_upper_triang_masked_softmax")
def _scaled_upper_triang_masked_softmax_fake(input, scale=1.0):
    _C._check_softmax_forward("scaled_upper_triang_masked_softmax", input, None, scale)
    return _contiguous_like(input)


@torch.library.register_fake(_lib + "scaled_aligned_causal_masked_softmax")
def _scaled_aligned_causal_masked_softmax_fake(input, scale=1.0):
    _C._check_softmax_forward("scaled_aligned_causal_masked_softmax", input, None, scale)
    return _contiguous_like(input)


@torch.library.register_fake(_lib + "scaled_softmax_backward")
def _scaled_softmax_backward_fake(grad_output, output, scale, causal=False):
    _C._check_softmax_backward(grad_output, output, scale, causal)
    return _contiguous_like(output)


# Autograd for the four softmax ops is registered in C++
# (csrc/ops/softmax/softmax_autograd.cpp): a Python wrapper would add host time per call.
