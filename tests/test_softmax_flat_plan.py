"""flat_row, the softmax design for rows whose width allows no 16-byte access (no GPU).

Read from the planner's trace (rtcnorm.softmax.explain): which problems it
takes, its shape and stage ring, that it is declined where it does not
apply (aligned rows keep their plans), that forcing it and its knobs work,
and that NVRTC compiles every variant without spills for sm_80, sm_90 and
sm_100. Nothing here reads explain's text.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
PLAIN = "scaled_softmax"
MASKED = "scaled_masked_softmax"
CAUSAL = "scaled_upper_triang_masked_softmax"
ALIGNED = "scaled_aligned_causal_masked_softmax"


def ring_bytes(rows, n, dtype, tensors):
    """Two stages of one buffer a tensor: the block's rows and the 16-byte pieces around them."""
    piece = 16 // dtype.itemsize
    return 2 * tensors * ((rows * n + 3 * piece - 1) // piece * piece) * dtype.itemsize


def explain(op, shape, dtype=BF16, **kw):
    return rtcnorm.softmax.explain(op, shape, dtype, **kw)


# (op, shape, dtype, kw) -> (vec, threads_per_row, vecs_per_thread, rows_per_cta) forward and backward
# (None: the backward keeps a register design).
FLAT = [
    (PLAIN, (4096, 12345), BF16, {}, (1, 256, 49, 1), (1, 256, 49, 1)),
    (PLAIN, (8192, 4097), BF16, {}, (1, 128, 33, 2), (1, 128, 33, 1)),
    (PLAIN, (1000, 9999), FP16, {}, (1, 256, 40, 1), (1, 256, 40, 1)),
    (PLAIN, (4096, 4097), FP32, {}, (1, 128, 33, 1), (1, 128, 33, 1)),
    (PLAIN, (4096, 4098), BF16, {}, (2, 64, 33, 2), (2, 64, 33, 1)),  # 4-byte vectors
    (PLAIN, (4096, 4098), BF16, {"arch": "sm_80", "sm_count": 108}, (2, 64, 33, 2), (2, 64, 33, 1)),
    (PLAIN, (16384, 1001), BF16, {}, (1, 16, 63, 16), None),  # packed short rows: backward in registers
    (PLAIN, (2048, 25001), BF16, {}, (1, 256, 98, 1), None),  # one backward CTA an SM
    (CAUSAL, (2, 4, 333, 333), BF16, {}, (1, 8, 42, 32), None),
    (ALIGNED, (8, 4, 64, 1001), FP16, {}, (1, 16, 63, 16), None),
]


@pytest.mark.parametrize(("op", "shape", "dtype", "kw", "fwd", "bwd"), FLAT)
def test_odd_rows_take_flat_rows(op, shape, dtype, kw, fwd, bwd):
    e = explain(op, shape, dtype, **kw)
    for phase, want, tensors in (("forward", fwd, 1), ("backward", bwd, 2)):
        p = e[phase]
        k = p["knobs"]
        if want is None:
            assert p["design"] != "flat_row", p
            cand = next(c for c in p["candidates"] if c["design"] == "flat_row")
            assert not cand["feasible"], cand
            continue
        assert p["design"] == "flat_row" and not p["forced"], p
        assert (k["vec"], k["threads_per_row"], k["vecs_per_thread"], k["rows_per_cta"]) == want, k
        assert k["vec"] * dtype.itemsize < 16 and shape[-1] % k["vec"] == 0
        assert p["persistent"] and not p["cached_row"] and p["grid"] == "SMs x occupancy", p
        assert k["smem_bytes"] == ring_bytes(k["rows_per_cta"], shape[-1], dtype, tensors), k
        cand = next(c for c in p["candidates"] if c["design"] == "flat_row")
        assert cand["resources"]["smem_bytes"] == k["smem_bytes"]
        assert k["min_blocks"] * p["block"] <= 2048 and k["min_blocks"] * k["smem_bytes"] <= 227 << 10, k
        kernel = "rtcnorm::softmax_" + ("fwd" if phase == "forward" else "bwd") + "_flat<"
        assert p["kernel"].startswith(kernel) and f", {shape[-1]}, {k['vec']}, " in p["kernel"], p["kernel"]


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "kw"),
    [
        (PLAIN, (4096, 4096), BF16, {}),  # whole 16-byte pieces: aligned rows keep their plans
        (PLAIN, (4096, 12344), BF16, {}),
        (PLAIN, (64, 1000), FP32, {}),
        (MASKED, (4, 32, 128, 1001), BF16, {"mask_shape": (4, 1, 128, 1001)}),  # no mask
        (PLAIN, (640, 200001), BF16, {}),  # the ring outgrows shared memory
        (PLAIN, (132, 12345), BF16, {}),  # at most one row per SM
        (ALIGNED, (1, 32, 1, 4097), BF16, {}),
    ],
)
def test_flat_rows_declined(op, shape, dtype, kw):
    e = explain(op, shape, dtype, **kw)
    for phase in ("forward", "backward"):
        cand = next(c for c in e[phase]["candidates"] if c["design"] == "flat_row")
        assert (not cand["feasible"] and e[phase]["design"] != "flat_row") or (op == MASKED and phase == "backward")


def test_few_rows_take_flat_rows_only_forced():
    """At most one row per SM: few_rows serves every key length, so a decode loop compiles a handful of
    kernels; forced, flat_row runs them too (one row: 128 rows of 2 threads a CTA)."""
    e = explain(PLAIN, (1, 3))
    assert e["forward"]["design"] == e["backward"]["design"] == "few_rows", e
    with _tuning.softmax_override(design="flat_row"):
        e = explain(PLAIN, (1, 3))
        for phase in ("forward", "backward"):
            k = e[phase]["knobs"]
            assert e[phase]["design"] == "flat_row" and e[phase]["forced"], e[phase]
            assert (k["vec"], k["threads_per_row"], k["vecs_per_thread"], k["rows_per_cta"]) == (1, 2, 2, 128), k


