"""Plans checked on a GPU: narrow rows in every mode, float32 rows on
16-CTA clusters, grid groups (exchange words reused, replay from a CUDA
graph) and kernels loaded again on a second device. All tests here need
a GPU."""

from __future__ import annotations

import contextlib

import pytest
import rtcnorm
import torch
from cuda_norm_util import NORM_OPS, capture_run, check, make, ref, refill, run
from norm_checks import (
    check_layer_norm,
    check_rms_norm,
    ln_inputs,
    rms_inputs,
)
from rtcnorm import _tuning

pytestmark = pytest.mark.gpu


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
    ("op", "n", "dtype", "variant"),
    [("layer_norm", 128, torch.bfloat16, "weight_bias"), ("layer_norm", 320, torch.bfloat16, "zero_centered"),
     ("layer_norm", 512, torch.bfloat16, "mixed"), ("layer_norm", 256, torch.float32, "no_affine"),
     ("layer_norm", 64, torch.float16, "bias"), ("rms_norm", 512, torch.bfloat16, "mixed"),
     ("rms_norm", 448, torch.float16, "zero_centered"), ("rms_norm", 512, torch.bfloat16, "no_weight")],
)  # fmt: skip
def test_narrow_rows_in_every_mode(op, n, dtype, variant, mode, poison):
    """Narrow rows, many to a CTA, with a partly filled last CTA, in each mode
    the planner is asked for: the planned design runs, and forward and
    backward match the reference, contiguous and row-strided."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m = 2 * sms * 16 + 37
    plan = rtcnorm.explain(op, (m, n), dtype, mode=mode, device="cuda")
    assert plan["design"] in ("register_row", "smem_row", "sliced_row", "reload_row"), plan
    assert plan["persistent"] == (mode == "static_persistent") or mode is None, plan
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
