"""One training step of Hugging Face decoder models with each norm implementation.

    python benchmarks/bench_models.py --out benchmarks/results/models_h100
    python benchmarks/bench_models.py --tiny --device cpu --modes eager --out /tmp/models   # smoke test

Models are built from transformers' config classes with random weights (nothing
is downloaded): Qwen3, Llama, Gemma3 (text) and GPT-2, hidden 2048, 4 layers,
16 heads of 128 (8 KV heads), MLP 8192, vocabulary 32000, sequence 2048, batch 4,
bf16, SDPA attention. A step is forward with the LM loss, backward and an AdamW
step. Norms:

- ``torch``: the model as transformers builds it;
- ``rtcnorm``: after ``rtcnorm.patch(model)``;
- ``liger``: after Liger's ``apply_liger_kernel_to_<family>(model=..., rms_norm=True)``
  with every other Liger option off (skipped, with the reason, where Liger is
  missing or has no patch for the family).

Each runs eager, and with ``torch.compile`` applied to every decoder layer (the
layers share one compiled graph; embeddings, LM head and loss stay eager). Step
time is the median of ``--steps`` steps after ``--warmup`` steps, timed with CUDA
events (perf_counter on the CPU); peak memory is ``max_memory_allocated``. Each
model runs in its own process, because Liger patches transformers' classes for
the whole process: a failure or a crash costs only that model's remaining
configurations, and is written into the table. Writes ``<out>.json``,
``<out>.md`` and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

FAMILIES = ("qwen3", "llama", "gemma3", "gpt2")
NORMS = ("torch", "rtcnorm", "liger")
MODES = ("eager", "compile")
FULL = dict(hidden=2048, layers=4, heads=16, kv_heads=8, head_dim=128, mlp=8192, vocab=32000, seq=2048, batch=4)
TINY = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=256, seq=32, batch=2)
LIGER_PATCHES = {
    "llama": ("apply_liger_kernel_to_llama",),
    "qwen3": ("apply_liger_kernel_to_qwen3",),
    "gemma3": ("apply_liger_kernel_to_gemma3_text", "apply_liger_kernel_to_gemma3"),
}


def build_model(family: str, s: dict):
    import transformers as tf

    common = dict(vocab_size=s["vocab"], num_hidden_layers=s["layers"], max_position_embeddings=s["seq"])
    decoder = dict(
        common,
        hidden_size=s["hidden"],
        intermediate_size=s["mlp"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
    )
    if family == "llama":
        cfg, cls = tf.LlamaConfig(**decoder), tf.LlamaForCausalLM
    elif family == "qwen3":
        cfg, cls = tf.Qwen3Config(**decoder), tf.Qwen3ForCausalLM
    elif family == "gemma3":
        cfg, cls = tf.Gemma3TextConfig(**decoder), tf.Gemma3ForCausalLM
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=s["vocab"], n_positions=s["seq"], n_embd=s["hidden"], n_layer=s["layers"])
        cfg.n_head, cfg.n_inner = s["heads"], s["mlp"]
        cls = tf.GPT2LMHeadModel
    else:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    cfg._attn_implementation = "sdpa"
    return cls(cfg)


def decoder_layers(model):
    for path in ("model.layers", "transformer.h"):
        obj = model
        try:
            for name in path.split("."):
                obj = getattr(obj, name)
        except AttributeError:
            continue
        return list(obj)
    raise RuntimeError(f"no decoder layers found in {type(model).__name__}")


def apply_norm(model, family: str, norm: str) -> str:
    """Swaps the norms in place; returns a short note for the table."""
    if norm == "torch":
        return ""
    if norm == "rtcnorm":
        import rtcnorm

        patch = getattr(rtcnorm, "patch", None)
        if patch is None:
            raise RuntimeError("this rtcnorm has no rtcnorm.patch")
        summary = patch(model)
        return str(summary).splitlines()[0][:120] if summary is not None else ""
    names = LIGER_PATCHES.get(family)
    if names is None:
        raise LookupError(f"Liger has no norm patch for {family}")
    try:
        import liger_kernel.transformers as lt
    except ImportError as e:
        raise LookupError(f"Liger is not importable: {e}") from None
    fn = next((getattr(lt, n) for n in names if hasattr(lt, n)), None)
    if fn is None:
        raise LookupError(f"this Liger has none of {names}")
    # Every switch off but the norm.
    kw = {
        p.name: False
        for p in inspect.signature(fn).parameters.values()
        if isinstance(p.default, bool) and p.name != "rms_norm"
    }
    fn(model=model, rms_norm=True, **kw)
    return f"{fn.__name__}(rms_norm=True, model=...)"


def run_config(family: str, norm: str, mode: str, s: dict, a) -> dict:
    import torch

    device = torch.device(a.device)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    torch.manual_seed(0)
    model = build_model(family, s).to(device=device, dtype=dtype)
    note = apply_norm(model, family, norm)
    if mode == "compile":
        for layer in decoder_layers(model):
            layer.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=device)
    cuda = device.type == "cuda"

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(a.steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            loss = step()
            times.append((time.perf_counter() - t) * 1e3)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return dict(step_ms=statistics.median(times), peak_gib=peak, warmup_s=warm_s, loss=float(loss), note=note)


def child(family: str, a) -> None:
    """Runs every configuration of one family; prints one JSON row per line."""
    s = TINY if a.tiny else FULL
    for norm in a.norms:
        for mode in a.modes:
            row = dict(model=family, norm=norm, mode=mode)
            try:
                row.update(run_config(family, norm, mode, s, a), status="ok")
            except LookupError as e:
                row.update(status="skipped", error=str(e))
            except Exception as e:  # one configuration's failure is a table cell, not the end of the run
                row.update(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                traceback.print_exc(file=sys.stderr)
            print("ROW " + json.dumps(row), flush=True)
            took = f"{row['step_ms']:.1f} ms a step" if row["status"] == "ok" else row["error"]
            print(f"{family} {norm} {mode}: {row['status']}, {took}", file=sys.stderr, flush=True)
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def run_family(family: str, a) -> list[dict]:
    argv = [sys.executable, os.path.abspath(__file__), "--child", family, "--device", a.device, "--dtype", a.dtype]
    argv += ["--norms", *a.norms, "--modes", *a.modes, "--warmup", str(a.warmup), "--steps", str(a.steps)]
    argv += ["--tiny"] if a.tiny else []
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout)
    rows = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    done = {(r["norm"], r["mode"]) for r in rows}
    lost = f"process exited {proc.returncode}: {(proc.stderr.strip().splitlines() or ['no output'])[-1][:200]}"
    for norm in a.norms:
        for mode in a.modes:
            if (norm, mode) not in done:
                rows.append(dict(model=family, norm=norm, mode=mode, status="failed", error=lost))
    if proc.returncode != 0 or any(r["status"] == "failed" for r in rows):
        sys.stderr.write(f"--- {family} stderr (tail) ---\n{proc.stderr[-3000:]}\n")
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    cols = [(n, m) for m in MODES for n in NORMS if any(r["norm"] == n and r["mode"] == m for r in rows)]
    head = ["model"] + [f"{n} {m}" for n, m in cols]
    lines = [
        f"**One training step (fwd + bwd + AdamW), {meta['dtype']}, {meta['gpu']}**: "
        f"median ms of {meta['steps']} steps (peak GiB)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    notes, patched = [], []
    for fam in dict.fromkeys(r["model"] for r in rows):
        cells = [fam]
        for n, m in cols:
            r = next((r for r in rows if r["model"] == fam and r["norm"] == n and r["mode"] == m), None)
            if r is None:
                cells.append("")
            elif r["status"] == "ok":
                mem = f" ({r['peak_gib']:.1f})" if r.get("peak_gib") is not None else ""
                cells.append(f"{r['step_ms']:.1f}{mem}")
                line = f"- {fam}, {n}: {r['note']}"
                if r.get("note") and line not in patched:  # once per model and norm, whatever the mode
                    patched.append(line)
            else:
                notes.append(f"- {fam}, {n} {m}: {r['status']}: {r['error']}")
                cells.append(f"{r['status']} [{len(notes)}]")
        lines.append("| " + " | ".join(cells) + " |")
    if patched:
        lines += ["", "What each patch swapped:", *patched]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def bar_chart(rows: list[dict], meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(dict.fromkeys(r["model"] for r in rows))
    cols = [(n, m) for m in MODES for n in NORMS if any(r["norm"] == n and r["mode"] == m for r in rows)]
    colors = {"torch": "tab:gray", "rtcnorm": "tab:blue", "liger": "tab:green"}
    width = 0.8 / max(len(cols), 1)
    fig, ax = plt.subplots(figsize=(8.4, 4.2), dpi=100)
    for i, (n, m) in enumerate(cols):
        xs, ys = [], []
        for j, fam in enumerate(fams):
            r = next((r for r in rows if r["model"] == fam and r["norm"] == n and r["mode"] == m), None)
            if r and r["status"] == "ok":
                xs.append(j + (i - (len(cols) - 1) / 2) * width)
                ys.append(r["step_ms"])
        hatch = "//" if m == "compile" else None
        ax.bar(xs, ys, width, color=colors[n], hatch=hatch, edgecolor="white", label=f"{n} {m}")
    ax.set_xticks(range(len(fams)), fams)
    ax.set_ylabel("ms per training step (lower is better)")
    ax.set_title(f"One training step, {meta['dtype']}, {meta['gpu']}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="path prefix of the .json/.md/.png results")
    p.add_argument("--models", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    p.add_argument("--norms", nargs="+", choices=NORMS, default=list(NORMS))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--tiny", action="store_true", help="tiny models (hidden 64, 2 layers, sequence 32): a smoke test")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None, help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3; --tiny: 1)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; --tiny: 2)")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed to one model's process")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    a.warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 3)
    a.steps = a.steps if a.steps is not None else (2 if a.tiny else 10)
    if a.child:
        child(a.child, a)
        return
    import torch

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    if not a.out:
        p.error("--out is required")
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
    meta = dict(gpu=gpu, dtype=a.dtype, steps=a.steps, warmup=a.warmup, torch=torch.__version__)
    meta.update(shape=TINY if a.tiny else FULL, date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        p.error("bench_models.py needs transformers (pip install transformers)")
    t0 = time.perf_counter()
    rows = []
    for fam in a.models:
        rows += run_family(fam, a)
        print(f"{fam}: done at {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    meta["wall_s"] = time.perf_counter() - t0
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    table = markdown(rows, meta)
    with open(a.out + ".md", "w") as f:
        f.write(table)
    bar_chart(rows, meta, a.out + ".png")
    print(table)


if __name__ == "__main__":
    main()
