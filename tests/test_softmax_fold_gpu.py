"""Folded logits of the cached softmax forward (marked ``gpu``).

Cached rows rewrite x once: the scale's sign moves into x, masked elements
and keys past a causal diagonal become -inf, and the max pass compares raw
values (softmax/fold.cuh). These tests hold every cached design to the
reference for scales of both signs and zero, and check that non-finite values
keep torch's semantics: ignored where masked, NaN rows where ``x * scale`` is
NaN or +inf meets +inf.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning
from softmax_reference import DTYPES, check_op, random_input, random_mask, reference_softmax

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SCALES = (-1.3, -0.37, 0.0, 0.37, 2.5)

# design -> (input shape, mask shape, knobs): a problem each design takes when forced.
CASES = {
    "rows": ((2, 4, 33, 1000), (2, 1, 33, 1000), {}),
    "mask_reuse": ((1, 8, 40, 2048), (1, 1, 40, 2048), {"reuse_run": 3}),
    "few_rows": ((1, 1, 4, 3000), (1, 1, 4, 3000), {}),
    "cluster_rows": ((1, 1, 8, 32768), (1, 1, 8, 32768), {}),
}


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("design", sorted(CASES))
@pytest.mark.parametrize("op", ["scaled_softmax", "scaled_masked_softmax", "scaled_aligned_causal_masked_softmax"])
def test_gpu_scales_of_every_sign(op, design, dtype, scale):
    shape, mask_shape, knobs = CASES[design]
    masked = op == "scaled_masked_softmax"
    if design == "mask_reuse" and not masked:
        pytest.skip("mask_reuse takes masked rows only")
    x = random_input(shape, dtype, "cuda", seed=31)
    mask = None
    if masked:
        mask = random_mask(mask_shape, "cuda", seed=31, p=0.4)
        mask[..., 1, :] = True  # a fully masked row
    with _tuning.softmax_override(design=design, **knobs):
        plan = rtcnorm.softmax.explain(op, shape, dtype, mask_shape=mask_shape if masked else None)["forward"]
        if plan["design"] != design:
            pytest.skip(f"{design} does not take {op} {shape} here")
        check_op(op, x, mask, scale=scale)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("sk", [130, 1000, 4099])  # diagonals inside every vector position
def test_gpu_causal_scales_of_every_sign(sk, scale):
    x = random_input((1, 2, sk, sk), torch.bfloat16, "cuda", seed=sk)
    check_op("scaled_upper_triang_masked_softmax", x, None, scale=scale)


def nan_rows(y: torch.Tensor) -> torch.Tensor:
    return torch.isnan(y).any(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale", [-0.5, 0.0, 0.5])
def test_gpu_non_finite_values_keep_torch_semantics(dtype, scale):
    """Row 0: inf and NaN only where masked (ignored). Row 1: +inf visible.
    Row 2: -inf visible. Row 3: NaN visible. Row 4: ordinary."""
    n = 1000
    x = random_input((5, n), dtype, "cuda", seed=41)
    mask = torch.zeros(5, n, dtype=torch.bool, device="cuda")
    mask[0, 3:6] = True
    x[0, 3], x[0, 4], x[0, 5] = float("inf"), float("-inf"), float("nan")
    x[1, 10] = float("inf")
    x[2, 20] = float("-inf")
    x[3, 30] = float("nan")
    ref = reference_softmax(x, scale, mask)
    y = rtcnorm.scaled_masked_softmax(x, mask, scale)
    assert torch.equal(nan_rows(y), nan_rows(ref)), (nan_rows(y), nan_rows(ref))
    ok = ~nan_rows(ref)
    torch.testing.assert_close(y[ok].float(), ref[ok].to(y.dtype).float(), atol=2e-3, rtol=1e-2)
    plain = rtcnorm.scaled_softmax(x[1:], scale)
    assert torch.equal(nan_rows(plain), nan_rows(reference_softmax(x[1:], scale)))
