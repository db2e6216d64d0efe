"""Model-level checks run on each rank of a gloo pool (tests/test_distributed.py):
the Llama-style decoder of benchmarks/dist_model.py under tensor + sequence
parallel, FSDP2 and both, against the same model in one process. Every rank
runs the single-process reference itself. float64, so a mismatch is a wrong
placement, never rounding."""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import dist_model  # noqa: E402

DIM, HEADS, HIDDEN, LAYERS, VOCAB = 32, 4, 64, 2, 24
# FSDP2 splits the batch, so its sequence is odd. Tensor parallel splits the
# sequence: torch 2.11's own TP styles fail in backward on an uneven split
# (with torch.nn.RMSNorm as well), so it gets an even one; uneven splits of
# the rtcnorm ops themselves are checked in dist_op_cases.
SEQ, TP_SEQ = 7, 8
STEPS = 3
TOL = {"rtol": 1e-9, "atol": 1e-10}


def _model(norms: str = "rtcnorm") -> dist_model.Decoder:
    m = dist_model.Decoder(DIM, HEADS, HIDDEN, LAYERS, VOCAB, norms=norms)
    dist_model.init_weights(m, seed=0)
    return m.double()


def _batch(step: int, batch: int, seq: int = SEQ):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(batch, seq, DIM, generator=g, dtype=torch.float64)
    return x, torch.randint(0, VOCAB, (batch, seq), generator=g)


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _check_grads(model, ref, step):
    ref_params = dict(ref.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(ref_params), (names, list(ref_params))
    for name, p in model.named_parameters():
        assert p.grad is not None, f"step {step}: {name} got no gradient"
        torch.testing.assert_close(
            _full(p.grad), ref_params[name].grad, **TOL, msg=lambda m, name=name: f"step {step} grad {name}: {m}"
        )


def _check_params(model, ref):
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            _full(p.detach()), ref_params[name].detach(), **TOL, msg=lambda m, n=name: f"{n}: {m}"
        )


def _train(model, ref, local_batch, batch: int, seq: int = SEQ):
    """STEPS of SGD on both models, checking the loss and every gradient at each
    step and every parameter at the end."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    for step in range(STEPS):
        x, target = _batch(step, batch, seq)
        loss_ref = dist_model.loss_fn(ref(x), target)
        loss_ref.backward()
        xl, tl = local_batch(x, target)
        loss = dist_model.loss_fn(model(xl), tl)
        loss.backward()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= dist.get_world_size()
        torch.testing.assert_close(mean_loss, loss_ref.detach(), **TOL, msg=lambda m, s=step: f"step {s} loss: {m}")
        _check_grads(model, ref, step)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    _check_params(model, ref)


def _norm_weight_grads(model):
    return {n: p.grad for n, p in model.named_parameters() if "norm" in n}


def tp_sp_matches_single_process():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ref = _model()
    model = dist_model.apply_tp(copy.deepcopy(ref), mesh)
    # the norm weights are replicated DTensors; their gradients arrive Partial
    x, target = _batch(0, 2, TP_SEQ)
    dist_model.loss_fn(model(dist_model.sequence_shard(x, mesh)), target).backward()
    for name, g in _norm_weight_grads(model).items():
        assert isinstance(g, DTensor) and g.placements[0].is_partial(), f"{name}: {g.placements}"
    model.zero_grad()
    _train(model, ref, lambda x, t: (dist_model.sequence_shard(x, mesh), t), batch=2, seq=TP_SEQ)


def tp_sp_norm_grads_are_deterministic():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    base = _model()
    x, target = _batch(0, 2, TP_SEQ)
    runs = []
    for _ in range(2):
        model = dist_model.apply_tp(copy.deepcopy(base), mesh)
        dist_model.loss_fn(model(dist_model.sequence_shard(x, mesh)), target).backward()
        runs.append({n: (g.to_local().clone(), g.full_tensor()) for n, g in _norm_weight_grads(model).items()})
    for name in runs[0]:
        for a, b in zip(runs[0][name], runs[1][name]):
            assert torch.equal(a, b), f"{name}: dW differs between two identical runs"


def _data_shard(x, target):
    rank, world = dist.get_rank(), dist.get_world_size()
    n = x.shape[0] // world
    return x[rank * n : (rank + 1) * n], target[rank * n : (rank + 1) * n]


def fsdp2_matches_single_process():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ref = _model()
    model = dist_model.apply_fsdp(copy.deepcopy(ref), mesh)
    _train(model, ref, _data_shard, batch=2 * dist.get_world_size())


def fsdp2_tp_2d_matches_single_process():
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    ref = _model()
    model = dist_model.apply_fsdp(dist_model.apply_tp(copy.deepcopy(ref), mesh["tp"]), mesh["dp"])

    def local(x, target):
        dp_rank, n = mesh["dp"].get_local_rank(), x.shape[0] // mesh["dp"].size()
        x, target = x[dp_rank * n : (dp_rank + 1) * n], target[dp_rank * n : (dp_rank + 1) * n]
        return dist_model.sequence_shard(x, mesh["tp"]), target

    # the loss of a dp rank is replicated over its tp ranks: averaging over all
    # ranks averages over dp
    _train(model, ref, local, batch=2 * mesh["dp"].size(), seq=TP_SEQ)


def bench_tiny_cpu():
    """benchmarks/bench_distributed.py --device cpu --tiny on these ranks; rank
    0 returns the directory it wrote."""
    import tempfile

    import bench_distributed

    out = tempfile.mkdtemp(prefix="rtcnorm-bench-dist-") if dist.get_rank() == 0 else "unused"
    bench_distributed.run(bench_distributed.parse_args(["--device", "cpu", "--tiny", "--out", out]))
    return out
