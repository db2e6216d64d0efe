"""The norm planner's catalogue, cost model and overrides, on trace fields only.

Planning needs no GPU and compiles nothing: every test here runs on the CPU
against an assumed sm_90 part of 132 SMs unless it says otherwise. Assertions
read the plan's fields (design, knobs, candidates, costs), never its prose.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from norm_plan_cases import case_ids, plan
from rtcnorm import _tuning

FWD_DESIGNS = {
    "register_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm", "persistent"],
    "smem_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm"],
    "sliced_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm", "slices", "ring_stages", "grid_exchange"],
    "reload_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm", "persistent"],
    "flat_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm"],
}
BWD_DESIGNS = {
    "register_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm"],
    "staged_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm", "ring_stages"],
    "sliced_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm", "slices", "ring_stages", "grid_exchange"],
    "split_row": ["vecs_per_thread"],
    "column_grads": ["vecs_per_thread", "cta_threads", "blocks_per_sm"],
    "flat_row": ["vecs_per_thread", "cta_threads", "blocks_per_sm"],
}


def test_the_catalogue_lists_each_design_with_its_knobs():
    assert _tuning.norm_designs("fwd") == FWD_DESIGNS
    assert _tuning.norm_designs("bwd") == BWD_DESIGNS


# (op, shape, forward design, backward design): one problem each design is picked for.
PICKS = [
    ("rms_norm", (16384, 4096), "register_row", "register_row"),
    ("layer_norm", (16384, 4096), "register_row", "register_row"),
    ("layer_norm", (94, 45056), "smem_row", "sliced_row"),
    ("rms_norm", (13, 130728), "sliced_row", "sliced_row"),
    ("rms_norm", (4, 4194304), "reload_row", "split_row"),
    ("rms_norm", (512, 131072), "sliced_row", "sliced_row"),
    ("rms_norm", (32, 4096), "register_row", "column_grads"),
    ("rms_norm", (38177, 1973), "flat_row", "flat_row"),
    ("layer_norm", (38177, 1973), "flat_row", "flat_row"),
]


@pytest.mark.parametrize("op,shape,fwd,bwd", PICKS, ids=[f"{o}-{s[0]}x{s[1]}" for o, s, *_ in PICKS])
def test_the_cheapest_candidate_is_picked(op, shape, fwd, bwd):
    p = plan(op, shape)
    for d, want in ((p, fwd), (p["backward"], bwd)):
        assert d["design"] == want
        first = d["candidates"][0]
        assert (first["design"], first["knobs"]) == (d["design"], d["knobs"])
        costs = [c["us"] for c in d["candidates"]]
        assert costs == sorted(costs)
        assert d["cost_us"] == pytest.approx(costs[0])


@pytest.mark.parametrize("shape", [(1, 4096), (4096, 1024), (262144, 128), (4096, 9999), (2048, 32768), (94, 45056)])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_costs_are_physical(op, shape):
    """Every ranked candidate moves at least the op's own bytes, streams at
    no more than copy bandwidth, and fits the launch bounds' registers."""
    m, n = shape
    p = plan(op, shape)
    for d, streams in ((p, 2), (p["backward"], 3)):
        for c in d["candidates"]:
            assert c["bytes"] >= m * n * 2 * streams
            assert 0 < c["efficiency"] <= 1
            assert c["us"] > 0
            assert 32 <= c["registers"] <= 255
            assert c["grid"] >= 1


def test_sm80_has_no_sliced_rows():
    """Thread-block clusters and grid groups need sm_90: sm_80 plans never slice a row."""
    for shape in [(512, 131072), (32, 4096), (94, 45056)]:
        p = rtcnorm.explain("rms_norm", shape, torch.bfloat16, device="cpu", arch="sm_80", sm_count=108)
        assert all(c["design"] != "sliced_row" for c in p["candidates"] + p["backward"]["candidates"])


@pytest.mark.parametrize(
    "mode,design,persistent",
    [
        ("static_persistent", "register_row", 1),
        ("multi_wave_cached", "register_row", 0),
        ("multi_wave_reload", "reload_row", 0),
    ],
)
def test_modes_restrict_the_forward(mode, design, persistent):
    p = plan(shape=(16384, 4096), mode=mode)
    assert (p["mode"], p["design"], p["knobs"]["persistent"]) == (mode, design, persistent)
    assert all(c["design"] == design for c in p["candidates"])


