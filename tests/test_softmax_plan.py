"""The softmax planner's choices, read from its trace (rtcnorm.softmax.explain), without a GPU.

Table-driven: each row is a problem and the design, knobs and launch the
planner must pick for it. The plans are today's (docs/history.md has the
measurements behind them); tests/plan/softmax_plan_diff.py compares whole
sweeps between trees. Nothing here reads explain's text.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rtcnorm import _tuning

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
MASKED = "scaled_masked_softmax"
CAUSAL = "scaled_upper_triang_masked_softmax"
ALIGNED = "scaled_aligned_causal_masked_softmax"
DESIGNS = ("cluster_rows", "few_rows", "mask_reuse", "rows", "streamed", "flat_row")
PERSISTENT = ("streamed", "flat_row")


def explain(op, shape, dtype=BF16, mask_shape=None, **kw):
    return rtcnorm.softmax.explain(op, shape, dtype, mask_shape=mask_shape, **kw)


def heads_mask(shape):
    """A mask broadcast over heads: (b, 1, sq, sk) for (b, h, sq, sk) scores."""
    return (shape[0], 1, *shape[2:])


# (op, shape, dtype, mask, kw) -> phase, design, (threads_per_row, vecs_per_thread, rows_per_cta, cluster), grid
PLANS = [
    # Register rows packed into CTAs; a full mask reads its rows once each.
    (MASKED, (4, 32, 1024, 4096), BF16, "full", {}, "forward", "rows", (128, 4, 2, 1), 4 * 32 * 1024 // 2),
    ("scaled_softmax", (4, 32, 1024, 1024), BF16, None, {}, "forward", "rows", (32, 4, 8, 1), 4 * 32 * 1024 // 8),
    # A mask broadcast over heads, rows of >= 2048 keys: runs of 4 heads per mask row read.
    (MASKED, (4, 32, 1024, 4096), BF16, "heads", {}, "forward", "mask_reuse", (128, 4, 1, 1), 4 * 1024 * 8),
    (MASKED, (4, 32, 1024, 2048), BF16, "heads", {}, "forward", "mask_reuse", (32, 8, 8, 1), 4 * 1024 // 8 * 8),
    (MASKED, (1, 32, 128, 8192), BF16, "heads", {}, "forward", "mask_reuse", (128, 8, 1, 1), 128 * 16),
    # Shorter rows, or too few row blocks for runs: rows (heads back to back from 4096 keys).
    (MASKED, (4, 32, 1024, 1024), BF16, "heads", {}, "forward", "rows", (32, 4, 8, 1), 4 * 32 * 1024 // 8),
    (MASKED, (1, 32, 32, 8192), BF16, "heads", {}, "forward", "rows", (128, 8, 1, 1), 32 * 32),
    # At most one row per SM: a CTA per row at two 16-byte vectors a thread (forward).
    ("scaled_softmax", (1, 32, 1, 2048), BF16, None, {}, "forward", "few_rows", (128, 2, 1, 1), 32),
    ("scaled_softmax", (1, 32, 1, 2048), BF16, None, {"sm_count": 16}, "forward", "rows", (32, 8, 8, 1), 4),
    # Few long rows: a cluster of 8 CTAs per row on sm_90+, a CTA per row on sm_80.
    (ALIGNED, (1, 8, 1, 32768), BF16, None, {}, "forward", "cluster_rows", (256, 2, 1, 8), 64),
    (ALIGNED, (1, 8, 1, 32768), BF16, None, {}, "backward", "cluster_rows", (256, 2, 1, 8), 64),
    (ALIGNED, (1, 8, 1, 32768), BF16, None, {"arch": "sm_80"}, "forward", "few_rows", (512, 8, 1, 1), 8),
    (ALIGNED, (1, 17, 1, 32768), BF16, None, {}, "forward", "few_rows", (512, 8, 1, 1), 17),
    (ALIGNED, (1, 8, 1, 16384), BF16, None, {}, "forward", "few_rows", (256, 8, 1, 1), 8),
    (MASKED, (1, 4, 2, 1 << 18), BF16, "full", {}, "forward", "cluster_rows", (512, 8, 1, 8), 64),
    # Rows no CTA can hold in registers stream on a persistent grid.
    (MASKED, (1, 4, 2, 1 << 18), BF16, "full", {"arch": "sm_80"}, "forward", "streamed", (512, 2, 1, 1), None),
    (MASKED, (1, 4, 64, 1 << 18), BF16, "full", {}, "forward", "streamed", (512, 2, 1, 1), None),
    ("scaled_softmax", (4, 8, 64, 100000), FP32, None, {}, "backward", "streamed", (512, 2, 1, 1), None),
    # The backward: rows of up to 256 16-byte vectors take one pair a thread in 256-thread CTAs.
    ("scaled_softmax", (4, 32, 1024, 1024), BF16, None, {}, "backward", "rows", (128, 1, 2, 1), 4 * 32 * 1024 // 2),
    ("scaled_softmax", (4, 32, 2048, 2048), BF16, None, {}, "backward", "rows", (256, 1, 1, 1), 4 * 32 * 2048),
    ("scaled_softmax", (4, 32, 128, 128), FP16, None, {}, "backward", "rows", (16, 1, 16, 1), 4 * 32 * 128 // 16),
    ("scaled_softmax", (4, 32, 1024, 1024), FP32, None, {}, "backward", "rows", (256, 1, 1, 1), 4 * 32 * 1024),
    ("scaled_softmax", (4, 32, 4096, 4096), BF16, None, {}, "backward", "rows", (256, 2, 1, 1), 4 * 32 * 4096),
    ("scaled_softmax", (4, 32, 8192, 8192), BF16, None, {}, "backward", "rows", (256, 4, 1, 1), 4 * 32 * 8192),
    # Rows of 2002 bytes allow no 16-byte access; short ones keep register rows backward (flat forward).
    ("scaled_softmax", (4, 32, 1001, 1001), BF16, None, {}, "backward", "rows", (128, 8, 2, 1), 4 * 32 * 1001 // 2),
    ("scaled_softmax", (4, 32, 1001, 1001), BF16, None, {}, "forward", "flat_row", (16, 63, 16, 1), "occupancy"),
    # Many rows that one CTA would hold alone on its SM: split over a cluster so that 4 CTAs share it.
    ("scaled_softmax", (1024, 65536), BF16, None, {}, "forward", "cluster_rows", (256, 8, 1, 4), 1024 * 4),
    ("scaled_softmax", (1024, 65536), BF16, None, {}, "backward", "cluster_rows", (256, 4, 1, 8), 1024 * 8),
    ("scaled_softmax", (1024, 65536), BF16, None, {"arch": "sm_80"}, "forward", "rows", (1024, 8, 1, 1), 1024),
    ("scaled_softmax", (2048, 32768), BF16, None, {}, "forward", "rows", (512, 8, 1, 1), 2048),
    # ... only rows of 16-byte accesses: narrower ones take flat rows (before them they streamed).
    ("scaled_softmax", (4096, 12345), BF16, None, {}, "forward", "flat_row", (256, 49, 1, 1), "occupancy"),
    # Causal rows keep the forward's shape backward: 16 registers of y and dy, 256-thread CTAs.
    (CAUSAL, (4, 32, 1024, 1024), BF16, None, {}, "backward", "rows", (32, 4, 8, 1), 4 * 32 * 1024 // 8),
    (ALIGNED, (4, 32, 2048, 2048), BF16, None, {}, "backward", "rows", (128, 2, 2, 1), 4 * 32 * 2048 // 2),
    (CAUSAL, (4, 32, 8192, 8192), BF16, None, {}, "backward", "rows", (256, 4, 1, 1), 4 * 32 * 8192),
]


@pytest.mark.parametrize(("op", "shape", "dtype", "mask", "kw", "phase", "design", "shape_knobs", "grid"), PLANS)
def test_plan_table(op, shape, dtype, mask, kw, phase, design, shape_knobs, grid):
    mask_shape = {"full": shape, "heads": heads_mask(shape), None: None}[mask]
    e = explain(op, shape, dtype, mask_shape, **kw)[phase]
    assert e["design"] == design and not e["forced"], e
    k = e["knobs"]
    assert (k["threads_per_row"], k["vecs_per_thread"], k["rows_per_cta"], k["cluster"]) == shape_knobs, k
    assert (e["threads_per_row"], e["vecs_per_thread"], e["rows_per_cta"], e["cluster"]) == shape_knobs
    assert e["cached_row"] == (design not in PERSISTENT) and e["persistent"] == (design in PERSISTENT)
    if grid == "occupancy":
        assert e["grid"] == "SMs x occupancy" and k["ctas_per_sm"] == 0
    elif grid is None:
        assert e["grid"] == "SMs x min(occupancy, 2)" and k["ctas_per_sm"] == 2
    else:
        assert e["grid"] == grid


@pytest.mark.parametrize(
    ("shape", "run", "splits"),
    [((4, 32, 1024, 4096), 4, 8), ((1, 32, 128, 8192), 2, 16), ((4, 2, 1024, 8192), 2, 1)],
)
def test_mask_reuse_runs(shape, run, splits):
    """Runs of 4 heads, shortened to keep 2048 row blocks; never longer than the heads."""
    f = explain(MASKED, shape, mask_shape=heads_mask(shape))["forward"]
    assert f["design"] == "mask_reuse" and f["knobs"]["reuse_run"] == run and f["reuse_splits"] == splits, f
    assert f["knobs"]["heads_inner"] and f["kernel"].endswith(f", {f['knobs']['min_blocks']}, 44u>"), f


@pytest.mark.parametrize(
    ("shape", "mask_shape", "heads_inner"),
    [
        ((4, 32, 1024, 4096), (4, 1, 1024, 4096), True),
        ((1, 32, 32, 8192), (1, 1, 32, 8192), True),
        ((4, 32, 1024, 4096), (4, 32, 1024, 4096), False),  # no broadcast
        ((4, 32, 1024, 4096), (4, 1, 1, 4096), False),  # broadcast over queries too: no rows of its own below
        ((4, 32, 1024, 2048), (4, 1, 1024, 2048), True),  # mask reuse takes heads back to back
        ((4, 32, 64, 1024), (4, 1, 64, 1024), False),  # short rows: re-reads hit L2
    ],
)
def test_heads_inner_needs_a_broadcast_over_rows(shape, mask_shape, heads_inner):
    assert explain(MASKED, shape, mask_shape=mask_shape)["forward"]["knobs"]["heads_inner"] == heads_inner


@pytest.mark.parametrize("op", ["scaled_softmax", MASKED, ALIGNED])
def test_one_wave_grids_take_launch_bounds_of_one(op):
    """A cached grid of at most one CTA per SM gets launch bounds of one; more row blocks than SMs keep 64 registers."""
    e = explain(op, (1, 32, 1, 8192))
    for phase in ("forward", "backward"):
        assert e[phase]["grid"] == 32 and e[phase]["knobs"]["min_blocks"] == 1, e[phase]
        cand = next(c for c in e[phase]["candidates"] if c["design"] == e[phase]["design"])
        assert cand["resources"]["regs_per_thread"] == min(255, 65536 // e[phase]["block"]), cand
    packed = explain(op, (1, 32, 1, 8192), sm_count=16)["forward"]
    assert packed["knobs"]["min_blocks"] == 4 and packed["design"] == "rows", packed
    many = explain(op, (1, 256, 1, 8192))["backward"]
    assert many["grid"] == 256 and many["knobs"]["min_blocks"] > 1, many


@pytest.mark.parametrize("op", [ALIGNED, CAUSAL])
def test_single_query_causal_rows_run_the_plain_kernels(op):
    one = explain(op, (1, 32, 1, 8192) if op == ALIGNED else (1, 32, 1, 1))
    assert ", 0, true, " in one["forward"]["kernel"] and ", false, true, " in one["backward"]["kernel"], one
    two = explain(op, (1, 32, 2, 8192) if op == ALIGNED else (1, 32, 2, 2))
    assert ", 2, true, " in two["forward"]["kernel"] and ", true, true, " in two["backward"]["kernel"], two


@pytest.mark.parametrize(
    ("op", "shape", "mask_shape", "kw"),
    [
        ("scaled_softmax", (1, 32, 1, 2048), None, {}),
        ("scaled_softmax", (7, 3, 5, 1001), None, {}),
        (MASKED, (4, 32, 1024, 4096), (4, 1, 1024, 4096), {}),
        (MASKED, (1, 4, 2, 1 << 18), None, {}),
        (MASKED, (1, 4, 2, 1 << 18), None, {"arch": "sm_80"}),
        (ALIGNED, (1, 8, 1, 32768), None, {}),
        (CAUSAL, (2, 4, 333, 333), None, {"sm_count": 108, "arch": "sm_100"}),
    ],
)
def test_trace_ranks_the_feasible_candidates(op, shape, mask_shape, kw):
    """Every design appears once, in catalogue order; the pick is the cheapest feasible one."""
    for phase, e in explain(op, shape, FP16, mask_shape, **kw).items():
        if phase not in ("forward", "backward"):
            continue
        cands = e["candidates"]
        assert [c["design"] for c in cands] == list(DESIGNS)
        feasible = [c for c in cands if c["feasible"]]
        assert feasible and all(("cost" in c) == c["feasible"] for c in cands)
        best = min(c["cost"]["ns"] for c in feasible)
        first_best = next(c for c in feasible if c["cost"]["ns"] == best)
        assert e["design"] == first_best["design"] and e["knobs"] == first_best["knobs"], (phase, e)
        for c in feasible:
            cost = c["cost"]
            assert cost["dram_bytes"] >= 2 * shape[-1] and cost["ctas"] >= 1 and cost["round_trips"] >= 1, c


def test_streamed_rows_re_read_their_input_from_l2():
    """The cost model charges a streamed row its second pass: cached slices (clusters) win."""
    cands = {c["design"]: c for c in explain(MASKED, (1, 4, 2, 1 << 18))["forward"]["candidates"]}
    rows_bytes = 8 * (1 << 18) * 2
    assert cands["streamed"]["cost"]["l2_bytes"] == rows_bytes and cands["cluster_rows"]["cost"]["l2_bytes"] == 0
    assert cands["cluster_rows"]["cost"]["ns"] < cands["streamed"]["cost"]["ns"]
    assert not cands["few_rows"]["feasible"] and not cands["rows"]["feasible"]


def test_a_lone_cta_pays_its_exponentials():
    """A forward CTA alone on its SM wave after wave shows its exponentials; a cluster split hides them.
    The backward has none, so its 1024-thread rows stay unsplit."""
    fwd = {c["design"]: c for c in explain("scaled_softmax", (1024, 65536))["forward"]["candidates"]}
    assert fwd["rows"]["knobs"]["min_blocks"] == 1 and fwd["rows"]["cost"]["lone_exps"] == 8 * 1024 * 64 * 2
    assert fwd["cluster_rows"]["cost"]["lone_exps"] == 0
    assert fwd["cluster_rows"]["cost"]["ns"] < fwd["rows"]["cost"]["ns"]
    bwd = explain("scaled_softmax", (2048, 32768))["backward"]
    assert bwd["design"] == "rows" and bwd["knobs"]["threads_per_row"] == 1024, bwd
    assert all(c["cost"]["lone_exps"] == 0 for c in bwd["candidates"] if c["feasible"])


def test_catalogue_declares_the_knobs():
    assert _tuning.softmax_designs() == {
        "cluster_rows": ["cluster", "l1_alloc", "stream_store"],
        "few_rows": ["l1_alloc", "stream_store"],
        "mask_reuse": ["reuse_run", "l1_alloc", "stream_store"],
        "rows": ["heads_inner", "l1_alloc", "stream_store"],
        "streamed": ["ctas_per_sm", "l1_alloc", "stream_store"],
        "flat_row": ["ctas_per_sm", "stream_store"],
    }


@pytest.mark.parametrize("op", ["scaled_softmax", MASKED, CAUSAL, ALIGNED])
@pytest.mark.parametrize("sk", [1, 7, 1000, 4097, 32768, 100000])
def test_memoized_plans_match_the_trace(op, sk):
    """precompile plans through the memo (the launch path), explain through a fresh trace: same kernels."""
    kernels = {line.rsplit(" ", 2)[0] for line in rtcnorm.jit.precompile(op, hidden_sizes=[sk], archs=("sm_90",))}
    shape = (1 << 14, 4, sk) if op in (CAUSAL, ALIGNED) else (1 << 16, sk)  # 65536 rows, as precompile plans
    e = explain(op, shape, BF16, shape if op == MASKED else None, sm_count=1)  # no grid fits one wave
    assert e["forward"]["kernel"] in kernels and e["backward"]["kernel"] in kernels, (e, kernels)


@settings(max_examples=300, deadline=None)
@given(
    op=st.sampled_from(["scaled_softmax", CAUSAL]),
    rows=st.integers(1, 1 << 20),
    cols=st.integers(1, 1 << 18),
    dtype=st.sampled_from([BF16, FP16, FP32]),
    target=st.sampled_from([("sm_80", 108), ("sm_90", 132), ("sm_100", 148)]),
)
def test_every_plan_holds_its_row(op, rows, cols, dtype, target):
    """Whatever the problem: a cached plan's threads, vectors and cluster cover
    the row; CTAs stay within 1024 threads; clusters appear only on sm_90+, and
    a many-row split leaves CTAs of at most 256 threads; the backward charges
    no exposed exponentials; the pick is the cheapest feasible candidate."""
    arch, sms = target
    shape = (rows, cols) if op == "scaled_softmax" else (1, rows, cols)
    e = explain(op, shape, dtype, arch=arch, sm_count=sms)
    for phase in ("forward", "backward"):
        p = e[phase]
        k = p["knobs"]
        assert p["threads_per_row"] & (p["threads_per_row"] - 1) == 0 and p["block"] <= 1024, p
        assert k["cluster"] in (1, 2, 4, 8) and (k["cluster"] == 1 or arch != "sm_80"), p
        if p["cached_row"]:
            assert k["threads_per_row"] * k["vecs_per_thread"] * k["vec"] * k["cluster"] >= cols, p
        if k["cluster"] > 1 and rows > sms:
            assert p["block"] <= 256 and k["vec"] * dtype.itemsize == 16, p
        feasible = [c for c in p["candidates"] if c["feasible"]]
        assert (
            min(c["cost"]["ns"] for c in feasible)
            == next(c for c in feasible if c["design"] == p["design"])["cost"]["ns"]
        )
        if phase == "backward":
            assert all(c["cost"]["lone_exps"] == 0 for c in feasible), p
