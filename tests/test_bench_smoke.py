"""The benchmark scripts run end to end: a CPU dry run of each norm benchmark writes a
table whose rtcnorm and torch cells are numbers, and the harness's L2 reset is a
no-op without CUDA. Timings on a CPU mean nothing; only the plumbing is checked."""

import json
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks")


@pytest.mark.parametrize("script", ["bench_rms_norm.py", "bench_layer_norm.py"])
def test_norm_benchmark_dry_run_writes_a_table(script, tmp_path):
    out = tmp_path / "smoke"
    cmd = [sys.executable, os.path.join(BENCH, script), "--dry-run", "--device", "cpu", "--peers", "torch"]
    cmd += ["--jit", "none", "--modes", "none", "--out", str(out)]  # a dry run times its own tiny shapes
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    table = json.loads((tmp_path / "smoke.json").read_text())
    rows = table["rows"]
    assert {r["phase"] for r in rows} == {"fwd", "bwd"} and len({r["shape"] for r in rows}) >= 2
    for row in rows:
        for col in ("copy", "rtcnorm", "torch", "kern_us", "kern_us_torch"):
            assert isinstance(row[col], float) and row[col] > 0, (row["shape"], row["phase"], col, row.get(col))
    assert table["meta"]["peers"]["torch"] == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")
def test_l2_reset_is_a_no_op_without_cuda():
    sys.path.insert(0, BENCH)
    try:
        import harness

        harness.configure(device="cpu")
        harness.reset_persisting_l2()
        assert "cu_reset" not in harness._cache
    finally:
        sys.path.remove(BENCH)


def test_copy_rates_per_call_and_per_kernel_are_cached_numbers():
    sys.path.insert(0, BENCH)
    try:
        import harness

        if not torch.cuda.is_available():
            harness.configure(device="cpu", warmup=1.0, rep=2.0)
        call, kernel = harness.copy_gbps(1 << 20), harness.copy_kernel_gbps(1 << 20)
        assert call > 0 and kernel > 0
        assert harness.copy_kernel_gbps(1 << 20) == kernel  # measured once per size
    finally:
        sys.path.remove(BENCH)


def _table_rows(text: str) -> list[tuple[str, ...]]:
    """The cells of every markdown table row but the header rows."""
    out = []
    for line in text.splitlines():
        cells = tuple(c.strip() for c in line.strip().strip("|").split("|"))
        if line.startswith("| ") and cells[0] not in ("shape", "op"):
            out.append(cells)
    return out


def _printed(*args: str) -> str:
    run = subprocess.run(
        [sys.executable, os.path.join(BENCH, "readme_tables.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_readme_tables_are_the_committed_results():
    """Every row of docs/performance.md's bf16 tables is the row readme_tables.py prints
    from benchmarks/results/*_h100.json, bar the anchor column (read from a file outside
    the repository), and every result row is there; the README's headline table is
    the one ``--headline`` prints from the same files."""

    def without_anchor(rows):
        out = []
        for cells in rows:
            anchor = 6 if cells[1] in ("fwd", "bwd") else 7  # norm rows, softmax rows
            out.append(cells[:anchor] + cells[anchor + 1 :])
        return out

    printed = without_anchor(_table_rows(_printed()))
    with open(os.path.join(REPO, "docs", "performance.md")) as f:
        documented = without_anchor(_table_rows(f.read()))
    assert len(printed) == 23 * 2 * 2 + 15 * 2, len(printed)
    assert printed == documented

    headline = _table_rows(_printed("--headline"))
    with open(os.path.join(REPO, "README.md")) as f:
        readme = [r for r in _table_rows(f.read()) if r[0] in ("RMSNorm", "LayerNorm")]
    assert len(headline) >= 6 and headline == readme


def test_plot_draws_one_png_per_op_and_phase(tmp_path):
    """plot.py draws GB/s against N from a small result file in bench_*.py's format:
    one PNG per op and phase; the largest M at each N is the point drawn."""
    pytest.importorskip("matplotlib")
    sys.path.insert(0, BENCH)
    try:
        import plot

        rows = []
        for shape, scale in (("4x128", 0.5), ("64x128", 1.0), ("8x4096", 2.0)):
            for phase in ("fwd", "bwd"):
                rows.append(
                    {"shape": shape, "phase": phase, "copy": 100.0 * scale, "rtcnorm": 90.0 * scale}
                    | {"torch": 50.0 * scale, "compile": "-", "liger": "=" if phase == "bwd" else 70.0 * scale}
                )
        meta = {"gpu": "Test GPU", "args": {"dtypes": ["bf16"]}}
        (tmp_path / "rms_norm_t.json").write_text(json.dumps({"meta": meta, "rows": rows}))
        assert plot.series(rows, "fwd", "rtcnorm") == ([128, 4096], [90.0, 180.0])
        assert plot.series(rows, "bwd", "liger") == ([], [])
        assert plot.series(rows, "fwd", "compile") == ([], [])
        written = plot.plot_all(str(tmp_path), "t", str(tmp_path / "png"))
        assert sorted(os.path.basename(p) for p in written) == ["rms_norm_bwd_t.png", "rms_norm_fwd_t.png"]
        for p in written:
            with open(p, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        with pytest.raises(SystemExit, match="no rms_norm/layer_norm_missing.json"):
            plot.plot_all(str(tmp_path), "missing", str(tmp_path / "png"))
    finally:
        sys.path.remove(BENCH)
