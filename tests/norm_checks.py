"""Run an rtcnorm norm op forward and backward and compare every output with
the float64 references, on any device. Shared by the RMSNorm and LayerNorm
tests, CPU and GPU alike."""

from __future__ import annotations

import math

import pytest
import torch
from reference import assert_close, ref_layer_norm, ref_rms_norm, rows_of, stat_dtype

# kSingleStride, kStreamStore, kPrefetchNext and kPreloadAffine in a kernel
# key's flags (csrc/kernels/common/params.cuh).
SINGLE_STRIDE = 1 << 9
STREAM_STORE = 1 << 10
PREFETCH_NEXT = 1 << 11
PRELOAD_AFFINE = 1 << 24
# explain()'s reason for a 16-bit LayerNorm row of 64-128 KB in registers
# (wide_ln_register_row).
WIDE_LN_REGS = "a 16-bit LayerNorm row of 64-128 KB at 64 elements a thread"


def rows_of_strides(rows: int, n: int, dtype, device, groups: int) -> torch.Tensor:
    """A (rows / 2, 2, n) view of random rows (rows even), none adjacent to
    the next: every other row of a wider buffer (groups=1: the leading dims
    collapse into one row stride), or the q heads of a fused (rows / 2, 3, 2,
    n) projection (groups=2: two strides, the general row map)."""
    assert rows % 2 == 0, rows
    if groups == 1:
        return torch.randn(2 * rows, n, device=device).to(dtype)[::2].view(rows // 2, 2, n)
    return torch.randn(rows // 2, 3, 2, n, device=device).to(dtype)[:, 0]


def kernel_flags(kernel: str) -> int:
    """The flags of a kernel instantiation as explain() names it."""
    return int(kernel.split(", ")[-2].rstrip("u"))


def column_cluster(kernel: str) -> int:
    """CTAs of the column cluster a kernel key names: log2 in flag bits 14-15,
    or bit 30 alone for 16 (kClusterBits, kCluster16)."""
    flags = kernel_flags(kernel)
    return 16 if flags >> 30 & 1 else 1 << (flags >> 14 & 3)


# Row lengths of the GPU tests: narrow, odd, model sizes, 1024-thread and streamed rows.
GPU_N = (1, 7, 127, 128, 1000, 3584, 4096, 4097, 5120, 7168, 65536, 262144)
GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MODES = (None, "static_persistent", "multi_wave_reload", "multi_wave_cached")
# (M, N): a single row, and 65537 rows (one past a power of two) of moderate width.
ROW_COUNT_SHAPES = [(1, 1), (1, 127), (1, 4096), (1, 7168), (1, 262144), (65537, 1), (65537, 127), (65537, 1000)]

# CPU reference tests of both norms: every dtype the CPU kernels take, and
# shapes with leading dims, a two-dim normalized_shape, odd N, N = 1 and a
# row wider than a 4096-thread chunk.
CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CPU_SHAPES = {
    "rows": ((7, 1000), [1000]),
    "leading_dims": ((2, 3, 5, 64), [64]),
    "two_normalized_dims": ((4, 6, 8), [6, 8]),
    "odd_n": ((5, 127), [127]),
    "n_is_1": ((9, 1), [1]),
    "one_wide_row": ((1, 4097), [4097]),
}

# Weight/bias variants. "mixed" is a float32 weight (and bias) beside 16-bit input.
RMS_VARIANTS = ("weight", "no_weight", "zero_centered", "mixed", "residual")
LN_VARIANTS = ("weight_bias", "weight", "bias", "no_affine", "zero_centered", "mixed")


def randn(shape, dtype, device, *, scale=1.0, shift=0.0):
    """Fresh standard-normal data (never zeros), rounded to dtype."""
    return (torch.randn(shape, device=device, dtype=torch.float64) * scale + shift).to(dtype)


def randomize(module: torch.nn.Module) -> torch.nn.Module:
    """Fills every parameter of ``module`` with random values near 1, in place."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(randn(p.shape, p.dtype, p.device, scale=0.5, shift=1.0))
    return module


def variant_applies(variant: str, dtype: torch.dtype) -> bool:
    return variant != "mixed" or dtype in (torch.float16, torch.bfloat16)


def rms_inputs(shape, normalized_shape, dtype, device, variant):
    """(x, weight, zero_centered_gamma, residual) for a variant of RMS_VARIANTS."""
    x = randn(shape, dtype, device)
    wdtype = torch.float32 if variant == "mixed" else dtype
    zcg = variant == "zero_centered"
    weight = None
    if variant != "no_weight":
        # Around 1 as a trained gamma is; around 0 for the zero-centred form.
        weight = randn(normalized_shape, wdtype, device, scale=0.5, shift=0.0 if zcg else 1.0)
    residual = randn(shape, dtype, device) if variant == "residual" else None
    return x, weight, zcg, residual


def ln_inputs(shape, normalized_shape, dtype, device, variant, *, shift=0.0):
    """(x, weight, bias, zero_centered_gamma) for a variant of LN_VARIANTS."""
    x = randn(shape, dtype, device, shift=shift)
    wdtype = torch.float32 if variant == "mixed" else dtype
    zcg = variant == "zero_centered"
    has_w = variant in ("weight_bias", "weight", "zero_centered", "mixed")
    has_b = variant in ("weight_bias", "bias", "zero_centered", "mixed")
    weight = randn(normalized_shape, wdtype, device, scale=0.5, shift=0.0 if zcg else 1.0) if has_w else None
    bias = randn(normalized_shape, wdtype, device, scale=0.5) if has_b else None
    return x, weight, bias, zcg


def dtype_variant_params(dtypes, variants):
    return [
        pytest.param(d, v, id=f"{str(d).removeprefix('torch.')}-{v}")
        for d in dtypes
        for v in variants
        if variant_applies(v, d)
    ]


def noncontiguous_cases(device, dtype):
    """(name, x, normalized_shape, copy_free): strided or misaligned rows the
    kernels address in place, and two layouts that need a copy."""
    base = torch.randn(2, 9, 3 * 4, 64, device=device).to(dtype)  # a fused qkv: (B, S, 3H, D), H = 4
    return [
        ("every_other_row", torch.randn(26, 96, device=device).to(dtype)[::2], [96], True),
        ("q_of_fused_qkv", base[:, :, :4], [64], True),
        ("k_of_fused_qkv", base[:, :, 4:8], [64], True),
        ("transposed_leading_dims", torch.randn(3, 5, 128, device=device).to(dtype).transpose(0, 1), [128], True),
        ("storage_offset_one", torch.randn(8 * 40 + 1, device=device).to(dtype)[1:].view(8, 40), [40], True),
        ("three_row_groups", torch.randn(4, 6, 5, 32, device=device).to(dtype)[::2, ::2, 1:4], [32], False),
        ("strided_last_dim", torch.randn(6, 128, device=device).to(dtype)[:, ::2], [64], False),
    ]


def _leaf(t, grad):
    return None if t is None else t.detach().requires_grad_(grad)


def _poison_for(poison, *tensors):
    if poison is not None:
        poison(4 * sum(t.numel() * t.element_size() for t in tensors if t is not None))


def _check_outputs(y, stats, x, normalized_shape, ref, stat_names, stat_scale=1.0):
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous()
    assert_close(y, ref["y"], what="y")
    lead = x.shape[: x.dim() - len(normalized_shape)]
    for name, t in zip(stat_names, stats):
        assert t.dtype == (stat_dtype(x) if x.device.type == "cpu" else torch.float32), name
        assert t.shape == lead, name
        assert_close(t, ref[name], what=name, scale=stat_scale)


def check_rms_norm(
    x,
    normalized_shape,
    weight=None,
    eps=None,
    *,
    mode=None,
    zero_centered_gamma=False,
    residual=None,
    backward=True,
    poison=None,
):
    """Runs torch.ops.rtcnorm.rms_norm (add_rms_norm with a residual) and its
    autograd backward; asserts every output matches the reference."""
    normalized_shape = list(normalized_shape)
    xl, wl, rl = _leaf(x, backward), _leaf(weight, backward), _leaf(residual, backward)
    _poison_for(poison, x, x, residual)
    if residual is None:
        y, rstd = torch.ops.rtcnorm.rms_norm(xl, normalized_shape, wl, eps, mode, zero_centered_gamma)
        h = None
    else:
        y, h, rstd = torch.ops.rtcnorm.add_rms_norm(xl, rl, normalized_shape, wl, eps, mode, zero_centered_gamma)
    dy = torch.randn_like(y) if backward else None
    dh = torch.randn_like(h) if backward and h is not None else None
    ref = ref_rms_norm(
        x, normalized_shape, weight, eps, zero_centered_gamma=zero_centered_gamma, residual=residual, dy=dy, dh=dh
    )
    _check_outputs(y, [rstd], x, normalized_shape, ref, ["rstd"])
    if h is not None:
        assert h.dtype == x.dtype and h.is_contiguous()
        assert_close(h, ref["h"].double(), what="h")
    if not backward:
        return y
    _poison_for(poison, x, x, weight, weight)
    outputs, grads = ([y, h], [dy, dh]) if h is not None else ([y], [dy])
    torch.autograd.backward(outputs, grads)
    m = rows_of(x, normalized_shape)
    # Rows of one element: dx = rstd * dy*g * (1 - xhat^2) cancels in fp32 as
    # xhat^2 -> 1 (the exact value is ~eps-sized), so allow a few fp32 ulps
    # of rstd * dy*g instead of the usual relative bound.
    dx_scale = 10.0 if math.prod(normalized_shape) == 1 else 1.0
    assert_close(xl.grad, ref["dx"], what="dx", scale=dx_scale)
    if rl is not None:
        assert_close(rl.grad, ref["dx"], what="d(residual)", scale=dx_scale)
    if wl is not None:
        assert wl.grad.dtype == weight.dtype
        assert_close(wl.grad, ref["dw"], what="dw", reduce_len=m)
    return y


def check_layer_norm(
    x,
    normalized_shape,
    weight=None,
    bias=None,
    eps=1e-5,
    *,
    mode=None,
    zero_centered_gamma=False,
    backward=True,
    poison=None,
    stat_scale=1.0,
):
    """Runs torch.ops.rtcnorm.layer_norm and its autograd backward; asserts
    every output matches the reference (mean, rstd and dx within
    ``stat_scale`` times the usual tolerance: dx is built from x - mean)."""
    normalized_shape = list(normalized_shape)
    xl, wl, bl = _leaf(x, backward), _leaf(weight, backward), _leaf(bias, backward)
    _poison_for(poison, x, x)
    y, mean, rstd = torch.ops.rtcnorm.layer_norm(xl, normalized_shape, wl, bl, eps, mode, zero_centered_gamma)
    dy = torch.randn_like(y) if backward else None
    ref = ref_layer_norm(x, normalized_shape, weight, bias, eps, zero_centered_gamma=zero_centered_gamma, dy=dy)
    _check_outputs(y, [mean, rstd], x, normalized_shape, ref, ["mean", "rstd"], stat_scale)
    if not backward:
        return y
    _poison_for(poison, x, x, weight, bias)
    y.backward(dy)
    m = rows_of(x, normalized_shape)
    assert_close(xl.grad, ref["dx"], what="dx", scale=stat_scale)
    if wl is not None:
        assert wl.grad.dtype == weight.dtype
        assert_close(wl.grad, ref["dw"], what="dw", reduce_len=m)
    if bl is not None:
        assert bl.grad.dtype == bias.dtype
        assert_close(bl.grad, ref["db"], what="db", reduce_len=m)
    return y


def gpu_rows(n: int, budget: int = 1 << 22) -> int:
    """An odd row count that gives about ``budget`` elements (at most 65537 rows),
    so that persistent CTAs loop over several row blocks and the last block is partial."""
    return max(3, min(65537, budget // n)) | 1


def numel(shape) -> int:
    return math.prod(shape)
