"""The GPU shard runner (tests/run_gpu_shards.py): every test once, by file, evenly; one cache, no precompile."""

from __future__ import annotations

import pytest
from run_gpu_shards import deal, shard_env


def _ids(sizes: dict[str, int]) -> list[str]:
    return [f"tests/{f}.py::test_{k}" for f, n in sizes.items() for k in range(n)]


@pytest.mark.parametrize(
    "sizes,shards",
    [
        ({"a": 10, "b": 3, "c": 1}, 4),
        ({"a": 1}, 16),
        ({"a": 500, "b": 499, "c": 7, "d": 2, "e": 1}, 16),
        ({f"f{k}": k + 1 for k in range(40)}, 7),
    ],
)
def test_every_test_once_in_file_chunks_evenly(sizes, shards):
    ids = _ids(sizes)
    out = deal(ids, shards)
    assert sorted(i for s in out for i in s) == sorted(ids)
    assert 1 <= len(out) <= shards and all(out)
    share = -(-len(ids) // shards)
    # Largest-first onto the least loaded shard: no shard exceeds the mean by more than one chunk.
    assert max(map(len, out)) <= len(ids) / len(out) + share
    # By file: a (shard, file) pair for each chunk at most, where dealing test by test gives one for
    # nearly every shard and file.
    chunks = sum(-(-n // share) for n in sizes.values())
    assert sum(len({i.split("::")[0] for i in s}) for s in out) <= chunks


def test_shards_share_one_cache_and_compile_on_demand(monkeypatch, tmp_path):
    """conftest.py's session precompile (every core) must not run in each shard at once."""
    monkeypatch.setenv("RTCNORM_TEST_PRECOMPILE", "1")
    monkeypatch.setenv("RTCNORM_CACHE_DIR", "/elsewhere")
    env = shard_env(str(tmp_path))
    assert env["RTCNORM_CACHE_DIR"] == str(tmp_path) and env["RTCNORM_TEST_PRECOMPILE"] == "0"
