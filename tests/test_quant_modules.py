"""quant= on the rtcnorm.RMSNorm / LayerNorm modules (CPU): the same codes as
the functional form, straight-through gradients, the state_dict unchanged."""

from __future__ import annotations

import pytest
import rtcnorm
import torch


@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm"])
def test_module_quant_matches_functional_and_trains(cls):
    torch.manual_seed(11)
    quant = rtcnorm.Quant("mxfp8", layout="blocked")
    mod = getattr(rtcnorm, cls)(96, quant=quant)
    with torch.no_grad():
        mod.weight.normal_()
    x = torch.randn(5, 96, requires_grad=True)
    out = mod(x)
    assert isinstance(out, rtcnorm.QuantizedTensor) and "quant=" in repr(mod)
    fn = rtcnorm.rms_norm if cls == "RMSNorm" else rtcnorm.layer_norm
    args = (x, 96, mod.weight) if cls == "RMSNorm" else (x, 96, mod.weight, mod.bias)
    ref = fn(*args, quant=quant)
    assert torch.equal(out.qdata.view(torch.uint8), ref.qdata.view(torch.uint8))
    assert torch.equal(out.scale.view(torch.uint8), ref.scale.view(torch.uint8))
    # Straight through: the gradient of the dequantized output reaches x and
    # the weight as the unquantized module's does.
    dy = torch.randn(5, 96)
    out.dequantize().backward(dy)
    plain = getattr(rtcnorm, cls)(96)
    plain.load_state_dict(mod.state_dict())
    xp = x.detach().clone().requires_grad_()
    plain(xp).backward(dy)
    torch.testing.assert_close(x.grad, xp.grad)
    torch.testing.assert_close(mod.weight.grad, plain.weight.grad)
    assert set(mod.state_dict()) == set(plain.state_dict())


def test_module_quant_with_residual_and_switched_off():
    torch.manual_seed(12)
    mod = rtcnorm.RMSNorm(64, quant=rtcnorm.Quant("per_token"))
    x, r = torch.randn(3, 64), torch.randn(3, 64)
    q, h = mod(x, r)
    assert isinstance(q, rtcnorm.QuantizedTensor) and torch.equal(h, x + r)
    mod.quant = None
    y, h2 = mod(x, r)
    assert type(y) is torch.Tensor and torch.equal(h2, h)


@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm"])
def test_module_quant_must_be_a_quant(cls):
    with pytest.raises(TypeError, match=rf"rtcnorm\.{cls}: quant must be an rtcnorm\.Quant or None, got str"):
        getattr(rtcnorm, cls)(8, quant="mxfp8")
    mod = getattr(rtcnorm, cls)(8)
    mod.quant = "per_token"
    with pytest.raises(TypeError, match=rf"rtcnorm\.{cls}: quant must be an rtcnorm\.Quant"):
        mod(torch.randn(2, 8))
