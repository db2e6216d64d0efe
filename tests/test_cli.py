"""The command line: ``python -m rtcnorm`` / ``rtcnorm`` (CPU; NVRTC compiles without a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import rtcnorm
import torch
from rtcnorm import cli, cli_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOFTMAX_64 = ["precompile", "--ops", "scaled_softmax", "--hidden-sizes", "64", "--dtypes", "fp32"]
SOFTMAX_64 += ["--archs", "sm_90", "--modes", "auto", "-q"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private, empty disk cache for one test."""
    monkeypatch.setenv("RTCNORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RTCNORM_DISABLE_DISK_CACHE", raising=False)
    # Kernels compiled earlier in this process are found in memory and not
    # written to a new cache folder; clearing forgets them.
    rtcnorm.jit.clear_cache()
    return tmp_path / "cache" / rtcnorm.__version__


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_info(capsys, cache):
    rc, out, err = run(capsys, "info")
    assert rc == 0 and err == ""
    assert out.startswith(f"rtcnorm {rtcnorm.__version__} ")
    assert f"torch   {torch.__version__}" in out
    nv = rtcnorm.jit.nvrtc_info()
    assert f"NVRTC   {nv['version']} at {nv['path']}" in out
    assert f"cache   {cache}: 0 kernels, 0 B" in out
    if not torch.cuda.is_available():
        assert "no GPU visible" in out


