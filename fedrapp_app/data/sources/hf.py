"""Hugging Face ``datasets`` sources: a Hub dataset, a local ``save_to_disk`` folder or parquet/arrow files.

The split stays memory-mapped Arrow on disk. Images are read with ``Image(decode=False)`` (encoded bytes or
paths) and decoded in the shared thread pool, so a batch costs one Arrow ``take`` plus parallel decodes.
Class names come from the label column's ``ClassLabel`` names (or the sorted values of a string column).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fedrapp_app.data.errors import unavailable
from fedrapp_app.data.loader import Undecodable, decode_many
from fedrapp_app.data.sources.base import Source, check_labels

AUTO = "auto"


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` folder."""
    return (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()


def has_table_files(path: Path) -> bool:
    """Whether ``path`` holds parquet or arrow files ``load_dataset`` can read offline."""
    return any(path.glob("**/*.parquet")) or any(path.glob("**/*.arrow"))


def _open(repo: str, split: str, what: str) -> Any:
    import datasets

    path = Path(repo).expanduser()
    if repo.startswith((".", "/", "~")) and not path.exists():
        # A path, not a Hub id: say so now instead of letting `datasets` ask the Hub for it.
        raise unavailable(what, f"reading the local dataset {path}", fix=[f"{path} does not exist"],
                          keys=("hf-repo", "data-dir"))  # fmt: skip
    try:
        if path.is_dir() and is_saved_dataset(path):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise ValueError(f"{path} has splits {sorted(loaded)}, not hf-split={split!r}")
                loaded = loaded[split]
            return loaded
        return datasets.load_dataset(str(path) if path.is_dir() else repo, split=split)
    except ValueError as exc:
        if "split" not in str(exc).lower():
            raise
        raise ValueError(f"{what}: {exc} (set hf-split)") from exc
    except Exception as exc:
        local = path.is_dir()
        raise unavailable(
            what,
            f"datasets.load_dataset({repo!r}, split={split!r})" + ("" if local else " from the Hugging Face Hub"),
            fix=[f"on a machine with network access: python -c \"import datasets; datasets.load_dataset("
                 f"'{repo}', split='{split}').save_to_disk('<folder>')\" and set hf-repo=<folder> (or data-dir)",
                 "or make the Hub reachable (datasets caches it under HF_HOME)"],
            keys=("hf-repo", "hf-split", "data-dir"),
            cause=exc,
        ) from exc  # fmt: skip


def _pick_column(features: Any, requested: str, kind: type, fallback: str, role: str, what: str) -> str:
    if requested != AUTO:
        if requested not in features:
            raise ValueError(f"{what}: no column {requested!r}; columns are {list(features)} (set hf-{role}-column)")
        return requested
    for name, feature in features.items():
        if isinstance(feature, kind):
            return name
    if fallback in features:
        return fallback
    raise ValueError(f"{what}: found no {role} column among {list(features)}; set hf-{role}-column")


class HuggingFaceSource(Source):
    """One split of a Hugging Face dataset (Hub id, ``save_to_disk`` folder or a folder of parquet files)."""

    def __init__(
        self,
        repo: str,
        split: str = "test",
        *,
        image_column: str = AUTO,
        label_column: str = AUTO,
        decode_workers: int = 4,
    ) -> None:
        import datasets

        self.description = f"Hugging Face dataset {repo} (split {split})"
        table = _open(repo, split, f"{repo} ({split} split)")
        features = table.features
        image_col = _pick_column(features, image_column, datasets.Image, "image", "image", self.description)
        label_col = _pick_column(features, label_column, datasets.ClassLabel, "label", "label", self.description)
        label_feature = features[label_col]
        # Only the label column is read (one Arrow column), never the images.
        values = np.asarray(table.select_columns([label_col]).with_format("numpy")[:][label_col])
        if isinstance(label_feature, datasets.ClassLabel):
            self.classnames = list(label_feature.names)
            labels = values
        elif values.dtype.kind in "USO":
            names, labels = np.unique(values.astype(str), return_inverse=True)
            self.classnames = [str(n) for n in names]
        else:
            raise ValueError(
                f"{self.description}: label column {label_col!r} is {label_feature} without class names; use a "
                "dataset whose label is a ClassLabel (or strings), or another source (coop, imagefolder)"
            )
        self.template = "a photo of a {}."
        self._labels = check_labels(labels, len(self.classnames), self.description)
        self._table = table.cast_column(image_col, datasets.Image(decode=False))
        self._image_col = image_col
        self._workers = decode_workers

    def labels(self) -> np.ndarray:
        return self._labels

    def load(self, indices: Sequence[int] | np.ndarray) -> list[Image.Image | Undecodable]:
        positions = [int(i) for i in np.asarray(indices)]
        rows = self._table[positions][self._image_col]
        payloads = [row["bytes"] if row.get("bytes") else row["path"] for row in rows]
        names = [row.get("path") or f"{self.description} row {i}" for row, i in zip(rows, positions, strict=True)]
        return decode_many(payloads, self._workers, names)
