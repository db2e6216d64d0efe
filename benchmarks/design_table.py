"""Tables of a design sweep (new_*.json / old_*.json as written by the sweep
driver): per shape and direction, % of copy of the planner's pick, of the
previous planner's pick and of the best forced candidate, and which designs
beat every other design by 3% or more.

    python3 benchmarks/design_table.py SWEEP_DIR OUT_PREFIX
"""

from __future__ import annotations

import glob
import json
import statistics
import sys


def load(d: str, prefix: str) -> dict:
    rows = {}
    for f in sorted(glob.glob(f"{d}/{prefix}_*.json")):
        for r in json.load(open(f)):
            rows[(r["op"], r["M"], r["N"])] = r
    return rows


def main(d: str, out: str) -> None:
    new, old = load(d, "new"), load(d, "old")
    lines = [
        "| op | shape | dir | pick % of copy | previous planner | best forced | pick / best | best design |",
        "|---|---|---|---|---|---|---|---|",
    ]
    records, wins = [], {}
    for key, r in sorted(new.items(), key=lambda kv: (kv[0][0], kv[0][1] * kv[0][2])):
        for direction, streams in (("fwd", 1.0), ("bwd", 1.5)):
            ents = [e for e in r[direction] if "ms" in e and e.get("design")]
            o = old.get(key, {}).get(direction) or []
            if not ents or not o:
                continue
            pct = lambda ms, s=streams, c=r["copy_ms"]: 100 * s * c / ms  # noqa: E731
            pick, best = ents[0], min(ents, key=lambda e: e["ms"])
            per = {}
            for e in ents:
                per[e["design"]] = min(per.get(e["design"], 1e9), e["ms"])
            for des, ms in per.items():
                others = [m for dd, m in per.items() if dd != des]
                if others and ms * 1.03 <= min(others):
                    wins.setdefault(f"{direction} {des}", []).append(f"{key[0]} {key[1]}x{key[2]}")
            rec = {
                "op": key[0],
                "M": key[1],
                "N": key[2],
                "dir": direction,
                "pick_pct": pct(pick["ms"]),
                "old_pct": pct(o[0]["ms"]),
                "best_pct": pct(best["ms"]),
                "best_design": best["design"],
                "best_knobs": best["knobs"],
                "pick_design": pick["design"],
                "pick_knobs": pick["knobs"],
                "max_rel_err": r.get(direction + "_err"),
            }
            records.append(rec)
            lines.append(
                f"| {key[0]} | {key[1]}x{key[2]} | {direction} | {rec['pick_pct']:.1f} | {rec['old_pct']:.1f} | "
                f"{rec['best_pct']:.1f} | {rec['pick_pct'] / rec['best_pct']:.2f} | {best['design']} |"
            )
    summary = []
    for direction in ("fwd", "bwd"):
        rs = [x for x in records if x["dir"] == direction]
        gm = lambda f, rs=rs: statistics.geometric_mean([f(x) for x in rs])  # noqa: E731
        summary.append(
            f"- {direction}: pick / previous planner {gm(lambda x: x['pick_pct'] / x['old_pct']):.3f} (geomean of "
            f"{len(rs)}), pick / best forced {gm(lambda x: x['pick_pct'] / x['best_pct']):.3f}; pick within 5% of "
            f"the best forced on {sum(x['pick_pct'] >= 0.95 * x['best_pct'] for x in rs)} of {len(rs)}"
        )
    for k, v in sorted(wins.items()):
        summary.append(
            f"- {k} beats every other design by 3%+ on {len(v)}: {', '.join(v[:6])}{' ...' if len(v) > 6 else ''}"
        )
    md = "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n"
    open(out + ".md", "w").write(md)
    json.dump({"records": records, "wins": wins}, open(out + ".json", "w"), indent=1)
    print("\n".join(summary))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
