"""How the norm kernels behave in a CUDA program: streams, CUDA graphs,
several devices, bitwise-reproducible weight gradients and >2^31-element
tensors. All tests here need a GPU."""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from norm_checks import (
    PREFETCH_NEXT,
    PRELOAD_AFFINE,
    SINGLE_STRIDE,
    WIDE_LN_REGS,
    check_layer_norm,
    check_rms_norm,
    kernel_flags,
    ln_inputs,
    one_wave_packs,
    rms_inputs,
    rows_of_strides,
)
from reference import assert_close, ref_layer_norm, ref_rms_norm
from rtcnorm import _tuning

pytestmark = pytest.mark.gpu
OPS = torch.ops.rtcnorm
NORM_OPS = ("rms_norm", "layer_norm")


def make(op, shape, dtype=torch.bfloat16, device="cuda"):
    """Inputs with weight (and bias) for `op`: a dict usable by run() and ref()."""
    n = shape[-1]
    if op == "rms_norm":
        x, w, _, _ = rms_inputs(shape, [n], dtype, device, "weight")
        return {"x": x, "w": w, "b": None, "dy": torch.randn_like(x)}
    x, w, b, _ = ln_inputs(shape, [n], dtype, device, "weight_bias")
    return {"x": x, "w": w, "b": b, "dy": torch.randn_like(x)}


def run(op, t, mode=None):
    """Forward then backward ops, called directly; returns {y, dx, dw[, db]}."""
    n = t["x"].shape[-1]
    if op == "rms_norm":
        y, rstd = OPS.rms_norm(t["x"], [n], t["w"], None, mode, False)
        dx, dw = OPS.rms_norm_backward(t["dy"], t["x"], rstd, t["w"], [n], False, True, None)
        return {"y": y, "dx": dx, "dw": dw}
    y, mean, rstd = OPS.layer_norm(t["x"], [n], t["w"], t["b"], 1e-5, mode, False)
    dx, dw, db = OPS.layer_norm_backward(t["dy"], t["x"], mean, rstd, t["w"], t["b"], [n], False, True, True)
    return {"y": y, "dx": dx, "dw": dw, "db": db}


def ref(op, t):
    n = t["x"].shape[-1]
    if op == "rms_norm":
        return ref_rms_norm(t["x"], [n], t["w"], dy=t["dy"])
    return ref_layer_norm(t["x"], [n], t["w"], t["b"], dy=t["dy"])


def check(op, got, expected, rows):
    for name, value in got.items():
        assert_close(value, expected[name], what=name, reduce_len=rows if name in ("dw", "db") else 1)


def run_poisoned_and_repeated(op, t, poison, repeats=2):
    """run(op, t) after poisoning the allocator's free memory; `repeats` more
    runs must give the same bits. Returns the first run's outputs."""
    poison(4 * t["x"].numel() * t["x"].element_size())
    got = run(op, t)
    for _ in range(repeats):
        again = run(op, t)
        for key in again:
            assert torch.equal(again[key], got[key]), key
    return got


@pytest.mark.parametrize("op", NORM_OPS)
def test_side_stream_orders_after_its_producer(op, poison):
    t = make(op, (4097, 4096))
    expected = ref(op, t)
    poison(8 * t["x"].numel() * t["x"].element_size())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The side stream spins before it produces the input: an op launched
        # on any other stream would read the input before it exists.
        torch.cuda._sleep(200_000_000)
        late = dict(t, x=t["x"] * 1, dy=t["dy"] * 1)
        got = run(op, late)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    check(op, got, expected, 4097)


@pytest.mark.parametrize("op", NORM_OPS)
def test_capturing_a_never_loaded_kernel_asks_for_warm_up(op):
    run(op, make(op, (8, 256)))  # the device is initialised; only this test's kernels are new
    n = {"rms_norm": 2344, "layer_norm": 2352}[op]  # row lengths no other test launches
    t = make(op, (64, n))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"(?i)warm up") as info:
        with torch.cuda.graph(graph):
            run(op, t, mode="multi_wave_cached")
    assert "CUDA graph" in str(info.value)


def capture_run(op, t):
    """run(op, t) warmed up on a side stream, then captured: (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(op, t)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run(op, t)
    return graph, outputs


def refill(op, t):
    """Fresh random x and dy copied into t's tensors (a captured graph reads them)."""
    fresh = make(op, tuple(t["x"].shape))
    for k in ("x", "dy"):
        t[k].copy_(fresh[k])


@pytest.mark.parametrize("op", NORM_OPS)
def test_graph_replays_after_warm_up(op):
    t = make(op, (1000, 5120))
    graph, outputs = capture_run(op, t)
    for _ in range(2):
        refill(op, t)
        graph.replay()
        torch.cuda.synchronize()
        check(op, outputs, ref(op, t), 1000)


