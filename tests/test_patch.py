"""rtcnorm.patch on torch's norm modules and hand-written look-alikes (CPU).

The Hugging Face families are in test_patch_models.py.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import rtcnorm
import torch
from rtcnorm.patch import PatchSummary, is_patched
from torch import nn


class PlainRMS(nn.Module):
    """Llama's formula under an unrelated name: found by behaviour."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class OffsetRMS(PlainRMS):
    """Scale 1 + weight, multiplied in fp32 (Gemma's order)."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (h * (1.0 + self.weight.float())).type_as(x)


class EpsOutsideRMS(PlainRMS):
    """x / (rms + eps): a different eps placement, visible only on small rows."""

    def forward(self, x):
        return self.weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.variance_epsilon)


class ClampedRMS(PlainRMS):
    """An extra feature rtcnorm does not have."""

    def forward(self, x):
        return super().forward(x).clamp(-1.0, 1.0)


class ResidualRMS(PlainRMS):
    def forward(self, x, residual=None):
        return super().forward(x if residual is None else x + residual)


class BiasLN(nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x):
        return nn.functional.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


def randomize(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return model


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.RMSNorm(96, eps=1e-5),
        lambda: nn.RMSNorm([6, 16]),
        lambda: nn.RMSNorm(96, elementwise_affine=False),
        lambda: nn.LayerNorm(96),
        lambda: nn.LayerNorm(96, bias=False),
        lambda: nn.LayerNorm(96, elementwise_affine=False),
        lambda: nn.LayerNorm([6, 16], eps=1e-3),
        lambda: PlainRMS(96),
        lambda: OffsetRMS(96),
        lambda: BiasLN(96),
    ],
    ids=["rms", "rms2d", "rms_noaffine", "ln", "ln_nobias", "ln_noaffine", "ln2d", "plain", "offset", "biasln"],
)
def test_swapped_module_matches_float64_reference(make):
    module = randomize(make())
    summary = rtcnorm.patch(module)
    assert [s.name for s in summary.swapped] == [""], str(summary)
    assert is_patched(module) and isinstance(module, type(module)._rtcnorm_base)
    x = (torch.randn(3, 5, 96) * torch.rand(3, 5, 1) * 4).reshape(3, 5, *module_shape(module))
    x.requires_grad_(True)
    y = module(x)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *module.parameters()], dy)
    x64 = x.detach().double().requires_grad_(True)
    m64 = copy.deepcopy(module).double()
    rtcnorm.unpatch(m64)
    if isinstance(m64, nn.RMSNorm) and m64.eps is None:
        m64.eps = torch.finfo(torch.float32).eps  # eps=None follows the input's dtype
    y64 = m64(x64)
    grads64 = torch.autograd.grad(y64, [x64, *m64.parameters()], dy.double())
    torch.testing.assert_close(y.double(), y64, atol=1e-5, rtol=2e-5)
    for g, g64 in zip(grads, grads64):
        torch.testing.assert_close(g.double(), g64, atol=1e-4, rtol=1e-4)


def module_shape(module):
    shape = getattr(module, "normalized_shape", None)
    return tuple(shape) if shape is not None else tuple(module.weight.shape)


def test_kinds_found_by_behaviour():
    model = nn.Sequential(PlainRMS(32), OffsetRMS(32), BiasLN(32), nn.Linear(32, 32))
    kinds = {s.name: s.kind for s in rtcnorm.patch(randomize(model)).swapped}
    assert kinds == {"0": "rms_norm", "1": "rms_norm (1 + weight)", "2": "layer_norm"}


@pytest.mark.parametrize(
    "module, reason",
    [
        (EpsOutsideRMS(64), "output as rms_norm differs in torch.float32"),
        (ClampedRMS(64), "matches no RMSNorm / LayerNorm form"),
        (ResidualRMS(64), "forward takes other arguments"),
    ],
    ids=["eps_placement", "clamp", "extra_argument"],
)
def test_different_module_is_skipped_with_reason(module, reason):
    randomize(module)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    summary = rtcnorm.patch(module)
    assert summary.swapped == []
    assert len(summary.skipped) == 1 and reason in summary.skipped[0].reason, str(summary)
    assert summary.skipped[0].cls == type(module).__name__
    assert type(module) is not None and not is_patched(module)
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), "verification must not change the module"


class GainRMS(PlainRMS):
    """Behaviour set by a plain attribute: instances differ though the class is one."""

    def __init__(self, n, gain):
        super().__init__(n)
        self.gain = gain

    def forward(self, x):
        return super().forward(x) * self.gain


def test_each_distinct_instance_is_verified():
    model = nn.Sequential(GainRMS(32, 1.0), GainRMS(32, 2.0), GainRMS(32, 1.0), GainRMS(48, 1.0))
    summary = rtcnorm.patch(randomize(model))
    assert [s.name for s in summary.swapped] == ["0", "2", "3"]
    assert [s.name for s in summary.skipped] == ["1"]


class NoUpcastRMS(PlainRMS):
    """Statistics in the input's dtype: overflows in float16."""

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def test_casting_order_is_judged_in_the_module_dtype():
    # The float32 check passes; the float16 one sees the original overflow.
    assert len(rtcnorm.patch(NoUpcastRMS(64)).swapped) == 1
    summary = rtcnorm.patch(NoUpcastRMS(64).half())
    assert [s.reason for s in summary.skipped] == ["gradient of input of the original is not finite in torch.float16"]


