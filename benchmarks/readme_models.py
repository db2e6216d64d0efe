"""Print the README's small end-to-end table from a merged bench_models.py result.

    python benchmarks/readme_models.py benchmarks/results/models_h100.json

One line per family, the step time of each implementation in each mode, and
rtcnorm.patch's speed-up over torch in the same mode; a cell that was not
measured reads "-" (its reason is in the full table, models_*.md). Nothing here
measures anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models_step import FAMILIES, IMPLS, MODES  # noqa: E402

NAMES = dict(qwen3="Qwen3", llama="Llama", gemma3="Gemma3", gpt2="GPT-2")
LABELS = dict(torch="torch", rtcnorm="rtcnorm.patch", liger="Liger")


def table(data: dict) -> str:
    metas, rows = data["meta"], data["rows"]
    if not rows:
        raise SystemExit("readme_models: the result has no rows")
    ok = {(r["family"], r["impl"], r["mode"]): r["step_ms"] for r in rows if r["status"] == "ok"}
    modes = [m for m in MODES if any(k[2] == m for k in ok)] or list(MODES[:1])
    m = next(iter(metas.values()))
    s = m["shape"]
    head = ["step, ms"]
    for mode in modes:
        suffix = "" if mode == "eager" else " (compile)"
        head += [LABELS[i] + suffix for i in IMPLS] + [f"rtcnorm.patch speed-up{suffix}"]
    lines = [
        f"One bf16 training step on {m['gpu']} (random init, hidden {s['hidden']}, {s['layers']} layers, "
        f"sequence {s['seq']}, batch {s['batch']}; torch {m['torch']}, transformers {m['transformers']}):"
        if m["dtype"] == "bf16"
        else f"One {m['dtype']} training step on {m['gpu']} (hidden {s['hidden']}, {s['layers']} layers):",
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    fams = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    for fam in fams:
        cells = [NAMES[fam]]
        for mode in modes:
            cells += [f"{ok[fam, i, mode]:.1f}" if (fam, i, mode) in ok else "-" for i in IMPLS]
            base, mine = ok.get((fam, "torch", mode)), ok.get((fam, "rtcnorm", mode))
            cells.append(f"{base / mine:.2f}x" if base and mine else "-")
        lines.append("| " + " | ".join(cells) + " |")
    by_hand = sorted({NAMES[r["family"]] for r in rows if r["impl"] == "liger" and "by hand" in r.get("note", "")})
    if by_hand:
        lines += [
            "",
            f"Liger has no patch for {', '.join(by_hand)}: its norms were swapped for Liger's modules by hand.",
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", help="the merged JSON (bench_models.py --merge ... --out PREFIX writes PREFIX.json)")
    a = p.parse_args(argv)
    try:
        with open(a.result) as f:
            data = json.load(f)
    except OSError as e:
        p.error(f"result: cannot read {a.result!r}: {e.strerror}")
    if not isinstance(data, dict) or not {"meta", "rows"} <= data.keys():
        p.error(f"result: {a.result!r} is not a merged bench_models.py result (no 'meta' and 'rows')")
    print(table(data), end="")


if __name__ == "__main__":
    main()
