"""Every norm design, forced, on the shapes it claims: outputs against float64.

One parametrized test over design x dtype x awkward N. Forcing a design
(rtcnorm._tuning.norm_override) makes the planner choose among that design's
candidates only; each case first checks the design is the one planned on
this device, then compares y (forward) or dx, dW, dB (backward) with the
float64 reference, outputs poisoned beforehand.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from reference import assert_close, ref_layer_norm, ref_rms_norm
from rtcnorm import _tuning

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# direction, design, [(rows, N)], needs sm_90 (clusters / grid groups)
CASES = [
    ("fwd", "register_row", [(33, 1), (33, 127), (1, 1000), (257, 5120)], False),
    ("fwd", "smem_row", [(33, 1000), (65, 8192), (3, 50000)], False),
    # 130728 and 54920: slices of unequal width (the last is short).
    ("fwd", "sliced_row", [(5, 16384), (70, 24576), (3, 65536), (13, 130728), (3, 54920)], True),
    ("fwd", "reload_row", [(33, 7), (33, 4096), (2, 99999)], False),
    ("fwd", "flat_row", [(33, 1), (33, 127), (1000, 1973), (257, 9999)], False),
    ("bwd", "register_row", [(33, 1), (257, 127), (300, 1000), (129, 4096)], False),
    ("bwd", "staged_row", [(33, 1024), (300, 4096), (129, 6144)], False),
    ("bwd", "sliced_row", [(5, 8192), (300, 16384), (3, 65536), (13, 130728), (239, 19640)], True),
    ("bwd", "split_row", [(33, 7), (300, 1000), (65, 20000)], False),
    ("bwd", "column_grads", [(2, 7), (33, 1000), (65, 4096)], False),
    ("bwd", "flat_row", [(33, 1), (257, 127), (1000, 1973), (300, 2705), (64, 9999)], False),
]
PARAMS = [
    pytest.param(direction, design, m, n, dt, sm90, id=f"{direction}-{design}-{m}x{n}-{str(dt)[6:]}")
    for direction, design, shapes, sm90 in CASES
    for m, n in shapes
    for dt in DTYPES
]


def _planned(op, m, n, dtype, direction):
    e = rtcnorm.explain(op, (m, n), dtype, device="cuda")
    return e if direction == "fwd" else e["backward"]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("direction,design,m,n,dtype,sm90", PARAMS)
def test_a_forced_design_matches_float64(op, direction, design, m, n, dtype, sm90, poison):
    if sm90 and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("sliced rows need sm_90 (clusters and grid groups)")
    if design == "flat_row" and dtype == torch.float32 and direction == "fwd":
        pytest.skip("the forward stages flat only 16-bit rows of odd width")
    with _tuning.norm_override(direction, design):
        planned = _planned(op, m, n, dtype, direction)
        assert planned["design"] == design, f"{design} is not feasible for {m}x{n} {dtype}: {planned['design']}"
        x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True) if op == "layer_norm" else None
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        poison(4 * m * n * 4)
        if op == "rms_norm":
            y = rtcnorm.rms_norm(x, n, w, 1e-6)
            ref = ref_rms_norm(x, [n], w, 1e-6, dy=dy)
        else:
            y = rtcnorm.layer_norm(x, n, w, b, 1e-5)
            ref = ref_layer_norm(x, [n], w, b, 1e-5, dy=dy)
        if direction == "fwd":
            assert_close(y, ref["y"], what=f"{op} y")
            return
        params = [t for t in (x, w, b) if t is not None]
        grads = torch.autograd.grad(y, params, dy, retain_graph=True)
        again = torch.autograd.grad(y, params, dy)
    # The partial rows are reduced in a fixed order: a rerun is bitwise equal.
    assert all(torch.equal(a, g) for a, g in zip(again, grads))
    assert_close(grads[0], ref["dx"], what=f"{op} dx")
    assert_close(grads[1], ref["dw"], what=f"{op} dw", reduce_len=m)
    if b is not None:
        assert_close(grads[2], ref["db"], what=f"{op} db", reduce_len=m)


@pytest.mark.parametrize("n,slices", [(130728, 8), (130728, 16), (54920, 8), (19640, 2)])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_unequal_slices_match_float64(op, n, slices, poison):
    """Rows whose vectors `slices` does not divide (2, 8 and 16 slices), the
    short last slice included, against float64."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("sliced rows need sm_90 (clusters and grid groups)")
    m, dtype = 5, torch.bfloat16
    with _tuning.norm_override("fwd", "sliced_row", slices=slices):
        planned = _planned(op, m, n, dtype, "fwd")
        assert planned["design"] == "sliced_row" and planned["knobs"]["slices"] == slices
        assert (n // planned["vec"]) % slices != 0, "the case must split unevenly"
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype) if op == "layer_norm" else None
        poison(4 * m * n * 4)
        if op == "rms_norm":
            y, ref = rtcnorm.rms_norm(x, n, w, 1e-6), ref_rms_norm(x, [n], w, 1e-6)
        else:
            y, ref = rtcnorm.layer_norm(x, n, w, b, 1e-5), ref_layer_norm(x, [n], w, b, 1e-5)
    assert_close(y, ref["y"], what=f"{op} y")


def test_tune_keeps_the_fastest_plan_and_a_new_process_uses_it(tmp_path, monkeypatch):
    """rtcnorm.tune times candidates, stores the winner on disk, and a fresh
    process (same cache folder) plans the problem with it."""
    import subprocess
    import sys

    monkeypatch.setenv("RTCNORM_CACHE_DIR", str(tmp_path))
    code = (
        "import torch, rtcnorm; "
        "r = rtcnorm.tune('rms_norm', (1000, 3000), torch.bfloat16, reps=3) if {tune} else None; "
        "e = rtcnorm.explain('rms_norm', (1000, 3000), torch.bfloat16, device='cuda'); "
        "print(e['tuned'], e['backward']['tuned'], e['design'], e['backward']['design'], "
        "r and r['fwd']['stored_on_disk'], r and r['fwd']['best']['ms'] <= r['fwd']['picked']['ms'] * 1.05)"
    )
    env = {**__import__("os").environ, "RTCNORM_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", code.format(tune=True)], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    tuned_f, tuned_b, *_, stored, no_worse = first.stdout.split()
    assert (tuned_f, tuned_b, stored, no_worse) == ("True", "True", "True", "True")
    second = subprocess.run([sys.executable, "-c", code.format(tune=False)], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split()[:2] == ["True", "True"]
    assert second.stdout.split()[2:4] == first.stdout.split()[2:4]


def test_a_tuned_problem_still_matches_float64(tmp_path, monkeypatch):
    monkeypatch.setenv("RTCNORM_CACHE_DIR", str(tmp_path))
    rtcnorm.tune("layer_norm", (777, 1536), torch.float16, reps=3, persist=False)
    x = torch.randn(777, 1536, device="cuda", dtype=torch.float16, requires_grad=True)
    w = torch.randn(1536, device="cuda", dtype=torch.float16, requires_grad=True)
    b = torch.randn(1536, device="cuda", dtype=torch.float16, requires_grad=True)
    dy = torch.randn_like(x)
    y = rtcnorm.layer_norm(x, 1536, w, b)
    ref = ref_layer_norm(x, [1536], w, b, dy=dy)
    assert_close(y, ref["y"], what="y")
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    assert_close(dx, ref["dx"], what="dx")
    assert_close(dw, ref["dw"], what="dw", reduce_len=777)
    assert rtcnorm.explain("layer_norm", (777, 1536), torch.float16, device="cuda")["tuned"]