def test_a_cached_mode_on_a_row_no_cached_design_holds_streams_it_twice():
    p = rtcnorm.explain(
        "rms_norm", (13, 1 << 20), torch.bfloat16, device="cpu", arch="sm_80", sm_count=108, mode="multi_wave_cached"
    )
    assert p["design"] == "reload_row" and not p["cached_row"]


@pytest.mark.parametrize(
    "direction,design", [(d, x) for d, t in (("fwd", FWD_DESIGNS), ("bwd", BWD_DESIGNS)) for x in t]
)
def test_forcing_a_design_runs_it_where_it_is_feasible(direction, design):
    shapes = {"column_grads": (32, 4096), "sliced_row": (64, 65536), "smem_row": (64, 65536), "flat_row": (4096, 1973)}
    shape = shapes.get(design, (4096, 8192))
    with _tuning.norm_override(direction, design):
        p = plan(shape=shape)
        d = p if direction == "fwd" else p["backward"]
        assert d["design"] == design
        assert all(c["design"] == design for c in d["candidates"])
    after = plan(shape=shape)
    assert _tuning.norm_get(direction) == {"design": None, "knobs": {}}
    assert (after if direction == "fwd" else after["backward"])["candidates"][0]["us"] == pytest.approx(
        (after if direction == "fwd" else after["backward"])["cost_us"]
    )


def test_a_knob_override_restricts_the_candidates():
    with _tuning.norm_override("bwd", "register_row", cta_threads=256, vecs_per_thread=2):
        d = plan(shape=(16384, 4096))["backward"]
    assert d["design"] == "register_row"
    assert (d["knobs"]["cta_threads"], d["knobs"]["vecs_per_thread"]) == (256, 2)
    assert all((c["knobs"]["cta_threads"], c["knobs"]["vecs_per_thread"]) == (256, 2) for c in d["candidates"])


def test_a_forced_design_that_cannot_run_plans_as_usual():
    """column_grads needs few row blocks; on many rows the cost model decides."""
    with _tuning.norm_override("bwd", "column_grads"):
        d = plan(shape=(262144, 4096))["backward"]
    assert d["design"] != "column_grads" and not d["forced"]


def test_explain_says_whether_an_override_applied():
    """``forced`` is a trace field: True only where the override restricted the candidates."""
    assert not plan()["forced"] and not plan()["backward"]["forced"]
    with _tuning.norm_override("bwd", "register_row", cta_threads=256, vecs_per_thread=2):
        p = plan(shape=(16384, 4096))
    assert p["backward"]["forced"] and not p["forced"]
    # Knobs no candidate of this problem has: the override does not apply.
    with _tuning.norm_override("fwd", "register_row", cta_threads=96, vecs_per_thread=63):
        assert not plan(shape=(16384, 4096))["forced"]


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        (("fwd", "warp_row"), {}, "unknown forward norm design 'warp_row'; valid: register_row"),
        (("bwd", "smem_row"), {}, "unknown backward norm design 'smem_row'"),
        (("fwd", "smem_row"), {"persistent": 1}, "knob 'persistent' is not declared by the forced design"),
        (("bwd", None), {"threads": 128}, "knob 'threads' is not declared by any design"),
        (("fwd", None), {"cta_threads": 4096}, r"knob cta_threads must be in \[0, 1024\]"),
        (("sideways", None), {}, "direction must be 'fwd' or 'bwd'"),
    ],
)
def test_bad_overrides_are_refused_and_change_nothing(args, kwargs, match):
    before = (_tuning.norm_get("fwd"), _tuning.norm_get("bwd")) if args[0] in ("fwd", "bwd") else None
    with pytest.raises(ValueError, match=match):
        with _tuning.norm_override(*args, **kwargs):
            pass
    if before is not None:
        assert (_tuning.norm_get("fwd"), _tuning.norm_get("bwd")) == before


def test_a_knob_must_be_an_integer():
    with pytest.raises(TypeError, match="knob cta_threads must be an int"):
        with _tuning.norm_override("fwd", "register_row", cta_threads="128"):
            pass


def test_explain_names_the_trace_without_a_gpu():
    p = plan(shape=(16384, 4096))
    assert p["tuned"] is False and p["backward"]["tuned"] is False
    assert p["assumed"].startswith("sm_90, 132 SMs")
    assert p["reason"] and p["backward"]["reason"]


def test_wider_rows_never_get_fewer_bytes_a_thread_in_registers():
    """Register rows hold at most 128 bytes a thread: wider rows take more threads, then other designs."""
    for n in (1024, 4096, 16384, 65536):
        p = plan(shape=(16384, n))
        if p["design"] == "register_row":
            assert p["vecs_per_thread"] * p["vec"] * 2 <= 128


