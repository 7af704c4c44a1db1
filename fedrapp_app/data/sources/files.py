"""Sources whose samples are image files on disk: a class-per-folder image folder and CoOp's layouts.

CoOp layouts (KaiyangZhou/CoOp, DATASETS.md and datasets/*.py):
- ``split_zhou_<Name>.json``: ``{"train"|"val"|"test": [[relative image path, label, class name], ...]}``,
  paths relative to the dataset's image folder (``images/``, ``jpg/``, ``101_ObjectCategories/`` ...);
- FGVC-Aircraft: ``variants.txt`` (class names, in label order) and ``images_variant_<split>.txt``
  (``<image id> <class name>`` lines) next to ``images/``;
- the ImageNet family: ``classnames.txt`` (``<wnid> <class name>`` lines) next to a folder with one
  sub-folder per class (ImageNetV2: folders ``0`` ... ``999`` in label order).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from fedrapp_app.data.errors import unavailable
from fedrapp_app.data.loader import Undecodable, decode_many
from fedrapp_app.data.presets import DatasetPreset
from fedrapp_app.data.sources.base import Source, check_labels

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
CLASSNAMES_FILE = "classnames.txt"
_WNID = re.compile(r"n\d{8}")


class FileListSource(Source):
    """Images given as file paths with their labels (what both folder layouts reduce to)."""

    def __init__(
        self,
        paths: Sequence[Path],
        labels: Sequence[int] | np.ndarray,
        classnames: list[str],
        description: str,
        *,
        decode_workers: int = 4,
    ) -> None:
        self.classnames = classnames
        self.template = "a photo of a {}."
        self.description = description
        self._labels = check_labels(np.asarray(labels), len(classnames), description)
        self._paths = [str(p) for p in paths]
        self._workers = decode_workers
        for probe in {self._paths[0], self._paths[-1]}:
            if not os.path.isfile(probe):
                raise unavailable(
                    description,
                    f"reading the image {probe}",
                    fix=["check that the images were extracted where the split file / folder expects them "
                         "(see docs/datasets.md for each dataset's layout)"],
                    keys=("data-dir",),
                )  # fmt: skip

    def labels(self) -> np.ndarray:
        return self._labels

    def load(self, indices: Sequence[int] | np.ndarray) -> list[Image.Image | Undecodable]:
        return decode_many([self._paths[int(i)] for i in np.asarray(indices)], self._workers)


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def _folder_order(names: list[str]) -> list[str]:
    # ImageNetV2's folders are 0..999: sort them as numbers, not as "0, 1, 10, 100, ...".
    if names and all(n.isdigit() for n in names):
        return sorted(names, key=int)
    return sorted(names)


def read_classnames_map(path: Path) -> list[tuple[str, str]]:
    """``classnames.txt`` lines as ``(key, name)``: ``"n01440764 tench"`` -> ``("n01440764", "tench")``."""
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, name = line.strip().partition(" ")
        if key:
            pairs.append((key, name.strip()))
    return pairs


def _names_for_folders(root: Path, folders: list[str], classnames_file: Path | None) -> list[str]:
    """Class names of the folders: from a ``classnames.txt`` (given, or next to them) if it covers them,
    else the folder names themselves."""
    candidates = [classnames_file] if classnames_file else [root / CLASSNAMES_FILE, root.parent / CLASSNAMES_FILE]
    for candidate in candidates:
        if not candidate.is_file():
            continue
        pairs = read_classnames_map(candidate)
        by_key = dict(pairs)
        if all(f in by_key for f in folders):
            return [by_key[f] for f in folders]
        if folders and all(f.isdigit() for f in folders) and max(int(f) for f in folders) < len(pairs):
            return [pairs[int(f)][1] if _WNID.fullmatch(pairs[int(f)][0]) else " ".join(pairs[int(f)])
                    for f in folders]  # fmt: skip
    if any(_WNID.fullmatch(f) for f in folders):
        raise unavailable(
            f"image folder {root}",
            f"naming its WordNet-id folders ({folders[0]}, ...)",
            fix=[f"put CoOp's ImageNet {CLASSNAMES_FILE} ('n01440764 tench' lines) in {root} or {root.parent}"],
            keys=("data-dir",),
        )
    return folders


def image_folder(root: str | Path, *, classnames_file: Path | None = None, decode_workers: int = 4) -> FileListSource:
    """A class-per-folder image folder (``root/<class>/**/<image>``): labels follow the sorted folders.

    Class names are the folder names, unless a ``classnames.txt`` (``classnames_file``, or one in ``root`` or
    its parent) maps them (ImageNet's WordNet ids, ImageNetV2's numbers) to names.
    """
    root = Path(root)
    if not root.is_dir():
        raise unavailable(f"image folder {root}", f"listing {root}", fix=[f"create {root}/<class name>/<images>"],
                          keys=("data-dir",))  # fmt: skip
    folders = _folder_order([d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith(".")])
    paths: list[Path] = []
    labels: list[int] = []
    for label, folder in enumerate(folders):
        files = sorted(p for p in (root / folder).rglob("*") if p.is_file() and _is_image(p))
        paths.extend(files)
        labels.extend([label] * len(files))
    if not paths:
        raise ValueError(f"image folder {root} has no images in class sub-folders (expected {root}/<class>/<img>)")
    present = set(labels)
    empty = [folder for label, folder in enumerate(folders) if label not in present]
    if empty:
        raise ValueError(
            f"image folder {root}: class folder(s) {', '.join(map(repr, empty[:5]))} hold no images "
            f"({', '.join(sorted(IMAGE_SUFFIXES))}); add images or remove the folder(s)"
        )
    classnames = _names_for_folders(root, folders, classnames_file)
    return FileListSource(paths, labels, classnames, f"image folder {root}", decode_workers=decode_workers)


def is_coop_folder(root: Path, preset: DatasetPreset) -> bool:
    """Whether ``root`` holds one of CoOp's layouts for ``preset``."""
    if any(root.glob("split_zhou_*.json")):
        return True
    if (root / "variants.txt").is_file():
        return True
    return preset.coop_layout == "classnames-folders" and (root / CLASSNAMES_FILE).is_file() and bool(
        preset.coop_image_dir) and (root / preset.coop_image_dir).is_dir()  # fmt: skip


