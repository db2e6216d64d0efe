"""rtcnorm under torch.distributed on CPU: DTensor sharding rules per op, and a
Llama-style model under tensor + sequence parallel and FSDP2, against the
single-process model. Two gloo processes (one pool for the whole module, see
tests/dist_pool.py); every wait is bounded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

if not torch.distributed.is_available():
    pytest.skip("torch was built without torch.distributed", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_pool import Pool  # noqa: E402

WORLD = 2


@pytest.fixture(scope="module")
def pool():
    p = Pool(WORLD)
    yield p
    p.close()


OP_CASES = [
    "rms_norm_leading_dims",
    "rms_norm_replicated",
    "rms_norm_normalized_dim_is_gathered",
    "add_rms_norm_sequence_shards",
    "layer_norm_leading_dims",
    "layer_norm_normalized_dim_is_gathered",
    "softmax_batch_head_query_shards",
    "masked_softmax_mask_follows_input",
    "causal_softmax_keeps_queries_whole",
]


@pytest.mark.parametrize("case", OP_CASES)
def test_dtensor_op(pool, case):
    pool.run(f"dist_op_cases:{case}")


MODEL_CASES = [
    "tp_sp_matches_single_process",
    "tp_sp_norm_grads_are_deterministic",
    "fsdp2_matches_single_process",
]


@pytest.mark.parametrize("case", MODEL_CASES)
def test_parallel_model(pool, case):
    pool.run(f"dist_model_cases:{case}", timeout=120)


def test_fsdp2_tp_2d_mesh_matches_single_process():
    # FSDP2 over a 2-way dp dim and TP + SP over a 2-way tp dim: 4 processes.
    pool4 = Pool(4)
    try:
        pool4.run("dist_model_cases:fsdp2_tp_2d_matches_single_process", timeout=120)
    finally:
        pool4.close()


def _run_python(code: str) -> str:
    env = dict(os.environ)
    python_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
    env["PYTHONPATH"] = os.pathsep.join([python_dir, env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_import_does_not_load_dtensor_and_rules_follow_it():
    out = _run_python(
        "import sys, torch, rtcnorm\n"
        "print('torch.distributed.tensor' in sys.modules)\n"
        "from torch.distributed.tensor import DTensor\n"
        "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "ops = [getattr(torch.ops.rtcnorm, n).default for n in torch.ops.rtcnorm]\n"
        "print(len(ops), all(op in funcs for op in ops))\n"
    )
    assert out.splitlines() == ["False", "10 True"], out


def test_rules_register_at_import_when_dtensor_is_loaded_first():
    out = _run_python(
        "import torch\n"
        "from torch.distributed.tensor import DTensor\n"
        "import rtcnorm\n"
        "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "print(torch.ops.rtcnorm.scaled_softmax_backward.default in funcs, "
        "rtcnorm.distributed.register_sharding_rules())\n"
    )
    assert out == "True True", out
