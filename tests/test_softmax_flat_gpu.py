"""flat_row softmax kernels on the GPU (marked ``gpu``; skipped without CUDA).

Rows whose width allows no 16-byte access, staged through shared memory in
16-byte pieces. Each case runs on fresh random data into a NaN-poisoned
output, forward and backward, and is held element by element to a float64
reference; the plan is checked to be the flat design (forced, or picked).
"""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning
from softmax_reference import (
    DTYPES,
    assert_backward_close,
    assert_forward_close,
    call,
    poison_next_alloc,
    random_input,
    reference_softmax,
    reference_softmax_backward,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PLAIN = "scaled_softmax"
CAUSAL = "scaled_upper_triang_masked_softmax"
ALIGNED = "scaled_aligned_causal_masked_softmax"


def _designs(op, x):
    """The designs this device plans for x (forward, backward)."""
    major, minor = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    e = rtcnorm.softmax.explain(op, x.shape, x.dtype, arch=f"sm_{major}{minor}", sm_count=sms)
    return e["forward"]["design"], e["backward"]["design"]


def check_flat(op, x, scale=0.37, seed=0, hidden_nan=False):
    """Forward and backward of `op` on x against float64 references. With
    hidden_nan, x and dy hold NaN past the causal diagonal, which no result
    may see."""
    causal = op in (CAUSAL, ALIGNED)
    dy = random_input(x.shape, x.dtype, x.device, seed + 7)
    x_in, dy_in = x, dy
    if hidden_nan:
        sq, sk = x.shape[-2:]
        hidden = torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(sk - sq + 1)
        x_in, dy_in = x.masked_fill(hidden, float("nan")), dy.masked_fill(hidden, float("nan"))
    poison_next_alloc(x)
    y = call(op, x_in, None, scale)
    y_ref = reference_softmax(x.double(), scale, None, causal)
    assert y.dtype == x.dtype and y.is_contiguous()
    assert_forward_close(y, y_ref, what=f"{op} forward {tuple(x.shape)} {x.dtype}")
    poison_next_alloc(x)
    dx = torch.ops.rtcnorm.scaled_softmax_backward(dy_in, y, scale, causal)
    dx_ref = reference_softmax_backward(dy.double(), y.double(), scale, causal)
    assert_backward_close(dx, dx_ref, y.double(), dy, scale, what=f"{op} backward {tuple(x.shape)} {x.dtype}")
    return y, dx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1),
        (1, 3),
        (7, 1),
        (65537, 3),  # 256 rows a block: the last block part full
        (1001, 999),  # 2 rows a block, an odd number of blocks
        (1, 12345),
        (300, 12345),
        (5, 4098),  # 16-bit: 4-byte vectors
        (3, 32769),  # forward only where the ring holds the row
    ],
)
def test_gpu_flat_forced_matches_float64(shape, dtype):
    x = random_input(shape, dtype, "cuda", seed=shape[-1])
    with _tuning.softmax_override(design="flat_row"):
        fwd, bwd = _designs(PLAIN, x)
        if shape[-1] * dtype.itemsize * 2 * 2 < 160 << 10:  # two stages of y and dy fit any sm_80+
            assert fwd == bwd == "flat_row", (fwd, bwd)
        check_flat(PLAIN, x, seed=shape[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.37, -2.5])
def test_gpu_flat_scaled(scale, dtype):
    x = random_input((333, 1001), dtype, "cuda", seed=5)
    with _tuning.softmax_override(design="flat_row"):
        assert _designs(PLAIN, x) == ("flat_row", "flat_row")
        check_flat(PLAIN, x, scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("op", "shape"),
    [
        (CAUSAL, (2, 3, 37, 37)),
        (CAUSAL, (1, 2, 333, 333)),
        (ALIGNED, (1, 2, 5, 12345)),
        (ALIGNED, (2, 3, 9, 45)),
        (ALIGNED, (1, 4, 1, 4097)),  # a single query: the plain kernel
    ],
)
def test_gpu_flat_causal(op, shape, dtype):
    """Keys past the diagonal are written as 0 and never read: NaN there in x or dy changes nothing."""
    x = random_input(shape, dtype, "cuda", seed=shape[-1])
    with _tuning.softmax_override(design="flat_row"):
        assert _designs(op, x) == ("flat_row", "flat_row")
        check_flat(op, x, hidden_nan=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("shape", "prev_fwd", "prev_bwd"), [((4096, 12345), "streamed", "rows"), ((256, 4097), "rows", "rows")]
)
def test_gpu_flat_against_the_previous_design(shape, prev_fwd, prev_bwd, dtype):
    """Flat rows and the designs planned before them agree to rounding."""
    x = random_input(shape, dtype, "cuda", seed=9)
    assert _designs(PLAIN, x)[0] == "flat_row"
    with _tuning.softmax_override(design="flat_row"):
        y, dx = check_flat(PLAIN, x)
    dy = random_input(shape, dtype, "cuda", seed=7)  # check_flat's dy (seed 0 + 7)
    with _tuning.softmax_override(design=prev_fwd):
        assert _designs(PLAIN, x)[0] == prev_fwd
        y1 = call(PLAIN, x, None, 0.37)
    with _tuning.softmax_override(design=prev_bwd):
        assert _designs(PLAIN, x)[1] == prev_bwd
        dx1 = torch.ops.rtcnorm.scaled_softmax_backward(dy, y, 0.37, False)
    assert_forward_close(y, y1.double(), what="flat against " + prev_fwd)
    assert_backward_close(dx, dx1.double(), y.double(), dy, 0.37, what="flat against " + prev_bwd)


@pytest.mark.parametrize("knobs", [{"ctas_per_sm": 1}, {"ctas_per_sm": 3, "stream_store": 1}])
def test_gpu_flat_knobs(knobs):
    """One CTA an SM walks many row blocks round the ring; evict-first stores change no bits."""
    x = random_input((2000, 777), torch.bfloat16, "cuda", seed=3)
    with _tuning.softmax_override(design="flat_row"):
        y, dx = check_flat(PLAIN, x)
    with _tuning.softmax_override(design="flat_row", **knobs):
        assert _designs(PLAIN, x) == ("flat_row", "flat_row")
        y1, dx1 = check_flat(PLAIN, x)
    assert torch.equal(y, y1) and torch.equal(dx, dx1)


def test_gpu_unstaged_inputs_take_other_designs():
    """Odd rows that are not one aligned flat array (a slice, a transpose) run
    the other designs, forced flat or not, and stay correct."""
    base = random_input((64, 1002), torch.bfloat16, "cuda", seed=4)
    with _tuning.softmax_override(design="flat_row"):
        check_flat(PLAIN, base[:, 1:])  # rows 2 bytes past alignment, strided
        check_flat(PLAIN, base[:, :999].t())  # not contiguous
        check_flat(PLAIN, base.view(-1)[1 : 1 + 63 * 1001].view(1001, 63))  # contiguous, 2 bytes past alignment
