"""benchmarks/tune_table.py without a GPU: its arguments, the shard split, the
resume and budget rules, and the report merged from synthetic shard records
(the 5% summary, missing and failed cells, the shipped table's entries)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from rtcnorm import _C, tuned_table

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import tune_table as T  # noqa: E402
import tune_table_report as R  # noqa: E402

GPU = "NVIDIA H200"


def parse(*argv):
    return T.build_parser().parse_args(list(argv))


def test_shard_and_budget_parse():
    args = parse("--shard", "1/2", "--budget-s", "90.5", "--dtypes", "bf16,fp32,bf16")
    assert args.shard == (1, 2) and args.budget_s == 90.5 and args.dtypes == ["bf16", "fp32"]
    defaults = parse()
    assert defaults.shard == (0, 1) and defaults.budget_s is None and defaults.dtypes == ["bf16"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (("--shard", "2/2"), "--shard i/n needs n >= 1 and 0 <= i < n, got '2/2'"),
        (("--shard", "0/0"), "--shard i/n needs n >= 1 and 0 <= i < n, got '0/0'"),
        (("--shard", "half"), "--shard must look like i/n (e.g. 0/2), got 'half'"),
        (("--budget-s", "-5"), "--budget-s must be positive, got '-5'"),
        (("--budget-s", "soon"), "--budget-s must be a number of seconds, got 'soon'"),
        (("--dtypes", "bf16,int8"), "expected a comma list of bf16, fp16, fp32, got 'bf16,int8'"),
    ],
)
def test_bad_arguments_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert message in capsys.readouterr().err


def test_the_problems_cover_both_sets_and_the_shards_split_them_exactly():
    shapes = json.load(open(T.SHAPES_PATH))["norm"]
    unique = {tuple(s) for g in ("bandwidth", "narrow_rows", "model", "latency", "random") for s in shapes[g]}
    every = T.problems(["bf16", "fp16"], list(T.OPS), list(T.SETS))
    assert len(every) == 2 * 2 * len(unique) and len(unique) == 47
    assert {p["set"] for p in every} == {"standard", "random"}
    shards = [T.shard_of(every, (i, 3)) for i in range(3)]
    keys = [T.problem_key(p) for s in shards for p in s]
    assert sorted(keys) == sorted(T.problem_key(p) for p in every) and len(set(keys)) == len(keys)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def record(op, rows, n, direction, default_us, tuned_us, dtype="bf16", gpu=GPU, **extra):
    r = {"op": op, "dtype": dtype, "set": "standard", "rows": rows, "n": n, "direction": direction, "gpu": gpu}
    r.update({"sm_count": 132, "rtcnorm": "0.1.0", "torch": "2.11", "reps": 10})
    r["default"] = {"design": "register_row", "knobs": {"cta_threads": 128}, "us": default_us}
    r["tuned"] = {"design": "staged_row", "knobs": {"ring_stages": 2}, "us": tuned_us}
    r["ratio"] = default_us / tuned_us
    r.update(extra)
    return r


def same_pick(r):
    return {**r, "tuned": {**r["default"], "us": r["tuned"]["us"]}}


def write_lines(path, records, tail=""):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.write(tail)


def test_resume_skips_only_problems_with_both_directions_measured(tmp_path):
    path = tmp_path / "t.shard0of1.jsonl"
    failed = {"op": "rms_norm", "dtype": "bf16", "rows": 32, "n": 4096, "error": "RuntimeError: x"}
    records = [
        record("rms_norm", 4096, 1024, "fwd", 10, 10),
        record("rms_norm", 4096, 1024, "bwd", 20, 19),
        record("layer_norm", 4096, 1024, "fwd", 10, 10),
        {**failed, "direction": "fwd"},
        {**failed, "direction": "bwd"},
    ]
    write_lines(path, records, tail='{"op": "rms_norm", "dty')  # the line a killed run was writing
    assert T.done_problems(str(path)) == {("rms_norm", "bf16", 4096, 1024)}
    assert T.done_problems(str(tmp_path / "absent.jsonl")) == set()


def test_budget_refuses_a_step_longer_than_the_time_left():
    now = [0.0]
    b = T.Budget(100.0, clock=lambda: now[0])
    assert b.fits()
    now[0] = 30.0
    b.took(30.0)
    assert b.fits()  # 70 s left, steps of 30 s
    now[0] = 70.0
    assert not b.fits()  # 30 s left, less than 1.2 x 30 s
    assert T.Budget(None).fits() and T.Budget(None).left() == float("inf")


def run_report(tmp_path, *extra):
    assert T.main(["--report", "--out", str(tmp_path / "tt"), "--results-dir", str(tmp_path / "results"), *extra]) == 0


def test_report_merges_shards_and_counts_cells_within_five_percent(tmp_path):
    shard0 = [
        record("rms_norm", 4096, 1024, "fwd", 10.4, 10.0),  # 1.04: within
        record("rms_norm", 4096, 1024, "bwd", 12.0, 10.0),  # 1.20: a miss
        record("layer_norm", 32, 4096, "fwd", 5.0, 5.0, error="RuntimeError: out of memory"),
    ]
    shard1 = [
        record("layer_norm", 32, 4096, "fwd", 5.3, 5.0),  # 1.06: a miss; replaces the failure
        record("layer_norm", 32, 4096, "bwd", 9.0, 10.0, error="RuntimeError: boom"),
        same_pick(record("rms_norm", 1, 4096, "fwd", 3.0, 3.0)),
        record("rms_norm", 1, 4096, "fwd", 3.1, 3.0, gpu="NVIDIA H100 80GB HBM3"),
    ]
    write_lines(tmp_path / "tt.shard0of2.jsonl", shard0)
    write_lines(tmp_path / "tt.shard1of2.jsonl", shard1, tail='{"op"')
    run_report(tmp_path)
    body = json.loads((tmp_path / "results" / "default_vs_tuned_h200.json").read_text())
    s = body["summary"]
    assert body["gpu"] == GPU and s["expected"] == 2 * 2 * 47
    assert (s["measured"], s["within_5pct"]) == (4, 2)
    assert s["errors"] == [["layer_norm", "bf16", "bwd", 32, 4096, "RuntimeError: boom"]]
    assert len(s["missing"]) == s["expected"] - 5 and ["rms_norm", "bf16", "bwd", 1, 4096] in s["missing"]
    assert [w[:5] for w in s["worst"][:2]] == [
        ["rms_norm", "bf16", "bwd", 4096, 1024],
        ["layer_norm", "bf16", "fwd", 32, 4096],
    ]
    assert s["worst"][0][5] == pytest.approx(1.2)
    md = (tmp_path / "results" / "default_vs_tuned_h200.md").read_text()
    assert md.startswith("# Default pick vs tuned pick, NVIDIA H200")
    assert (
        "**Summary: 2 of 4 measured cells within 5% (188 expected, 183 missing, 1 failed); the tuned pick is the default's in 1.**"
        in md
    )
    assert "## rms_norm bwd bf16: 0 of 1 within 5%" in md
    assert (
        "| standard | 4096x1024 | register_row (cta_threads=128) | 12.00 | staged_row (ring_stages=2) | 10.00 | 1.200 **miss** |"
        in md
    )
    assert "| standard | 4096x1024 | missing |" in md  # layer_norm 4096x1024
    assert "| standard | 1x4096 | register_row (cta_threads=128) | 3.00 | same | 3.00 | 1.000 |" in md
    h100 = json.loads((tmp_path / "results" / "default_vs_tuned_h100-80gb-hbm3.json").read_text())
    assert h100["summary"]["measured"] == 1 and h100["cells"][0]["default"]["us"] == 3.1


def test_report_without_records_fails_and_says_where_it_looked(tmp_path, capsys):
    assert T.main(["--report", "--out", str(tmp_path / "none")]) == 1
    assert "no records in" in capsys.readouterr().err


def test_export_ships_measured_choices_that_differ_and_beat_the_default(tmp_path):
    write_lines(
        tmp_path / "tt.shard0of1.jsonl",
        [
            record("rms_norm", 4096, 1024, "bwd", 12.0, 10.0),
            record("rms_norm", 4096, 2048, "bwd", 10.1, 10.0),  # under --export-min-ratio's 1.02
            record("layer_norm", 32, 4096, "fwd", 5.0, 5.0, error="RuntimeError: boom"),
            same_pick(record("layer_norm", 1, 4096, "fwd", 5.0, 4.0)),  # nothing to ship
        ],
    )
    run_report(tmp_path, "--export-package", "--package-dir", str(tmp_path / "data"))
    table = json.loads((tmp_path / "data" / "tuned_h200.json").read_text())
    assert {k: table[k] for k in ("format", "gpu", "sm_count", "rtcnorm")} == {
        "format": 1,
        "gpu": GPU,
        "sm_count": 132,
        "rtcnorm": "0.1.0",
    }
    assert table["entries"] == [
        {
            "op": "rms_norm",
            "direction": "bwd",
            "rows": 4096,
            "n": 1024,
            "dtype": "bf16",
            "design": "staged_row",
            "knobs": {"ring_stages": 2},
        }
    ]


@pytest.mark.parametrize(
    "name,slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"), ("NVIDIA", "gpu")]
)
def test_the_report_and_the_package_name_a_gpu_alike(name, slug):
    assert R.gpu_slug(name) == slug == tuned_table.gpu_slug(name)


def test_run_appends_each_problem_as_measured_and_stops_at_the_budget(tmp_path, monkeypatch):
    """A fake clock advances 40 s a problem under a 100 s budget: two problems
    fit (the third would end past it), each written, a rerun resumes after them."""
    now = [0.0]
    monkeypatch.setattr(T.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(T, "device_meta", lambda device: {"gpu": GPU, "sm_count": 132, "rtcnorm": "0.1.0"})
    seen = []

    def fake_measure(p, args, meta):
        seen.append(T.problem_key(p))
        now[0] += 40.0
        return [record(p["op"], p["rows"], p["n"], d, 11.0, 10.0) for d in T.DIRECTIONS]

    monkeypatch.setattr(T, "measure", fake_measure)
    argv = ["--out", str(tmp_path / "tt"), "--shard", "1/4", "--budget-s", "100", "--compile-workers", "0"]
    argv += ["--ops", "layer_norm", "--no-progress"]
    assert T.main(argv) == 0
    path = tmp_path / "tt.shard1of4.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(seen) == 2 and len(lines) == 4 and [r["direction"] for r in lines] == ["fwd", "bwd"] * 2
    assert (
        seen == [T.problem_key(p) for p in T.shard_of(T.problems(["bf16"], ["layer_norm"], list(T.SETS)), (1, 4))][:2]
    )
    now[0] = 0.0
    assert T.main(argv) == 0
    assert len(seen) == 4 and len(set(seen)) == 4


def test_compile_phase_runs_tune_in_worker_processes_and_reports_their_failures(tmp_path, capfd):
    """Without a GPU every worker's tune() fails; each failure is reported, none stops the phase."""
    argv = ["--out", str(tmp_path / "tt"), "--phase", "compile", "--compile-workers", "2", "--no-progress"]
    argv += ["--sets", "standard", "--ops", "rms_norm", "--shard", "0/8"]
    assert T.main(argv) == 0
    err = capfd.readouterr().err
    todo = T.shard_of(T.problems(["bf16"], ["rms_norm"], ["standard"]), (0, 8))
    assert err.count("compile phase: rms_norm ") == len(todo) == 3
    assert "RuntimeError: rtcnorm.tune: needs a CUDA device" in err
    assert not (tmp_path / "tt.shard0of8.jsonl").exists()  # the compile phase measures nothing


