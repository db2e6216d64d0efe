"""Softmax family benchmark: rtcnorm against torch eager, torch.compile, Quack, Apex and TransformerEngine.

Shapes come from benchmarks/bench_shapes.json ("softmax": masked, causal,
aligned_causal; B x H x Sq x Sk) and PLAIN_SHAPES below (plain softmax of
M x N rows, N up to 65536). Each row is timed side by side in one run:
median of triton.testing.do_bench (or CUDA events) with L2 flushed.

Quack's softmax is plain (2-D, unscaled, unmasked; N % 8 == 0). On plain rows
it is a peer like the others; beside the masked and causal ops it runs its
plain softmax over the same rows, the bar those ops are held to ("kernel vs
quack plain"), and is left out of "best peer".

Bytes counted (the fewest the op must move):
- masked forward: x + y + mask (the mask as stored: (B, 1, Sq, Sk) bool);
- causal forward: x + y, as if the whole input were read, so a kernel that
  skips the masked half can show more than copy bandwidth;
- backward (through autograd: torch.autograd.grad(y, x, dy, retain_graph=True)):
  y + dy + dx.
"% copy" is against a device-to-device copy_ of the same byte count in this run.
"<impl> kernel" is the same byte count over the device time per call from
torch.profiler (host overhead left out), for rtcnorm and every peer; "best peer
kernel" is the highest peer's, and "kernel vs best" rtcnorm's over it: the fair
comparison when a slow host makes the peers' per-call times host-bound.
"copy kernel" is the copy's device time the same way, and "kernel %copy"
rtcnorm's kernel against it (for calls of a few microseconds of work, whose
per-call figures measure the host).

    python benchmarks/bench_softmax.py [--kinds masked,causal,aligned_causal] [--dtype bf16] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import rtcnorm  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NEG_INF = float("-inf")
# Plain softmax rows (1 x 1 x M x N): 128 MB of bf16 input from N = 1024 to
# 65536, the widest at 32 MB too, and an odd N that no 16-byte access fits.
PLAIN_SHAPES = [[1, 1, (1 << 26) // n, n] for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536)]
PLAIN_SHAPES += [[1, 1, 256, 65536], [1, 1, 4096, 12345]]


# ---- implementations: each maps (kind, x, hidden, scale) to y, or raises ----------
# `hidden` is the bool mask of excluded elements, built once outside the timed
# region: the padding mask, or the (sq, sk) causal mask the torch peers need
# (the fused kernels derive causality themselves and ignore it).


def hidden_causal(sq, sk, device):
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(sk - sq + 1)


def torch_eager(kind, x, hidden, scale):
    if hidden is None:
        return torch.softmax(x * scale, dim=-1)
    return torch.softmax((x * scale).masked_fill(hidden, NEG_INF), dim=-1)


# Compiled per shape: bench_shape resets dynamo first, so every shape gets a
# specialised graph and no shape falls back to eager at the recompile limit.
_compiled = torch.compile(torch_eager, dynamic=False)


def torch_compile(kind, x, hidden, scale):
    return _compiled(kind, x, hidden, scale)


def rtcnorm_impl(kind, x, mask, scale):
    if kind == "plain":
        return rtcnorm.scaled_softmax(x, scale)
    if kind == "masked":
        return rtcnorm.scaled_masked_softmax(x, mask, scale)
    if kind == "causal":
        return rtcnorm.scaled_upper_triang_masked_softmax(x, scale)
    return rtcnorm.scaled_aligned_causal_masked_softmax(x, scale)


def _quack():
    qk = harness.peer("quack")
    if qk is None:
        raise ImportError(harness.peer_status()["quack"])

    def run(kind, x, hidden, scale):
        return qk.softmax(x.reshape(-1, x.shape[-1])).view(x.shape)

    return run


def _megatron_kernels(f, aligned: bool):
    """A runner over the Megatron fused-softmax autograd functions of module `f`
    (Apex and TransformerEngine ship the same ones; Apex has no aligned causal)."""

    def run(kind, x, mask, scale):
        if kind == "plain":
            return f.ScaledSoftmax.apply(x, scale)
        if kind == "masked":
            return f.ScaledMaskedSoftmax.apply(x, mask, scale)
        if kind == "causal":
            b, h, sq, sk = x.shape
            return f.ScaledUpperTriangMaskedSoftmax.apply(x.view(-1, sq, sk), scale).view(b, h, sq, sk)
        if not aligned:
            raise NotImplementedError("no aligned causal kernel")
        return f.ScaledAlignedCausalMaskedSoftmax.apply(x, scale)

    return run


def _apex():
    from apex.transformer.functional import fused_softmax as f

    return _megatron_kernels(f, aligned=False)


def _te():
    from transformer_engine.pytorch import softmax as f

    return _megatron_kernels(f, aligned=True)


def implementations(with_peers: bool):
    impls = {"rtcnorm": rtcnorm_impl}
    if with_peers:
        impls["torch"] = torch_eager
        impls["compile"] = torch_compile
        for name, make in (("quack", _quack), ("apex", _apex), ("te", _te)):
            try:
                impls[name] = make()
            except Exception as e:  # not installed, or built without the fused softmax
                print(f"{name}: not available ({type(e).__name__}: {e})")
    return impls


# ---- measurement ------------------------------------------------------------------


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def kernel_gbps(nbytes: int, kernel_ms: float) -> float | None:
    """GB/s over the profiled device time; None when the profiler saw no device work."""
    return gbps(nbytes, kernel_ms) if math.isfinite(kernel_ms) and kernel_ms > 0 else None


def measure(impl, kind, x, hidden, scale, dy, phase):
    """(ms, kernel ms) of one implementation and phase; raises if it cannot run."""
    if phase == "fwd":

        def fn():
            return impl(kind, x, hidden, scale)

        fn()
        return harness.bench(fn), harness.profiler_kernel_ms(fn)
    xg = x.detach().requires_grad_(True)
    y = impl(kind, xg, hidden, scale)

    def fn():
        return torch.autograd.grad(y, xg, dy, retain_graph=True)

    fn()
    return harness.bench(fn, grad=True), harness.profiler_kernel_ms(fn)


def bench_shape(kind, shape, dtype, impls, phases, table):
    b, h, sq, sk = shape
    device = "cuda"
    torch._dynamo.reset()
    scale = 1.0 / 8.0
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, device=device, dtype=dtype, generator=g)
    dy = torch.randn(shape, device=device, dtype=dtype, generator=g)
    if kind == "masked":
        hidden = torch.rand((b, 1, sq, sk), device=device, generator=g) < 0.1
    elif kind == "plain":
        hidden = None
    else:
        hidden = hidden_causal(sq, sk, device)
    elt = x.numel() * x.element_size()
    nbytes = {"fwd": 2 * elt + (hidden.numel() if kind == "masked" else 0), "bwd": 3 * elt}
    for phase in phases:
        copy = harness.copy_gbps(nbytes[phase])
        copy_kernel = harness.copy_kernel_gbps(nbytes[phase])
        row = {"op": f"softmax_{kind}", "shape": "x".join(map(str, shape)), "phase": phase, "copy": round(copy)}
        row["copy kernel"] = round(copy_kernel)
        best_peer = best_peer_kernel = 0.0  # 0.0: no peer ran (or none had device work)
        rtc_kernel = None
        for name, impl in impls.items():
            try:
                ms, kernel_ms = measure(impl, kind, x, hidden, scale, dy, phase)
            except Exception as e:  # a peer's size limit, NotImplementedError, or OOM
                row[name] = "-"
                print(f"  {name} {kind} {shape} {phase}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                gc.collect()
                torch.cuda.empty_cache()
                continue
            rate, kernel_rate = gbps(nbytes[phase], ms), kernel_gbps(nbytes[phase], kernel_ms)
            row[name] = round(rate)
            row[f"{name} kernel"] = round(kernel_rate) if kernel_rate else "-"
            if name == "rtcnorm":
                row["rtcnorm %copy"] = round(100 * rate / copy, 1)
                rtc_kernel = kernel_rate
                if kernel_rate:
                    row["kernel %copy"] = round(100 * kernel_rate / copy_kernel, 1)
            elif name != "quack" or kind == "plain":
                best_peer = max(best_peer, rate)
                best_peer_kernel = max(best_peer_kernel, kernel_rate or 0.0)
            gc.collect()
            torch.cuda.empty_cache()
        row["best peer"] = round(best_peer) if best_peer else "-"
        if best_peer and isinstance(row.get("rtcnorm"), int):
            row["vs best"] = f"{row['rtcnorm'] / best_peer:.2f}x"
        row["best peer kernel"] = round(best_peer_kernel) if best_peer_kernel else "-"
        if best_peer_kernel and rtc_kernel:
            row["kernel vs best"] = f"{rtc_kernel / best_peer_kernel:.2f}x"
        if isinstance(row.get("quack kernel"), int) and rtc_kernel:
            row["kernel vs quack plain"] = f"{rtc_kernel / row['quack kernel']:.2f}x"
        table.add(row)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default="plain,masked,causal,aligned_causal")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--phases", default="fwd,bwd")
    p.add_argument("--quick", action="store_true", help="first two shapes of each kind")
    p.add_argument("--no-peers", action="store_true", help="rtcnorm only")
    p.add_argument("--out", help="results name under benchmarks/results (default softmax_<dtype>)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_softmax: needs a CUDA GPU")

    shapes = dict(harness.load_shapes()["softmax"], plain=PLAIN_SHAPES)
    dtype = DTYPES[args.dtype]
    impls = implementations(not args.no_peers)
    phases = args.phases.split(",")
    columns = ["op", "shape", "phase", "copy", "rtcnorm", "rtcnorm %copy", "copy kernel", "rtcnorm kernel"]
    columns += ["kernel %copy"]
    peers = [n for n in impls if n != "rtcnorm"]
    columns += peers + ["best peer", "vs best"]
    columns += [f"{n} kernel" for n in peers] + ["best peer kernel", "kernel vs best"]
    columns += ["kernel vs quack plain"] if "quack" in impls else []
    table = harness.Table(f"Softmax family, {args.dtype}, {torch.cuda.get_device_name()} (GB/s)", columns)
    for kind in args.kinds.split(","):
        for shape in shapes[kind][: 2 if args.quick else None]:
            bench_shape(kind, tuple(shape), dtype, impls, phases, table)
    table.print()
    table.save(args.out or f"softmax_{args.dtype}")
    s = rtcnorm.jit.stats()
    print(
        f"JIT: {s['compiles']} compiles ({s['compile_ms']:.0f} ms), {s['disk_hits']} disk hits "
        f"({s['disk_load_ms']:.0f} ms), {s['module_loads']} module loads ({s['module_load_ms']:.0f} ms)"
    )


if __name__ == "__main__":
    main()
