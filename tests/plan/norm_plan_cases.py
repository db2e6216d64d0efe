"""Shared by the CPU plan tests: a plan on the assumed sm_90 part of 132 SMs, and test ids of plan cases."""

from __future__ import annotations

import rtcnorm
import torch


def plan(op="rms_norm", shape=(16384, 4096), dtype=torch.bfloat16, **kw):
    """explain() on the CPU (arch sm_90, 132 SMs): forward fields, the backward's under "backward"."""
    return rtcnorm.explain(op, shape, dtype, device="cpu", **kw)


def case_ids(cases):
    """Test ids of (op, shape, dtype) cases: op-MxN-dtype."""
    return [f"{o}-{s[0]}x{s[1]}-{str(d)[6:]}" for o, s, d in cases]
