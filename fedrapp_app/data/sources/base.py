"""``Source``: one labelled split, read lazily (labels up front, images only when a batch asks for them)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
from PIL import Image

from fedrapp_app.data.loader import Undecodable
from fedrapp_app.data.presets import DatasetPreset, clean_classnames


class Source(ABC):
    """A labelled split. ``labels()`` is cheap metadata; ``load(indices)`` decodes only those images.

    Attributes
    ----------
    classnames : cleaned class names; label ``c`` is ``classnames[c]``.
    template : zero-shot template with one ``{}`` (the preset's).
    templates : the preset's prompt ensemble (empty: the template alone).
    description : where the data comes from, for logs and errors.
    """

    classnames: list[str]
    template: str
    description: str
    templates: tuple[str, ...] = ()

    @abstractmethod
    def labels(self) -> np.ndarray:
        """int64 [N]: the label of every sample, in source order."""

    @abstractmethod
    def load(self, indices: Sequence[int] | np.ndarray) -> list[Image.Image | Undecodable]:
        """The RGB images of the given sample positions, in that order; a sample that cannot be decoded is an
        ``Undecodable`` (its name and the reason) in its place."""

    def __len__(self) -> int:
        return len(self.labels())

    @property
    def num_classes(self) -> int:
        return len(self.classnames)


def check_labels(labels: np.ndarray, num_classes: int, description: str) -> np.ndarray:
    """Return ``labels`` as int64 after checking they index ``num_classes`` class names."""
    labels = np.asarray(labels, dtype=np.int64)
    if num_classes == 0:
        raise ValueError(f"{description} has zero classes: no class names were found in the source")
    if labels.size == 0:
        raise ValueError(f"{description} has no samples")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise ValueError(
            f"{description}: labels span [{low}, {high}] but the source names {num_classes} classes; "
            "the label column and the class names do not match"
        )
    return labels


class ClassSubset(Source):
    """The samples of the kept classes of another source, relabelled 0..C'-1 (e.g. Caltech101 without
    its background class)."""

    def __init__(
        self, base: Source, keep: np.ndarray, classnames: list[str], template: str, templates: tuple[str, ...] = ()
    ) -> None:
        raw = base.labels()
        self._base = base
        self._rows = np.flatnonzero(keep[raw])
        new_label = np.cumsum(keep) - 1
        self._labels = new_label[raw[self._rows]].astype(np.int64)
        self.classnames = classnames
        self.template = template
        self.templates = tuple(templates)
        dropped = len(keep) - int(keep.sum())
        self.description = f"{base.description} without {dropped} dropped class(es)"
        check_labels(self._labels, len(classnames), self.description)

    def labels(self) -> np.ndarray:
        return self._labels

    def load(self, indices: Sequence[int] | np.ndarray) -> list[Image.Image | Undecodable]:
        return self._base.load(self._rows[np.asarray(indices, dtype=np.int64)])


def with_preset(source: Source, preset: DatasetPreset) -> Source:
    """Apply a preset to a freshly read source: CoOp's class-name cleaning and the zero-shot template.

    Classes the preset drops disappear with their samples (``ClassSubset``).
    """
    names, keep = clean_classnames(preset, source.classnames)
    if not names:
        raise ValueError(f"{source.description} has zero classes after cleaning the class names")
    if keep.all():
        source.classnames = names
        source.template = preset.template
        source.templates = preset.ensemble
        return source
    return ClassSubset(source, keep, names, preset.template, preset.ensemble)
