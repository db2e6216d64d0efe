"""The ops' argument contracts, on CPU: the real and fake impls refuse the
same calls with the same message (torch.compile and export fail while
tracing), a tensor on another device is an error naming it, explain() checks
its arguments as the ops do and names the device it plans for, and the
dtypes each path takes are the ones its messages list."""

from __future__ import annotations

import math
import pydoc
import re

import pytest
import rtcnorm
import torch
from rtcnorm import _C as native
from torch._subclasses.fake_tensor import FakeTensorMode

OPS = torch.ops.rtcnorm
NAN = float("nan")
F8 = torch.float8_e4m3fn


def outcome(fn):
    """("ok", [(shape, dtype) of each output]) or ("raise", type, message)."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the exception itself is compared
        return ("raise", type(e), str(e))
    outs = out if isinstance(out, tuple | list) else (out,)
    return ("ok", [(tuple(o.shape), o.dtype) for o in outs])


def fake_call(op, args):
    mode = FakeTensorMode()
    fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    with mode:
        return op(*fake)


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


# ---- D9: the fake impls refuse what the real ones refuse ---------------------


def bad_calls():
    x, g = _x(4, 8), _x(4, 8)
    rstd = torch.rand(4) + 0.5
    y = torch.softmax(_x(2, 3, 5), -1)
    return {
        "integer_input": (OPS.rms_norm, (x.to(torch.int32), [8]), TypeError, "input must be float32"),
        "weight_shape": (OPS.rms_norm, (x, [8], torch.ones(7)), ValueError, r"weight must have shape \[8\]"),
        "negative_eps": (OPS.rms_norm, (x, [8], None, -1.0), ValueError, "eps must be finite and >= 0, got -1"),
        "nan_eps": (OPS.rms_norm, (x, [8], None, NAN), ValueError, "eps must be finite and >= 0, got nan"),
        "nan_eps_layer_norm": (OPS.layer_norm, (x, [8], None, None, NAN), ValueError, "eps must be finite"),
        "zero_normalized_shape": (OPS.rms_norm, (_x(4, 0), [0]), ValueError, "must not contain a zero"),
        "rows_over_16M": (OPS.rms_norm, (_x(0, 4097, 4097), [4097, 4097]), ValueError, "more than 16777216"),
        "residual_shape": (OPS.add_rms_norm, (x, _x(4, 7), [8]), ValueError, "residual must have input's shape"),
        "residual_dtype": (OPS.add_rms_norm, (x, x.half(), [8]), TypeError, "residual must have input's dtype"),
        "bias_dtype": (
            OPS.layer_norm,
            (x.half(), [8], torch.ones(8), torch.ones(8, dtype=torch.float16)),
            TypeError,
            "weight and bias must share a dtype",
        ),
        "bad_mode": (OPS.layer_norm, (x, [8], None, None, 1e-5, "fast"), ValueError, "mode must be None"),
        "bwd_rstd_rows": (
            OPS.rms_norm_backward,
            (g, x, rstd[:3], None, [8], False, False),
            ValueError,
            r"rstd must hold one Float per row \(4\), got 3",
        ),
        "bwd_mean_dtype": (
            OPS.layer_norm_backward,
            (g, x, rstd.double(), rstd, None, None, [8], False, False, False),
            ValueError,
            "mean must hold one Float per row",
        ),
        "bwd_grad_shape": (
            OPS.rms_norm_backward,
            (_x(4, 7), x, rstd, None, [8], False, False),
            ValueError,
            "grad_out must have input's shape",
        ),
        "softmax_nan_scale": (OPS.scaled_softmax, (x, NAN), ValueError, "scale must be finite, got nan"),
        "softmax_mask_shape": (
            OPS.scaled_masked_softmax,
            (x, torch.zeros(3, 8, dtype=torch.bool)),
            ValueError,
            "is not broadcastable",
        ),
        "softmax_upper_triang": (OPS.scaled_upper_triang_masked_softmax, (_x(2, 3, 4),), ValueError, "sq == sk"),
        "softmax_bwd_causal": (OPS.scaled_softmax_backward, (y.mT, y.mT, 1.0, True), ValueError, "sq <= sk"),
        "softmax_bwd_inf_scale": (OPS.scaled_softmax_backward, (y, y, math.inf), ValueError, "scale must be finite"),
    }


@pytest.mark.parametrize("case", list(bad_calls()))
def test_fake_refuses_what_the_op_refuses_with_its_message(case):
    op, args, exc, text = bad_calls()[case]
    real = outcome(lambda: op(*args))
    fake = outcome(lambda: fake_call(op, args))
    assert real[:2] == ("raise", exc), real
    assert re.search(text, real[2]), real
    assert fake == real


def _bad_eps_module():
    class M(torch.nn.Module):
        def forward(self, x):
            return OPS.rms_norm(x, [8], None, -1.0)[0]

    return M()


def _bad_scale_module():
    class M(torch.nn.Module):
        def forward(self, x, mask):
            return OPS.scaled_masked_softmax(x, mask, NAN)

    return M()


def test_export_refuses_a_bad_call_while_tracing():
    with pytest.raises(Exception, match=r"rtcnorm\.rms_norm: eps must be finite and >= 0, got -1"):
        torch.export.export(_bad_eps_module(), (_x(4, 8),))
    mask = torch.zeros(4, 8, dtype=torch.bool)
    with pytest.raises(Exception, match=r"rtcnorm\.scaled_masked_softmax: scale must be finite, got nan"):
        torch.export.export(_bad_scale_module(), (_x(4, 8), mask))


def test_export_with_a_dynamic_batch_checks_the_known_sizes():
    class M(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(n))

        def forward(self, x):
            return OPS.rms_norm(x, [8], self.w)[0]

    batch = torch.export.Dim("batch")
    ep = torch.export.export(M(8), (_x(4, 8),), dynamic_shapes={"x": {0: batch}})
    x = _x(6, 8)
    assert torch.allclose(ep.module()(x), OPS.rms_norm(x, [8], torch.ones(8))[0])
    with pytest.raises(Exception, match=r"rtcnorm\.rms_norm: weight must have shape \[8\] \(normalized_shape\)"):
        torch.export.export(M(7), (_x(4, 8),), dynamic_shapes={"x": {0: batch}})


def test_compile_dynamic_shapes_trace_once():
    w = torch.rand(32) + 0.5

    def f(x, mask):
        y = OPS.rms_norm(x, [32], w)[0]
        return OPS.scaled_masked_softmax(y, mask, 0.5)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for rows in (3, 5, 9):
            x, mask = _x(2, rows, 32), torch.rand(1, rows, 32) < 0.3
            assert torch.allclose(compiled(x, mask), f(x, mask), atol=1e-6)


# ---- D7: a tensor on another device is an error naming it --------------------


def device_cases():
    x, g, rstd, w = _x(4, 8), _x(4, 8), torch.rand(4) + 0.5, torch.rand(8)
    y = torch.softmax(_x(2, 3, 5), -1)
    m = torch.device("meta")
    mask = torch.zeros(2, 3, 5, dtype=torch.bool)
    return {
        "rms_norm/weight": (OPS.rms_norm, (x, [8], w.to(m)), "weight is on meta but input is on cpu"),
        "rms_norm/input": (OPS.rms_norm, (x.to(m), [8], w), "weight is on cpu but input is on meta"),
        "add_rms_norm/residual": (OPS.add_rms_norm, (x, g.to(m), [8]), "residual is on meta but input is on cpu"),
        "layer_norm/bias": (OPS.layer_norm, (x, [8], w, w.to(m)), "bias is on meta but input is on cpu"),
        "rms_norm_backward/grad_out": (
            OPS.rms_norm_backward,
            (g.to(m), x, rstd, w, [8], False, True),
            "grad_out is on meta but input is on cpu",
        ),
        "rms_norm_backward/rstd": (
            OPS.rms_norm_backward,
            (g, x, rstd.to(m), w, [8], False, True),
            "rstd is on meta but input is on cpu",
        ),
        "rms_norm_backward/grad_h": (
            OPS.rms_norm_backward,
            (g, x, rstd, w, [8], False, True, g.to(m)),
            "grad_h is on meta but input is on cpu",
        ),
        "layer_norm_backward/mean": (
            OPS.layer_norm_backward,
            (g, x, rstd.to(m), rstd, w, w, [8], False, True, True),
            "mean is on meta but input is on cpu",
        ),
        "scaled_masked_softmax/mask": (
            OPS.scaled_masked_softmax,
            (y, mask.to(m)),
            "mask is on meta but input is on cpu",
        ),
        "scaled_softmax_backward/grad_output": (
            OPS.scaled_softmax_backward,
            (y.to(m), y, 1.0),
            "grad_output is on meta but output is on cpu",
        ),
        "scaled_softmax_backward/output": (
            OPS.scaled_softmax_backward,
            (y, y.to(m), 1.0, True),
            "grad_output is on cpu but output is on meta",
        ),
    }


@pytest.mark.parametrize("case", list(device_cases()))
def test_a_tensor_on_another_device_is_an_error_naming_it(case):
    op, args, text = device_cases()[case]
    with pytest.raises(RuntimeError) as info:
        op(*args)
    assert str(info.value) == f"rtcnorm.{case.split('/')[0]}: {text}"


# ---- D10 and the assumed device: explain() -----------------------------------


def test_explain_refuses_a_negative_size_before_planning():
    for resources in (False, True):
        with pytest.raises(ValueError, match=r"rtcnorm\.explain: shape must not hold a negative entry, got \[4, -5\]"):
            rtcnorm.explain("rms_norm", (4, -5), resources=resources)
    with pytest.raises(TypeError, match=r"rtcnorm\.explain: normalized_shape must be a sequence of ints"):
        rtcnorm.explain("layer_norm", (4, 8), normalized_shape=[8.5])
    with pytest.raises(ValueError, match=r"rtcnorm\.explain: sm_count must be at least 1, got 0"):
        rtcnorm.explain("rms_norm", (4, 64), sm_count=0)
    with pytest.raises(
        ValueError, match=r"rtcnorm\.explain: arch must name sm_80 or newer \(e\.g\. 'sm_90'\), got 'sm_75'"
    ):
        rtcnorm.explain("rms_norm", (4, 64), arch="sm_75")
    with pytest.raises(ValueError, match=r"rtcnorm\.explain: needs rows >= 0, a row of 1 to 2\^24 elements"):
        native.explain_norm(
            "rms_norm",
            4,
            -5,
            "float32",
            "float32",
            None,
            True,
            False,
            False,
            False,
            -1,
            132,
            90,
            True,
            True,
            None,
            None,
            "plain",
        )


def explain_cases():
    bf = torch.bfloat16
    return {
        "zero_row": (dict(shape=(4, 0)), lambda: OPS.rms_norm(_x(4, 0, dtype=bf), [0])),
        "rows_over_16M": (dict(shape=(2, 2**25)), lambda: OPS.rms_norm(_x(0, 2**25, dtype=bf), [2**25])),
        "float8": (dict(dtype=F8), lambda: OPS.rms_norm(_x(4, 64, dtype=F8), [64])),
        "weight_dtype": (
            dict(weight_dtype=torch.float64),
            lambda: OPS.rms_norm(_x(4, 64, dtype=bf), [64], torch.ones(64, dtype=torch.float64)),
        ),
        "normalized_shape": (dict(normalized_shape=[32]), lambda: OPS.rms_norm(_x(4, 64, dtype=bf), [32])),
        "mode": (dict(mode="fast"), lambda: OPS.rms_norm(_x(4, 64, dtype=bf), [64], None, None, "fast")),
    }


@pytest.mark.parametrize("case", list(explain_cases()))
def test_explain_gives_the_op_errors(case):
    kw, call = explain_cases()[case]
    kw = {"shape": (4, 64), "dtype": torch.bfloat16, **kw}
    expected = outcome(call)
    assert expected[0] == "raise"
    assert outcome(lambda: rtcnorm.explain("rms_norm", device="cpu", **kw)) == expected


def test_explain_refuses_float64_for_a_gpu_and_takes_it_for_the_cpu():
    with pytest.raises(TypeError, match=r"rtcnorm\.rms_norm: CUDA input must be float32, float16 or bfloat16"):
        rtcnorm.explain("rms_norm", (4, 64), torch.float64, device="cuda:0")
    plan = rtcnorm.explain("layer_norm", (4, 64), torch.float64, device="cpu")
    assert plan["device"] == "cpu" and "kernel" not in plan and "no kernel is compiled" in plan["cpu_path"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the plan made without a GPU")
def test_explain_names_the_device_it_assumes():
    plan = rtcnorm.explain("rms_norm", (4096, 4096))
    assert plan["device"] is None and plan["assumed"] == "sm_90, 132 SMs (no GPU visible)"
    assert plan["reason"].endswith("planned for an assumed GPU: sm_90, 132 SMs (no GPU visible)")
    assert "cpu_path" not in plan
    old = rtcnorm.explain("layer_norm", (64, 1024), arch="sm_80", sm_count=108)
    assert old["assumed"] == "sm_80, 108 SMs (no GPU visible)"
    cpu = rtcnorm.explain("rms_norm", (4096, 4096), device="cpu")
    assert cpu["device"] == "cpu" and cpu["assumed"] == "sm_90, 132 SMs (device='cpu': a GPU of this arch)"
    assert cpu["cpu_path"].startswith("CPU tensors run rtcnorm's ATen reference code")
    assert cpu["kernel"] == plan["kernel"]


# ---- dtypes: float8 refused, float64 on CPU accepted and named ---------------


def float8_calls():
    x = _x(4, 8, dtype=F8)
    return {
        "rms_norm": (OPS.rms_norm, (x, [8])),
        "add_rms_norm": (OPS.add_rms_norm, (x, x, [8])),
        "layer_norm": (OPS.layer_norm, (x, [8])),
        "rms_norm_backward": (OPS.rms_norm_backward, (x, x, torch.ones(4), None, [8], False, False)),
        "layer_norm_backward": (
            OPS.layer_norm_backward,
            (x, x, torch.ones(4), torch.ones(4), None, None, [8], False, False, False),
        ),
        "scaled_softmax": (OPS.scaled_softmax, (x,)),
        "scaled_softmax_backward": (OPS.scaled_softmax_backward, (x, x, 1.0)),
    }


@pytest.mark.parametrize("case", list(float8_calls()))
def test_float8_is_refused_by_a_message_listing_the_dtypes(case):
    op, args = float8_calls()[case]
    real = outcome(lambda: op(*args))
    assert real[:2] == ("raise", TypeError) and "Float8_e4m3fn" in real[2], real
    for name in ("float32", "float16", "bfloat16", "float64"):
        assert name in real[2], real
    assert outcome(lambda: fake_call(op, args)) == real


def test_float64_on_cpu_is_accepted_as_the_messages_say():
    x, w = _x(3, 5, 16, dtype=torch.float64), torch.rand(16, dtype=torch.float64) + 0.5
    y, rstd = OPS.rms_norm(x, [16], w, 1e-6)
    ref = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w
    assert y.dtype == rstd.dtype == torch.float64
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    fake = fake_call(OPS.rms_norm, (x, [16], w, 1e-6))
    assert [(t.shape, t.dtype) for t in fake] == [(y.shape, y.dtype), (rstd.shape, rstd.dtype)]
    with pytest.raises(TypeError) as info:
        OPS.layer_norm(x.to(torch.int64), [16])
    assert str(info.value) == (
        "rtcnorm.layer_norm: input must be float32, float16 or bfloat16 (or float64 on CPU), got Long"
    )


def test_modes_documents_itself_and_stays_a_tuple():
    text = pydoc.render_doc(rtcnorm.MODES)
    assert "the forward modes of the norm ops" in text and "``multi_wave_cached``: one CTA" in text
    assert isinstance(rtcnorm.MODES, tuple) and "static_persistent" in rtcnorm.MODES
    assert list(rtcnorm.MODES) == ["static_persistent", "multi_wave_reload", "multi_wave_cached"]


@pytest.mark.gpu
def test_cuda_fake_and_real_agree_and_explain_names_the_gpu():
    x = _x(4, 8).cuda()
    mask = torch.zeros(4, 8, dtype=torch.bool)
    calls = {
        "float64": (OPS.rms_norm, (x.double(), [8]), TypeError, "CUDA input must be float32"),
        "weight_on_cpu": (
            OPS.layer_norm,
            (x, [8], torch.ones(8)),
            RuntimeError,
            "weight is on cpu but input is on cuda",
        ),
        "mask_on_cpu": (OPS.scaled_masked_softmax, (x, mask), RuntimeError, "mask is on cpu but input is on cuda"),
        "softmax_float64": (OPS.scaled_softmax, (x.double(),), TypeError, "float32 on CUDA, got Double"),
    }
    for name, (op, args, exc, text) in calls.items():
        real = outcome(lambda op=op, args=args: op(*args))
        assert real[:2] == ("raise", exc) and text in real[2], (name, real)
        assert outcome(lambda op=op, args=args: fake_call(op, args)) == real, name
    plan = rtcnorm.explain("rms_norm", (4096, 4096))
    assert plan["device"] == f"cuda:{torch.cuda.current_device()}" and plan["assumed"] is None