def coop_root(data_dir: Path, preset: DatasetPreset) -> Path:
    """``data-dir`` may be CoOp's ``$DATA`` root or the dataset's own folder; return the latter."""
    if preset.coop_dir and not is_coop_folder(data_dir, preset) and (data_dir / preset.coop_dir).is_dir():
        return data_dir / preset.coop_dir
    return data_dir


def _split_json(root: Path, preset: DatasetPreset, split: str, workers: int) -> FileListSource:
    path = root / preset.coop_split_file if preset.coop_split_file else None
    if path is None or not path.is_file():
        found = sorted(root.glob("split_zhou_*.json"))
        path = found[0] if found else root / (preset.coop_split_file or "split_zhou_<Name>.json")
    if not path.is_file():
        raise unavailable(preset.title, f"reading CoOp's split file {path}", fix=list(preset.prepare),
                          keys=("data-dir",))  # fmt: skip
    split_data = json.loads(path.read_text(encoding="utf-8"))
    if split not in split_data:
        raise ValueError(f"{path} has splits {sorted(split_data)}, not hf-split={split!r}")
    items = split_data[split]
    if not items:
        raise ValueError(f"{path}: split {split!r} is empty")
    # Class names from every split of the file: the chosen split need not hold every class.
    names: dict[int, str] = {}
    for _, label, classname in (item for part in split_data.values() for item in part):
        if names.setdefault(int(label), classname) != classname:
            raise ValueError(f"{path}: label {label} is named both {names[int(label)]!r} and {classname!r}")
    missing = sorted(set(range(max(names) + 1)) - set(names))
    if missing:
        raise ValueError(f"{path}: no sample names label(s) {missing[:5]}; labels must be 0..C-1")
    image_root = _image_root(root, preset, items[0][0])
    return FileListSource(
        [image_root / item[0] for item in items],
        [int(item[1]) for item in items],
        [names[c] for c in range(len(names))],
        f"CoOp split {path} ({split})",
        decode_workers=workers,
    )


def _image_root(root: Path, preset: DatasetPreset, first: str) -> Path:
    candidates = [root / preset.coop_image_dir] if preset.coop_image_dir else []
    candidates += [root, root / "images", root / "jpg"]
    for candidate in candidates:
        if (candidate / first).is_file():
            return candidate
    return candidates[0]  # FileListSource reports the missing image with the layout hint


def _variants(root: Path, split: str, workers: int) -> FileListSource:
    classnames = [line.strip() for line in (root / "variants.txt").read_text().splitlines() if line.strip()]
    index = {name: i for i, name in enumerate(classnames)}
    listing = root / f"images_variant_{split}.txt"
    if not listing.is_file():
        raise ValueError(f"{root}: no {listing.name} for hf-split={split!r}")
    paths, labels = [], []
    for line in listing.read_text().splitlines():
        image_id, _, variant = line.strip().partition(" ")
        if image_id:
            paths.append(root / "images" / f"{image_id}.jpg")
            labels.append(index[variant])
    return FileListSource(paths, labels, classnames, f"CoOp FGVC layout {root} ({split})", decode_workers=workers)


def coop_folder(data_dir: str | Path, preset: DatasetPreset, split: str = "test", *,
                decode_workers: int = 4) -> FileListSource:  # fmt: skip
    """A dataset in CoOp's folder layout (``data-dir`` = CoOp's ``$DATA`` or the dataset's own folder)."""
    root = coop_root(Path(data_dir), preset)
    if (root / "variants.txt").is_file():
        return _variants(root, split, decode_workers)
    if preset.coop_layout == "classnames-folders" and not any(root.glob("split_zhou_*.json")):
        image_dir = root / preset.coop_image_dir
        if not (root / CLASSNAMES_FILE).is_file() or not image_dir.is_dir():
            raise unavailable(preset.title, f"reading CoOp's layout under {root}", fix=list(preset.prepare),
                              keys=("data-dir",))  # fmt: skip
        return image_folder(image_dir, classnames_file=root / CLASSNAMES_FILE, decode_workers=decode_workers)
    return _split_json(root, preset, split, decode_workers)
