"""rtcnorm demo: the main job of `make demo`.

On a GPU: compiles and runs the ops, checks them against torch, prints
timings and the JIT cache statistics (cold compile vs. warm start).
Without a GPU: runs the CPU path and precompiles kernels for sm_90 with NVRTC,
to show the JIT working on a machine with no driver.
"""

import time

import rtcnorm
import torch
import torch.nn.functional as F


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


def run_cpu():
    print("no CUDA device: running the CPU path and precompiling for sm_90")
    for name, fn, ref, _ in cases("cpu", torch.float32):
        print(f"{name:34s} max rel err vs torch: {max_rel_err(fn(), ref()):.2e}")
    t0 = time.perf_counter()
    lines = rtcnorm.jit.precompile(
        "rms_norm", hidden_sizes=[128, 4096], dtypes=[torch.bfloat16], modes=[None], archs=["sm_90"]
    )
    print(f"\nprecompiled {len(lines)} rms_norm kernels for sm_90 in {time.perf_counter() - t0:.1f} s, e.g.:")
    for line in lines[:3]:
        print("  " + line)
    plan = rtcnorm.explain("rms_norm", (32768, 128), torch.bfloat16, device="cpu")
    print(f"\nexplain rms_norm 32768x128 on a 132-SM sm_90: mode={plan['mode']}\n  {plan['reason']}")


def main():
    print(f"rtcnorm {rtcnorm.__version__}, torch {torch.__version__}")
    info = rtcnorm.jit.nvrtc_info()
    print(f"NVRTC {info['version']} at {info['path']}")
    print(f"kernel cache: {rtcnorm.jit.cache_dir()}")
    rtcnorm.jit.reset_stats()
    if torch.cuda.is_available():
        run_gpu()
    else:
        run_cpu()
    print("\nJIT cache stats:")
    for k, v in rtcnorm.jit.stats().items():
        print(f"  {k:16s} {v:.1f}" if isinstance(v, float) else f"  {k:16s} {v}")


if __name__ == "__main__":
    main()
