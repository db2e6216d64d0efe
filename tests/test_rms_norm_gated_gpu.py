"""Gated RMSNorm on the GPU (marker gpu): the NVRTC kernels against the
float64 reference with poisoned outputs, the ATen fallback beyond the
register plans, strided rows, mixed weight dtype, and a bitwise
deterministic backward."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import rtcnorm
import torch
from gated_checks import ACTIVATIONS, CASES, ORDERS, check_gated, gated_inputs
from rtcnorm import _C

pytestmark = pytest.mark.gpu

GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# Model widths with Mamba2-like group sizes, beside the awkward CASES.
MODEL_CASES = [
    (2048, (None, 1024, 64)),
    (4096, (None, 1024)),
    (8192, (None, 1024, 2048)),
    (5120, (None, 1024)),  # one segment of 10 warps
    (3072, (None,)),  # 6 warps forward, 4 backward
]


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


@pytest.fixture(scope="module", autouse=True)
def _warm_kernels():
    """Compiles every kernel the matrix below launches on all CPU cores at
    once (aligned tensors plan these keys), instead of one at a time."""
    if not torch.cuda.is_available():
        return
    jobs = [
        (DTYPE_NAMES[dt], DTYPE_NAMES[dt], n, g or n, weight, order, act == "sigmoid", _arch())
        for dt in GPU_DTYPES
        for n, groups in CASES + MODEL_CASES
        for g in groups
        for weight in (True, False)
        for order in ORDERS
        for act in ACTIVATIONS
    ]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda j: _C._gated_plan(*j, compile=True), jobs))


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("norm_before_gate", ORDERS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gpu_matches_reference(dtype, norm_before_gate, activation, poison):
    for n, groups in CASES + MODEL_CASES:
        for g in groups:
            for weight in (True, False):
                for m in (1, 5, 257):
                    x, z, w = gated_inputs((m, n), dtype, "cuda", weight=weight)
                    poison(6 * x.numel() * x.element_size())
                    check_gated(x, z, w, norm_before_gate=norm_before_gate, group_size=g, activation=activation)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_kernels_cover_model_widths(dtype):
    """The shapes above run the NVRTC kernels, not the ATen fallback."""
    for n, groups in MODEL_CASES:
        for g in groups:
            plan = _C._gated_plan(DTYPE_NAMES[dtype], DTYPE_NAMES[dtype], n, g or n, True, True, False, _arch())
            assert plan["forward"] is not None and plan["backward"] is not None, (n, g)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_float32_weight_and_leading_dims(dtype, poison):
    for order in ORDERS:
        x, z, w = gated_inputs((3, 7, 1024), dtype, "cuda", weight_dtype=torch.float32)
        poison(8 << 20)
        check_gated(x, z, w, norm_before_gate=order, group_size=256)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_strided_rows(dtype, poison):
    """x and z sliced out of wider buffers (one row stride each), and a
    transposed x that takes the contiguous copy."""
    bx = torch.randn(64, 3 * 512, device="cuda").to(dtype)
    bz = torch.randn(64, 2 * 512, device="cuda").to(dtype)
    x, z = bx[:, 512:1024], bz[:, 512:]
    w = torch.randn(512, device="cuda").to(dtype)
    for order in ORDERS:
        poison(8 << 20)
        check_gated(x, z, w, norm_before_gate=order, group_size=128)
    xt = torch.randn(512, 64, device="cuda").to(dtype).t()
    poison(8 << 20)
    check_gated(xt, torch.randn_like(xt), w, norm_before_gate=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_fallback_past_the_register_plans(dtype, poison):
    """Rows no register plan holds (backward at 131072; 2048 groups of 2)
    run the ATen path and still match the reference."""
    for n, g in ((131072, None), (4096, 2)):
        x, z, w = gated_inputs((3, n), dtype, "cuda")
        poison(8 << 20)
        check_gated(x, z, w, group_size=g)


def test_gpu_many_rows():
    x, z, w = gated_inputs((65537, 128), torch.bfloat16, "cuda")
    check_gated(x, z, w, group_size=64, norm_before_gate=False)


@pytest.mark.parametrize("order", ORDERS)
def test_gpu_backward_is_bitwise_deterministic(order):
    x, z, w = gated_inputs((8192, 4096), torch.bfloat16, "cuda")
    y, rstd = torch.ops.rtcnorm.rms_norm_gated(x, z, w, 1e-6, order, 1024, "silu")
    dy = torch.randn_like(y)
    runs = [torch.ops.rtcnorm.rms_norm_gated_backward(dy, x, z, rstd, w, order, 1024, "silu", True) for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    assert runs[0][2].shape == w.shape and bool(torch.isfinite(runs[0][2]).all())


def test_gpu_module_and_compile():
    m = rtcnorm.RMSNormGated(1024, group_size=256).cuda().to(torch.bfloat16)
    x, z, _ = gated_inputs((16, 1024), torch.bfloat16, "cuda", weight=False)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, z), m(x, z))


def test_gpu_opcheck():
    from torch.library import opcheck

    ops = torch.ops.rtcnorm
    x, z, w = gated_inputs((4, 256), torch.bfloat16, "cuda")
    opcheck(ops.rms_norm_gated.default, (x.requires_grad_(), z.requires_grad_(), w, 1e-6, False, 64, "silu"))
    x, z = x.detach(), z.detach()
    y, rstd = ops.rms_norm_gated(x, z, w, 1e-6, True, 64, "sigmoid")
    opcheck(ops.rms_norm_gated_backward.default, (torch.randn_like(y), x, z, rstd, w, True, 64, "sigmoid", True))
