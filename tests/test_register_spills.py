"""ptxas' register report of the kernels the planner picks (no GPU needed).

``explain(..., resources=True)`` compiles each planned kernel with NVRTC and
returns ptxas' registers and spill bytes. These tests hold the plans of the
standard benchmark shapes to a small spill budget, and the launch bounds that
docs/history.md entries 67-68 set to keep rows out of local memory (where
ptxas used to spill 88-384 bytes a thread) to none or nearly none, so that a
planner change that lets a row spill fails here rather than in a benchmark.
The report is that of the NVRTC this process loads, for sm_90.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rtcnorm
import torch
from rtcnorm import softmax

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
SHAPES = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "bench_shapes.json").read_text())
NORM_SHAPES = sorted({tuple(s) for name, group in SHAPES["norm"].items() if name != "random" for s in group})
REPORT_KEYS = {"target", "registers", "spill_stores", "spill_loads", "stack_frame"}

# Spill stores (bytes a thread) a standard shape's planned kernel may have.
# The largest today: 38 bytes at 128 registers, the backward of 16-bit
# LayerNorm 4096x16384 beside float32 gamma and beta; most plans have none.
STANDARD_SPILL_BUDGET = 64
# The rows entries 67-68 moved out of local memory.
FIXED_SPILL_BUDGET = 16

_reports: dict[str, dict] = {}


def kernels_of(plan: dict) -> list[tuple[str, str]]:
    """(phase, kernel) pairs of an explain() plan: forward, backward and, for a split backward, its coefficient kernel."""
    out = [("forward", plan["kernel"]), ("backward", plan["backward"]["kernel"])]
    if plan["backward"]["split"]:
        out.append(("coef", plan["backward"]["coef_kernel"]))
    return out


def reports(op: str, shape, dtype, **kw) -> dict[str, dict]:
    """ptxas' report per phase of a plan's kernels, each kernel compiled once per session."""
    plan = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90", **kw)
    if any(k not in _reports for _, k in kernels_of(plan)):
        full = rtcnorm.explain(op, shape, dtype, device="cpu", arch="sm_90", resources=True, **kw)
        bwd = full["backward"]
        _reports[full["kernel"]] = full["ptxas"]
        _reports[bwd["kernel"]] = bwd["ptxas"]
        if bwd["split"]:
            _reports[bwd["coef_kernel"]] = bwd["coef_ptxas"]
    return {phase: {**_reports[k], "kernel": k} for phase, k in kernels_of(plan)}


def test_explain_reports_ptxas_resources():
    plan = rtcnorm.explain("layer_norm", (4096, 4096), BF16, device="cpu", resources=True)
    for r in (plan["ptxas"], plan["backward"]["ptxas"]):
        assert set(r) == REPORT_KEYS and r["target"] == "sm_90", r
        assert 16 <= r["registers"] <= 255 and r["spill_stores"] >= 0 and r["spill_loads"] >= 0, r
    # A split backward reports its coefficient kernel too.
    split = rtcnorm.explain("rms_norm", (64, 262144), FP32, device="cpu", resources=True)["backward"]
    assert split["split"] and set(split["coef_ptxas"]) == REPORT_KEYS
    # Off by default: no compile.
    plain = rtcnorm.explain("layer_norm", (4096, 4096), BF16, device="cpu")
    assert "ptxas" not in plain and "ptxas" not in plain["backward"]
    # Each arch NVRTC emits cubins for reports its own target.
    for arch in ("sm_80", "sm_100"):
        assert (
            rtcnorm.explain("rms_norm", (8, 4096), BF16, device="cpu", arch=arch, resources=True)["ptxas"]["target"]
            == arch
        )
    # Softmax plans report both phases.
    sm = softmax.explain("scaled_masked_softmax", (4, 32, 1024, 1024), resources=True)
    assert set(sm["forward"]["ptxas"]) == REPORT_KEYS and set(sm["backward"]["ptxas"]) == REPORT_KEYS


def test_explain_resources_of_a_ptx_only_arch_are_none():
    """An arch newer than NVRTC's cubin targets gets PTX, which the driver compiles: no report."""
    known = rtcnorm.jit.nvrtc_info()["archs"]
    arch = max(known) + 1
    plan = rtcnorm.explain("rms_norm", (8, 4096), BF16, device="cpu", arch=f"sm_{arch}", resources=True)
    assert plan["ptxas"] is None and plan["backward"]["ptxas"] is None


