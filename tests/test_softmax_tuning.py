"""The softmax planner's two overrides (rtcnorm._tuning.softmax_*), without a GPU.

Force a design, set a knob a design declares; nothing else. Round trips,
errors that name what is valid, that overrides reach the plan and the
kernel key (so the JIT cache never confuses variants) and clear the plan
memo, and that kernels only overrides reach compile with NVRTC.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning

MASKED = "scaled_masked_softmax"
ALIGNED = "scaled_aligned_causal_masked_softmax"
ALL_KNOBS = "cluster, reuse_run, ctas_per_sm, heads_inner, l1_alloc, stream_store"


def plan(shape=(4, 32, 1024, 4096), op=MASKED, **kw):
    b, h, sq, sk = shape
    return rtcnorm.softmax.explain(op, shape, torch.bfloat16, mask_shape=(b, 1, sq, sk), **kw)


def _opts(kernel: str) -> int:
    """The SoftmaxOpt bits of a kernel name expression (its last template argument)."""
    return int(kernel.rsplit(", ", 1)[1].removesuffix("u>"))


def test_defaults_are_empty():
    assert _tuning.softmax_get() == {"design": None, "knobs": {}}


def test_override_round_trip_and_nesting():
    with _tuning.softmax_override(design="rows", heads_inner=1):
        assert _tuning.softmax_get() == {"design": "rows", "knobs": {"heads_inner": 1}}
        with _tuning.softmax_override(l1_alloc=True, ctas_per_sm=3):
            assert _tuning.softmax_get() == {"design": None, "knobs": {"l1_alloc": 1, "ctas_per_sm": 3}}
        assert _tuning.softmax_get() == {"design": "rows", "knobs": {"heads_inner": 1}}
    assert _tuning.softmax_get() == {"design": None, "knobs": {}}


def test_override_restores_after_error():
    with pytest.raises(RuntimeError, match="boom"):
        with _tuning.softmax_override(design="streamed", ctas_per_sm=4):
            raise RuntimeError("boom")
    assert _tuning.softmax_get() == {"design": None, "knobs": {}}


@pytest.mark.parametrize(
    ("design", "knobs", "exc", "match"),
    [
        ("persistent", {}, ValueError, "unknown softmax design 'persistent'; the designs are cluster_rows, few_rows, "
         "mask_reuse, rows, streamed, flat_row"),
        ("rows", {"cluster": 2}, ValueError,
         "softmax knob 'cluster' is not declared by design 'rows'; its knobs are heads_inner, l1_alloc, stream_store"),
        (None, {"fwd_target_regs": 32}, ValueError,
         f"softmax knob 'fwd_target_regs' is not declared by any design; its knobs are {ALL_KNOBS}"),
        ("cluster_rows", {"cluster": 3}, ValueError, "softmax knob cluster must be 2, 4 or 8, got 3"),
        (None, {"l1_alloc": 2}, ValueError, "softmax knob l1_alloc must be 0 or 1, got 2"),
        (None, {"ctas_per_sm": 0}, ValueError, "softmax knob ctas_per_sm must be from 1 to 32, got 0"),
        (None, {"reuse_run": -1}, ValueError, r"softmax knob reuse_run must be from 1 to 2\^30, got -1"),
        (None, {"stream_store": 1.5}, TypeError, "softmax knob stream_store must be an int or a bool"),
    ],
)  # fmt: skip
def test_invalid_overrides_name_what_is_valid(design, knobs, exc, match):
    with _tuning.softmax_override(design="few_rows", l1_alloc=1):
        with pytest.raises(exc, match=match):
            with _tuning.softmax_override(design, **knobs):
                pass
        assert _tuning.softmax_get() == {"design": "few_rows", "knobs": {"l1_alloc": 1}}  # nothing was set


def test_forced_design_runs_where_feasible():
    """A forced design plans every problem it can run; the others plan as usual."""
    with _tuning.softmax_override(design="rows"):
        f = rtcnorm.softmax.explain("scaled_softmax", (1, 32, 1, 2048))["forward"]
        assert f["design"] == "rows" and f["forced"] and f["rows_per_cta"] == 8, f
    with _tuning.softmax_override(design="cluster_rows"):
        f = rtcnorm.softmax.explain(ALIGNED, (1, 8, 1, 32768), arch="sm_80")["forward"]
        assert f["design"] == "few_rows" and not f["forced"], f  # no clusters before sm_90
    with _tuning.softmax_override(design="mask_reuse"):
        f = plan((4, 32, 1024, 1024))["forward"]  # runs lose below 2048 keys: not feasible by default
        assert f["design"] == "rows" and not f["forced"], f
    with _tuning.softmax_override(design="mask_reuse", reuse_run=2):
        p = plan((4, 32, 1024, 1024))  # a run length makes it feasible at any length
        assert p["forward"]["design"] == "mask_reuse" and p["forward"]["forced"]
        assert p["backward"]["design"] == "rows" and not p["backward"]["forced"]  # the backward reads no mask


def test_knobs_reach_the_plan_and_the_key():
    base = plan()
    with _tuning.softmax_override(reuse_run=5):
        f = plan()["forward"]
        assert (f["knobs"]["reuse_run"], f["reuse_splits"], f["grid"]) == (5, 7, 4 * 1024 * 7), f
    with _tuning.softmax_override(design="mask_reuse", reuse_run=5):
        f = plan((4, 32, 1024, 1024))["forward"]  # forced: runs at any length
        assert f["kernel"].endswith(", 44u>") and f["grid"] == 4 * 1024 // 8 * 7, f
    with _tuning.softmax_override(design="rows", heads_inner=1):
        f = plan((4, 32, 64, 1024))["forward"]
        assert f["knobs"]["heads_inner"] and _opts(f["kernel"]) & 4, f
    with _tuning.softmax_override(design="rows", heads_inner=0):
        f = plan((1, 32, 32, 8192))["forward"]
        assert not f["knobs"]["heads_inner"] and not _opts(f["kernel"]) & 4, f
    with _tuning.softmax_override(ctas_per_sm=3):
        f = rtcnorm.softmax.explain(MASKED, (1, 4, 64, 1 << 18))["forward"]
        assert f["design"] == "streamed" and f["grid"] == "SMs x min(occupancy, 3)", f
    with _tuning.softmax_override(design="cluster_rows", cluster=2):
        e = rtcnorm.softmax.explain(ALIGNED, (1, 32, 1, 8192))
        for phase in ("forward", "backward"):
            assert e[phase]["cluster"] == 2 and e[phase]["grid"] == 64 and _opts(e[phase]["kernel"]) & 192 == 64
    with _tuning.softmax_override(stream_store=True):
        p = rtcnorm.softmax.explain("scaled_softmax", (4, 32, 64, 1024))
        assert all(p[k]["knobs"]["stream_store"] and _opts(p[k]["kernel"]) & 16 for k in ("forward", "backward"))
    assert plan() == base


def test_l1_loads_from_40_mb_and_the_override_forces_either_way():
    big, small = (4, 32, 1024, 1024), (4, 32, 64, 1024)  # 256 MB and 16 MB of bf16
    for shape, rule in ((big, True), (small, False)):
        p = rtcnorm.softmax.explain("scaled_softmax", shape)
        for phase in ("forward", "backward"):
            assert p[phase]["knobs"]["l1_alloc"] == rule and bool(_opts(p[phase]["kernel"]) & 32) == rule
        for value in (0, 1):
            with _tuning.softmax_override(l1_alloc=value):
                p = rtcnorm.softmax.explain("scaled_softmax", shape)
                assert all(bool(_opts(p[k]["kernel"]) & 32) == bool(value) for k in ("forward", "backward"))


def _kernels(op, sizes, archs=("sm_80", "sm_90", "sm_100"), dtypes=(torch.bfloat16,)) -> set[str]:
    lines = rtcnorm.jit.precompile(op, hidden_sizes=sizes, dtypes=list(dtypes), archs=archs)
    return {line.rsplit(" ", 2)[0] for line in lines}


def test_overrides_clear_the_plan_memo():
    """precompile plans through the memo: an override changes its keys, and leaving it restores them."""
    before = _kernels("scaled_softmax", [1024, 100000], archs=("sm_90",))
    assert any(_opts(k) & 32 for k in before)  # 64K rows: 40 MB and more
    with _tuning.softmax_override(l1_alloc=0, stream_store=1):
        during = _kernels("scaled_softmax", [1024, 100000], archs=("sm_90",))
    assert during and all(_opts(k) & 48 == 16 for k in during), during
    assert _kernels("scaled_softmax", [1024, 100000], archs=("sm_90",)) == before


def test_override_only_variants_compile():
    """Kernels only overrides reach compile for sm_80, sm_90 and sm_100: evict-first stores (cached and
    streamed), loads around L1, heads back to back on short rows, mask reuse on short rows."""
    with _tuning.softmax_override(stream_store=1, l1_alloc=0):
        kernels = _kernels("scaled_softmax", [1024, 100000])
    for kind in ("fwd", "bwd"):
        for cached in ("true", "false"):
            found = [k for k in kernels if k.startswith(f"rtcnorm::softmax_{kind}") and f" {cached}, " in k]
            assert found and all(_opts(k) & 48 == 16 for k in found), (kind, cached, kernels)
    with _tuning.softmax_override(design="rows", heads_inner=1):
        kernels = _kernels(MASKED, [1000])
    assert any(k.startswith("rtcnorm::softmax_fwd") and _opts(k) & 12 == 4 for k in kernels), kernels
    with _tuning.softmax_override(design="mask_reuse", reuse_run=3):
        kernels = _kernels(MASKED, [1000], dtypes=(torch.float16,))
    assert any(k.startswith("rtcnorm::softmax_fwd") and _opts(k) & 12 == 12 for k in kernels), kernels


def test_forced_cluster_sizes_compile():
    """Forced cluster sizes compile for sm_90 and sm_100 and never reach sm_80's variant list."""
    for size in (2, 4):
        with _tuning.softmax_override(design="cluster_rows", cluster=size):
            lines = rtcnorm.jit.precompile(ALIGNED, hidden_sizes=[8192], archs=("sm_80", "sm_90", "sm_100"))
        by_arch = {}
        for line in lines:
            kernel, arch, _ = line.rsplit(" ", 2)
            by_arch.setdefault(arch, set()).add(kernel)
        for arch in ("sm_90", "sm_100"):
            assert any(_opts(k) & 192 == {2: 64, 4: 128}[size] for k in by_arch[arch]), by_arch[arch]
        assert not any(_opts(k) & 192 for k in by_arch["sm_80"]), by_arch["sm_80"]


def test_default_cluster_kernels_compile():
    lines = rtcnorm.jit.precompile(MASKED, hidden_sizes=[32768], archs=("sm_80", "sm_90", "sm_100"))
    by_arch = {}
    for line in lines:
        kernel, arch, _ = line.rsplit(" ", 2)
        by_arch.setdefault(arch, set()).add(kernel)
    for arch in ("sm_90", "sm_100"):
        assert any(_opts(k) & 192 == 192 for k in by_arch[arch]), by_arch[arch]
    assert not any(_opts(k) & 192 for k in by_arch["sm_80"]), by_arch["sm_80"]
