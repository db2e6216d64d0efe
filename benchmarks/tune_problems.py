"""The problems of the default-vs-tuned table (benchmarks/tune_table.py and
its report): every (dtype, op, set, shape) of bench_shapes.json's standard
and random sets, each shape once."""

from __future__ import annotations

import json
import os

SHAPES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_shapes.json")
SETS = {"standard": ("bandwidth", "narrow_rows", "model", "latency"), "random": ("random",)}
DIRECTIONS = ("fwd", "bwd")


def problems(dtypes, ops, sets, shapes_path: str = SHAPES_PATH) -> list[dict]:
    """Every (dtype, op, set, shape), each shape once, in a fixed order; largest first within a dtype and op."""
    with open(shapes_path) as f:
        norm = json.load(f)["norm"]
    shapes, seen = [], set()
    for name in sets:
        for group in SETS[name]:
            for m, n in norm[group]:
                if (int(m), int(n)) not in seen:  # a shape in two groups is one problem
                    seen.add((int(m), int(n)))
                    shapes.append((name, int(m), int(n)))
    out = []
    for dtype in dtypes:
        for op in ops:
            for name, m, n in sorted(shapes, key=lambda s: -s[1] * s[2]):
                out.append({"op": op, "dtype": dtype, "set": name, "rows": m, "n": n})
    return out
