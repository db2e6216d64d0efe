"""Benchmark rtcnorm.rms_norm against torch eager, torch.compile, Liger, Quack, Apex and TE.

Forward and backward (autograd.grad over x and weight), every standard shape of
bench_shapes.json["norm"], in one run; GB/s and % of a same-size device copy.

Bytes counted (s: element size of x, sw: of the weight, rstd is fp32):
- fwd: x + y + weight             = 2*M*N*s + N*sw
- bwd: x + dy + dx + weight + dW + rstd = 3*M*N*s + 2*N*sw + 4*M

    python benchmarks/bench_rms_norm.py                      # all shapes, bf16, fwd+bwd, all peers
    python benchmarks/bench_rms_norm.py --quick              # 4 shapes, short timing
    python benchmarks/bench_rms_norm.py --shapes narrow_rows --dtype all --phase bwd
    python benchmarks/bench_rms_norm.py --dry-run            # CPU smoke run of the whole pipeline

See norm_bench.py for the driver and `--help` for every flag.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import norm_bench  # noqa: E402

if __name__ == "__main__":
    norm_bench.main("rms_norm")
