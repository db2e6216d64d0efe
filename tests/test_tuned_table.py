"""The shipped tuning tables (rtcnorm.tuned_table): a table is used only on its
own GPU model and rtcnorm version, for exactly its problems, never over a
choice the process knows, and not at all with RTCNORM_TUNED_TABLE=0. The GPU
test checks that explain() on the device takes a seeded choice."""

from __future__ import annotations

import json
import os
import types

import pytest
import rtcnorm
import torch
from reference import assert_close, ref_rms_norm
from rtcnorm import _C, _tuning, tuned_table

H200 = ("NVIDIA H200", 132, 90)
H100 = ("NVIDIA H100 80GB HBM3", 132, 90)


def table(gpu=H200[0], sm_count=132, version=None, entries=None):
    return {
        "format": 1,
        "gpu": gpu,
        "sm_count": sm_count,
        "rtcnorm": version or rtcnorm.__version__,
        "entries": entries if entries is not None else [entry()],
    }


def entry(op="rms_norm", direction="fwd", rows=4096, n=1024, design="register_row", knobs=None):
    knobs = {"cta_threads": 256} if knobs is None else knobs
    return {"op": op, "direction": direction, "rows": rows, "n": n, "dtype": "bf16", "design": design, "knobs": knobs}


@pytest.mark.parametrize(
    "other",
    [
        {"gpu": "NVIDIA H100 80GB HBM3"},
        {"sm_count": 114},
        {"version": "0.0.1"},
    ],
)
def test_a_table_of_another_gpu_model_or_version_is_ignored(other):
    assert tuned_table.matching_entries(table(**other), *H200[:2], rtcnorm.__version__) == []


def test_a_table_of_another_format_or_none_is_ignored():
    assert tuned_table.matching_entries({**table(), "format": 2}, *H200[:2], rtcnorm.__version__) == []
    assert tuned_table.matching_entries(None, *H200[:2], rtcnorm.__version__) == []
    assert tuned_table.matching_entries(table(), *H200[:2], rtcnorm.__version__) == [entry()]


