"""Every quantized-output recipe's forward kernel compiles on every arch (no GPU).

The quantized epilogue (kernels/norm/quant_epilogue.cuh) takes hardware FP8
conversions from sm_89 on and software ones before, and packs E2M1 codes by
vector width; ``explain(..., resources=True)`` compiles the planned kernels
with NVRTC for the arch asked, so each branch is built here: sm_80 (software),
sm_90 and sm_100 (hardware), for each input dtype and widths that give one
element a thread (odd N), one NVFP4 block (16) and full vectors (4096).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import rtcnorm
import torch

ARCHS = ("sm_80", "sm_90", "sm_100")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
WIDTHS = (7, 16, 4096)
# (recipe, quant_dtype, scale layout): each recipe, both FP8 data formats, both block-scale layouts.
RECIPES = (
    ("per_tensor", None, "plain"),
    ("per_tensor", torch.float8_e5m2, "plain"),
    ("per_token", None, "plain"),
    ("per_token", torch.float8_e5m2, "plain"),
    ("mxfp8", None, "plain"),
    ("mxfp8", None, "blocked"),
    ("nvfp4", None, "plain"),
    ("nvfp4", None, "blocked"),
)
QUANT_BITS = 25  # the recipe's place in the kernel's flag word (params.cuh kQuantBits)


def compile_forward(arch, dtype, n, recipe, qdtype, layout):
    return rtcnorm.explain("rms_norm", (64, n), dtype, device="cpu", arch=arch, resources=True, quant=recipe,
                           quant_dtype=qdtype, scale_layout=layout)  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
def test_every_recipe_compiles_for_each_dtype(arch):
    jobs = [(arch, d, n, *r) for d in DTYPES for n in WIDTHS for r in RECIPES]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        plans = list(pool.map(lambda j: compile_forward(*j), jobs))
    recipes = set()
    for job, plan in zip(jobs, plans):
        flags = int(plan["kernel"].split(", ")[-2].rstrip("u"))
        recipes.add((flags >> QUANT_BITS) & 7)
        r = plan["ptxas"]
        assert r is not None and r["target"] == arch, (job, r)
        assert 16 <= r["registers"] <= 255 and r["spill_stores"] == 0, (job, r)
    assert recipes == {1, 2, 3, 4, 5, 6}, recipes
