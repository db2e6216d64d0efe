"""torch.compile(fullgraph=True) and torch.export through the norm modules,
on the CPU and on a GPU."""

from __future__ import annotations

import pytest
import rtcnorm
import torch
from norm_checks import (
    randn,
    randomize,
)
from reference import assert_close


class Block(torch.nn.Module):
    def __init__(self, n, dtype, device, mode=None):
        super().__init__()
        self.pre = rtcnorm.RMSNorm(n, mode=mode, device=device, dtype=dtype)
        self.proj = torch.nn.Linear(n, n, device=device, dtype=dtype)
        self.post = rtcnorm.LayerNorm(n, mode=mode, device=device, dtype=dtype)

    def forward(self, x, r):
        y, h = self.pre(x, r)
        return self.post(self.proj(y)) + h


def _compile_matches_eager(device, dtype, backend, dynamic=False, shape=(4, 7, 64)):
    block = randomize(Block(shape[-1], dtype, device))
    compiled = torch.compile(block, fullgraph=True, backend=backend, dynamic=dynamic)
    x = randn(shape, dtype, device).requires_grad_()
    r = randn(shape, dtype, device)
    got = compiled(x, r)
    got.sum().backward()
    grads = [x.grad] + [p.grad for p in block.parameters()]
    x.grad = None
    block.zero_grad()
    expected = block(x, r)
    expected.sum().backward()
    assert_close(got, expected.double(), what="compiled y")
    for g, e in zip(grads, [x.grad] + [p.grad for p in block.parameters()]):
        assert_close(g, e.double(), what="compiled grad", reduce_len=shape[0] * shape[1])


def test_compile_fullgraph_cpu_inductor():
    _compile_matches_eager("cpu", torch.float32, "inductor")


def test_compile_fullgraph_cpu_dynamic_shapes():
    torch._dynamo.reset()
    _compile_matches_eager("cpu", torch.float32, "aot_eager", dynamic=True, shape=(3, 5, 32))
    _compile_matches_eager("cpu", torch.float32, "aot_eager", dynamic=True, shape=(2, 9, 32))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph_cuda_inductor(dtype):
    _compile_matches_eager("cuda", dtype, "inductor", shape=(8, 33, 1024))


@pytest.mark.gpu
def test_compile_reduce_overhead_replays_cuda_graphs():
    """mode="reduce-overhead" records the ops into CUDA graphs after its
    warm-up runs (which compile and load the kernels) and replays them on
    fresh inputs."""
    torch._dynamo.reset()
    block = randomize(Block(256, torch.bfloat16, "cuda"))
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(5):
            x, r = randn((8, 33, 256), torch.bfloat16, "cuda"), randn((8, 33, 256), torch.bfloat16, "cuda")
            got = compiled(x, r).clone()
            assert_close(got, block(x, r).double(), what="reduce-overhead y")


class ExportBlock(Block):
    """Block plus causal attention scores through FusedScaleMaskSoftmax."""

    def __init__(self, n, dtype, device):
        super().__init__(n, dtype, device)
        self.softmax = rtcnorm.FusedScaleMaskSoftmax("causal", scale=n**-0.5)

    def forward(self, x, r):
        h = super().forward(x, r)
        return self.softmax((h @ h.transpose(-1, -2)).unsqueeze(1))


def _export_matches_eager(device, dtype, n=64):
    block = randomize(ExportBlock(n, dtype, device))
    batch = torch.export.Dim("batch", min=1, max=64)
    x, r = randn((3, 9, n), dtype, device), randn((3, 9, n), dtype, device)
    ep = torch.export.export(block, (x, r), dynamic_shapes={"x": {0: batch}, "r": {0: batch}})
    targets = {str(node.target) for node in ep.graph.nodes if node.op == "call_function"}
    for op in ("add_rms_norm", "layer_norm", "scaled_upper_triang_masked_softmax"):
        assert f"rtcnorm.{op}.default" in targets, f"{op} missing from the exported graph: {sorted(targets)}"
    for b in (1, 5):  # batch sizes other than the traced one
        x, r = randn((b, 9, n), dtype, device), randn((b, 9, n), dtype, device)
        got = ep.module()(x, r)
        assert got.shape == (b, 1, 9, 9)
        assert torch.equal(got, block(x, r)), "the exported program must run the same kernels as eager"


def test_export_with_a_dynamic_batch_cpu():
    _export_matches_eager("cpu", torch.float32)


@pytest.mark.gpu
def test_export_with_a_dynamic_batch_cuda():
    _export_matches_eager("cuda", torch.bfloat16)
