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


def test_readme_tables_are_the_committed_results():
    """Every row of the README's bf16 tables is the row readme_tables.py prints from
    benchmarks/results/*_h100.json, bar the anchor column (read from a file outside
    the repository), and every result row is in the README."""
    cmd = [sys.executable, os.path.join(BENCH, "readme_tables.py")]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]

    def rows(text):
        out = []
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| ") and cells[0] not in ("shape", "op"):
                anchor = 6 if cells[1] in ("fwd", "bwd") else 7  # norm rows, softmax rows
                out.append(tuple(cells[:anchor] + cells[anchor + 1 :]))
        return out

    printed = rows(run.stdout)
    with open(os.path.join(REPO, "README.md")) as f:
        readme = rows(f.read())
    assert len(printed) == 23 * 2 * 2 + 15 * 2, len(printed)
    assert printed == readme
