"""tune_table.py --report: merge the shard files into one default-vs-tuned table per GPU.

Writes ``<results>/default_vs_tuned_<gpu>.md`` (a table per dtype, op and
direction: shape, the default and tuned (design, knobs) with their device
times, and default/tuned) and ``.json`` (every cell, the summary). A cell is
within target when the default takes at most 5% longer than the tuned pick.
Cells of the shape sets that no shard measured are listed as missing. With
``--export-package``, the tuned choices go to the shipped table
``python/rtcnorm/data/tuned_<gpu>.json`` (read by rtcnorm.tuned_table): those
that differ from the default and beat it by ``--export-min-ratio`` (1.02).
"""

from __future__ import annotations

import glob
import json
import os
import sys

from rtcnorm.tuned_table import gpu_slug
from tune_problems import DIRECTIONS, problems

TARGET = 1.05  # default time / tuned time, at most
WORST = 5  # cells named in the summary
PACKAGE_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "rtcnorm", "data")


def cell_key(r: dict) -> tuple:
    return (r["op"], r["dtype"], r["direction"], int(r["rows"]), int(r["n"]))


def merge(records: list[dict]) -> dict:
    """One record a cell: the last measured one, an error only where none was measured."""
    cells: dict = {}
    for r in records:
        k = cell_key(r)
        if "error" not in r or k not in cells or "error" in cells[k]:
            cells[k] = r
    return cells


