"""rtcnorm.RMSNorm and rtcnorm.LayerNorm as drop-ins for the torch modules,
and the ops' autograd graph: a call that needs no gradient builds no node."""

from __future__ import annotations

import copy

import pytest
import rtcnorm
import torch
import torch.autograd.forward_ad as fwad
from norm_checks import (
    randn,
    randomize,
)
from reference import assert_close

PAIRS = {"rms_norm": (torch.nn.RMSNorm, rtcnorm.RMSNorm), "layer_norm": (torch.nn.LayerNorm, rtcnorm.LayerNorm)}


CONFIGS = {
    "rms_norm": [dict(eps=None), dict(eps=1e-3), dict(elementwise_affine=False)],
    "layer_norm": [dict(), dict(eps=1e-3, bias=False), dict(elementwise_affine=False)],
}


def _cases():
    return [pytest.param(op, cfg, id=f"{op}-{cfg}") for op in PAIRS for cfg in CONFIGS[op]]


@pytest.mark.parametrize(("op", "cfg"), _cases())
def test_parameters_and_state_dict_interchange_with_torch(op, cfg):
    torch_cls, ours_cls = PAIRS[op]
    theirs, ours = randomize(torch_cls((6, 16), **cfg)), ours_cls((6, 16), **cfg)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert ours.normalized_shape == theirs.normalized_shape == (6, 16)
    assert ours.eps == theirs.eps and ours.elementwise_affine == theirs.elementwise_affine
    ours.load_state_dict(theirs.state_dict())
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(a, b), name
    randomize(ours)
    theirs.load_state_dict(ours.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("op", "cfg"), _cases())
def test_outputs_and_grads_match_torch_modules(op, cfg, dtype):
    torch_cls, ours_cls = PAIRS[op]
    theirs = randomize(torch_cls(64, dtype=dtype, **cfg))
    ours = ours_cls.from_torch(theirs, mode="multi_wave_cached")
    # The float64 twin of the torch module, with the eps the low-precision module uses.
    twin = copy.deepcopy(theirs).double()
    if twin.eps is None:
        twin.eps = torch.finfo(dtype).eps
    x = randn((3, 5, 64), dtype, "cpu").requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y, ref = ours(x), twin(x64)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref.backward(dy.double())
    assert_close(y, ref, what="y")
    assert_close(x.grad, x64.grad, what="dx")
    for (name, p), (_, q) in zip(ours.named_parameters(), twin.named_parameters()):
        assert p.dtype == dtype
        assert_close(p.grad, q.grad, what=f"d{name}", reduce_len=15)


@pytest.mark.parametrize("op", list(PAIRS))
def test_from_torch_copies_everything_and_repr_shows_the_mode(op):
    torch_cls, ours_cls = PAIRS[op]
    theirs = randomize(torch_cls(32, eps=1e-4, dtype=torch.bfloat16))
    ours = ours_cls.from_torch(theirs, mode="static_persistent")
    assert ours.eps == 1e-4 and ours.mode == "static_persistent"
    assert ours.weight.dtype == torch.bfloat16 and torch.equal(ours.weight, theirs.weight)
    assert ours.weight.data_ptr() != theirs.weight.data_ptr()
    assert "mode=static_persistent" in repr(ours) and "eps=0.0001" in repr(ours)
    assert "mode=None" in repr(ours_cls(32))
    with pytest.raises(ValueError, match="mode must be None, 'static_persistent'"):
        ours_cls(32, mode="persistent")


def test_layer_norm_without_bias_and_without_affine():
    assert rtcnorm.LayerNorm(8, bias=False).bias is None
    plain = rtcnorm.LayerNorm(8, elementwise_affine=False)
    assert plain.weight is None and plain.bias is None and not list(plain.parameters())
    x = torch.randn(4, 8)
    assert_close(plain(x), torch.nn.functional.layer_norm(x.double(), [8]), what="y")


@pytest.mark.parametrize("op", list(PAIRS))
def test_zero_centered_gamma_starts_at_identity_scale(op):
    _, ours_cls = PAIRS[op]
    zc, plain = ours_cls(48, zero_centered_gamma=True), ours_cls(48)
    assert torch.equal(zc.weight, torch.zeros(48)) and torch.equal(plain.weight, torch.ones(48))
    assert "zero_centered_gamma=True" in repr(zc)
    x = torch.randn(5, 48)
    assert torch.equal(zc(x), plain(x))


def test_rms_norm_module_with_residual_returns_the_sum():
    module = randomize(rtcnorm.RMSNorm(32))
    x, r = torch.randn(4, 32), torch.randn(4, 32)
    y, h = module(x, r)
    assert torch.equal(h, x + r)
    assert torch.equal(y, module(x + r))


def _graph_cases():
    """name -> (fn(x, w, b, r), the (x, w, b, r) it is called with, the indices it reads)."""
    args = tuple(randn(s, torch.float32, "cpu") for s in ((4, 5, 32), (32,), (32,), (4, 5, 32)))
    mask = torch.rand(4, 1, 32) > 0.5
    return {
        "rms_norm": (lambda x, w, b, r: rtcnorm.rms_norm(x, 32, w), args, {0, 1}),
        "add_rms_norm": (lambda x, w, b, r: rtcnorm.rms_norm(x, 32, w, residual=r)[0], args, {0, 1, 3}),
        "layer_norm": (lambda x, w, b, r: rtcnorm.layer_norm(x, 32, w, b), args, {0, 1, 2}),
        "scaled_softmax": (lambda x, w, b, r: rtcnorm.scaled_softmax(x, 0.5), args, {0}),
        "masked": (lambda x, w, b, r: rtcnorm.scaled_masked_softmax(x, mask, 0.5), args, {0}),
        "causal": (lambda x, w, b, r: rtcnorm.scaled_upper_triang_masked_softmax(x[:, :, :5], 0.5), args, {0}),
        "aligned": (lambda x, w, b, r: rtcnorm.scaled_aligned_causal_masked_softmax(x, 0.5), args, {0}),
    }


@pytest.mark.parametrize("case", list(_graph_cases()))
def test_calls_that_need_no_graph_build_no_node(case):
    """Under no_grad, or when no argument requires grad, an op runs below
    autograd (no node is built), with outputs bitwise those of the recorded
    call. Any one tensor argument that requires grad (the weight, bias or
    residual alone too) records a node; a forward-mode tangent is still refused."""
    fn, args, reads = _graph_cases()[case]
    plain = fn(*args)
    assert plain.grad_fn is None and not plain.requires_grad
    for i in range(len(args)):
        leaves = [a.clone().requires_grad_(j == i) for j, a in enumerate(args)]
        recorded = fn(*leaves)
        assert (recorded.grad_fn is not None) == (i in reads), (case, i)
        with torch.no_grad():
            unrecorded = fn(*leaves)
        assert unrecorded.grad_fn is None and not unrecorded.requires_grad
        assert torch.equal(unrecorded, recorded.detach()) and torch.equal(unrecorded, plain)
    with fwad.dual_level(), torch.no_grad():
        dual = fwad.make_dual(args[0], torch.ones_like(args[0]))
        with pytest.raises(RuntimeError, match="jvp is not implemented"):
            fn(dual, *args[1:])