def test_ring_limits_the_row_per_direction():
    """32769 bf16 keys: two stages of x fit 227 KB, two of y and dy do not; sm_80's 163 KB hold neither
    in fp32 forward."""
    e = explain(PLAIN, (4096, 32769), BF16)
    assert e["forward"]["design"] == "flat_row" and e["forward"]["knobs"]["smem_bytes"] < 227 << 10
    assert not next(c for c in e["backward"]["candidates"] if c["design"] == "flat_row")["feasible"]
    f32 = explain(PLAIN, (4096, 21001), FP32, arch="sm_80", sm_count=108)["forward"]
    assert f32["design"] != "flat_row", f32


def test_short_rows_pack_within_the_stage_budget():
    """Short rows share 256-thread CTAs (at least 2 threads a row) while a stage buffer stays within 32 KB."""
    with _tuning.softmax_override(design="flat_row"):
        k = explain(PLAIN, (65536, 99))["forward"]["knobs"]
        assert (k["threads_per_row"], k["rows_per_cta"]) == (2, 128), k
        k = explain(PLAIN, (65536, 999))["forward"]["knobs"]
        assert (k["threads_per_row"], k["rows_per_cta"]) == (16, 16), k
        k = explain(PLAIN, (65536, 7))["forward"]["knobs"]
        assert (k["threads_per_row"], k["rows_per_cta"], k["vecs_per_thread"]) == (2, 128, 4), k
        k = explain(PLAIN, (65536, 999))["backward"]["knobs"]  # y and dy: half the rows
        assert (k["threads_per_row"], k["rows_per_cta"]) == (16, 8), k
        k = explain(PLAIN, (65536, 7), FP32)["forward"]["knobs"]
        assert k["rows_per_cta"] * 7 * 4 <= 32 << 10 and k["min_blocks"] * k["smem_bytes"] <= 227 << 10, k


def test_flat_rows_beat_narrow_designs_in_the_model():
    """Where flat_row is feasible it is cheaper than every design at narrower than 16-byte accesses."""
    for shape, phases in (((4096, 12345), ("forward", "backward")), ((8192, 4097), ("forward", "backward")),
                          ((16384, 1001), ("forward",))):  # fmt: skip
        for phase in phases:
            cands = {c["design"]: c for c in explain(PLAIN, shape)[phase]["candidates"] if c["feasible"]}
            flat = cands.pop("flat_row")["cost"]
            assert cands and all(flat["ns"] < c["cost"]["ns"] for c in cands.values()), (shape, phase)
            assert flat["l2_bytes"] == 0 and flat["lone_exps"] == 0


def test_forcing_and_knobs():
    with _tuning.softmax_override(design="flat_row"):
        e = explain(PLAIN, (32, 1001))
        assert all(e[p]["design"] == "flat_row" and e[p]["forced"] for p in ("forward", "backward")), e
        aligned = explain(PLAIN, (4096, 4096))["forward"]
        assert aligned["design"] == "rows" and not aligned["forced"], aligned
    with _tuning.softmax_override(design="flat_row", ctas_per_sm=3, stream_store=1):
        f = explain(PLAIN, (4096, 12345))["forward"]
        assert f["forced"] and f["grid"] == "SMs x min(occupancy, 3)" and f["knobs"]["ctas_per_sm"] == 3, f
        assert f["kernel"].endswith(", 16u>"), f["kernel"]
    with pytest.raises(ValueError, match="softmax knob 'heads_inner' is not declared by design 'flat_row'; its knobs "
                       "are ctas_per_sm, stream_store"):  # fmt: skip
        with _tuning.softmax_override(design="flat_row", heads_inner=1):
            pass


def test_precompile_lists_flat_kernels():
    lines = rtcnorm.jit.precompile(PLAIN, hidden_sizes=[12345], dtypes=[BF16], archs=("sm_90",))
    kernels = {line.rsplit(" ", 2)[0] for line in lines}
    assert any(k.startswith("rtcnorm::softmax_fwd_flat<rtcnorm::bf16, 12345,") for k in kernels), kernels
    assert any(k.startswith("rtcnorm::softmax_bwd_flat<rtcnorm::bf16, 12345,") for k in kernels), kernels


COMPILE = [
    (op, shape, dtype)
    for op, shape in ((PLAIN, (4096, 12345)), (PLAIN, (65536, 9)), (PLAIN, (4096, 4098)), (CAUSAL, (2, 4, 333, 333)))
    for dtype in (BF16, FP16, FP32)
] + [(ALIGNED, (2, 4, 64, 1001), BF16), (PLAIN, (64, 1), FP32), (PLAIN, (64, 32769), BF16)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
def test_flat_kernels_compile_without_spills(arch):
    sms = {"sm_80": 108, "sm_90": 132, "sm_100": 148}[arch]

    def compile_one(job):
        op, shape, dtype = job
        return rtcnorm.softmax.explain(op, shape, dtype, arch=arch, sm_count=sms, resources=True)

    with _tuning.softmax_override(design="flat_row"):
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            plans = list(pool.map(compile_one, COMPILE))
    flat = 0
    for job, e in zip(COMPILE, plans):
        for phase in ("forward", "backward"):
            p = e[phase]
            if p["design"] != "flat_row":
                continue
            flat += 1
            r = p["ptxas"]
            assert r is not None and r["target"] == arch, (job, r)
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (job, phase, p["kernel"], r)
    assert flat >= 2 * len(COMPILE) - 4, f"flat_row planned for {flat} of {2 * len(COMPILE)}"
