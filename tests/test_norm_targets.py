"""benchmarks/norm_targets.py: the planner issue's targets read from saved records.

Synthetic records with known kernel times: each verdict follows from the
table of targets, never from the script's own arithmetic being re-derived."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import norm_targets as T  # noqa: E402


def rec(shape, phase, impl, kern_us, copy_gbps=4000.0, check=None):
    m, n = (int(v) for v in shape.split("x"))
    nbytes = (2 if phase == "fwd" else 3) * m * n * 2
    return {"op": "rms_norm", "shape": shape, "dtype": "bf16", "phase": phase, "impl": impl,
            "kern_us": kern_us, "bytes": nbytes, "copy": copy_gbps, "check": check}  # fmt: skip


SMALL, BIG = "32x4096", "16384x8192"  # below and above 64 MB of input


@pytest.mark.parametrize(
    "set_name,phase,shape,rtc,peer,want",
    [
        ("standard", "fwd", SMALL, 10.0, 10.0, "ok"),  # 1.00x is enough forward
        ("standard", "fwd", SMALL, 10.0, 9.0, "peer 0.90x < 1.00x"),
        ("standard", "bwd", SMALL, 10.0, 10.5, "peer 1.05x < 1.10x"),
        ("random", "bwd", SMALL, 10.0, 10.5, "ok"),  # 1.05x is the random set's bar
        ("random", "fwd", SMALL, 10.0, 9.8, "ok"),
        # 16384x8192 bwd moves 805 MB: at 4000 GB/s a copy takes 201 us.
        ("standard", "bwd", BIG, 210.0, 220.0, "ok"),  # under 1.10x but at 96% of copy
        ("standard", "bwd", BIG, 300.0, 400.0, "copy 67% < 85%"),
        ("standard", "fwd", BIG, 200.0, 150.0, "peer 0.75x < 1.00x, copy 67% < 90%"),
    ],
)
def test_verdicts_follow_the_targets(set_name, phase, shape, rtc, peer, want):
    cells = T.cells([rec(shape, phase, "rtcnorm", rtc), rec(shape, phase, "quack", peer)], set_name)
    assert [c["verdict"] for c in cells] == [want]
    assert cells[0]["best_peer"] == "quack" and cells[0]["vs_best"] == pytest.approx(peer / rtc)


def test_a_peer_that_failed_its_check_or_has_no_kernel_time_is_not_the_best():
    rows = [rec(SMALL, "fwd", "rtcnorm", 10.0), rec(SMALL, "fwd", "liger", 1.0, check="rel err 1e-1"),
            rec(SMALL, "fwd", "torch", None), rec(SMALL, "fwd", "compile", 12.0)]  # fmt: skip
    (cell,) = T.cells(rows, "standard")
    assert cell["best_peer"] == "compile" and "liger" not in cell and "torch" not in cell


def test_main_writes_markdown_and_refuses_empty_records(tmp_path):
    path = tmp_path / "r_records.json"
    path.write_text(json.dumps({"rows": [rec(SMALL, "fwd", "rtcnorm", 10.0), rec(SMALL, "fwd", "torch", 11.0)]}))
    md = tmp_path / "t.md"
    assert T.main([str(path), "--set", "standard", "--md", str(md)]) == 0
    text = md.read_text()
    assert "standard fwd: 1/1 cells meet their targets" in text and "| rms_norm | 32x4096 | fwd |" in text
    path.write_text(json.dumps({"rows": [rec(SMALL, "fwd", "torch", 11.0)]}))
    with pytest.raises(SystemExit):
        T.main([str(path), "--set", "standard"])
