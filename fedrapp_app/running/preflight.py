"""Checks that fail a run before anything heavy starts: everything knowable on this host from the config alone.

``fedrapp-sim`` runs them before it starts a SuperLink (the simulation's clients run on this host, with this
model and this data), so a typo costs seconds and one message instead of a Ray start and a traceback per
client. Each check raises ``PreflightError`` whose message names the problem and the fix:

- the model: a local folder must exist and hold a CLIP ``config.json`` and weights; a Hub id must be in the local
  Hugging Face cache or the Hub must be reachable;
- the data: the source must exist in the chosen format, ``num-clients`` partitions of it must fit its pool
  (``min-partition-size`` each), and every class must have at least one image that decodes.

Only light imports here (no torch, no transformers): the checks take seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from fedrapp_app.config import ConfigError, RunConfig, override_hint

#: Seconds to wait for a TCP connection to the Hub before calling it unreachable.
HUB_PROBE_SECONDS = 3.0
_TESTBED_MODEL = Path(__file__).resolve().parents[1] / "testbed" / "model"


class PreflightError(ValueError):
    """A run cannot start: the message says what is wrong and how to fix it."""


def hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> bool:
    """Whether a TCP connection to the Hugging Face Hub (``HF_ENDPOINT``) opens; False under ``HF_HUB_OFFLINE``."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


#: The files of a Hugging Face checkpoint folder that hold its weights (one of them is enough).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _looks_local(model: str) -> bool:
    """A path rather than a Hub id (``org/name``): the same rule as ``engine.loading.resolve_source``."""
    return Path(model).expanduser().exists() or model.startswith((".", "/", "~")) or model.count("/") > 1


def describe_clip(config: dict, where: str) -> str:
    """A CLIP checkpoint's ``config.json`` in a few words: ``"CLIP (image ViT 224 px / patch 16, 12 layers x 768;
    text 12 layers x 512; embeddings 512) from <where>"``; absent keys take ``transformers``' CLIP defaults."""
    vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
    return (
        f"CLIP (image ViT {vision.get('image_size', 224)} px / patch {vision.get('patch_size', 32)}, "
        f"{vision.get('num_hidden_layers', 12)} layers x {vision.get('hidden_size', 768)}; text "
        f"{text.get('num_hidden_layers', 12)} layers x {text.get('hidden_size', 512)}; embeddings "
        f"{config.get('projection_dim', 512)}) from {where}"
    )


def check_model(model: str) -> str:
    """The model named by the run config can be loaded on this host (without loading it); what it is, in words
    (:func:`describe_clip`)."""
    fix = override_hint("model", "testbed").replace("testbed", "<folder or Hub id>")
    if model == "testbed":
        folder = _TESTBED_MODEL
    elif _looks_local(model):
        folder = Path(model).expanduser()
        if folder.is_file():
            raise PreflightError(
                f"model = {model!r} is a file, not a folder: a checkpoint is the folder that holds config.json, the "
                f"weights and the tokenizer and preprocessor files (fix: "
                f"{override_hint('model', str(folder.parent))} if this file is one of them)"
            )
        if not folder.is_dir():
            raise PreflightError(
                f"model = {model!r}: no such folder. Point it at a local CLIP checkpoint folder (config.json, "
                f"weights, tokenizer and preprocessor files), a Hub id such as 'openai/clip-vit-base-patch16', "
                f"or 'testbed' ({fix})"
            )
    else:
        return _check_hub_model(model, fix)
    config = folder / "config.json"
    if not config.is_file():
        raise PreflightError(
            f"model = {model!r}: {folder} has no config.json, so it is not a Hugging Face checkpoint folder ({fix})"
        )
    try:
        found = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise PreflightError(f"model = {model!r}: cannot read {config}: {err}") from err
    model_type = found.get("model_type")
    if model_type != "clip":
        raise PreflightError(
            f"model = {model!r}: {config} describes a {model_type!r} model, not a CLIP checkpoint (model_type "
            f"'clip', e.g. openai/clip-vit-base-patch16) ({fix})"
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        where = (
            "the shipped testbed model has lost its weights: a copy of the app from Flower Hub does not carry "
            "them (Flower Hub takes no .safetensors files). Install the project from its git repository or a "
            "wheel, which hold fedrapp_app/testbed/model/model.safetensors"
            if folder == _TESTBED_MODEL
            else f"copy the checkpoint's weights into the folder, or point the run at another one ({fix})"
        )
        raise PreflightError(f"model = {model!r}: {folder} holds no weights ({', '.join(WEIGHT_FILES)}); {where}")
    where = "the shipped offline testbed model" if folder == _TESTBED_MODEL else f"the folder {folder}"
    return describe_clip(found, where)


def _check_hub_model(repo: str, fix: str) -> str:
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo, "config.json")
    if isinstance(cached, str):
        try:
            return describe_clip(json.loads(Path(cached).read_text()), f"the Hub ({repo}, in the local cache)")
        except (OSError, json.JSONDecodeError):
            return f"{repo} (in the local Hugging Face cache)"
    if not hub_reachable():
        raise PreflightError(
            f"model = {repo!r} is not in the local Hugging Face cache and the Hub is unreachable from this "
            "machine (or HF_HUB_OFFLINE is set). Download it once on a connected machine "
            f"(`hf download {repo} --local-dir /path/clip`), copy the folder here and point the run at it "
            f"({fix}), or run model='testbed'"
        )
    return f"{repo} from the Hub (downloaded when the clients start: not in the local cache yet)"