# bf16 on every run; the other variants compile another ~450 kernels: slow.
SLOW = pytest.mark.slow


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize(
    "dtype,variant",
    [
        (BF16, "plain"),
        pytest.param(BF16, "float32 weight", marks=SLOW),
        pytest.param(BF16, "residual", marks=SLOW),
        pytest.param(FP16, "plain", marks=SLOW),
        pytest.param(FP32, "plain", marks=SLOW),
    ],
    ids=["bf16", "bf16-w32", "bf16-residual", "fp16", "fp32"],
)
def test_standard_shapes_plan_kernels_that_barely_spill(op, dtype, variant):
    kw = {"weight_dtype": FP32} if variant == "float32 weight" else {"residual": True} if variant == "residual" else {}
    over = []
    for shape in NORM_SHAPES:
        for phase, r in reports(op, shape, dtype, **kw).items():
            assert r["target"] == "sm_90", r
            if r["spill_stores"] > STANDARD_SPILL_BUDGET:
                over.append(
                    f"{op} {tuple(shape)} {phase}: {r['spill_stores']} bytes at {r['registers']} ({r['kernel']})"
                )
    assert not over, "planned kernels spill past the budget:\n" + "\n".join(over)


@pytest.mark.parametrize(
    "op,shape,dtype,kw,phase,before",
    [
        # Forward: LayerNorm register rows past 80 bytes a thread, its
        # shared-memory chunks, 16-bit rows beside float32 gamma and beta.
        ("layer_norm", (4096, 12288), BF16, {}, "forward", 88),
        ("layer_norm", (4096, 16384), BF16, {"weight_dtype": FP32}, "forward", 264),
        ("layer_norm", (65536, 512), BF16, {"weight_dtype": FP32}, "forward", 280),
        ("layer_norm", (16384, 8192), FP32, {}, "forward", 120),
        ("layer_norm", (4096, 49152), BF16, {}, "forward", 124),
        ("layer_norm", (1024, 24576), FP32, {}, "forward", 172),
        # Backward: two CTAs an SM only where their registers fit.
        ("rms_norm", (16384, 2560), BF16, {}, "backward", 56),
        ("rms_norm", (4096, 3584), BF16, {}, "backward", 28),
        ("rms_norm", (4096, 2560), FP32, {}, "backward", 280),
        ("layer_norm", (16384, 5120), FP32, {}, "backward", 120),
        ("layer_norm", (4096, 9216), FP32, {}, "backward", 200),
        # float32 rows of 131072 on 16-CTA clusters (entry 68).
        ("rms_norm", (512, 131072), FP32, {}, "backward", 336),
        ("rms_norm", (512, 131072), FP32, {"residual": True}, "backward", 380),
    ],
)
def test_launch_bounds_leave_rows_their_registers(op, shape, dtype, kw, phase, before):
    """``before``: ptxas' spill bytes under the bounds these rules replaced
    (``reg_headroom=1``; for the 131072-wide rows ``bwd_cluster=8``)."""
    r = reports(op, shape, dtype, **kw)[phase]
    assert r["spill_stores"] <= FIXED_SPILL_BUDGET < before, r


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "per_tensor"])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape", [(4096, 9999), (38177, 1973), (13247, 1573), (1946, 2705)])
def test_one_element_quantized_rows_keep_no_stack(shape, op, recipe):
    """One-element rows of a block recipe split each block's scale over its
    lanes; the butterfly's amax array stays in registers (a 64-128 byte stack
    frame before docs/history.md entry 94), and no planned odd-width kernel
    of these shapes spills."""
    qdtype = torch.float4_e2m1fn_x2 if recipe == "nvfp4" else torch.float8_e4m3fn
    layout = "plain" if recipe == "per_tensor" else "blocked"
    plan = rtcnorm.explain(op, shape, BF16, device="cpu", arch="sm_90", resources=True, quant=recipe,
                           quant_dtype=qdtype, scale_layout=layout)  # fmt: skip
    assert plan["vec"] == 1, plan["kernel"]
    r = plan["ptxas"]
    assert r["stack_frame"] == 0 and r["spill_stores"] == 0 and r["spill_loads"] == 0, (plan["kernel"], r)


SOFTMAX_OPS = {
    "masked": "scaled_masked_softmax",
    "causal": "scaled_upper_triang_masked_softmax",
    "aligned_causal": "scaled_aligned_causal_masked_softmax",
}
SOFTMAX_CASES = [(SOFTMAX_OPS[k], tuple(s)) for k, group in SHAPES["softmax"].items() for s in group] + [
    ("scaled_softmax", (1, 1, (1 << 26) // n, n)) for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536)
]


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32], ids=["bf16", "fp16", "fp32"])
def test_standard_softmax_forwards_keep_no_stack(dtype):
    """The cached forward folds its logits in registers once (softmax/fold.cuh):
    every standard softmax shape's forward still compiles without a stack frame."""
    over = []
    for op, shape in SOFTMAX_CASES:
        mask_shape = (shape[0], 1, *shape[2:]) if op == "scaled_masked_softmax" else None
        plan = softmax.explain(op, shape, dtype, mask_shape=mask_shape, resources=True)["forward"]
        r = plan["ptxas"]
        assert r["target"] == "sm_90", r
        if r["spill_stores"] or r["stack_frame"]:
            over.append(f"{op} {shape} {plan['design']}: {r}")
    assert not over, "softmax forwards with a stack frame:\n" + "\n".join(over)