def test_extra_parameter_and_buffer_are_skipped():
    a, b = PlainRMS(16), PlainRMS(16)
    a.gate = nn.Parameter(torch.ones(16))
    b.register_buffer("scale", torch.ones(16))
    summary = rtcnorm.patch(nn.Sequential(a, b))
    reasons = {s.name: s.reason for s in summary.skipped}
    assert "parameters besides weight and bias: ['gate']" in reasons["0"]
    assert "has buffers: ['scale']" in reasons["1"]


def test_batch_and_group_norm_are_not_candidates():
    model = nn.Sequential(nn.BatchNorm1d(8), nn.GroupNorm(2, 8), nn.InstanceNorm1d(8, affine=True))
    state = copy.deepcopy(model.state_dict())
    summary = rtcnorm.patch(model)
    assert summary.swapped == [] and summary.skipped == []
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_kind_switches():
    model = nn.Sequential(nn.RMSNorm(32), nn.LayerNorm(32), PlainRMS(32))
    summary = rtcnorm.patch(model, rms_norm=False)
    assert [s.name for s in summary.swapped] == ["1"]
    assert {s.name: s.reason for s in summary.skipped} == {"0": "rms_norm=False", "2": "rms_norm=False"}
    rtcnorm.unpatch(model)
    summary = rtcnorm.patch(model, layer_norm=False)
    assert [s.name for s in summary.swapped] == ["0", "2"]


def test_low_precision_module_is_verified_in_its_dtype():
    model = randomize(nn.Sequential(PlainRMS(64), OffsetRMS(64), nn.LayerNorm(64))).to(torch.bfloat16)
    summary = rtcnorm.patch(model)
    assert len(summary.swapped) == 3, str(summary)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert model(x).dtype == torch.bfloat16


def test_output_dtype_rule_is_kept():
    # Llama's weight * x.to(input_dtype) with a float32 weight promotes.
    m = randomize(PlainRMS(64))
    plain = copy.deepcopy(m)
    rtcnorm.patch(m)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert m(x).dtype == plain(x).dtype == torch.float32
    torch.testing.assert_close(m(x), plain(x), atol=2e-2, rtol=2e-2)


def test_meta_parameters_are_skipped_unless_unverified():
    with torch.device("meta"):
        model = nn.Sequential(nn.LayerNorm(32), PlainRMS(32))
    summary = rtcnorm.patch(model)
    assert summary.swapped == [] and all("meta device" in s.reason for s in summary.skipped)
    summary = rtcnorm.patch(model, verify=False)
    assert [s.name for s in summary.swapped] == ["0"]


def test_mode_is_checked_and_passed():
    with pytest.raises(ValueError, match=r"rtcnorm.patch: mode must be None"):
        rtcnorm.patch(nn.LayerNorm(8), mode="fast")
    with pytest.raises(TypeError, match=r"rtcnorm.patch: model must be a torch.nn.Module, got list"):
        rtcnorm.patch([nn.LayerNorm(8)])
    m = nn.LayerNorm(64)
    rtcnorm.patch(m, mode="multi_wave_reload")
    assert type(m)._rtcnorm_form.mode == "multi_wave_reload"
    assert "rtcnorm=layer_norm" in repr(m)


def test_pickle_and_deepcopy_keep_the_patch():
    model = randomize(nn.Sequential(nn.LayerNorm(32), PlainRMS(32)))
    rtcnorm.patch(model)
    x = torch.randn(3, 32)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all(is_patched(m) for m in clone)
        torch.testing.assert_close(clone(x), model(x))
        assert rtcnorm.unpatch(clone) == ["0", "1"]
        assert type(clone[0]) is nn.LayerNorm and type(clone[1]) is PlainRMS


def test_optimizer_keeps_training_the_same_parameters():
    model = randomize(nn.Sequential(nn.Linear(32, 32), PlainRMS(32)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rtcnorm.patch(model)
    before = model[1].weight.detach().clone()
    model(torch.randn(4, 32)).square().sum().backward()
    opt.step()
    assert not torch.equal(model[1].weight, before)


def test_summary_text():
    model = nn.Sequential(nn.LayerNorm(16), nn.LayerNorm(16), EpsOutsideRMS(16))
    summary = rtcnorm.patch(randomize(model))
    assert isinstance(summary, PatchSummary)
    text = str(summary)
    assert text.splitlines()[0] == "rtcnorm.patch: 2 swapped, 1 skipped, 0 already patched"
    assert "swapped  LayerNorm as layer_norm: 2 (0, 1)" in text
    assert "skipped  EpsOutsideRMS: 1 (2)" in text and "differs in torch.float32" in text


def test_compile_fullgraph_patched_block():
    model = randomize(nn.Sequential(PlainRMS(64), nn.Linear(64, 64), OffsetRMS(64), nn.LayerNorm(64)))
    rtcnorm.patch(model)
    x = torch.randn(2, 5, 64, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(out, model(x))
    out.sum().backward()
    assert model[0].weight.grad is not None and x.grad is not None
