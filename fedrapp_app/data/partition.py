"""Partitions of a split over clients: IID and Dirichlet(alpha) label skew, through flwr-datasets.

Both partitioners work on a tiny ``datasets.Dataset`` of (sample index, label) rows, so the images are never
touched. Labels are read here only to build the experiment's label skew (SPEC §6); nothing downstream of a
partition (methods, uploads, server) sees them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from fedrapp_app.data.spec import DataSpec, validate_spec

log = logging.getLogger("flwr.fedrapp.data")
#: Environment variable naming the folder of cached partitions ('off' to turn the cache off).
PARTITION_CACHE_ENV = "FEDRAPP_PARTITION_CACHE"


def _labels_dataset(indices: np.ndarray, labels: np.ndarray):  # -> datasets.Dataset
    import datasets

    return datasets.Dataset.from_dict({"index": indices, "label": labels})


def _check_sizes(num_samples: int, spec: DataSpec) -> None:
    if num_samples == 0:
        raise ValueError("cannot partition an empty split: the source has no samples")
    if spec.num_clients > num_samples:
        raise ValueError(
            f"num-clients={spec.num_clients} exceeds the {num_samples} samples of the split: "
            f'every client needs at least one sample (fix: -c "num-clients={num_samples}" or fewer)'
        )
    if spec.partition == "dirichlet" and spec.num_clients * spec.min_partition_size > num_samples:
        fixes = [f'-c "min-partition-size={num_samples // spec.num_clients}"']
        if num_samples >= spec.min_partition_size:
            fixes.append(f'-c "num-clients={num_samples // spec.min_partition_size}"')
        fixes.append("-c \"partition='iid'\"")
        raise ValueError(
            f"min-partition-size={spec.min_partition_size} x num-clients={spec.num_clients} = "
            f"{spec.num_clients * spec.min_partition_size} exceeds the {num_samples} samples of the split "
            f"(fix: {', '.join(fixes[:-1])} or {fixes[-1]}: the largest that fit, or no minimum)"
        )


def _iid(labels: np.ndarray, spec: DataSpec) -> list[np.ndarray]:
    from flwr_datasets.partitioner import IidPartitioner

    # IidPartitioner cuts contiguous shards; shuffling first (seeded) makes them IID even when the split
    # is stored class by class.
    order = np.random.default_rng(spec.seed).permutation(len(labels))
    partitioner = IidPartitioner(num_partitions=spec.num_clients)
    partitioner.dataset = _labels_dataset(order, labels[order])
    return [np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64) for i in range(spec.num_clients)]


_REPAIR_KEY = 307  # SeedSequence key of the minimum-size repair (distinct from the other seeded draws)


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
            # flwr warns on every redraw that misses the minimum size; the outcome is handled below.
            warnings.simplefilter("ignore", UserWarning)
            return [np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64) for i in range(spec.num_clients)]
    except ValueError as exc:
        if "attempts" not in str(exc):
            raise
    # Many clients on a small pool: rejection sampling (11 draws) rarely meets the minimum. Take one more
    # draw without a minimum and top up the short clients from the largest ones (ours; see repair_min_size).
    free = DirichletPartitioner(
        num_partitions=spec.num_clients,
        partition_by="label",
        alpha=float(spec.dirichlet_alpha),
        min_partition_size=0,
        self_balancing=False,
        shuffle=True,
        seed=spec.seed,
    )
    free.dataset = _labels_dataset(np.arange(len(labels)), labels)
    parts = [np.asarray(free.load_partition(i)["index"], dtype=np.int64) for i in range(spec.num_clients)]
    return repair_min_size(parts, spec.min_partition_size, spec.seed)


def repair_min_size(parts: list[np.ndarray], minimum: int, seed: int) -> list[np.ndarray]:
    """Give every part at least ``minimum`` samples by moving samples out of the largest parts (ours).

    Short parts are filled in client order; each takes what it lacks from the currently largest part (never
    below ``minimum``), a seeded random choice of that part's samples. Few samples move (at most
    ``minimum`` per short client) and only out of the largest parts, so the label skew of the draw stays.
    Needs ``len(parts) * minimum <= total`` (checked before partitioning).
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, _REPAIR_KEY]))
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    for short in range(len(parts)):
        while len(parts[short]) < minimum:
            donor = int(np.argmax([len(p) for p in parts]))
            spare = len(parts[donor]) - minimum
            if donor == short or spare <= 0:
                raise ValueError(f"cannot give {len(parts)} clients {minimum} samples each")
            take = min(minimum - len(parts[short]), spare)
            moved = rng.choice(len(parts[donor]), size=take, replace=False)
            keep = np.ones(len(parts[donor]), dtype=bool)
            keep[moved] = False
            parts[short] = np.concatenate([parts[short], parts[donor][moved]])
            parts[donor] = parts[donor][keep]
    return parts


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


