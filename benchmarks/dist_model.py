"""A Llama-style decoder and its parallel plans, shared by
benchmarks/bench_distributed.py and tests/test_distributed.py.

``norms="rtcnorm"`` builds it with rtcnorm.RMSNorm and rtcnorm's causal
softmax; ``norms="torch"`` with torch.nn.RMSNorm and a masked torch.softmax.
Everything else (linears, init, layout) is the same, so the two differ only
in those ops. Attention runs on each rank's local heads (the standard
ColwiseParallel output); the norms run under SequenceParallel on DTensors.
"""

from __future__ import annotations

import math

import rtcnorm
import torch
import torch.nn.functional as F
from torch import nn


def _torch_causal_softmax(scores: torch.Tensor, scale: float) -> torch.Tensor:
    sq, sk = scores.shape[-2:]
    hide = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax((scores.float() * scale).masked_fill(hide, float("-inf")), dim=-1).to(scores.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, norms: str) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.softmax = rtcnorm.scaled_upper_triang_masked_softmax if norms == "rtcnorm" else _torch_causal_softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallel each rank holds its own heads
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        p = self.softmax(q @ k.transpose(-1, -2), 1.0 / math.sqrt(self.head_dim))
        return self.wo((p @ v).transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int, norms: str) -> None:
        super().__init__()
        norm = rtcnorm.RMSNorm if norms == "rtcnorm" else nn.RMSNorm
        self.attention_norm, self.ffn_norm = norm(dim, eps=1e-5), norm(dim, eps=1e-5)
        self.attention = Attention(dim, n_heads, norms)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Decoder(nn.Module):
    """Takes hidden states (b, s, dim); returns logits (b, s, vocab)."""

    def __init__(self, dim=32, n_heads=4, hidden=64, n_layers=2, vocab=24, norms="rtcnorm") -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(dim, n_heads, hidden, norms) for _ in range(n_layers))
        self.norm = (rtcnorm.RMSNorm if norms == "rtcnorm" else nn.RMSNorm)(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def init_weights(model: nn.Module, seed: int) -> None:
    """Deterministic weights, drawn on the parameters' device (norm weights
    not all ones, so dW matters)."""
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            g = torch.Generator(device=p.device).manual_seed(seed * 1000 + i)
            w = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
            w = w * (0.1 if "norm" in name else p.shape[-1] ** -0.5) + (1.0 if "norm" in name else 0.0)
            p.copy_(w)


def tp_plan(model: Decoder) -> dict:
    """Tensor + sequence parallel: the residual stream is a DTensor sharded on
    the sequence dim (dim 1); each norm runs on its sequence shard; attention
    and feed-forward gather the sequence once and split heads / hidden units.

    The residual stream stays a DTensor (not local tensors, as
    ``DTensor.from_local`` inside SequenceParallel would make them) so that a
    sequence length not divisible by the mesh size keeps its true global
    shape: from_local assumes even shards. Each gather hands local tensors on
    (use_local_output): a DTensor linear on an unevenly gathered input fails
    in torch 2.11 (a view of the non-contiguous gathered tensor)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)
    plan = {
        "norm": SequenceParallel(),
        # The (small) output projection stays replicated: every rank computes
        # the full logits and the same loss.
        "output": gather,
    }
    for i in range(len(model.layers)):
        plan.update(
            {
                f"layers.{i}.attention_norm": SequenceParallel(),
                f"layers.{i}.attention": gather,
                f"layers.{i}.attention.wq": ColwiseParallel(),
                f"layers.{i}.attention.wk": ColwiseParallel(),
                f"layers.{i}.attention.wv": ColwiseParallel(),
                f"layers.{i}.attention.wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                f"layers.{i}.ffn_norm": SequenceParallel(),
                f"layers.{i}.feed_forward": gather,
                f"layers.{i}.feed_forward.w1": ColwiseParallel(),
                f"layers.{i}.feed_forward.w3": ColwiseParallel(),
                f"layers.{i}.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            }
        )
    return plan


def apply_tp(model: Decoder, mesh) -> Decoder:
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh, tp_plan(model))


def apply_fsdp(model: Decoder, mesh, reshard_after_forward: bool = True) -> Decoder:
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def sequence_shard(x: torch.Tensor, mesh):
    """``x`` (the same on every rank) as a DTensor split on dim 1, without communication."""
    from torch.distributed.tensor import Shard, distribute_tensor

    return distribute_tensor(x, mesh, [Shard(1)], src_data_rank=None)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32)), target.flatten())
