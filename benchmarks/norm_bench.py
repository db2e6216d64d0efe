"""The driver shared by bench_rms_norm.py and bench_layer_norm.py.

For each shape and dtype it times, side by side in one process, the forward and the
backward of: rtcnorm (the heuristic, labelled `rtcnorm`, and each forced mode), torch
eager, torch.compile of the same function, and whichever of Liger, Quack, Apex and
TransformerEngine import. The backward is
`torch.autograd.grad(y, [x, weight(, bias)], dy, retain_graph=True)`, autograd
included, as a user meets it. The forward runs with grad enabled (a training step).

Bytes counted, the fewest the op must move (s: element size of x, sw: of the
weights; stats are fp32):
- rms_norm   fwd: x + y + weight                                = 2*M*N*s + N*sw
- rms_norm   bwd: x + dy + dx + weight + dW + rstd               = 3*M*N*s + 2*N*sw + 4*M
- layer_norm fwd: x + y + weight + bias                          = 2*M*N*s + 2*N*sw
- layer_norm bwd: x + dy + dx + weight + dW + dB + rstd + mean   = 3*M*N*s + 3*N*sw + 8*M
The bias is not read by the backward, so it is not counted there.

Two comparisons with the peers sit side by side in the wide table. Call level:
`best_peer` is the highest GB/s of a peer whose accuracy check passed (`peer` names
it) and `rtc/best` is rtcnorm's GB/s over it; `rtc_us` is rtcnorm's time per call.
Kernel level, from torch.profiler (device work per call, host overhead left out;
measured for rtcnorm, every peer and, in the forward, every forced mode): `kern_us` is
rtcnorm's, `peer_kern_us` the smallest of a peer whose check passed (`kpeer` names
it), and `kern best/rtc` = peer_kern_us / kern_us, so >= 1 means rtcnorm's device
time is at most the best peer's. A host-bound peer can trail on `rtc/best` while
its kernels are fast: `kern best/rtc` is the fair comparison on a slow host. The
saved rows also keep each peer's kernel time as `kern_us_<peer>`.

The heuristic table compares the heuristic's forward with the best forced mode
twice: per call (`gap_pct`, GB/s) and by kernel time (`kern_gap_pct`). The modes
differ only on the device (the same host path launches each), so the check
(`ok`) is the kernel gap; calls of a few µs of kernels are host-bound, and
their call gap moves from run to run.
"""

from __future__ import annotations

import argparse
import math
import time
from types import SimpleNamespace

import harness as H
import torch
import torch.nn.functional as F
from norm_report import HEURISTIC_TOLERANCE, LABELS, _heuristic_rows, _summary, _wide_rows

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}
MODES = ("static_persistent", "multi_wave_reload", "multi_wave_cached")
PEERS = ("torch", "compile", "liger", "quack", "apex_fused", "apex_fast", "te")
QUICK_SHAPES = [(4096, 4096), (16384, 8192), (32768, 128), (32, 4096)]
SMOKE_SHAPES = [(8, 64), (5, 1000), (1, 128)]

try:
    import rtcnorm

    RTC_ERROR = None
except Exception as e:  # the peers still run; every rtcnorm cell says why it is empty
    rtcnorm, RTC_ERROR = None, H.reason(e)


def norm_bytes(op: str, phase: str, m: int, n: int, dtype: torch.dtype, wdtype: torch.dtype | None = None) -> int:
    s = torch.empty((), dtype=dtype).element_size()
    sw = torch.empty((), dtype=wdtype or dtype).element_size()
    params = 2 if op == "layer_norm" else 1
    if phase == "fwd":
        return 2 * m * n * s + params * n * sw
    return 3 * m * n * s + (1 + params) * n * sw + 4 * params * m


# ---- implementations: build(c) -> (forward callable, the weights it takes grads for) --


def _rtc(mode):
    def build(c):
        if rtcnorm is None:
            raise ImportError(RTC_ERROR)
        if c.op == "rms_norm":
            return (lambda: rtcnorm.rms_norm(c.x, (c.n,), c.w, c.eps, mode=mode)), c.params
        return (lambda: rtcnorm.layer_norm(c.x, (c.n,), c.w, c.b, c.eps, mode=mode)), c.params

    return build


def _torch_fn(c):
    if c.op == "rms_norm":
        return lambda x, w, b: F.rms_norm(x, (c.n,), w, c.eps)
    return lambda x, w, b: F.layer_norm(x, (c.n,), w, b, c.eps)


def _eager(c):
    f = _torch_fn(c)
    return (lambda: f(c.x, c.w, c.b)), c.params


def _compiled(c):
    torch._dynamo.reset()  # one specialised graph per shape; never the recompile limit
    f = torch.compile(_torch_fn(c), dynamic=False)
    return (lambda: f(c.x, c.w, c.b)), c.params