@pytest.fixture
def devices(monkeypatch, tmp_path):
    """Three visible GPUs (two H200s, one H100), the tables in tmp_path, and the binding recorded."""
    models = [H200, H200, H100]
    props = [types.SimpleNamespace(name=g, multi_processor_count=s, major=a // 10, minor=a % 10) for g, s, a in models]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(tuned_table, "DATA_DIR", str(tmp_path))
    monkeypatch.setattr(tuned_table, "_seeded", set())
    monkeypatch.delenv(tuned_table.ENV, raising=False)
    calls = []
    monkeypatch.setattr(_C, "_norm_seed_tuned", lambda *a: calls.append(a) or True)
    return tmp_path, calls


def test_each_visible_model_reads_its_own_table_once_for_exactly_its_entries(devices):
    folder, calls = devices
    mine = [entry(), entry("layer_norm", "bwd", 32, 4096, "staged_row", {"ring_stages": 2})]
    (folder / "tuned_h200.json").write_text(json.dumps(table(entries=mine)))
    (folder / "tuned_h100-80gb-hbm3.json").write_text(json.dumps(table(gpu=H100[0], version="0.0.1")))
    assert tuned_table.seed() == 2
    assert calls == [
        (*H200, "fwd", "rms_norm", 4096, 1024, "bfloat16", False, 0, "register_row", {"cta_threads": 256}),
        (*H200, "bwd", "layer_norm", 32, 4096, "bfloat16", True, 3, "staged_row", {"ring_stages": 2}),
    ]
    assert tuned_table.seed() == 0 and len(calls) == 2  # each model once
    assert tuned_table.seed(refresh=True) == 2 and len(calls) == 4


@pytest.mark.parametrize("value", ["0", "false", "No", " off "])
def test_the_switch_leaves_the_tables_unread(devices, monkeypatch, value):
    folder, calls = devices
    (folder / "tuned_h200.json").write_text(json.dumps(table()))
    monkeypatch.setenv(tuned_table.ENV, value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: pytest.fail("devices queried with the tables off"))
    assert tuned_table.seed() == 0 and calls == []


def test_no_table_for_a_model_seeds_nothing(devices):
    assert tuned_table.seed() == 0 and devices[1] == []


def test_a_failure_at_cuda_init_warns_and_never_raises(monkeypatch):
    monkeypatch.setattr(tuned_table, "seed", lambda: 1 / 0)
    with pytest.warns(UserWarning, match=r"the shipped tuning table was not read \(division by zero\)"):
        tuned_table._on_cuda_init()


def test_install_defers_to_cuda_initialization(monkeypatch):
    queued = []
    monkeypatch.setattr(torch.cuda, "_lazy_call", queued.append)
    tuned_table.install()
    assert queued == [tuned_table._on_cuda_init]


@pytest.fixture
def fresh_store(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("RTCNORM_CACHE_DIR", str(cache))
    monkeypatch.setenv(tuned_table.ENV, "0")  # CUDA's initialization seeds no shipped table into the test
    _C._norm_forget_tuned()
    yield
    _C._norm_forget_tuned()


def a_fwd_choice():
    c = rtcnorm.explain("rms_norm", (4096, 1024), torch.bfloat16)["candidates"][1]
    return c["design"], c["knobs"]


def test_a_seeded_choice_never_replaces_one_the_process_knows(fresh_store):
    design, knobs = a_fwd_choice()
    args = ("Test GPU", 7, 90, "fwd", "rms_norm", 4096, 1024, "bfloat16", False, 0, design, knobs)
    assert _C._norm_seed_tuned(*args) is True
    assert _C._norm_seed_tuned(*args) is False  # known now
    _C._norm_forget_tuned()
    assert _C._norm_seed_tuned(*args) is True


def test_every_shipped_h200_entry_differs_from_the_planners_own_pick():
    """An entry the cost model already picks is dead weight, and entries it beats
    were dropped when the model changed (docs/history.md entry 99): each entry
    of the shipped H200 table names a plan other than the planner's."""
    with open(os.path.join(tuned_table.DATA_DIR, "tuned_h200.json")) as f:
        table = json.load(f)
    assert table["gpu"] == H200[0] and len(table["entries"]) >= 30
    for e in table["entries"]:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[e["dtype"]]
        plan = rtcnorm.explain(e["op"], (e["rows"], e["n"]), dtype, device="cpu", arch="sm_90", sm_count=H200[1])
        plan = plan if e["direction"] == "fwd" else plan["backward"]
        assert (plan["design"], plan["knobs"]) != (e["design"], e["knobs"]), e


def test_entries_the_catalogue_rejects_are_skipped_with_a_warning(fresh_store):
    design, knobs = a_fwd_choice()
    entries = [entry(design=design, knobs=knobs), entry(n=2048, design="no_such_design")]
    with pytest.warns(UserWarning, match=r"1 entries of the Test GPU tuning table were skipped.*no_such_design"):
        assert tuned_table.seed_model("Test GPU", 7, 90, table("Test GPU", 7, entries=entries)) == 1


@pytest.mark.gpu
def test_on_the_device_a_seeded_choice_plans_exactly_its_problem(fresh_store):
    props = torch.cuda.get_device_properties(0)
    model = (props.name, props.multi_processor_count, props.major * 10 + props.minor)
    default = rtcnorm.explain("rms_norm", (4096, 1024), torch.bfloat16, device="cuda")
    other = next(c for c in default["candidates"] if (c["design"], c["knobs"]) != (default["design"], default["knobs"]))
    mine = table(model[0], model[1], entries=[entry(design=other["design"], knobs=other["knobs"])])
    assert tuned_table.seed_model(*model, table={**mine, "rtcnorm": "0.0.1"}) == 0
    assert tuned_table.seed_model(*model, table=mine) == 1
    e = rtcnorm.explain("rms_norm", (4096, 1024), torch.bfloat16, device="cuda")
    assert e["tuned"] and (e["design"], e["knobs"]) == (other["design"], other["knobs"])
    assert not e["backward"]["tuned"]
    assert not rtcnorm.explain("rms_norm", (4097, 1024), torch.bfloat16, device="cuda")["tuned"]
    assert not rtcnorm.explain("layer_norm", (4096, 1024), torch.bfloat16, device="cuda")["tuned"]
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    expected = ref_rms_norm(x, (1024,), w, 1e-6)["y"]
    assert_close(rtcnorm.rms_norm(x, 1024, w, 1e-6), expected, what="y under the seeded choice", dtype=x.dtype)


@pytest.mark.gpu
def test_a_choice_of_a_design_the_default_ranking_omits_is_still_planned(fresh_store):
    """tune() times each design under an override, which ranks every candidate
    (shared-memory rows also where registers hold the row): such a winner must
    plan too, not fall back silently to the cost model's pick."""
    props = torch.cuda.get_device_properties(0)
    model = (props.name, props.multi_processor_count, props.major * 10 + props.minor)
    default = rtcnorm.explain("rms_norm", (4096, 1024), torch.bfloat16, device="cuda")
    assert all(c["design"] != "smem_row" for c in default["candidates"])
    with _tuning.norm_override("fwd", "smem_row"):
        forced = rtcnorm.explain("rms_norm", (4096, 1024), torch.bfloat16, device="cuda")
    assert forced["design"] == "smem_row"
    mine = table(model[0], model[1], entries=[entry(design="smem_row", knobs=forced["knobs"])])
    assert tuned_table.seed_model(*model, table=mine) == 1
    e = rtcnorm.explain("rms_norm", (4096, 1024), torch.bfloat16, device="cuda")
    assert e["tuned"] and (e["design"], e["knobs"]) == ("smem_row", forced["knobs"])


@pytest.mark.gpu
def test_tune_keeps_the_shipped_choices_of_other_problems(fresh_store, monkeypatch, tmp_path):
    """tune() forgets the in-memory choices before timing and seeds the tables
    again after: a shipped choice of another problem survives it."""
    props = torch.cuda.get_device_properties(0)
    default = rtcnorm.explain("rms_norm", (4096, 1024), torch.bfloat16, device="cuda")
    other = next(c for c in default["candidates"] if (c["design"], c["knobs"]) != (default["design"], default["knobs"]))
    mine = table(props.name, props.multi_processor_count, entries=[entry(design=other["design"], knobs=other["knobs"])])
    (tmp_path / f"tuned_{tuned_table.gpu_slug(props.name)}.json").write_text(json.dumps(mine))
    monkeypatch.setattr(tuned_table, "DATA_DIR", str(tmp_path))
    monkeypatch.setenv(tuned_table.ENV, "1")
    assert tuned_table.seed(refresh=True) == 1
    rtcnorm.tune("rms_norm", (333, 1024), torch.bfloat16, reps=2, persist=False)
    e = rtcnorm.explain("rms_norm", (4096, 1024), torch.bfloat16, device="cuda")
    assert e["tuned"] and (e["design"], e["knobs"]) == (other["design"], other["knobs"])
    assert rtcnorm.explain("rms_norm", (333, 1024), torch.bfloat16, device="cuda")["tuned"]
