"""flat_row's kernels compile without spills on every arch (no GPU).

``explain(..., resources=True)`` compiles the planned kernel with NVRTC and
reports ptxas's registers and spills. flat_row is forced in each direction
for RMSNorm (with and without the residual) and LayerNorm, in both 16-bit
dtypes on odd widths with one row or many a CTA and up to 32 elements a
thread; the backward also on the 4-byte widths it is planned for (fp32 rows
of odd width, 16-bit rows of width 2 mod 4).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import rtcnorm
import torch
from rtcnorm import _tuning

WIDTHS = (127, 1973, 9999)
CASES = [("rms_norm", {}), ("rms_norm", {"residual": True}), ("layer_norm", {})]
WIDE4 = [(torch.float32, 1973), (torch.float32, 9999), (torch.bfloat16, 2294), (torch.float16, 9998)]


def _compile(direction, arch, op, kw, dtype, n):
    e = rtcnorm.explain(op, (20000, n), dtype, device="cpu", arch=arch, resources=True, **kw)
    return e if direction == "fwd" else e["backward"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_flat_rows_compile_without_spills(direction, arch):
    jobs = [
        (direction, arch, op, kw, d, n) for op, kw in CASES for d in (torch.bfloat16, torch.float16) for n in WIDTHS
    ]
    if direction == "bwd":
        jobs += [(direction, arch, op, kw, d, n) for op, kw in CASES for d, n in WIDE4]
    with _tuning.norm_override(direction, "flat_row"):
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            plans = list(pool.map(lambda j: _compile(*j), jobs))
    flat = 0
    for job, plan in zip(jobs, plans):
        if plan["design"] != "flat_row":
            continue
        flat += 1
        r = plan["ptxas"]
        assert r is not None and r["target"] == arch, (job, r)
        assert r["spill_stores"] == 0, (job, plan["knobs"], r)
    assert flat >= len(jobs) * 2 // 3, f"flat_row planned for {flat} of {len(jobs)}"
