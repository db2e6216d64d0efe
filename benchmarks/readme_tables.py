"""Print the bf16 performance tables of docs/performance.md (and, with
--headline, the README's small table) from the saved benchmark results.

    python benchmarks/readme_tables.py [--anchors PATH/anchors_h100.md]
    python benchmarks/readme_tables.py --headline

Reads results/rms_norm_h100.json, layer_norm_h100.json (bench_rms_norm.py /
bench_layer_norm.py --out <op>_h100) and softmax_bf16_h100.json (bench_softmax.py),
and prints one markdown table per op: per-call GB/s against the copy and the best
peer of the same run, then kernel against kernel. The "H100 anchor best" column
is the bold best-peer cell of an anchors file (rows `| op | shape | phase | ... |
**GB/s** |`); without one it reads "-". Nothing here measures anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
NORMS = (("rms_norm", "rms", "RMSNorm"), ("layer_norm", "ln", "LayerNorm"))
# The per-call columns both tables share, after their row keys.
CALL_HEAD = ("copy GB/s", "rtcnorm GB/s (% copy)", "best peer in run", "rtcnorm / best", "H100 anchor best")
NORM_HEAD = (
    ("shape", "phase") + CALL_HEAD + ("kernel µs", "best peer's kernel µs", "kernel: best peer / rtcnorm", "call µs")
)
SOFTMAX_HEAD = (
    ("op", "shape", "phase")
    + CALL_HEAD
    + (
        "copy kernel GB/s",
        "rtcnorm kernel GB/s (% copy kernel)",
        "best peer kernel GB/s",
        "kernel: rtcnorm / best peer",
    )
)


# The README's headline rows: (op, shape, phase).
HEADLINE = (
    ("rms_norm", "16384x8192", "fwd"),
    ("rms_norm", "16384x8192", "bwd"),
    ("rms_norm", "32768x128", "fwd"),
    ("rms_norm", "32768x128", "bwd"),
    ("rms_norm", "1024x65536", "bwd"),
    ("layer_norm", "16384x8192", "fwd"),
    ("layer_norm", "16384x8192", "bwd"),
    ("layer_norm", "512x131072", "bwd"),
)
HEADLINE_HEAD = (
    "op",
    "shape",
    "phase",
    "rtcnorm GB/s (% of copy)",
    "best peer GB/s",
    "rtcnorm kernel µs",
    "best peer's kernel µs",
    "kernel speed-up",
)


def gbps(v: float) -> str:
    """Three significant figures below 100 GB/s, whole GB/s above."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%"


def load_anchors(path: str | None) -> dict:
    """(op, shape, phase) -> the anchors' best peer GB/s."""
    if not path:
        return {}
    row = re.compile(r"^\|\s*(\w+)\s*\|\s*([\dx]+)\s*\|\s*(fwd|bwd)\s*\|.*\*\*([\d.]+)\*\*\s*\|\s*$")
    out = {}
    with open(path) as f:
        for line in f:
            m = row.match(line.strip())
            if m:
                out[m.group(1), m.group(2), m.group(3)] = float(m.group(4))
    return out


def table(head, rows) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def norm_rows(name: str, tag: str, anchors: dict) -> list:
    with open(os.path.join(RESULTS, f"{name}_h100.json")) as f:
        data = json.load(f)
    rows = []
    for r in data["rows"]:
        anchor = anchors.get((tag, r["shape"], r["phase"]))
        rows.append(
            (
                r["shape"],
                r["phase"],
                gbps(r["copy"]),
                f"{gbps(r['rtcnorm'])} ({pct(r['rtcnorm'], r['copy'])})",
                f"{gbps(r['best_peer'])} {r['peer']}",
                f"{r['rtc/best']:.2f}",
                gbps(anchor) if anchor else "-",
                f"{r['kern_us']:.1f}",
                f"{r['peer_kern_us']:.1f} {r['kpeer']}",
                f"{r['kern best/rtc']:.2f}",
                f"{r['rtc_us']:.1f}",
            )
        )
    return rows


def softmax_rows(anchors: dict) -> list:
    with open(os.path.join(RESULTS, "softmax_bf16_h100.json")) as f:
        data = json.load(f)
    rows = []
    for r in data["rows"]:
        anchor = anchors.get((r["op"], r["shape"], r["phase"]))
        rows.append(
            (
                r["op"],
                r["shape"],
                r["phase"],
                gbps(r["copy"]),
                f"{gbps(r['rtcnorm'])} ({pct(r['rtcnorm'], r['copy'])})",
                gbps(r["best peer"]),
                r["vs best"],
                gbps(anchor) if anchor else "-",
                gbps(r["copy kernel"]),
                f"{gbps(r['rtcnorm kernel'])} ({pct(r['rtcnorm kernel'], r['copy kernel'])})",
                gbps(r["best peer kernel"]),
                r["kernel vs best"],
            )
        )
    return rows


def headline_rows() -> list:
    data = {}
    for name, _, _ in NORMS:
        with open(os.path.join(RESULTS, f"{name}_h100.json")) as f:
            data[name] = {(r["shape"], r["phase"]): r for r in json.load(f)["rows"]}
    titles = {name: title for name, _, title in NORMS}
    rows = []
    for op, shape, phase in HEADLINE:
        r = data[op][shape, phase]
        rows.append(
            (
                titles[op],
                shape,
                phase,
                f"{gbps(r['rtcnorm'])} ({pct(r['rtcnorm'], r['copy'])})",
                f"{gbps(r['best_peer'])} {r['peer']}",
                f"{r['kern_us']:.1f}",
                f"{r['peer_kern_us']:.1f} {r['kpeer']}",
                f"{r['kern best/rtc']:.2f}x",
            )
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anchors", default=None, help="a markdown file of peer anchors (bold best-peer cells)")
    p.add_argument("--headline", action="store_true", help="print the README's small table instead")
    args = p.parse_args()
    if args.headline:
        print(table(HEADLINE_HEAD, headline_rows()))
        return
    anchors = load_anchors(args.anchors)
    for name, tag, title in NORMS:
        print(f"**{title}, bf16, NVIDIA H100**\n")
        print(table(NORM_HEAD, norm_rows(name, tag, anchors)) + "\n")
    print("**Softmax family, bf16, NVIDIA H100**\n")
    print(table(SOFTMAX_HEAD, softmax_rows(anchors)))


if __name__ == "__main__":
    main()
