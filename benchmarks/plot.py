"""Draw GB/s against row length N from saved norm benchmark results.

    python benchmarks/plot.py [--results benchmarks/results] [--tag h100] [--out DIR]

Reads ``<op>_<tag>.json`` (written by bench_rms_norm.py / bench_layer_norm.py
--out <op>_<tag>) for op in rms_norm and layer_norm, and writes one PNG per op
and phase, ``<op>_<phase>_<tag>.png``: rtcnorm, every peer of the run and the
same-size device copy. Where several shapes share N, the one that moves the
most bytes (the largest M) is drawn, since smaller calls time the host rather
than the memory system. GB/s is per call (triton's do_bench, L2 flushed), as in
the tables. Nothing here measures anything.
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
OPS = {"rms_norm": "RMSNorm", "layer_norm": "LayerNorm"}
# Result columns of peers, with their legend labels and styles.
PEERS = {
    "torch": ("torch eager", "tab:gray", "s"),
    "compile": ("torch.compile", "tab:orange", "^"),
    "liger": ("Liger", "tab:green", "v"),
    "apex_fused": ("Apex fused", "tab:purple", "D"),
    "te": ("TransformerEngine", "tab:brown", "P"),
}
PHASES = {"fwd": "forward", "bwd": "backward"}


def shape_mn(shape: str) -> tuple[int, int]:
    m, n = shape.split("x")[-2:]
    return int(m), int(n)


def series(rows: list[dict], phase: str, column: str) -> tuple[list[int], list[float]]:
    """(N, GB/s) points of one column, the largest M per N; cells that are not
    numbers (failed, missing, '=' for a shared kernel) are left out."""
    best: dict[int, tuple[int, dict]] = {}
    for r in rows:
        if r["phase"] != phase:
            continue
        m, n = shape_mn(r["shape"])
        if n not in best or m > best[n][0]:
            best[n] = (m, r)
    ns = sorted(best)
    pts = [(n, best[n][1].get(column)) for n in ns]
    pts = [(n, float(v)) for n, v in pts if isinstance(v, (int, float))]
    return [n for n, _ in pts], [v for _, v in pts]


def plot_one(data: dict, op: str, phase: str, path: str) -> str:
    meta = data.get("meta", {})
    gpu = meta.get("gpu", "GPU")
    dtype = "/".join(meta.get("args", {}).get("dtypes", [])) or "bf16"
    fig, ax = plt.subplots(figsize=(8.4, 4.2), dpi=100)
    xs, ys = series(data["rows"], phase, "copy")
    ax.plot(xs, ys, color="black", linestyle="--", linewidth=1, label="device copy (same bytes)")
    for col, (label, color, marker) in PEERS.items():
        xs, ys = series(data["rows"], phase, col)
        if xs:
            ax.plot(xs, ys, color=color, marker=marker, markersize=4, linewidth=1, label=label)
    xs, ys = series(data["rows"], phase, "rtcnorm")
    if not xs:
        plt.close(fig)
        raise ValueError(f"{op} {phase}: no rtcnorm numbers in the results")
    ax.plot(xs, ys, color="tab:blue", marker="o", markersize=5, linewidth=2, label="rtcnorm")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (row length); the largest M measured at each N")
    ax.set_ylabel("GB/s per call")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{OPS.get(op, op)} {PHASES[phase]}, {dtype}, {gpu}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_all(results: str, tag: str, out: str) -> list[str]:
    """Every (op, phase) PNG whose ``<op>_<tag>.json`` exists; returns their paths."""
    os.makedirs(out, exist_ok=True)
    written = []
    for op in OPS:
        src = os.path.join(results, f"{op}_{tag}.json")
        if not os.path.exists(src):
            continue
        with open(src) as f:
            data = json.load(f)
        for phase in PHASES:
            if any(r["phase"] == phase for r in data["rows"]):
                written.append(plot_one(data, op, phase, os.path.join(out, f"{op}_{phase}_{tag}.png")))
    if not written:
        raise SystemExit(f"no {'/'.join(OPS)}_{tag}.json under {results}")
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=RESULTS, help="folder of <op>_<tag>.json files")
    p.add_argument("--tag", default="h100", help="the results' suffix, e.g. h100")
    p.add_argument("--out", default=None, help="folder for the PNGs (default: --results)")
    a = p.parse_args()
    for path in plot_all(a.results, a.tag, a.out or a.results):
        print(f"{path}: {os.path.getsize(path) // 1024} KB")


if __name__ == "__main__":
    main()