@pytest.mark.parametrize("n", [128, 4096, 65536])
@pytest.mark.parametrize("op", NORM_OPS)
def test_weight_grads_are_bitwise_reproducible(op, n):
    t = make(op, (max(2049, (1 << 23) // n | 1), n))  # many rows per persistent CTA
    first = run(op, t)
    for _ in range(3):
        again = run(op, t)
        for name in first:
            assert torch.equal(again[name], first[name]), name


@pytest.mark.parametrize(
    "shape",
    [(4096, 1024), (256, 8192), (300, 16384), (2048, 32768), (37, 131072), (1, 4096)],
    ids=["registers", "staged-capped-grid", "staged-or-cluster", "cluster", "split", "one-row"],
)
@pytest.mark.parametrize("op", NORM_OPS)
def test_programmatic_launches_change_no_bit(op, shape, poison):
    """The backward's later kernels (column kernel, column reduce) launched
    programmatically (the sm_90+ rule) or plainly give the same bits, eagerly
    and replayed from a CUDA graph, and match the reference."""
    t = make(op, shape)
    results = {}
    for v in (1, 2):
        with _tuning.override(bwd_programmatic=v):
            assert rtcnorm.explain(op, shape, t["x"].dtype)["backward"]["programmatic_launch"] == (v == 2)
            poison(4 * t["x"].numel() * t["x"].element_size())
            results[v] = run(op, t)
            graph, replayed = capture_run(op, t)
            poison(4 * t["x"].numel() * t["x"].element_size())
            graph.replay()
            torch.cuda.synchronize()
            for name in results[v]:
                assert torch.equal(replayed[name], results[v][name]), (v, name)
    for name in results[1]:
        assert torch.equal(results[2][name], results[1][name]), name
    check(op, results[2], ref(op, t), shape[0])


@pytest.mark.parametrize(
    "shape",
    [(4, 1024), (32, 4096), (4096, 1024), (256, 8192), (2048, 32768), (38, 131072)],
    ids=["one-row-block", "column-ctas", "registers", "staged", "cluster", "split"],
)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("op", NORM_OPS)
def test_rows_of_one_and_two_strides(op, groups, shape, poison):
    """Rows of one stride take the single-stride row map (kSingleStride) on
    the few-row grids of the rule, or on every plan when it is forced
    (fwd_single_stride / bwd_single_stride = 2); rows of two strides never
    do. Forward and backward give the same bits under each setting and match
    the reference; RMSNorm also beside a residual of the other layout."""
    rows, n = shape
    dtype = torch.bfloat16
    t = make(op, shape, dtype)
    t["x"] = rows_of_strides(rows, n, dtype, "cuda", groups)
    t["dy"] = t["dy"].view(t["x"].shape)
    results = {}
    for v in (0, 1, 2):
        with _tuning.override(fwd_single_stride=v, bwd_single_stride=v):
            plan = rtcnorm.explain(op, t["x"].shape, dtype, strides=t["x"].stride())
            for phase in (plan, plan["backward"]):
                single = bool(kernel_flags(phase["kernel"]) & SINGLE_STRIDE)
                if groups == 2 or v == 1:
                    assert not single, (v, phase["kernel"])
                elif v == 2:
                    assert single, phase["kernel"]
            poison(4 * t["x"].numel() * t["x"].element_size())
            results[v] = run(op, t)
            if op == "rms_norm":
                other = rows_of_strides(rows, n, dtype, "cuda", 3 - groups)
                check_rms_norm(t["x"], [n], t["w"], residual=other, poison=poison)
    for v in (1, 2):
        for name in results[0]:
            assert torch.equal(results[v][name], results[0][name]), (v, name)
    check(op, results[0], ref(op, t), rows)


@pytest.mark.parametrize("design", ["split", "reload"])
@pytest.mark.parametrize(("shape", "strided"), [((37, 32768), False), ((5, 65544), True), ((300, 16384), True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", NORM_OPS)
def test_both_designs_for_rows_too_long_for_registers(op, dtype, shape, strided, design, poison):
    """Rows the backward cannot keep in registers: the split design (the rule)
    and the persistent re-reading kernel both match the reference, on
    contiguous and row-strided input, and the split design is reproducible."""
    t = make(op, (shape[0] * (2 if strided else 1), shape[1]), dtype)
    if strided:
        t["x"], t["dy"] = t["x"][::2], t["dy"][::2].contiguous()
    plan = rtcnorm.explain(op, t["x"].shape, dtype)["backward"]
    with _tuning.override(bwd_split=2 if design == "split" else 1):
        now = rtcnorm.explain(op, t["x"].shape, dtype)["backward"]
        assert now["split"] == (design == "split" and not plan["cached_row"])
        poison(4 * t["x"].numel() * t["x"].element_size())
        got = run(op, t)
        again = run(op, t)
    for name in got:
        assert torch.equal(got[name], again[name]), name
    check(op, got, ref(op, t), shape[0])


def check_contiguous_and_strided(op, m, n, dtype, variant, mode, poison):
    """Forward and backward of m rows of n, contiguous and every other row of 2m,
    against the reference."""
    for strided in (False, True):
        rows = 2 * m if strided else m
        if op == "rms_norm":
            x, w, zcg, r = rms_inputs((rows, n), [n], dtype, "cuda", variant)
            x = x[::2] if strided else x
            r = r[: x.shape[0]] if r is not None else None
            check_rms_norm(x, [n], w, mode=mode, zero_centered_gamma=zcg, residual=r, poison=poison)
        else:
            # A large mean where every output has a 16-bit tolerance (float32
            # outputs, y or a float32 dW, would see fp32 rounding of the mean).
            shift = 0.0 if dtype == torch.float32 or variant == "mixed" else 100.0
            x, w, b, zcg = ln_inputs((rows, n), [n], dtype, "cuda", variant, shift=shift)
            x = x[::2] if strided else x
            check_layer_norm(x, [n], w, b, mode=mode, zero_centered_gamma=zcg, poison=poison, stat_scale=4.0)


@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant"),
    [(264, 40960, torch.bfloat16, "weight_bias"), (133, 49152, torch.float16, "zero_centered"),
     (150, 57344, torch.bfloat16, "weight_bias"), (140, 61440, torch.bfloat16, "weight_bias"),
     (600, 65536, torch.bfloat16, "weight_bias"), (132, 36864, torch.bfloat16, "mixed")],
)  # fmt: skip
@pytest.mark.parametrize("forced", [0, 1, 2])
def test_wide_layer_norm_register_rows(m, n, dtype, variant, forced, poison):
    """16-bit LayerNorm rows of 64-128 KB in registers at N / 64 threads, one
    CTA an SM (wide_ln_register_row, entry 76; rows of 576-960 threads take
    flat_lanes): the rule (0), off (1: shared-memory rows and cluster slices)
    and forced (2) all match the float64 reference, forward and backward,
    contiguous and every other row of twice as many; rows of float32 gamma
    and beta ("mixed") stay off the rule."""
    with _tuning.override(fwd_wide_ln_regs=forced):
        wdtype = torch.float32 if variant == "mixed" else None
        plan = rtcnorm.explain("layer_norm", (m, n), dtype, weight_dtype=wdtype, device=0)
        taken = WIDE_LN_REGS in plan["reason"]
        assert taken == (forced != 1 and variant != "mixed"), plan["reason"]
        check_contiguous_and_strided("layer_norm", m, n, dtype, variant, None, poison)


@pytest.mark.parametrize("mode", [None, "static_persistent", "multi_wave_cached"], ids=lambda m: m or "auto")
@pytest.mark.parametrize(
    ("n", "variant"),
    [(1000, "weight"), (4097, "residual"), (5120, "mixed"), (16384, "residual"), (32768, "mixed"), (65536, "weight")],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", NORM_OPS)
def test_rows_cached_in_shared_memory(op, dtype, n, variant, mode, poison):
    """Every wide row forced into the shared-memory row cache (one chunk, two
    chunks at N = 65536, scalar access at N = 4097) matches the reference, with
    residual, float32 weights and row-strided input; rows that do not fit one
    CTA's shared memory fall back to the streamed forward."""
    if op == "layer_norm" and variant == "residual":
        variant = "weight_bias"
    if variant == "mixed" and dtype == torch.float32:
        variant = "weight"
    m = 67 if n <= 16384 else 9
    with _tuning.override(fwd_smem_row_bytes=1):
        plan = rtcnorm.explain(op, (m, n), dtype, mode=mode, residual=variant == "residual")
        fits = n * dtype.itemsize <= 163 * 1024  # every sm_80+ part with that much: all but 256 KB rows here
        # 256 KB rows are split across a cluster on sm_90+, each slice in shared memory.
        slices = plan["column_slices"]  # a hardware cluster or a grid group
        assert slices == 1 or (not fits and torch.cuda.get_device_capability() >= (9, 0))
        assert plan["cached_row"] == (fits or slices > 1)
        assert plan["smem"] == (n // slices * dtype.itemsize * plan["rows_per_cta"] if plan["cached_row"] else 0)
        check_contiguous_and_strided(op, m, n, dtype, variant, mode, poison)


@pytest.mark.parametrize("mode", [None, "static_persistent", "multi_wave_cached"], ids=lambda m: m or "auto")
@pytest.mark.parametrize(
    ("op", "n", "dtype", "variant", "tpr", "nv"),
    [("layer_norm", 128, torch.bfloat16, "weight_bias", 4, 4), ("layer_norm", 320, torch.bfloat16, "zero_centered", 16, 3),
     ("layer_norm", 512, torch.bfloat16, "mixed", 8, 8), ("layer_norm", 256, torch.float32, "no_affine", 16, 4),
     ("layer_norm", 64, torch.float16, "bias", 4, 2), ("rms_norm", 512, torch.bfloat16, "mixed", 8, 8),
     ("rms_norm", 448, torch.float16, "zero_centered", 8, 7), ("rms_norm", 512, torch.bfloat16, "no_weight", 8, 8)],
)  # fmt: skip
def test_narrow_rows_with_fuller_threads(op, n, dtype, variant, tpr, nv, mode, poison):
    """Narrow forward rows at 2-8 vectors per thread (LayerNorm, and 16-bit rows
    past 384 elements; N = 64 at the 4-thread floor) in 256-thread CTAs of 16-64
    rows, with a partly filled last CTA, match the reference, contiguous and
    row-strided."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m = 2 * sms * (256 // tpr) + 37  # enough CTAs for the rule to choose the fuller threads
    plan = rtcnorm.explain(op, (m, n), dtype, mode=mode, device="cuda")
    assert (plan["threads_per_row"], plan["vecs_per_thread"], plan["block"]) == (tpr, nv, 256), plan
    check_contiguous_and_strided(op, m, n, dtype, variant, mode, poison)


needs_clusters = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="thread-block clusters need sm_90+",
)


@needs_clusters
@pytest.mark.parametrize("cluster", [2, 8, 16])
@pytest.mark.parametrize("mode", [None, "static_persistent"], ids=lambda m: m or "auto")
@pytest.mark.parametrize(
    ("n", "variant", "dtype"),
    [(24576, "mixed", torch.bfloat16), (4104, "zero_centered", torch.float32),
     (131072, "residual", torch.float16), (65536, "no_weight", torch.float32)],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_rows_split_across_a_cluster(op, n, variant, dtype, mode, cluster, poison):
    """Cluster sizes forced on forward and backward: each CTA of a cluster
    owns a column slice and the statistics meet through distributed shared
    memory. Matches the reference with residual, float32 weights, zero-centred
    gamma, no weight and row-strided input; rows whose vectors do not split
    evenly (4104 float32: 1026 vectors) fall back to a smaller cluster, as
    does 16 (sm_90's non-portable size) on other archs."""
    if op == "layer_norm" and variant == "residual":
        variant = "weight_bias"
    m = 37 if n <= 24576 else 5
    with _tuning.override(fwd_cluster=cluster, bwd_cluster=cluster):
        plan = rtcnorm.explain(op, (m, n), dtype, mode=mode, residual=variant == "residual")
        assert 1 < plan["column_slices"] <= cluster and plan["cached_row"]
        check_contiguous_and_strided(op, m, n, dtype, variant, mode, poison)


@needs_clusters
@pytest.mark.parametrize("cluster", [4, 16])
@pytest.mark.parametrize("op", NORM_OPS)
def test_cluster_exchange_over_many_row_blocks(op, cluster, poison):
    """Each cluster walks dozens of row blocks (1003 rows over at most 33
    clusters), so the pushed partials' slots and mbarriers cycle through both
    parities and many phases, forward and backward, with a tail row block
    past M and the CTAs of a cluster free to drift apart between exchanges."""
    m, n, dtype = 1003, 32768, torch.bfloat16
    variant = "weight" if op == "rms_norm" else "weight_bias"
    # The meeting loop's exchange (the deferred slices have their own test).
    with _tuning.override(fwd_cluster=cluster, bwd_cluster=cluster, fwd_defer_stats=1):
        plan = rtcnorm.explain(op, (m, n), dtype)
        assert plan["cluster"] == cluster and plan["backward"]["column_slices"] == cluster, plan
        check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)


@needs_clusters
@pytest.mark.parametrize(
    ("op", "m", "variant"),
    [("rms_norm", 1, "weight"), ("rms_norm", 37, "residual"), ("rms_norm", 300, "zero_centered"),
     ("rms_norm", 133, "no_weight"), ("layer_norm", 1, "weight_bias"), ("layer_norm", 300, "bias"),
     ("layer_norm", 37, "zero_centered")],
)  # fmt: skip
def test_float32_rows_of_131072_on_16_cta_clusters(op, m, variant, poison):
    """float32 rows of 131072 run their backward on sm_90's 16-CTA clusters
    (slices of 8192, 16 elements a thread: docs/history.md entry 68)
    rather than 8 spilling slices or the split design; forward and backward
    match the reference, contiguous and row-strided, and dW / dB are the same
    bits on every run."""
    n, dtype = 131072, torch.float32
    plan = rtcnorm.explain(op, (m, n), dtype, residual=variant == "residual")["backward"]
    if torch.cuda.get_device_capability() == (9, 0):
        assert plan["column_slices"] == 16 and not plan["split"] and plan["cached_row"], plan
    check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)
    t = make(op, (m, n), dtype)
    first = run(op, t)
    again = run(op, t)
    for name in first:
        assert torch.equal(again[name], first[name]), name


@needs_clusters
@pytest.mark.parametrize("op", NORM_OPS)
def test_cluster_weight_grads_are_bitwise_reproducible_and_match_one_cta(op):
    """The cluster backward's dW/dB are the same bits on every run, and agree
    with the one-CTA design to rounding of the partial sums."""
    t = make(op, (3001, 16384), torch.float32)
    with _tuning.override(bwd_cluster=1):
        single = run(op, t)
    assert rtcnorm.explain(op, (3001, 16384), torch.float32)["backward"]["cluster"] == 2
    first = run(op, t)
    for _ in range(3):
        again = run(op, t)
        for name in first:
            assert torch.equal(again[name], first[name]), name
    check(op, first, ref(op, t), 3001)
    for name in first:
        torch.testing.assert_close(first[name], single[name], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", [None, "static_persistent"], ids=lambda m: m or "auto")
@pytest.mark.parametrize(
    ("n", "variant", "dtype", "cluster"),
    [(128, "weight", torch.bfloat16, 1), (1000, "zero_centered", torch.float16, 1), (4096, "mixed", torch.bfloat16, 1),
     (8192, "residual", torch.bfloat16, 1), (6144, "no_weight", torch.float32, 1), (12288, "weight", torch.float32, 2),
     (32768, "residual", torch.bfloat16, 4), (65536, "mixed", torch.bfloat16, 8)],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_backward_rows_staged_through_shared_memory(op, n, variant, dtype, cluster, mode, poison):
    """The backward forced to stage x, dy (and the residual's dh) through its
    shared-memory ring, alone and across clusters: several rows per CTA at
    N = 128, the ring's tail rows past M, residual, float32 weights,
    zero-centred gamma, no weight and row-strided input all match the
    reference."""
    if cluster > 1 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90+")
    if op == "layer_norm" and variant == "residual":
        variant = "weight_bias"
    m = 131 if n <= 16384 else 11
    with _tuning.override(bwd_stage=2, bwd_cluster=cluster):
        plan = rtcnorm.explain(op, (m, n), dtype, mode=mode, residual=variant == "residual")["backward"]
        # (Without column slices, the rule may pair the CTAs as row clusters.)
        assert plan["staged"] and plan["column_slices"] == cluster and plan["smem"] > 0
        check_contiguous_and_strided(op, m, n, dtype, variant, mode, poison)


@needs_clusters
@pytest.mark.parametrize(
    ("m", "n", "dtype", "cluster"),
    [(2 * 132 + 5, 32768, torch.bfloat16, 0), (37, 65536, torch.float16, 0), (9, 131072, torch.bfloat16, 0),
     (300, 20480, torch.bfloat16, 4), (131, 24576, torch.float16, 8), (3, 32768, torch.bfloat16, 8),
     (1029, 32768, torch.bfloat16, 0), (1100, 24576, torch.bfloat16, 0), (1030, 23552, torch.bfloat16, 0)],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_deferred_cluster_sums_change_no_bit(op, m, n, dtype, cluster, poison):
    """Staged column-cluster rows whose cluster sums are collected one row
    block late (kDeferStats) give bitwise the dx, dW and dB of the same
    cluster meeting at every row block (both rings leave one CTA an SM, so
    the grids match): the rule's cluster sizes and forced ones (clusters of 8
    for 1024+ rows of 23552-24576, slices of uneven vectors), a grid with
    more clusters than row blocks, tail row blocks past M, float16. Both
    match the reference, contiguous and strided. (Hardware clusters both:
    the grid groups of test_grid_group_slices_match_the_cluster_exchange
    have grids of their own.)"""
    t = make(op, (m, n), dtype)
    with _tuning.override(bwd_defer_stats=2, bwd_cluster=cluster, bwd_grid_exchange=1):
        cluster = rtcnorm.explain(op, (m, n), dtype)["backward"]["cluster"]
    results = {}
    for name, defer in (("met", 1), ("deferred", 2)):
        with _tuning.override(bwd_defer_stats=defer, bwd_cluster=cluster, bwd_grid_exchange=1):
            plan = rtcnorm.explain(op, (m, n), dtype)["backward"]
            assert plan["cluster"] > 1 and plan["staged"] and plan["deferred_stats"] == (defer == 2), plan
            assert plan["ring_stages"] == (3 if defer == 2 else 2), plan
            results[name] = run_poisoned_and_repeated(op, t, poison)
            if name == "deferred":
                check_contiguous_and_strided(
                    op, m, n, dtype, "weight" if op == "rms_norm" else "weight_bias", None, poison
                )
    for key in results["met"]:
        assert torch.equal(results["met"][key], results["deferred"][key]), key
    check(op, results["deferred"], ref(op, t), m)


@needs_clusters
@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant", "cluster"),
    [(4 * 132 + 5, 16384, torch.bfloat16, "weight_bias", 16), (300, 12288, torch.float16, "zero_centered", 16),
     (1000, 10240, torch.bfloat16, "mixed", 16), (3, 16384, torch.bfloat16, "weight_bias", 16),
     (37, 9216, torch.float16, "weight_bias", 16), (2100, 12288, torch.bfloat16, "weight_bias", 4)],
)  # fmt: skip
def test_layer_norm_deferred_slices_two_ctas_an_sm(m, n, dtype, variant, cluster, poison):
    """LayerNorm's dW and dB on 16-bit rows of up to 16384 elements: deferred
    cluster slices on 256-thread CTAs, two an SM (docs/history.md entries 52 and 55: on
    sm_90 16 CTAs a row, 4 for rows short of 16384 in grids of 2048+ rows; 8
    elsewhere). dx is bitwise that of the same cluster meeting at every row
    block on 512-thread CTAs (the same row groups and merge order); dW and dB
    match the reference and repeat bitwise; contiguous and strided rows match
    the reference; a grid of one row block writes the gradients itself."""
    if torch.cuda.get_device_capability() != (9, 0):
        cluster = 8
    # (2048+ rows of 12288 and 16384 take slices of 8192 on sm_90, entry 64: the pair plan here.)
    with _tuning.override(bwd_staged_slices=1):
        pair_plan_slices(m, n, dtype, variant, cluster, poison)


def pair_plan_slices(m, n, dtype, variant, cluster, poison):
    x, w, b, zcg = ln_inputs((m, n), [n], dtype, "cuda", variant, shift=0.0 if variant == "mixed" else 100.0)
    dy = torch.randn_like(x)
    plan = rtcnorm.explain("layer_norm", (m, n), dtype, weight_dtype=w.dtype, zero_centered_gamma=zcg)["backward"]
    assert plan["column_slices"] == cluster and plan["block"] <= 256 and plan["deferred_stats"], plan
    assert plan["staged"] and plan["direct_grads"] == (plan["row_blocks"] == 1), plan

    def backward():
        _, mean, rstd = OPS.layer_norm(x, [n], w, b, 1e-5, None, zcg)
        return OPS.layer_norm_backward(dy, x, mean, rstd, w, b, [n], zcg, True, True)

    poison(4 * x.numel() * x.element_size())
    first = backward()
    for got, again in zip(first, backward()):
        assert torch.equal(got, again)
    with _tuning.override(bwd_defer_stats=1, bwd_cluster=cluster):
        met = rtcnorm.explain("layer_norm", (m, n), dtype, weight_dtype=w.dtype, zero_centered_gamma=zcg)["backward"]
        assert met["cluster"] == cluster and not met["deferred_stats"], met
        threads_per_row = [k["kernel"].split(", ")[4] for k in (plan, met)]  # <T, W, N, VEC, TPR, ...>
        assert threads_per_row[0] == threads_per_row[1], (plan, met)
        met_dx = backward()[0]
    assert torch.equal(first[0], met_dx)
    expected = ref_layer_norm(x, [n], w, b, zero_centered_gamma=zcg, dy=dy)
    for name, got in zip(("dx", "dw", "db"), first):
        assert_close(got, expected[name], what=name, reduce_len=m if name != "dx" else 1)
    check_contiguous_and_strided("layer_norm", m, n, dtype, variant, None, poison)


@needs_clusters
@pytest.mark.parametrize(
    ("op", "m", "n", "dtype", "cluster"),
    [("rms_norm", 1029, 32768, torch.bfloat16, 0), ("layer_norm", 1100, 65536, torch.bfloat16, 8),
     ("layer_norm", 300, 16384, torch.float16, 0), ("rms_norm", 37, 131072, torch.bfloat16, 16),
     ("layer_norm", 23, 24576, torch.bfloat16, 8), ("rms_norm", 700, 24576, torch.float16, 8),
     ("layer_norm", 2 * 132 + 5, 131072, torch.bfloat16, 0)],
)  # fmt: skip
def test_grid_group_slices_match_the_cluster_exchange(op, m, n, dtype, cluster, poison):
    """Deferred column slices as groups of a cooperative launch whose row sums
    meet through global memory (kGridExchange, entry 59): dx is bitwise that
    of the same slices as a hardware cluster (the same row sums merged in the
    same order); dW and dB repeat bitwise and match the reference, as do
    contiguous and strided rows. The rule's shapes and forced ones: a grid of
    fewer row blocks than groups, tail row blocks past M, float16."""
    t = make(op, (m, n), dtype)
    with _tuning.override(bwd_defer_stats=2, bwd_cluster=cluster, bwd_grid_exchange=1):
        hw = rtcnorm.explain(op, (m, n), dtype)["backward"]
        assert hw["cluster"] > 1 and hw["deferred_stats"] and not hw["grid_exchange"], hw
        cluster_run = run(op, t)
    with _tuning.override(bwd_defer_stats=2, bwd_cluster=cluster, bwd_grid_exchange=2):
        plan = rtcnorm.explain(op, (m, n), dtype)["backward"]
        assert plan["grid_exchange"] and plan["cluster"] == 1 and plan["column_slices"] == hw["cluster"], plan
        assert plan["kernel"].split(", ")[:7] == hw["kernel"].split(", ")[:7], (plan, hw)
        assert plan["grid"] <= torch.cuda.get_device_properties(0).multi_processor_count * 2, plan
        got = run_poisoned_and_repeated(op, t, poison)
        variant = "weight" if op == "rms_norm" else "weight_bias"
        check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)
    assert torch.equal(got["dx"], cluster_run["dx"])
    check(op, got, ref(op, t), m)


@needs_clusters
@pytest.mark.parametrize(
    ("op", "m", "n", "dtype", "variant", "slices"),
    [("rms_norm", 1100, 12288, torch.bfloat16, "weight", 4), ("rms_norm", 1030, 14336, torch.bfloat16, "mixed", 8),
     ("rms_norm", 300, 16384, torch.float16, "zero_centered", 2), ("rms_norm", 129, 9216, torch.bfloat16, "no_weight", 2),
     ("rms_norm", 2 * 132 + 5, 10240, torch.bfloat16, "weight", 2), ("rms_norm", 4097, 13312, torch.float16, "weight", 2),
     ("layer_norm", 2100, 16384, torch.bfloat16, "weight_bias", 2), ("layer_norm", 2050, 12288, torch.float16,
     "zero_centered", 4), ("layer_norm", 2048, 11264, torch.bfloat16, "weight_bias", 2),
     ("layer_norm", 1030, 14336, torch.bfloat16, "weight", 8)],
)  # fmt: skip
def test_staged_width_rows_as_deferred_slices(op, m, n, dtype, variant, slices, poison):
    """16-bit rows of 8193-16384 elements split into column slices (entry 64,
    the sm_90 rule; forced elsewhere): RMSNorm rows one CTA would stage, and
    LayerNorm's dW and dB where the pair plan would defer (11264 and 13312:
    slices of 16 elements a thread that keep their terms and meet at every row
    block, not deferred). Uneven vectors (14336 on 8 CTAs), tail
    row blocks past M, grids of fewer row blocks than groups, float16, float32
    weights, zero-centred gamma and no weight: dx, dW and dB repeat bitwise and
    match the reference contiguous and strided, as the previous plan's do."""
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    over = {} if sm90 else {"bwd_staged_slices": 2}
    wdt = torch.float32 if variant == "mixed" else None
    kw = dict(
        weight_dtype=wdt, elementwise_affine=variant != "no_weight", zero_centered_gamma=variant == "zero_centered"
    )
    if op == "layer_norm":
        kw["bias"] = variant in ("weight_bias", "zero_centered")
    with _tuning.override(**over):
        plan = rtcnorm.explain(op, (m, n), dtype, **kw)["backward"]
        assert plan["column_slices"] > 1 and plan["staged"] and plan["cached_row"], plan
        if sm90:
            assert plan["column_slices"] == slices, plan
            assert plan["deferred_stats"] == (n not in (11264, 13312)) and plan["block"] > 256, plan
        check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)
        if variant in ("weight", "weight_bias"):
            t = make(op, (m, n), dtype)
            check(op, run_poisoned_and_repeated(op, t, poison), ref(op, t), m)
    with _tuning.override(bwd_staged_slices=1):
        assert rtcnorm.explain(op, (m, n), dtype, **kw)["backward"]["kernel"] != plan["kernel"] or op == "layer_norm"
        check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)


def forward_outputs(op, x, w, b, zcg, r):
    """Every output of the forward op, called directly: y and the statistics (and h)."""
    n = x.shape[-1]
    if op == "layer_norm":
        return OPS.layer_norm(x, [n], w, b, 1e-5, None, zcg)
    if r is not None:
        return OPS.add_rms_norm(x, r, [n], w, None, None, zcg)
    return OPS.rms_norm(x, [n], w, None, None, zcg)


def check_forward_bits(op, x, w, b, zcg, r, expected, poison):
    """After poisoning, the forward's outputs are bitwise `expected`, and the
    same bits again on a second call."""
    poison(4 * x.numel() * x.element_size())
    got = forward_outputs(op, x, w, b, zcg, r)
    for a, c in zip(got, expected):
        assert torch.equal(a, c)
    for a, c in zip(forward_outputs(op, x, w, b, zcg, r), got):
        assert torch.equal(a, c)


def op_inputs(op, m, n, dtype, variant, shift=0.0):
    """x, w, b, zcg, r of an m x n case on the GPU (LayerNorm's x shifted by
    `shift`), and the explain() keywords that describe them."""
    if op == "rms_norm":
        x, w, zcg, r = rms_inputs((m, n), [n], dtype, "cuda", variant)
        b = None
        kwargs = {"elementwise_affine": w is not None}
    else:
        x, w, b, zcg = ln_inputs((m, n), [n], dtype, "cuda", variant, shift=shift)
        r = None
        kwargs = {"elementwise_affine": w is not None, "bias": b is not None}
    kwargs.update(residual=r is not None, weight_dtype=None if w is None else w.dtype)
    return x, w, b, zcg, r, kwargs


@needs_clusters
@pytest.mark.parametrize(
    ("op", "m", "n", "dtype", "variant", "cluster", "forced"),
    [("rms_norm", 16, 131072, torch.bfloat16, "weight", 0, False),
     ("layer_norm", 64, 262144, torch.bfloat16, "weight_bias", 0, False),
     ("layer_norm", 300, 131072, torch.float32, "bias", 0, False),
     ("rms_norm", 32, 131072, torch.float16, "residual", 0, True),
     ("rms_norm", 1003, 32768, torch.bfloat16, "zero_centered", 4, True),
     ("layer_norm", 1003, 24576, torch.bfloat16, "mixed", 4, True),
     ("layer_norm", 777, 65536, torch.float16, "weight", 8, True)],
)  # fmt: skip
def test_forward_grid_groups_match_the_cluster_exchange(op, m, n, dtype, variant, cluster, forced, poison):
    """Forward column slices as groups of a persistent cooperative launch whose
    statistics meet through global memory (kGridExchange, entry 60): y, the
    statistics and h are bitwise those of the same slices as a hardware
    cluster (the same partials merged in the same order), repeat bitwise, and
    match the reference contiguous and strided. The rule's shapes (one CTA an
    SM, or a grid of about one wave) and forced ones: groups walking many row
    blocks with a tail past M, three-warp slices whose LayerNorm moments merge
    by the general formula (24576 in 4 slices), a residual, a bias alone."""
    shift = 0.0 if dtype == torch.float32 or variant == "mixed" else 100.0
    x, w, b, zcg, r, kwargs = op_inputs(op, m, n, dtype, variant, shift)
    with _tuning.override(fwd_cluster=cluster, fwd_grid_exchange=1):
        hw = rtcnorm.explain(op, (m, n), dtype, **kwargs)
        assert hw["cluster"] > 1 and not hw["grid_exchange"], hw
        cluster_out = forward_outputs(op, x, w, b, zcg, r)
    with _tuning.override(fwd_cluster=cluster, fwd_grid_exchange=2 if forced else 0):
        plan = rtcnorm.explain(op, (m, n), dtype, **kwargs)
        assert plan["grid_exchange"] and plan["cluster"] == 1 and plan["column_slices"] == hw["cluster"], plan
        assert plan["persistent"] and plan["mode"] == "static_persistent", plan
        assert plan["kernel"].split(", ")[:7] == hw["kernel"].split(", ")[:7], (plan, hw)
        assert plan["grid"] <= torch.cuda.get_device_properties(0).multi_processor_count * plan["blocks_per_sm"], plan
        check_forward_bits(op, x, w, b, zcg, r, cluster_out, poison)
        check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)


@needs_clusters
@pytest.mark.parametrize(
    ("op", "m", "n", "dtype", "variant", "tuning"),
    [("rms_norm", 512, 131072, torch.bfloat16, "weight", {}),
     ("rms_norm", 300, 131072, torch.float16, "zero_centered", {}),
     ("rms_norm", 257, 131072, torch.float32, "no_weight", {}),
     ("rms_norm", 64, 262144, torch.bfloat16, "mixed", {}),
     ("rms_norm", 129, 131072, torch.bfloat16, "weight", {"fwd_grid_exchange": 1}),
     ("rms_norm", 1003, 32768, torch.bfloat16, "weight", {"fwd_cluster": 4, "fwd_defer_stats": 2}),
     ("rms_norm", 40, 131072, torch.bfloat16, "weight", {"fwd_defer_stats": 2, "fwd_ring_stages": 5}),
     ("layer_norm", 777, 65536, torch.bfloat16, "weight_bias",
      {"fwd_defer_stats": 2, "fwd_ring_stages": 4, "fwd_wide_ln_regs": 1}),
     ("layer_norm", 300, 131072, torch.float32, "bias", {"fwd_defer_stats": 2}),
     ("layer_norm", 1003, 24576, torch.bfloat16, "mixed", {"fwd_cluster": 4, "fwd_defer_stats": 2})],
)  # fmt: skip
def test_forward_deferred_slices_match_the_meeting_loop(op, m, n, dtype, variant, tuning, poison):
    """Column slices staged through a shared-memory ring whose group
    statistics are collected one row block late (kDeferStats, entry 66): y
    and the statistics are bitwise those of the meeting loop on the same
    slices (the same partials merged in the same order), repeat bitwise, and
    match the reference contiguous and strided. The rule's shapes (RMSNorm,
    many row blocks a group, a tail past M, 16 slices) and forced ones: a
    hardware cluster, rings of 4 and 5 stages, LayerNorm's moments (equal
    counts, and three-warp slices merging by the general formula)."""
    x, w, b, zcg, r, kwargs = op_inputs(op, m, n, dtype, variant, 0.0 if variant == "mixed" else 100.0)
    base = {k: v for k, v in tuning.items() if k in ("fwd_cluster", "fwd_grid_exchange", "fwd_wide_ln_regs")}
    with _tuning.override(fwd_defer_stats=1, **base):
        meeting = rtcnorm.explain(op, (m, n), dtype, **kwargs)
        expected = forward_outputs(op, x, w, b, zcg, r)
    with _tuning.override(**tuning):
        plan = rtcnorm.explain(op, (m, n), dtype, **kwargs)
        assert kernel_flags(plan["kernel"]) & ((1 << 16) | (1 << 29)) == (1 << 16) | (1 << 29), plan
        assert plan["kernel"].split(", ")[2:7] == meeting["kernel"].split(", ")[2:7], (plan, meeting)
        assert plan["persistent"] and plan["smem"] > 0 and plan["column_slices"] > 1
        check_forward_bits(op, x, w, b, zcg, r, expected, poison)
        check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)


@pytest.mark.parametrize(
    ("op", "m", "n", "dtype", "variant", "phase"),
    [("layer_norm", 300, 12288, torch.bfloat16, "weight_bias", "fwd"),
     ("layer_norm", 301, 14336, torch.float16, "zero_centered", "fwd"),
     ("layer_norm", 257, 16384, torch.bfloat16, "mixed", "fwd"),
     ("layer_norm", 280, 7168, torch.float32, "weight_bias", "fwd"),
     ("layer_norm", 300, 8192, torch.float32, "bias", "fwd"),
     ("layer_norm", 1100, 49664, torch.bfloat16, "weight_bias", "fwd"),  # 49152: wide_ln_register_row
     ("layer_norm", 16387, 512, torch.bfloat16, "mixed", "fwd"),
     ("rms_norm", 1001, 2560, torch.bfloat16, "weight", "bwd"),
     ("rms_norm", 997, 1536, torch.float32, "zero_centered", "bwd"),
     ("layer_norm", 333, 5120, torch.float32, "weight_bias", "bwd")],
)  # fmt: skip
def test_register_headroom_bounds(op, m, n, dtype, variant, phase, poison):
    """Kernels whose launch bounds the register-headroom rules lowered (entry
    67, sm_90: fewer CTAs an SM so that ptxas need not spill) match the
    reference contiguous and strided; forward outputs are bitwise those of the
    previous bounds (the same arithmetic in a different register allocation)."""
    x, w, b, zcg, r, kwargs = op_inputs(op, m, n, dtype, variant)

    def bound():
        plan = rtcnorm.explain(op, (m, n), dtype, **kwargs)
        return int((plan["kernel"] if phase == "fwd" else plan["backward"]["kernel"]).split(", ")[-1].rstrip(">"))

    with _tuning.override(reg_headroom=1):
        before = bound()
        previous = forward_outputs(op, x, w, b, zcg, r)
    if torch.cuda.get_device_capability() == (9, 0):
        assert bound() < before
    check_forward_bits(op, x, w, b, zcg, r, previous, poison)
    check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize(
    ("m", "n", "dtype"),
    [(3072, 1024, torch.bfloat16), (1057, 2048, torch.float16), (768, 4096, torch.bfloat16),
     (300, 8192, torch.bfloat16)],
)  # fmt: skip
def test_one_wave_rows_with_gamma_beside_x_match_plain_loads(op, m, n, dtype, poison):
    """16-bit rows in one wave of 128-thread CTAs at four an SM, gamma (and
    beta) loaded into registers beside x (RMSNorm: where the CTAs hold one or
    two rows or number at most three an SM): forward outputs bitwise those of
    the plain loads (the same arithmetic), contiguous and row-strided, and
    forward and backward against the reference."""
    variant = "weight_bias" if op == "layer_norm" else "weight"
    x, w, b, zcg, r, kwargs = op_inputs(op, 2 * m, n, dtype, variant)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = rtcnorm.explain(op, (m, n), dtype, **kwargs)
    if not 2 * sms < plan["row_blocks"] <= 4 * sms:
        pytest.skip(f"{m} rows are not one wave at four CTAs an SM on {sms} SMs")
    preload = bool(kernel_flags(plan["kernel"]) & PRELOAD_AFFINE)
    assert plan["kernel"].endswith(", 4>") and preload == one_wave_packs(op, plan, sms), plan
    for rows in (x[:m], x[::2]):
        with _tuning.override(fwd_affine_prefetch=1):
            plain = forward_outputs(op, rows, w, b, zcg, r)
        check_forward_bits(op, rows, w, b, zcg, r, plain, poison)
    check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)


# Grid groups in both directions wherever rows are split into column slices.
GROUP_SHAPES = {"rms_norm": [(300, 32768), (1029, 32768)], "layer_norm": [(1100, 65536), (37, 65536)]}


def grid_groups(op):
    slices = {"rms_norm": {"fwd_cluster": 4}, "layer_norm": {"fwd_cluster": 8, "bwd_cluster": 8}}[op]
    return _tuning.override(fwd_grid_exchange=2, bwd_grid_exchange=2, bwd_defer_stats=2, **slices)


def tags_after(base, spans):
    """The stream's next tag base after leases of `spans` tags each
    (ops/grid_exchange_buffers.cpp): a lease that would pass 2^32 - 1 starts a
    fresh buffer at 0."""
    for span in spans:
        if base > 2**32 - 1 - span:
            base = 0
        base += span
    return base


@needs_clusters
@pytest.mark.parametrize("op", NORM_OPS)
def test_grid_exchange_words_are_reused_without_zeroing(op, poison):
    """Grid-group launches share one exchange buffer per stream and never zero
    it: each launch polls for tags above every earlier launch's (the stream's
    counter moves by its row blocks). Shapes of different row counts in turn,
    then the counter run up to the 32-bit limit (the launch that would pass it
    takes a fresh buffer at 0), give bitwise the first launch's outputs."""
    dev = torch.cuda.current_device()
    shapes = GROUP_SHAPES[op]
    with grid_groups(op):
        spans = []
        for shape in shapes:
            plan = rtcnorm.explain(op, shape, torch.bfloat16)
            assert plan["grid_exchange"] and plan["backward"]["grid_exchange"], plan
            spans.append((plan["row_blocks"], plan["backward"]["row_blocks"]))
        inputs = [make(op, shape) for shape in shapes]
        first = [run(op, t) for t in inputs]
        for t, shape, got in zip(inputs, shapes, first):
            check(op, got, ref(op, t), shape[0])
        for headroom in (None, 5, 0, None):
            if headroom is not None:
                rtcnorm.jit._C._advance_grid_exchange_tags(dev, 2**32 - 1 - headroom)
            for t, span, expected in zip(inputs, spans, first):
                before = rtcnorm.jit._C._grid_exchange_next_tag(dev)
                poison(4 * t["x"].numel() * t["x"].element_size())
                got = run(op, t)
                assert rtcnorm.jit._C._grid_exchange_next_tag(dev) == tags_after(before, span), (before, span)
                for name in expected:
                    assert torch.equal(got[name], expected[name]), (headroom, name)


@needs_clusters
@pytest.mark.parametrize("op", NORM_OPS)
def test_grid_groups_replay_from_a_graph(op):
    """A grid-group launch captured into a CUDA graph gets a zeroed exchange
    buffer of its own (the zeroing is captured too), since every replay repeats
    the launch's tags: replays on fresh inputs, with eager grid-group launches
    on the stream between them, match eager runs bitwise."""
    shape = GROUP_SHAPES[op][0]
    with grid_groups(op):
        t = make(op, shape)
        graph, outputs = capture_run(op, t)
        for _ in range(3):
            refill(op, t)
            graph.replay()
            eager = run(op, t)
            torch.cuda.synchronize()
            for name in eager:
                assert torch.equal(outputs[name], eager[name]), name
        check(op, outputs, ref(op, t), shape[0])


@pytest.mark.parametrize(
    ("n", "dtype", "variant"),
    [(16384, torch.bfloat16, "weight"), (16384, torch.float16, "zero_centered"), (16384, torch.bfloat16, "mixed"),
     (5120, torch.bfloat16, "weight"), (5120, torch.float16, "mixed"), (4608, torch.bfloat16, "zero_centered")],
)  # fmt: skip
def test_rms_norm_backward_deep_ring_and_two_per_sm_prefetch(n, dtype, variant, poison):
    """RMSNorm backward rules of docs/history.md entry 46: one-row CTAs alone on their SM
    stage through a 3-stage ring (N = 16384, 192 KB), and one-row CTAs two per
    SM with kept terms prefetch their next row (N = 4608 / 5120). Many rows a
    CTA, a grid of fewer rows than SMs, and row-strided rows match the
    reference; grids of one or two row blocks a CTA keep the two-stage ring and
    no prefetch."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (sm_90 splits such rows into deferred slices, entry 64: one CTA a row here.)
    with _tuning.override(bwd_staged_slices=1):
        deep_ring_rows(n, dtype, variant, sms, poison)


def deep_ring_rows(n, dtype, variant, sms, poison):
    for m in (6 * sms + 7, sms // 2 + 1):
        plan = rtcnorm.explain("rms_norm", (m, n), dtype, weight_dtype=torch.float32 if variant == "mixed" else None)
        bwd = plan["backward"]
        many = m > 4 * sms  # several row blocks a CTA: the rules' domain
        if n == 16384 and torch.cuda.get_device_capability() >= (9, 0):  # 227 KB of shared memory a CTA
            stages = 3 if many else 2
            assert bwd["staged"] and bwd["ring_stages"] == stages and bwd["smem"] == stages * 2 * n * 2, bwd
        elif n != 16384:
            assert (
                not bwd["staged"] and bwd["keep_terms"] and bool(kernel_flags(bwd["kernel"]) & PREFETCH_NEXT) == many
            ), bwd
        check_contiguous_and_strided("rms_norm", m, n, dtype, variant, None, poison)


@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant"),
    [(4097, 1024, torch.bfloat16, "weight"), (300, 8192, torch.bfloat16, "residual"),
     (1000, 4096, torch.float16, "zero_centered"), (257, 8192, torch.float32, "no_weight"),
     (3, 4096, torch.bfloat16, "mixed"), (777, 2000, torch.bfloat16, "weight")],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_backward_terms_kept_between_passes_and_ring_depth_change_no_bit(op, m, n, dtype, variant, poison):
    """The backward with xhat, w*dy and gamma kept as floats between its passes
    (the rule where registers allow) and with the two reads (bwd_keep_terms=1)
    gives bitwise the same dx, dW (and dB); rows staged through a ring of 3 or
    4 stages give the same dx (dW and dB then come from the staged plan's grid).
    All match the reference, contiguous and strided."""
    if op == "layer_norm" and variant == "residual":
        variant = "weight_bias"
    kw = dict(residual=variant == "residual", device="cuda")
    results = {}
    for name, cfg in {"terms": dict(bwd_keep_terms=2), "two_reads": dict(bwd_keep_terms=1),
                      "ring3": dict(bwd_keep_terms=2, bwd_stage=2, bwd_ring_stages=3),
                      "ring4": dict(bwd_keep_terms=1, bwd_stage=2, bwd_ring_stages=4)}.items():  # fmt: skip
        with _tuning.override(**cfg):
            plan = rtcnorm.explain(op, (m, n), dtype, **kw)["backward"]
            assert plan["keep_terms"] == (cfg["bwd_keep_terms"] == 2), plan
            if "bwd_ring_stages" in cfg:
                if not plan["staged"]:  # a float32 ring of 4 x 8192 x 2 tensors exceeds 227 KB
                    assert dtype == torch.float32, plan
                    continue
                assert plan["ring_stages"] == cfg["bwd_ring_stages"], plan
            torch.manual_seed(7)
            t = make(op, (m, n), dtype)
            poison(4 * t["x"].numel() * t["x"].element_size())
            results[name] = run(op, t)
            if name in ("terms", "ring4"):
                check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)
    expected = ref(op, t)
    for name, got in results.items():
        # dW / dB depend on the grid, which a deeper ring may shrink (fewer
        # CTAs fit per SM): bitwise only against the same plan's grid.
        same_grid = name == "terms"
        for key in got:
            if key in ("y", "dx") or same_grid:
                assert torch.equal(got[key], results["two_reads"][key]), (name, key)
        check(op, got, expected, m)


@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant"),
    [(1, 4096, torch.bfloat16, "weight"), (2, 4096, torch.bfloat16, "residual"), (1, 8192, torch.float16, "mixed"),
     (1, 7, torch.float32, "zero_centered"), (64, 128, torch.bfloat16, "weight"), (3, 1000, torch.float32, "bias_only"),
     (1, 65536, torch.bfloat16, "weight"), (1, 2048, torch.bfloat16, "bias_only"), (1, 4096, torch.float32, "mixed"),
     (1, 6144, torch.float16, "zero_centered")],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_backward_of_one_row_block_writes_its_gradients_directly(op, m, n, dtype, variant, poison):
    """Where every row fits one row block, its CTA (or cluster: N = 65536)
    writes dW / dB in the weight dtype itself: bitwise what the partial row
    and the column reduce give (bwd_direct_grads=1), and the reference's,
    contiguous and strided, for every weight variant. (Column CTAs off: they
    take a lone row block of more than one row, see the test below.)"""
    if n == 65536 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the 65536-wide one-row plan is a cluster: sm_90+")
    if variant == "bias_only":
        variant = "no_weight" if op == "rms_norm" else "bias"
    if op == "layer_norm" and variant == "residual":
        variant = "weight_bias"
    results = {}
    for value in (1, 2):
        with _tuning.override(bwd_direct_grads=value, bwd_column_grads=1):
            plan = rtcnorm.explain(op, (m, n), dtype, device="cuda")["backward"]
            assert plan["direct_grads"] == (value == 2) and plan["row_blocks"] == 1, plan
            torch.manual_seed(11)
            t = make(op, (m, n), dtype)
            poison(4 * t["x"].numel() * t["x"].element_size())
            results[value] = run(op, t)
            if value == 2:
                check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)
    for key, got in results[2].items():
        assert torch.equal(got, results[1][key]), key
    check(op, results[2], ref(op, t), m)


@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant"),
    [(32, 4096, torch.bfloat16, "weight"), (8, 4096, torch.bfloat16, "residual"), (64, 1024, torch.float16, "mixed"),
     (100, 1000, torch.float32, "zero_centered"), (33, 4097, torch.bfloat16, "bias_only"),
     (1, 4096, torch.bfloat16, "weight"), (256, 1024, torch.bfloat16, "weight"), (13, 2048, torch.float32, "mixed"),
     (2, 4096, torch.bfloat16, "residual"), (2, 1024, torch.bfloat16, "mixed"), (3, 1000, torch.float32, "bias_only"),
     (64, 128, torch.bfloat16, "weight")],  # a lone row block of a few rows (narrow ones too)
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_backward_column_ctas_write_the_weight_grads(op, m, n, dtype, variant, poison):
    """Grids of at most a row block an SM may hand dW / dB to column CTAs beside
    the row CTAs (bwd_column_grads=2; one row forced, odd N in scalar columns):
    y and dx bitwise those of the partial-row design (1), dW / dB the reference's
    and bitwise the same on a second run, contiguous and row-strided."""
    if variant == "bias_only":
        variant = "no_weight" if op == "rms_norm" else "bias"
    if op == "layer_norm":
        variant = layer_norm_variant(variant)
    kw = dict(residual=variant == "residual", device="cuda")
    results = {}
    for value in (1, 2):
        with _tuning.override(bwd_column_grads=value):
            plan = rtcnorm.explain(op, (m, n), dtype, **kw)["backward"]
            assert plan["column_grads"] == (value == 2), plan
            torch.manual_seed(23)
            t = make(op, (m, n), dtype)
            poison(4 * t["x"].numel() * t["x"].element_size())
            results[value] = run(op, t)
            if value == 2:
                assert not plan["direct_grads"] and plan["grid"] == plan["row_blocks"] + plan["column_ctas"], plan
                again = run(op, t)
                for key, got in again.items():
                    assert torch.equal(got, results[2][key]), key
                check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)
    for key in ("y", "dx"):
        assert torch.equal(results[2][key], results[1][key]), key
    check(op, results[2], ref(op, t), m)


@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant"),
    [(256, 8192, torch.bfloat16, "weight"), (192, 8192, torch.float16, "zero_centered"),
     (128, 8192, torch.bfloat16, "residual"), (100, 8000, torch.bfloat16, "mixed"), (37, 8190, torch.bfloat16, "weight"),
     (200, 6000, torch.float16, "bias_only"), (2, 8192, torch.bfloat16, "weight"),
     (256, 4096, torch.bfloat16, "zero_centered"), (100, 5120, torch.float32, "weight"),
     (330, 4096, torch.bfloat16, "weight"),  # 11 rows a column lane
     # rows a 256-thread CTA does not split evenly: 3 or 2 vectors a thread
     # (5120), 224- and 192-thread rows (7168, 3072), two 96-thread rows a CTA
     # (1536), scalars (4097; 7001: LayerNorm's rows were split before)
     (256, 5120, torch.bfloat16, "weight"), (300, 5120, torch.float16, "zero_centered"),
     (128, 7168, torch.bfloat16, "residual"), (264, 7168, torch.bfloat16, "weight"), (2, 7168, torch.float16, "mixed"),
     (200, 3072, torch.bfloat16, "bias_only"), (128, 3072, torch.float32, "weight"), (256, 1536, torch.bfloat16, "mixed"),
     (33, 4097, torch.bfloat16, "weight"), (44, 7001, torch.float16, "zero_centered")],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_backward_one_wave_column_grids(op, m, n, dtype, variant, poison):
    """Grids whose row CTAs and column CTAs all fit the SMs at once hand dW / dB
    to the column CTAs (one wave) where the other plans walk row blocks or stage
    rows: y bitwise that of the plan without it (bwd_one_wave_columns=1), dx and
    dW / dB the reference's, every output bitwise the same on a second run,
    contiguous and row-strided."""
    if op == "layer_norm":
        variant = layer_norm_variant(variant)
    kw = dict(residual=variant == "residual", device="cuda")
    with _tuning.override(bwd_one_wave_columns=1):
        before = rtcnorm.explain(op, (m, n), dtype, **kw)["backward"]
        torch.manual_seed(29)
        t = make(op, (m, n), dtype)
        old = run(op, t)
    plan = rtcnorm.explain(op, (m, n), dtype, **kw)["backward"]
    if "one wave" not in plan["reason"]:
        pytest.skip(f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs: no one-wave plan here")
    assert not before["column_grads"] and plan["column_grads"] and plan["block"] <= 256, (before, plan)
    assert plan["grid"] == plan["row_blocks"] + plan["column_ctas"], plan
    got = run_poisoned_and_repeated(op, t, poison)
    assert torch.equal(got["y"], old["y"])
    check(op, got, ref(op, t), m)
    check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)


def layer_norm_variant(variant):
    """An RMSNorm input variant as LayerNorm's: no residual there, and a weight
    comes with a bias."""
    return {"residual": "weight_bias", "weight": "weight_bias"}.get(variant, variant)


@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant"),
    [(1, 4096, torch.bfloat16, "zero_centered"), (32, 4096, torch.float16, "mixed"), (132, 8192, torch.bfloat16, "weight"),
     (5, 1000, torch.float32, "weight"), (1, 65536, torch.bfloat16, "weight"), (264, 4096, torch.bfloat16, "residual")],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_forward_fetches_gamma_three_ways_to_the_same_bits(op, m, n, dtype, variant, poison):
    """gamma/beta loaded after the row reduction (fwd_affine_prefetch=1), fetched
    into L1 beside the row (2) or loaded into registers beside it (3, the few-row
    rule): the same outputs bit for bit, and the reference's, contiguous and
    strided."""
    if op == "layer_norm":
        variant = layer_norm_variant(variant)
    results = {}
    for value in (1, 2, 3):
        with _tuning.override(fwd_affine_prefetch=value):
            torch.manual_seed(5)
            if op == "rms_norm":
                x, w, zcg, r = rms_inputs((m, n), [n], dtype, "cuda", variant)
                poison(4 * x.numel() * x.element_size())
                results[value] = rtcnorm.rms_norm(x, [n], w, zero_centered_gamma=zcg, residual=r)
            else:
                x, w, b, zcg = ln_inputs((m, n), [n], dtype, "cuda", variant)
                poison(4 * x.numel() * x.element_size())
                results[value] = rtcnorm.layer_norm(x, [n], w, b, zero_centered_gamma=zcg)
            if value == 3:
                check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)
    for value in (2, 3):
        for got, want in zip(
            torch.utils._pytree.tree_leaves(results[value]), torch.utils._pytree.tree_leaves(results[1])
        ):
            assert torch.equal(got, want), value


@pytest.mark.parametrize(
    ("n", "dtype", "variant"),
    [(4096, torch.bfloat16, "weight"), (128, torch.bfloat16, "weight"), (1000, torch.float32, "zero_centered"),
     (8192, torch.float16, "residual"), (65536, torch.bfloat16, "weight")],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_backward_of_one_row_on_one_row_group(op, n, dtype, variant, poison):
    """A single row's backward runs on a CTA of one row group (at least a warp),
    gamma loaded beside the row: bitwise what the rule's wider CTA gives (forced
    by bwd_cta_threads), and the reference's."""
    if n == 65536 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the 65536-wide one-row plan is a cluster: sm_90+")
    if op == "layer_norm":
        variant = layer_norm_variant(variant)
    results = {}
    for threads in (0, 1024):
        with _tuning.override(bwd_cta_threads=threads):
            torch.manual_seed(13)
            t = make(op, (1, n), dtype)
            poison(4 * t["x"].numel() * t["x"].element_size())
            results[threads] = run(op, t)
            if threads == 0:
                check_contiguous_and_strided(op, 1, n, dtype, variant, None, poison)
    for key, got in results[0].items():
        assert torch.equal(got, results[1024][key]), key
    check(op, results[0], ref(op, t), 1)


@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant", "block"),
    [(2, 1024, torch.bfloat16, "weight", 128), (3, 1024, torch.float16, "residual", 256),
     (16, 1024, torch.bfloat16, "mixed", 128), (64, 1024, torch.bfloat16, "zero_centered", 128),
     (8, 2048, torch.float16, "weight", 128), (32, 2048, torch.bfloat16, "residual", 128),
     (2, 2048, torch.bfloat16, "no_weight", 256), (3, 4096, torch.bfloat16, "weight", 256),
     (32, 4096, torch.bfloat16, "mixed", 256), (17, 4096, torch.float16, "residual", 256)],
)  # fmt: skip
def test_rms_norm_backward_on_few_row_ctas(m, n, dtype, variant, block, poison):
    """RMSNorm's few 16-bit rows that write partial rows (column CTAs off: grids
    with them take 256-thread CTAs) on CTAs sized to them (one row block) or of
    128 threads (up to 32 row blocks): dx bitwise what 512-thread CTAs give (the
    same per-row arithmetic), dW within the reference's tolerance and bitwise the
    same from run to run, contiguous and row-strided, every weight variant."""
    with _tuning.override(bwd_column_grads=1):
        plan = rtcnorm.explain("rms_norm", (m, n), dtype, device="cuda")["backward"]
    assert plan["block"] == block and "few 16-bit rows" in plan["reason"], plan
    results = {}
    for threads in (0, 512):
        with _tuning.override(bwd_cta_threads=threads, bwd_column_grads=1):
            torch.manual_seed(17)
            t = make("rms_norm", (m, n), dtype)
            poison(4 * t["x"].numel() * t["x"].element_size())
            results[threads] = run("rms_norm", t)
            if threads == 0:
                again = run("rms_norm", t)
                assert all(torch.equal(again[k], v) for k, v in results[0].items())
                check_contiguous_and_strided("rms_norm", m, n, dtype, variant, None, poison)
    assert torch.equal(results[0]["y"], results[512]["y"]) and torch.equal(results[0]["dx"], results[512]["dx"])
    check("rms_norm", results[0], ref("rms_norm", t), m)


@pytest.mark.parametrize(
    ("n", "dtype", "variant", "min_row_blocks"),
    [(8192, torch.bfloat16, "weight", 0), (12288, torch.float16, "residual", 2), (1024, torch.bfloat16, "mixed", 7),
     (8192, torch.float32, "zero_centered", 3), (32768, torch.bfloat16, "weight", 3)],
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_backward_on_a_capped_grid(op, n, dtype, variant, min_row_blocks, poison):
    """The backward on fewer CTAs than resident, each taking several row blocks
    (the staged rule's cap, or forced on register and cluster rows), matches
    the reference, contiguous and row-strided."""
    if n > 16384 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("16-bit rows past 16384 are cluster slices only on sm_90+")
    if op == "layer_norm" and variant == "residual":
        variant = "weight_bias"
    m = 203
    # The staged rule's cap binds on grids without row clusters (sm_90+ pairs
    # CTAs there instead), so the rule's case turns them off.
    with _tuning.override(bwd_min_row_blocks=min_row_blocks, bwd_row_cluster=1 if min_row_blocks == 0 else 0):
        plan = rtcnorm.explain(op, (m, n), dtype, residual=variant == "residual", device="cuda")["backward"]
        assert plan.get("max_ctas") is not None and plan["grid"] <= plan["max_ctas"], plan
        unit = plan["column_slices"] if plan["grid_exchange"] else plan["cluster"]
        assert plan["max_ctas"] // unit < plan["row_blocks"], plan
        check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)


@pytest.mark.parametrize(
    ("m", "n", "dtype", "variant", "forced"),
    [(512, 8192, torch.bfloat16, "weight", 0),  # the rule's clusters of two, staged rows
     (1000, 8192, torch.float16, "mixed", 0), (203, 1000, torch.float32, "zero_centered", 4),
     (97, 999, torch.bfloat16, "weight", 8),  # odd N: scalar column sums, 8 uneven shares
     (300, 128, torch.bfloat16, "residual", 2),  # narrow rows: warps' bundles combined first
     (8, 4096, torch.bfloat16, "weight", 4),  # one cluster: the gradients written directly
     (16, 4096, torch.float16, "bias_only", 16),  # one cluster of 16, half its CTAs without rows
     (40, 16384, torch.bfloat16, "residual", 2)],  # dh staged in the ring too
)  # fmt: skip
@pytest.mark.parametrize("op", NORM_OPS)
def test_backward_on_row_clusters(op, m, n, dtype, variant, forced, poison):
    """The CTAs of a row cluster add up their column sums in distributed shared
    memory (the rule's clusters of two, or forced sizes up to 16): the reference's
    results contiguous and row-strided, bitwise the same dW / dB on a second run,
    and bitwise the plain grid's y and dx."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters: sm_90+")
    if forced == 16 and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("a cluster of 16 is sm_90's non-portable size")
    if variant == "bias_only":
        variant = "weight" if op == "rms_norm" else "bias"
    if op == "layer_norm":
        variant = layer_norm_variant(variant)
        if n == 16384:  # LayerNorm's 16384-wide 16-bit rows are column slices; 7168 is one staged CTA
            n = 7168
    kw = dict(residual=variant == "residual", device="cuda")
    with _tuning.override(bwd_row_cluster=forced):
        plan = rtcnorm.explain(op, (m, n), dtype, **kw)["backward"]
        assert plan["row_cluster"] and plan["cluster"] == (forced or 2), plan
        assert plan["direct_grads"] == (plan["row_blocks"] <= plan["cluster"]), plan
        check_contiguous_and_strided(op, m, n, dtype, variant, None, poison)
        torch.manual_seed(17)
        t = make(op, (m, n), dtype)
        poison(4 * t["x"].numel() * t["x"].element_size())
        first = run(op, t)
        second = run(op, t)
    for key, got in first.items():
        assert torch.equal(got, second[key]), key
    with _tuning.override(bwd_row_cluster=1):
        assert not rtcnorm.explain(op, (m, n), dtype, **kw)["backward"]["row_cluster"]
        plain = run(op, t)
    for key in ("y", "dx"):
        assert torch.equal(first[key], plain[key]), key
    check(op, first, ref(op, t), m)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("op", NORM_OPS)
def test_a_kernel_loaded_on_one_device_is_loaded_again_for_another(op):
    n = {"rms_norm": 2368, "layer_norm": 2376}[op]
    t0 = make(op, (33, n), device="cuda:0")
    run(op, t0)
    torch.cuda.synchronize(0)
    before = rtcnorm.jit.stats()
    t1 = {k: (v.to("cuda:1") if v is not None else None) for k, v in t0.items()}
    with torch.cuda.device(0):
        got = run(op, t1)
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    after = rtcnorm.jit.stats()
    assert after["module_loads"] > before["module_loads"]
    assert after["compiles"] == before["compiles"]  # the image is shared; only the load is per device
    # explain() loading a kernel on cuda:1 leaves the caller's current device alone.
    with torch.cuda.device(0):
        rtcnorm.explain(op, (33, n), mode="static_persistent", device="cuda:1")
        assert torch.cuda.current_device() == 0
    assert rtcnorm.jit.stats()["module_loads"] > after["module_loads"]
    assert all(v.device == torch.device("cuda:1") for v in got.values())
    check(op, got, ref(op, t1), 33)


def _chunked_weight_grads(op, t, out, chunk=1 << 14):
    """dW (and dB) in float64, summed over row chunks; checks dx of each chunk on the way."""
    n = t["x"].shape[-1]
    dw = torch.zeros(n, dtype=torch.float64, device=t["x"].device)
    db = torch.zeros_like(dw)
    for start in range(0, t["x"].shape[0], chunk):
        part = {k: (v[start : start + chunk] if k in ("x", "dy") else v) for k, v in t.items()}
        r = ref(op, part)
        assert_close(out["y"][start : start + chunk], r["y"], what=f"y rows {start}+")
        assert_close(out["dx"][start : start + chunk], r["dx"], what=f"dx rows {start}+")
        dw += r["dw"]
        if op == "layer_norm":
            db += r["db"]
    return dw, db


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape", [(524289, 4096), (16777217, 128), (32769, 65536)], ids=["wide_rows", "narrow_rows", "streamed_rows"]
)
@pytest.mark.parametrize("op", NORM_OPS)
def test_more_than_2_pow_31_elements(op, shape, poison, require_gpu_memory):
    numel = shape[0] * shape[1]
    assert numel > 2**31
    require_gpu_memory(5 * numel * 2 + (2 << 30))
    # Drawn in bf16 directly: a float64 draw of this size would need 17 GiB on its own.
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(shape[-1], dtype=torch.bfloat16, device="cuda") * 0.5 + 1
    b = torch.randn_like(w) if op == "layer_norm" else None
    t = {"x": x, "w": w, "b": b, "dy": torch.randn_like(x)}
    poison(2 * numel * 2)
    out = run(op, t)
    torch.cuda.synchronize()
    assert bool(torch.isfinite(out["y"]).all()) and bool(torch.isfinite(out["dx"]).all())
    dw, db = _chunked_weight_grads(op, t, out, chunk=max(1, (1 << 26) // shape[1]))
    assert_close(out["dw"], dw, what="dw", reduce_len=shape[0])
    if op == "layer_norm":
        assert_close(out["db"], db, what="db", reduce_len=shape[0])
