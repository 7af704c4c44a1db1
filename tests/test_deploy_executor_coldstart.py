"""The stock executor's cold start: the on-disk partition cache a fresh ClientApp process reads instead of
partitioning again (keyed by everything a partition depends on, validated, never stale)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedrapp_app.data import DataSpec, build_client_stream, clear_caches, partition_indices
from fedrapp_app.data import partition as partition_module
from fedrapp_app.data.partition import (
    PARTITION_CACHE_ENV,
    cached_partition_indices,
    partition_cache_dir,
    partition_key,
)


def _labels(n: int = 400, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


def _spec(**overrides) -> DataSpec:
    values = {"dataset": "custom", "data_dir": "/unused", "num_clients": 4, "min_partition_size": 5}
    return DataSpec(**{**values, **overrides})


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_a_cached_partition_is_the_computed_one_and_a_hit_computes_nothing(tmp_path, monkeypatch, partition):
    labels, spec = _labels(), _spec(partition=partition)
    first = cached_partition_indices(labels, spec, tmp_path)
    assert _same(first, partition_indices(labels, spec)) and len(list(tmp_path.glob("*.npz"))) == 1

    def refuse(*_args):
        raise AssertionError("a cache hit must not partition again")

    monkeypatch.setattr(partition_module, "partition_indices", refuse)
    assert _same(cached_partition_indices(labels, spec, tmp_path), first)


def test_the_key_changes_with_every_input_of_a_partition():
    labels, spec = _labels(), _spec()
    key = partition_key(labels, spec)
    assert partition_key(labels.copy(), _spec()) == key
    changed = labels.copy()
    changed[7] = (changed[7] + 1) % 10
    others = [
        partition_key(changed, spec),
        partition_key(labels[:-1], spec),
        partition_key(labels, _spec(seed=1)),
        partition_key(labels, _spec(num_clients=5)),
        partition_key(labels, _spec(dirichlet_alpha=0.5)),
        partition_key(labels, _spec(min_partition_size=6)),
        partition_key(labels, _spec(partition="iid")),
    ]
    assert len({key, *others}) == len(others) + 1
    # What only cuts the stream (batch size, sample cap, domains) shares the partition.
    assert partition_key(labels, _spec(batch_size=8, max_samples_per_client=20)) == key


def test_a_damaged_or_foreign_cache_file_is_recomputed_and_replaced(tmp_path):
    labels, spec = _labels(), _spec()
    expected = partition_indices(labels, spec)
    path = tmp_path / f"{partition_key(labels, spec)}.npz"
    path.write_bytes(b"not an npz file")
    assert _same(cached_partition_indices(labels, spec, tmp_path), expected)
    # A well-formed file that does not cover the samples (e.g. written by hand, or for another split).
    np.savez(path, key=np.array(partition_key(labels, spec)), sizes=np.array([1, 1, 1, 1]), indices=np.arange(4))
    assert _same(cached_partition_indices(labels, spec, tmp_path), expected)
    with np.load(path) as stored:  # replaced by the right partition
        assert stored["indices"].size == len(labels)


def test_an_unwritable_cache_costs_only_the_speed_up_with_one_warning(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    labels, spec = _labels(), _spec()
    with caplog.at_level(logging.WARNING, logger="flwr.fedrapp.data"):
        first = cached_partition_indices(labels, spec, blocker / "cache")
        second = cached_partition_indices(labels, _spec(seed=3), blocker / "cache")
    assert _same(first, partition_indices(labels, spec)) and _same(second, partition_indices(labels, _spec(seed=3)))
    warnings = [r for r in caplog.records if "not writable" in r.getMessage()]
    assert len(warnings) == 1 and PARTITION_CACHE_ENV in warnings[0].getMessage()


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(PARTITION_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert partition_cache_dir() == tmp_path / "xdg" / "fedrapp" / "partitions"
    monkeypatch.setenv(PARTITION_CACHE_ENV, str(tmp_path / "mine"))
    assert partition_cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(PARTITION_CACHE_ENV, "off")
    assert partition_cache_dir() is None


def test_streams_are_the_same_with_a_cold_and_a_warm_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(PARTITION_CACHE_ENV, str(tmp_path / "cache"))
    spec = DataSpec(num_clients=3, testbed_samples=120, batch_size=8, min_partition_size=5)
    clear_caches()
    cold = [build_client_stream(spec, c).order for c in range(3)]
    clear_caches()  # a new process: only the disk cache is left
    warm = [build_client_stream(spec, c).order for c in range(3)]
    clear_caches()
    monkeypatch.setenv(PARTITION_CACHE_ENV, "off")
    uncached = [build_client_stream(spec, c).order for c in range(3)]
    clear_caches()
    assert _same(cold, warm) and _same(cold, uncached)


def test_a_fresh_process_with_a_warm_cache_builds_its_stream_without_importing_datasets(tmp_path):
    code = (
        "import sys\n"
        "from fedrapp_app.data import DataSpec, build_client_stream\n"
        "spec = DataSpec(num_clients=2, testbed_samples=64, batch_size=8, min_partition_size=5)\n"
        "print(len(build_client_stream(spec, 1).order), 'datasets' in sys.modules, 'flwr_datasets' in sys.modules)\n"
    )
    env = {**os.environ, PARTITION_CACHE_ENV: str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    first, second = (r.stdout.split() for r in runs)
    assert first == [first[0], "True", "True"]  # the first process partitions (flwr-datasets)
    assert second == [first[0], "False", "False"]  # the next one reads the partition from disk
    assert len(list(Path(tmp_path / "cache").glob("*.npz"))) == 1
