"""Property: every op and its fake impl agree on the same random arguments,
valid and invalid, on CPU. Both succeed with outputs of the same shapes and
dtypes, or both raise the same exception type with the same message.

Arguments cover dtypes (int32, float8 and float64 beside the kernel dtypes),
sizes of 0, mismatched and empty shapes, rows of more than 2^24 elements
(on inputs of no element), eps negative / NaN / inf, bad modes, wrong
weights, biases, residuals, gradients and statistics, masks that do and do
not broadcast, and scales that are not finite."""

from __future__ import annotations

import logging
import math

import pytest
import rtcnorm  # noqa: F401  (registers torch.ops.rtcnorm)
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

OPS = torch.ops.rtcnorm
F8 = torch.float8_e4m3fn
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, F8)
SCALARS = (1.0, 0.5, -2.0, 0.0, math.nan, math.inf, -math.inf)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def quiet_fake_tensor_log():
    # FakeTensorMode logs every exception a fake impl raises, with a traceback.
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    yield
    log.setLevel(level)


def make(shape, dtype):
    return torch.randn(shape, dtype=torch.float64).to(dtype)


def outcome(fn):
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the exception itself is compared
        return ("raise", type(e).__name__, str(e))
    outs = out if isinstance(out, tuple | list) else (out,)
    return ("ok", [(tuple(o.shape), o.dtype) for o in outs])


def assert_agree(op, args):
    real = outcome(lambda: op(*args))
    mode = FakeTensorMode()
    fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]

    def fake():
        with mode:
            return op(*fake_args)

    assert outcome(fake) == real, (op, [getattr(a, "shape", a) for a in args], real)
    return real


def broken_shape(shape):
    """A shape that differs from `shape` (and is never all ones where it was not)."""
    return [*shape[:-1], shape[-1] + 2] if shape else [2]


# ---- the norm ops ------------------------------------------------------------


@st.composite
def norm_shapes(draw):
    """(input shape, normalized_shape): valid, or one of the ways to be wrong."""
    lead = draw(st.lists(st.integers(0, 3), max_size=2))
    hidden = draw(st.lists(st.integers(1, 5), min_size=1, max_size=2))
    kind = draw(st.sampled_from(["valid"] * 4 + ["empty", "zero", "mismatch", "negative", "huge"]))
    if kind == "zero":
        hidden[-1] = 0
    if kind == "huge":
        lead, hidden = [0, *lead], [4097, 4097]
    ns = {"empty": [], "mismatch": broken_shape(hidden), "negative": [-1]}.get(kind, hidden)
    return [*lead, *hidden], ns


@st.composite
def param(draw, shape, dtype):
    """None, or a weight / bias: right, or of a wrong shape or dtype."""
    kind = draw(st.sampled_from([None, "input_dtype", "float32", "shape", "dtype"]))
    if kind is None or math.prod(shape) > 4096:  # rows of 2^24 elements: no weight of that size
        return None
    if kind == "shape":
        return make(broken_shape(shape), dtype)
    pdtype = {"input_dtype": dtype, "float32": torch.float32}.get(kind) or draw(st.sampled_from(DTYPES))
    return make(shape, pdtype)


@st.composite
def like(draw, shape, dtype):
    """A tensor like input (residual, gradient): right, wrong shape or wrong dtype."""
    kind = draw(st.sampled_from(["right", "right", "shape", "dtype"]))
    if kind == "shape":
        return make(broken_shape(shape), dtype)
    return make(shape, dtype if kind == "right" else draw(st.sampled_from(DTYPES)))


@st.composite
def stat(draw, lead, dtype):
    """Per-row statistic: right, of the wrong row count, or of the wrong dtype."""
    right = torch.float64 if dtype == torch.float64 else torch.float32
    kind = draw(st.sampled_from(["right", "right", "rows", "dtype"]))
    if kind == "rows":
        return torch.rand(math.prod(lead) + 1, dtype=right) + 0.5
    return (torch.rand(lead, dtype=torch.float64) + 0.5).to(right if kind == "right" else draw(st.sampled_from(DTYPES)))


