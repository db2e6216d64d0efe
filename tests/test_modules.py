"""rtcnorm.RMSNorm / rtcnorm.LayerNorm as drop-ins for the torch modules,
rtcnorm.explain, and torch.compile(fullgraph=True) through the ops."""

from __future__ import annotations

import copy

import pytest
import rtcnorm
import torch
import torch.autograd.forward_ad as fwad
from norm_checks import (
    PREFETCH_NEXT,
    PRELOAD_AFFINE,
    SINGLE_STRIDE,
    STREAM_STORE,
    WIDE_LN_REGS,
    column_cluster,
    kernel_flags,
    one_wave_packs,
    randn,
)
from reference import assert_close
from rtcnorm import _tuning

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


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "cluster", "bwd_cluster"),
    [
        ("rms_norm", (512, 131072), torch.bfloat16, 8, 16),  # 256 KB rows: read once by 8 CTAs
        ("layer_norm", (512, 131072), torch.bfloat16, 8, 16),  # (backward: 16 deferred slices of 8192)
        ("layer_norm", (1024, 65536), torch.float32, 8, 8),
        ("rms_norm", (5, 262144), torch.float32, 8, 1),  # 8 slices of 32768 fp32 (backward: split design)
        ("rms_norm", (2048, 32768), torch.float32, 1, 4),  # one CTA caches the forward row
        ("rms_norm", (4096, 16384), torch.float32, 1, 2),  # float32 backward rows past 8192 elements
        ("layer_norm", (4096, 16384), torch.float32, 1, 2),
        ("rms_norm", (2048, 32768), torch.bfloat16, 1, 4),  # 16-bit, one gradient: deferred slices of 8192
        ("layer_norm", (2048, 32768), torch.bfloat16, 1, 4),  # two gradients, many rows: deferred slices of 8192
        ("layer_norm", (256, 32768), torch.bfloat16, 1, 8),  # few rows: slices of 4096 that meet
        ("layer_norm", (2047, 16384), torch.bfloat16, 1, 16),  # deferred slices of 1024 (sm_90)
        ("layer_norm", (4096, 16384), torch.bfloat16, 1, 2),  # 2048+ rows: deferred slices of 8192 (entry 64)
        ("layer_norm", (4096, 12288), torch.bfloat16, 1, 4),  # many rows short of 16384: slices of 3072
        ("layer_norm", (1024, 65536), torch.float16, 8, 8),  # forward: at most 8 rows an SM, 8 slices
        ("layer_norm", (2048, 65536), torch.bfloat16, 1, 8),  # forward: the row in registers (entry 76)
        ("layer_norm", (4096, 8192), torch.float32, 1, 1),
    ],
)
def test_explain_cluster_rule(op, shape, dtype, cluster, bwd_cluster):
    """Rows one CTA cannot cache are split across a thread-block cluster on
    sm_90+ (forward), as are float32 backward rows past 8192 elements; the key
    carries the cluster in its flags, and pre-Hopper plans never use one."""
    with _tuning.override(fwd_defer_stats=1):  # RMSNorm's deferred slices are grid groups (their own test)
        check_cluster_rule(op, shape, dtype, cluster, bwd_cluster)


def check_cluster_rule(op, shape, dtype, cluster, bwd_cluster):
    plan = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
    bwd = plan["backward"]
    assert plan["cluster"] == cluster and bwd["column_slices"] == bwd_cluster
    # Deferred slices on sm_90 are grid groups, not hardware clusters (entry 59).
    assert bwd["cluster"] == (1 if bwd["grid_exchange"] else bwd_cluster)
    for p, cl in ((plan, cluster), (bwd, bwd_cluster)):
        assert column_cluster(p["kernel"]) == cl
        assert f", {shape[1]}, " in p["kernel"]  # the key names the whole row
        assert (f"of {cl} CTAs, {shape[1] // cl} columns each" in p["reason"]) == (cl > 1)
    if cluster > 1:
        assert plan["cached_row"] and plan["grid"] == plan["row_blocks"] * cluster
    if bwd_cluster > 1:
        assert not plan["backward"]["split"]
        # 16-bit slices are staged through shared memory, float32 ones are not.
        assert plan["backward"]["staged"] == (dtype != torch.float32)
    old = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_80")
    assert old["cluster"] == 1 and old["backward"]["cluster"] == 1
    # 16 CTAs is sm_90's non-portable size: sm_100 keeps 8, and LayerNorm's
    # 16-bit rows of at most 16384 keep slices of 2048 there (entries 52, 55).
    blackwell = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_100")
    pair = op == "layer_norm" and dtype != torch.float32 and 8192 < shape[1] <= 16384
    assert blackwell["backward"]["cluster"] == (8 if pair else min(bwd_cluster, 8))
    reload = rtcnorm.explain(op, shape, dtype, mode="multi_wave_reload", device="cpu", arch="sm_90")
    assert reload["cluster"] == 1 and not reload["cached_row"]
    with _tuning.override(fwd_cluster=1, bwd_cluster=1):
        off = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
        assert off["cluster"] == 1 and off["backward"]["cluster"] == 1
    with _tuning.override(fwd_cluster=2, bwd_cluster=2):
        forced = rtcnorm.explain(op, (64, 8192), dtype, device="cpu", arch="sm_90")
        # (The forward's 128 lone CTAs make the slices a grid group: entry 60.)
        assert forced["column_slices"] == 2 and forced["backward"]["cluster"] == 2


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "groups"),
    [
        ("layer_norm", (512, 262144), torch.bfloat16, True),  # one 512-thread CTA an SM, many waves
        ("layer_norm", (16, 262144), torch.bfloat16, True),  # 128 such CTAs
        ("layer_norm", (256, 131072), torch.float32, True),
        ("rms_norm", (16, 131072), torch.bfloat16, True),  # 16 rows: one 1024-thread CTA an SM
        ("rms_norm", (8, 131072), torch.bfloat16, False),  # 64 CTAs: under half the SMs
        ("rms_norm", (64, 131072), torch.bfloat16, False),  # four CTAs an SM: clusters
        ("rms_norm", (512, 131072), torch.bfloat16, False),
        ("layer_norm", (1024, 65536), torch.float16, False),
        ("rms_norm", (256, 131072), torch.float32, False),
    ],
)
def test_explain_forward_grid_group_rule(op, shape, dtype, groups):
    """Forward column slices become groups of a persistent cooperative launch
    (kGridExchange) on sm_90 where each CTA holds an SM alone and the grid has
    more than half as many CTAs as SMs; grids of several CTAs an SM keep
    hardware clusters, as do other archs, an explicit multi-wave mode and the
    override of 1. The override of 2 forces groups wherever a persistent grid
    may split the row."""
    with _tuning.override(fwd_defer_stats=1):  # the deferred slices' rule has its own test
        check_forward_grid_group_rule(op, shape, dtype, groups)


def check_forward_grid_group_rule(op, shape, dtype, groups):
    plan = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
    slices = plan["column_slices"]
    assert slices > 1 and plan["grid_exchange"] == groups, plan
    assert plan["cluster"] == (1 if groups else slices)
    assert plan["persistent"] == groups and (plan["mode"] == "static_persistent") == groups
    assert (PREFETCH_NEXT & kernel_flags(plan["kernel"]) != 0) == groups
    merged = f"group of {slices} CTAs, {shape[1] // slices} columns each, statistics merged through global memory"
    assert (merged in plan["reason"]) == groups and ("distributed shared memory" in plan["reason"]) != groups
    if groups:
        assert "whole groups of column_slices CTAs" in plan["grid"] and "cooperative launch" in plan["reason"]
    else:
        assert plan["grid"] == plan["row_blocks"] * slices
    for arch in ("sm_100", "sm_80"):
        other = rtcnorm.explain(op, shape, dtype, device="cpu", arch=arch)
        assert not other["grid_exchange"] and other["cluster"] == other["column_slices"]
    waves = rtcnorm.explain(op, shape, dtype, mode="multi_wave_cached", device="cpu", arch="sm_90")
    assert not waves["grid_exchange"] and waves["cluster"] == slices and not waves["persistent"]
    with _tuning.override(fwd_grid_exchange=1):
        off = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
        assert not off["grid_exchange"] and off["cluster"] == slices and off["mode"] == "multi_wave_cached"
    with _tuning.override(fwd_grid_exchange=2):
        on = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
        assert on["grid_exchange"] and on["column_slices"] == slices and on["persistent"]
        reload = rtcnorm.explain(op, shape, dtype, mode="multi_wave_reload", device="cpu", arch="sm_90")
        assert not reload["grid_exchange"] and reload["column_slices"] == 1


DEFERRED = "collecting the group's statistics one row block late"
STAGED_DEFERRED = (1 << 16) | (1 << 29)  # kStagedRow | kDeferStats


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "deferred"),
    [
        ("rms_norm", (512, 131072), torch.bfloat16, True),  # clusters of 8 before
        ("rms_norm", (64, 131072), torch.bfloat16, True),  # 64 row blocks, 33 groups
        ("rms_norm", (2048, 131072), torch.float16, True),
        ("rms_norm", (256, 131072), torch.float32, True),  # one 192 KB ring an SM
        ("rms_norm", (512, 262144), torch.bfloat16, True),  # 16 slices
        ("rms_norm", (256, 196608), torch.bfloat16, True),  # 384-thread slices
        ("rms_norm", (32, 131072), torch.bfloat16, False),  # one row block a group: nothing to defer
        ("rms_norm", (16, 131072), torch.bfloat16, False),  # lone CTAs an SM as groups, one wave
        ("layer_norm", (512, 131072), torch.bfloat16, False),  # LayerNorm keeps the meeting loop
        ("rms_norm", (1024, 65536), torch.bfloat16, False),  # one CTA a row: no slices
    ],
)
def test_explain_forward_deferred_slices_rule(op, shape, dtype, deferred):
    """RMSNorm column slices on sm_90 are staged through a 3-stage
    shared-memory ring and collect their group's statistics one row block late
    (kStagedRow | kDeferStats, entry 66) in grids of more row blocks than
    resident groups: a persistent grid group with evict-first stores. Other
    archs, LayerNorm, one-wave grids, an explicit multi-wave mode, a residual
    and the override of 1 keep the plan; the override of 2 forces the ring on
    any eligible slice plan; fwd_grid_exchange=1 keeps a hardware cluster."""
    m, n = shape
    plan = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
    flags = kernel_flags(plan["kernel"])
    assert ((flags & STAGED_DEFERRED) == STAGED_DEFERRED) == deferred, plan
    assert (DEFERRED in plan["reason"]) == deferred
    with _tuning.override(fwd_defer_stats=1):
        off = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
        assert kernel_flags(off["kernel"]) & STAGED_DEFERRED == 0 and off["smem"] == 0, off
    if deferred:
        slices = plan["column_slices"]
        esize = torch.empty((), dtype=dtype).element_size()
        assert plan["grid_exchange"] and plan["cluster"] == 1 and slices > 1, plan
        assert plan["persistent"] and plan["mode"] == "static_persistent"
        assert plan["smem"] == 3 * plan["rows_per_cta"] * (n // slices) * esize
        # The text says where the slice lives: the ring, not registers.
        slice_kb = (n // slices) * esize // 1024
        assert plan["reason"].startswith(f"row slice of {slice_kb} KB staged in shared memory"), plan["reason"]
        assert "fits in registers" not in plan["reason"] and "in registers" in off["reason"]
        with _tuning.override(fwd_ring_stages=1):  # below the kernel's 3 stages: 3
            assert rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")["kernel"] == plan["kernel"]
        assert flags & STREAM_STORE and not flags & PREFETCH_NEXT
        assert "whole groups of column_slices CTAs" in plan["grid"]
        assert plan["kernel"].split(", ")[2:7] == off["kernel"].split(", ")[2:7]  # the same thread shape
        for arch in ("sm_100", "sm_80"):
            other = rtcnorm.explain(op, shape, dtype, device="cpu", arch=arch)
            assert kernel_flags(other["kernel"]) & STAGED_DEFERRED == 0 and other["smem"] == 0
        waves = rtcnorm.explain(op, shape, dtype, mode="multi_wave_cached", device="cpu", arch="sm_90")
        assert kernel_flags(waves["kernel"]) & STAGED_DEFERRED == 0 and not waves["persistent"]
        res = rtcnorm.explain(op, shape, dtype, residual=True, device="cpu", arch="sm_90")
        assert kernel_flags(res["kernel"]) & STAGED_DEFERRED == 0
        with _tuning.override(fwd_grid_exchange=1):
            hw = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
            assert kernel_flags(hw["kernel"]) & STAGED_DEFERRED == STAGED_DEFERRED
            assert not hw["grid_exchange"] and hw["cluster"] == slices and hw["persistent"]
    elif plan["column_slices"] > 1:
        with _tuning.override(fwd_defer_stats=2):
            forced = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90")
            assert kernel_flags(forced["kernel"]) & STAGED_DEFERRED == STAGED_DEFERRED, forced
            assert forced["persistent"] and forced["smem"] > 0


def launch_blocks(kernel: str) -> int:
    """The CTAs per SM a kernel key's launch bounds ask for (its last argument)."""
    return int(kernel.split(", ")[-1].rstrip(">"))


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "wdtype", "phase", "blocks", "before"),
    [
        ("layer_norm", (4096, 12288), "bf16", None, "fwd", 3, 4),  # 192 threads: 96 registers, not 80
        ("layer_norm", (4096, 14336), "bf16", None, "fwd", 2, 4),  # 224 threads at 3 leave 80
        ("layer_norm", (4096, 16384), "bf16", "fp32", "fwd", 2, 4),
        ("layer_norm", (512, 131072), "bf16", "fp32", "fwd", 2, 4),  # a slice beside float32 gamma
        ("layer_norm", (512, 131072), "bf16", None, "fwd", 4, 4),  # same-dtype slices keep theirs
        ("layer_norm", (16384, 7168), "fp32", None, "fwd", 1, 4),  # float32 rows: 96, else one (persistent)
        ("layer_norm", (16384, 6144), "fp32", None, "fwd", 3, 4),  # 192 threads at 3 leave 96
        ("layer_norm", (16384, 9216), "fp32", None, "fwd", 2, 1),  # 288 threads: two leave 96 (was one)
        ("layer_norm", (16384, 12288), "fp32", None, "fwd", 1, 1),  # 384 threads at two leave 80
        ("layer_norm", (4096, 8192), "fp32", None, "fwd", 2, 4),  # shared-memory row, 128-byte chunks
        ("layer_norm", (4096, 49664), "bf16", None, "fwd", 1, 2),  # 256-byte chunks: 160 registers
        ("layer_norm", (1024, 65536), "fp32", None, "fwd", 4, 4),  # shared-memory slices keep theirs
        ("layer_norm", (65536, 512), "bf16", "fp32", "fwd", 2, 4),  # narrow rows beside float32 gamma
        ("layer_norm", (4096, 4096), "bf16", None, "fwd", 8, 8),  # 128-thread CTAs: their own rule
        ("rms_norm", (4096, 16384), "bf16", None, "fwd", 4, 4),
        ("rms_norm", (4096, 2560), "bf16", None, "bwd", 1, 2),  # two CTAs leave 64 registers, 80 needed
        ("rms_norm", (4096, 1536), "bf16", None, "bwd", 1, 2),
        ("rms_norm", (4096, 3072), "bf16", None, "bwd", 2, 2),  # two leave 80
        ("rms_norm", (4096, 2560), "fp32", None, "bwd", 1, 2),
        ("layer_norm", (4096, 5120), "fp32", None, "bwd", 1, 2),  # float32 x, dy, dW, dB: 104
        ("layer_norm", (4096, 5120), "bf16", None, "bwd", 2, 2),
    ],
)
def test_explain_register_headroom(op, shape, dtype, wdtype, phase, blocks, before):
    """Launch bounds leave the registers a row needs (entries 67-68): LayerNorm
    forward rows of more than 80 bytes a thread in CTAs past 128 threads, its
    shared-memory chunks and narrow rows beside float32 gamma, and backward
    CTAs of at most 16 cached elements a thread, take fewer CTAs an SM where
    ptxas spilled them at the previous bound (kept by reg_headroom=1), counting
    registers per partition (a 224-thread CTA at 3 an SM gets 80, not 96)."""
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}

    def bounds():
        plan = rtcnorm.explain(op, shape, dt[dtype], device="cpu", arch="sm_90", weight_dtype=dt.get(wdtype))
        return launch_blocks(plan["kernel"] if phase == "fwd" else plan["backward"]["kernel"])

    assert bounds() == blocks
    with _tuning.override(reg_headroom=1):
        assert bounds() == before
    with _tuning.override(fwd_min_blocks=before, bwd_min_blocks=before):  # an explicit bound wins
        assert bounds() == before