# One-wave grids (every row block resident at launch): the time is the chain
# of one row block, so the plan spreads a row over more threads rather than
# giving each thread more elements (H200: bf16 RMSNorm 389x5568 forward 6.83
# -> 4.33 us, 1x4096 backward 3.58 -> 2.14).
ONE_WAVE = [
    ("rms_norm", (389, 5568), "fwd", 16),
    ("rms_norm", (256, 8192), "fwd", 16),
    ("rms_norm", (1, 4096), "bwd", 8),
    ("layer_norm", (1, 4096), "bwd", 8),
    ("rms_norm", (32, 4096), "bwd", 8),
]


@pytest.mark.parametrize("op,shape,direction,most", ONE_WAVE, ids=[f"{o}-{s[0]}x{s[1]}-{d}" for o, s, d, _ in ONE_WAVE])
def test_one_wave_grids_give_a_thread_few_elements(op, shape, direction, most):
    p = plan(op, shape)
    p = p if direction == "fwd" else p["backward"]
    assert p["vecs_per_thread"] * p["vec"] <= most, p["knobs"]
    # Many-wave grids still hold more a thread: their chains hide behind the stream.
    many = plan(op, (65536, shape[1]))
    many = many if direction == "fwd" else many["backward"]
    assert many["vecs_per_thread"] * many["vec"] >= p["vecs_per_thread"] * p["vec"]


# (op, shape, dtype): 16-bit rows of odd width (2-byte accesses), many rows.
NARROW = [
    ("rms_norm", (38177, 1973), torch.bfloat16),
    ("rms_norm", (1946, 2705), torch.bfloat16),
    ("layer_norm", (38177, 1973), torch.bfloat16),
    ("layer_norm", (1946, 2705), torch.bfloat16),
    ("layer_norm", (13247, 1573), torch.float16),
    ("layer_norm", (12288, 3001), torch.bfloat16),
    ("rms_norm", (4096, 9999), torch.float16),
    ("rms_norm", (8192, 1001), torch.float16),
]


@pytest.mark.parametrize("op,shape,dtype", NARROW, ids=case_ids(NARROW))
def test_narrow_widths_read_flat_pieces_only_where_rows_are_contiguous(op, shape, dtype):
    p = plan(op, shape, dtype)
    assert p["design"] == "flat_row"
    flat = [c for c in p["candidates"] if c["design"] == "flat_row"]
    other = [c for c in p["candidates"] if c["design"] != "flat_row"]
    # 16-byte pieces; the others' 2-byte loads priced below copy.
    assert flat and all(o["efficiency"] < flat[0]["efficiency"] for o in other)
    m, n = shape
    strided = plan(op, shape, dtype, strides=(n + 1, 1))
    assert strided["design"] != "flat_row" and strided["backward"]["design"] != "flat_row"
    assert all(c["design"] != "flat_row" for c in strided["candidates"])


# Narrow rows no register layout holds (wider than 1024 threads hold, or
# beside a quantized epilogue or a residual): one row a CTA, read from a
# one-stage ring in chunks of 16 elements a thread, where that stage (and the
# residual's) fits shared memory.
WIDE_ODD = [
    ("rms_norm", (1416, 112459), {}),
    ("layer_norm", (1416, 112459), {}),
    ("rms_norm", (300, 40001), {"residual": True}),
    ("layer_norm", (2, 65537), {}),
    ("layer_norm", (4096, 9999), {"quant": "mxfp8"}),
    ("rms_norm", (4096, 12345), {"residual": True}),
]


@pytest.mark.parametrize("op,shape,kw", WIDE_ODD, ids=[f"{o}-{s[0]}x{s[1]}-{'-'.join(k)}" for o, s, k in WIDE_ODD])
def test_rows_no_register_layout_holds_read_flat_in_chunks(op, shape, kw):
    p = plan(op, shape, **kw)
    m, n = shape
    assert (p["design"], p["rows_per_cta"], p["vecs_per_thread"]) == ("flat_row", 1, 16)
    assert p["threads_per_row"] * 16 < n
    stage = (n + 3 * 8 - 1) // 8 * 8 * 2  # flat_buffer_elems(1, n, 2) bf16 elements
    assert p["smem"] == stage * (2 if kw.get("residual") else 1)  # a ring of one stage
    assert {c["knobs"]["cta_threads"] for c in p["candidates"] if c["design"] == "flat_row"} <= {256, 512, 1024}
    if not kw:  # the same rows held in registers where the epilogue's registers are not needed
        assert plan(op, (m, 112459), residual=True)["design"] != "flat_row"  # x and h overflow shared memory


