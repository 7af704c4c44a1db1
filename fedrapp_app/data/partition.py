"""Partitions of a split over clients: IID and Dirichlet(alpha) label skew, through flwr-datasets.

Both partitioners work on a tiny ``datasets.Dataset`` of (sample index, label) rows, so the images are never
touched. Labels are read here only to build the experiment's label skew (SPEC §6); nothing downstream of a
partition (methods, uploads, server) sees them.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedrapp_app.data.spec import DataSpec, validate_spec


def _labels_dataset(indices: np.ndarray, labels: np.ndarray):  # -> datasets.Dataset
    import datasets

    return datasets.Dataset.from_dict({"index": indices, "label": labels})


def _check_sizes(num_samples: int, spec: DataSpec) -> None:
    if num_samples == 0:
        raise ValueError("cannot partition an empty split: the source has no samples")
    if spec.num_clients > num_samples:
        raise ValueError(
            f"num-clients={spec.num_clients} exceeds the {num_samples} samples of the split: "
            "every client needs at least one sample; lower num-clients"
        )
    if spec.partition == "dirichlet" and spec.num_clients * spec.min_partition_size > num_samples:
        raise ValueError(
            f"min-partition-size={spec.min_partition_size} x num-clients={spec.num_clients} = "
            f"{spec.num_clients * spec.min_partition_size} exceeds the {num_samples} samples of the split; "
            "lower min-partition-size or num-clients"
        )


def _iid(labels: np.ndarray, spec: DataSpec) -> list[np.ndarray]:
    from flwr_datasets.partitioner import IidPartitioner

    # IidPartitioner cuts contiguous shards; shuffling first (seeded) makes them IID even when the split
    # is stored class by class.
    order = np.random.default_rng(spec.seed).permutation(len(labels))
    partitioner = IidPartitioner(num_partitions=spec.num_clients)
    partitioner.dataset = _labels_dataset(order, labels[order])
    return [np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64) for i in range(spec.num_clients)]


def _dirichlet(labels: np.ndarray, spec: DataSpec) -> list[np.ndarray]:
    from flwr_datasets.partitioner import DirichletPartitioner

    partitioner = DirichletPartitioner(
        num_partitions=spec.num_clients,
        partition_by="label",
        alpha=float(spec.dirichlet_alpha),
        min_partition_size=spec.min_partition_size,
        self_balancing=False,  # plain Dirichlet label skew (Hsu et al. 2019)
        shuffle=True,
        seed=spec.seed,
    )
    partitioner.dataset = _labels_dataset(np.arange(len(labels)), labels)
    try:
        with warnings.catch_warnings():
            # flwr warns on every redraw that misses the minimum size; the outcome is reported below.
            warnings.simplefilter("ignore", UserWarning)
            return [np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64) for i in range(spec.num_clients)]
    except ValueError as exc:
        if "attempts" not in str(exc):
            raise
        raise ValueError(
            f"could not draw a Dirichlet(dirichlet-alpha={spec.dirichlet_alpha}) partition of {len(labels)} "
            f"samples over num-clients={spec.num_clients} with at least min-partition-size="
            f"{spec.min_partition_size} samples each (11 draws with seed={spec.seed}); lower min-partition-size "
            "or num-clients, or raise dirichlet-alpha"
        ) from exc


def partition_indices(labels: np.ndarray, spec: DataSpec) -> list[np.ndarray]:
    """Split sample positions over ``spec.num_clients`` clients, seeded by ``spec.seed``.

    Parameters
    ----------
    labels : int [N], the label of every sample of the split.
    spec : uses ``num_clients``, ``partition`` ("iid" | "dirichlet"), ``dirichlet_alpha``,
        ``min_partition_size`` and ``seed``.

    Returns
    -------
    One sorted int64 array of sample positions per client; disjoint, covering [0, N), each at least
    ``min_partition_size`` long.
    """
    validate_spec(spec)
    labels = np.asarray(labels, dtype=np.int64)
    _check_sizes(len(labels), spec)
    parts = _iid(labels, spec) if spec.partition == "iid" else _dirichlet(labels, spec)
    return [np.sort(p) for p in parts]


def label_histograms(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """float [K, C]: each client's label distribution (rows sum to 1)."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]).astype(np.float64)
    return counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)


def label_skew(labels: np.ndarray, parts: list[np.ndarray], num_classes: int | None = None) -> float:
    """Mean total-variation distance between each client's label distribution and the global one.

    0 for identical distributions; close to 1 when every client holds classes the others barely have.
    """
    labels = np.asarray(labels, dtype=np.int64)
    classes = int(labels.max()) + 1 if num_classes is None else num_classes
    global_hist = np.bincount(labels, minlength=classes) / len(labels)
    return float(0.5 * np.abs(label_histograms(labels, parts, classes) - global_hist).sum(axis=1).mean())