def _liger(c):
    lk = H.peer("liger")
    if c.op == "rms_norm":  # in_place=False: dy stays intact across repeated backwards
        return (lambda: lk.rms_norm(c.x, c.w, c.eps, offset=0.0, casting_mode="llama", in_place=False)), c.params
    return (lambda: lk.layer_norm(c.x, c.w, c.b, c.eps)), c.params


class _QuackLayerNorm(torch.autograd.Function):
    """Quack's LayerNorm forward and backward kernels as one autograd op."""

    @staticmethod
    def forward(ctx, x, w, b, eps):
        fwd, _ = H.peer("quack").layer_norm
        y, rstd, mean = fwd(x, w, b, eps, return_rstd=True, return_mean=True)
        ctx.save_for_backward(x, w, rstd, mean)
        return y

    @staticmethod
    def backward(ctx, dy):
        _, bwd = H.peer("quack").layer_norm
        x, w, rstd, mean = ctx.saved_tensors
        dx, dw, db = bwd(x, w, dy, rstd, mean, has_bias=True)
        return dx, dw, db, None


def _quack(c):
    if c.n % 8:
        raise ValueError(f"Quack needs N % 8 == 0 (16-byte rows); N = {c.n}")
    qk = H.peer("quack")
    if c.op == "rms_norm":
        return (lambda: qk.rms_norm(c.x, c.w, eps=c.eps)), c.params
    # Its LayerNorm takes float32 gamma and beta.
    w, b = (t.detach().float().requires_grad_(True) for t in (c.w, c.b))
    return (lambda: _QuackLayerNorm.apply(c.x, w, b, c.eps)), [w, b]


def _module(name):
    def build(c):
        cls = getattr(H.peer(name), c.op)
        kw = {"params_dtype": c.dtype} if name == "te" else {}
        mod = cls(c.n, eps=c.eps, **kw).to(device=c.x.device, dtype=c.dtype)
        bias = getattr(mod, "bias", None)
        with torch.no_grad():
            mod.weight.copy_(c.w)
            if bias is not None:
                bias.copy_(c.b if c.b is not None else torch.zeros_like(c.w))
        return (lambda: mod(c.x)), [p for p in (mod.weight, bias) if p is not None]

    return build


BUILDERS = {"rtcnorm": _rtc(None), **{md: _rtc(md) for md in MODES}, "torch": _eager, "compile": _compiled}
BUILDERS["liger"] = _liger
BUILDERS["quack"] = _quack
BUILDERS.update({name: _module(name) for name in ("apex_fused", "apex_fast", "te")})


def _available(op: str, names) -> tuple[list[str], dict]:
    """Peers that import and have this op; the others with the reason."""
    keep, missing = [], {}
    for name in names:
        if name in ("torch", "compile"):
            keep.append(name)
            continue
        obj = H.peer(name)
        if obj is None:
            missing[name] = H.peer_status()[name]
        elif getattr(obj, op, None) is None:
            missing[name] = f"has no {op}"
        else:
            keep.append(name)
    return keep, missing


def _close(got, want, dtype) -> str | None:
    """None when every tensor matches the fp32 reference to a loose tolerance."""
    tol = 2e-3 if dtype == torch.float32 else 5e-2
    for g, r in zip(got, want):
        if g is None:
            return "no gradient"
        err = (g.detach().float() - r).abs().max().item() / max(r.abs().max().item(), 1e-6)
        if not math.isfinite(err) or err > tol:
            return f"rel err {err:.1e}"
    return None


def _explain(op, m, n, dtype, modes) -> dict:
    """{mode or None: plan} from rtcnorm.explain, for the modes it can plan."""
    plans = {}
    for md in (None, *modes):
        try:
            plans[md] = rtcnorm.explain(op, [m, n], dtype, mode=md)
        except Exception:
            pass
    return plans


