"""rtcnorm.RMSNorm / rtcnorm.LayerNorm as drop-ins for the torch modules,
rtcnorm.explain, and torch.compile(fullgraph=True) through the ops."""

from __future__ import annotations

import copy

import pytest
import rtcnorm
import torch
import torch.autograd.forward_ad as fwad
from norm_checks import (
    randn,
)
from reference import assert_close

BF16 = torch.bfloat16

PAIRS = {"rms_norm": (torch.nn.RMSNorm, rtcnorm.RMSNorm), "layer_norm": (torch.nn.LayerNorm, rtcnorm.LayerNorm)}
CONFIGS = {
    "rms_norm": [dict(eps=None), dict(eps=1e-3), dict(elementwise_affine=False)],
    "layer_norm": [dict(), dict(eps=1e-3, bias=False), dict(elementwise_affine=False)],
}


def _cases():
    return [pytest.param(op, cfg, id=f"{op}-{cfg}") for op in PAIRS for cfg in CONFIGS[op]]


def randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(randn(p.shape, p.dtype, p.device, scale=0.5, shift=1.0))
    return module


@pytest.mark.parametrize(("op", "cfg"), _cases())
def test_parameters_and_state_dict_interchange_with_torch(op, cfg):
    torch_cls, ours_cls = PAIRS[op]
    theirs, ours = randomize(torch_cls((6, 16), **cfg)), ours_cls((6, 16), **cfg)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert ours.normalized_shape == theirs.normalized_shape == (6, 16)
    assert ours.eps == theirs.eps and ours.elementwise_affine == theirs.elementwise_affine
    ours.load_state_dict(theirs.state_dict())
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(a, b), name
    randomize(ours)
    theirs.load_state_dict(ours.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("op", "cfg"), _cases())
def test_outputs_and_grads_match_torch_modules(op, cfg, dtype):
    torch_cls, ours_cls = PAIRS[op]
    theirs = randomize(torch_cls(64, dtype=dtype, **cfg))
    ours = ours_cls.from_torch(theirs, mode="multi_wave_cached")
    # The float64 twin of the torch module, with the eps the low-precision module uses.
    twin = copy.deepcopy(theirs).double()
    if twin.eps is None:
        twin.eps = torch.finfo(dtype).eps
    x = randn((3, 5, 64), dtype, "cpu").requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y, ref = ours(x), twin(x64)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref.backward(dy.double())
    assert_close(y, ref, what="y")
    assert_close(x.grad, x64.grad, what="dx")
    for (name, p), (_, q) in zip(ours.named_parameters(), twin.named_parameters()):
        assert p.dtype == dtype
        assert_close(p.grad, q.grad, what=f"d{name}", reduce_len=15)


@pytest.mark.parametrize("op", list(PAIRS))
def test_from_torch_copies_everything_and_repr_shows_the_mode(op):
    torch_cls, ours_cls = PAIRS[op]
    theirs = randomize(torch_cls(32, eps=1e-4, dtype=torch.bfloat16))
    ours = ours_cls.from_torch(theirs, mode="static_persistent")
    assert ours.eps == 1e-4 and ours.mode == "static_persistent"
    assert ours.weight.dtype == torch.bfloat16 and torch.equal(ours.weight, theirs.weight)
    assert ours.weight.data_ptr() != theirs.weight.data_ptr()
    assert "mode=static_persistent" in repr(ours) and "eps=0.0001" in repr(ours)
    assert "mode=None" in repr(ours_cls(32))
    with pytest.raises(ValueError, match="mode must be None, 'static_persistent'"):
        ours_cls(32, mode="persistent")


def test_layer_norm_without_bias_and_without_affine():
    assert rtcnorm.LayerNorm(8, bias=False).bias is None
    plain = rtcnorm.LayerNorm(8, elementwise_affine=False)
    assert plain.weight is None and plain.bias is None and not list(plain.parameters())
    x = torch.randn(4, 8)
    assert_close(plain(x), torch.nn.functional.layer_norm(x.double(), [8]), what="y")