@contextlib.contextmanager
def _offline_unless_reachable() -> Iterator[None]:
    """Hub reads inside go to the local cache only when the Hub cannot be reached (no network timeouts)."""
    if hub_reachable():
        yield
        return
    before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before


#: Folder names that split a dataset (train/test/...): as class names they mean data-dir is one level too high.
SPLIT_NAMES = frozenset({"train", "training", "test", "testing", "val", "valid", "validation", "eval", "dev"})
#: How many class names ``--check`` shows.
SHOWN_CLASSES = 5


@dataclass(frozen=True)
class DataFindings:
    """What the data check found: where the data is, its class names, each client's samples and, with fixed shift
    domains, the samples of each domain (empty otherwise; ``domains`` says why in words)."""

    description: str
    classes: list[str]
    per_client: list[int]
    per_domain: dict[str, int]
    domains: str
    data_dir: str = ""  # the run's data-dir, where it has one

    def warnings(self) -> list[str]:
        """What looks wrong though a run would start: a dataset of one class, class names that are split folders."""
        found = []
        if len(self.classes) == 1:
            found.append(
                f"the dataset has one class ({self.classes[0]!r}): every prediction is right, so its accuracy says "
                "nothing (an image folder holds one sub-folder per class: point data-dir at the folder above them)"
            )
        splits = [name for name in self.classes if name.strip().lower() in SPLIT_NAMES]
        if splits:
            split = f"{self.data_dir or '<data-dir>'}/{splits[0]}"
            found.append(
                f"class name(s) {', '.join(map(repr, splits))} look like split folders, not classes: point data-dir "
                f"at one split (e.g. {override_hint('data-dir', split)}), whose sub-folders are the classes"
            )
        return found

    def lines(self) -> list[str]:
        """The findings in a few lines, for ``--check``."""
        first = ", ".join(self.classes[:SHOWN_CLASSES]) + (", ..." if len(self.classes) > SHOWN_CLASSES else "")
        sizes = self.per_client
        per_domain = ", ".join(f"{d} {n}" for d, n in self.per_domain.items())
        return [
            f"data: {self.description}; {len(self.classes)} classes ({first})",
            f"samples per client: {', '.join(map(str, sizes))} ({sum(sizes)} in all, {min(sizes)} to {max(sizes)})",
            f"samples per shift domain: {per_domain}" if per_domain else f"shift domains: {self.domains}",
        ]