def measure(op: str, m: int, n: int, dname: str, impls: list[str], modes, args) -> tuple[list, list, dict]:
    """Time every impl on one shape; returns (records, issues, explain plans)."""
    dev, dtype = H.device(), DTYPES[dname]
    x = torch.randn(m, n, device=dev, dtype=dtype, requires_grad=True)
    w = torch.randn(n, device=dev, dtype=dtype, requires_grad=True)
    b = torch.randn(n, device=dev, dtype=dtype, requires_grad=True) if op == "layer_norm" else None
    dy = torch.randn(m, n, device=dev, dtype=dtype)
    params = [w] if b is None else [w, b]
    c = SimpleNamespace(op=op, x=x, w=w, b=b, n=n, eps=EPS[op], dtype=dtype, params=params)
    ref = None
    if args.check:
        leaves = [t.detach().float().requires_grad_(True) for t in [x, *params]]
        yr = _torch_fn(c)(leaves[0], leaves[1], leaves[2] if b is not None else None)
        ref = (yr.detach(), torch.autograd.grad(yr, leaves, dy.float()))
        del yr, leaves
    plans = _explain(op, m, n, dtype, modes) if rtcnorm is not None else {}
    bwd_kernel = {md: p.get("backward", {}).get("kernel") for md, p in plans.items()}
    copy = {ph: H.copy_gbps(norm_bytes(op, ph, m, n, dtype)) for ph in args.phases}
    records, issues = [], []
    for impl in impls:
        try:
            fwd, wts = BUILDERS[impl](c)
        except Exception as e:
            issues += [(impl, ph, H.reason(e)) for ph in args.phases]
            continue
        for ph in args.phases:
            nbytes = norm_bytes(op, ph, m, n, dtype)
            rec = {"op": op, "shape": f"{m}x{n}", "m": m, "n": n, "dtype": dname, "phase": ph, "impl": impl}
            rec.update(bytes=nbytes, copy=copy[ph])
            same = impl in MODES and bwd_kernel.get(impl) is not None and bwd_kernel.get(impl) == bwd_kernel.get(None)
            if ph == "bwd" and same:
                records.append({**rec, "same_as": "rtcnorm"})
                continue
            try:
                y = fwd()
                if ph == "fwd":
                    fn, grad, check = fwd, False, _close([y], [ref[0]], dtype) if ref else None
                else:
                    inputs = [x, *wts]
                    check = (
                        _close(torch.autograd.grad(y, inputs, dy, retain_graph=True), ref[1], dtype) if ref else None
                    )

                    def fn(y=y, inputs=inputs):
                        return torch.autograd.grad(y, inputs, dy, retain_graph=True)

                    grad = True
                ms = H.bench(fn, grad=grad)
                rec.update(ms=ms, gbps=H.gbps(nbytes, ms), pct_copy=100 * H.gbps(nbytes, ms) / copy[ph], check=check)
                # Forced modes: kernel time in the forward (the heuristic check), call level only in the backward.
                if impl == "rtcnorm" or impl in PEERS or (ph == "fwd" and impl in MODES):
                    kms = H.profiler_kernel_ms(fn, iters=args.prof_iters)
                    rec["kern_us"] = kms * 1e3 if math.isfinite(kms) else None
                if check:
                    issues.append((impl, ph, f"accuracy check failed: {check}"))
                del y, fn
            except Exception as e:
                rec["error"] = H.reason(e)
                issues.append((impl, ph, rec["error"]))
                if isinstance(e, torch.cuda.OutOfMemoryError):
                    torch.cuda.empty_cache()
            records.append(rec)
        del fwd, wts
    return records, issues, plans


def _shapes(spec: str, quick: bool, dry: bool) -> list[tuple[int, int]]:
    if dry:
        return SMOKE_SHAPES
    if quick and spec == "all":
        return QUICK_SHAPES
    groups, out = H.load_shapes()["norm"], []
    for tok in spec.replace(",", " ").split():
        if tok == "all":
            out += [tuple(s) for g in groups.values() for s in g]
        elif tok in groups:
            out += [tuple(s) for s in groups[tok]]
        elif "x" in tok:
            out.append(tuple(int(v) for v in tok.lower().split("x")))
        else:
            raise SystemExit(f"--shapes: {tok!r} is neither a group ({', '.join(groups)}), 'all' nor MxN")
    return list(dict.fromkeys(out))


def _names(spec: str, allowed, what: str) -> list[str]:
    if spec in ("all", ""):
        return list(allowed)
    if spec == "none":
        return []
    names = spec.replace(",", " ").split()
    bad = [n for n in names if n not in allowed]
    if bad:
        raise SystemExit(f"--{what}: unknown {bad}; choose from {', '.join(allowed)}, all or none")
    return names