@pytest.mark.parametrize("op", list(PAIRS))
def test_zero_centered_gamma_starts_at_identity_scale(op):
    _, ours_cls = PAIRS[op]
    zc, plain = ours_cls(48, zero_centered_gamma=True), ours_cls(48)
    assert torch.equal(zc.weight, torch.zeros(48)) and torch.equal(plain.weight, torch.ones(48))
    assert "zero_centered_gamma=True" in repr(zc)
    x = torch.randn(5, 48)
    assert torch.equal(zc(x), plain(x))


def test_rms_norm_module_with_residual_returns_the_sum():
    module = randomize(rtcnorm.RMSNorm(32))
    x, r = torch.randn(4, 32), torch.randn(4, 32)
    y, h = module(x, r)
    assert torch.equal(h, x + r)
    assert torch.equal(y, module(x + r))


# ---- explain -------------------------------------------------------------------


DEFERRED = "collecting the group's statistics one row block late"
STAGED_DEFERRED = (1 << 16) | (1 << 29)  # kStagedRow | kDeferStats


AHEAD = "prefetches into L2 the row a device-full of CTAs ahead"


ONE_STRIDE = "rows of one stride"


DENSE_NARROW = [(BF16, 6144, 128), (BF16, 32768, 128), (torch.float16, 32768, 128), (BF16, 16384, 256),
                (BF16, 65536, 256), (BF16, 32768, 64), (BF16, 4096, 256)]  # fmt: skip


DENSE_NARROW_LN = [(BF16, 65536, 256, {}), (BF16, 32768, 256, {}), (torch.float16, 65536, 128, {}),
                   (BF16, 262144, 128, {}), (BF16, 1 << 20, 256, {}), (BF16, 65536, 256, {"bias": False}),
                   (BF16, 65536, 128, {"zero_centered_gamma": True})]  # fmt: skip


@pytest.mark.parametrize(
    ("dtype", "m", "n", "kw"),
    [(BF16, 32768, 128, {}), (BF16, 16384, 256, {}), (BF16, 262144, 64, {}), (BF16, 65536, 192, {}),
     (BF16, 65536, 384, {}), (BF16, 65536, 512, {}), (BF16, 65536, 256, {"weight_dtype": torch.float32}),
     (BF16, 65536, 256, {"elementwise_affine": False}), (torch.float32, 65536, 256, {}),
     (BF16, 65536, 256, {"arch": "sm_100"})],
)  # fmt: skip
def test_dense_narrow_layer_norm_rule_leaves_other_rows(dtype, m, n, kw):
    """Outside the LayerNorm dense rule: grids under 12 CTAs an SM at two
    vectors (persistent at four), N = 64, uneven splits, rows past 384, float32
    gamma or rows, no affine tensor, and sm_100."""
    kw = {"sm_count": 132, "arch": "sm_90", **kw}
    plan = rtcnorm.explain("layer_norm", (m, n), dtype, **kw)
    assert not plan["kernel"].endswith(", 5>") and "1280 threads per SM" not in plan["reason"], plan


ONE_WAVE_ROWS = [(2560, 1024), (4096, 1024), (1536, 2048), (2048, 2048), (768, 4096), (1024, 4096), (512, 8192)]


# Kernel key flags (csrc/kernels/common/params.cuh; PREFETCH_NEXT is in norm_checks).
PREFETCH_AFFINE = 1 << 13
STAGED_ROW = 1 << 16
RING_EXTRA_SHIFT = 19
DEFER_STATS = 1 << 29
GRID_EXCHANGE = 1 << 31  # deferred slices as groups of a cooperative launch (entry 59)


KEEP_TERMS = 1 << 22
DIRECT_GRADS = 1 << 23
GAMMA_BESIDE_ROW = 1 << 25


COLUMN_GRADS = 1 << 21


ROW_CLUSTER_SHIFT = 26


# kCachedRow, kTwoPassStats, kL1Allocate in csrc/kernels/common/params.cuh
CACHED_ROW, TWO_PASS_STATS, L1_ALLOCATE = 1 << 4, 1 << 17, 1 << 18


