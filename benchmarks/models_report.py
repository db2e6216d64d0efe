"""Merge the per-family results of bench_models.py into one table and one plot.

    python benchmarks/models_report.py PARTS_DIR OUT_PREFIX

Reads every PARTS_DIR/<family>.json and writes OUT_PREFIX.json (meta per family
and all rows), OUT_PREFIX.md (one line per variant, then the patch summaries,
the profiles and every skip or failure with its reason) and OUT_PREFIX.png
(step time and peak memory per family and variant). Nothing here measures.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models_step import FAMILIES, IMPLS, MODES  # noqa: E402

COLORS = dict(torch="tab:gray", rtcnorm="tab:blue", liger="tab:green")


def load(parts: str) -> tuple[dict, list[dict]]:
    metas, rows = {}, []
    names = sorted(n for n in os.listdir(parts) if n.endswith(".json")) if os.path.isdir(parts) else []
    for name in names:
        with open(os.path.join(parts, name)) as f:
            data = json.load(f)
        if isinstance(data, dict) and "rows" in data and "family" in data.get("meta", {}):
            meta = metas[data["meta"]["family"]] = data["meta"]
            rows += data["rows"]
            # A runner stopped from outside leaves the variant it was in, and those after it.
            done = {(r["impl"], r["mode"]) for r in data["rows"]}
            run = meta.get("running") or {}
            for impl, mode in meta.get("variants", []):
                if (impl, mode) not in done:
                    why = "not reached: the run was stopped before it"
                    if (run.get("impl"), run.get("mode")) == (impl, mode):
                        why = f"the run was stopped during this variant (given {run['cap_s']:.0f} s)"
                    rows.append(dict(family=meta["family"], impl=impl, mode=mode, status="skipped", reason=why))
    if not rows:
        raise SystemExit(f"models_report: no <family>.json with rows in {parts!r}")
    order = {(f, i, m): n for n, (f, m, i) in enumerate(itertools.product(FAMILIES, MODES, IMPLS))}
    rows.sort(key=lambda r: order.get((r["family"], r["impl"], r["mode"]), len(order)))
    return metas, rows


def find(rows: list[dict], family: str, impl: str, mode: str) -> dict | None:
    return next((r for r in rows if (r["family"], r["impl"], r["mode"]) == (family, impl, mode)), None)


def _patch_cell(r: dict) -> str:
    p = r.get("patch")
    if p:
        return f"{p['swapped']} swapped, {p['skipped']} skipped"
    return r.get("note", "")


def markdown(metas: dict, rows: list[dict]) -> str:
    m = next(iter(metas.values()))
    s = m["shape"]
    lines = [
        f"**One training step (forward + LM loss, backward, AdamW), {m['dtype']}, {m['gpu']}**, "
        f"hidden {s['hidden']}, {s['layers']} layers, sequence {s['seq']}, batch {s['batch']}; "
        f"median of {m['steps']} steps after {m['warmup']} warm-up; torch {m['torch']}, "
        f"transformers {m['transformers']}.",
        "",
        "| family | impl | mode | step ms | vs torch | host ms | peak MB | first step s | loss0 | norms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in rows:
        cells = [r["family"], "rtcnorm.patch" if r["impl"] == "rtcnorm" else r["impl"], r["mode"]]
        if r["status"] == "ok":
            base = find(rows, r["family"], "torch", r["mode"])
            vs = f"{base['step_ms'] / r['step_ms']:.2f}x" if base and base["status"] == "ok" else ""
            peak = f"{r['peak_mb']:.0f}" if r.get("peak_mb") is not None else "-"
            cells += [f"{r['step_ms']:.1f}", vs, f"{r['host_ms']:.1f}", peak, f"{r['first_step_s']:.1f}"]
            cells += [f"{r['loss0']:.4f}", _patch_cell(r)]
        else:
            notes.append(f"- {r['family']} {r['impl']} {r['mode']}: {r['status']}: {r['reason']}")
            cells += [f"{r['status']} [{len(notes)}]"] + [""] * 6
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "`vs torch`: torch's step time over this one, same mode. `host ms`: time to queue a step."]
    target = []
    for fam in dict.fromkeys(r["family"] for r in rows):
        for mode in MODES:
            mine, peer = find(rows, fam, "rtcnorm", mode), find(rows, fam, "liger", mode)
            if mine and peer and mine["status"] == peer["status"] == "ok":
                gap = mine["step_ms"] / peer["step_ms"] - 1
                verdict = "met" if gap <= 0 else f"missed: rtcnorm.patch is {gap * 100:.1f}% slower"
                target.append(f"- {fam} {mode}: {mine['step_ms']:.1f} ms against {peer['step_ms']:.1f} ms, {verdict}")
    if target:
        lines += ["", "Target, a step at least as fast with rtcnorm.patch as with Liger's norms:", *target]
    summaries = []
    for r in rows:
        p = r.get("patch")
        if p and r["mode"] == MODES[0]:
            kinds = "; ".join(f"{k} x{n}" for k, n in p["kinds"].items())
            summaries.append(f"- {r['family']}: {p['swapped']} swapped ({kinds}), {p['skipped']} skipped")
            summaries += [f"  - skipped {why}" for why in p["reasons"]]
    if summaries:
        lines += ["", "rtcnorm.patch summary per family:", *summaries]
    prof = [r for r in rows if r.get("profile")]
    if prof:
        lines += [
            "",
            "Profiled step (one more step under torch.profiler; times include its overhead). `host ms`: "
            "until the step was queued; `device busy ms`: the sum of kernel times; `norm kernels ms`: kernels "
            "named rms_norm or layer_norm (rtcnorm's, Liger's, torch's LayerNorm; torch's RMSNorm runs as "
            "generic kernels and counts 0). Full tables: parts/profile_<family>_<impl>_<mode>.txt.",
            "",
            "| family | impl | mode | wall ms | host ms | device busy ms | norm kernels ms | kernels | top device call |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in prof:
            p = r["profile"]
            top = f"{p['top_cuda'][0][0][:48]} ({p['top_cuda'][0][2]:.1f} ms)" if p["top_cuda"] else ""
            lines.append(
                f"| {r['family']} | {r['impl']} | {r['mode']} | {p['wall_ms']:.1f} | {p['host_ms']:.1f} "
                f"| {p['device_busy_ms']:.1f} | {p['norm_kernel_ms']:.2f} | {p['kernels']} | {top} |"
            )
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def plot(metas: dict, rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = [f for f in FAMILIES if f in metas]
    ok = [r for r in rows if r["status"] == "ok"]
    cols = [(i, m) for m in MODES for i in IMPLS if any(r["impl"] == i and r["mode"] == m for r in ok)]
    width = 0.8 / max(len(cols), 1)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), dpi=100)
    for ax, key, label in ((axes[0], "step_ms", "ms per training step"), (axes[1], "peak_mb", "peak memory, MB")):
        for k, (impl, mode) in enumerate(cols):
            xs, ys = [], []
            for j, fam in enumerate(fams):
                r = find(rows, fam, impl, mode)
                if r and r["status"] == "ok" and r.get(key) is not None:
                    xs.append(j + (k - (len(cols) - 1) / 2) * width)
                    ys.append(r[key])
            hatch = "//" if mode == "compile" else None
            ax.bar(xs, ys, width, color=COLORS[impl], hatch=hatch, edgecolor="white", label=f"{impl} {mode}")
        if not ax.patches:
            ax.text(0.5, 0.5, "not measured on this device", ha="center", transform=ax.transAxes)
        ax.set_xticks(range(len(fams)), fams)
        ax.set_ylabel(f"{label} (lower is better)")
        ax.grid(True, axis="y", alpha=0.3)
    m = next(iter(metas.values()))
    fig.suptitle(f"One training step, {m['dtype']}, {m['gpu']}", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[1].legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def merge(parts: str, out: str) -> str:
    """Writes ``out``.json, .md and .png from ``parts``; returns the markdown."""
    metas, rows = load(parts)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(dict(meta=metas, rows=rows), f, indent=1)
    table = markdown(metas, rows)
    with open(out + ".md", "w") as f:
        f.write(table)
    plot(metas, rows, out + ".png")
    return table


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(merge(sys.argv[1], sys.argv[2]))