AHEAD = "prefetches into L2 the row a device-full of CTAs ahead"


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "extra", "ahead"),
    [
        ("layer_norm", (2048, 32768), torch.bfloat16, {}, True),  # one 512-thread CTA an SM, 16 waves
        ("layer_norm", (200, 32768), torch.float16, {}, True),  # 1.5 waves
        ("layer_norm", (4096, 20480), torch.bfloat16, {}, True),  # 320 threads: was persistent
        ("layer_norm", (1024, 28672), torch.bfloat16, {}, True),
        ("layer_norm", (2048, 32768), torch.bfloat16, {"weight_dtype": torch.float32}, True),
        ("layer_norm", (132, 32768), torch.bfloat16, {}, False),  # one wave: nothing ahead
        ("layer_norm", (2048, 32768), torch.bfloat16, {"bias": False}, False),  # not one CTA an SM
        ("layer_norm", (2048, 32768), torch.bfloat16, {"residual": True}, False),
        ("layer_norm", (4096, 16384), torch.bfloat16, {}, False),  # 256-thread CTAs, four an SM
        ("layer_norm", (4096, 16384), torch.float32, {}, False),  # float32 rows: override 2 only
        ("rms_norm", (1024, 65536), torch.bfloat16, {}, False),
    ],
)
def test_explain_forward_prefetch_ahead_rule(op, shape, dtype, extra, ahead):
    """Multi-wave grids of one 16-bit LayerNorm row a CTA at one CTA an SM
    prefetch into L2 the row a device-full of CTAs ahead and store evict-first
    (entry 62), on any arch; rows of 257-511 threads take that grid rather
    than a persistent one. Override 1 turns it off (and those rows persistent
    again); override 2 adds float32 rows; a persistent mode never takes it."""
    plan = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90", sm_count=132, **extra)
    assert (AHEAD in plan["reason"]) == ahead, plan["reason"]
    if ahead:
        assert plan["mode"] == "multi_wave_cached" and not plan["persistent"] and plan["cached_row"]
        assert plan["block"] > 256 and plan["grid"] == plan["row_blocks"] == shape[0]
        flags = kernel_flags(plan["kernel"])
        assert flags & PREFETCH_NEXT and flags & STREAM_STORE
        assert AHEAD in rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_100", **extra)["reason"]
        with _tuning.override(fwd_prefetch_ahead=1):
            off = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90", sm_count=132, **extra)
            assert AHEAD not in off["reason"]
            assert off["persistent"] == (plan["block"] < 512)  # low residency: persistent again
        persistent = rtcnorm.explain(op, shape, dtype, mode="static_persistent", device="cpu", arch="sm_90", **extra)
        assert AHEAD not in persistent["reason"] and persistent["persistent"]
    if dtype == torch.float32:
        with _tuning.override(fwd_prefetch_ahead=2):
            on = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90", sm_count=132, **extra)
            assert AHEAD in on["reason"] and not on["persistent"]


ONE_STRIDE = "rows of one stride"


@pytest.mark.parametrize(
    "shape", [(4, 1024), (32, 4096), (4096, 1024), (256, 8192), (2048, 32768), (38, 131072), (65536, 128)]
)
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_forced_single_stride_kernels_compile(op, shape):
    """Every layout takes the single-stride row map when it is forced
    (override 2): register, staged, cluster, split and narrow kernels
    compile with it for sm_90 (the GPU tests run them)."""
    with _tuning.override(fwd_single_stride=2, bwd_single_stride=2):
        plan = rtcnorm.explain(op, shape, torch.bfloat16, device="cpu", arch="sm_90", resources=True)
    for phase in (plan, plan["backward"]):
        assert kernel_flags(phase["kernel"]) & SINGLE_STRIDE, phase["kernel"]
        assert phase["ptxas"]["registers"] > 0, phase


@pytest.mark.parametrize(
    ("shape", "dtype", "taken"),
    [
        ((4096, 40960), torch.bfloat16, True),
        ((132, 49152), torch.float16, True),  # one row an SM
        ((131, 49152), torch.bfloat16, False),  # fewer: clusters
        ((1024, 57344), torch.bfloat16, True),
        ((4096, 61440), torch.float16, True),
        ((529, 65536), torch.bfloat16, True),  # past 4 rows an SM
        ((528, 65536), torch.bfloat16, False),
        ((4096, 65536), torch.float16, False),  # fp16 spills at 64 registers
        ((4096, 32768), torch.bfloat16, False),  # 512-thread rows (wide_ln_row)
        ((4096, 40000), torch.bfloat16, False),  # not whole warps of 64 elements
        ((512, 131072), torch.bfloat16, False),
    ],
)
def test_explain_wide_layer_norm_register_rows(shape, dtype, taken):
    """16-bit LayerNorm rows of 64-128 KB (N a multiple of 2048) with 16-bit
    gamma and beta sit in registers, N / 64 threads a row, one CTA an SM,
    with plain stores, no next-row prefetch and gamma/beta loaded after the
    reduction (entry 76); fewer rows than SMs (65536: 4 an SM, and only in
    bf16) keep shared-memory rows or cluster slices, as do float32 gamma and
    beta, a residual and rows without bias. Override 1 turns it off, 2 on
    wherever the row qualifies."""
    n = shape[1]
    eligible = n % 2048 == 0 and 32768 < n <= 65536
    plan = rtcnorm.explain("layer_norm", shape, dtype, device="cpu", arch="sm_90", sm_count=132)
    flags = kernel_flags(plan["kernel"])
    assert (WIDE_LN_REGS in plan["reason"]) == taken, plan["reason"]
    if taken:
        assert plan["cached_row"] and plan["cluster"] == 1 and plan["smem"] == 0, plan
        assert plan["block"] == n // 64 and plan["vecs_per_thread"] == 8, plan
        assert flags & (STREAM_STORE | PREFETCH_NEXT | PRELOAD_AFFINE) == 0, plan["kernel"]
    for extra in ({"weight_dtype": torch.float32}, {"residual": True}, {"bias": False}):
        other = rtcnorm.explain("layer_norm", shape, dtype, device="cpu", arch="sm_90", sm_count=132, **extra)
        assert WIDE_LN_REGS not in other["reason"], (extra, other["reason"])
    with _tuning.override(fwd_wide_ln_regs=1):
        off = rtcnorm.explain("layer_norm", shape, dtype, device="cpu", arch="sm_90", sm_count=132)
        assert WIDE_LN_REGS not in off["reason"]
        if taken:
            assert off["kernel"] != plan["kernel"]
    with _tuning.override(fwd_wide_ln_regs=2):
        on = rtcnorm.explain("layer_norm", shape, dtype, device="cpu", arch="sm_90", sm_count=132)
        assert (WIDE_LN_REGS in on["reason"]) == eligible, on["reason"]
    rms = rtcnorm.explain("rms_norm", shape, dtype, device="cpu", arch="sm_90", sm_count=132)
    assert WIDE_LN_REGS not in rms["reason"]


@pytest.mark.parametrize("n", [36864, 49152, 61440])
def test_wide_layer_norm_register_rows_compile_unspilled(n):
    """The rule's rows of 576-960 threads compile for sm_90 within the
    registers one CTA an SM leaves, spilling at most a few bytes (the
    division a non-power-of-two row group once took spilled 76-228 bytes
    there; flat_lanes, entry 76)."""
    plan = rtcnorm.explain("layer_norm", (4096, n), torch.bfloat16, device="cpu", arch="sm_90", resources=True)
    assert WIDE_LN_REGS in plan["reason"]
    assert plan["ptxas"]["spill_stores"] <= 8, plan["ptxas"]


@pytest.mark.parametrize(
    ("shape", "strides", "fwd", "bwd"),
    [
        ((1, 4096), None, True, True),  # one CTA writing the gradients
        ((32, 4096), None, True, True),  # column CTAs beside the row CTAs
        ((32, 4096), (8192, 1), True, True),  # every other row: still one stride
        ((16, 2, 4096), (3 * 2 * 4096, 4096, 1), False, False),  # q heads of a fused projection
        ((64, 8192), None, True, True),  # one CTA an SM; backward a one-wave column grid
        ((256, 8192), None, False, False),  # two CTAs an SM; backward 256 row CTAs in one wave
        ((16384, 8192), None, False, False),
    ],
)
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_explain_single_stride_rule(op, shape, strides, fwd, bwd):
    """Grids of at most one register-row CTA an SM, none in a cluster or
    (backward) staging its rows, skip the row-map test where the rows are
    one stride (kSingleStride, entry 75). Rows of two strides never do;
    override 1 turns it off, 2 on for every plan of one-stride rows;
    strides must match the shape."""
    dtype = torch.bfloat16
    for arch in ("sm_80", "sm_90", "sm_100"):
        plan = rtcnorm.explain(op, shape, dtype, strides=strides, device="cpu", arch=arch, sm_count=132)
        for phase, want in ((plan, fwd), (plan["backward"], bwd)):
            assert bool(kernel_flags(phase["kernel"]) & SINGLE_STRIDE) == want, (arch, phase["kernel"])
            assert (ONE_STRIDE in phase["reason"]) == want, phase["reason"]
    for v, want in ((1, False), (2, strides is None or shape[1] != 2)):
        with _tuning.override(fwd_single_stride=v, bwd_single_stride=v):
            plan = rtcnorm.explain(op, shape, dtype, strides=strides, device="cpu", sm_count=132)
            for phase in (plan, plan["backward"]):
                assert bool(kernel_flags(phase["kernel"]) & SINGLE_STRIDE) == want, (v, phase["kernel"])
    with pytest.raises(ValueError, match=r"rtcnorm\.explain: strides \[1\] must have one entry per dim"):
        rtcnorm.explain(op, shape, dtype, strides=[1], device="cpu")


@pytest.mark.parametrize(
    ("shape", "dtype", "two_pass"),
    [
        ((8192, 32768), torch.bfloat16, True),  # one 512-thread CTA an SM, 62 rows an SM
        ((16384, 12288), torch.bfloat16, True),  # 192-thread CTAs
        ((16384, 16384), torch.bfloat16, True),
        ((8192, 16384), torch.float32, True),
        ((4096, 8192), torch.bfloat16, True),  # 31 rows an SM
        ((16384, 8192), torch.bfloat16, False),  # 128-thread CTAs, 124 rows an SM
        ((16384, 5120), torch.bfloat16, False),
    ],
)
def test_explain_layer_norm_two_pass_rule(shape, dtype, two_pass):
    """A LayerNorm row one CTA caches in registers takes its statistics in two
    passes, except rows of three or four warps in CTAs of at most 128 threads
    in grids of more than 32 row blocks an SM, which merge (count, mean, M2)
    triples (entries 26 and 63); the override forces either."""
    plan = rtcnorm.explain("layer_norm", shape, dtype, device="cpu", arch="sm_90", sm_count=132)
    assert plan["cached_row"] and plan["column_slices"] == 1 and plan["smem"] == 0, plan
    assert ("two passes" in plan["reason"]) == two_pass, plan["reason"]
    assert two_pass or plan["block"] <= 128
    for forced in (1, 2):
        with _tuning.override(fwd_two_pass=forced):
            plan = rtcnorm.explain("layer_norm", shape, dtype, device="cpu", arch="sm_90", sm_count=132)
            assert ("two passes" in plan["reason"]) == (forced == 2)


