"""rtcnorm under torch.distributed on CPU: DTensor sharding rules per op, and a
Llama-style model under tensor + sequence parallel and FSDP2, against the
single-process model. Two gloo processes (one pool for the whole module, see
tests/dist_pool.py); every wait is bounded."""

from __future__ import annotations

import json
import os
import shutil
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


@pytest.mark.parametrize(
    "case", ["norm_quant_row_shards", "rms_norm_gated_row_shards", "rms_norm_gated_quant_row_shards"]
)
def test_dtensor_quant_and_gated_ops(pool, case):
    pool.run(f"dist_new_op_cases:{case}")


MODEL_CASES = [
    "tp_sp_matches_single_process",
    "tp_sp_norm_grads_are_deterministic",
    "fsdp2_matches_single_process",
]


@pytest.mark.parametrize("case", MODEL_CASES)
def test_parallel_model(pool, case):
    pool.run(f"dist_model_cases:{case}", timeout=120)


def test_distributed_benchmark_tiny_cpu_run(pool):
    out = pool.run("dist_model_cases:bench_tiny_cpu", timeout=120)[0]
    try:
        with open(os.path.join(out, "bench_distributed.json")) as f:
            result = json.load(f)
        table = open(os.path.join(out, "bench_distributed.md")).read()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    assert result["numerics_ok"] and result["no_extra_traffic"], result
    for norms in ("torch", "rtcnorm"):
        for plan in ("tp_sp", "fsdp2"):
            assert result["step_ms"][norms][plan] > 0
            comm = result["collectives"][norms][plan]
            assert comm["total_count"] > 0 and comm["norm_op_count"] == 0, (norms, plan, comm)
        assert result["numerics"][norms]["grad_rel_err"] < 1e-4, result["numerics"][norms]
    assert "| rtcnorm |" in table and "| torch |" in table


def test_2d_mesh_ops_and_fsdp2_tp_match_single_process():
    # A (2, 2) mesh: the op rules over two mesh dims, then FSDP2 over a 2-way
    # dp dim and TP + SP over a 2-way tp dim. 4 processes.
    pool4 = Pool(4)
    try:
        pool4.run("dist_op_cases:ops_on_a_2d_mesh")
        pool4.run("dist_model_cases:fsdp2_tp_2d_matches_single_process", timeout=120)
    finally:
        pool4.close()


def _run_pythons(*codes: str) -> list[str]:
    """Run each snippet in a fresh interpreter (concurrently); their stdouts."""
    env = dict(os.environ)
    python_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
    env["PYTHONPATH"] = os.pathsep.join([python_dir, env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen([sys.executable, "-c", c], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in codes
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        outs.append(out.strip())
    return outs


def test_rules_register_lazily_and_in_either_import_order():
    rtcnorm_first, dtensor_first = _run_pythons(
        "import sys, torch, rtcnorm\n"
        "print('torch.distributed.tensor' in sys.modules)\n"
        "from torch.distributed.tensor import DTensor\n"
        "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "ops = [getattr(torch.ops.rtcnorm, n).default for n in torch.ops.rtcnorm]\n"
        "print(len(ops), all(op in funcs for op in ops))\n",
        "import torch\n"
        "from torch.distributed.tensor import DTensor\n"
        "import rtcnorm\n"
        "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "print(torch.ops.rtcnorm.scaled_softmax_backward.default in funcs, "
        "rtcnorm.distributed.register_sharding_rules())\n",
    )
    # import rtcnorm does not import DTensor; importing it later registers all 14 ops
    assert rtcnorm_first.splitlines() == ["False", "14 True"], rtcnorm_first
    assert dtensor_first == "True True", dtensor_first
