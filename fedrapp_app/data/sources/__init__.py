"""``build_source(spec)``: pick and open the source of a ``DataSpec`` (auto-detecting local layouts)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from fedrapp_app.data.errors import unavailable
from fedrapp_app.data.presets import DatasetPreset, get_preset
from fedrapp_app.data.sources.base import ClassSubset, Source, with_preset
from fedrapp_app.data.sources.files import coop_folder, coop_root, image_folder, is_coop_folder
from fedrapp_app.data.sources.hf import HuggingFaceSource, has_table_files, is_saved_dataset
from fedrapp_app.data.sources.testbed import TestbedSource
from fedrapp_app.data.sources.webdataset import WebDatasetSource, fetch_webdataset, is_webdataset
from fedrapp_app.data.spec import DataSpec, validate_spec, without_stream_fields

__all__ = [
    "ClassSubset",
    "HuggingFaceSource",
    "Source",
    "TestbedSource",
    "WebDatasetSource",
    "build_source",
    "cached_source",
    "clear_source_cache",
    "detect_layout",
    "resolve_source",
]


def detect_layout(path: Path, preset: DatasetPreset, split: str) -> str:
    """The source kind of a local folder: ``coop``, ``hf``, ``webdataset`` or ``imagefolder``."""
    if not path.exists():
        fetch = f"or set data-source='webdataset' to fetch {preset.hub_repo} into {path}"
        download = [fetch] if preset.hub_repo else []
        raise unavailable(
            preset.title, f"reading the local folder {path}",
            fix=[f"point data-dir at the prepared dataset ({path} does not exist)", *preset.prepare, *download],
            keys=("data-dir", "data-source"),
        )  # fmt: skip
    if path.is_dir() and is_coop_folder(coop_root(path, preset), preset):
        return "coop"
    if path.is_dir() and (is_saved_dataset(path) or has_table_files(path)):
        return "hf"
    if path.is_dir() and is_webdataset(path, split):
        return "webdataset"
    if path.is_dir() and any(p.is_dir() and not p.name.startswith(".") for p in path.iterdir()):
        return "imagefolder"
    raise unavailable(
        preset.title, f"recognising the layout of {path}",
        fix=["expected one of: CoOp's layout (split_zhou_*.json + images), a saved Hugging Face dataset "
             "(dataset_info.json) or parquet files, a webdataset (<split>/*.tar + classnames.txt), "
             "or an image folder (<class>/<image>)", *preset.prepare],
        keys=("data-dir", "data-source"),
    )  # fmt: skip


def resolve_source(spec: DataSpec) -> tuple[str, str]:
    """``(kind, location)`` the spec reads from: e.g. ``("webdataset", "clip-benchmark/wds_vtab-pets")``.

    ``location`` is a local path, a Hub repo id, or "" for the testbed. Looks at the file system (for
    ``source="auto"``) but reads no data.
    """
    preset = get_preset(spec.dataset)
    if preset.name == "testbed":
        return "testbed", ""
    if spec.source != "auto":
        return spec.source, spec.data_dir or spec.hf_repo or preset.hub_repo
    if spec.data_dir:
        return detect_layout(Path(spec.data_dir).expanduser(), preset, spec.hf_split), spec.data_dir
    if spec.hf_repo:
        local = Path(spec.hf_repo).expanduser()
        if local.exists():
            return detect_layout(local, preset, spec.hf_split), spec.hf_repo
        # clip-benchmark's Hub webdatasets are all named wds_*; anything else is read with `datasets`.
        return ("webdataset" if "/wds_" in spec.hf_repo else "hf"), spec.hf_repo
    return "webdataset", preset.hub_repo


def _open_webdataset(spec: DataSpec, preset: DatasetPreset, location: str) -> Source:
    local = Path(location).expanduser()
    if local.is_dir() and is_webdataset(local, spec.hf_split):
        return WebDatasetSource(local, spec.hf_split, decode_workers=spec.decode_workers)
    repo = spec.hf_repo or preset.hub_repo
    if not repo:
        return WebDatasetSource(local, spec.hf_split, decode_workers=spec.decode_workers)  # reports the layout
    what = f"{preset.name} ({spec.hf_split} split)"
    root = fetch_webdataset(repo, spec.hf_split, spec.data_dir or None, what=what)
    return WebDatasetSource(root, spec.hf_split, decode_workers=spec.decode_workers)


def build_source(spec: DataSpec) -> Source:
    """Open the split a spec names, with the preset's class-name cleaning and template applied.

    Raises ``ValueError`` for a bad spec or malformed data and ``DataUnavailableError`` (with what was tried
    and how to get the data) when the data is not there.
    """
    validate_spec(spec)
    preset = get_preset(spec.dataset)
    kind, location = resolve_source(spec)
    workers = spec.decode_workers
    if kind == "testbed":  # its class names and template are its own; the preset adds the prompt ensemble
        source = TestbedSource(spec.testbed_samples, spec.seed, decode_workers=workers)
        source.templates = preset.ensemble
        return source
    if kind == "webdataset":
        raw = _open_webdataset(spec, preset, location)
    elif kind == "hf":
        raw = HuggingFaceSource(location, spec.hf_split, image_column=spec.hf_image_column,
                                label_column=spec.hf_label_column, decode_workers=workers)  # fmt: skip
    elif kind == "coop":
        raw = coop_folder(Path(location).expanduser(), preset, spec.hf_split, decode_workers=workers)
    else:
        raw = image_folder(Path(location).expanduser(), decode_workers=workers)
    return with_preset(raw, preset)


# A client process serves many rounds (and, in simulation, several clients): open each source once.
_CACHE: OrderedDict[DataSpec, Source] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 4


def _source_key(spec: DataSpec) -> DataSpec:
    """The spec with every field that does not change the source reset, so those specs share a cache entry."""
    base = DataSpec()
    key = replace(
        without_stream_fields(spec),
        num_clients=base.num_clients, partition=base.partition, dirichlet_alpha=base.dirichlet_alpha,
        min_partition_size=base.min_partition_size,
    )  # fmt: skip
    if get_preset(spec.dataset).name != "testbed":
        key = replace(key, seed=base.seed, testbed_samples=base.testbed_samples)
    return key


def cached_source(spec: DataSpec) -> Source:
    """``build_source`` with a small per-process cache (specs that differ only in partitioning share it)."""
    key = _source_key(spec)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    source = build_source(spec)
    with _CACHE_LOCK:
        _CACHE[key] = source
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return source


def clear_source_cache() -> None:
    """Forget every cached source (tests; or after the data on disk changed)."""
    with _CACHE_LOCK:
        _CACHE.clear()
