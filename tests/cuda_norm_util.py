"""Inputs, runs and float64 references of the norm ops on a GPU, shared by
the CUDA runtime tests and the GPU plan tests."""

from __future__ import annotations

import torch
from norm_checks import (
    ln_inputs,
    rms_inputs,
)
from reference import assert_close, ref_layer_norm, ref_rms_norm

OPS = torch.ops.rtcnorm


NORM_OPS = ("rms_norm", "layer_norm")


def make(op, shape, dtype=torch.bfloat16, device="cuda"):
    """Inputs with weight (and bias) for `op`: a dict usable by run() and ref()."""
    n = shape[-1]
    if op == "rms_norm":
        x, w, _, _ = rms_inputs(shape, [n], dtype, device, "weight")
        return {"x": x, "w": w, "b": None, "dy": torch.randn_like(x)}
    x, w, b, _ = ln_inputs(shape, [n], dtype, device, "weight_bias")
    return {"x": x, "w": w, "b": b, "dy": torch.randn_like(x)}


def run(op, t, mode=None):
    """Forward then backward ops, called directly; returns {y, dx, dw[, db]}."""
    n = t["x"].shape[-1]
    if op == "rms_norm":
        y, rstd = OPS.rms_norm(t["x"], [n], t["w"], None, mode, False)
        dx, dw = OPS.rms_norm_backward(t["dy"], t["x"], rstd, t["w"], [n], False, True, None)
        return {"y": y, "dx": dx, "dw": dw}
    y, mean, rstd = OPS.layer_norm(t["x"], [n], t["w"], t["b"], 1e-5, mode, False)
    dx, dw, db = OPS.layer_norm_backward(t["dy"], t["x"], mean, rstd, t["w"], t["b"], [n], False, True, True)
    return {"y": y, "dx": dx, "dw": dw, "db": db}


def ref(op, t):
    n = t["x"].shape[-1]
    if op == "rms_norm":
        return ref_rms_norm(t["x"], [n], t["w"], dy=t["dy"])
    return ref_layer_norm(t["x"], [n], t["w"], t["b"], dy=t["dy"])


def check(op, got, expected, rows):
    for name, value in got.items():
        assert_close(value, expected[name], what=name, reduce_len=rows if name in ("dw", "db") else 1)


def capture_run(op, t):
    """run(op, t) warmed up on a side stream, then captured: (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(op, t)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run(op, t)
    return graph, outputs


def refill(op, t):
    """Fresh random x and dy copied into t's tensors (a captured graph reads them)."""
    fresh = make(op, tuple(t["x"].shape))
    for k in ("x", "dy"):
        t[k].copy_(fresh[k])
