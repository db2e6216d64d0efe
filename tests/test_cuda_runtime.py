"""How the norm kernels behave in a CUDA program: streams, CUDA graphs,
several devices, bitwise-reproducible weight gradients and >2^31-element
tensors. All tests here need a GPU."""

from __future__ import annotations

import contextlib

import pytest
import rtcnorm
import torch
from norm_checks import (
    check_layer_norm,
    check_rms_norm,
    ln_inputs,
    rms_inputs,
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


# Grid groups in both directions wherever rows are split into column slices.
GROUP_SHAPES = {"rms_norm": [(300, 32768), (1029, 32768)], "layer_norm": [(1100, 65536), (37, 65536)]}


def tags_after(base, spans):
    """The stream's next tag base after leases of `spans` tags each
    (ops/grid_exchange_buffers.cpp): a lease that would pass 2^32 - 1 starts a
    fresh buffer at 0."""
    for span in spans:
        if base > 2**32 - 1 - span:
            base = 0
        base += span
    return base


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


@contextlib.contextmanager
def grid_groups(op):
    """Rows split into column slices that meet in global memory, both directions."""
    with (
        _tuning.norm_override("fwd", "sliced_row", grid_exchange=1),
        _tuning.norm_override("bwd", "sliced_row", grid_exchange=1),
    ):
        yield


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