@pytest.mark.parametrize("n", [128, 4096, 262144])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_explain_without_a_gpu(op, n):
    plan = rtcnorm.explain(op, (2, 512, n), torch.bfloat16, device="cpu", sm_count=100, arch="sm_80")
    assert plan["op"] == op and plan["requested_mode"] is None
    assert plan["mode"] in rtcnorm.MODES and plan["reason"]
    assert plan["sm_count"] == 100 and plan["arch"] == "sm_80"
    assert plan["kernel"].startswith(f"rtcnorm::{op}_fwd<rtcnorm::bf16, rtcnorm::bf16, {n},")
    bwd = plan["backward"]
    assert bwd["reason"]
    if n > 65536:  # too long for registers: the split backward, with its grid resolved
        assert bwd["split"] and bwd["kernel"].startswith(f"rtcnorm::{op}_bwd_cols<")
        assert bwd["coef_kernel"].startswith(f"rtcnorm::{op}_bwd_coef<")
        col_tiles, row_tiles = bwd["grid"]
        assert col_tiles * bwd["block"] * 8 >= n and row_tiles * bwd["rows_per_tile"] >= 1024
    else:
        assert not bwd["split"] and bwd["kernel"].startswith(f"rtcnorm::{op}_bwd<")
    assert plan["block"] == plan["threads_per_row"] * plan["rows_per_cta"]
    assert plan["row_blocks"] == -(-1024 // plan["rows_per_cta"])
    # Documented in rtcnorm.MODES: rows past 65536 16-bit values never stay in
    # one CTA; sm_90+ splits them across a cluster (unless a reload is asked for).
    if n > 65536:
        assert not plan["cached_row"] and plan["cluster"] == 1
    for mode in rtcnorm.MODES:
        for arch in ("sm_80", "sm_90"):
            forced = rtcnorm.explain(op, (1024, n), torch.bfloat16, mode=mode, device="cpu", arch=arch)
            assert forced["mode"] == mode and forced["requested_mode"] == mode
            assert forced["persistent"] == (mode == "static_persistent")
            split = n > 65536 and arch == "sm_90" and mode != "multi_wave_reload"
            assert forced["column_slices"] == (8 if split else 1)
            assert forced["cached_row"] == (mode != "multi_wave_reload" and (n <= 65536 or split))


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "residual", "smem"),
    [
        ("layer_norm", (2048, 65536), torch.float16, False, 131072),  # gamma + beta beside a 64 KB+ row
        ("layer_norm", (2048, 32768), torch.bfloat16, False, 0),  # 64 KB in 512 threads: registers
        ("layer_norm", (4096, 8192), torch.float32, False, 32768),  # float32 32 KB rows of 256 threads
        ("layer_norm", (4096, 16384), torch.float32, False, 0),  # float32 64 KB rows of 512 threads
        ("layer_norm", (4096, 16384), torch.bfloat16, False, 0),  # 32 KB 16-bit rows stay in registers
        ("rms_norm", (1024, 65536), torch.bfloat16, False, 0),  # gamma alone fits beside the row
        ("rms_norm", (4096, 8192), torch.bfloat16, True, 16384),  # a residual from 16 KB
        ("rms_norm", (4096, 4096), torch.bfloat16, True, 0),
        ("rms_norm", (512, 98304), torch.bfloat16, False, 196608),  # too long for registers, fits in 227 KB
    ],
)
def test_explain_long_rows_in_shared_memory(op, shape, dtype, residual, smem):
    """The rule for rows kept in shared memory rather than registers, and the
    per-arch limit (227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_86)."""
    plan = rtcnorm.explain(op, shape, dtype, residual=residual, device="cpu", arch="sm_90")
    assert plan["smem"] == smem and plan["cached_row"] == (smem > 0 or shape[1] * dtype.itemsize <= 128 * 1024)
    assert ("kept in shared memory" in plan["reason"]) == (smem > 0)
    if smem:
        assert plan["mode"] == "multi_wave_cached" and plan["block"] * plan["vecs_per_thread"] * plan["vec"] <= shape[1]
        on_86 = rtcnorm.explain(op, shape, dtype, residual=residual, device="cpu", arch="sm_86")
        assert on_86["smem"] == (smem if smem <= 99 * 1024 else 0)
        reload = rtcnorm.explain(op, shape, dtype, residual=residual, mode="multi_wave_reload", device="cpu")
        assert reload["smem"] == 0 and not reload["cached_row"]
        persistent = rtcnorm.explain(op, shape, dtype, residual=residual, mode="static_persistent", device="cpu")
        assert persistent["smem"] == smem and persistent["persistent"]
    with _tuning.override(fwd_smem_row_bytes=1 << 30, fwd_defer_stats=1):  # (no staging ring either)
        assert rtcnorm.explain(op, shape, dtype, residual=residual, device="cpu")["smem"] == 0


@pytest.mark.parametrize(
    ("shape", "dtype", "wdtype", "minb"),
    [((2048, 32768), torch.bfloat16, None, 1), ((2048, 32768), torch.float16, torch.float32, 1),
     ((2048, 24576), torch.bfloat16, None, 1), ((4096, 16384), torch.float32, None, 1),
     ((4096, 16384), torch.bfloat16, None, 2), ((2048, 65536), torch.float16, None, 1)],
)  # fmt: skip
def test_wide_layer_norm_rows_keep_gamma_and_beta_room(shape, dtype, wdtype, minb):
    """LayerNorm rows of up to 64 KB that CTAs of more than 256 threads cache
    stay in registers at one CTA per SM (128 registers a thread: two spill),
    leaving L1 to gamma and beta; rows past 64 KB keep the shared-memory row
    (fp16 at 65536: test_explain_wide_layer_norm_register_rows has the rows
    that leave it), and 256-thread CTAs take two an SM, which leave the 96
    registers of the register-headroom rule (entry 67)."""
    plan = rtcnorm.explain("layer_norm", shape, dtype, weight_dtype=wdtype, device="cpu", arch="sm_90")
    assert plan["cached_row"] and plan["kernel"].endswith(f", {minb}>"), plan["kernel"]
    assert (plan["smem"] > 0) == (shape[1] * dtype.itemsize > 64 * 1024)
    assert plan["cluster"] == 1
    # RMSNorm (gamma alone) and rows beside a residual keep their own rules.
    rms = rtcnorm.explain("rms_norm", shape, dtype, weight_dtype=wdtype, device="cpu", arch="sm_90")
    assert rms["smem"] == 0
    with_res = rtcnorm.explain("layer_norm", shape, dtype, weight_dtype=wdtype, residual=True, device="cpu")
    assert with_res["smem"] > 0


@pytest.mark.parametrize(
    ("op", "n", "minb"),
    [("layer_norm", 7168, 1), ("layer_norm", 5120, 2), ("rms_norm", 7168, 1), ("rms_norm", 6144, 1),
     ("rms_norm", 5120, 2)],
)  # fmt: skip
def test_backward_launch_bounds_leave_layer_norm_its_registers(op, n, minb):
    """Two CTAs per SM only where each thread keeps enough registers: LayerNorm's
    448-thread CTAs (N = 7168) would get 72 and spill, so they run one per SM;
    RMSNorm's 384- and 448-thread CTAs run one per SM to keep the backward's
    terms between passes, which fit two 320-thread CTAs (N = 5120)."""
    kernel = rtcnorm.explain(op, (16384, n), torch.bfloat16, device="cpu")["backward"]["kernel"]
    assert kernel.endswith(f", {minb}>"), kernel


