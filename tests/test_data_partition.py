"""Partitions over clients: disjoint, covering, seeded, minimum size, and Dirichlet skew vs IID."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrapp_app.data import DataSpec, label_skew, partition_indices
from fedrapp_app.data.partition import repair_min_size


def balanced_labels(num_classes: int, per_class: int, seed: int = 0) -> np.ndarray:
    labels = np.repeat(np.arange(num_classes), per_class)
    return np.random.default_rng(seed).permutation(labels)


def spec(**overrides) -> DataSpec:
    return DataSpec(dataset="custom", data_dir="/unused", **overrides)


def assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n, "partitions must cover every sample exactly once"
    np.testing.assert_array_equal(np.sort(joined), np.arange(n))
    assert all(p.dtype == np.int64 for p in parts)


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_disjoint_covering_and_minimum_size(partition):
    labels = balanced_labels(20, 50)
    parts = partition_indices(labels, spec(partition=partition, num_clients=8, min_partition_size=30))
    assert len(parts) == 8
    assert_disjoint_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 30


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_seeded(partition):
    labels = balanced_labels(10, 40)
    a = partition_indices(labels, spec(partition=partition, num_clients=5, seed=3))
    b = partition_indices(labels, spec(partition=partition, num_clients=5, seed=3))
    c = partition_indices(labels, spec(partition=partition, num_clients=5, seed=4))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_is_balanced_even_when_the_split_is_sorted_by_class():
    labels = np.repeat(np.arange(10), 100)  # class after class, as many test splits are stored
    parts = partition_indices(labels, spec(partition="iid", num_clients=10, min_partition_size=0))
    assert {len(p) for p in parts} == {100}
    assert label_skew(labels, parts, 10) < 0.15


def mean_skew(labels: np.ndarray, partition: str, alpha: float = 0.1) -> float:
    """Mean label skew over three seeds."""
    specs = [spec(partition=partition, dirichlet_alpha=alpha, num_clients=8, seed=s) for s in range(3)]
    return float(np.mean([label_skew(labels, partition_indices(labels, s)) for s in specs]))


def test_dirichlet_skew_is_much_larger_at_alpha_0_1_than_iid():
    labels = balanced_labels(20, 100)
    iid = mean_skew(labels, "iid")
    skew_05, skew_01 = mean_skew(labels, "dirichlet", 0.5), mean_skew(labels, "dirichlet", 0.1)
    # Measured: IID ~0.10 (sampling noise of 250 samples per client), alpha 0.5 ~0.44, alpha 0.1 ~0.68.
    assert iid < 0.2
    assert skew_05 > iid + 0.2
    assert skew_01 > skew_05 + 0.1


def test_more_clients_than_samples():
    with pytest.raises(ValueError, match="num-clients=12 exceeds the 10 samples"):
        partition_indices(np.arange(10) % 2, spec(num_clients=12, min_partition_size=0))


def test_minimum_size_impossible_by_count():
    with pytest.raises(ValueError, match="min-partition-size=20 x num-clients=6"):
        partition_indices(balanced_labels(4, 25), spec(num_clients=6, min_partition_size=20))


def test_dirichlet_that_misses_the_minimum_size_is_repaired():
    # Possible by count (6 x 15 <= 100) but alpha = 0.01 gives each class to one client: a client without
    # a class has nothing, so the redraws fail; the repaired draw tops the short clients up.
    labels = balanced_labels(2, 50)
    parts = partition_indices(labels, spec(num_clients=6, dirichlet_alpha=0.01, min_partition_size=15))
    assert min(len(p) for p in parts) == 15 and sum(len(p) for p in parts) == 100


def test_single_client_gets_everything():
    labels = balanced_labels(3, 5)
    for partition in ("iid", "dirichlet"):
        (part,) = partition_indices(labels, spec(partition=partition, num_clients=1, min_partition_size=15))
        np.testing.assert_array_equal(part, np.arange(15))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 300),
    classes=st.integers(1, 12),
    clients=st.integers(1, 10),
    partition=st.sampled_from(["iid", "dirichlet"]),
    alpha=st.sampled_from([0.1, 0.5, 5.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_disjoint_and_covering(n, classes, clients, partition, alpha, seed):
    labels = np.random.default_rng(seed).integers(0, classes, n)
    s = spec(partition=partition, num_clients=clients, dirichlet_alpha=alpha, min_partition_size=0, seed=seed)
    if clients > n:
        with pytest.raises(ValueError, match="num-clients"):
            partition_indices(labels, s)
        return
    assert_disjoint_cover(partition_indices(labels, s), n)


def test_many_clients_on_a_small_pool_still_get_a_dirichlet_partition_with_the_minimum():
    # 11 rejection draws miss min-partition-size at this size; the repaired 12th draw meets it.
    spec = DataSpec(num_clients=300, dirichlet_alpha=0.1, min_partition_size=10, seed=4)
    labels = np.repeat(np.arange(30), 5120 // 30 + 1)[:5120]
    parts = partition_indices(labels, spec)
    assert min(len(p) for p in parts) >= 10
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))  # disjoint, covering
    assert label_skew(labels, parts) > 0.5  # still strongly label-skewed
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_indices(labels, spec), strict=True))


def test_the_minimum_size_repair_moves_samples_only_out_of_the_largest_parts():
    parts = [np.arange(0, 50), np.arange(50, 52), np.arange(52, 60), np.arange(60, 61)]
    repaired = repair_min_size(parts, minimum=5, seed=0)
    assert [len(p) for p in repaired] == [43, 5, 8, 5]
    assert set(np.concatenate(repaired[1:]).tolist()) - set(range(50, 61)) <= set(range(50))
    assert np.array_equal(np.sort(np.concatenate(repaired)), np.arange(61))
