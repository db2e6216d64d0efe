"""How the norm kernels behave in a CUDA program: streams, CUDA graphs,
bitwise-reproducible weight gradients and >2^31-element tensors. All
tests here need a GPU."""

from __future__ import annotations

import pytest
import torch
from cuda_norm_util import NORM_OPS, capture_run, check, make, ref, refill, run
from reference import assert_close

pytestmark = pytest.mark.gpu


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
