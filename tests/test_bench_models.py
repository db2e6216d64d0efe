"""benchmarks/bench_models.py on the CPU: the smoke path of one family writes
every variant's row with its fields, the patched and unpatched models give the
same losses, the merge writes the table and plot, a variant that overruns its
time is killed and recorded, and bad arguments get a clear error."""

import json
import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks")

pytest.importorskip("transformers")


def _bench(*args, timeout=300):
    run = subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_models.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return run


@pytest.fixture
def bench_module():
    sys.path.insert(0, BENCH)
    try:
        import bench_models

        yield bench_models
    finally:
        sys.path.remove(BENCH)


def _liger_importable() -> bool:
    return (
        subprocess.run([sys.executable, "-c", "import liger_kernel.transformers"], capture_output=True).returncode == 0
    )


def test_smoke_run_of_one_family_writes_every_variant_and_losses_agree(tmp_path):
    pytest.importorskip("matplotlib")
    parts = tmp_path / "parts"
    # aot_eager: the compile mode's graphs without a C++ compiler run.
    run = _bench("--smoke", "--family", "qwen3", "--out-dir", str(parts), "--backend", "aot_eager", "--profile")
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads((parts / "qwen3.json").read_text())
    assert data["meta"]["family"] == "qwen3" and data["meta"]["shape"]["hidden"] == 64
    assert "running" not in data["meta"]
    rows = {(r["impl"], r["mode"]): r for r in data["rows"]}
    assert set(rows) == {(i, m) for i in ("torch", "rtcnorm", "liger") for m in ("eager", "compile")}
    for (impl, mode), r in rows.items():
        if impl == "liger" and r["status"] == "skipped":
            assert not _liger_importable() and "Liger is not importable" in r["reason"], r
            continue
        if impl == "liger" and r["status"] == "failed":  # its Triton kernels need a GPU
            assert _liger_importable() and r["reason"], r
            continue
        assert r["status"] == "ok", r
        assert r["family"] == "qwen3" and r["step_ms"] > 0 and r["host_ms"] > 0 and len(r["steps_ms"]) == 2
        assert r["peak_mb"] is None and r["first_step_s"] > 0 and r["build_s"] > 0 and r["wall_s"] > 0
        assert r["profile"]["wall_ms"] > 0 and r["profile"]["top_cpu"], r["profile"]
        assert (parts / r["profile_file"]).read_text().startswith("Top CPU")
        if mode == "compile":
            assert r["graphs"] == 1, r  # the decoder layers share one graph, no recompile
    for impl in ("rtcnorm", "liger"):
        patch = rows[impl, "eager"].get("patch")
        if impl == "rtcnorm":
            # one layer: input, post-attention, q and k norms, and the final norm
            assert patch["swapped"] == 5 and patch["skipped"] == 0 and patch["reasons"] == [], patch
            assert patch["kinds"] == {"Qwen3RMSNorm as rms_norm": 5}, patch
    # Same seeded weights and tokens: fp32 losses agree before and after AdamW steps.
    for mode in ("eager", "compile"):
        base, mine = rows["torch", mode], rows["rtcnorm", mode]
        assert mine["loss0"] == pytest.approx(base["loss0"], rel=1e-5, abs=1e-6)
        assert mine["loss"] == pytest.approx(base["loss"], rel=1e-4, abs=1e-5)
        assert base["loss0"] == pytest.approx(rows["torch", "eager"]["loss0"], rel=1e-5)

    run = _bench("--merge", str(parts), "--out", str(tmp_path / "models"), timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    merged = json.loads((tmp_path / "models.json").read_text())
    assert len(merged["rows"]) == 6 and set(merged["meta"]) == {"qwen3"}
    table = (tmp_path / "models.md").read_text()
    assert "| qwen3 | rtcnorm.patch | eager |" in table and "| qwen3 | torch | compile |" in table
    assert "- qwen3: 5 swapped (Qwen3RMSNorm as rms_norm x5), 0 skipped" in table
    assert (tmp_path / "models.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    readme = subprocess.run(
        [sys.executable, os.path.join(BENCH, "readme_models.py"), str(tmp_path / "models.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert readme.returncode == 0, readme.stderr
    line = next(x for x in readme.stdout.splitlines() if x.startswith("| Qwen3 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == 9 and float(cells[1]) == pytest.approx(rows["torch", "eager"]["step_ms"], abs=0.05)
    assert cells[4] == f"{rows['torch', 'eager']['step_ms'] / rows['rtcnorm', 'eager']['step_ms']:.2f}x"


def test_a_variant_that_overruns_its_share_is_killed_and_recorded(bench_module, tmp_path, monkeypatch):
    started = []

    class Hung(bench_module.Worker):
        @staticmethod
        def argv(family, a):
            return [sys.executable, "-c", "import time; time.sleep(120)"]

        def __init__(self, family, a):
            super().__init__(family, a)
            started.append(self.proc)

    monkeypatch.setattr(bench_module, "Worker", Hung)
    monkeypatch.setattr(bench_module, "FLOOR", dict(eager=0.0, compile=0.0))
    monkeypatch.setattr(bench_module, "MIN_START_S", 0.1)
    a = bench_module.parse_args(["--smoke", "--family", "gpt2", "--out-dir", str(tmp_path), "--budget", "3"])
    a.impls = ["torch", "rtcnorm"]
    t0 = time.monotonic()
    rows = bench_module.run_family("gpt2", a, dict(gpu="CPU"))
    assert time.monotonic() - t0 < 20
    assert [(r["impl"], r["mode"]) for r in rows] == [
        ("torch", "eager"),
        ("rtcnorm", "eager"),
        ("torch", "compile"),
        ("rtcnorm", "compile"),
    ]
    assert started and all(p.poll() is not None for p in started)  # killed, not left running
    first = rows[0]
    assert first["status"] == "skipped" and "did not finish within" in first["reason"] and "killed" in first["reason"]
    assert all(r["status"] == "skipped" and r["reason"].startswith("budget") for r in rows), rows
    saved = json.loads((tmp_path / "gpt2.json").read_text())
    assert saved["rows"] == rows and "running" not in saved["meta"]


def test_merge_reports_variants_a_stopped_runner_never_finished(bench_module, tmp_path):
    pytest.importorskip("matplotlib")
    meta = dict(family="llama", gpu="H100", dtype="bf16", steps=10, warmup=3, torch="2.11", transformers="5")
    meta.update(
        shape=dict(hidden=2048, layers=4, seq=2048, batch=4), running=dict(impl="rtcnorm", mode="compile", cap_s=90)
    )
    meta["variants"] = [[i, m] for m in ("eager", "compile") for i in ("torch", "rtcnorm")]
    ok = dict(status="ok", step_ms=40.0, host_ms=5.0, peak_mb=9000.0, first_step_s=2.0, loss0=10.4, loss=10.4)
    rows = [
        dict(ok, family="llama", impl="torch", mode="eager"),
        dict(ok, family="llama", impl="rtcnorm", mode="eager"),
    ]
    rows[1].update(
        step_ms=32.0, patch=dict(swapped=9, skipped=0, already=0, kinds={"LlamaRMSNorm as rms_norm": 9}, reasons=[])
    )
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "llama.json").write_text(json.dumps(dict(meta=meta, rows=rows)))
    import models_report

    table = models_report.merge(str(parts), str(tmp_path / "m"))
    assert (
        "| llama | rtcnorm.patch | eager | 32.0 | 1.25x | 5.0 | 9000 | 2.0 | 10.4000 | 9 swapped, 0 skipped |" in table
    )
    assert "- llama torch compile: skipped: the run was stopped during" not in table
    assert "- llama rtcnorm compile: skipped: the run was stopped during this variant (given 90 s)" in table
    assert "- llama torch compile: skipped: not reached" in table
    with pytest.raises(SystemExit, match="no <family>.json with rows in"):
        models_report.merge(str(tmp_path / "empty"), str(tmp_path / "x"))


def test_variant_share_grows_with_mode_weight_and_keeps_its_floor(bench_module):
    cap = bench_module.variant_cap
    todo = [("torch", "compile"), ("rtcnorm", "compile"), ("liger", "compile")]
    assert cap(270.0, todo) == pytest.approx(90.0)
    assert cap(600.0, todo) == pytest.approx(200.0)
    assert cap(50.0, todo) == 50.0  # never more than is left
    assert cap(600.0, [("torch", "eager"), ("torch", "compile")]) == pytest.approx(150.0)
    assert cap(100.0, [("torch", "eager"), ("torch", "compile")]) == 60.0  # the eager floor


@pytest.mark.parametrize(
    "args, message",
    [
        (["--merge", "x"], "--merge needs --out"),
        (["--family", "qwen3"], "give --family and --out-dir"),
        (["--family", "bert", "--out-dir", "x"], "invalid choice: 'bert'"),
        (["--smoke", "--family", "gpt2", "--out-dir", "x", "--steps", "0"], "--steps must be at least 1, got 1 and 0"),
    ],
)
def test_bad_arguments_get_a_clear_error(args, message):
    run = _bench(*args, timeout=120)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_readme_table_refuses_a_file_that_is_not_a_merged_result(tmp_path):
    bad = tmp_path / "part.json"
    bad.write_text(json.dumps([1, 2]))
    run = subprocess.run(
        [sys.executable, os.path.join(BENCH, "readme_models.py"), str(bad)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "is not a merged bench_models.py result" in run.stderr


@pytest.mark.slow
def test_gpu_driver_script_dry_run_on_cpu_merges_four_families(tmp_path):
    pytest.importorskip("matplotlib")
    env = dict(os.environ, NGPU="4", MODELS_ARGS="--smoke --device cpu --impls torch rtcnorm --modes eager")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python"), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        ["bash", os.path.join(BENCH, "run_models_gpu.sh"), str(tmp_path), "120"],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    merged = json.loads((tmp_path / "models.json").read_text())
    assert {(r["family"], r["impl"], r["status"]) for r in merged["rows"]} == {
        (f, i, "ok") for f in ("qwen3", "llama", "gemma3", "gpt2") for i in ("torch", "rtcnorm")
    }
    assert all(r["profile"]["top_cpu"] for r in merged["rows"])
    readme = (tmp_path / "readme_models.md").read_text()
    assert [x.split("|")[1].strip() for x in readme.splitlines() if x.startswith("| ") and "step" not in x] == [
        "Qwen3",
        "Llama",
        "Gemma3",
        "GPT-2",
    ]
    assert (tmp_path / "models.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("family, swapped", [("qwen3", 5), ("llama", 3), ("gemma3", 7), ("gpt2", 3)])
def test_liger_variant_patches_every_norm_where_liger_is_importable(bench_module, family, swapped):
    pytest.importorskip("liger_kernel.transformers")
    import models_step
    import torch

    model = models_step.build_model(family, models_step.SMOKE, torch.device("cpu"), torch.float32)
    params = {n: p.data_ptr() for n, p in model.named_parameters()}
    note = models_step.apply_impl(model, family, "liger")["note"]
    assert note.endswith(f"{swapped} norms") or note.startswith(f"no apply_liger_kernel_to_gpt2: {swapped} ")
    names = [m._get_name() for m in model.modules() if "Norm" in m._get_name()]
    assert len(names) == swapped and all(n.startswith("Liger") for n in names), names
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == params  # the same weights