def _graph_cases():
    """name -> (fn(x, w, b, r), the (x, w, b, r) it is called with, the indices it reads)."""
    args = tuple(randn(s, torch.float32, "cpu") for s in ((4, 5, 32), (32,), (32,), (4, 5, 32)))
    mask = torch.rand(4, 1, 32) > 0.5
    return {
        "rms_norm": (lambda x, w, b, r: rtcnorm.rms_norm(x, 32, w), args, {0, 1}),
        "add_rms_norm": (lambda x, w, b, r: rtcnorm.rms_norm(x, 32, w, residual=r)[0], args, {0, 1, 3}),
        "layer_norm": (lambda x, w, b, r: rtcnorm.layer_norm(x, 32, w, b), args, {0, 1, 2}),
        "scaled_softmax": (lambda x, w, b, r: rtcnorm.scaled_softmax(x, 0.5), args, {0}),
        "masked": (lambda x, w, b, r: rtcnorm.scaled_masked_softmax(x, mask, 0.5), args, {0}),
        "causal": (lambda x, w, b, r: rtcnorm.scaled_upper_triang_masked_softmax(x[:, :, :5], 0.5), args, {0}),
        "aligned": (lambda x, w, b, r: rtcnorm.scaled_aligned_causal_masked_softmax(x, 0.5), args, {0}),
    }


@pytest.mark.parametrize("case", list(_graph_cases()))
def test_calls_that_need_no_graph_build_no_node(case):
    """Under no_grad, or when no argument requires grad, an op runs below
    autograd (no node is built), with outputs bitwise those of the recorded
    call. Any one tensor argument that requires grad (the weight, bias or
    residual alone too) records a node; a forward-mode tangent is still refused."""
    fn, args, reads = _graph_cases()[case]
    plain = fn(*args)
    assert plain.grad_fn is None and not plain.requires_grad
    for i in range(len(args)):
        leaves = [a.clone().requires_grad_(j == i) for j, a in enumerate(args)]
        recorded = fn(*leaves)
        assert (recorded.grad_fn is not None) == (i in reads), (case, i)
        with torch.no_grad():
            unrecorded = fn(*leaves)
        assert unrecorded.grad_fn is None and not unrecorded.requires_grad
        assert torch.equal(unrecorded, recorded.detach()) and torch.equal(unrecorded, plain)
    with fwad.dual_level(), torch.no_grad():
        dual = fwad.make_dual(args[0], torch.ones_like(args[0]))
        with pytest.raises(RuntimeError, match="jvp is not implemented"):
            fn(dual, *args[1:])


def test_explain_describes_mixed_dtypes_and_flags():
    plan = rtcnorm.explain("rms_norm", (64, 4096), torch.bfloat16, weight_dtype=torch.float32, device="cpu")
    assert plan["kernel"].startswith("rtcnorm::rms_norm_fwd<rtcnorm::bf16, float, 4096,")
    bare = rtcnorm.explain(
        "layer_norm", (64, 6, 8), torch.float16, normalized_shape=[6, 8], elementwise_affine=False, device="cpu"
    )
    assert bare["kernel"].startswith("rtcnorm::layer_norm_fwd<rtcnorm::fp16, rtcnorm::fp16, 48,")


def test_explain_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"mode must be None, 'static_persistent', 'multi_wave_reload' or"):
        rtcnorm.explain("rms_norm", (4, 64), mode="fast")
    with pytest.raises(ValueError, match=r"op must be one of \('rms_norm', 'layer_norm'\)"):
        rtcnorm.explain("group_norm", (4, 64))
    with pytest.raises(ValueError, match="normalized_shape"):
        rtcnorm.explain("layer_norm", (4, 64), normalized_shape=[32])


@pytest.mark.gpu
def test_explain_on_a_gpu_reports_the_loaded_kernel():
    plan = rtcnorm.explain("rms_norm", (8192, 4096), torch.bfloat16, mode="static_persistent")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert plan["sm_count"] == props.multi_processor_count
    assert plan["blocks_per_sm"] >= 1 and plan["registers"] > 0
    assert 1 <= plan["grid"] <= plan["sm_count"] * plan["blocks_per_sm"]


