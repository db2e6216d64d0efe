"""The planner issue's targets, checked against saved norm_bench records.

Reads the `*_records.json` files that bench_rms_norm.py / bench_layer_norm.py
write (`--out NAME` gives `NAME_records.json`) and prints, per op, set, shape and
phase: rtcnorm's kernel time, every peer's, the best peer's over rtcnorm's, the
kernel's share of a same-size copy where the shape moves 64 MB or more, and
whether the cell meets its target:

| set      | fwd                    | bwd                                           |
|----------|------------------------|-----------------------------------------------|
| standard | >= 1.00x best peer     | >= 1.10x best peer or >= 92% of copy (lower)  |
| random   | >= 0.98x best peer     | >= 1.05x best peer                            |
| 64 MB+   | >= 90% of copy         | >= 85% of copy                                |

Kernel times are torch.profiler sums (device work per call, L2 flushed), the
fair comparison on a host slower than the kernels. A 64 MB+ shape's copy
figure comes from do_bench, where the copy's call time is its kernel time.

    python benchmarks/norm_targets.py results/rms_norm_std_h200_records.json --set standard ...
    python benchmarks/norm_targets.py --set random results/*_rnd_h200_records.json --md out.md
"""

from __future__ import annotations

import argparse
import json
import sys

BIG = 64 << 20  # bytes a shape's input must reach for the copy targets
PEER_IMPLS = ("torch", "compile", "liger", "quack", "apex_fused", "apex_fast", "te")
TARGETS = {  # set -> {phase: (min ratio to the best peer, min % of copy that also passes)}
    "standard": {"fwd": (1.00, None), "bwd": (1.10, 92.0)},
    "random": {"fwd": (0.98, None), "bwd": (1.05, None)},
}
COPY_TARGET = {"fwd": 90.0, "bwd": 85.0}


def load(paths) -> list[dict]:
    rows = []
    for p in paths:
        with open(p) as f:
            rows += json.load(f)["rows"]
    return rows


def cells(records: list[dict], set_name: str) -> list[dict]:
    """One cell per (op, shape, dtype, phase): kernel times and the verdicts."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["op"], r["shape"], r["dtype"], r["phase"]), []).append(r)
    out = []
    for (op, shape, dtype, phase), group in groups.items():
        by = {r["impl"]: r for r in group}
        rtc = by.get("rtcnorm", {}).get("kern_us")
        if rtc is None:
            continue
        m, n = (int(v) for v in shape.split("x"))
        peers = {k: r["kern_us"] for k, r in by.items() if k in PEER_IMPLS and r.get("kern_us") and not r.get("check")}
        cell = {"op": op, "shape": shape, "dtype": dtype, "phase": phase, "rtc_us": rtc, **peers}
        if peers:
            best = min(peers, key=peers.get)
            cell["best_peer"], cell["vs_best"] = best, peers[best] / rtc
        nbytes = by["rtcnorm"]["bytes"]
        es = 4 if dtype == "fp32" else 2
        if m * n * es >= BIG:
            cell["pct_copy"] = 100 * nbytes / (rtc * 1e-6) / (by["rtcnorm"]["copy"] * 1e9)
        cell["verdict"] = verdict(cell, set_name)
        out.append(cell)
    return out


def verdict(cell: dict, set_name: str) -> str:
    """'ok' or the targets the cell misses, comma-separated."""
    misses = []
    ratio, pct_ok = TARGETS[set_name][cell["phase"]]
    pct = cell.get("pct_copy")
    vs = cell.get("vs_best")
    if vs is not None and vs < ratio and not (pct_ok is not None and pct is not None and pct >= pct_ok):
        misses.append(f"peer {vs:.2f}x < {ratio:.2f}x")
    if pct is not None and pct < COPY_TARGET[cell["phase"]]:
        misses.append(f"copy {pct:.0f}% < {COPY_TARGET[cell['phase']]:.0f}%")
    return ", ".join(misses) or "ok"


def table(cells_: list[dict], md: bool) -> str:
    peers = [p for p in PEER_IMPLS if any(p in c for c in cells_)]
    head = [
        "op",
        "shape",
        "phase",
        "rtcnorm us",
        *[f"{p} us" for p in peers],
        "best peer",
        "vs best",
        "% copy",
        "target",
    ]

    def fmt(v):
        return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)

    rows = []
    for c in cells_:
        pct = c.get("pct_copy")
        rows.append([c["op"], c["shape"], c["phase"], fmt(c["rtc_us"]), *[fmt(c.get(p)) for p in peers],
                     c.get("best_peer", "-"), fmt(c.get("vs_best")), "-" if pct is None else f"{pct:.0f}%",
                     c["verdict"]])  # fmt: skip
    if md:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(r, widths)) for r in [head, *rows])


def summary(cells_: list[dict], set_name: str) -> str:
    lines = []
    for phase in ("fwd", "bwd"):
        cs = [c for c in cells_ if c["phase"] == phase]
        ok = [c for c in cs if c["verdict"] == "ok"]
        ratios = sorted(c["vs_best"] for c in cs if "vs_best" in c)
        worst = min(cs, key=lambda c: c.get("vs_best", 9.0), default=None)
        line = f"{set_name} {phase}: {len(ok)}/{len(cs)} cells meet their targets"
        if ratios:
            line += f"; kernel vs best peer median {ratios[len(ratios) // 2]:.2f}x"
            line += f", worst {worst['vs_best']:.2f}x ({worst['op']} {worst['shape']}, {worst['best_peer']})"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", help="*_records.json files of norm_bench runs")
    ap.add_argument("--set", required=True, choices=sorted(TARGETS), help="which targets apply")
    ap.add_argument("--md", default=None, help="also write the table and summary as Markdown here")
    a = ap.parse_args(argv)
    cs = sorted(cells(load(a.records), a.set), key=lambda c: (c["op"], c["phase"], c["shape"]))
    if not cs:
        ap.error("no rtcnorm cell with a kernel time in these records")
    text = table(cs, md=False) + "\n\n" + summary(cs, a.set)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(summary(cs, a.set).replace("\n", "\n\n") + "\n\n" + table(cs, md=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