def _domain_samples(spec, sizes: list[int]) -> tuple[dict[str, int], str]:
    """Samples per fixed shift domain (each client's stream in its domain), or why there is no such count."""
    from fedrapp_app.data import client_domains
    from fedrapp_app.data.streams import shift_plan

    domains = client_domains(spec)
    if all(d is None for d in domains):
        moving = shift_plan(spec) is not None
        return {}, f"they move along each stream (shift = {spec.shift!r})" if moving else "none (no corruption)"
    counts: dict[str, int] = {}
    for domain, size in zip(domains, sizes, strict=True):
        counts[str(domain)] = counts.get(str(domain), 0) + size
    return counts, ""


def check_data(config: RunConfig) -> DataFindings:
    """The dataset exists in the chosen format, its pool fits the partitions and every class decodes; what it
    found (no label is read beyond the partition's own use of them)."""
    from fedrapp_app.data import DataUnavailableError, cached_source, client_partitions

    spec = config.data_spec()
    try:
        with _offline_unless_reachable():
            parts = client_partitions(spec)  # opens the source (format, layout, labels) and draws the partitions
            source = cached_source(spec)
    except (DataUnavailableError, ValueError, OSError) as err:
        raise PreflightError(f"dataset {config['dataset']!r}: {err}") from err
    if spec.dataset != "testbed":
        empty = classes_without_decodable_image(source)
        if empty:
            shown = ", ".join(repr(c) for c in empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
            raise PreflightError(
                f"dataset {config['dataset']!r} ({source.description}): no image of class(es) {shown} can be "
                "decoded (corrupt or not images). Replace those files, or remove the class folder(s)"
            )
    cap = spec.max_samples_per_client
    sizes = [min(len(part), cap) if cap else len(part) for part in parts]
    per_domain, domains = _domain_samples(spec, sizes)
    data_dir = str(config["data-dir"]).rstrip("/")
    return DataFindings(source.description, list(source.classnames), sizes, per_domain, domains, data_dir)


def classes_without_decodable_image(source) -> list[str]:
    """Names of the classes of ``source`` (a ``Source``) that have samples but none that decodes.

    Decodes images of a class only until one succeeds: about one image per class on healthy data.
    """
    import numpy as np

    from fedrapp_app.data.loader import Undecodable

    labels = source.labels()
    empty = []
    for c, name in enumerate(source.classnames):
        positions = np.flatnonzero(labels == c)
        if positions.size and all(isinstance(source.load([int(i)])[0], Undecodable) for i in positions):
            empty.append(name)
    return empty


@dataclass(frozen=True)
class Findings:
    """What the checks before a start found: the model in words and the data."""

    model: str
    data: DataFindings

    def lines(self) -> list[str]:
        return [f"model: {self.model}", *self.data.lines()]

    def warnings(self) -> list[str]:
        return self.data.warnings()


def preflight(config: RunConfig) -> Findings:
    """Every check above on a config whose ``num-clients`` is resolved; ``PreflightError`` on the first problem;
    what they found."""
    if not config.num_clients:
        raise ConfigError("preflight needs num-clients resolved: RunConfig.with_num_clients(n)")
    model = check_model(str(config["model"]))
    data = check_data(config)
    check_privacy_budget(config)
    return Findings(model, data)


def check_privacy_budget(config: RunConfig) -> None:
    """Under dp, every client's budget can be met over its stream (the most rounds it can upload in) by a noise
    below the accountant's bound; the clients check it again before their first upload."""
    if not config["dp"]:
        return
    from fedrapp_app.data import client_partitions
    from fedrapp_app.privacy.accountant import BudgetError, noise_for_budget

    spec = config.data_spec()
    longest = max(len(part) for part in client_partitions(spec))
    if spec.max_samples_per_client:
        longest = min(longest, spec.max_samples_per_client)
    rounds = -(-longest // spec.batch_size)
    try:
        noise_for_budget(float(config["dp-epsilon"]), float(config["dp-delta"]), rounds)
    except BudgetError as err:
        raise PreflightError(f"{err} (the longest stream has {rounds} batches)") from None
