"""One kernel of each design compiles for each dtype on every arch (no GPU).

The CI-sized counterpart of the exhaustive sweeps in test_precompile.py (marked
``slow``): for each arch and dtype, each design of the catalogue is forced on a
shape it can run and the planned kernels are compiled by NVRTC
(``explain(..., resources=True)``, nothing cached); ptxas must report a sane
register count for each. Featured rows (a residual, float32 gamma with
zero-centring) compile through the designs the planner picks for them.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning

ARCHS = ("sm_80", "sm_90", "sm_100")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# A shape each design can run (sliced rows: sm_90 and later only).
DESIGN_SHAPES = {
    ("fwd", "register_row"): (4096, 4096),
    ("fwd", "smem_row"): (64, 16384),
    ("fwd", "sliced_row"): (64, 65536),
    ("fwd", "reload_row"): (4096, 4096),
    ("bwd", "register_row"): (4096, 4096),
    ("bwd", "staged_row"): (4096, 4096),
    ("bwd", "sliced_row"): (64, 65536),
    ("bwd", "split_row"): (4096, 4096),
    ("bwd", "column_grads"): (32, 4096),
}
FEATURED = (
    ("rms_norm", (4096, 4096), {"residual": True}),
    ("rms_norm", (4096, 4096), {"weight_dtype": torch.float32, "zero_centered_gamma": True}),
    ("layer_norm", (4096, 4096), {"weight_dtype": torch.float32, "zero_centered_gamma": True}),
)


def compiled(op, shape, dtype, arch, direction=None, design=None, **features):
    if design is None:
        return rtcnorm.explain(op, shape, dtype, device="cpu", arch=arch, resources=True, **features)
    with _tuning.norm_override(direction, design):
        return rtcnorm.explain(op, shape, dtype, device="cpu", arch=arch, resources=True, **features)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_kernel_of_each_design_compiles_for_each_dtype(arch):
    jobs = []
    for dtype in DTYPES.values():
        for (direction, design), shape in DESIGN_SHAPES.items():
            if design == "sliced_row" and arch == "sm_80":
                continue
            # LayerNorm shares the kernel bodies and dtype handling with RMSNorm.
            for op in ("rms_norm", "layer_norm") if dtype != torch.float16 else ("rms_norm",):
                jobs.append(((op, shape, dtype, arch, direction, design), {}))
        for op, shape, features in FEATURED:
            jobs.append(((op, shape, dtype, arch), features))
    # Overrides are process-wide: forced designs are compiled one at a time,
    # the featured rows (no override) in parallel (NVRTC releases the GIL).
    forced = [j for j in jobs if len(j[0]) > 4]
    plans = [compiled(*j[0], **j[1]) for j in forced]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        plans += list(pool.map(lambda j: compiled(*j[0], **j[1]), [j for j in jobs if len(j[0]) == 4]))
    jobs = forced + [j for j in jobs if len(j[0]) == 4]
    for (args, features), plan in zip(jobs, plans):
        if len(args) > 4:
            direction, design = args[4], args[5]
            planned = plan if direction == "fwd" else plan["backward"]
            assert planned["design"] == design, (args, planned["design"])
        reports = [plan["ptxas"], plan["backward"]["ptxas"]]
        if plan["backward"]["split"]:
            reports.append(plan["backward"]["coef_ptxas"])
        for r in reports:
            # NVRTC may know an arch only as PTX (no ptxas report); these three it compiles to cubins.
            assert r is not None and r["target"] == arch, (args, features, r)
            assert 16 <= r["registers"] <= 255 and r["spill_stores"] >= 0, (args, features, r)
