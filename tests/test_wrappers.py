"""The Python wrappers: thin calls of the ops, and their argument errors.

rtcnorm.rms_norm / layer_norm and the modules call the op overloads bound
at import; these tests hold them to the raw op's results and to clear
errors for a normalized_shape that is not an int or a sequence of ints.
"""

from __future__ import annotations

import numpy as np
import pytest
import rtcnorm
import torch
from norm_checks import randn

OPS = ("rms_norm", "layer_norm")


def _raw(op, x, shape, w):
    if op == "rms_norm":
        return torch.ops.rtcnorm.rms_norm(x, shape, w, None, None, False)[0]
    return torch.ops.rtcnorm.layer_norm(x, shape, w, None, 1e-5, None, False)[0]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "normalized_shape",
    [16, (16,), [16], torch.Size([16]), np.int64(16), [np.int64(16)], (4, 16)],
    ids=["int", "tuple", "list", "size", "numpy-int", "list-of-numpy-int", "two-dims"],
)
def test_every_spelling_of_normalized_shape_gives_the_raw_ops_result(op, normalized_shape):
    x = randn((3, 4, 16), torch.float32, "cpu")
    shape = [int(s) for s in np.atleast_1d(np.asarray(normalized_shape))]
    w = randn(shape, torch.float32, "cpu", scale=0.5, shift=1.0)
    got = getattr(rtcnorm, op)(x, normalized_shape, w)
    assert torch.equal(got, _raw(op, x, shape, w))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [[8.5], 8.5, [8.0], (8, 2.5), "8", None], ids=repr)
def test_a_non_integer_normalized_shape_is_a_type_error_naming_it(op, bad):
    x = randn((2, 8), torch.float32, "cpu")
    with pytest.raises(TypeError, match=rf"rtcnorm\.{op}: normalized_shape must be an int or a sequence of ints"):
        getattr(rtcnorm, op)(x, bad)


@pytest.mark.parametrize("cls", [rtcnorm.RMSNorm, rtcnorm.LayerNorm])
@pytest.mark.parametrize("bad", [[8.5], 8.5, "8"], ids=repr)
def test_modules_refuse_a_non_integer_normalized_shape(cls, bad):
    with pytest.raises(TypeError, match=rf"rtcnorm\.{cls.__name__}: normalized_shape must be an int"):
        cls(bad)


def test_a_shape_mismatch_keeps_the_ops_own_error():
    """Errors that are not about the shape's type pass through unchanged."""
    x = randn((2, 8), torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"rtcnorm\.rms_norm: normalized_shape \[4\] must match"):
        rtcnorm.rms_norm(x, [4])
    with pytest.raises(ValueError, match=r"rtcnorm\.layer_norm: normalized_shape \[4\] must match"):
        rtcnorm.layer_norm(x, 4)


@pytest.mark.parametrize("op", OPS)
def test_a_bad_mode_is_a_value_error_naming_the_op(op):
    x = randn((2, 8), torch.float32, "cpu")
    for mode in ("fast", 3, ["static_persistent"]):
        with pytest.raises(ValueError, match=rf"rtcnorm\.{op}: mode must be None"):
            getattr(rtcnorm, op)(x, 8, mode=mode)


def test_modules_match_the_functional_forms_with_a_residual():
    x, r = randn((5, 32), torch.float32, "cpu"), randn((5, 32), torch.float32, "cpu")
    rms = rtcnorm.RMSNorm(32, eps=1e-6, zero_centered_gamma=True)
    torch.nn.init.normal_(rms.weight, std=0.3)
    y, h = rms(x, r)
    ey, eh = rtcnorm.rms_norm(x, 32, rms.weight, 1e-6, zero_centered_gamma=True, residual=r)
    assert torch.equal(y, ey) and torch.equal(h, eh)
    ln = rtcnorm.LayerNorm(32, eps=1e-3)
    torch.nn.init.normal_(ln.bias, std=0.3)
    assert torch.equal(ln(x), rtcnorm.layer_norm(x, 32, ln.weight, ln.bias, 1e-3))
