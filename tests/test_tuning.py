"""rtcnorm.tune's contract on the CPU: argument errors, refusal inside
tracing and capture, and RTCNORM_AUTOTUNE's guards. Tuning itself (timing on
the GPU, the stored winner, a second process using it) is in
test_norm_designs_gpu.py."""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from rtcnorm import tuning


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        (("group_norm", (8, 64)), {}, ValueError, "op must be one of"),
        (("rms_norm", (8, 64)), {"mode": "fastest"}, ValueError, "mode must be one of"),
        (("rms_norm", (8, 64)), {"directions": ("up",)}, ValueError, "directions must be a non-empty subset"),
        (("rms_norm", (8, 64)), {"directions": ()}, ValueError, "directions must be a non-empty subset"),
        (("layer_norm", (8, 64)), {"residual": True}, ValueError, "residual=True is an rms_norm feature"),
    ],
)
def test_bad_arguments_name_what_is_wrong(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        rtcnorm.tune(*args, **kwargs)


def test_without_a_gpu_tune_says_it_needs_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        rtcnorm.tune("rms_norm", (8, 64))


@pytest.mark.parametrize(
    "compiling,capturing,match",
    [(True, False, "inside torch.compile tracing"), (False, True, "during CUDA-graph capture")],
)
def test_tune_never_runs_inside_tracing_or_capture(monkeypatch, compiling, capturing, match):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    with pytest.raises(RuntimeError, match=match):
        rtcnorm.tune("rms_norm", (8, 64))


def test_autotune_leaves_cpu_tensors_and_weightless_calls_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(tuning, "tune", lambda *a, **k: calls.append((a, k)))
    x, w = torch.randn(4, 16), torch.randn(16)
    tuning.maybe_autotune("rms_norm", x, w, None, None, None, False)
    tuning.maybe_autotune("rms_norm", x, None, None, None, None, False)
    assert calls == []


def test_autotune_is_on_only_when_asked():
    import os

    expected = os.environ.get("RTCNORM_AUTOTUNE", "").strip().lower() in ("1", "true", "yes", "on")
    assert tuning.AUTOTUNE is expected