def test_rows_registers_hold_are_never_read_in_chunks():
    p = plan("layer_norm", (4096, 9999))  # the same width without an epilogue
    assert p["design"] == "flat_row" and p["threads_per_row"] * p["vecs_per_thread"] >= 9999
    assert all(c["knobs"]["cta_threads"] * c["knobs"]["vecs_per_thread"] >= 9999 for c in p["candidates"])


@pytest.mark.parametrize("shape", [(16384, 4096), (65536, 896), (8192, 1004)])
def test_widths_of_8_byte_vectors_or_wider_never_stage_flat(shape):
    with _tuning.norm_override("fwd", "flat_row"), _tuning.norm_override("bwd", "flat_row"):
        p = plan("rms_norm", shape)
    assert p["design"] != "flat_row" and p["backward"]["design"] != "flat_row"


# 4-byte accesses (16-bit rows of width 2 mod 4, fp32 rows of odd width):
# flat_row only backward, where it is the default; the forward never stages.
WIDE4 = [((40447, 2094), torch.bfloat16), ((216106, 2294), torch.bfloat16), ((38177, 1973), torch.float32)]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape,dtype", WIDE4, ids=[f"{s[0]}x{s[1]}-{str(d)[6:]}" for s, d in WIDE4])
def test_4_byte_widths_stage_flat_backward_only(op, shape, dtype):
    p = plan(op, shape, dtype)
    assert p["backward"]["design"] == "flat_row"
    with _tuning.norm_override("fwd", "flat_row"):
        assert plan(op, shape, dtype)["design"] != "flat_row"


# Odd rows too wide for gamma in registers at 16 elements a thread: flat_row
# re-reads gamma at each use (RMSNorm) or holds 32 elements a thread (LayerNorm).
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape", [(4096, 9999), (16384, 9999)])
def test_wide_odd_rows_plan_flat_backward(op, shape):
    b = plan(op, shape)["backward"]
    assert b["design"] == "flat_row"
    assert b["knobs"]["vecs_per_thread"] * b["knobs"]["cta_threads"] >= shape[1]


# Rows no CTA's registers hold, more of them than a wave's slice groups: (op, shape, dtype).
MANY_WIDE = [
    ("rms_norm", (512, 131072), torch.bfloat16),
    ("rms_norm", (4096, 131072), torch.bfloat16),
    ("rms_norm", (1024, 65536), torch.float32),
    ("layer_norm", (512, 131072), torch.bfloat16),
    ("layer_norm", (1024, 65536), torch.float16),
    ("layer_norm", (2048, 65536), torch.bfloat16),
    ("layer_norm", (512, 131072), torch.float32),
]


@pytest.mark.parametrize("op,shape,dtype", MANY_WIDE, ids=case_ids(MANY_WIDE))
def test_many_wide_rows_slice_through_a_deferred_ring(op, shape, dtype):
    """Slices that wait on each other's statistics every row block idle meanwhile;
    a ring collects them a row block late while the next row blocks load."""
    p = plan(op, shape, dtype)
    assert p["design"] == "sliced_row"
    assert p["knobs"]["ring_stages"] >= 3 and p["knobs"]["grid_exchange"] == 1
    waiting = {k: v for k, v in p["knobs"].items() if k != "blocks_per_sm"} | {"ring_stages": 0, "grid_exchange": 0}
    with _tuning.norm_override("fwd", "sliced_row", **waiting):
        forced = plan(op, shape, dtype)
    assert forced["forced"] and forced["cost_us"] > p["cost_us"]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_a_ring_pays_a_fixed_stretch_each_row_slice(op):
    """Twice the slices halve each slice's bytes, not its exchange and barriers:
    at the same CTA, 16 slices of a 131072-wide row cost more than 8."""
    knobs = {"cta_threads": 256, "vecs_per_thread": 8, "ring_stages": 3, "grid_exchange": 1}
    costs = {}
    for slices in (8, 16):
        with _tuning.norm_override("fwd", "sliced_row", slices=slices, **knobs):
            p = plan(op, (512, 131072))
        assert p["forced"] and p["knobs"]["slices"] == slices
        costs[slices] = p["cost_us"]
    assert costs[16] > costs[8]