@st.composite
def norm_calls(draw):
    op = draw(st.sampled_from(["rms_norm", "add_rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward"]))
    dtype = draw(st.sampled_from(DTYPES))
    shape, ns = draw(norm_shapes())
    x = make(shape, dtype)
    pshape = shape[len(shape) - len(ns) :] if 0 < len(ns) <= len(shape) else ns
    weight = draw(param(pshape, dtype))
    eps = draw(st.sampled_from([None, 1e-5, 1e-2, 0.0, -1.0, math.nan, math.inf]))
    mode = draw(st.sampled_from([None, "multi_wave_cached", "static_persistent", "fast"]))
    zero_centered = draw(st.booleans())
    if op == "rms_norm":
        return OPS.rms_norm, (x, ns, weight, eps, mode, zero_centered)
    if op == "add_rms_norm":
        return OPS.add_rms_norm, (x, draw(like(shape, dtype)), ns, weight, eps, mode, zero_centered)
    bias = draw(param(pshape, dtype))
    if op == "layer_norm":
        return OPS.layer_norm, (x, ns, weight, bias, 1e-5 if eps is None else eps, mode, zero_centered)
    lead = shape[: max(0, len(shape) - len(ns))]
    grad, rstd = draw(like(shape, dtype)), draw(stat(lead, dtype))
    w_grad, b_grad = draw(st.booleans()), draw(st.booleans())
    if op == "rms_norm_backward":
        grad_h = draw(st.one_of(st.none(), like(shape, dtype)))
        return OPS.rms_norm_backward, (grad, x, rstd, weight, ns, zero_centered, w_grad, grad_h)
    mean = draw(stat(lead, dtype))
    return OPS.layer_norm_backward, (grad, x, mean, rstd, weight, bias, ns, zero_centered, w_grad, b_grad)


@FUZZ
@given(norm_calls())
def test_norm_ops_and_fakes_agree(call):
    assert_agree(*call)


# ---- the softmax ops ---------------------------------------------------------

SOFTMAX_FORWARD = (
    "scaled_softmax",
    "scaled_masked_softmax",
    "scaled_upper_triang_masked_softmax",
    "scaled_aligned_causal_masked_softmax",
)


@st.composite
def mask_for(draw, shape):
    """A bool mask that broadcasts to `shape`, or a float / non-broadcasting / too-long one."""
    kind = draw(st.sampled_from(["broadcast"] * 3 + ["float", "shape", "dims"]))
    trailing = shape[len(shape) - draw(st.integers(0, len(shape))) :]
    mshape = [draw(st.sampled_from([1, d])) for d in trailing]
    if kind == "shape":
        mshape = broken_shape(mshape)
    if kind == "dims":
        mshape = [1, *shape]
    m = torch.rand(mshape) < 0.3
    return m.float() if kind == "float" else m


@st.composite
def softmax_calls(draw):
    op = draw(st.sampled_from([*SOFTMAX_FORWARD, "scaled_softmax_backward"]))
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), max_size=4))
    scale = draw(st.sampled_from(SCALARS))
    x = make(shape, dtype)
    if op == "scaled_masked_softmax":
        return OPS.scaled_masked_softmax, (x, draw(mask_for(shape)), scale)
    if op == "scaled_softmax_backward":
        grad = draw(like(shape, dtype))
        return OPS.scaled_softmax_backward, (grad, x, scale, draw(st.booleans()))
    return getattr(OPS, op), (x, scale)


@FUZZ
@given(softmax_calls())
def test_softmax_ops_and_fakes_agree(call):
    assert_agree(*call)


def outcomes_of(strategy):
    """The outcome kinds ("ok", "raise") of a fixed sample of calls."""
    seen = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(strategy)
    def sample(call):
        seen.add(assert_agree(*call)[0])

    sample()
    return seen


def test_the_fuzzed_arguments_reach_both_outcomes():
    """The strategies are not degenerate: calls both succeed and fail."""
    assert outcomes_of(norm_calls()) == {"ok", "raise"}
    assert outcomes_of(softmax_calls()) == {"ok", "raise"}
