"""The softmax planner's tunables (rtcnorm._tuning.softmax_*), without a GPU.

Round trips, argument errors that name the field, that overrides reach the
kernel key (so the JIT cache never confuses variants), and that the kernel
variants only overrides can reach compile with NVRTC.
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning

MASKED = "scaled_masked_softmax"


def plan(shape=(4, 32, 1024, 4096), op=MASKED, **kw):
    b, h, sq, sk = shape
    return rtcnorm.softmax.explain(op, shape, torch.bfloat16, mask_shape=(b, 1, sq, sk), **kw)


def _opts(kernel: str) -> int:
    """The SoftmaxOpt bits of a kernel name expression (its last template argument)."""
    return int(kernel.rsplit(", ", 1)[1].removesuffix("u>"))


def test_defaults_are_rules():
    values = _tuning.softmax_get()
    assert values and all(v == 0 for v in values.values())
    assert {"fwd_target_regs", "fwd_max_regs", "fwd_cta_threads", "fwd_resident_threads", "fwd_persistent",
            "fwd_prefetch", "mask_order", "stream_regs", "bwd_resident_threads"} <= set(values)  # fmt: skip


def test_override_round_trip():
    before = _tuning.softmax_get()
    with _tuning.softmax_override(fwd_target_regs=32, fwd_persistent=2, ctas_per_sm=4):
        now = _tuning.softmax_get()
        assert now["fwd_target_regs"] == 32 and now["fwd_persistent"] == 2 and now["ctas_per_sm"] == 4
    assert _tuning.softmax_get() == before


def test_override_restores_after_error():
    before = _tuning.softmax_get()
    with pytest.raises(RuntimeError, match="boom"):
        with _tuning.softmax_override(fwd_cta_threads=128):
            raise RuntimeError("boom")
    assert _tuning.softmax_get() == before


@pytest.mark.parametrize(
    ("values", "exc", "match"),
    [
        ({"fwd_cta_threads": 100}, ValueError, "fwd_cta_threads must be 0.*power of two from 32 to 1024, got 100"),
        ({"fwd_persistent": 3}, ValueError, r"fwd_persistent must be 0.*1 \(off\) or 2 \(on\), got 3"),
        ({"fwd_resident_threads": -1}, ValueError, "fwd_resident_threads must be 0.*got -1"),
        ({"stream_regs": 65}, ValueError, "stream_regs must be 0.*from 1 to 64, got 65"),
        ({"fwd_max_regs": 1.5}, TypeError, "fwd_max_regs must be an int"),
        ({"not_a_field": 1}, KeyError, "unknown softmax tunable 'not_a_field'"),
    ],
)
def test_invalid_values_name_the_field(values, exc, match):
    before = _tuning.softmax_get()
    with pytest.raises(exc, match=match):
        with _tuning.softmax_override(fwd_target_regs=32, **values):
            pass
    assert _tuning.softmax_get() == before  # nothing was set


def test_default_plans():
    shape = (4, 32, 1024, 4096)
    f = rtcnorm.softmax.explain(MASKED, shape, torch.bfloat16, mask_shape=shape)["forward"]
    assert f["kernel"] == "rtcnorm::softmax_fwd<rtcnorm::bf16, 8, 128, 2, 4, 1, true, 4, 32u>"
    assert not f["persistent"] and f["grid"] == 4 * 32 * 1024 // 2
    # A mask broadcast over heads, rows of >= 2048 keys: a CTA per row, and each
    # mask row read once for a run of 4 heads (8 runs of the 32 heads).
    f = plan(shape)["forward"]
    assert f["kernel"] == "rtcnorm::softmax_fwd<rtcnorm::bf16, 8, 128, 1, 4, 1, true, 8, 44u>"
    assert not f["persistent"] and f["grid"] == 4 * 1024 * 8
    assert "run of 4 rows sharing it (8 runs per mask row)" in f["reason"]
    f = plan((4, 32, 1024, 2048))["forward"]  # 8 rows per CTA: 512 mask row blocks x 8 runs
    assert f["kernel"].endswith(", 8, 1, true, 4, 44u>") and f["grid"] == 512 * 8
    # Runs of 2 where 4 would leave fewer than 2048 row blocks.
    assert plan((1, 32, 128, 8192))["forward"]["grid"] == 128 * 16
    assert plan((4, 32, 1024, 1024))["forward"]["kernel"].endswith(", 32u>")  # shorter rows: unchanged
    # Too few rows for runs that still leave 8192 row blocks: heads back to back only.
    assert plan((1, 32, 32, 8192))["forward"]["kernel"].endswith(", 4u>")  # 16 MB: loads around L1


def test_overrides_reach_the_key():
    base = plan()
    with _tuning.softmax_override(fwd_resident_threads=512):
        assert plan()["forward"]["kernel"].endswith("true, 4, 44u>")
    with _tuning.softmax_override(fwd_persistent=2, fwd_prefetch=2, mask_order=2, ctas_per_sm=3, mask_reuse=1):
        f = plan()["forward"]
        assert f["persistent"] and f["grid"] == "SMs x min(occupancy, 3)"
        assert f["kernel"].endswith(", 38u>") and "prefetched" in f["reason"] and "mask row" in f["reason"]
    with _tuning.softmax_override(fwd_persistent=2, fwd_prefetch=2):
        assert plan()["forward"]["kernel"].endswith(", 44u>")  # mask reuse takes no prefetch
    with _tuning.softmax_override(reuse_run=5):
        f = plan()["forward"]
        assert f["grid"] == 4 * 1024 * 7 and "run of 5 rows sharing it (7 runs per mask row)" in f["reason"]
        f = plan((4, 32, 1024, 1024))["forward"]  # an override turns reuse on for any length
        assert f["kernel"].endswith(", 44u>") and f["grid"] == 4 * 1024 // 8 * 7
    full = rtcnorm.softmax.explain(MASKED, (4, 32, 1024, 4096))["forward"]
    with _tuning.softmax_override(fwd_prefetch=2, mask_order=2):
        f = rtcnorm.softmax.explain(MASKED, (4, 32, 1024, 4096))["forward"]
        assert f["kernel"] == full["kernel"]  # no persistent grid, no broadcast mask: no-ops
    with _tuning.softmax_override(fwd_target_regs=32, keep_exp_elems=64):
        f = plan()["forward"]
        assert f["vecs_per_thread"] == 8 and f["kernel"].endswith(", 45u>")  # keep-exp, mask reuse
    with _tuning.softmax_override(bwd_persistent=2, bwd_prefetch=2, bwd_cta_threads=512):
        b = plan()["backward"]
        assert b["persistent"] and b["kernel"].endswith(", 34u>")
    with _tuning.softmax_override(cache_threads=64, stream_regs=16, stream_threads=256):
        f = plan()["forward"]
        assert not f["cached_row"] and f["threads_per_row"] == 256 and f["vecs_per_thread"] == 4
    assert plan() == base


@pytest.mark.parametrize(
    ("mask_shape", "expected"),
    [((4, 1, 1024, 4096), True), ((1, 1, 1024, 4096), True), ((4, 1, 1, 4096), False), ((4, 32, 1024, 4096), False)],
)
def test_mask_order_needs_a_broadcast_over_rows(mask_shape, expected):
    with _tuning.softmax_override(mask_order=2, mask_reuse=1):
        f = rtcnorm.softmax.explain(MASKED, (4, 32, 1024, 4096), mask_shape=mask_shape)["forward"]
    assert f["kernel"].endswith(", 36u>") == expected
    f = rtcnorm.softmax.explain(MASKED, (4, 32, 1024, 4096), mask_shape=mask_shape)["forward"]
    assert f["kernel"].endswith(", 44u>") == expected  # and so does mask reuse


def test_tuned_variants_compile():
    """Every kernel option and a non-default launch bound compile for sm_80, sm_90 and sm_100."""
    settings = dict(fwd_persistent=2, fwd_prefetch=2, mask_order=2, keep_exp_elems=64, fwd_resident_threads=512,
                    bwd_persistent=2, bwd_prefetch=2, bwd_resident_threads=512)  # fmt: skip
    lines = []
    for reuse in (1, 2):  # mask reuse drops the prefetch: 7u without it, 13u with it
        with _tuning.softmax_override(mask_reuse=reuse, **settings):
            lines += rtcnorm.jit.precompile(
                MASKED, hidden_sizes=[4096], dtypes=[torch.bfloat16], archs=("sm_80", "sm_90", "sm_100")
            )
    with _tuning.softmax_override(**settings):
        lines += rtcnorm.jit.precompile(
            "scaled_aligned_causal_masked_softmax", hidden_sizes=[1000], dtypes=[torch.float16], archs=("sm_90",)
        )
    kernels = {line.rsplit(" ", 2)[0] for line in lines}
    assert any(k.startswith("rtcnorm::softmax_fwd") and k.endswith(", 39u>") for k in kernels), kernels
    assert any(k.startswith("rtcnorm::softmax_fwd") and k.endswith(", 45u>") for k in kernels), kernels
    assert any(k.startswith("rtcnorm::softmax_bwd") and k.endswith(", 34u>") for k in kernels), kernels


def _bwd(sk: int, dtype=torch.bfloat16, op: str = "scaled_softmax") -> dict:
    return rtcnorm.softmax.explain(op, (4, 32, sk, sk), dtype)["backward"]


@pytest.mark.parametrize(
    ("sk", "dtype", "tpr", "nv", "rows"),
    [
        (1024, torch.bfloat16, 128, 1, 4),  # up to 256 16-byte vectors: one pair per thread
        (2048, torch.bfloat16, 256, 1, 2),
        (1024, torch.float32, 256, 1, 2),
        (128, torch.float16, 16, 1, 32),
        (4096, torch.bfloat16, 256, 2, 2),  # longer rows: 16 registers of y and dy per thread
        (8192, torch.bfloat16, 512, 2, 1),
        (1001, torch.bfloat16, 128, 8, 4),  # single-element vectors keep the register target
    ],
)
def test_backward_plans(sk, dtype, tpr, nv, rows):
    b = _bwd(sk, dtype)
    assert (b["threads_per_row"], b["vecs_per_thread"], b["rows_per_cta"]) == (tpr, nv, rows), b
    assert b["cached_row"] and not b["persistent"]
    l1 = 32 if 4 * 32 * sk * sk * dtype.itemsize >= 40 << 20 else 0  # inputs of 40 MB+: loads through L1
    assert b["kernel"].endswith(f", {max(1, 1024 // (tpr * rows))}, {l1}u>"), b  # 64 registers
    assert _bwd(sk, dtype, MASKED)["kernel"] == b["kernel"]  # the backward never sees the mask


@pytest.mark.parametrize("op", ["scaled_upper_triang_masked_softmax", "scaled_aligned_causal_masked_softmax"])
def test_causal_backward_keeps_the_forward_shape(op):
    """Causal rows: 16 registers of y and dy per thread and CTAs of 256 threads."""
    for sk, tpr, nv, rows in [(1024, 32, 4, 8), (2048, 128, 2, 2), (8192, 256, 4, 1)]:
        b = _bwd(sk, op=op)
        assert (b["threads_per_row"], b["vecs_per_thread"], b["rows_per_cta"]) == (tpr, nv, rows), (sk, b)
        assert ", true, true, " in b["kernel"], b


def test_stream_store_reaches_the_key_and_compiles():
    with _tuning.softmax_override(fwd_stream_store=2, bwd_stream_store=2):
        p = rtcnorm.softmax.explain("scaled_softmax", (4, 32, 64, 1024))
        assert p["forward"]["kernel"].endswith(", 16u>") and p["backward"]["kernel"].endswith(", 16u>")
        assert "evict-first" in p["forward"]["reason"] and "evict-first" in p["backward"]["reason"]
        lines = rtcnorm.jit.precompile(
            "scaled_softmax", hidden_sizes=[1024, 100000], dtypes=[torch.bfloat16], archs=("sm_80", "sm_90", "sm_100")
        )
    kernels = {line.rsplit(" ", 2)[0] for line in lines}
    for kind in ("fwd", "bwd"):
        for cached in ("true", "false"):
            found = [k for k in kernels if k.startswith(f"rtcnorm::softmax_{kind}") and f" {cached}, " in k]
            assert found and all(_opts(k) & 16 for k in found), (kind, cached, kernels)
    assert "evict-first" not in rtcnorm.softmax.explain("scaled_softmax", (4, 32, 64, 1024))["backward"]["reason"]


def test_l1_loads_from_40_mb_and_the_other_path_compiles():
    """Inputs of 40 MB or more load x (y and dy) through L1 (opts bit 32),
    smaller ones around it; the override forces either way, and both kernels
    compile for every arch."""
    big, small = (4, 32, 1024, 1024), (4, 32, 64, 1024)  # 256 MB and 16 MB of bf16
    p = rtcnorm.softmax.explain("scaled_softmax", big)
    for phase, data in (("forward", "x"), ("backward", "y and dy")):
        assert p[phase]["kernel"].endswith(", 32u>") and f"{data} loaded through L1" in p[phase]["reason"], p[phase]
    p = rtcnorm.softmax.explain("scaled_softmax", small)
    assert p["forward"]["kernel"].endswith(", 0u>") and "through L1" not in p["forward"]["reason"]
    with _tuning.softmax_override(fwd_l1_alloc=2, bwd_l1_alloc=2):
        p = rtcnorm.softmax.explain("scaled_softmax", small)
        assert p["forward"]["kernel"].endswith(", 32u>") and p["backward"]["kernel"].endswith(", 32u>")
    with _tuning.softmax_override(fwd_l1_alloc=1, bwd_l1_alloc=1):
        p = rtcnorm.softmax.explain("scaled_softmax", big)
        assert p["forward"]["kernel"].endswith(", 0u>") and p["backward"]["kernel"].endswith(", 0u>")
        assert "through L1" not in p["forward"]["reason"] + p["backward"]["reason"]
        lines = rtcnorm.jit.precompile(
            "scaled_softmax", hidden_sizes=[1024, 100000], dtypes=[torch.bfloat16], archs=("sm_80", "sm_90", "sm_100")
        )
    kernels = {line.rsplit(" ", 2)[0] for line in lines}
    assert kernels and not any(_opts(k) & 32 for k in kernels), kernels


@pytest.mark.parametrize("op", ["scaled_softmax", MASKED, "scaled_aligned_causal_masked_softmax"])
def test_decode_grids_take_launch_bounds_of_one(op):
    """A grid of at most one CTA per SM (32 decode rows) is launched with
    launch bounds of one CTA per SM; a grid of more row blocks than SMs, or
    an explicit resident-threads override, keeps the register cap."""
    f, b = (rtcnorm.softmax.explain(op, (1, 32, 1, 8192))[k] for k in ("forward", "backward"))
    for e in (f, b):
        assert e["grid"] == 32 and e["kernel"].endswith(", 1, 0u>"), e
        assert "1 CTA per SM (grid of at most one CTA per SM)" in e["reason"], e
    few_sms = rtcnorm.softmax.explain(op, (1, 32, 1, 8192), sm_count=16)
    assert few_sms["forward"]["kernel"].endswith(", 4, 0u>"), few_sms  # 32 row blocks on 16 SMs
    many = rtcnorm.softmax.explain(op, (1, 256, 1, 8192))["backward"]
    assert many["grid"] == 256 and not many["kernel"].endswith(", 1, 0u>"), many
    with _tuning.softmax_override(fwd_resident_threads=1024):
        assert rtcnorm.softmax.explain(op, (1, 32, 1, 8192))["forward"]["kernel"].endswith(", 4, 0u>")
    with pytest.raises(ValueError, match="sm_count must be at least 1"):
        rtcnorm.softmax.explain(op, (1, 32, 1, 8192), sm_count=0)
    kernels = {line.rsplit(" ", 2)[0] for line in rtcnorm.jit.precompile(op, hidden_sizes=[8192], archs=("sm_90",))}
    assert f["kernel"] in kernels and b["kernel"] in kernels, kernels


@pytest.mark.parametrize("op", ["scaled_aligned_causal_masked_softmax", "scaled_upper_triang_masked_softmax"])
def test_single_query_causal_rows_run_the_plain_kernels(op):
    """A causal row of one query (sq == 1: decode) sees every key, so both
    directions plan the plain kernels; two queries keep the causal ones."""
    one = rtcnorm.softmax.explain(op, (1, 32, 1, 8192) if "aligned" in op else (1, 32, 1, 1))
    assert ", 0, true, " in one["forward"]["kernel"] and ", false, true, " in one["backward"]["kernel"], one
    assert "single query" in one["forward"]["reason"] and "keys past the diagonal" not in one["forward"]["reason"]
    two = rtcnorm.softmax.explain(op, (1, 32, 2, 8192) if "aligned" in op else (1, 32, 2, 2))
    assert ", 2, true, " in two["forward"]["kernel"] and ", true, true, " in two["backward"]["kernel"], two
    assert one["backward"]["kernel"] == rtcnorm.softmax.explain("scaled_softmax", (32, 1, 1, 8192 if "aligned" in op else 1))["backward"]["kernel"]  # fmt: skip


def test_few_row_grids_take_a_cta_per_row():
    """At most one row per SM: a CTA per row, the forward at two 16-byte
    vectors a thread; more rows than SMs (or the override) pack rows."""
    f = rtcnorm.softmax.explain("scaled_softmax", (1, 32, 1, 2048))["forward"]
    assert (f["rows_per_cta"], f["threads_per_row"], f["vecs_per_thread"], f["grid"]) == (1, 128, 2, 32), f
    packed = rtcnorm.softmax.explain("scaled_softmax", (1, 32, 1, 2048), sm_count=16)["forward"]
    assert packed["rows_per_cta"] > 1 and packed["grid"] < 32, packed
    with _tuning.softmax_override(few_rows=1):
        f1 = rtcnorm.softmax.explain("scaled_softmax", (1, 32, 1, 2048))["forward"]
        assert (f1["kernel"], f1["grid"]) == (packed["kernel"], packed["grid"]), (f1, packed)
    with _tuning.softmax_override(few_rows=2):
        many = rtcnorm.softmax.explain("scaled_softmax", (1, 512, 1, 2048))["forward"]
        assert many["rows_per_cta"] == 1 and many["grid"] == 512, many


def test_few_long_rows_split_over_clusters():
    """At most an eighth as many rows as SMs, each of 4096 16-byte vectors or
    more: a cluster of up to 8 CTAs per row on sm_90+, never on sm_80; the
    override forces a size on any few-row grid or turns clusters off."""
    op = "scaled_aligned_causal_masked_softmax"
    for phase in ("forward", "backward"):
        e = rtcnorm.softmax.explain(op, (1, 8, 1, 32768))[phase]
        assert e["cluster"] == 8 and e["grid"] == 64 and e["cached_row"], e
        assert "cluster of 8 CTAs" in e["reason"] and _opts(e["kernel"]) & 192 == 192, e
        assert rtcnorm.softmax.explain(op, (1, 8, 1, 32768), arch="sm_80")[phase]["cluster"] == 1
        assert rtcnorm.softmax.explain(op, (1, 32, 1, 8192))[phase]["cluster"] == 1  # 32 rows: too many
        assert rtcnorm.softmax.explain(op, (1, 8, 1, 16384))[phase]["cluster"] == 1  # rows too short
        assert rtcnorm.softmax.explain(op, (1, 17, 1, 32768))[phase]["cluster"] == 1  # 17 x 8 > 132 SMs
        assert rtcnorm.softmax.explain(op, (1, 1, 1, 32768))[phase]["cluster"] == 8
    # 8 rows of 65536 backward: streamed as whole rows, cached as slices.
    b = rtcnorm.softmax.explain(op, (1, 8, 1, 65536))["backward"]
    assert b["cached_row"] and b["cluster"] == 8, b
    with _tuning.softmax_override(fwd_cluster=2, bwd_cluster=1):
        e = rtcnorm.softmax.explain(op, (1, 32, 1, 8192))
        assert e["forward"]["cluster"] == 2 and e["forward"]["grid"] == 64 and e["backward"]["cluster"] == 1, e
    with _tuning.softmax_override(fwd_cluster=8, fwd_persistent=2):
        assert rtcnorm.softmax.explain(op, (1, 8, 1, 32768))["forward"]["cluster"] == 1
    for bad in (3, 16):
        with pytest.raises(ValueError, match="fwd_cluster must be 0"), _tuning.softmax_override(fwd_cluster=bad):
            pass


def test_cluster_kernels_compile():
    """The few-row cluster kernels compile for sm_90 and sm_100 and never
    reach sm_80's variant list."""
    lines = rtcnorm.jit.precompile(
        "scaled_masked_softmax", hidden_sizes=[32768], dtypes=[torch.bfloat16], archs=("sm_80", "sm_90", "sm_100")
    )
    by_arch = {}
    for line in lines:
        kernel, arch, _ = line.rsplit(" ", 2)
        by_arch.setdefault(arch, set()).add(kernel)
    for arch in ("sm_90", "sm_100"):
        assert any(_opts(k) & 192 for k in by_arch[arch]), by_arch[arch]
    assert not any(_opts(k) & 192 for k in by_arch["sm_80"]), by_arch["sm_80"]