# -- the on-disk cache ------------------------------------------------------------------------------
# A deployed SuperNode without warm workers starts a new process per message; partitioning through
# flwr-datasets costs it ~1.5 s each time (mostly importing `datasets`). A partition is a pure function of
# the labels, the partition settings, this module's code and the libraries that draw it, so it is cached
# on disk under a hash of exactly those: a changed input is a different file, never a stale one.


def partition_cache_dir() -> Path | None:
    """The cache folder: ``$FEDRAPP_PARTITION_CACHE``, else ``$XDG_CACHE_HOME/fedrapp/partitions``
    (``~/.cache/...``); None when the variable is ``off``."""
    chosen = os.environ.get(PARTITION_CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("off", "0", "") else Path(chosen).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fedrapp" / "partitions"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def partition_key(labels: np.ndarray, spec: DataSpec) -> str:
    """SHA-256 (hex) of everything a partition depends on: the labels (values, dtype, shape), the partition
    settings and seed, this module's source, and the versions of numpy and flwr-datasets."""
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    digest = hashlib.sha256()
    settings = (spec.num_clients, spec.partition, float(spec.dirichlet_alpha), spec.min_partition_size, spec.seed)
    for part in (
        repr(settings).encode(),
        repr(labels.shape).encode(),
        labels.tobytes(),
        Path(__file__).read_bytes(),
        _version("numpy").encode(),
        _version("flwr-datasets").encode(),
    ):
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


def _valid(parts: list[np.ndarray], num_samples: int, spec: DataSpec) -> bool:
    """``parts`` is what ``partition_indices`` returns for these sizes: one sorted int64 array per client,
    disjoint, covering [0, num_samples), each at least the Dirichlet minimum."""
    if len(parts) != spec.num_clients or any(p.dtype != np.int64 or np.any(np.diff(p) <= 0) for p in parts):
        return False
    if spec.partition == "dirichlet" and min(len(p) for p in parts) < spec.min_partition_size:
        return False
    joined = np.sort(np.concatenate(parts))
    return len(joined) == num_samples and bool(np.array_equal(joined, np.arange(num_samples)))


def _read(path: Path, key: str, num_samples: int, spec: DataSpec) -> list[np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as stored:
            if str(stored["key"]) != key:
                return None
            parts = np.split(stored["indices"], np.cumsum(stored["sizes"])[:-1])
    except (OSError, ValueError, KeyError):
        return None
    return parts if _valid(parts, num_samples, spec) else None


def _write(path: Path, key: str, parts: list[np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, key=np.array(key), sizes=np.array([len(p) for p in parts]), indices=np.concatenate(parts))
        os.replace(temporary, path)  # atomic: a reader sees the old file or the whole new one
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


_WARNED: set[str] = set()


def cached_partition_indices(labels: np.ndarray, spec: DataSpec, cache_dir: Path | None) -> list[np.ndarray]:
    """``partition_indices(labels, spec)``, read from ``cache_dir`` when it holds this exact partition.

    A file that is unreadable, belongs to other inputs or fails the partition's invariants is recomputed and
    replaced. A folder that cannot be written costs the speed-up only (one warning per folder and process).
    """
    if cache_dir is None:
        return partition_indices(labels, spec)
    validate_spec(spec)
    key = partition_key(labels, spec)
    path = Path(cache_dir) / f"{key}.npz"
    cached = _read(path, key, len(labels), spec) if path.is_file() else None
    if cached is not None:
        return cached
    parts = partition_indices(labels, spec)
    try:
        _write(path, key, parts)
    except OSError as err:
        if str(cache_dir) not in _WARNED:
            _WARNED.add(str(cache_dir))
            log.warning(
                "partition cache %s is not writable (%s); partitions are recomputed in every process "
                "(set %s to a writable folder, or to 'off')",
                cache_dir,
                err,
                PARTITION_CACHE_ENV,
            )
    return parts
