"""Rows of huge magnitude: scale-safe statistics, never silent zeros.

fp32 rows near 1e30 and bf16 rows near 1e38 overflow fp32 sums of squares
(and bf16 ones the plain sum too). Their outputs must still be the
normalized values, about +-1, against a float64 reference that divides each
row by its largest magnitude first (so the reference itself cannot overflow,
even for float64 rows of 1e200).
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from reference import assert_close

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
# (dtype, row magnitude): fp32 squares overflow from about 2e19; bf16 rows
# near 1e38 overflow even their plain sum; float64 (CPU only) from 1e155.
HUGE = [(F32, 1e30), (F32, 3e36), (BF16, 1e38), (F64, 1e200)]
EPS = 1e-5


def huge_rows(rows, n, dtype, device, magnitude, residual=False):
    """Fresh random rows of about `magnitude` (|values| below 3 * magnitude,
    so bf16 rows of 1e38 stay finite), and a residual of the same size."""
    x = (torch.randn(rows, n, dtype=F64).clamp(-3, 3) * magnitude / (2 if residual else 1)).to(dtype)
    r = (torch.randn(rows, n, dtype=F64).clamp(-3, 3) * magnitude / 2).to(dtype) if residual else None
    return x.to(device), (r.to(device) if r is not None else None)


def reference(op, h, weight=None, bias=None):
    """float64 y, mean and rstd of rows h (the residual sum already rounded)."""
    h64 = h.double()
    amax = h64.abs().amax(-1, keepdim=True)
    hs = h64 / amax
    mean = hs.mean(-1, keepdim=True) if op == "layer_norm" else torch.zeros_like(amax)
    var = (hs - mean).pow(2).mean(-1, keepdim=True)
    rstd_s = torch.rsqrt(var + EPS / amax.square())
    # eps / amax^2 underflows for float64 rows of 1e200: a constant row's zero
    # deviations times an infinite rstd stay zero, as eps makes them.
    y = torch.where(hs == mean, 0.0, (hs - mean) * rstd_s)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    rstd = torch.where(var == 0, EPS**-0.5, rstd_s / amax)
    return y, (mean * amax).squeeze(-1), rstd.squeeze(-1)


def run(op, x, weight, bias, residual=None):
    """(y, h, mean, rstd) of the op below the wrappers (h is x without residual)."""
    n = x.shape[-1]
    if op == "layer_norm":
        y, mean, rstd = torch.ops.rtcnorm.layer_norm(x, [n], weight, bias, EPS, None, False)
        return y, x, mean, rstd
    if residual is not None:
        y, h, rstd = torch.ops.rtcnorm.add_rms_norm(x, residual, [n], weight, EPS, None, False)
        return y, h, None, rstd
    y, rstd = torch.ops.rtcnorm.rms_norm(x, [n], weight, EPS, None, False)
    return y, x, None, rstd


def check(op, dtype, magnitude, device, n, rows=5, residual=False, mode=None):
    x, r = huge_rows(rows, n, dtype, device, magnitude, residual)
    wdtype = dtype if dtype != F64 else F64
    weight = (torch.randn(n, dtype=F64) * 0.5 + 1).to(wdtype).to(device)
    bias = (torch.randn(n, dtype=F64) * 0.5).to(wdtype).to(device) if op == "layer_norm" else None
    if mode is None:
        y, h, mean, rstd = run(op, x, weight, bias, r)
    else:
        fn = rtcnorm.layer_norm if op == "layer_norm" else rtcnorm.rms_norm
        args = (weight, bias) if op == "layer_norm" else (weight,)
        out = fn(x, n, *args, EPS, mode=mode, residual=r) if r is not None else fn(x, n, *args, EPS, mode=mode)
        y, h = out if r is not None else (out, x)
        mean = rstd = None
    ref_y, ref_mean, ref_rstd = reference(op, h, weight, bias)
    what = f"{op} {dtype} rows of {magnitude:g} (N={n}, mode={mode})"
    # A rescued row's statistics are fp32 sums of its N scaled values, so
    # their error, and the outputs', grows with N like any reduction's.
    assert_close(y, ref_y, what=f"{what} y", reduce_len=n)
    if op == "rms_norm" or n > 1:  # a LayerNorm row of one element is its bias
        assert y.abs().amax() > 0.1, f"{what}: outputs are zero"
    if rstd is not None:
        stat = F64 if dtype == F64 else F32
        # rstd of rows near FLT_MAX is an fp32 subnormal of about 22 bits.
        assert_close(
            rstd * h.double().abs().amax(-1),
            ref_rstd * h.double().abs().amax(-1),
            what=f"{what} rstd",
            dtype=stat,
            reduce_len=n,
        )
        if mean is not None:
            assert_close(
                mean / h.double().abs().amax(-1),
                ref_mean / h.double().abs().amax(-1),
                what=f"{what} mean",
                dtype=stat,
                reduce_len=n,
            )


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype,magnitude", HUGE, ids=[f"{d}-{m:g}".replace("torch.", "") for d, m in HUGE])
@pytest.mark.parametrize("n", [1, 7, 256])
def test_cpu_huge_rows_are_normalized(op, dtype, magnitude, n):
    check(op, dtype, magnitude, "cpu", n)


@pytest.mark.parametrize("dtype,magnitude", HUGE, ids=[f"{d}-{m:g}".replace("torch.", "") for d, m in HUGE])
def test_cpu_huge_rows_with_a_residual(dtype, magnitude):
    check("rms_norm", dtype, magnitude, "cpu", 64, residual=True)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_cpu_ordinary_rows_beside_huge_ones_are_unchanged(op):
    """Only rows whose sums overflow are recomputed: the others come out bit
    for bit as they do in a batch of ordinary rows."""
    x = torch.randn(6, 32)
    big = x.clone()
    big[1::2] *= 1e30
    y_big = run(op, big, None, None)[0]
    y_small = run(op, x, None, None)[0]
    assert torch.equal(y_big[0::2], y_small[0::2])
    assert_close(y_big[1::2], reference(op, big[1::2])[0], what=f"{op} huge rows among ordinary ones")


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_cpu_rows_with_inf_or_nan_stay_non_finite(op):
    """A row holding an inf or a NaN has no normalized values: its outputs
    stay non-finite as before, and the rows beside it are unaffected."""
    x = torch.randn(4, 16) * 1e30
    x[1, 3] = float("inf")
    x[2, 5] = float("nan")
    y = run(op, x, None, None)[0]
    assert not torch.isfinite(y[1]).all() and not torch.isfinite(y[2]).all()
    assert_close(y[0::3], reference(op, x[0::3])[0], what=f"{op} finite rows beside inf and NaN")


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_cpu_backward_of_huge_rows(op):
    """dx of rows of 1e30 is about 1e-30: compared after scaling by the row's magnitude."""
    x, _ = huge_rows(4, 48, F32, "cpu", 1e30)
    w = torch.randn(48) * 0.5 + 1
    x.requires_grad_()
    dy = torch.randn(4, 48)
    y = rtcnorm.layer_norm(x, 48, w, eps=EPS) if op == "layer_norm" else rtcnorm.rms_norm(x, 48, w, EPS)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    amax = x64.detach().abs().amax(-1, keepdim=True)
    ref_fn = torch.nn.functional.layer_norm if op == "layer_norm" else torch.nn.functional.rms_norm
    (ref_dx,) = torch.autograd.grad(ref_fn(x64, (48,), w.double(), eps=EPS), x64, dy.double())
    assert_close(dx * amax, ref_dx * amax, what=f"{op} dx of rows of 1e30 (times 1e30)", dtype=F32)


