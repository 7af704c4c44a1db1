"""clip-benchmark style webdatasets: ``<split>/{0..n-1}.tar`` shards of ``<key>.<webp|jpg|png>`` +
``<key>.cls`` members, and ``classnames.txt`` at the root (LAION-AI/CLIP_benchmark, build_wds_dataset).

The shards are indexed once (tar headers and the tiny ``.cls`` members only); an image is then read with one
``pread`` at its recorded offset, so random access needs neither the whole shard nor the ``webdataset``
package, and any thread can read concurrently.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from fedrapp_app.data.errors import unavailable
from fedrapp_app.data.loader import Undecodable, decode_many
from fedrapp_app.data.sources.base import Source, check_labels

IMAGE_EXTENSIONS = ("webp", "jpg", "jpeg", "png")
CLASSNAMES_FILE = "classnames.txt"


def read_lines(path: Path) -> list[str]:
    """Non-empty stripped lines of a text file."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def find_shards(root: Path, split: str) -> list[Path]:
    """The tar shards of ``split`` under ``root``: ``nshards.txt`` order if present, else sorted names."""
    split_dir = root / split
    nshards = split_dir / "nshards.txt"
    if nshards.is_file():
        count = int(nshards.read_text().strip())
        return [split_dir / f"{i}.tar" for i in range(count)]
    for folder in (split_dir, root):
        shards = sorted(folder.glob("*.tar"), key=lambda p: (len(p.stem), p.stem))
        if shards:
            return shards
    return []


def is_webdataset(root: Path, split: str) -> bool:
    """Whether ``root`` looks like a clip-benchmark webdataset (shards and class names)."""
    return bool(find_shards(root, split)) and _classnames_path(root) is not None


def _classnames_path(root: Path) -> Path | None:
    for folder in (root, root.parent):
        if (folder / CLASSNAMES_FILE).is_file():
            return folder / CLASSNAMES_FILE
    return None


def _split_member(name: str) -> tuple[str, str]:
    # Webdataset convention: the key is the path up to the first dot of the file name.
    folder, base = posixpath.split(name)
    stem, _, ext = base.partition(".")
    return posixpath.join(folder, stem), ext.lower()


def _index_shard(path: Path) -> tuple[list[str], list[int], list[int], list[int]]:
    """Keys, labels, image offsets and image sizes of one uncompressed tar shard, in member order."""
    images: dict[str, tuple[int, int]] = {}
    labels: dict[str, int] = {}
    order: list[str] = []
    with tarfile.open(path, mode="r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, ext = _split_member(member.name)
            if ext in IMAGE_EXTENSIONS and key not in images:
                images[key] = (member.offset_data, member.size)
                order.append(key)
            elif ext == "cls":
                handle = tar.extractfile(member)
                assert handle is not None
                labels[key] = int(handle.read().decode().strip())
    missing = [k for k in order if k not in labels]
    if missing:
        raise ValueError(f"webdataset shard {path}: sample {missing[0]!r} has an image but no .cls label")
    return (
        order,
        [labels[k] for k in order],
        [images[k][0] for k in order],
        [images[k][1] for k in order],
    )


class WebDatasetSource(Source):
    """A local clip-benchmark webdataset split (download one with ``fetch_webdataset``)."""

    def __init__(self, root: str | Path, split: str = "test", *, decode_workers: int = 4) -> None:
        root = Path(root)
        shards = find_shards(root, split)
        names_path = _classnames_path(root)
        if not shards or names_path is None:
            raise unavailable(
                f"webdataset at {root}",
                f"reading {root}/{split}/*.tar and {root}/{CLASSNAMES_FILE}",
                fix=[f"expected {split}/nshards.txt, {split}/0.tar ... and {CLASSNAMES_FILE} under {root}",
                     "download one with: hf download --repo-type dataset clip-benchmark/wds_<name> "
                     f"--local-dir {root}"],
                keys=("data-dir", "hf-split"),
            )  # fmt: skip
        self.classnames = read_lines(names_path)
        self.template = "a photo of a {}."
        self.description = f"webdataset {root} (split {split}, {len(shards)} shards)"
        self._shards = shards
        self._workers = decode_workers
        shard_ids, labels, offsets, sizes = [], [], [], []
        for shard_id, shard in enumerate(shards):
            if not shard.is_file():
                raise ValueError(f"{self.description}: shard {shard} listed by nshards.txt is missing")
            _, shard_labels, shard_offsets, shard_sizes = _index_shard(shard)
            shard_ids.extend([shard_id] * len(shard_labels))
            labels.extend(shard_labels)
            offsets.extend(shard_offsets)
            sizes.extend(shard_sizes)
        self._labels = check_labels(np.asarray(labels), len(self.classnames), self.description)
        self._shard_ids = np.asarray(shard_ids, dtype=np.int32)
        self._offsets = np.asarray(offsets, dtype=np.int64)
        self._sizes = np.asarray(sizes, dtype=np.int64)
        self._fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()

    def labels(self) -> np.ndarray:
        return self._labels

    def _fd(self, shard_id: int) -> int:
        with self._fd_lock:
            if shard_id not in self._fds:
                self._fds[shard_id] = os.open(self._shards[shard_id], os.O_RDONLY)
            return self._fds[shard_id]

    def _read(self, index: int) -> bytes:
        # pread keeps no file position, so concurrent decode threads can share one descriptor per shard.
        return os.pread(self._fd(int(self._shard_ids[index])), int(self._sizes[index]), int(self._offsets[index]))

    def load(self, indices: Sequence[int] | np.ndarray) -> list[Image.Image | Undecodable]:
        positions = [int(i) for i in np.asarray(indices, dtype=np.int64)]
        payloads = [self._read(i) for i in positions]
        names = [f"{self._shards[int(self._shard_ids[i])]} sample {i}" for i in positions]
        return decode_many(payloads, self._workers, names)

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            with contextlib.suppress(OSError):
                os.close(fd)


def fetch_webdataset(repo: str, split: str, local_dir: str | None, *, what: str) -> Path:
    """Download (or find in the Hugging Face cache) the ``split`` shards and class names of a Hub webdataset.

    The cache is tried first, so a machine without network access works once the data has been fetched.
    """
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub comes with datasets
        raise unavailable(what, f"the Hub repo {repo}", fix=["pip install huggingface_hub"],
                          keys=("hf-repo",), cause=exc) from exc  # fmt: skip
    patterns = [f"{split}/*", CLASSNAMES_FILE, "zeroshot_classification_templates.txt"]
    kwargs = dict(repo_id=repo, repo_type="dataset", allow_patterns=patterns, local_dir=local_dir or None)
    try:
        return Path(snapshot_download(local_files_only=True, **kwargs))
    except Exception:  # noqa: BLE001 - not cached yet: fall through to the download
        pass
    try:
        return Path(snapshot_download(**kwargs))
    except Exception as exc:
        target = local_dir or "the Hugging Face cache (HF_HOME)"
        raise unavailable(
            what,
            f"downloading the webdataset {repo} (split {split}) from the Hugging Face Hub",
            fix=[f"on a machine with network access: hf download --repo-type dataset {repo} "
                 f"--include '{split}/*' --include {CLASSNAMES_FILE} --local-dir <folder>, "
                 "then set data-dir=<folder>",
                 f"or make the Hub reachable (the download goes to {target})"],
            keys=("data-dir", "hf-repo", "data-source"),
            cause=exc,
        ) from exc  # fmt: skip