def parse_args(op: str, argv=None):
    p = argparse.ArgumentParser(description=f"Benchmark {op}: GB/s and % of copy against peers, in one run.")
    p.add_argument("--shapes", default="all", help="all, groups (bandwidth,narrow_rows,model,latency) or MxN list")
    p.add_argument("--dtype", default="bf16", choices=[*DTYPES, "all"])
    p.add_argument("--phase", default="both", choices=("fwd", "bwd", "both"))
    p.add_argument("--peers", default="all", help=f"comma list of {','.join(PEERS)}; all or none")
    p.add_argument("--modes", default="all", help="forced rtcnorm modes to time besides the heuristic; all or none")
    p.add_argument("--quick", action="store_true", help="4 shapes (unless --shapes), short timing")
    p.add_argument("--dry-run", action="store_true", help="CPU smoke run: tiny shapes, wall-clock timer")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--jit", default="4096", help="row lengths for the JIT-cost table, or none")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the accuracy check of each impl")
    p.add_argument("--out", default=None, help="results/<OUT>*.csv/.json/.md/.png")
    a = p.parse_args(argv)
    a.device = "cpu" if a.dry_run else a.device
    a.phases = ("fwd", "bwd") if a.phase == "both" else (a.phase,)
    a.dtypes = list(DTYPES) if a.dtype == "all" else [a.dtype]
    a.prof_iters = 3 if a.dry_run else 10 if a.quick else 20
    a.out = a.out or f"{op}_{a.dtype}" + ("_quick" if a.quick else "") + ("_smoke" if a.dry_run else "")
    return a


def main(op: str, argv=None) -> None:
    a = parse_args(op, argv)
    warmup, rep = (1, 5) if a.dry_run else (5, 15) if a.quick else (10, 40)
    H.configure(device=a.device, warmup=warmup, rep=rep)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    shapes, modes = _shapes(a.shapes, a.quick, a.dry_run), _names(a.modes, MODES, "modes")
    peers, missing = _available(op, _names(a.peers, PEERS, "peers"))
    impls = ["rtcnorm", *modes, *peers]
    recs, issues, plans = [], [], {}
    items = [(s, d) for s in shapes for d in a.dtypes]
    for (m, n), dname in H.progress(items, desc=op, label=lambda it: f"{it[0][0]}x{it[0][1]} {it[1]}"):
        try:
            r, i, p = measure(op, m, n, dname, impls, modes, a)
        except Exception as e:  # inputs did not fit, or similar: the shape is skipped, not the run
            r, i, p = [], [("all", "-", f"{m}x{n} {dname}: {H.reason(e)}")], {}
        if H.on_cuda():
            torch.cuda.empty_cache()
        recs, issues, plans[(f"{m}x{n}", dname)] = recs + r, issues + i, p
    env = H.environment()
    where = f"{env.get('gpu', env['device'])}, {env['timer']}"
    dt = "" if len(a.dtypes) > 1 else f" {a.dtypes[0]}"
    title = (
        f"{op}{dt} on {where}: GB/s (% of copy), *_us in µs; '=' same backward kernel as rtcnorm; '-' failed or missing"
    )
    cols = [LABELS.get(i, i) for i in impls]
    head = ["shape", "dtype", "phase"] if len(a.dtypes) > 1 else ["shape", "phase"]
    kern = ["rtc_us", "kern_us", "peer_kern_us", "kpeer", "kern best/rtc"]
    wide = H.Table(title, [*head, "copy", *cols, "best_peer", "peer", "rtc/best", *kern], pct_of="copy")
    wide.pct_cols = {*cols, "best_peer"}  # GB/s columns only: times and ratios are never % of copy
    for row in _wide_rows(recs, peers, len(a.dtypes) > 1):
        wide.add(row)
    heur = H.Table(f"{op}: heuristic vs best forced mode (target: gap <= {HEURISTIC_TOLERANCE:.0f}%)", [])
    for row in _heuristic_rows(recs, plans, modes):
        heur.add(row)
    jit = None
    if a.jit != "none" and rtcnorm is not None:
        from jit_cost import jit_table

        sizes = [int(v) for v in a.jit.replace(",", " ").split()]
        jit = jit_table(op, sizes, str(DTYPES[a.dtypes[0]]).removeprefix("torch."), device=a.device)
    meta = {"args": vars(a), "peers": {**{p: H.peer_status().get(p, "ok") for p in peers}, **missing}}
    plot = {"y": ["copy", *cols], "x": [c for c in head if c != "phase"], "facet": "phase", "ylabel": "GB/s"}
    saved = wide.save(a.out, plot=plot, meta=meta)
    rec_table = H.Table(f"{op} per-impl records", [])
    for r in recs:
        rec_table.add(r)
    rec_table.save(a.out + "_records", plot=False, meta=meta)
    heur.save(a.out + "_heuristic", plot=False, meta=meta)
    if jit is not None:
        jit.save(a.out + "_jit", plot=False, meta=meta)
        jit.print()
    if heur.rows:
        heur.print()
    _summary(op, a, recs, issues, heur, wide, meta, saved, time.perf_counter() - t0)
    # The per-peer kern_us_<peer> columns stay in the saved files; the terminal shows the best one.
    shown = H.Table(wide.title, [c for c in wide.columns if not c.startswith("kern_us_")], pct_of=wide.pct_of)
    shown.pct_cols, shown.rows = wide.pct_cols, wide.rows
    shown.print()
