"""Compares the softmax plans of two trees over a broad sweep, field by field.

    python3 tests/plan/softmax_plan_diff.py OLD_TREE [NEW_TREE]

Builds softmax_plan_dump.cpp against each tree's planner sources (no torch
extension build), compares per-(dtype, sk) digests of every plan field
(kernel key, cached, persistent, CTAs per SM cap, reuse runs, row blocks)
and prints the differing plans of the groups that differ. Exit status 1
when any plan differs. The sweep: sk 1..1100, every 7th to 4096, powers of
two and their neighbours, a geometric sweep of odd sk to 262144; 44 row
counts from 1 to 2^20; 3 dtypes; sm_80/90/100 with and without an SM count;
every variant (masks broadcast over 2..32 rows, causal with one and more
queries); aligned and unaligned vectors; row tensors as one flat array or
not (flat_row).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import pathlib
import subprocess
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
TORCH = pathlib.Path(torch.__file__).resolve().parent
OLD_SOURCES = ["csrc/ops/softmax_plan.cpp"]
NEW_SOURCES = [f"csrc/ops/softmax/plan/{f}.cpp" for f in ("designs", "cost_model", "planner", "explain")]
NEW_SOURCES.append("csrc/ops/softmax/kernels.cpp")


def build(tree: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    old = (tree / OLD_SOURCES[0]).exists()
    sources = [str(tree / s) for s in (OLD_SOURCES if old else NEW_SOURCES)]
    cmd = ["g++", "-O2", "-std=c++17", f"-DPLAN_API={1 if old else 2}", f"-I{tree / 'csrc'}", f"-I{TORCH / 'include'}"]
    cmd += [str(HERE / "softmax_plan_dump.cpp"), *sources, f"-L{TORCH / 'lib'}", "-lc10"]
    cmd += [f"-Wl,-rpath,{TORCH / 'lib'}", "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def run(binary: pathlib.Path, *args: str) -> list[str]:
    return subprocess.run([str(binary), *args], check=True, capture_output=True, text=True).stdout.splitlines()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=pathlib.Path)
    ap.add_argument("new", type=pathlib.Path, nargs="?", default=HERE.parent.parent)
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp"))
    ap.add_argument("--show", type=int, default=40, help="differing plans to print")
    args = ap.parse_args()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        bins = list(pool.map(build, (args.old, args.new), (args.work / "plan_old", args.work / "plan_new")))
        old_groups, new_groups = pool.map(lambda b: run(b, "groups"), bins)
    assert len(old_groups) == len(new_groups)
    plans = sum(int(g.split()[2]) for g in old_groups)
    differing = [a.split()[:2] for a, b in zip(old_groups, new_groups) if a != b]
    print(f"{plans} plans in {len(old_groups)} (dtype, sk) groups; {len(differing)} groups differ")
    shown = 0
    count = 0
    for dtype, sk in differing:
        old_lines, new_lines = (run(b, "group", dtype, sk) for b in bins)
        for a, b in zip(old_lines, new_lines):
            if a == b:
                continue
            count += 1
            if shown < args.show:
                print("old", a, "\nnew", b)
                shown += 1
    if differing:
        print(f"{count} plans differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
