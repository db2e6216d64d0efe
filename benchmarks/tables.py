"""Benchmark result tables: text, Markdown, CSV, JSON and a PNG plot.

Numbers stay numbers in CSV/JSON; text and Markdown round them. ``save`` writes
under benchmarks/results/ with the run's environment (harness.environment).
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# The run's environment saved beside every table: harness.environment, set by harness.
_environment = dict


def set_environment(fn) -> None:
    global _environment
    _environment = fn


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def _num(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    a = abs(v)
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 0.1 else f"{v:.3g}"


class Table:
    """Rows of named cells. Numbers stay numbers in CSV/JSON; text and Markdown round
    them, and columns in `pct_cols` also show their % of column `pct_of`."""

    def __init__(self, title: str, columns, *, pct_of: str | None = None, pct_cols=()):
        self.title, self.columns, self.rows = title, list(columns), []
        self.pct_of, self.pct_cols = pct_of, set(pct_cols)

    def add(self, row: dict) -> None:
        for k in row:
            if k not in self.columns:
                self.columns.append(k)
        self.rows.append(dict(row))

    def cell(self, row: dict, col: str) -> str:
        v = row.get(col)
        if v is None:
            return "-"
        if not _is_num(v):
            return str(v)
        ref = row.get(self.pct_of) if self.pct_of else None
        if col in self.pct_cols and _is_num(ref) and ref > 0:
            return f"{_num(v)} {100 * v / ref:.0f}%"
        return _num(v)

    def text(self) -> str:
        grid = [self.columns] + [[self.cell(r, c) for c in self.columns] for r in self.rows]
        widths = [max(len(row[i]) for row in grid) for i in range(len(self.columns))]
        lines = [self.title]
        for j, row in enumerate(grid):
            lines.append("  ".join(s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(row, widths))))
            if j == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def print(self) -> None:
        print("\n" + self.text(), flush=True)

    def markdown(self) -> str:
        out = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |"]
        out.append("|" + "---|" * len(self.columns))
        out += ["| " + " | ".join(self.cell(r, c) for c in self.columns) + " |" for r in self.rows]
        return "\n".join(out) + "\n"

    def save(self, name: str, *, plot: dict | bool | None = None, meta: dict | None = None) -> list[str]:
        """Write results/<name>.csv, .json and .md, plus .png when matplotlib imports.
        `plot` may name `y` (the columns plotted), `x` (the columns labelling a row;
        default the first), `facet` (one subplot per value), `ylabel` and `title`."""
        os.makedirs(RESULTS_DIR, exist_ok=True)
        base = os.path.join(RESULTS_DIR, name)
        with open(base + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns)
            w.writeheader()
            w.writerows(self.rows)
        with open(base + ".json", "w") as f:
            doc = {"title": self.title, "meta": {**_environment(), **(meta or {})}, "columns": self.columns}
            json.dump({**doc, "rows": self.rows}, f, indent=1, default=str)
        with open(base + ".md", "w") as f:
            f.write(self.markdown())
        paths = [base + ext for ext in (".csv", ".json", ".md")]
        if plot is False:
            return paths
        try:
            self._plot(base + ".png", **(plot or {}))
            paths.append(base + ".png")
        except ImportError:
            pass
        except Exception as e:
            print(f"plot {name}: {type(e).__name__}: {e}", file=sys.stderr)
        return paths

    def _plot(self, path: str, y=None, x=None, facet=None, ylabel: str = "", title: str | None = None) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        numeric = [c for c in self.columns if any(_is_num(r.get(c)) for r in self.rows)]
        ycols = list(y) if y else numeric
        labels = list(x) if x else [self.columns[0]]
        groups: dict = {}
        for r in self.rows:
            groups.setdefault(r.get(facet) if facet else "", []).append(r)
        if not groups or not ycols:
            return
        width = max(8.0, 0.45 * max(len(g) for g in groups.values()) + 4)
        fig, axes = plt.subplots(len(groups), 1, figsize=(width, 4.5 * len(groups)), squeeze=False)
        for ax, (key, rows) in zip(axes[:, 0], groups.items()):
            xs = list(range(len(rows)))
            for c in ycols:
                ys = [r.get(c) if _is_num(r.get(c)) else float("nan") for r in rows]
                if any(_is_num(v) for v in ys):
                    ax.plot(xs, ys, marker="o", ms=3, label=c, ls="--" if c == self.pct_of else "-")
            ax.set_xticks(xs)
            ax.set_xticklabels([" ".join(str(r.get(c, "")) for c in labels) for r in rows], rotation=60, ha="right")
            ax.tick_params(axis="x", labelsize=7)
            ax.set_title(f"{title or self.title.split(':')[0]} {key}".strip(), fontsize=9)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