# ---- torch.compile -------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self, n, dtype, device, mode=None):
        super().__init__()
        self.pre = rtcnorm.RMSNorm(n, mode=mode, device=device, dtype=dtype)
        self.proj = torch.nn.Linear(n, n, device=device, dtype=dtype)
        self.post = rtcnorm.LayerNorm(n, mode=mode, device=device, dtype=dtype)

    def forward(self, x, r):
        y, h = self.pre(x, r)
        return self.post(self.proj(y)) + h


def _compile_matches_eager(device, dtype, backend, dynamic=False, shape=(4, 7, 64)):
    block = randomize(Block(shape[-1], dtype, device))
    compiled = torch.compile(block, fullgraph=True, backend=backend, dynamic=dynamic)
    x = randn(shape, dtype, device).requires_grad_()
    r = randn(shape, dtype, device)
    got = compiled(x, r)
    got.sum().backward()
    grads = [x.grad] + [p.grad for p in block.parameters()]
    x.grad = None
    block.zero_grad()
    expected = block(x, r)
    expected.sum().backward()
    assert_close(got, expected.double(), what="compiled y")
    for g, e in zip(grads, [x.grad] + [p.grad for p in block.parameters()]):
        assert_close(g, e.double(), what="compiled grad", reduce_len=shape[0] * shape[1])


def test_compile_fullgraph_cpu_inductor():
    _compile_matches_eager("cpu", torch.float32, "inductor")


def test_compile_fullgraph_cpu_dynamic_shapes():
    torch._dynamo.reset()
    _compile_matches_eager("cpu", torch.float32, "aot_eager", dynamic=True, shape=(3, 5, 32))
    _compile_matches_eager("cpu", torch.float32, "aot_eager", dynamic=True, shape=(2, 9, 32))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph_cuda_inductor(dtype):
    _compile_matches_eager("cuda", dtype, "inductor", shape=(8, 33, 1024))


@pytest.mark.gpu
def test_compile_reduce_overhead_replays_cuda_graphs():
    """mode="reduce-overhead" records the ops into CUDA graphs after its
    warm-up runs (which compile and load the kernels) and replays them on
    fresh inputs."""
    torch._dynamo.reset()
    block = randomize(Block(256, BF16, "cuda"))
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(5):
            x, r = randn((8, 33, 256), BF16, "cuda"), randn((8, 33, 256), BF16, "cuda")
            got = compiled(x, r).clone()
            assert_close(got, block(x, r).double(), what="reduce-overhead y")


# ---- torch.export ----------------------------------------------------------------


class ExportBlock(Block):
    """Block plus causal attention scores through FusedScaleMaskSoftmax."""

    def __init__(self, n, dtype, device):
        super().__init__(n, dtype, device)
        self.softmax = rtcnorm.FusedScaleMaskSoftmax("causal", scale=n**-0.5)

    def forward(self, x, r):
        h = super().forward(x, r)
        return self.softmax((h @ h.transpose(-1, -2)).unsqueeze(1))


def _export_matches_eager(device, dtype, n=64):
    block = randomize(ExportBlock(n, dtype, device))
    batch = torch.export.Dim("batch", min=1, max=64)
    x, r = randn((3, 9, n), dtype, device), randn((3, 9, n), dtype, device)
    ep = torch.export.export(block, (x, r), dynamic_shapes={"x": {0: batch}, "r": {0: batch}})
    targets = {str(node.target) for node in ep.graph.nodes if node.op == "call_function"}
    for op in ("add_rms_norm", "layer_norm", "scaled_upper_triang_masked_softmax"):
        assert f"rtcnorm.{op}.default" in targets, f"{op} missing from the exported graph: {sorted(targets)}"
    for b in (1, 5):  # batch sizes other than the traced one
        x, r = randn((b, 9, n), dtype, device), randn((b, 9, n), dtype, device)
        got = ep.module()(x, r)
        assert got.shape == (b, 1, 9, 9)
        assert torch.equal(got, block(x, r)), "the exported program must run the same kernels as eager"


def test_export_with_a_dynamic_batch_cpu():
    _export_matches_eager("cpu", torch.float32)


@pytest.mark.gpu
def test_export_with_a_dynamic_batch_cuda():
    _export_matches_eager("cuda", torch.bfloat16)
