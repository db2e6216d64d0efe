"""The planner's picks today, priced by recorded measurements: no GPU needed.

`tune_table.py` records, per problem, the candidates `rtcnorm.tune` timed on
the GPU (design, knobs, device us). This script plans every recorded problem
again with the current planner (for the recorded GPU's arch and SM count) and
looks its pick up among that problem's timed candidates:

- within: the pick was timed, at most `--tolerance` over the fastest timed;
- miss: the pick was timed, slower than that;
- unmeasured: the pick is not among the timed candidates (a plan the
  recording never saw: a GPU run is needed to price it).

A cost-model change can be checked here before it reaches a GPU: the picks it
moves should land on faster recorded candidates. The recorded times are those
of the recording's tree, so kernels changed since make them stale.

Several recordings are merged per problem (op, dtype, direction, shape, GPU):
a problem in more than one takes the last file's cell whole, never a mix, as
their timers may differ (tune's CUDA events include the gaps between a call's
kernels, a profiler's kernel sum does not: up to 2.7x apart on 3 us problems).
By default: the tune recording, then the backward sweeps of
`bwd_occupancy_h200.json` (docs/history.md entry 99).

    python benchmarks/replay_picks.py [RECORDING ...] [--md out.md]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from tune_table import DTYPES
from tune_table_report import choice_text

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = [os.path.join(HERE, "results", name) for name in ("default_vs_tuned_h200.json", "bwd_occupancy_h200.json")]


def merged(docs: list[dict]) -> dict:
    """One recording of several: a problem recorded more than once takes the last file's cell."""
    cells: dict = {}
    for doc in docs:
        for c in doc["cells"]:
            cells[(c["op"], c["dtype"], c["direction"], c["rows"], c["n"], c.get("arch"), c.get("sm_count"))] = c
    return {"cells": list(cells.values())}


def load(paths: list[str]) -> dict:
    """The recordings at `paths`, merged in that order."""
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    return merged(docs)


def replay(doc: dict, tolerance: float = 1.05) -> list[dict]:
    """One row per recorded cell: its pick today and the verdict above."""
    import rtcnorm
    import torch

    rows = []
    for c in doc["cells"]:
        timed = {(d, json.dumps(k, sort_keys=True)): us for d, k, us in c.get("candidates") or []}
        row = {k: c[k] for k in ("op", "dtype", "direction", "set")} | {"shape": f"{c['rows']}x{c['n']}"}
        if not timed:
            rows.append(row | {"verdict": "no candidates"})
            continue
        dtype, arch = getattr(torch, DTYPES[c["dtype"]]), c.get("arch", "sm_90")
        plan = rtcnorm.explain(c["op"], (c["rows"], c["n"]), dtype, device="cpu", arch=arch,
                               sm_count=c.get("sm_count", 132))  # fmt: skip
        plan = plan if c["direction"] == "fwd" else plan["backward"]
        (best_key, best_us) = min(timed.items(), key=lambda kv: kv[1])
        us = timed.get((plan["design"], json.dumps(plan["knobs"], sort_keys=True)))
        row |= {"pick": plan["design"], "knobs": plan["knobs"], "best": best_key[0],
                "best_knobs": json.loads(best_key[1]), "best_us": best_us}  # fmt: skip
        if us is None:
            row["verdict"] = "unmeasured"
        else:
            row |= {"pick_us": us, "ratio": us / best_us}
            row["verdict"] = "within" if us <= tolerance * best_us else "miss"
        rows.append(row)
    return rows


def summary(rows: list[dict], tolerance: float) -> str:
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("within", "miss", "unmeasured", "no candidates")}
    timed = counts["within"] + counts["miss"]
    return (
        f"{counts['within']} of {timed} timed picks within {tolerance:.2f}x of the fastest timed candidate; "
        f"{counts['miss']} misses, {counts['unmeasured']} picks never timed, {counts['no candidates']} cells "
        f"without candidates ({len(rows)} cells)"
    )


def by_direction(rows: list[dict]) -> str:
    """Per direction: timed picks, their geometric mean and worst ratio to the fastest timed
    candidate (one figure a cost-model change should lower)."""
    parts = []
    for d in ("fwd", "bwd"):
        ratios = [r["ratio"] for r in rows if r["direction"] == d and "ratio" in r]
        if ratios:
            mean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            parts.append(f"{d}: {len(ratios)} timed, geometric mean {mean:.4f}, worst {max(ratios):.3f}")
    return "; ".join(parts)


def _pick(r: dict) -> str:
    return choice_text({"design": r["pick"], "knobs": r["knobs"]})


def table(rows: list[dict]) -> str:
    head = "| op | dtype | dir | shape | pick | pick us | fastest timed | its us | ratio |\n|---|---|---|---|---|---|---|---|---|"
    body = [
        f"| {r['op']} | {r['dtype']} | {r['direction']} | {r['shape']} | {_pick(r)} | {r['pick_us']:.2f} | "
        f"{choice_text({'design': r['best'], 'knobs': r['best_knobs']})} | {r['best_us']:.2f} | {r['ratio']:.3f} |"
        for r in sorted((r for r in rows if r["verdict"] == "miss"), key=lambda r: -r["ratio"])
    ]
    return "\n".join([head, *body])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recordings", nargs="*", default=DEFAULTS, help="tune_table.py JSONs (cells with candidates)")
    ap.add_argument("--tolerance", type=float, default=1.05, help="a pick within this of the fastest is no miss")
    ap.add_argument("--md", default=None, help="also write the summary and the misses as Markdown here")
    a = ap.parse_args(argv)
    if a.tolerance < 1.0:
        ap.error(f"--tolerance must be at least 1.0, got {a.tolerance}")
    rows = replay(load(a.recordings), a.tolerance)
    never = [
        f"{r['op']} {r['dtype']} {r['direction']} {r['shape']}: {_pick(r)}"
        for r in rows
        if r["verdict"] == "unmeasured"
    ]
    text = summary(rows, a.tolerance) + "\n\n" + by_direction(rows) + "\n\nMisses:\n\n" + table(rows)
    text += "\n\nPicks never timed:\n\n" + "\n".join(f"- {n}" for n in never)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            names = ", ".join(f"`{os.path.basename(p)}`" for p in a.recordings)
            f.write(f"# Picks of today's planner, priced by {names}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
