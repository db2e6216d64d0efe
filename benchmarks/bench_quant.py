"""Quantized norm outputs (docs/quantized_outputs.md): the fused forward
against the unfused path (rtcnorm's norm, then torch's own quantization
ops), and against a same-size copy. `--op gated`: the gated RMSNorm
(norm before a SiLU gate, one group) instead of RMSNorm.

Bytes moved: the inputs read (x, and the gate z), the quantized output and
its scales written. Times: `harness.bench` (call time, L2 flushed) and
`profiler_kernel_ms` (device time) of one call each.

    python benchmarks/bench_quant.py [--op rms_norm|gated] [--out benchmarks/results/quant_h200]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import rtcnorm  # noqa: E402

OP = torch.ops.rtcnorm.norm_quant
GATED_OP = torch.ops.rtcnorm.rms_norm_gated_quant
SHAPES = [(4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192), (65536, 1024), (4096, 9999), (16384, 5120)]
RECIPES = [
    ("per_tensor", torch.float8_e4m3fn, "plain"),
    ("per_token", torch.float8_e4m3fn, "plain"),
    ("mxfp8", torch.float8_e4m3fn, "blocked"),
    ("nvfp4", torch.float4_e2m1fn_x2, "blocked"),
]
FP8_MAX = 448.0


def moved_bytes(recipe: str, m: int, n: int, esize: int, inputs: int = 1) -> int:
    data = m * ((n + 1) // 2) if recipe == "nvfp4" else m * n
    scales = {"per_tensor": 4, "per_token": 4 * m, "mxfp8": m * -(-n // 32), "nvfp4": m * -(-n // 16)}[recipe]
    return inputs * m * n * esize + data + scales


def unfused(recipe: str, norm, m: int, n: int, scale, qdtype):
    """``norm()`` (rtcnorm's, in the input dtype), then torch's quantization
    ops with the same arithmetic (None where N does not split into whole blocks)."""
    if recipe == "per_tensor":

        def fn():
            y = norm().float()
            return (y * scale).clamp(-FP8_MAX, FP8_MAX).to(qdtype), y.abs().amax()

    elif recipe == "per_token":

        def fn():
            y = norm().float()
            a = y.abs().amax(1, keepdim=True)
            return (y * (FP8_MAX / a)).to(qdtype), a / FP8_MAX

    elif n % {"mxfp8": 32, "nvfp4": 16}[recipe] != 0:
        return None
    elif recipe == "mxfp8":

        def fn():
            y = norm().float().view(m, n // 32, 32)
            e = torch.floor(torch.log2(y.abs().amax(2, keepdim=True))) - 8
            return (y * torch.exp2(-e)).clamp(-FP8_MAX, FP8_MAX).to(qdtype), (e + 127).to(torch.uint8)

    else:

        def fn():
            y = norm().float().view(m, n // 16, 16)
            s = (y.abs().amax(2, keepdim=True) / 6 * scale).to(torch.float8_e4m3fn)
            v = (y * (scale / s.float())).clamp(-6, 6)  # torch has no E2M1 cast: the scaled values stand in
            return v, s

    return fn


def run(shapes, dtype, op: str = "rms_norm") -> list[dict]:
    rows = []
    for (m, n), (recipe, qdtype, layout) in harness.progress(
        [(s, r) for s in shapes for r in RECIPES], desc="quant", label=lambda t: f"{t[0][0]}x{t[0][1]} {t[1][0]}"
    ):
        x = torch.randn(m, n, dtype=dtype, device="cuda")
        z = torch.randn(m, n, dtype=dtype, device="cuda") if op == "gated" else None
        w = torch.randn(n, dtype=dtype, device="cuda")
        scale = torch.tensor([2.0], device="cuda") if recipe in ("per_tensor", "nvfp4") else None

        if op == "gated":
            fused = functools.partial(GATED_OP, x, z, w, None, True, None, "silu", recipe, qdtype, scale, layout)
            norm = functools.partial(rtcnorm.rms_norm_gated, x, z, w)
        else:
            fused = functools.partial(OP, x, None, [n], w, None, None, "rms_norm", recipe, qdtype, scale, layout)
            norm = functools.partial(rtcnorm.rms_norm, x, n, w)

        nbytes = moved_bytes(recipe, m, n, x.element_size(), 2 if op == "gated" else 1)
        call_ms = harness.bench(fused)
        dev_ms = harness.profiler_kernel_ms(fused)
        copy = harness.copy_gbps(nbytes)
        unf = unfused(recipe, norm, m, n, scale, qdtype)
        unf_ms = harness.bench(unf) if unf is not None else None
        rows.append(
            {
                "shape": f"{m}x{n}",
                "recipe": recipe,
                "layout": layout,
                "call_us": round(call_ms * 1e3, 2),
                "device_us": round(dev_ms * 1e3, 2),
                "gbps": round(harness.gbps(nbytes, dev_ms), 1),
                "pct_copy": round(100 * harness.gbps(nbytes, dev_ms) / copy, 1),
                "unfused_us": None if unf_ms is None else round(unf_ms * 1e3, 2),
                "vs_unfused": None if unf_ms is None else round(unf_ms / call_ms, 2),
            }
        )
    return rows


def markdown(rows: list[dict], env: dict, op: str = "rms_norm") -> str:
    title = "gated RMSNorm (norm, then SiLU gate; one group)" if op == "gated" else "RMSNorm"
    head = (
        f"# Quantized {title} forward, bf16 input ({env.get('gpu', '?')})\n\n"
        "Bytes: inputs read + quantized output + scales. `% copy`: device time against a same-size copy; "
        "`vs unfused`: call time of rtcnorm's norm then torch's quantization ops over the fused call's.\n\n"
        "| shape | recipe | scales | call us | device us | GB/s | % copy | unfused us | vs unfused |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['shape']} | {r['recipe']} | {r['layout']} | {r['call_us']} | {r['device_us']} | {r['gbps']} | "
        f"{r['pct_copy']} | {r['unfused_us'] if r['unfused_us'] is not None else '-'} | "
        f"{r['vs_unfused'] if r['vs_unfused'] is not None else '-'} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=("rms_norm", "gated"), default="rms_norm")
    ap.add_argument("--out", help="write <out>.json and <out>.md")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_quant: needs a CUDA GPU")
    env = harness.environment()
    rows = run(SHAPES, torch.bfloat16, args.op)
    text = markdown(rows, env, args.op)
    print(text)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
