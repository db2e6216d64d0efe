"""Sliced rows whose vectors the slice count does not divide, forward and
backward (CPU: plans and NVRTC compiles; the GPU comparisons are in
test_norm_designs_gpu.py)."""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_few_long_rows_are_sliced_over_many_sms(op, dtype):
    # 13 rows of 130728: 16341 vectors of 8 (odd), one CTA a row would leave 119 of 132 SMs idle.
    e = rtcnorm.explain(op, (13, 130728), dtype, device="cpu", arch="sm_90", resources=True)
    assert e["design"] == "sliced_row"
    slices = e["knobs"]["slices"]
    assert slices > 1 and (130728 // e["vec"]) % slices != 0
    assert e["grid"] == 13 * slices
    assert e["ptxas"]["spill_stores"] == 0


@pytest.mark.parametrize(
    "arch,n,slices", [("sm_90", 130728, 8), ("sm_90", 130728, 16), ("sm_100", 130728, 8), ("sm_90", 54920, 8)]
)
def test_unequal_slices_compile_without_spills(arch, n, slices):
    for op in ("rms_norm", "layer_norm"):
        with _tuning.norm_override("fwd", "sliced_row", slices=slices):
            e = rtcnorm.explain(op, (5, n), torch.bfloat16, device="cpu", arch=arch, resources=True)
        assert (e["design"], e["knobs"]["slices"]) == ("sliced_row", slices)
        assert (n // e["vec"]) % slices != 0
        assert e["ptxas"]["spill_stores"] == 0 and e["ptxas"]["target"] == arch


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape", [(13, 130728), (239, 19640)])
def test_the_backward_splits_unequally_without_rings_or_spills(op, shape):
    with _tuning.norm_override("bwd", "sliced_row"):
        b = rtcnorm.explain(op, shape, torch.bfloat16, device="cpu", arch="sm_90", resources=True)["backward"]
    assert b["design"] == "sliced_row" and (shape[1] // b["vec"]) % b["knobs"]["slices"] != 0
    assert b["knobs"]["ring_stages"] == 0 and not b["staged"]
    assert b["ptxas"]["spill_stores"] == 0


def test_scalar_rows_are_not_split_unequally():
    # N odd: one element a vector; the per-element bound tests would spill.
    for shape in ((7, 99999), (1416, 112459)):
        e = rtcnorm.explain("rms_norm", shape, torch.bfloat16, device="cpu", arch="sm_90")
        for d in (e, e["backward"]):
            assert d["design"] != "sliced_row" or (shape[1] % d["knobs"]["slices"]) == 0


def test_sliced_rows_stay_off_sm_80():
    e = rtcnorm.explain("rms_norm", (13, 130728), torch.bfloat16, device="cpu", arch="sm_80")
    assert e["design"] != "sliced_row"