@pytest.mark.parametrize(
    ("op", "n", "residual", "mode", "minb", "dtype", "wdtype"),
    [
        ("layer_norm", 5120, False, "multi_wave_cached", 8, BF16, None),  # 40 elements per thread: 64 registers
        ("rms_norm", 2560, False, "multi_wave_cached", 8, BF16, None),
        ("rms_norm", 2560, True, "multi_wave_cached", 4, BF16, None),  # a residual would spill at 64
        # 64 elements per thread: 8 CTAs where a CTA holds two rows, 7 (72 registers) for one
        ("rms_norm", 4096, False, "multi_wave_cached", 8, BF16, None),
        ("layer_norm", 2048, False, "multi_wave_cached", 8, torch.float16, None),
        ("rms_norm", 8192, False, "multi_wave_cached", 7, BF16, None),
        ("layer_norm", 8192, False, "multi_wave_cached", 7, BF16, None),
        ("rms_norm", 7168, False, "multi_wave_cached", 7, BF16, None),
        # float32 RMSNorm rows (one float32 affine tensor) fit 64 registers
        ("rms_norm", 4096, False, "multi_wave_cached", 8, torch.float32, None),
        ("rms_norm", 1024, False, "multi_wave_cached", 8, torch.float32, None),
        # float32 gamma and beta fit 80 registers beside a float32 row, 96 beside a
        # 16-bit one
        ("layer_norm", 4096, False, "multi_wave_cached", 6, torch.float32, None),
        ("layer_norm", 1024, False, "multi_wave_cached", 6, torch.float32, None),
        ("layer_norm", 4096, False, "multi_wave_cached", 5, BF16, torch.float32),
        # float32 gamma beside a 16-bit RMSNorm row, and 96-thread CTAs, keep 128
        ("rms_norm", 4096, False, "multi_wave_cached", 4, BF16, torch.float32),
        ("rms_norm", 3072, False, "multi_wave_cached", 4, torch.float32, None),
        ("rms_norm", 8192, True, "multi_wave_cached", 4, BF16, None),
        ("layer_norm", 6144, False, "static_persistent", 4, BF16, None),  # 4 x 96 threads per SM: persistent
        ("rms_norm", 6144, False, "multi_wave_cached", 4, BF16, None),
    ],
)
def test_forward_launch_bounds_and_residency(op, n, residual, mode, minb, dtype, wdtype):
    """Register-cached rows of up to 80 bytes per thread run 8 CTAs per SM; rows of up
    to 128 bytes in 128-thread CTAs run 7 or 8 when 16-bit, 8 when float32 RMSNorm,
    6 or 5 beside LayerNorm's float32 gamma and beta; LayerNorm rows whose launch
    bounds guarantee under 512 threads per SM take the persistent grid."""
    kw = {} if wdtype is None else {"weight_dtype": wdtype}
    plan = rtcnorm.explain(op, (16384, n), dtype, residual=residual, device="cpu", **kw)
    assert plan["mode"] == mode and plan["kernel"].endswith(f", {minb}>"), plan
    if mode == "static_persistent":
        assert "guarantee only 384 threads per SM" in plan["reason"]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize(
    ("m", "n", "minb"),
    [(3168, 1024, 4), (4096, 1024, 4), (4224, 1024, 4), (2048, 2048, 4), (1024, 4096, 4), (2112, 1024, 8),
     (4352, 1024, 8), (8192, 1024, 8), (16384, 4096, 8)],
)  # fmt: skip
def test_forward_grids_of_one_wave_at_four_ctas_keep_128_registers(op, dtype, m, n, minb):
    """16-bit rows of 81-128 bytes per thread in 128-thread CTAs whose grid has
    more than 2 and at most 4 CTAs per SM (132 here) keep launch bounds of 4 CTAs
    per SM: every CTA is resident at once either way, and the 128-register build
    runs faster; 2 or fewer, or more than 4, keep 8. float32 rows are unchanged."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    plan = rtcnorm.explain(op, (m, n), dtype, **kw)
    assert plan["mode"] == "multi_wave_cached" and plan["kernel"].endswith(f", {minb}>"), plan
    if minb == 4:
        assert 2 * 132 < plan["row_blocks"] <= 4 * 132, plan
    assert not rtcnorm.explain(op, (m, n), torch.float32, **kw)["kernel"].endswith(", 4>")


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize(("m", "n"), [(1, 4096), (32, 4096), (132, 2048), (64, 8192), (100, 1024)])
def test_forward_grids_of_at_most_one_cta_per_sm_take_launch_bounds_of_one(op, dtype, m, n):
    """A grid of at most one CTA per SM is launched with launch bounds of one
    CTA per SM (no occupancy to trade for registers); the same rows on fewer
    SMs than row blocks keep a register cap, and the plan stays multi-wave."""
    plan = rtcnorm.explain(op, (m, n), dtype, device="cpu", sm_count=132, arch="sm_90")
    assert plan["row_blocks"] <= 132 and plan["kernel"].endswith(", 1>"), plan
    assert plan["mode"] == "multi_wave_cached", plan
    if plan["row_blocks"] >= 4:
        few = rtcnorm.explain(op, (m, n), dtype, device="cpu", sm_count=plan["row_blocks"] // 4, arch="sm_90")
        assert few["row_blocks"] > few["sm_count"] and not few["kernel"].endswith(", 1>"), few


@pytest.mark.parametrize(
    ("dtype", "m", "n", "residual", "nv"),
    [(BF16, 32768, 128, False, 4), (BF16, 16384, 256, False, 4), (torch.float16, 24576, 128, False, 4),
     (torch.float32, 16384, 128, False, 4), (BF16, 65536, 128, False, 2), (BF16, 16384, 128, False, 2),
     (BF16, 32768, 128, True, 2), (BF16, 262144, 128, False, 2)],
)  # fmt: skip
def test_narrow_rmsnorm_rows_take_four_vectors_in_one_round(dtype, m, n, residual, nv):
    """Narrow RMSNorm rows take 4 vectors per thread where the 256-thread CTAs
    then number at least 2 and at most 4 per SM (one round of resident CTAs),
    2 otherwise and beside a residual. (sm_100: on sm_90 most of these 16-bit
    rows take the dense narrow plan instead, test_dense_narrow_rmsnorm_rows.)"""
    arch = "sm_90" if dtype == torch.float32 or residual else "sm_100"
    kw = dict(device="cpu", sm_count=132, arch=arch, residual=residual)
    plan = rtcnorm.explain("rms_norm", (m, n), dtype, **kw)
    assert plan["vecs_per_thread"] == nv, plan
    if nv == 4:
        assert 2 * 132 <= plan["row_blocks"] <= 4 * 132 and plan["block"] == 256, plan
    with _tuning.override(fwd_vecs_target=2):
        assert rtcnorm.explain("rms_norm", (m, n), dtype, **kw)["vecs_per_thread"] == 2


DENSE_NARROW = [(BF16, 6144, 128), (BF16, 32768, 128), (torch.float16, 32768, 128), (BF16, 16384, 256),
                (BF16, 65536, 256), (BF16, 32768, 64), (BF16, 4096, 256)]  # fmt: skip


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(("dtype", "m", "n"), DENSE_NARROW)
def test_dense_narrow_rmsnorm_rows(dtype, m, n, arch):
    """Narrow 16-bit RMSNorm rows whose vectors split evenly at two a thread, in
    grids of 1-32 CTAs an SM, run multi-wave at launch bounds of eight
    256-thread CTAs an SM; ptxas fits them in 32 registers without spilling."""
    plan = rtcnorm.explain("rms_norm", (m, n), dtype, sm_count=132, arch=arch, resources=True)
    assert plan["mode"] == "multi_wave_cached" and plan["vecs_per_thread"] == 2, plan
    assert plan["block"] == 256 and plan["kernel"].endswith(", 8>"), plan
    assert 132 <= plan["row_blocks"] <= 32 * 132 and "2048 threads per SM" in plan["reason"], plan
    usage = plan["ptxas"]
    assert usage["registers"] <= 32 and usage["spill_stores"] == 0 and usage["spill_loads"] == 0, usage
    # The tunable turns the rule off; a forced persistent grid keeps the narrow bounds.
    with _tuning.override(fwd_dense_narrow=1):
        assert not rtcnorm.explain("rms_norm", (m, n), dtype, sm_count=132, arch=arch)["kernel"].endswith(", 8>")
    forced = rtcnorm.explain("rms_norm", (m, n), dtype, sm_count=132, arch=arch, mode="static_persistent")
    assert forced["mode"] == "static_persistent" and not forced["kernel"].endswith(", 8>"), forced


@pytest.mark.parametrize(
    ("dtype", "m", "n", "kw"),
    [(BF16, 4096, 128, {}), (BF16, 262144, 128, {}), (BF16, 16384, 192, {}), (BF16, 16384, 384, {}),
     (BF16, 16384, 512, {}), (BF16, 32768, 128, {"residual": True}), (BF16, 32768, 128, {"weight_dtype": torch.float32}),
     (torch.float32, 32768, 128, {}), (BF16, 32768, 128, {"arch": "sm_100"})],
)  # fmt: skip
def test_dense_narrow_rmsnorm_rule_leaves_other_rows(dtype, m, n, kw):
    """Outside the dense rule: grids under one CTA an SM or past 32, uneven
    splits (N = 192, 384), rows past 384, a residual, float32 gamma or rows,
    sm_100, and LayerNorm keep the narrow launch bounds."""
    kw = {"sm_count": 132, "arch": "sm_90", **kw}
    plan = rtcnorm.explain("rms_norm", (m, n), dtype, **kw)
    assert not plan["kernel"].endswith(", 8>") and "2048 threads per SM" not in plan["reason"], plan
    ln = rtcnorm.explain("layer_norm", (m, n), dtype, **kw)
    assert "2048 threads per SM" not in ln["reason"], ln


DENSE_NARROW_LN = [(BF16, 65536, 256, {}), (BF16, 32768, 256, {}), (torch.float16, 65536, 128, {}),
                   (BF16, 262144, 128, {}), (BF16, 1 << 20, 256, {}), (BF16, 65536, 256, {"bias": False}),
                   (BF16, 65536, 128, {"zero_centered_gamma": True})]  # fmt: skip


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(("dtype", "m", "n", "kw"), DENSE_NARROW_LN)
def test_dense_narrow_layer_norm_rows(dtype, m, n, kw, arch):
    """Narrow 16-bit LayerNorm rows of 128 or 256 elements with 16-bit gamma
    and/or beta, in grids of at least 12 CTAs an SM at two vectors a thread, run
    multi-wave at launch bounds of five 256-thread CTAs an SM (48 registers)
    and load gamma and beta beside x; ptxas fits them without spilling."""
    plan = rtcnorm.explain("layer_norm", (m, n), dtype, sm_count=132, arch=arch, resources=True, **kw)
    assert plan["mode"] == "multi_wave_cached" and plan["vecs_per_thread"] == 2, plan
    assert plan["block"] == 256 and plan["kernel"].endswith(", 5>"), plan
    assert plan["row_blocks"] >= 12 * 132 and "1280 threads per SM" in plan["reason"], plan
    assert kernel_flags(plan["kernel"]) & PRELOAD_AFFINE, plan
    usage = plan["ptxas"]
    assert usage["registers"] <= 48 and usage["spill_stores"] == 0 and usage["spill_loads"] == 0, usage
    with _tuning.override(fwd_dense_narrow=1):
        off = rtcnorm.explain("layer_norm", (m, n), dtype, sm_count=132, arch=arch, **kw)
    assert not off["kernel"].endswith(", 5>") and off["vecs_per_thread"] == 4, off
    forced = rtcnorm.explain("layer_norm", (m, n), dtype, sm_count=132, arch=arch, mode="static_persistent", **kw)
    assert forced["mode"] == "static_persistent" and not forced["kernel"].endswith(", 5>"), forced


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


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize(("m", "n"), ONE_WAVE_ROWS)
def test_one_wave_rows_preload_gamma_and_beta(op, m, n):
    """16-bit rows of 128-thread CTAs in one wave at four an SM (launch bounds
    of four: 128 registers for at most 128 bytes of row a thread) load gamma
    (and beta) into registers beside x; ptxas fits them without spilling.
    RMSNorm CTAs of more than two rows in grids of more than three an SM (4096
    x 1024, 2048 x 2048), one more row block past the wave, float32 gamma or an
    explicit fwd_min_blocks keep the plain loads."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    plan = rtcnorm.explain(op, (m, n), BF16, resources=True, **kw)
    assert plan["block"] == 128 and 2 * 132 < plan["row_blocks"] <= 4 * 132, plan
    assert plan["kernel"].endswith(", 4>"), plan
    packs = one_wave_packs(op, plan, 132)
    assert bool(kernel_flags(plan["kernel"]) & PRELOAD_AFFINE) == packs, plan
    if not packs:
        return
    usage = plan["ptxas"]
    assert usage["spill_stores"] == 0 and usage["spill_loads"] == 0, usage
    past = rtcnorm.explain(op, (4 * 132 * (128 // plan["threads_per_row"]) + 1, n), BF16, **kw)
    wide = rtcnorm.explain(op, (m, n), BF16, weight_dtype=torch.float32, **kw)
    with _tuning.override(fwd_min_blocks=4):
        tuned = rtcnorm.explain(op, (m, n), BF16, **kw)
    for other in (past, wide, tuned):
        assert not kernel_flags(other["kernel"]) & PRELOAD_AFFINE, other


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "kw", "keep"),
    [("layer_norm", (4096, 8192), BF16, {}, True), ("rms_norm", (16384, 8192), BF16, {}, True),
     ("rms_norm", (4096, 1024), BF16, {}, True), ("layer_norm", (32768, 4096), torch.float16, {}, True),
     ("layer_norm", (4096, 4096), torch.float32, {}, True), ("rms_norm", (16384, 5120), BF16, {}, True),
     ("rms_norm", (1, 4096), BF16, {}, True), ("layer_norm", (16384, 7168), BF16, {}, True),
     ("rms_norm", (300, 8192), BF16, {"residual": True}, True),
     ("layer_norm", (16384, 5120), BF16, {}, False),  # two 320-thread CTAs per SM: 102 registers
     ("rms_norm", (16384, 7168), BF16, {}, True),  # one 448-thread CTA per SM to keep them
     ("rms_norm", (4096, 16384), BF16, {}, False),  # 32 elements a thread
     ("rms_norm", (2048, 32768), BF16, {}, False),  # cluster slices of 32 elements a thread
     ("layer_norm", (32768, 128), BF16, {}, False), ("rms_norm", (65536, 256), BF16, {}, False),  # narrow
     ("rms_norm", (512, 131072), BF16, {}, False), ("rms_norm", (64, 262144), BF16, {}, False)],  # split design
)  # fmt: skip
def test_backward_keeps_terms_between_passes_where_registers_allow(op, shape, dtype, kw, keep):
    """Cached backward rows of at most 16 elements a thread keep xhat, w*dy and
    gamma as floats between the two passes where they fit the launch bounds'
    registers; bwd_keep_terms=1 / 2 force either way and change nothing else."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90", **kw)
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert plan["keep_terms"] == keep == bool(kernel_flags(plan["kernel"]) & KEEP_TERMS), plan
    assert ("kept as floats between the two passes" in plan["reason"]) == keep, plan["reason"]
    off, on = _explain_off_on("bwd_keep_terms", op, shape, dtype, **kw)
    assert not off["backward"]["keep_terms"]
    assert on["backward"]["keep_terms"] == plan["cached_row"]
    for other in (off, on):
        # (gamma beside the row goes with the kept terms, and so does the
        # next-row prefetch of RMSNorm's one-row CTAs two per SM)
        # (and forced kept terms leave a deferred cluster exchange, entry 51,
        # with its third ring stage)
        # (and the grid groups of deferred slices, entry 59)
        mask = ~(KEEP_TERMS | GAMMA_BESIDE_ROW | PREFETCH_NEXT | DEFER_STATS | GRID_EXCHANGE | (3 << RING_EXTRA_SHIFT))
        assert kernel_flags(other["backward"]["kernel"]) & mask == kernel_flags(plan["kernel"]) & mask
        assert other["backward"]["kernel"].split(", ")[:7] == plan["kernel"].split(", ")[:7]
        assert other["backward"]["block"] == plan["block"]
        deferred = plan["deferred_stats"] and not other["backward"]["deferred_stats"]
        assert (
            (other["backward"]["smem"] == plan["smem"] // 3 * 2)
            if deferred
            else other["backward"]["smem"] == plan["smem"]
        )


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_backward_ring_depth_override(op, stages):
    """The staging ring has 2 stages by rule; bwd_ring_stages asks for 3-5, which
    scales its shared memory, and a ring that no longer fits the CTA's shared
    memory falls back to registers."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    base = rtcnorm.explain(op, (4096, 8192), BF16, **kw)["backward"]
    assert base["staged"] and base["ring_stages"] == 2 and "2-stage" in base["reason"]
    with _tuning.override(bwd_ring_stages=stages):
        plan = rtcnorm.explain(op, (4096, 8192), BF16, **kw)["backward"]
        assert plan["staged"] and plan["ring_stages"] == stages and f"{stages}-stage" in plan["reason"]
        assert plan["smem"] == base["smem"] // 2 * stages
        assert (kernel_flags(plan["kernel"]) >> RING_EXTRA_SHIFT) & 3 == stages - 2
        wide = rtcnorm.explain(op, (4096, 16384), BF16, **kw)["backward"]
        assert wide["staged"] == (stages * 4096 * 2 * 2 * 4 <= 227 * 1024) or wide["column_slices"] > 1, wide


@pytest.mark.parametrize(
    ("op", "shape", "arch", "stages", "prefetch"),
    [("rms_norm", (4096, 16384), "sm_90", 3, False),  # one 128 KB two-stage CTA an SM: three stages
     ("rms_norm", (4096, 16384), "sm_80", 2, False),  # three (192 KB) exceed sm_80's 163 KB
     ("rms_norm", (4096, 8192), "sm_90", 2, False),  # two CTAs an SM
     ("layer_norm", (512, 32768), "sm_90", 2, False),  # column-cluster slices of four rows
     ("rms_norm", (16384, 5120), "sm_90", 0, True),  # two 320-thread CTAs an SM, terms kept
     ("layer_norm", (16384, 5120), "sm_90", 0, False),  # no kept terms at two an SM
     ("rms_norm", (256, 5120), "sm_90", 0, False),  # two row blocks a CTA: nothing to fetch ahead
     ("rms_norm", (256, 16384), "sm_90", 2, False)],
)  # fmt: skip
def test_backward_deep_ring_and_two_per_sm_prefetch_rules(op, shape, arch, stages, prefetch):
    """docs/history.md entry 46: a one-row CTA whose two-stage ring keeps any second CTA
    off its SM stages through three; one-row 16-bit RMSNorm CTAs two per SM
    with kept terms prefetch their next row; both only in grids of more than
    4 row blocks per SM. Overrides still decide. (sm_90 splits 16-bit rows of
    16384 into column slices, entry 64: one CTA a row here.)"""
    kw = dict(device="cpu", sm_count=132, arch=arch)
    with _tuning.override(bwd_staged_slices=1):
        plan = rtcnorm.explain(op, shape, BF16, **kw)["backward"]
        assert plan["ring_stages"] == stages and plan["staged"] == (stages > 0), plan
        assert bool(kernel_flags(plan["kernel"]) & PREFETCH_NEXT) == prefetch, plan
    with _tuning.override(bwd_staged_slices=1, bwd_ring_stages=2, bwd_hints=1):
        forced = rtcnorm.explain(op, shape, BF16, **kw)["backward"]
        assert forced["ring_stages"] == (2 if stages else 0) and not kernel_flags(forced["kernel"]) & PREFETCH_NEXT


@pytest.mark.parametrize(
    ("shape", "dtype", "arch", "blocks"),
    [((4096, 12288), BF16, "sm_100", 1), ((4096, 14336), torch.float16, "sm_100", 1),
     ((4096, 11264), BF16, "sm_100", 1), ((4096, 10240), BF16, "sm_100", 2), ((4096, 9216), BF16, "sm_100", 2),
     ((64, 12288), BF16, "sm_90", 1), ((64, 10240), BF16, "sm_90", 2), ((4096, 12288), torch.float32, "sm_80", 1),
     ((16384, 5120), BF16, "sm_90", 2), ((16384, 7168), BF16, "sm_90", 1)],
)  # fmt: skip
def test_rms_norm_backward_two_ctas_an_sm_only_where_registers_fit(shape, dtype, arch, blocks):
    """docs/history.md entry 65: a one-row RMSNorm backward CTA runs two an SM only where
    its dW accumulators and row values (2 x 32 registers at 32 elements a
    thread) and 32 more fit half the register file: CTAs of 352-448 threads at
    32 elements (11264-14336) run one an SM (they spilled at two); 288-320
    threads and rows of 16 elements keep two (7168 runs one for its kept
    terms, entry 38). The override still decides."""
    kw = dict(device="cpu", sm_count=132, arch=arch)
    plan = rtcnorm.explain("rms_norm", shape, dtype, **kw)["backward"]
    elems = 16 if shape[1] <= 7168 else 32  # a thread's elements of its row
    assert plan["column_slices"] == 1 and plan["block"] == shape[1] // elems, plan
    assert int(plan["kernel"].split(", ")[-1].rstrip(">")) == blocks, plan
    with _tuning.override(bwd_min_blocks=2):
        forced = rtcnorm.explain("rms_norm", shape, dtype, **kw)["backward"]
        assert int(forced["kernel"].split(", ")[-1].rstrip(">")) == 2, forced


# Kernel key flags (csrc/kernels/common/params.cuh; PREFETCH_NEXT is in norm_checks).
PREFETCH_AFFINE = 1 << 13
STAGED_ROW = 1 << 16
RING_EXTRA_SHIFT = 19
DEFER_STATS = 1 << 29
GRID_EXCHANGE = 1 << 31  # deferred slices as groups of a cooperative launch (entry 59)


@pytest.mark.parametrize(
    ("op", "shape", "kw", "arch", "cluster", "deferred"),
    [("rms_norm", (2048, 32768), {}, "sm_90", 4, True),  # one gradient set: slices of 8192
     ("rms_norm", (1024, 65536), {}, "sm_100", 8, True),
     ("rms_norm", (512, 131072), {}, "sm_90", 16, True),  # sm_90: 16 slices of 8192 (entry 53)
     ("rms_norm", (512, 131072), {}, "sm_100", 8, True),  # slices of 16384 (was the split design)
     ("rms_norm", (2048, 32768), {"residual": True}, "sm_90", 8, False),  # dh: three tensors, 3 stages do not fit
     ("rms_norm", (512, 131072), {"residual": True}, "sm_90", 1, False),  # ... so the split design
     ("rms_norm", (64, 262144), {}, "sm_90", 1, False),  # 32768-element slices do not cache: split
     ("rms_norm", (2048, 32768), {}, "sm_80", 1, False),  # no clusters
     ("layer_norm", (2048, 32768), {}, "sm_90", 4, True),  # dW and dB, many rows: slices of 8192
     ("layer_norm", (2048, 24576), {}, "sm_90", 8, True),  # 5 rows of 96 threads fill more than 2 of 192 (entry 56)
     ("layer_norm", (2048, 24576), {}, "sm_100", 4, True),
     ("rms_norm", (1024, 24576), {}, "sm_90", 8, True),
     ("rms_norm", (1023, 24576), {}, "sm_90", 4, True),  # fewer rows than measured: slices of 6144
     ("rms_norm", (2048, 23552), {}, "sm_90", 8, True),
     ("rms_norm", (2048, 28672), {}, "sm_90", 4, True),  # 2 rows of 224 threads either way: the smaller cluster
     ("layer_norm", (2048, 12288), {"bias": False}, "sm_90", 4, True),  # dW alone: 5 rows of 96, not 2 of 192
     ("layer_norm", (512, 32768), {}, "sm_90", 8, False),  # few rows: slices of 4096, met every row block
     ("layer_norm", (2048, 20480), {}, "sm_90", 8, False),  # below 24576: met every row block
     ("layer_norm", (1024, 65536), {}, "sm_90", 8, True),  # grid groups: slices of 8192 (entry 59)
     ("layer_norm", (1024, 65536), {}, "sm_100", 8, False),
     ("layer_norm", (1023, 65536), {}, "sm_90", 8, False),
     ("layer_norm", (2048, 32768), {"bias": False}, "sm_90", 4, True),  # dW alone
     ("layer_norm", (512, 131072), {}, "sm_90", 16, True),  # both, past 65536 elements
     ("layer_norm", (2047, 16384), {}, "sm_90", 16, True),  # both, up to 16384: 256-thread CTAs, 16 a row
     ("layer_norm", (4096, 16384), {}, "sm_100", 8, True),  # (slices of 2048 where 8 is the largest cluster)
     ("layer_norm", (64, 12288), {}, "sm_100", 8, True),  # (slices of 1536)
     ("layer_norm", (64, 12288), {}, "sm_90", 16, True),
     ("layer_norm", (512, 9216), {}, "sm_90", 16, True),
     ("layer_norm", (2048, 15360), {}, "sm_90", 4, True),  # many rows short of 16384: 4 a row
     ("layer_norm", (2048, 9216), {}, "sm_90", 4, True),
     ("layer_norm", (2047, 12288), {}, "sm_90", 16, True),
     ("layer_norm", (4096, 16384), {"residual": True}, "sm_90", 4, False),
     ("layer_norm", (4096, 16384), {}, "sm_80", 1, False)],
)  # fmt: skip
def test_backward_deferred_cluster_sums_rule(op, shape, kw, arch, cluster, deferred):
    """docs/history.md entries 51-53: 16-bit column-cluster rows collect the cluster's
    row sums one row block late (kDeferStats, a 3-stage ring) for one gradient
    set, and for two past 65536 elements or up to 16384 (there on 256-thread
    CTAs, two an SM: on sm_90 16 CTAs a row, or 4 for rows short of 16384 in
    grids of 2048+ rows, entry 55; slices of 2048 elsewhere); rows of 131072
    split across 16 CTAs on sm_90; on sm_90, in grids of 1024+ rows, a row
    splits across twice the CTAs where the half-width slices fill more of a
    512-thread CTA (entry 56); bwd_defer_stats=1 restores the meeting at
    every row block in slices of 4096, 2 forces the deferral."""
    plan = rtcnorm.explain(op, shape, BF16, device="cpu", sm_count=132, arch=arch, **kw)["backward"]
    assert plan["column_slices"] == cluster and plan["deferred_stats"] == deferred, plan
    assert column_cluster(plan["kernel"]) == cluster, plan
    # sm_90's deferred slices are groups of a cooperative launch (entry 59).
    assert plan["grid_exchange"] == (deferred and arch == "sm_90"), plan
    assert plan["cluster"] == (1 if plan["grid_exchange"] else cluster), plan
    assert bool(kernel_flags(plan["kernel"]) & DEFER_STATS) == deferred, plan
    if deferred:
        pair = op == "layer_norm" and kw.get("bias", True) and shape[1] <= 16384
        fields = plan["kernel"].split(", ")  # <T, W, N, VEC, TPR, ROWS, ...>
        tpr, rows_per_cta = int(fields[4]), int(fields[5])
        # Pairs of 256-thread CTAs an SM (at most that on clusters of 4); else
        # 32 elements a thread (the last vectors of a slice may be idle), one CTA an SM.
        if pair and cluster == 4:
            assert plan["block"] <= 256, plan
        else:
            assert plan["block"] == (256 if pair else rows_per_cta * tpr), plan
            assert pair or (int(fields[3]) * int(fields[6]) == 32 and tpr * 32 >= shape[1] // cluster), plan
        assert plan["staged"] and plan["ring_stages"] == 3, plan
        assert plan["smem"] == 3 * rows_per_cta * (shape[1] // cluster) * 2 * 2, plan  # x and dy, 16-bit
        assert "one row block late" in plan["reason"], plan
        with _tuning.override(bwd_defer_stats=1):
            met = rtcnorm.explain(op, shape, BF16, device="cpu", sm_count=132, arch=arch, **kw)["backward"]
        assert not met["deferred_stats"] and (met["split"] or met["ring_stages"] == 2), met
        assert met["split"] or met["column_slices"] == min(8, 1 << (-(-shape[1] // 4096) - 1).bit_length()), met
    elif cluster > 1:
        with _tuning.override(bwd_defer_stats=2):
            forced = rtcnorm.explain(op, shape, BF16, device="cpu", sm_count=132, arch=arch, **kw)["backward"]
        assert forced["deferred_stats"] == ("residual" not in kw), forced
    fp32 = rtcnorm.explain(op, shape, torch.float32, device="cpu", sm_count=132, arch=arch, **kw)["backward"]
    assert not fp32["deferred_stats"], fp32


@pytest.mark.parametrize(
    ("op", "shape", "kw", "arch", "slices", "block"),
    [("rms_norm", (4096, 9216), {}, "sm_90", 2, 384),  # 2 rows of 192 threads beside one CTA of 288
     ("rms_norm", (4096, 12288), {}, "sm_90", 4, 480),  # 5 rows of 96 fill more than 2 of 192 (the fill rule)
     ("rms_norm", (4096, 14336), {}, "sm_90", 8, 512),  # 8 rows of 64: four times the CTAs fill more
     ("rms_norm", (4096, 16384), {}, "sm_90", 2, 512),
     ("rms_norm", (128, 16384), {}, "sm_90", 2, 512),
     ("rms_norm", (4096, 12288), {"elementwise_affine": False}, "sm_90", 4, 480),
     ("rms_norm", (4096, 12288), {"weight_dtype": torch.float32}, "sm_90", 4, 480),
     ("rms_norm", (4096, 15360), {}, "sm_90", 1, 480),  # slices of 320 threads: one CTA of 480 stays
     ("rms_norm", (127, 16384), {}, "sm_90", 1, 512),  # few rows
     ("rms_norm", (4096, 8192), {}, "sm_90", 1, 512),  # 8192: one slice
     ("rms_norm", (4096, 16384), {"residual": True}, "sm_90", 1, 512),  # dh: no deferral
     ("rms_norm", (4096, 12288), {}, "sm_100", 1, 384),
     ("rms_norm", (4096, 12288), {}, "sm_80", 1, 384),
     ("layer_norm", (4096, 16384), {}, "sm_90", 2, 512),  # dW and dB: the pair plan gives way
     ("layer_norm", (2048, 12288), {}, "sm_90", 4, 480),
     ("layer_norm", (2048, 11264), {}, "sm_90", 2, 352),  # 16 elements a thread (terms kept, not deferred)
     ("layer_norm", (2047, 16384), {}, "sm_90", 16, 256),  # few rows: the pair plan
     ("layer_norm", (4096, 15360), {}, "sm_90", 4, 160),  # 24 elements a thread: the pair plan
     ("layer_norm", (4096, 9216), {}, "sm_90", 4, 192),
     ("layer_norm", (4096, 10240), {}, "sm_90", 4, 160),  # the pair plan keeps terms, does not defer
     ("layer_norm", (4096, 16384), {"weight_dtype": torch.float32}, "sm_90", 16, 256),
     ("layer_norm", (4096, 14336), {"bias": False}, "sm_90", 8, 512)],  # dW alone: the fill rule's 4x
)  # fmt: skip
def test_backward_staged_slices_rule(op, shape, kw, arch, slices, block):
    """docs/history.md entry 64: on sm_90, 16-bit rows of 8193-16384 elements that one
    CTA would stage (RMSNorm) split into deferred slices of 8192 in grids of
    128+ rows where the slices' CTAs hold at least as many threads; with dW and
    dB (LayerNorm, 16-bit gamma and beta, 2048+ rows) the pair plan gives way
    to them where it would defer and they hold 16 or 32 elements a thread.
    bwd_staged_slices=1 keeps the previous plans, 2 forces the slices."""

    def plan_of(**over):
        with _tuning.override(**over):
            return rtcnorm.explain(op, shape, BF16, device="cpu", sm_count=132, arch=arch, **kw)["backward"]

    plan = plan_of()
    assert plan["column_slices"] == slices and plan["block"] == block, plan
    old = plan_of(bwd_staged_slices=1)
    changed = plan["kernel"] != old["kernel"]
    # (dW alone on LayerNorm rows past 8192 was already sliced; only its fill changed.)
    assert changed == (slices > 1 and (op == "rms_norm" or block > 256) and "bias" not in kw), (plan, old)
    if changed:
        assert plan["staged"] and plan["cached_row"], plan
        if op == "rms_norm" or plan["deferred_stats"]:
            assert plan["deferred_stats"] and plan["ring_stages"] == 3, plan
            # Grid groups where the rows fill as many groups as clusters would (entry 59).
            assert plan["grid_exchange"] == (plan["row_blocks"] >= 132 // slices), plan
        assert old["column_slices"] == (1 if op == "rms_norm" else 16 if shape[0] < 2048 or shape[1] == 16384 else 4)
    forced = plan_of(bwd_staged_slices=2)
    eligible = arch != "sm_80" and "residual" not in kw and shape[1] > 8192
    if eligible and op == "rms_norm":
        assert forced["column_slices"] > 1 and forced["deferred_stats"], forced
    if not eligible:
        assert forced["kernel"] == plan["kernel"], forced
    fp32 = rtcnorm.explain(op, shape, torch.float32, device="cpu", sm_count=132, arch=arch, **kw)["backward"]
    with _tuning.override(bwd_staged_slices=1):
        assert (
            rtcnorm.explain(op, shape, torch.float32, device="cpu", sm_count=132, arch=arch, **kw)["backward"] == fp32
        )


KEEP_TERMS = 1 << 22
DIRECT_GRADS = 1 << 23
GAMMA_BESIDE_ROW = 1 << 25


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "direct", "cluster"),
    [("rms_norm", (1, 4096), BF16, True, 1), ("rms_norm", (2, 4096), BF16, True, 1),
     ("rms_norm", (3, 4096), BF16, False, 1), ("layer_norm", (1, 8192), BF16, True, 1),
     ("layer_norm", (64, 128), BF16, True, 1), ("layer_norm", (65, 128), BF16, False, 1),
     ("rms_norm", (1, 7), torch.float32, True, 1), ("rms_norm", (1, 65536), BF16, True, 8),
     ("layer_norm", (1, 262144), BF16, False, 1),  # split design: rows not cached
     ("rms_norm", (32, 4096), BF16, False, 1)],
)  # fmt: skip
def test_backward_of_one_row_block_writes_the_gradients(op, shape, dtype, direct, cluster):
    """When one row block holds every row, its CTA (or cluster) writes dW / dB
    itself (kDirectGrads): a grid of one, no partial rows, no column reduce.
    bwd_direct_grads=1 keeps the partial row; forcing 2 never applies to a grid
    of more row blocks. Only the flag bit differs. Checked with column CTAs off;
    with them, a single row keeps the direct design."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    with _tuning.override(bwd_column_grads=1):  # (column CTAs take a lone block of more rows)
        _check_one_row_block_writes_the_gradients(op, shape, dtype, direct, cluster, kw)
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    if shape[0] == 1 or plan["split"] or plan["cluster"] > 1:
        assert plan["direct_grads"] == direct, plan


def _check_one_row_block_writes_the_gradients(op, shape, dtype, direct, cluster, kw):
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert plan["direct_grads"] == direct == bool(kernel_flags(plan["kernel"]) & DIRECT_GRADS), plan
    assert ("column sums as the gradients" in plan["reason"]) == direct, plan["reason"]
    if direct:
        assert plan["row_blocks"] == 1 and plan["grid"] == cluster == plan["cluster"], plan
    off, on = _explain_off_on("bwd_direct_grads", op, shape, dtype, **kw)
    assert not off["backward"]["direct_grads"]
    assert on["backward"]["direct_grads"] == direct
    if not plan["split"]:
        assert kernel_flags(off["backward"]["kernel"]) == kernel_flags(plan["kernel"]) & ~DIRECT_GRADS
    # No weight (or bias): nothing to sum, nothing to write.
    assert not rtcnorm.explain(op, shape, dtype, elementwise_affine=False, **kw)["backward"]["direct_grads"]


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "early"),
    [("rms_norm", (1, 4096), BF16, True), ("layer_norm", (1, 4096), BF16, True),
     ("layer_norm", (1, 8192), torch.float16, True), ("rms_norm", (1, 4096), torch.float32, True),
     ("rms_norm", (1, 65536), BF16, False),  # a cluster's CTAs: their sums meet first
     ("layer_norm", (64, 128), BF16, False),  # terms not kept: dW is summed beside dx
     ("rms_norm", (1, 7), torch.float32, False), ("rms_norm", (2, 4096), BF16, False)],
)  # fmt: skip
def test_a_lone_cta_stores_its_gradients_before_the_row_reduction(op, shape, dtype, early):
    """A lone CTA writing dW / dB itself from the terms of its first pass
    stores them before the row reduction (the dx pass no longer waits to
    drain them); explain() says so exactly where the kernel does it: direct,
    terms kept, no column or row cluster. Without a weight (or bias) there
    is nothing to store."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    said = "gradients are stored before the row reduction" in plan["reason"]
    assert said == early, plan["reason"]
    if early:
        flags = kernel_flags(plan["kernel"])
        assert flags & DIRECT_GRADS and flags & KEEP_TERMS and plan["cluster"] == 1 and not plan["row_cluster"], plan
    bare = rtcnorm.explain(op, shape, dtype, elementwise_affine=False, **kw)["backward"]
    assert "stored before the row reduction" not in bare["reason"], bare["reason"]
    with _tuning.override(bwd_direct_grads=1):
        off = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert "stored before the row reduction" not in off["reason"], off["reason"]


def _explain_off_on(switch: str, op, shape, dtype, **kw) -> tuple[dict, dict]:
    """explain() with the tuning switch `switch` forced off (1), then on (2)."""
    plans = []
    for value in (1, 2):
        with _tuning.override(**{switch: value}):
            plans.append(rtcnorm.explain(op, shape, dtype, **kw))
    return plans[0], plans[1]


COLUMN_GRADS = 1 << 21


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "extra", "cols"),
    [("rms_norm", (32, 4096), BF16, {}, 64),  # a row CTA per row, 64 column CTAs of 64 columns
     ("layer_norm", (32, 4096), BF16, {}, 64), ("rms_norm", (8, 4096), BF16, {"residual": True}, 64),
     ("layer_norm", (256, 1024), BF16, {}, 16),  # 4 rows a row lane: the rule's edge
     ("rms_norm", (32, 4096), torch.float32, {}, 64),
     ("rms_norm", (44, 7001), torch.float32, {}, None),  # 11 rows a lane; 28 float scalars a thread: no one wave
     ("rms_norm", (512, 1024), BF16, {}, None),  # 8 rows a lane: partial rows
     ("rms_norm", (1, 4096), BF16, {}, None),  # one row: its CTA writes the gradients
     ("rms_norm", (2, 1024), BF16, {}, None),  # one CTA sized to its rows writes them too
     ("layer_norm", (2, 4096), BF16, {}, 64), ("rms_norm", (8, 1024), BF16, {}, 16),  # a few rows
     ("layer_norm", (64, 128), BF16, {}, None), ("rms_norm", (128, 256), BF16, {}, None),  # narrow rows
     ("rms_norm", (512, 8192), BF16, {}, None),  # staged rows (past one wave: test_one_wave_column_grids)
     ("layer_norm", (16384, 4096), BF16, {}, None),  # a full grid
     ("rms_norm", (32, 4096), BF16, {"elementwise_affine": False}, None)],  # nothing to sum
)  # fmt: skip
def test_few_row_blocks_hand_the_weight_grads_to_column_ctas(op, shape, dtype, extra, cols):
    """Grids of at most one row block an SM, at most 4 rows a row lane and more
    than one row (but not one CTA sized to its rows, nor narrow rows): column
    CTAs beside the row CTAs write dW / dB
    (kColumnGrads), so the grid is the row blocks plus the column CTAs, with no
    direct gradients and no partial rows. bwd_column_grads=1 takes the partial
    rows back (only the flag bit differs); a forced cap of the grid keeps them
    too; sm_80 plans the same (no cluster involved)."""
    kw = dict(extra, device="cpu", sm_count=132, arch="sm_90")
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    on = cols is not None
    assert plan["column_grads"] == on == bool(kernel_flags(plan["kernel"]) & COLUMN_GRADS), plan
    assert ("column CTAs beside the row CTAs" in plan["reason"]) == on, plan["reason"]
    assert not on or ("partial row per CTA" not in plan["reason"] and "as the gradients" not in plan["reason"])
    if not on:
        assert "column_ctas" not in plan
        return
    assert plan["column_ctas"] == cols and plan["grid"] == plan["row_blocks"] + cols, plan
    assert not plan["direct_grads"] and plan["row_blocks"] <= 132, plan
    vec = int(plan["kernel"].split(",")[3])
    assert plan["smem"] >= 2 * plan["block"] * vec * 4, plan  # the lanes' sums
    off, _ = _explain_off_on("bwd_column_grads", op, shape, dtype, **kw)
    assert not off["backward"]["column_grads"] and "column_ctas" not in off["backward"]
    with _tuning.override(bwd_column_grads=1, bwd_cta_threads=plan["block"]):
        same_ctas = rtcnorm.explain(op, shape, dtype, **kw)["backward"]  # only the flag bit differs
    assert kernel_flags(same_ctas["kernel"]) == kernel_flags(plan["kernel"]) & ~COLUMN_GRADS
    with _tuning.override(bwd_min_row_blocks=2):
        capped = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    # (a cap above the row blocks leaves the plan as it was)
    assert capped["column_grads"] == (capped.get("max_ctas", capped["row_blocks"]) >= capped["row_blocks"]), capped
    assert rtcnorm.explain(op, shape, dtype, **dict(kw, arch="sm_80"))["backward"]["column_grads"]


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "block", "row_blocks"),
    [("rms_norm", (32, 4096), BF16, 256, 32), ("layer_norm", (32, 4096), BF16, 256, 32),  # a row a CTA
     ("layer_norm", (8, 4096), torch.float16, 256, 8), ("rms_norm", (64, 4096), torch.float32, 256, 64),
     ("rms_norm", (32, 2048), BF16, 256, 16),  # two rows a CTA, not the partial rows' 128-thread CTAs
     ("layer_norm", (128, 1024), BF16, 256, 32),  # four rows a CTA
     ("layer_norm", (100, 1000), torch.float32, 256, 25),
     ("rms_norm", (128, 4096), BF16, 512, 64),  # 128 row blocks of 256 would leave no SMs to the column CTAs
     ("layer_norm", (256, 1024), BF16, 512, 32)],
)  # fmt: skip
def test_column_gradient_grids_take_256_thread_ctas(op, shape, dtype, block, row_blocks):
    """A grid whose column CTAs write dW / dB runs on 256-thread CTAs where its
    rows take at most 256 threads and the column CTAs still fit beside 256-thread
    row CTAs; otherwise it keeps its plan. bwd_cta_threads still decides when set."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert plan["column_grads"] and (plan["block"], plan["row_blocks"]) == (block, row_blocks), plan
    # (RMSNorm's 16-bit rows of 4096 have 256-thread CTAs from the few-row rule already)
    sized = ("column-gradient grid: CTAs of 256 threads" in plan["reason"]) + ("few 16-bit rows" in plan["reason"])
    assert sized == (block == 256), plan["reason"]
    with _tuning.override(bwd_cta_threads=512):
        forced = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert forced["block"] == 512 and forced["column_grads"] and "column-gradient grid" not in forced["reason"]
    bare = rtcnorm.explain(op, shape, dtype, elementwise_affine=False, **kw)["backward"]
    assert not bare["column_grads"] and "column-gradient grid" not in bare["reason"], bare


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "extra", "arch", "sm_count", "bounds", "cols"),
    [("rms_norm", (256, 8192), BF16, {}, "sm_90", 132, 3, 128),  # 256 + 128 CTAs, three an SM
     ("layer_norm", (256, 8192), BF16, {}, "sm_90", 132, 3, 128),
     ("rms_norm", (128, 8192), BF16, {}, "sm_90", 132, 2, 128),  # two an SM hold 256
     ("layer_norm", (2, 8192), torch.float16, {}, "sm_90", 132, 2, 128),  # rows the rules stage
     ("rms_norm", (128, 8192), BF16, {"residual": True}, "sm_90", 132, 2, 128),
     ("layer_norm", (100, 8000), BF16, {"weight_dtype": torch.float32}, "sm_90", 132, 2, 125),
     ("rms_norm", (37, 8190), BF16, {}, "sm_90", 132, 2, 128),  # pairs of elements, 64 a column CTA
     ("rms_norm", (200, 6000), BF16, {}, "sm_80", 108, 3, 94),  # sm_80: no cluster involved
     ("layer_norm", (256, 4096), BF16, {}, "sm_90", 132, 3, 64),  # 8 rows a column lane
     ("rms_norm", (330, 4096), BF16, {}, "sm_90", 132, 3, 64),  # 11 rows a lane, 394 CTAs: the edge
     ("rms_norm", (333, 4096), BF16, {}, "sm_90", 132, None, None),  # 397 CTAs: past three an SM
     ("rms_norm", (100, 5120), torch.float32, {}, "sm_90", 132, 2, 160),
     ("rms_norm", (160, 8192), BF16, {}, "sm_100", 148, 2, 128),
     ("rms_norm", (256, 8192), BF16, {}, "sm_100", 148, None, None),  # 384 CTAs: three an SM spill there
     ("rms_norm", (268, 8192), BF16, {}, "sm_90", 132, 3, 128),  # 9 rows a lane, 396 CTAs
     ("rms_norm", (269, 8192), BF16, {}, "sm_90", 132, None, None),  # 397 CTAs
     ("rms_norm", (128, 8192), BF16, {"residual": True, "weight_dtype": torch.float32}, "sm_90", 132, 2, 128),
     ("layer_norm", (256, 8192), torch.float32, {}, "sm_90", 132, None, None),  # 64 floats a thread
     ("rms_norm", (512, 4096), BF16, {}, "sm_90", 132, None, None),  # 16 rows a column lane
     ("rms_norm", (128, 16384), BF16, {}, "sm_90", 132, None, None),  # 64 elements a thread
     ("layer_norm", (64, 128), BF16, {}, "sm_90", 132, None, None),  # narrow rows
     ("rms_norm", (1, 8192), BF16, {}, "sm_90", 132, None, None),  # one row writes its gradients
     ("rms_norm", (128, 8192), BF16, {"elementwise_affine": False}, "sm_90", 132, None, None)],
)  # fmt: skip
def test_one_wave_column_grids(op, shape, dtype, extra, arch, sm_count, bounds, cols):
    """A grid whose 256-thread register-row CTAs and one-line column CTAs (at
    most 11 rows a lane) all fit the SMs at once, at launch bounds of two CTAs
    an SM or three (16-bit rows and weights, no dh, up to sm_90), takes
    column CTAs for dW / dB where the other rules walk row blocks or stage
    rows. bwd_one_wave_columns=1 (or bwd_column_grads=1) keeps the plan it
    replaces, which has no column CTAs."""
    kw = dict(extra, device="cpu", sm_count=sm_count, arch=arch)
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    on = cols is not None
    assert ("one wave" in plan["reason"]) == on, plan["reason"]
    for switch in ("bwd_one_wave_columns", "bwd_column_grads"):
        with _tuning.override(**{switch: 1}):
            off = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
        assert "one wave" not in off["reason"] and not off["column_grads"], off
    if not on:
        return
    assert plan["column_grads"] and not plan["direct_grads"] and plan["block"] == 256, plan
    assert plan["column_ctas"] == cols and plan["grid"] == plan["row_blocks"] + cols, plan
    assert plan["kernel"].endswith(f", {bounds}>") and plan["grid"] <= bounds * sm_count, plan
    assert kernel_flags(plan["kernel"]) & COLUMN_GRADS and not plan["staged"] and plan["cluster"] == 1, plan
    assert f"at launch bounds of {bounds} CTAs an SM" in plan["reason"], plan["reason"]


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "extra", "arch", "sm_count", "tpr_rows_vecs", "bounds", "cols"),
    [("rms_norm", (256, 5120), BF16, {}, "sm_90", 132, (256, 1, 3), 3, 80),  # ragged: 3 or 2 vectors, not 320 threads
     ("layer_norm", (300, 5120), torch.float16, {}, "sm_90", 132, (256, 1, 3), 3, 80),
     ("layer_norm", (128, 5120), BF16, {"weight_dtype": torch.float32}, "sm_90", 132, (256, 1, 3), 2, 80),
     ("rms_norm", (128, 7168), BF16, {"residual": True}, "sm_90", 132, (224, 1, 4), 2, 112),
     ("layer_norm", (264, 7168), BF16, {}, "sm_90", 132, (224, 1, 4), 3, 112),  # 376 CTAs, 10 rows a lane
     ("rms_norm", (2, 7168), BF16, {}, "sm_90", 132, (224, 1, 4), 2, 112),  # rows the rules stage
     ("layer_norm", (200, 3072), BF16, {}, "sm_90", 132, (192, 1, 2), 2, 48),
     ("rms_norm", (256, 1536), BF16, {}, "sm_90", 132, (96, 2, 2), 2, 24),  # CTAs of two 96-thread rows
     ("rms_norm", (128, 3072), torch.float32, {}, "sm_90", 132, (192, 1, 4), 2, 96),
     ("rms_norm", (200, 5120), BF16, {}, "sm_80", 108, (256, 1, 3), 3, 80),
     ("rms_norm", (200, 5120), BF16, {}, "sm_100", 148, (256, 1, 3), 2, 80),
     ("rms_norm", (33, 4097), BF16, {}, "sm_90", 132, (256, 1, 17), 2, 65),  # scalars, 64 a column CTA
     ("rms_norm", (33, 4097), torch.float32, {}, "sm_90", 132, (256, 1, 17), 2, 129),
     ("layer_norm", (44, 7001), torch.float32, {}, "sm_90", 132, (256, 1, 28), 2, 219),  # in place of a split
     ("layer_norm", (16, 6001), BF16, {}, "sm_90", 132, (256, 1, 24), 2, 94),
     ("rms_norm", (44, 7001), torch.float32, {}, "sm_90", 132, None, None, None),  # 28 float scalars a thread
     ("rms_norm", (256, 5120), BF16, {}, "sm_100", 148, None, None, None),  # 336 CTAs: two an SM hold 296
     ("layer_norm", (300, 7168), BF16, {}, "sm_90", 132, None, None, None),  # 412 CTAs
     ("layer_norm", (256, 2560), BF16, {}, "sm_90", 132, None, None, None),  # 13 rows a column lane
     ("layer_norm", (100, 6001), BF16, {}, "sm_90", 132, None, None, None)],  # 25 rows a lane: still split
)  # fmt: skip
def test_one_wave_rows_of_at_most_256_threads(op, shape, dtype, extra, arch, sm_count, tpr_rows_vecs, bounds, cols):
    """One-wave column grids of rows that 256 threads do not split evenly: the
    row takes at most 256 threads, ragged where the other rules' row is wider
    (5120: 320 threads there), the layout's narrower row otherwise. A row the
    other rules split takes it too; float32 scalar rows past 24 a thread take it
    only in place of a split."""
    kw = dict(extra, device="cpu", sm_count=sm_count, arch=arch)
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert ("one wave" in plan["reason"]) == (cols is not None), plan["reason"]
    with _tuning.override(bwd_one_wave_columns=1):
        off = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert "one wave" not in off["reason"], off
    if cols is None:
        return
    tpr, rows, vecs = tpr_rows_vecs
    shape_args = tuple(int(a) for a in plan["kernel"].split(", ")[4:7])  # <T, W, N, VEC, TPR, ROWS, NV, ...>
    assert shape_args == (tpr, rows, vecs) and launch_blocks(plan["kernel"]) == bounds, plan
    assert plan["block"] == tpr * rows <= 256 and plan["column_ctas"] == cols, plan
    assert plan["grid"] == plan["row_blocks"] + cols <= bounds * sm_count and not plan["split"], plan
    assert kernel_flags(plan["kernel"]) & COLUMN_GRADS and not plan["staged"], plan


def test_one_wave_float_scalars_past_24_a_thread():
    """Float32 scalar rows of more than 24 elements a thread take a one-wave
    grid only in place of a split plan (LayerNorm 44x7001) or where
    bwd_one_wave_columns=2 forces it; RMSNorm's register plan stays."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    rms = rtcnorm.explain("rms_norm", (44, 7001), torch.float32, **kw)["backward"]
    assert "one wave" not in rms["reason"] and not rms["split"], rms
    with _tuning.override(bwd_one_wave_columns=2):
        forced = rtcnorm.explain("rms_norm", (44, 7001), torch.float32, **kw)["backward"]
    assert "one wave" in forced["reason"] and forced["block"] == 256, forced
    ln = rtcnorm.explain("layer_norm", (44, 7001), torch.float32, **kw)["backward"]
    with _tuning.override(bwd_one_wave_columns=1):
        before = rtcnorm.explain("layer_norm", (44, 7001), torch.float32, **kw)["backward"]
    assert "one wave" in ln["reason"] and before["split"], (ln, before)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize(
    ("m", "n", "fetch"),
    [(1, 4096, "preload"), (32, 4096, "preload"), (132, 8192, "preload"), (132, 4096, "preload"),
     (264, 4096, "preload"), (133, 8192, "preload"), (16384, 4096, None), (64, 16384, "preload"),
     (1, 65536, "prefetch"), (529, 4096, "preload"), (1057, 4096, None)],
)  # fmt: skip
def test_few_row_grids_fetch_gamma_beside_the_row(op, m, n, fetch):
    """Few-row grids (2 vectors a thread, at most 1024 threads per SM: 528 rows of
    4096 on 132 SMs) load gamma/beta into registers beside the row's loads
    (kPreloadAffine). A decode-sized grid of a longer row a thread (1x65536: 8
    vectors) fetches them into L1 instead (kPrefetchAffine). Grids of at most one
    CTA per SM take launch bounds of one. Full grids do neither, but for one
    wave at four CTAs an SM (529 rows: 265 CTAs of two rows; 1057: 529 CTAs,
    past one wave; test_one_wave_rows_preload_gamma_and_beta). Overrides: 1
    neither, 2 the L1 prefetch, 3 the preload wherever the row is in registers."""
    if op == "layer_norm" and n == 65536 and m <= 8 * 132:
        fetch = "preload"  # 8 cluster slices in registers, not one CTA's shared-memory row
    plan = rtcnorm.explain(op, (m, n), BF16, device="cpu", sm_count=132)
    flags = kernel_flags(plan["kernel"])
    assert bool(flags & PRELOAD_AFFINE) == (fetch == "preload"), plan
    assert bool(flags & PREFETCH_AFFINE) == (fetch == "prefetch"), plan
    if m <= 132 and plan["smem"] == 0:  # (a row in shared memory takes the CTAs it fits)
        assert plan["row_blocks"] <= 132 and plan["kernel"].endswith(", 1>"), plan
    bare = rtcnorm.explain(op, (m, n), BF16, elementwise_affine=False, device="cpu", sm_count=132)
    assert not kernel_flags(bare["kernel"]) & (PREFETCH_AFFINE | PRELOAD_AFFINE)
    off, on = _explain_off_on("fwd_affine_prefetch", op, (m, n), BF16, device="cpu", sm_count=132)
    assert not kernel_flags(off["kernel"]) & (PREFETCH_AFFINE | PRELOAD_AFFINE)
    assert kernel_flags(on["kernel"]) & (PREFETCH_AFFINE | PRELOAD_AFFINE) == PREFETCH_AFFINE
    with _tuning.override(fwd_affine_prefetch=3):
        forced = rtcnorm.explain(op, (m, n), BF16, device="cpu", sm_count=132)
    want = PRELOAD_AFFINE if forced["cached_row"] and forced["smem"] == 0 else PREFETCH_AFFINE
    assert kernel_flags(forced["kernel"]) & (PREFETCH_AFFINE | PRELOAD_AFFINE) == want, forced


@pytest.mark.parametrize(
    ("op", "m", "n", "kw", "preload"),
    [("layer_norm", 2048, 32768, {}, True), ("layer_norm", 4096, 32768, {"dtype": torch.float16}, True),
     ("layer_norm", 2048, 24576, {}, False),  # 384-thread CTAs at 64 elements a thread lost with it
     ("layer_norm", 256, 262144, {}, False),  # as did 512-thread slices of a cluster
     ("layer_norm", 2048, 32768, {"weight_dtype": torch.float32}, False),  # float32 packs: 128 registers
     ("layer_norm", 2048, 32768, {"bias": False}, False),  # not a wide_ln_row: two CTAs an SM
     ("layer_norm", 4096, 16384, {}, False),  # 256-thread CTAs, launch bounds of two
     ("layer_norm", 1024, 65536, {}, False),  # 1024-thread rows at 64 registers: spilled with the packs
     ("rms_norm", 2048, 32768, {}, False)],  # two CTAs an SM: 64 registers, spilled with the packs
)  # fmt: skip
def test_wide_layer_norm_rows_preload_gamma_and_beta(op, m, n, kw, preload):
    """16-bit LayerNorm rows with 16-bit gamma and beta that one 512-thread CTA
    an SM caches in registers (launch bounds of one: 128 registers a thread)
    load both beside the row (kPreloadAffine, docs/history.md entry 53); nothing else in
    a full grid does, cluster slices of the same shape included."""
    kw = {"dtype": BF16, **kw}
    plan = rtcnorm.explain(op, (m, n), device="cpu", sm_count=132, arch="sm_90", **kw)
    flags = kernel_flags(plan["kernel"])
    assert bool(flags & PRELOAD_AFFINE) == preload, plan
    assert not flags & PREFETCH_AFFINE, plan
    if preload:
        assert plan["cached_row"] and plan["smem"] == 0 and plan["kernel"].endswith(", 1>"), plan
        with _tuning.override(fwd_affine_prefetch=1):
            off = rtcnorm.explain(op, (m, n), device="cpu", sm_count=132, arch="sm_90", **kw)
        assert not kernel_flags(off["kernel"]) & (PREFETCH_AFFINE | PRELOAD_AFFINE), off


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "late"),
    [("rms_norm", (1, 4096), BF16, True), ("rms_norm", (32, 4096), BF16, True),
     # (16-bit rows of 4096 up to 332 rows are one-wave column grids: test_one_wave_column_grids)
     ("rms_norm", (264, 4096), torch.float32, True), ("rms_norm", (266, 4096), torch.float32, False),
     ("layer_norm", (264, 4096), torch.float32, True),
     ("rms_norm", (512, 8192), BF16, False),  # staged: gamma loads while the ring's copies fly
     ("rms_norm", (16384, 1024), BF16, False), ("layer_norm", (1, 1024), torch.float32, True)],
)  # fmt: skip
def test_backward_of_one_row_block_per_cta_loads_gamma_beside_the_row(op, shape, dtype, late):
    """Where the grid gives every CTA a single row block (row blocks <= SMs) a
    register-cached CTA that keeps its terms loads gamma after its row's x and dy
    (kGammaBesideRow); persistent and staged CTAs load it first. A single row takes
    a CTA of one row group (at least a warp), so nothing idles in its barriers."""
    plan = rtcnorm.explain(op, shape, dtype, device="cpu", sm_count=132, arch="sm_90")["backward"]
    flags = kernel_flags(plan["kernel"])
    assert bool(flags & GAMMA_BESIDE_ROW) == late, plan
    assert ("gamma loaded beside the row" in plan["reason"]) == late, plan["reason"]
    if late:
        assert flags & KEEP_TERMS and not flags & STAGED_ROW, plan
    tpr, rows = (int(a) for a in plan["kernel"].split(", ")[4:6])  # <T, W, N, VEC, TPR, ROWS, ...>
    few = "few 16-bit rows" in plan["reason"]  # test_backward_few_row_cta_rule (here, more rows than one CTA holds)
    assert rows == (max(1, 32 // tpr) if shape[0] == 1 else max(1, (128 if few else 512) // tpr)), plan
    # The override moves gamma on any grid that keeps its terms in registers; only
    # a grid of one row block per CTA also asks for one CTA per SM.
    off, on = _explain_off_on("bwd_gamma_beside_row", op, shape, dtype, device="cpu", sm_count=132, arch="sm_90")
    off, on = off["backward"], on["backward"]
    assert not kernel_flags(off["kernel"]) & GAMMA_BESIDE_ROW
    eligible = bool(flags & KEEP_TERMS) and not flags & STAGED_ROW
    assert bool(kernel_flags(on["kernel"]) & GAMMA_BESIDE_ROW) == eligible, on
    if eligible and not late:
        assert on["kernel"].split(", ")[-1] == off["kernel"].split(", ")[-1] == plan["kernel"].split(", ")[-1], on


ROW_CLUSTER_SHIFT = 26


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "arch", "cluster"),
    [("layer_norm", (512, 8192), BF16, "sm_90", 2), ("layer_norm", (16384, 7168), BF16, "sm_90", 2),
     ("rms_norm", (512, 8192), BF16, "sm_90", 2), ("rms_norm", (1056, 8192), BF16, "sm_90", 2),
     ("rms_norm", (1057, 8192), BF16, "sm_90", 1), ("rms_norm", (128, 16384), BF16, "sm_100", 2),
     ("rms_norm", (256, 7168), BF16, "sm_90", 1),  # one 448-thread CTA an SM: lost up to 9%
     ("layer_norm", (66, 7168), BF16, "sm_90", 1),  # a one-wave column grid (test_one_wave_rows_...)
     ("layer_norm", (300, 7168), BF16, "sm_90", 2),
     ("layer_norm", (256, 8192), BF16, "sm_80", 1), ("layer_norm", (256, 8192), torch.float32, "sm_90", 1),
     ("rms_norm", (32, 4096), BF16, "sm_90", 1), ("layer_norm", (4096, 4096), BF16, "sm_90", 1),
     ("layer_norm", (256, 65536), BF16, "sm_90", 1)],  # rows split into column slices
)  # fmt: skip
def test_staged_backward_sums_columns_across_a_row_cluster(op, shape, dtype, arch, cluster):
    """sm_90+ staged rows (16-bit, N >= 7168) whose partial rows weigh on the
    backward (LayerNorm's two; one of 8192+ columns, at most 8 row blocks an SM)
    run as row clusters of two CTAs from half the SMs' row blocks up: the pair adds
    up its column sums in distributed shared memory and writes one partial row.
    Register rows, small grids, sm_80 and column-split rows keep a partial row a
    CTA. The override forces any size (16 only on sm_90), 1 never; the grid of one
    cluster writes the gradients itself."""
    kw = dict(device="cpu", sm_count=132, arch=arch)
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    rc_bits = (kernel_flags(plan["kernel"]) >> ROW_CLUSTER_SHIFT) & 7
    assert plan["row_cluster"] == (cluster > 1) == (rc_bits > 0), plan
    if cluster > 1:
        assert plan["cluster"] == 1 << rc_bits == cluster and plan["staged"], plan
        assert "row cluster of 2 CTAs" in plan["reason"] and "max_ctas" not in plan, plan
        # The CTA's column sums (and the bundles its combine reads) fit beside the ring.
        grads = 2 if op == "layer_norm" else 1
        assert plan["smem"] >= grads * shape[1] * 4, plan
    bare = rtcnorm.explain(op, shape, dtype, elementwise_affine=False, **kw)["backward"]
    assert not bare["row_cluster"], bare  # nothing to sum
    with _tuning.override(bwd_row_cluster=1):
        assert not rtcnorm.explain(op, shape, dtype, **kw)["backward"]["row_cluster"]
    column_split = plan["cluster"] > 1 and not plan["row_cluster"]
    for forced in (4, 16):
        with _tuning.override(bwd_row_cluster=forced):
            on = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
        if arch == "sm_80" or column_split:
            assert not on["row_cluster"], on
            continue
        assert on["row_cluster"] and on["cluster"] == (forced if arch == "sm_90" else min(forced, 8)), on
        assert on["direct_grads"] == (on["row_blocks"] <= on["cluster"]), on


