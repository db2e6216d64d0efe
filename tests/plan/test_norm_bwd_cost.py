"""The backward cost model's work and idle-slot terms, asserted on plan trace fields (CPU, no GPU).

Register rows whose dx converts x and dy again (no kept terms) issue about 40
instructions an element against 30, so they need more warps an SM to stream;
slots of a chunk past the row's vectors issue the same work for nothing. The
measurements behind both: docs/history.md, entry 103.
"""

from __future__ import annotations

import pytest
import torch
from norm_plan_cases import case_ids, plan
from rtcnorm import _tuning


def backward(op, shape, dtype=torch.bfloat16):
    return plan(op, shape, dtype)["backward"]


# Many rows of up to 4096 columns: (op, shape, dtype).
MANY_ROWS = [
    ("rms_norm", (262144, 128), torch.bfloat16),
    ("rms_norm", (65536, 256), torch.float16),
    ("rms_norm", (32768, 1024), torch.bfloat16),
    ("rms_norm", (16384, 2048), torch.bfloat16),
    ("rms_norm", (4096, 4096), torch.bfloat16),
    ("rms_norm", (32768, 1024), torch.float32),
    ("rms_norm", (8192, 4096), torch.float32),
]


@pytest.mark.parametrize("op,shape,dtype", MANY_ROWS, ids=case_ids(MANY_ROWS))
def test_many_rows_keep_the_terms_of_16_elements_a_thread(op, shape, dtype):
    """16 elements a thread keep their terms at 16 warps an SM; 32 a thread,
    converted again for dx at 12 warps, are priced dearer."""
    b = backward(op, shape, dtype)
    assert b["design"] == "register_row" and b["keep_terms"]
    assert b["vecs_per_thread"] * b["vec"] == 16
    with _tuning.norm_override("bwd", "register_row", vecs_per_thread=2 * b["vecs_per_thread"]):
        wide = backward(op, shape, dtype)
    assert wide["forced"] and not wide["keep_terms"]
    assert wide["cost_us"] > b["cost_us"]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape", [(443017, 192), (159642, 160)])
def test_backward_rows_leave_few_slots_idle(op, shape):
    """24 or 20 vectors a row: 8 threads of 3 vectors leave none or a sixth of
    their slots idle, 16 of 2 or 32 of 1 a quarter or more; the idle slots'
    work costs more than converting the terms of 24 elements again."""
    b = backward(op, shape)
    slots, vecs = b["threads_per_row"] * b["vecs_per_thread"], shape[1] // b["vec"]
    assert slots >= vecs and (slots - vecs) * 6 <= slots
    with _tuning.norm_override("bwd", "register_row", vecs_per_thread=1):
        spread = backward(op, shape)
    assert spread["forced"] and spread["threads_per_row"] == 32
    assert spread["cost_us"] > b["cost_us"]