def load(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # the line a killed run was writing
                    continue
    return rows


def expected_cells(dtypes, ops, sets) -> dict:
    """Every cell the shape sets ask for: key -> the set the shape belongs to."""
    return {
        (p["op"], p["dtype"], d, p["rows"], p["n"]): p["set"] for p in problems(dtypes, ops, sets) for d in DIRECTIONS
    }


def summarize(cells: dict, expected: dict) -> dict:
    measured = {k: r for k, r in cells.items() if "error" not in r}
    within = [k for k, r in measured.items() if r["ratio"] <= TARGET]
    worst = sorted(measured, key=lambda k: -measured[k]["ratio"])[:WORST]
    return {
        "expected": len(expected),
        "measured": len(measured),
        "within_5pct": len(within),
        "same_pick": sum(_same(r) for r in measured.values()),
        "missing": [list(k) for k in expected if k not in cells],
        "errors": [[*k, r["error"]] for k, r in cells.items() if "error" in r],
        "worst": [[*k, measured[k]["ratio"]] for k in worst],
    }


def _same(r: dict) -> bool:
    return (r["default"]["design"], r["default"]["knobs"]) == (r["tuned"]["design"], r["tuned"]["knobs"])


def choice_text(c: dict) -> str:
    """A design choice {design, knobs} as `design (knob=value ...)`."""
    knobs = " ".join(f"{k}={v}" for k, v in sorted(c["knobs"].items()))
    return f"{c['design']} ({knobs})" if knobs else c["design"]


def _row_order(k, expected: dict) -> tuple:
    return (expected[k] != "standard", -k[3] * k[4], k[3])


def _shape(k) -> str:
    return f"{k[3]}x{k[4]}"


def markdown(gpu: str, cells: dict, expected: dict, summary: dict, meta: dict) -> str:
    lines = [
        f"# Default pick vs tuned pick, {gpu}",
        "",
        f"rtcnorm {meta.get('rtcnorm')}, torch {meta.get('torch')}, {meta.get('sm_count')} SMs. "
        "`rtcnorm.tune` picks the winner; the default and the winner are then timed again in the same "
        "process on the same GPU, alternating, with tune()'s timing: device time (CUDA events after a "
        f"GPU spin), L2 flushed before each call, median of {meta.get('reps')} calls, median of the rounds. "
        "ratio = default us / tuned us (1 where the picks are the same); within target when ratio <= 1.05.",
        "",
        f"**Summary: {summary['within_5pct']} of {summary['measured']} measured cells within 5% "
        f"({summary['expected']} expected, {len(summary['missing'])} missing, {len(summary['errors'])} failed); "
        f"the tuned pick is the default's in {summary['same_pick']}.**",
    ]
    if summary["worst"]:
        worst = ", ".join(f"{w[0]} {w[1]} {w[2]} {w[3]}x{w[4]} {w[5]:.3f}" for w in summary["worst"])
        lines.append(f"Worst cells: {worst}.")
    groups = sorted({k[:3] for k in expected})
    for op, dtype, direction in groups:
        keys = sorted((k for k in expected if k[:3] == (op, dtype, direction)), key=lambda k: _row_order(k, expected))
        rows, n_in, n_meas = [], 0, 0
        for k in keys:
            r, where = cells.get(k), expected.get(k, "")
            if r is None:
                rows.append(f"| {where} | {_shape(k)} | missing | | | | |")
            elif "error" in r:
                rows.append(f"| {where} | {_shape(k)} | failed: {r['error'][:80].replace('|', '/')} | | | | |")
            else:
                n_meas += 1
                ok = r["ratio"] <= TARGET
                n_in += ok
                rows.append(
                    f"| {where} | {_shape(k)} | {choice_text(r['default'])} | {r['default']['us']:.2f} "
                    f"| {'same' if _same(r) else choice_text(r['tuned'])} | {r['tuned']['us']:.2f} "
                    f"| {r['ratio']:.3f}{'' if ok else ' **miss**'} |"
                )
        lines += [
            "",
            f"## {op} {direction} {dtype}: {n_in} of {n_meas} within 5%",
            "",
            "| set | shape | default (design, knobs) | default us | tuned (design, knobs) | tuned us | ratio |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    return "\n".join(lines) + "\n"


def table_entries(cells: dict, min_ratio: float) -> list[dict]:
    """The tuned choices worth shipping, as the table holds them: measured
    cells whose tuned pick differs from the default and beat it by
    ``min_ratio`` (the ops' defaults: weight, and bias for layer_norm)."""
    out = []
    for k, r in sorted(cells.items()):
        if "error" in r or _same(r) or r["ratio"] < min_ratio:
            continue
        op, dtype, direction, rows, n = k
        entry = {"op": op, "direction": direction, "rows": rows, "n": n, "dtype": dtype}
        out.append({**entry, "design": r["tuned"]["design"], "knobs": r["tuned"]["knobs"]})
    return out


def package_table(gpu: str, cells: dict, meta: dict, min_ratio: float) -> dict:
    return {
        "format": 1,
        "gpu": gpu,
        "sm_count": meta.get("sm_count"),
        "rtcnorm": meta.get("rtcnorm"),
        "entries": table_entries(cells, min_ratio),
    }


def report(args) -> int:
    paths = sorted(glob.glob(glob.escape(args.out) + ".shard*of*.jsonl"))
    records = load(paths)
    if not records:
        print(f"no records in {args.out}.shard*of*.jsonl", file=sys.stderr)
        return 1
    os.makedirs(args.results_dir, exist_ok=True)
    for gpu in sorted({r["gpu"] for r in records}):
        mine = [r for r in records if r["gpu"] == gpu]
        dtypes = sorted({r["dtype"] for r in mine} | set(args.dtypes))
        expected = expected_cells(dtypes, args.ops, args.sets)
        cells = {k: r for k, r in merge(mine).items() if k in expected}  # --ops / --sets narrow the report
        summary = summarize(cells, expected)
        meta = next((r for r in reversed(mine) if "error" not in r), mine[-1])
        base = os.path.join(args.results_dir, f"default_vs_tuned_{gpu_slug(gpu)}")
        with open(base + ".md", "w") as f:
            f.write(markdown(gpu, cells, expected, summary, meta))
        body = {"gpu": gpu, "summary": summary, "cells": [cells[k] for k in sorted(cells)]}
        with open(base + ".json", "w") as f:
            json.dump(body, f, indent=1)
        print(f"{base}.md: {summary['within_5pct']} of {summary['measured']} cells within 5%")
        if args.export_package:
            folder = args.package_dir or PACKAGE_DATA
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"tuned_{gpu_slug(gpu)}.json")
            with open(path, "w") as f:
                table = package_table(gpu, cells, meta, args.export_min_ratio)
                json.dump(table, f, indent=1)
            print(f"{path}: {len(table['entries'])} entries")
    return 0
