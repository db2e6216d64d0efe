"""One planned kernel of each design compiles for each dtype on every arch (no GPU).

The CI-sized counterpart of the exhaustive sweeps in test_precompile.py (marked
``slow``): for each arch and dtype, the plans of a few shapes chosen to land on
every forward and backward design the planner has there are compiled by NVRTC
(``explain(..., resources=True)``, nothing cached), and ptxas must report a
sane register count for each kernel. The designs the shapes land on are checked
too, so a planner change that stops a shape from reaching a design shows here.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import rtcnorm
import torch

ARCHS = ("sm_80", "sm_90", "sm_100")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
RESIDUAL = {"residual": True}
FEATURES = {"weight_dtype": torch.float32, "zero_centered_gamma": True}
# (op, shape, features): narrow rows, few rows (column CTAs), one row (direct
# gradients), one-wave few rows, 16-bit staged rows, rows past one CTA (slices,
# clusters, grid groups), rows past any cluster (split backward), a residual
# (a shared-memory row for float32), float32 gamma with zero-centring.
SHAPES = (
    ("rms_norm", (32768, 128), {}),
    ("rms_norm", (32, 4096), {}),
    ("rms_norm", (1, 4096), {}),
    ("rms_norm", (256, 8192), {}),
    ("rms_norm", (4096, 8192), {}),
    ("rms_norm", (1024, 65536), {}),
    ("rms_norm", (64, 262144), {}),
    ("rms_norm", (4096, 4096), RESIDUAL),
    ("rms_norm", (4096, 4096), FEATURES),
    ("layer_norm", (32768, 128), {}),
    ("layer_norm", (4096, 8192), {}),
    ("layer_norm", (1024, 65536), {}),
    ("layer_norm", (4096, 4096), FEATURES),
)
# Designs every arch must reach with these shapes, over all dtypes.
COMMON_FWD = {"persistent", "register row", "shared-memory row"}
COMMON_BWD = {"registers", "column CTAs", "direct grads", "staged", "split"}
ARCH_FWD = {"sm_80": {"re-read row"}, "sm_90": {"grid group", "cluster"}, "sm_100": {"cluster"}}
ARCH_BWD = {"sm_80": set(), "sm_90": {"cluster", "deferred", "grid group", "row cluster"}, "sm_100": {"cluster"}}


def forward_design(plan: dict) -> str:
    if plan["grid_exchange"]:
        return "grid group"
    if plan["cluster"] > 1:
        return "cluster"
    if plan["smem"]:
        return "shared-memory row"
    if plan["persistent"]:
        return "persistent"
    return "register row" if plan["cached_row"] else "re-read row"


def backward_designs(bwd: dict) -> set[str]:
    names = {
        "split": "split",
        "staged": "staged",
        "row_cluster": "row cluster",
        "direct_grads": "direct grads",
        "column_grads": "column CTAs",
        "deferred_stats": "deferred",
        "grid_exchange": "grid group",
    }
    out = {name for key, name in names.items() if bwd.get(key)}
    if bwd["cluster"] > 1:
        out.add("cluster")
    return out or {"registers"}


def compiled_plan(op, shape, dtype, features, arch):
    return rtcnorm.explain(op, shape, dtype, device="cpu", arch=arch, resources=True, **features)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_kernel_of_each_design_compiles_for_each_dtype(arch):
    jobs = [
        (op, shape, dtype, features)
        for dtype in DTYPES.values()
        for op, shape, features in SHAPES
        # LayerNorm shares the kernel bodies and dtype handling with RMSNorm.
        if op == "rms_norm" or dtype != torch.float16
    ]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # NVRTC releases the GIL
        plans = list(pool.map(lambda j: compiled_plan(*j, arch), jobs))
    fwd, bwd = set(), set()
    for (op, shape, dtype, features), plan in zip(jobs, plans):
        fwd.add(forward_design(plan))
        bwd |= backward_designs(plan["backward"])
        reports = [plan["ptxas"], plan["backward"]["ptxas"]]
        if plan["backward"]["split"]:
            reports.append(plan["backward"]["coef_ptxas"])
        for r in reports:
            where = (op, shape, dtype, features, arch)
            # NVRTC may know an arch only as PTX (no ptxas report); these three it compiles to cubins.
            assert r is not None and r["target"] == arch, (where, r)
            assert 16 <= r["registers"] <= 255 and r["spill_stores"] >= 0, (where, r)
    assert fwd >= COMMON_FWD | ARCH_FWD[arch], sorted(fwd)
    assert bwd >= COMMON_BWD | ARCH_BWD[arch], sorted(bwd)