# ---- GPU kernels -----------------------------------------------------------------

GPU_HUGE = [(F32, 1e30), (BF16, 1e38)]
GPU_IDS = [f"{d}-{m:g}".replace("torch.", "") for d, m in GPU_HUGE]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype,magnitude", GPU_HUGE, ids=GPU_IDS)
@pytest.mark.parametrize("n", [7, 1000, 4096, 7168, 65536])
def test_gpu_huge_rows_are_normalized(op, dtype, magnitude, n):
    check(op, dtype, magnitude, "cuda", n, rows=33)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("mode", ["static_persistent", "multi_wave_reload", "multi_wave_cached"])
@pytest.mark.parametrize("dtype,magnitude", GPU_HUGE, ids=GPU_IDS)
def test_gpu_huge_rows_in_every_mode(op, mode, dtype, magnitude):
    check(op, dtype, magnitude, "cuda", 4096, rows=300, mode=mode)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,magnitude", GPU_HUGE, ids=GPU_IDS)
@pytest.mark.parametrize("n", [1024, 7168])
def test_gpu_huge_rows_with_a_residual(dtype, magnitude, n):
    check("rms_norm", dtype, magnitude, "cuda", n, rows=64, residual=True)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape", [(512, 131072), (1024, 65536), (2048, 32768)])
def test_gpu_huge_rows_of_cluster_and_staged_designs(op, shape):
    """Wide bf16 rows (row clusters and staged rows on sm_90+): one huge row
    in every eight, the others ordinary and unchanged by the guard."""
    rows, n = shape
    x = torch.randn(rows, n, device="cuda").to(BF16)
    plain = run(op, x, None, None)[0]
    x[::8] = huge_rows(rows // 8, n, BF16, "cuda", 1e38)[0]
    y = run(op, x, None, None)[0]
    assert torch.equal(y[1::8], plain[1::8])
    assert_close(y[::8], reference(op, x[::8])[0], what=f"{op} bf16 {shape} huge rows")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_gpu_rows_with_inf_stay_non_finite(op):
    x = torch.randn(64, 4096, device="cuda") * 1e30
    x[3, 17] = float("inf")
    y = run(op, x, None, None)[0]
    assert not torch.isfinite(y[3]).all()
    others = torch.cat([x[:3], x[4:]])
    assert_close(torch.cat([y[:3], y[4:]]), reference(op, others)[0], what=f"{op} finite rows beside an inf")
