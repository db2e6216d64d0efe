"""How fast one SM streams alone: a Triton copy (and read) of k programs, each a
contiguous share, for k from 1 to two waves. The cost model's SM-bound stream
time (ops/norm/plan/cost_model.cpp, kSmAlone) is this figure over the SM's share
of DRAM bandwidth.

    python benchmarks/sm_stream.py > benchmarks/results/sm_stream_h200.jsonl
"""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

BLOCK = 8192  # bf16 elements a program moves a step: 16 KB


@triton.jit
def _copy(x, y, per, BLOCK: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * per
    for off in range(0, per, BLOCK):
        i = base + off + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i))


@triton.jit
def _read(x, out, per, BLOCK: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * per
    acc = tl.zeros([BLOCK], tl.float32)
    for off in range(0, per, BLOCK):
        acc += tl.load(x + base + off + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out + tl.program_id(0), tl.sum(acc))


def rows_of(k: int, per: int, sms: int, per_mb: float) -> list[dict]:
    """Copy and read of k programs of `per` bf16 elements each."""
    x = torch.randn(k * per, device="cuda", dtype=torch.bfloat16)
    y, out = torch.empty_like(x), torch.empty(k, device="cuda")
    runs = {
        "copy": (lambda: _copy[(k,)](x, y, per, BLOCK=BLOCK, num_warps=32), 2),
        "read": (lambda: _read[(k,)](x, out, per, BLOCK=BLOCK, num_warps=32), 1),
    }
    rows = []
    for kind, (fn, streams) in runs.items():
        us = do_bench(fn, warmup=5, rep=30) * 1e3
        gbps = k * per * 2 * streams / us / 1e3
        rows.append(
            {
                "kind": kind,
                "per_mb": per_mb,
                "programs": k,
                "us": round(us, 2),
                "GBps": round(gbps, 1),
                "GBps_per_sm": round(gbps / min(k, sms), 1),
            }
        )
    return rows


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_mb in (0.25, 1, 4):
        for k in sorted({1, 4, 13, 26, 52, sms // 2, sms, 2 * sms}):
            for row in rows_of(k, int(per_mb * 2**20) // 2, sms, per_mb):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
