"""rtcnorm demo: the main job of `make demo`.

On a GPU: compiles and runs the ops, checks them against torch, prints
timings and the JIT cache statistics (cold compile vs. warm start).
Without a GPU: runs the CPU path, then compiles with NVRTC the kernels that an
H100 (sm_90) would run for a handful of shapes and prints ptxas' report of
each, to show the JIT working on a machine with no driver. Filling the disk
cache ahead of time for whole models is `python -m rtcnorm precompile`.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import rtcnorm
import torch
import torch.nn.functional as F
from tqdm import tqdm


def median_ms(fn, reps=50):
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(5):
        fn()
    for s, e in zip(start, end):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return times[len(times) // 2]


def max_rel_err(out, ref):
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


def cases(device, dtype):
    def rms(m, n):
        x = torch.randn(m, n, device=device, dtype=dtype)
        w = torch.randn(n, device=device, dtype=dtype)
        return (
            f"rms_norm {m}x{n}",
            lambda: rtcnorm.rms_norm(x, n, w, 1e-6),
            lambda: F.rms_norm(x.float(), (n,), w.float(), 1e-6),
            lambda: F.rms_norm(x, (n,), w, 1e-6),
        )

    def ln(m, n):
        x = torch.randn(m, n, device=device, dtype=dtype)
        w, b = torch.randn(n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)
        return (
            f"layer_norm {m}x{n}",
            lambda: rtcnorm.layer_norm(x, n, w, b),
            lambda: F.layer_norm(x.float(), (n,), w.float(), b.float()),
            lambda: F.layer_norm(x, (n,), w, b),
        )

    big = device == "cuda"
    out = [rms(32768 if big else 64, 128), rms(8192 if big else 16, 4096), ln(8192 if big else 16, 4096)]
    if hasattr(rtcnorm, "scaled_masked_softmax"):
        b, h, s = (4, 16, 1024) if big else (1, 2, 64)
        x = torch.randn(b, h, s, s, device=device, dtype=dtype)
        mask = torch.rand(b, 1, s, s, device=device) < 0.1
        out.append(
            (
                f"scaled_masked_softmax {b}x{h}x{s}x{s}",
                lambda: rtcnorm.scaled_masked_softmax(x, mask, 0.125),
                lambda: torch.softmax((x.float() * 0.125).masked_fill(mask, float("-inf")), -1),
                lambda: torch.softmax((x * 0.125).masked_fill(mask, float("-inf")), -1),
            )
        )
    return out


def run_gpu():
    dtype = torch.bfloat16
    print(f"device: {torch.cuda.get_device_name()}  dtype: {dtype}")
    print(f"{'op':34s} {'first call ms':>14s} {'max rel err':>12s} {'rtcnorm us':>11s} {'torch us':>9s}")
    for name, fn, ref, eager in cases("cuda", dtype):
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) * 1e3
        err = max_rel_err(out, ref())
        print(f"{name:34s} {first:14.1f} {err:12.2e} {median_ms(fn) * 1e3:11.1f} {median_ms(eager) * 1e3:9.1f}")
    plan = rtcnorm.explain("rms_norm", (32768, 128), dtype)
    print(f"\nexplain rms_norm 32768x128: mode={plan['mode']} grid={plan['grid']} block={plan['block']}")
    print(f"  {plan['reason']}")


# Shapes that tell the story on an H100 (sm_90, 132 SMs): each gets its own
# kernels, compiled for its exact row length, dtype and launch shape.
STORY = (
    ("rms_norm", (32768, 128), "Qwen3 QK-norm: 8 threads a row, 32 rows a CTA"),
    ("rms_norm", (16384, 4096), "Llama-8B hidden: a row in registers, read once"),
    ("layer_norm", (8192, 768), "GPT-2 LayerNorm"),
    ("rms_norm", (512, 131072), "a row too wide for one CTA: a cluster of CTAs"),
    ("scaled_masked_softmax", (4, 32, 1024, 1024), "masked attention softmax"),
)


def story_kernels(op, shape):
    """The (phase, kernel, ptxas report) triples of the plan for ``shape`` on sm_90,
    compiled now by NVRTC (no GPU needed)."""
    if op.startswith("scaled"):
        plan = rtcnorm.softmax.explain(op, shape, torch.bfloat16, arch="sm_90", resources=True)
        return [(ph, plan[ph]["kernel"], plan[ph]["ptxas"], plan[ph]["reason"]) for ph in ("forward", "backward")]
    plan = rtcnorm.explain(op, shape, torch.bfloat16, device="cpu", arch="sm_90", resources=True)
    bwd = plan["backward"]
    return [
        ("forward", plan["kernel"], plan["ptxas"], plan["reason"]),
        ("backward", bwd["kernel"], bwd["ptxas"], bwd["reason"]),
    ]


def run_cpu():
    print("no CUDA device: the CPU path, then the kernels an H100 (sm_90) would run, compiled here")
    for name, fn, ref, _ in cases("cpu", torch.float32):
        print(f"{name:34s} max rel err vs torch: {max_rel_err(fn(), ref()):.2e}")
    t0 = time.perf_counter()
    # NVRTC releases the GIL: one shape per core.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = [pool.submit(story_kernels, op, shape) for op, shape, _ in STORY]
        for f in tqdm(as_completed(futures), total=len(futures), desc="compiling for sm_90", unit="shape"):
            f.result()
    elapsed = time.perf_counter() - t0
    count = 0
    for (op, shape, why), f in zip(STORY, futures):
        print(f"\n{op} {'x'.join(map(str, shape))} bf16 ({why})")
        for phase, kernel, ptxas, reason in f.result():
            count += 1
            regs = f"{ptxas['registers']} registers, {ptxas['spill_stores']} B spilled" if ptxas else "PTX"
            print(f"  {phase:8s} {kernel}\n           {regs}; {reason.split(';')[0]}")
    print(f"\ncompiled {count} kernels for sm_90 in {elapsed:.1f} s on {os.cpu_count()} cores")


def main():
    print(f"rtcnorm {rtcnorm.__version__}, torch {torch.__version__}")
    info = rtcnorm.jit.nvrtc_info()
    print(f"NVRTC {info['version']} at {info['path']}")
    rtcnorm.jit.reset_stats()
    if not torch.cuda.is_available():
        run_cpu()
        # explain(resources=True) compiles to read ptxas' report and stores nothing.
        print(f"kernel cache: {rtcnorm.jit.cache_dir()} (fill it ahead with: python -m rtcnorm precompile)")
        return
    run_gpu()
    print(f"\nkernel cache: {rtcnorm.jit.cache_dir()}\nJIT cache stats:")
    for k, v in rtcnorm.jit.stats().items():
        print(f"  {k:16s} {v:.1f}" if isinstance(v, float) else f"  {k:16s} {v}")


if __name__ == "__main__":
    main()
