"""The tuning tables shipped in the package: measured (design, knobs) of the
standard and random benchmark shapes on one GPU model, as
``benchmarks/tune_table.py --report --export-package`` writes them to
``rtcnorm/data/tuned_<gpu>.json``.

When CUDA initializes (torch's lazy init; at import if it already has), the
table of each visible GPU model is read, and every entry is kept as an
in-memory tuned choice for exactly its problem: op, rows, N and dtype with the
ops' default features (a weight of the input's dtype, and a bias for
layer_norm; contiguous rows; the forward in auto mode, the backward with every
gradient). A table is used only where its GPU name, SM count and rtcnorm
version all match; it never writes the disk cache and never replaces a choice
this process already knows (``rtcnorm.tune``'s, in memory or on disk). Reading
devices' names creates no CUDA context. An entry the catalogue rejects (a
design or knob of another build) is skipped.

``RTCNORM_TUNED_TABLE=0`` (or false/no/off) leaves the tables unread. The
planner never needs them: without one, every problem plans with the cost model.
The choices share the tuned store's limits: ``rtcnorm.tune`` forgets the
in-memory choices before it times (and seeds the tables again after), and a
process that meets more than 4,096 distinct problems starts the store over.
"""

from __future__ import annotations

import json
import os
import re
import warnings

import torch

from . import _C

ENV = "RTCNORM_TUNED_TABLE"
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
FORMAT = 1
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_seeded: set = set()  # GPU models whose table was read


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("0", "false", "no", "off")


def gpu_slug(name: str) -> str:
    """A file name for a GPU model: ``"NVIDIA H200"`` -> ``"h200"``, ``"NVIDIA H100 80GB HBM3"`` -> ``"h100-80gb-hbm3"``."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w != "nvidia"]
    return "-".join(words) or "gpu"


def read_table(gpu: str) -> dict | None:
    """The shipped table named after ``gpu``, or None where there is none."""
    path = os.path.join(DATA_DIR, f"tuned_{gpu_slug(gpu)}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def matching_entries(table: dict | None, gpu: str, sm_count: int, version: str) -> list[dict]:
    """The table's entries where it was made on this GPU model and rtcnorm version, else none."""
    if not isinstance(table, dict) or table.get("format") != FORMAT:
        return []
    if (table.get("gpu"), table.get("sm_count"), table.get("rtcnorm")) != (gpu, sm_count, version):
        return []
    return list(table.get("entries", []))


def seed_model(gpu: str, sm_count: int, arch: int, table: dict | None = None) -> int:
    """Keep the matching entries of ``gpu``'s table (read from the package when
    not given) as tuned choices of that model; returns how many were kept."""
    from . import __version__

    if table is None:
        table = read_table(gpu)
    kept, rejected = 0, []
    for e in matching_entries(table, gpu, sm_count, __version__):
        try:
            bias = e["op"] == "layer_norm"
            extra = 0 if e["direction"] == "fwd" else 1 | (2 if bias else 0)
            kept += _C._norm_seed_tuned(
                gpu,
                sm_count,
                arch,
                e["direction"],
                e["op"],
                int(e["rows"]),
                int(e["n"]),
                _DTYPES.get(e["dtype"], e["dtype"]),
                bias,
                extra,
                e["design"],
                dict(e["knobs"]),
            )
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            rejected.append(f"{e}: {err}")
    if rejected:
        warnings.warn(
            f"rtcnorm: {len(rejected)} entries of the {gpu} tuning table were skipped, e.g. {rejected[0]}",
            stacklevel=2,
        )
    return kept


def seed(refresh: bool = False) -> int:
    """Read the tables of the visible GPU models (each once, unless ``refresh``); returns the choices kept."""
    if not enabled():
        return 0
    kept, done = 0, set() if refresh else _seeded
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        model = (props.name, props.multi_processor_count, props.major * 10 + props.minor)
        if model in done:
            continue
        done.add(model)
        _seeded.add(model)
        kept += seed_model(*model)
    return kept


def _on_cuda_init() -> None:
    # Runs inside torch's CUDA initialization: an error here must not fail it.
    try:
        seed()
    except Exception as err:
        warnings.warn(f"rtcnorm: the shipped tuning table was not read ({err}); the cost model plans", stacklevel=2)


def install() -> None:
    """Read the tables when CUDA initializes (now, if it has)."""
    torch.cuda._lazy_call(_on_cuda_init)
