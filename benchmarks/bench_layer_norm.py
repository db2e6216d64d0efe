"""Benchmark rtcnorm.layer_norm against torch eager, torch.compile, Liger, Quack, Apex and TE.

Forward and backward (autograd.grad over x, weight and bias), every standard and random shape of
bench_shapes.json["norm"], in one run; GB/s and % of a same-size device copy. Apex
enters twice: FusedLayerNorm (apex_fused) and contrib FastLayerNorm (apex_fast).

Bytes counted (s: element size of x, sw: of the weights, stats are fp32):
- fwd: x + y + weight + bias                        = 2*M*N*s + 2*N*sw
- bwd: x + dy + dx + weight + dW + dB + rstd + mean = 3*M*N*s + 3*N*sw + 8*M
(the backward never reads the bias, so it is not counted.)

    python benchmarks/bench_layer_norm.py                    # all shapes, bf16, fwd+bwd, all peers
    python benchmarks/bench_layer_norm.py --quick            # 4 shapes, short timing
    python benchmarks/bench_layer_norm.py --shapes 4096x4096,32768x128 --peers torch,apex_fast
    python benchmarks/bench_layer_norm.py --dry-run          # CPU smoke run of the whole pipeline

See norm_bench.py for the driver and `--help` for every flag.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import norm_bench  # noqa: E402

if __name__ == "__main__":
    norm_bench.main("layer_norm")