@pytest.mark.gpu
def test_on_the_device_one_small_problem_runs_end_to_end(tmp_path):
    """rms_norm 1x4096 (the smallest standard shape: shard 22 of 23): the
    compile phase in a worker, tune(), the interleaved re-timing, the report."""
    import subprocess

    script = os.path.join(os.path.dirname(T.__file__), "tune_table.py")
    common = ["--out", str(tmp_path / "tt"), "--ops", "rms_norm", "--sets", "standard", "--no-progress"]
    run = [sys.executable, script, *common, "--shard", "22/23", "--compile-workers", "1", "--reps", "3"]
    done = subprocess.run(run + ["--confirm-rounds", "2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "tt.shard22of23.jsonl").read_text().splitlines()]
    assert [(r["rows"], r["n"], r["direction"]) for r in lines] == [(1, 4096, "fwd"), (1, 4096, "bwd")]
    for r in lines:
        assert "error" not in r and r["default"]["us"] > 0 and r["tuned"]["us"] > 0 and len(r["candidates"]) >= 1
        assert r["ratio"] == pytest.approx(r["default"]["us"] / r["tuned"]["us"])
    report = [sys.executable, script, "--report", *common, "--results-dir", str(tmp_path / "results")]
    done = subprocess.run(report, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    body = json.loads(next((tmp_path / "results").glob("default_vs_tuned_*.json")).read_text())
    assert body["summary"]["measured"] == 2 and body["summary"]["expected"] == 2 * 23


def fake_tune_report():
    def side(design, knobs, ms):
        return {"design": design, "knobs": knobs, "ms": ms}

    a, b = side("register_row", {"cta_threads": 128}, 0.010), side("staged_row", {"ring_stages": 2}, 0.008)
    return {d: {"picked": a, "best": b, "speedup": 1.25, "candidates": [a, b]} for d in T.DIRECTIONS}


def test_measure_records_the_retimed_pair_and_refuses_a_problem_tuned_on_disk(monkeypatch):
    import rtcnorm

    monkeypatch.setattr(rtcnorm, "tune", lambda *a, **k: fake_tune_report())
    monkeypatch.setattr(rtcnorm, "explain", lambda *a, **k: {"tuned": False, "backward": {"tuned": False}})
    monkeypatch.setattr(_C, "_norm_forget_tuned", lambda: None)
    pairs = []

    def fake_confirm(p, picks, device, reps, rounds):
        pairs.append((picks, rounds))
        return {d: {"default": 9.0, "tuned": 8.8} for d in T.DIRECTIONS}

    monkeypatch.setattr(T, "confirm", fake_confirm)
    p = {"op": "rms_norm", "dtype": "bf16", "set": "standard", "rows": 4096, "n": 1024}
    args = parse("--confirm-rounds", "2")
    fwd, bwd = T.measure(p, args, {"gpu": GPU})
    assert pairs[0][1] == 2 and pairs[0][0]["bwd"][1] == {"design": "staged_row", "knobs": {"ring_stages": 2}}
    assert fwd["default"] == {"design": "register_row", "knobs": {"cta_threads": 128}, "us": 9.0}
    assert bwd["tuned"]["us"] == 8.8 and bwd["ratio"] == pytest.approx(9.0 / 8.8)
    assert bwd["tune_us"] == {"default": pytest.approx(10.0), "tuned": pytest.approx(8.0)}
    plain = T.measure(p, parse("--confirm-rounds", "0"), {"gpu": GPU})[0]
    assert len(pairs) == 1 and plain["ratio"] == pytest.approx(1.25)
    monkeypatch.setattr(rtcnorm, "explain", lambda *a, **k: {"tuned": False, "backward": {"tuned": True}})
    with pytest.raises(RuntimeError, match="the disk cache holds a tuned choice for this problem"):
        T.measure(p, args, {"gpu": GPU})