def test_precompile_cache_stats_verify_clear(capsys, cache):
    rc, out, err = run(capsys, *SOFTMAX_64)
    assert rc == 0, err
    assert out.startswith("4 kernels (4 compiled, 0 already cached)") and str(cache) in out
    rc, out, _ = run(capsys, *SOFTMAX_64)
    assert out.startswith("4 kernels (0 compiled, 4 already cached)")
    files = cli_cache.entry_files(str(cache))
    assert len(files) == 4 and all(os.path.dirname(f).endswith("sm_90") for f in files)

    rc, out, _ = run(capsys, "cache", "stats")
    assert rc == 0 and "sm_90          4 kernels" in out and "total          4 kernels" in out
    rc, out, _ = run(capsys, "cache", "verify")
    assert rc == 0 and out.strip() == f"checked 4 kernels in {cache}: all intact"

    # One flipped image byte, one truncated entry, one renamed entry.
    data = bytearray(open(files[0], "rb").read())
    data[len(data) // 2] ^= 0x40
    open(files[0], "wb").write(bytes(data))
    open(files[1], "r+b").truncate(100)
    moved = os.path.join(os.path.dirname(files[2]), "0" * 40 + ".bin")
    os.rename(files[2], moved)
    rc, out, _ = run(capsys, "cache", "verify")
    assert rc == 1
    assert f"bad: {files[0]}: checksum mismatch" in out
    assert f"bad: {files[1]}: size mismatch" in out or f"bad: {files[1]}: truncated" in out
    assert f"bad: {moved}: file name does not match its key" in out
    assert out.strip().endswith("3 bad")
    rc, out, _ = run(capsys, "cache", "verify", "--remove")
    assert rc == 1 and "3 bad (removed)" in out
    assert cli_cache.entry_files(str(cache)) == [files[3]]
    rc, out, _ = run(capsys, "cache", "verify")
    assert rc == 0

    rc, out, _ = run(capsys, "cache", "clear")
    assert rc == 0 and out.strip() == f"removed 1 kernels from {cache}"
    assert cli_cache.entry_files(str(cache)) == []


def test_verify_reads_garbage_as_bad(tmp_path):
    d = tmp_path / "sm_80"
    d.mkdir()
    (d / "a.bin").write_bytes(b"not a kernel")
    (d / "b.bin").write_bytes(b"RTCNORM1" + b"\xff" * 60)
    (d / "c.bin.lock").write_bytes(b"")
    checked, bad = cli_cache.verify(str(tmp_path))
    assert checked == 2
    assert dict((os.path.basename(p), why) for p, why in bad) == {
        "a.bin": "bad magic (not an rtcnorm cache entry)",
        "b.bin": "truncated",
    }


class FakePrecompile:
    """Records the calls; with ``progress`` in its signature when asked."""

    def __init__(self, with_progress: bool):
        self.calls = []
        self.with_progress = with_progress

    def __call__(self, op, *, hidden_sizes, dtypes, modes, archs, threads, **kw):
        self.calls.append(dict(op=op, hidden_sizes=list(hidden_sizes), dtypes=list(dtypes), archs=list(archs)))
        lines = [f"{op}_k<{n}, {d}> {a} compiled" for n in hidden_sizes for d in dtypes for a in archs]
        if "progress" in kw:
            for i in range(len(lines) + 1):
                kw["progress"](i, len(lines))
        # A kernel listed again, as found in memory, is counted once, as compiled.
        return lines + [lines[0].replace(" compiled", " cached")]

    @property
    def __signature__(self):
        import inspect

        params = [inspect.Parameter("op", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        names = ["hidden_sizes", "dtypes", "modes", "archs", "threads"] + (["progress"] if self.with_progress else [])
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in names]
        return inspect.Signature(params)


@pytest.mark.parametrize("with_progress", [True, False], ids=["progress_keyword", "per_size_bar"])
def test_precompile_from_model_config(capsys, cache, tmp_path, monkeypatch, with_progress):
    fake = FakePrecompile(with_progress)
    monkeypatch.setattr(rtcnorm.jit, "precompile", fake)
    cfg = {"model_type": "qwen3", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64}
    cfg |= {"rms_norm_eps": 1e-6, "dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, out, err = run(capsys, "precompile", "--model", str(tmp_path), "--archs", "sm_90", "sm_100")
    assert rc == 0, err
    assert "rms_norm at 64, 256" in err
    sizes = sorted(n for c in fake.calls for n in c["hidden_sizes"])
    assert sizes == [64, 256] and {c["op"] for c in fake.calls} == {"rms_norm"}
    assert all(c["dtypes"] == [torch.bfloat16] and c["archs"] == ["sm_90", "sm_100"] for c in fake.calls)
    assert len(fake.calls) == (1 if with_progress else 2)
    assert out.startswith("4 kernels (4 compiled, 0 already cached)")


def test_precompile_without_tqdm(capsys, cache, monkeypatch):
    fake = FakePrecompile(False)
    monkeypatch.setattr(rtcnorm.jit, "precompile", fake)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now fails
    rc, out, err = run(capsys, "precompile", "--hidden-sizes", "64", "128", "--ops", "layer_norm", "--archs", "sm_80")
    assert (rc, err) == (0, "")
    assert out.startswith("6 kernels (6 compiled, 0 already cached)")
    assert [c["hidden_sizes"] for c in fake.calls] == [[64], [128]]


@pytest.mark.parametrize(
    "cfg, expected",
    [
        ({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "layer_norm_epsilon": 1e-5}, {"layer_norm": [768]}),
        ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "rms_norm_eps": 1e-5}, {"rms_norm": [4096]}),
        ({"model_type": "gemma3", "text_config": {"hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256, "rms_norm_eps": 1e-6}}, {"rms_norm": [256, 2560]}),
        ({"model_type": "deepseek_v3", "hidden_size": 7168, "q_lora_rank": 1536, "kv_lora_rank": 512, "rms_norm_eps": 1e-6}, {"rms_norm": [512, 1536, 7168]}),
        ({"model_type": "bert", "hidden_size": 768, "layer_norm_eps": 1e-12}, {"layer_norm": [768]}),
    ],
    ids=["gpt2", "llama", "gemma3_text_config", "deepseek_v3", "bert"],
)  # fmt: skip
def test_sizes_from_config(cfg, expected):
    merged = {**cfg, **cfg.get("text_config", {})}
    assert cli.sizes_from_config(merged) == (expected, None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["precompile"], "rtcnorm precompile: error: give --hidden-sizes or --model (one of them)"),
        (["precompile", "--hidden-sizes", "0"], "argument --hidden-sizes: expected a positive integer, got '0'"),
        (["precompile", "--hidden-sizes", "64", "--dtypes", "int8"], "argument --dtypes: expected one of"),
        (["precompile", "--hidden-sizes", "64", "--archs", "ampere"], "expected an arch like sm_90, got 'ampere'"),
        (["precompile", "--hidden-sizes", "64", "--modes", "fast"], "expected auto or one of static_persistent"),
        (["precompile", "--model", "/nonexistent/config.json"], "--model: cannot read /nonexistent/config.json"),
        (["precompile", "--ops", "nosuch", "--hidden-sizes", "8", "--archs", "sm_90", "-q"], "unknown op 'nosuch'"),
        (
            ["precompile", "--hidden-sizes", "64", "--threads", "-1"],
            "argument --threads: expected a whole number, got '-1'",
        ),
        (["bench", "--shapes", "4096by4096"], "expected ROWSxHIDDEN such as 4096x4096, got '4096by4096'"),
        (["cache"], "the following arguments are required: ACTION"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_arguments_give_one_line(capsys, cache, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc in (1, 2) and out == ""
    assert len(err.splitlines()) == 1 and message in err, err


def test_model_config_errors(capsys, cache, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    rc, _, err = run(capsys, "precompile", "--model", str(bad))
    assert rc == 1 and err.startswith(f"rtcnorm precompile: error: --model: {bad} is not JSON")
    bad.write_text(json.dumps({"hidden_size": 64}))
    rc, _, err = run(capsys, "precompile", "--model", str(bad))
    assert rc == 1 and "the config names no norm epsilon" in err


@pytest.mark.parametrize(
    "argv", [[], ["info"], ["precompile"], ["cache"], ["cache", "stats"], ["cache", "verify"], ["bench"], ["tune"]]
)
def test_help_everywhere(capsys, argv):
    rc, out, _ = run(capsys, *argv, "--help")
    assert rc == 0 and out.startswith("usage: rtcnorm" + "".join(" " + a for a in argv))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_bench_without_gpu(capsys):
    rc, out, err = run(capsys, "bench", "--shapes", "128x256")
    assert (rc, out, err) == (1, "", "rtcnorm bench: error: bench needs a CUDA GPU and none is visible\n")


def test_tune_needs_shapes(capsys):
    rc, out, err = run(capsys, "tune")
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and "--shapes" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_tune_without_gpu(capsys):
    rc, out, err = run(capsys, "tune", "--shapes", "128x256")
    assert (rc, out, err) == (1, "", "rtcnorm tune: error: tune needs a CUDA GPU and none is visible\n")


@pytest.mark.gpu
def test_tune_on_gpu_prints_the_picked_and_tuned_times(capsys, cache):
    rc, out, err = run(capsys, "tune", "--shapes", "512x1000", "--ops", "rms_norm", "--reps", "3", "-q")
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[:3] for r in rows] == [["rms_norm", "512x1000", "fwd"], ["rms_norm", "512x1000", "bwd"]]
    # Times are not compared here (that is the benchmark's job): each row
    # holds two positive times and the gain they imply.
    for r in rows:
        picked, tuned, gain = float(r[3]), float(r[4]), float(r[5].rstrip("x"))
        assert picked > 0 and tuned > 0
        assert gain == pytest.approx(picked / tuned, abs=0.01 + 0.1 / tuned)


def test_module_entry_and_console_script(cache):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "rtcnorm", "tune"], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stdout == ""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"]["rtcnorm"] == "rtcnorm.cli:main"


@pytest.mark.gpu
def test_bench_on_gpu(capsys):
    rc, out, err = run(capsys, "bench", "--shapes", "1024x1024", "333x4097", "--dtype", "bf16")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("GB/s on ") and "bfloat16" in lines[0]
    rows = [line.split() for line in lines[3:]]
    assert [(r[0], r[1]) for r in rows] == [
        (op, s) for op in ("rms_norm", "layer_norm") for s in ("1024x1024", "333x4097")
    ]
    assert all(float(v) > 0 for r in rows for v in r[2:])
