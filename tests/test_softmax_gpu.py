"""The softmax family's CUDA kernels (marked ``gpu``; skipped without CUDA).

Each kernel runs on fresh random data into a NaN-poisoned output and is held
to the fp32 reference element by element, over every size class (warp rows,
CTA rows, 1024-thread rows, streamed rows), dtype, mask form and layout.
"""

from __future__ import annotations

import math

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning
from softmax_reference import (
    CAUSAL_OPS,
    DTYPES,
    OPS,
    SKS,
    assert_backward_close,
    assert_forward_close,
    call,
    check_op,
    default_shape,
    poison_next_alloc,
    random_input,
    random_mask,
    reference_softmax,
    reference_softmax_backward,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_gpu_bad_arguments():
    x = torch.randn(2, 3, 4, 5, device="cuda")
    with pytest.raises(TypeError, match=r"input must be float16, bfloat16 or float32 on CUDA, got Double"):
        rtcnorm.scaled_softmax(x.double())
    with pytest.raises(RuntimeError, match=r"mask is on cpu but input is on cuda"):
        rtcnorm.scaled_masked_softmax(x, torch.zeros(4, 5, dtype=torch.bool))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sk", SKS)
@pytest.mark.parametrize("op", OPS)
def test_gpu_matches_reference(op, sk, dtype):
    shape = default_shape(op, sk)
    x = random_input(shape, dtype, "cuda", seed=sk)
    mask = None
    if op == "scaled_masked_softmax":
        mask = random_mask((shape[0], 1, shape[2], sk), "cuda", seed=sk)
        mask[0, 0, shape[2] // 2] = True  # a fully masked row (sq may be 1)
    check_op(op, x, mask)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [(1, 4, 1, 8192), (2, 3, 1, 100), (1, 2, 7, 4097), (1, 1, 512, 4096), (2, 1, 64, 65536), (1, 1, 3, 131075)],
)
def test_gpu_aligned_causal(shape, dtype):
    check_op("scaled_aligned_causal_masked_softmax", random_input(shape, dtype, "cuda", seed=11))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s", [1, 2, 31, 1000, 2049, 4097])
def test_gpu_upper_triang(s, dtype):
    check_op("scaled_upper_triang_masked_softmax", random_input((1, 2, s, s), dtype, "cuda", seed=s))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sk", [2048, 8192, 16384, 32768, 65536, 65544, 131072, 262144, 65537])
@pytest.mark.parametrize("op", ["scaled_softmax", "scaled_masked_softmax", "scaled_aligned_causal_masked_softmax"])
def test_gpu_long_rows(op, sk, dtype):
    shape = (1, 3, 2, sk)
    mask = random_mask((1, 1, 2, sk), "cuda", seed=sk) if op == "scaled_masked_softmax" else None
    check_op(op, random_input(shape, dtype, "cuda", seed=sk), mask)


@pytest.mark.parametrize("sk", [1, 3, 8, 64, 128, 1000])
def test_gpu_many_rows(sk):
    x = random_input((65537, sk), torch.bfloat16, "cuda", seed=12)
    check_op("scaled_softmax", x)
    check_op("scaled_masked_softmax", x, random_mask((65537, sk), "cuda", seed=12))


@pytest.mark.parametrize(
    "mask_shape",
    [(2, 3, 5, 72), (2, 1, 5, 72), (1, 1, 5, 72), (5, 72), (72,), (1, 3, 1, 72), (2, 3, 5, 1), (2, 1, 1, 1), ()],
)
def test_gpu_broadcast_masks(mask_shape):
    x = random_input((2, 3, 5, 72), torch.bfloat16, "cuda", seed=13)
    check_op("scaled_masked_softmax", x, random_mask(mask_shape, "cuda", seed=13, p=0.4))


@pytest.mark.parametrize("reuse_run", [1, 3, 1 << 20])  # runs of one row, uneven runs, one run per mask row
@pytest.mark.parametrize(
    ("shape", "mask_shape"),
    [
        ((3, 7, 13, 200), (3, 1, 13, 200)),  # 7 heads share a mask row; 13 query rows, 8 row groups per CTA
        ((2, 5, 9, 4096), (2, 1, 9, 4096)),  # a CTA per row
        ((2, 3, 4, 33, 40), (1, 1, 1, 33, 40)),  # broadcast over two dims (one group of 24 rows)
        ((4, 6, 3, 1000), (4, 1, 3, 1000)),
    ],
)
def test_gpu_mask_reuse(shape, mask_shape, reuse_run):
    """Each row group reads its broadcast mask row once for a run of the rows
    sharing it: the same output, bit for bit, as reading it once per row."""
    x = random_input(shape, torch.bfloat16, "cuda", seed=21)
    m = random_mask(mask_shape, "cuda", seed=21, p=0.4)
    m[..., 1, :] = True  # fully masked rows, too
    with _tuning.softmax_override(design="mask_reuse", reuse_run=reuse_run):
        plan = rtcnorm.softmax.explain("scaled_masked_softmax", shape, torch.bfloat16, mask_shape=mask_shape)
        assert plan["forward"]["design"] == "mask_reuse", plan["forward"]
        y = check_op("scaled_masked_softmax", x, m)
    with _tuning.softmax_override(design="rows", heads_inner=1):  # the same row shape, each row reads its mask
        assert torch.equal(torch.ops.rtcnorm.scaled_masked_softmax(x, m, 0.37), y)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sk", [100, 1024, 8192, 20000])  # warp rows, CTA rows, 1024-thread rows, streamed rows
def test_gpu_l1_path_changes_no_bits(op, sk):
    """Loads through L1 (inputs of 40 MB or more) or around it: the same
    output and gradient, bit for bit, both held to the reference."""
    shape = default_shape(op, sk)
    x = random_input(shape, torch.bfloat16, "cuda", seed=sk + 3)
    mask = random_mask((shape[0], 1, shape[2], sk), "cuda", seed=sk) if op == "scaled_masked_softmax" else None
    dy = random_input(shape, torch.bfloat16, "cuda", seed=sk + 4)
    causal = op in CAUSAL_OPS
    out = {}
    for l1 in (0, 1):
        with _tuning.softmax_override(l1_alloc=l1):
            plan = rtcnorm.softmax.explain(op, shape, torch.bfloat16)
            assert plan["forward"]["knobs"]["l1_alloc"] == plan["backward"]["knobs"]["l1_alloc"] == bool(l1)
            y = check_op(op, x, mask)
            out[l1] = (y, torch.ops.rtcnorm.scaled_softmax_backward(dy, y, 0.37, causal))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cluster", [2, 4, 8])
@pytest.mark.parametrize(
    ("op", "shape"),
    [
        ("scaled_softmax", (1, 5, 1, 40000)),
        ("scaled_masked_softmax", (2, 3, 1, 8192)),
        ("scaled_aligned_causal_masked_softmax", (1, 2, 5, 9001)),  # causal prefixes of 8997-9001 keys
        ("scaled_aligned_causal_masked_softmax", (1, 4, 1, 65536)),  # a single query: the plain kernels
        ("scaled_upper_triang_masked_softmax", (1, 1, 96, 96)),  # prefixes shorter than one CTA's first piece
    ],
)
def test_gpu_few_rows_split_over_clusters(op, shape, cluster, dtype):
    """Few-row grids with each row split over a thread-block cluster (forced
    sizes; sm_90+): forward, backward and autograd held to the reference,
    with fully masked rows, and the same result, to rounding, as whole-CTA
    rows."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    x = random_input(shape, dtype, "cuda", seed=cluster)
    mask = None
    if op == "scaled_masked_softmax":
        mask = random_mask((shape[0], 1, 1, shape[-1]), "cuda", seed=cluster)
        mask[1] = True  # the second batch's rows are fully masked
    with _tuning.softmax_override(design="cluster_rows", cluster=cluster):
        plan = rtcnorm.softmax.explain(op, shape, dtype, mask_shape=None if mask is None else mask.shape)
        assert plan["forward"]["cluster"] == cluster, plan
        for e in (plan["forward"], plan["backward"]):  # a slice too long to cache streams whole rows
            assert e["cluster"] == cluster or not e["cached_row"], e
            assert e["cluster"] == 1 or e["grid"] == cluster * x.numel() // shape[-1], e
        y = check_op(op, x, mask)
    with _tuning.softmax_override(design="few_rows"):
        y1 = call(op, x, mask, 0.37)
    assert_forward_close(y, y1.float(), what="cluster against whole-CTA rows")
    if mask is not None:
        assert torch.count_nonzero(y[1]) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cluster", [None, 2, 4, 8])  # None: the planner's own split, where it makes one
@pytest.mark.parametrize(
    ("op", "shape"),
    [
        ("scaled_softmax", (1, 300, 1, 65536)),  # the planned split: 4 CTAs a row forward, 8 backward (bf16)
        ("scaled_softmax", (3, 100, 1, 12345)),  # odd keys: single-element accesses
        ("scaled_masked_softmax", (2, 3, 50, 20000)),
        ("scaled_upper_triang_masked_softmax", (1, 2, 200, 200)),
    ],
)
def test_gpu_many_rows_split_over_clusters(op, shape, cluster, dtype):
    """More rows than SMs, each split over a cluster: the clusters stride over
    row blocks. Held to the reference, with fully masked rows, and to
    rounding the same as unsplit rows."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    x = random_input(shape, dtype, "cuda", seed=31)
    mask = None
    if op == "scaled_masked_softmax":
        mask = random_mask((shape[0], 1, shape[2], shape[-1]), "cuda", seed=31)
        mask[1, :, 3] = True  # a fully masked query row in every head of the second batch
    forced = {} if cluster is None else {"design": "cluster_rows", "cluster": cluster}
    with _tuning.softmax_override(**forced):
        plan = rtcnorm.softmax.explain(op, shape, dtype, mask_shape=None if mask is None else mask.shape)
        if cluster is not None:
            assert plan["forward"]["cluster"] == cluster and plan["forward"]["design"] == "cluster_rows", plan
        y = check_op(op, x, mask)
    with _tuning.softmax_override(design="streamed"):
        y1 = call(op, x, mask, 0.37)
    assert_forward_close(y, y1.float(), what="cluster against streamed rows")
    if mask is not None:
        assert torch.count_nonzero(y[1, :, 3]) == 0


def test_gpu_mask_layouts():
    x = random_input((2, 3, 5, 64), torch.float16, "cuda", seed=14)
    m = random_mask((2, 1, 64, 5), "cuda", seed=14).transpose(-1, -2)  # keys not contiguous
    check_op("scaled_masked_softmax", x, m)
    m = random_mask((2, 1, 5, 65), "cuda", seed=15)[..., 1:]  # mask rows misaligned
    check_op("scaled_masked_softmax", x, m)
    x5 = random_input((2, 3, 2, 5, 40), torch.bfloat16, "cuda", seed=16)
    m5 = random_mask((2, 1, 2, 1, 40), "cuda", seed=16).expand(2, 1, 2, 5, 40)
    check_op("scaled_masked_softmax", x5, m5)
    m6 = random_mask((2, 3, 2, 5, 40), "cuda", seed=17).permute(2, 0, 3, 1, 4).contiguous().permute(1, 3, 0, 2, 4)
    check_op("scaled_masked_softmax", x5, m6)


@pytest.mark.parametrize("op", OPS)
def test_gpu_strided_and_unaligned_inputs(op):
    base = random_input((4, 3, 36, 37), torch.bfloat16, "cuda", seed=18)
    mask = random_mask((4, 1, 36, 36), "cuda", seed=18) if op == "scaled_masked_softmax" else None
    check_op(op, base[..., 1:], mask)  # rows start 2 bytes past alignment
    check_op(op, base[..., :36].transpose(0, 1), mask.transpose(0, 1) if mask is not None else None)
    wide = random_input((4, 3, 36, 72), torch.float32, "cuda", seed=19)
    check_op(op, wide[..., ::2], mask)  # non-unit stride along keys


@pytest.mark.parametrize("op", CAUSAL_OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_causal_ignores_hidden_region(op, dtype):
    """Values past the diagonal, in x or dy, never reach the result."""
    shape = (2, 2, 45, 45) if op == "scaled_upper_triang_masked_softmax" else (2, 2, 9, 45)
    x = random_input(shape, dtype, "cuda", seed=20)
    sq, sk = shape[-2:]
    hidden = torch.ones(sq, sk, dtype=torch.bool, device="cuda").triu(sk - sq + 1)
    y = call(op, x.masked_fill(hidden, float("nan")), None, 0.5)
    y_ref = reference_softmax(x, 0.5, None, True)
    assert_forward_close(y, y_ref, what="forward")
    dy = random_input(shape, dtype, "cuda", seed=21)
    dx = torch.ops.rtcnorm.scaled_softmax_backward(dy.masked_fill(hidden, float("nan")), y, 0.5, True)
    dx_ref = reference_softmax_backward(dy, y_ref, 0.5, True)
    assert_backward_close(dx, dx_ref, y_ref, dy, 0.5, what="backward")


def test_gpu_rows_sum_to_one_with_large_logits():
    x = random_input((8, 3000), torch.float32, "cuda", seed=22) * 1e4
    y = rtcnorm.scaled_softmax(x, 1.0)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.sum(-1), torch.ones(8, device="cuda"))


def test_gpu_empty_inputs():
    assert rtcnorm.scaled_softmax(torch.empty(0, 5, device="cuda")).shape == (0, 5)
    assert rtcnorm.scaled_softmax(torch.empty(3, 0, device="cuda")).shape == (3, 0)


def test_gpu_compile_fullgraph():
    x = random_input((2, 4, 64, 64), torch.bfloat16, "cuda", seed=23).requires_grad_(True)
    mask = random_mask((2, 1, 64, 64), "cuda", seed=23)
    f = rtcnorm.FusedScaleMaskSoftmax("padding", scale=0.125)
    y = torch.compile(f, fullgraph=True)(x, mask)
    assert_forward_close(y, reference_softmax(x.detach(), 0.125, mask))
    y.float().sum().backward()
    assert torch.isfinite(x.grad).all()


def test_gpu_cuda_graph_after_warmup():
    x = random_input((2, 4, 32, 96), torch.bfloat16, "cuda", seed=24)
    rtcnorm.scaled_upper_triang_masked_softmax(x[..., :32, :32], 0.5)  # warm-up: compiles and loads
    static_x = x[..., :32, :32].clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            out = rtcnorm.scaled_upper_triang_masked_softmax(static_x, 0.5)
    static_x.copy_(random_input(static_x.shape, torch.bfloat16, "cuda", seed=25))
    g.replay()
    torch.cuda.synchronize()
    assert_forward_close(out, reference_softmax(static_x, 0.5, None, True))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("op", "shape"),
    [
        ("scaled_masked_softmax", (1, 32, 8193, 8193)),  # a mask broadcast over heads
        ("scaled_upper_triang_masked_softmax", (1, 32, 8193, 8193)),
        ("scaled_aligned_causal_masked_softmax", (1, 16, 4097, 32769)),  # odd rows: one element a vector
        ("scaled_softmax", (1, 2049, 1, 1048577)),  # rows streamed through the online pass
    ],
    ids=["masked", "upper_triang", "aligned_causal", "streamed"],
)
def test_gpu_more_than_2_pow_31_elements(op, shape, require_gpu_memory):
    """Element offsets past 2^31 (64-bit row offsets): every element of the
    forward and the backward against the fp32 reference, one head (or a
    slice of rows) at a time."""
    numel = math.prod(shape)
    assert numel > 2**31
    require_gpu_memory(4 * numel * 2 + (4 << 30))
    causal = op in CAUSAL_OPS
    scale = 0.37
    # Drawn in bf16 on the device: an fp32 draw of this size would need 8.6 GiB more.
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda") * 3
    mask = (torch.rand((1, 1) + shape[2:], device="cuda") < 0.3) if op == "scaled_masked_softmax" else None
    poison_next_alloc(x)
    y = call(op, x, mask, scale)
    dy = torch.randn_like(x)
    poison_next_alloc(x)
    dx = torch.ops.rtcnorm.scaled_softmax_backward(dy, y, scale, causal)
    torch.cuda.synchronize()
    step = max(1, (1 << 26) // (shape[2] * shape[3]))
    for h in range(0, shape[1], step):
        part = slice(h, h + step)
        y_ref = reference_softmax(x[:, part], scale, mask, causal)
        assert_forward_close(y[:, part], y_ref, what=f"{op} forward, heads {h}+")
        dx_ref = reference_softmax_backward(dy[:, part], y_ref, scale, causal)
        assert_backward_close(dx[:, part], dx_ref, y_ref, dy[:, part], scale, what=f"{op} backward, heads {h}+")