@pytest.mark.parametrize(("m", "forced", "direct"), [(8, 4, True), (16, 16, True), (16, 4, False), (1, 4, True)])
def test_a_forced_row_cluster_of_every_row_block_writes_the_gradients(m, forced, direct):
    """Forcing a row cluster at least as large as the row blocks (2 rows of 4096 a
    CTA) gives a grid of one cluster that writes dW / dB itself; a smaller one
    gives a partial row per cluster. A single row block needs no cluster."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    with _tuning.override(bwd_row_cluster=forced):
        plan = rtcnorm.explain("layer_norm", (m, 4096), BF16, **kw)["backward"]
    if m == 1:
        assert not plan["row_cluster"] and plan["direct_grads"] and plan["grid"] == 1, plan
        return
    assert plan["row_cluster"] and plan["direct_grads"] == direct, plan
    if direct:
        assert plan["grid"] == forced and "the grid's one cluster writes the gradients" in plan["reason"], plan
    # dW and dB sums (N floats each) beside the two row groups' bundles.
    assert plan["smem"] == (1 + 2) * 4096 * 4, plan


@pytest.mark.parametrize(
    ("op", "n", "dtype", "prefetch"),
    [("layer_norm", 7168, BF16, "staged"), ("layer_norm", 6144, BF16, True), ("layer_norm", 4096, BF16, True),
     ("layer_norm", 5120, BF16, False), ("rms_norm", 7168, BF16, "staged"), ("rms_norm", 5120, BF16, True),
     ("layer_norm", 7168, torch.float32, True), ("rms_norm", 8192, BF16, "staged"), ("layer_norm", 3072, BF16, True),
     ("layer_norm", 2560, BF16, False), ("rms_norm", 8192, torch.float32, True), ("rms_norm", 4096, BF16, True)],
)  # fmt: skip
def test_backward_prefetches_the_next_row_where_registers_allow(op, n, dtype, prefetch):
    """The grid-stride backward asks L2 for its next row block in 512-thread CTAs,
    in lone CTAs of one or two rows under 512 threads and in 16-bit RMSNorm
    one-row CTAs two per SM with kept terms (N = 5120), never in LayerNorm's two
    CTAs per SM of 320-448 threads, whose registers are already tight, nor in
    its three-row CTAs at N = 2560, where it measured 12% slower. 16-bit rows of
    7168+ elements are staged through shared memory instead, the next row's
    copies already in flight."""
    plan = rtcnorm.explain(op, (16384, n), dtype, device="cpu")["backward"]
    flags = kernel_flags(plan["kernel"])
    assert bool(flags & PREFETCH_NEXT) == (prefetch is True), plan["kernel"]
    assert bool(flags & STAGED_ROW) == plan["staged"] == (prefetch == "staged"), plan["kernel"]
    if plan["staged"]:
        assert "shared-memory ring" in plan["reason"]
        with _tuning.override(bwd_stage=1):
            regs = rtcnorm.explain(op, (16384, n), dtype, device="cpu")["backward"]
            assert not regs["staged"] and not kernel_flags(regs["kernel"]) & STAGED_ROW


@pytest.mark.parametrize(
    ("op", "n", "dtype", "residual", "staged", "cluster"),
    [("rms_norm", 5120, BF16, False, False, 1), ("rms_norm", 7168, BF16, False, True, 1),
     ("rms_norm", 8192, torch.float16, False, True, 1), ("rms_norm", 8192, BF16, True, False, 1),
     ("rms_norm", 16384, BF16, True, True, 1), ("rms_norm", 8192, torch.float32, False, False, 1),
     ("layer_norm", 8192, BF16, False, True, 1), ("layer_norm", 16384, BF16, False, True, 2),  # entry 64
     ("rms_norm", 32768, BF16, True, True, 8), ("rms_norm", 65536, torch.float16, False, True, 8),
     ("rms_norm", 131072, BF16, False, True, 16), ("rms_norm", 131072, BF16, True, False, 1),
     ("layer_norm", 16384, torch.float32, False, False, 2)],
)  # fmt: skip
def test_backward_staging_rule(op, n, dtype, residual, staged, cluster):
    """16-bit backward rows of 7168+ elements (past 8192 beside a residual's dh)
    are staged through shared memory; 16-bit rows one CTA does not cache, up to
    65536 elements (131072 without a residual's dh: deferred slices, entry 51,
    on 16 CTAs on sm_90, entry 53), become staged slices of a cluster on sm_90+
    and keep the split design before; float32 rows never stage."""
    plan = rtcnorm.explain(op, (4096, n), dtype, residual=residual, device="cpu")["backward"]
    # (LayerNorm's staged rows of one CTA run as row clusters of two on sm_90+.)
    column_cluster = plan["column_slices"]
    assert plan["staged"] == staged and column_cluster == cluster, plan
    if staged:
        tensors = 3 if residual else 2
        assert plan["smem"] >= 2 * n // cluster * dtype.itemsize * tensors
        assert not plan["split"] and plan["cached_row"]
    old = rtcnorm.explain(op, (4096, n), dtype, residual=residual, device="cpu", arch="sm_80")["backward"]
    assert old["cluster"] == 1 and (old["split"] or old["cached_row"])


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "arch", "max_ctas"),
    [("rms_norm", (512, 7168), BF16, "sm_90", 256), ("rms_norm", (300, 7168), BF16, "sm_90", 150),
     ("rms_norm", (512, 8192), BF16, "sm_80", 256), ("layer_norm", (300, 8192), BF16, "sm_80", 66),
     ("layer_norm", (1024, 8192), BF16, "sm_80", 128), ("rms_norm", (4000, 8192), torch.float16, "sm_90", 2000),
     ("rms_norm", (256, 8192), BF16, "sm_90", None), ("layer_norm", (1024, 8192), BF16, "sm_90", None),
     ("layer_norm", (256, 16384), BF16, "sm_90", None), ("rms_norm", (256, 4096), BF16, "sm_90", None),
     ("rms_norm", (256, 8192), torch.float32, "sm_90", None), ("layer_norm", (64, 65536), BF16, "sm_90", None)],
)  # fmt: skip
def test_backward_grid_cap_rule(op, shape, dtype, arch, max_ctas):
    """Staged one-CTA backward rows run on at most max(SMs / 2, row blocks / k)
    CTAs, k = 2 for one fp32 partial output (dW) and 8 for two (dW and dB), so
    few rows write few fp32 partial rows; register rows, cluster rows
    (LayerNorm 16384 and 65536 bf16 are cluster slices), row clusters (sm_90+:
    their pairs already halve the partial rows) and float32 keep the resident
    grid. bwd_min_row_blocks forces a cap on any plan, in whole clusters."""
    kw = dict(device="cpu", sm_count=132, arch=arch)
    plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert plan.get("max_ctas") == max_ctas, plan
    if max_ctas is not None:
        assert plan["staged"] and plan["cluster"] == 1 and "capped" in plan["reason"]
    with _tuning.override(bwd_min_row_blocks=5):
        forced = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    ctas = -(-forced["row_blocks"] // 5)
    if forced["row_cluster"]:  # each CTA of a row cluster owns row blocks
        ctas = -(-ctas // forced["cluster"])
    unit = forced["column_slices"] if forced["grid_exchange"] else forced["cluster"]
    assert forced["max_ctas"] == ctas * unit, forced


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "block", "row_blocks"),
    [
        ("rms_norm", (2, 1024), BF16, 128, 1),  # one row block: a CTA of just its rows
        ("rms_norm", (3, 1024), BF16, 256, 1),  # rows rounded up to a power of two
        ("rms_norm", (3, 1536), BF16, 384, 1),  # 96 threads a row: 4 rows of the 5 that 512 threads hold
        ("rms_norm", (5, 1536), BF16, 480, 1),  # never past those 5
        ("rms_norm", (8, 1024), BF16, 512, 1),
        ("rms_norm", (2, 4096), BF16, 512, 1),
        ("rms_norm", (3, 4096), torch.float16, 256, 3),  # up to 32 row blocks of 128 threads or one row
        ("rms_norm", (16, 1024), BF16, 128, 8),
        ("rms_norm", (64, 1024), BF16, 128, 32),
        ("rms_norm", (32, 2048), BF16, 128, 32),
        ("rms_norm", (32, 4096), BF16, 256, 32),
        ("rms_norm", (128, 1024), BF16, 512, 16),  # past 32 row blocks: 512 threads
        ("rms_norm", (64, 2048), BF16, 512, 16),
        ("rms_norm", (64, 4096), BF16, 512, 32),
        ("rms_norm", (32, 8192), BF16, 512, 32),  # a 512-thread row: unchanged
        ("rms_norm", (32, 4096), torch.float32, 512, 16),  # float32 rows: unchanged
        ("rms_norm", (32, 256), BF16, 1024, 1),  # narrow rows: unchanged
        ("layer_norm", (32, 4096), BF16, 512, 16),  # LayerNorm: unchanged
        ("layer_norm", (2, 1024), BF16, 512, 1),
    ],
)
def test_backward_few_row_cta_rule(op, shape, dtype, block, row_blocks):
    """RMSNorm's few 16-bit register rows get CTAs sized to them where they
    write partial rows (column CTAs off; with them, 256-thread CTAs: see
    test_column_gradient_grids_take_256_thread_ctas): one row block takes a CTA
    of just its rows, and up to 32 row blocks of 128-thread (or one-row) CTAs
    replace 512-thread ones; bwd_cta_threads still decides when set."""
    kw = dict(device="cpu", sm_count=132, arch="sm_90")
    with _tuning.override(bwd_column_grads=1):
        plan = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert (plan["block"], plan["row_blocks"]) == (block, row_blocks), plan
    assert plan["direct_grads"] == (row_blocks == 1)
    with _tuning.override(bwd_cta_threads=512, bwd_column_grads=1):
        forced = rtcnorm.explain(op, shape, dtype, **kw)["backward"]
    assert forced["block"] == (480 if shape[1] == 1536 else 512) and "few 16-bit rows" not in forced["reason"], forced
    assert ("few 16-bit rows" in plan["reason"]) == (block != forced["block"] and shape[1] > 512), plan


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "residual", "tpr", "nv", "mode"),
    [("layer_norm", (262144, 128), BF16, False, 8, 2, "multi_wave_cached"),  # the dense narrow rule
     ("layer_norm", (32768, 128), BF16, False, 4, 4, "static_persistent"),
     ("layer_norm", (65536, 256), BF16, False, 16, 2, "multi_wave_cached"),  # the dense narrow rule
     ("layer_norm", (65536, 256), torch.float32, False, 16, 4, "multi_wave_cached"),
     ("layer_norm", (16384, 512), BF16, False, 8, 8, "static_persistent"),
     ("layer_norm", (65536, 512), BF16, False, 8, 8, "multi_wave_cached"),
     ("layer_norm", (16384, 512), torch.float32, False, 32, 4, "multi_wave_cached"),
     ("layer_norm", (4096, 512), BF16, False, 32, 2, "static_persistent"),  # 128 CTAs at 8: too few
     ("layer_norm", (8192, 128), BF16, False, 8, 2, "static_persistent"),
     ("layer_norm", (1024, 7), torch.float32, False, 4, 2, "static_persistent"),
     ("rms_norm", (262144, 128), BF16, False, 8, 2, "multi_wave_cached"),
     ("rms_norm", (65536, 256), BF16, False, 16, 2, "multi_wave_cached"),
     ("rms_norm", (16384, 512), BF16, False, 8, 8, "static_persistent"),
     ("rms_norm", (16384, 512), BF16, True, 32, 2, "static_persistent"),
     ("rms_norm", (16384, 512), torch.float32, False, 64, 2, "multi_wave_cached")],
)  # fmt: skip
def test_narrow_forward_rows_vectors_per_thread(op, shape, dtype, residual, tpr, nv, mode):
    """Narrow forward rows: 2 vectors per thread, 4 for LayerNorm, 8 for 16-bit
    rows of more than 384 elements, unless a residual joins the row or the
    fuller CTAs would number under two per SM; at least 4 threads per row.
    Persistent up to 16 x SMs row blocks counted at 2 vectors per thread. Rows
    of the dense narrow rule take 2 (test_dense_narrow_layer_norm_rows)."""
    plan = rtcnorm.explain(op, shape, dtype, residual=residual, device="cpu", sm_count=132, arch="sm_90")
    assert (plan["threads_per_row"], plan["vecs_per_thread"], plan["mode"]) == (tpr, nv, mode), plan
    assert plan["block"] == 256 and plan["cached_row"]


# kCachedRow, kTwoPassStats, kL1Allocate in csrc/kernels/common/params.cuh
CACHED_ROW, TWO_PASS_STATS, L1_ALLOCATE = 1 << 4, 1 << 17, 1 << 18


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "mode", "cluster", "two_pass"),
    [("layer_norm", (65536, 256), BF16, None, 0, True),
     ("layer_norm", (2048, 8192), BF16, None, 0, True),  # 128 threads a row: CTA barriers
     ("layer_norm", (16384, 4096), BF16, None, 0, True),  # 64 threads a row, 124 row blocks per SM
     ("layer_norm", (16384, 5120), BF16, None, 0, False),  # 128 threads a row, 124 row blocks per SM
     ("layer_norm", (4096, 16384), BF16, None, 0, True),  # 256 threads a row, 31 row blocks per SM
     ("layer_norm", (4096, 1000), torch.float16, "static_persistent", 0, True),  # uneven vectors
     ("layer_norm", (64, 4097), torch.float32, "multi_wave_cached", 0, True),
     ("layer_norm", (2048, 32768), BF16, None, 0, True),  # 512 threads a row, 16 row blocks per SM
     ("layer_norm", (2048, 65536), torch.float16, None, 0, False),  # row in shared memory
     ("layer_norm", (2048, 65536), BF16, None, 0, True),  # 1024 threads a row in registers
     ("layer_norm", (4096, 8192), BF16, "multi_wave_reload", 0, False),  # streamed row
     ("layer_norm", (512, 131072), BF16, None, 0, False),  # cluster slices
     ("layer_norm", (4096, 8192), BF16, None, 2, False),
     ("rms_norm", (65536, 256), BF16, None, 0, False)],
)  # fmt: skip
def test_layer_norm_cached_rows_take_two_pass_statistics(op, shape, dtype, mode, cluster, two_pass):
    """A LayerNorm row one CTA caches in registers gets its mean and variance
    in two passes over the cached row, except rows of more than two warps in
    grids of over 32 row blocks per SM; shared-memory, streamed and cluster
    rows keep the one-pass merge. fwd_two_pass=1 turns the rule off, 2 forces
    it wherever a row is register-cached."""
    kw = dict(mode=mode, device="cpu", sm_count=132, arch="sm_90")
    with _tuning.override(fwd_cluster=cluster):
        plan = rtcnorm.explain(op, shape, dtype, **kw)
        assert bool(kernel_flags(plan["kernel"]) & TWO_PASS_STATS) == two_pass, plan
        assert ("statistics in two passes" in plan["reason"]) == two_pass, plan["reason"]
        off, forced = _explain_off_on("fwd_two_pass", op, shape, dtype, **kw)
    assert kernel_flags(off["kernel"]) == kernel_flags(plan["kernel"]) & ~TWO_PASS_STATS
    assert off["kernel"].split(", ")[:7] == plan["kernel"].split(", ")[:7]
    register_row = op == "layer_norm" and bool(kernel_flags(plan["kernel"]) & CACHED_ROW) and forced["cluster"] == 1
    assert bool(kernel_flags(forced["kernel"]) & TWO_PASS_STATS) == register_row, forced


@pytest.mark.parametrize(
    ("op", "shape", "dtype", "mode", "residual", "through_l1"),
    [("rms_norm", (16384, 8192), BF16, None, False, True),
     ("rms_norm", (4096, 5120), BF16, None, False, True),  # 40 MB: the threshold
     ("rms_norm", (4096, 5119), BF16, None, False, False),  # just under it
     ("rms_norm", (4096, 4096), BF16, None, False, False),
     ("rms_norm", (262144, 128), BF16, None, False, True),  # narrow rows, many waves
     ("rms_norm", (32768, 128), BF16, None, False, False),
     ("rms_norm", (16384, 4096), BF16, None, True, True),  # residual beside x
     ("layer_norm", (8192, 8192), torch.float32, None, False, True),
     ("layer_norm", (8192, 2048), BF16, None, False, False),
     ("layer_norm", (2048, 65536), torch.float16, None, False, True),  # row in shared memory
     ("layer_norm", (4096, 8192), BF16, "multi_wave_reload", False, True),  # streamed twice
     ("layer_norm", (512, 131072), BF16, None, False, False),  # cluster slices keep no_allocate
     ("layer_norm", (1, 262144), torch.float32, None, False, False)],
)  # fmt: skip
def test_large_forward_inputs_read_through_l1(op, shape, dtype, mode, residual, through_l1):
    """Forward inputs of 40 MB or more are read through L1 (kL1Allocate), unless
    a cluster splits the row; smaller ones around it. fwd_l1_alloc=1 / 2 force
    either way and change nothing else; the backward never takes the flag."""
    kw = dict(mode=mode, residual=residual, device="cpu", sm_count=132, arch="sm_90")
    plan = rtcnorm.explain(op, shape, dtype, **kw)
    assert bool(kernel_flags(plan["kernel"]) & L1_ALLOCATE) == through_l1, plan
    assert ("read through L1" in plan["reason"]) == through_l1, plan["reason"]
    off, on = _explain_off_on("fwd_l1_alloc", op, shape, dtype, **kw)
    assert kernel_flags(off["kernel"]) == kernel_flags(plan["kernel"]) & ~L1_ALLOCATE
    assert kernel_flags(on["kernel"]) == kernel_flags(plan["kernel"]) | L1_ALLOCATE
    for other in (off, on):
        assert other["kernel"].split(", ")[:7] == plan["kernel"].split(", ")[:7]
        assert other["backward"] == plan["backward"]
        assert (other["grid"], other["block"], other["smem"]) == (plan["grid"], plan["block"], plan["smem"])


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape", [(4096, 1024), (256, 8192), (2048, 32768), (512, 131072), (1, 4096)])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
def test_backward_launches_later_kernels_programmatically_from_sm_90(op, shape, arch):
    """On sm_90+ the backward's column kernel (split design) and column reduce
    are launched programmatically; before sm_90 they are plain launches.
    bwd_programmatic=1 / 2 force either way and change no kernel or grid."""
    kw = dict(device="cpu", sm_count=132, arch=arch)
    plan = rtcnorm.explain(op, shape, BF16, **kw)
    assert plan["backward"]["programmatic_launch"] == (arch != "sm_80")
    off, on = _explain_off_on("bwd_programmatic", op, shape, BF16, **kw)
    assert not off["backward"]["programmatic_launch"] and on["backward"]["programmatic_launch"]
    for other in (off, on):
        assert {**other["backward"], "programmatic_launch": None} == {**plan["backward"], "programmatic_launch": None}
        assert other["kernel"] == plan["kernel"]


@pytest.mark.parametrize(
    ("n", "dtype", "threads", "elems"),
    [(8192, torch.bfloat16, 512, 16), (8192, torch.float32, 512, 16), (12288, torch.bfloat16, 384, 32),
     (16384, torch.bfloat16, 512, 32), (16384, torch.float32, 512, 32), (4096, torch.bfloat16, 256, 16)],
)  # fmt: skip
def test_rms_backward_caches_32_elements_only_above_8192(n, dtype, threads, elems):
    """RMSNorm's backward keeps 32 row elements per thread for N in (8192, 16384]
    and 16 at N = 8192, where 32 spilled (fp32: 264-304 bytes). (On sm_90+ a
    float32 row past 8192 elements is split across a cluster instead.)"""
    kernel = rtcnorm.explain("rms_norm", (16384, n), dtype, device="cpu", arch="sm_80")["backward"]["kernel"]
    vec, tpr, _, nv = (int(f) for f in kernel.split(", ")[3:7])
    assert (tpr, vec * nv) == (threads, elems), kernel


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
