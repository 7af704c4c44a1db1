"""``DataSpec``: the data settings of a run, one field per kebab-case run-config key, validated cheaply."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

from fedrapp_app.data.presets import PRESETS, resolve_preset
from fedrapp_app.data.shift import SHIFT_TIMES, SHIFTS
from fedrapp_app.testbed.corruptions import DEFAULT_DOMAINS

SOURCES = ("auto", "hf", "webdataset", "coop", "imagefolder", "testbed")
PARTITIONS = ("iid", "dirichlet")
#: A client's stream order: seeded random (the paper's), class-correlated (classes one after the other), or
#: RoTTA's Dirichlet-in-time order (``stream-dirichlet``).
STREAM_ORDERS = ("random", "class", "dirichlet")
#: A testbed domain entry that means "no corruption".
CLEAN = "clean"
#: Four shift domains, the testbed's first four default ones (``corruptions.DEFAULT_DOMAINS``: severities
#: where the hand prompt's accuracy drops but a signal is left): with 8 clients two clients share each
#: domain, the setting where personalised sharing has something to find (TESTBED.md).
DEFAULT_TESTBED_DOMAINS = ",".join(f"{name}:{severity}" for name, severity in DEFAULT_DOMAINS[:4])


@dataclass(frozen=True)
class DataSpec:
    """Where the test split comes from and how it is cut into per-client streams.

    Field ``x_y`` is the run-config key ``x-y``. Defaults give the offline testbed run.
    """

    dataset: str = "testbed"  # "testbed", a preset name (presets.PRESETS) or "custom"
    source: str = "auto"  # one of SOURCES; "auto" picks from data-dir / hf-repo / the preset
    data_dir: str = ""  # local folder (CoOp layout, webdataset, image folder, saved HF dataset)
    hf_repo: str = ""  # Hub repo id (or local path) of an HF dataset or a clip-benchmark webdataset
    hf_split: str = "test"
    hf_image_column: str = "auto"  # "auto": the first Image column
    hf_label_column: str = "auto"  # "auto": the first ClassLabel column, else "label"
    num_clients: int = 8
    partition: str = "dirichlet"  # one of PARTITIONS
    dirichlet_alpha: float = 0.1
    min_partition_size: int = 10
    seed: int = 0
    batch_size: int = 64
    max_samples_per_client: int = 0  # 0 = the whole partition
    testbed_samples: int = 5120
    testbed_domains: str = DEFAULT_TESTBED_DOMAINS  # "name:severity,..." (client i: domain i mod D); "clean"
    decode_workers: int = 4  # threads decoding a batch (0 = decode in the caller)
    shift: str = "fixed"  # one of shift.SHIFTS: how a client's domain moves along its stream
    shift_period: int = 4  # batches per schedule step (continual, gradual)
    shift_rate: float = 0.0  # > 0: a step at each batch with this probability instead of every shift-period
    shift_spread: int = 0  # domains active across clients at once (0 = all configured ones)
    shift_times: str = "shared"  # one of shift.SHIFT_TIMES: the federation's switch times, or each client's own
    stream_order: str = "random"  # one of STREAM_ORDERS
    stream_dirichlet: float = 0.1  # gamma of stream_order="dirichlet" (RoTTA's default)
    corruptions: str = ""  # a real dataset's ImageNet-C shift domains "name:severity,..." (data/corruptions.py)


#: Fields that shape a client's stream but neither the source nor the partition (caches ignore them).
STREAM_FIELDS = ("batch_size", "max_samples_per_client", "testbed_domains", "shift", "shift_period", "shift_rate",
                 "shift_spread", "shift_times", "stream_order", "stream_dirichlet", "corruptions")  # fmt: skip


def without_stream_fields(spec: DataSpec) -> DataSpec:
    """``spec`` with every field of ``STREAM_FIELDS`` at its default (a cache key for sources and partitions)."""
    base = DataSpec()
    return replace(spec, **{name: getattr(base, name) for name in STREAM_FIELDS})


#: Fields whose run-config key is not simply the field name in kebab case.
_RUN_CONFIG_KEYS = {"source": "data-source"}


def kebab(field_name: str) -> str:
    """The run-config key of a field: ``dirichlet_alpha`` -> ``dirichlet-alpha``, ``source`` -> ``data-source``."""
    return _RUN_CONFIG_KEYS.get(field_name, field_name.replace("_", "-"))


def _bad(field_name: str, value: Any, allowed: str) -> ValueError:
    """The refusal of a field's value: what is expected and, unless ``allowed`` says it, the fix."""
    key = kebab(field_name)
    example = "'<value>'" if isinstance(value, str) else "<value>"
    fix = "" if "fix:" in allowed else f' (fix: -c "{key}={example}" or edit [tool.flwr.app.config])'
    return ValueError(f"{key}={value!r} is invalid: expected {allowed}{fix}")


def _check_int(spec: DataSpec, name: str, low: int) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(name, value, f"an integer >= {low}")


def _check_choice(spec: DataSpec, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(spec, name)
    if value not in choices:
        raise _bad(name, value, "one of " + ", ".join(repr(c) for c in choices))


def parse_domains(text: str) -> tuple[tuple[str, int] | None, ...]:
    """Parse ``testbed-domains``: ``"gaussian_noise:1,blur:2,clean"`` -> ``(("gaussian_noise", 1), ...)``.

    ``None`` entries mean a clean domain; a missing severity means 1. An empty text (or only "clean")
    gives ``()``: no corruption at all. Names are checked against the testbed later (``check_domains``).
    """
    entries = [e.strip() for e in text.split(",") if e.strip()]
    domains: list[tuple[str, int] | None] = []
    for entry in entries:
        if entry == CLEAN:
            domains.append(None)
            continue
        name, _, severity = entry.partition(":")
        name = name.strip()
        try:
            level = int(severity) if severity.strip() else 1
        except ValueError:
            level = 0
        if not name or level < 1:
            raise _bad(
                "testbed_domains", text,
                "a comma-separated list of 'corruption:severity' (severity an integer >= 1) or 'clean'",
            )  # fmt: skip
        domains.append((name, level))
    if all(d is None for d in domains):
        return ()
    return tuple(domains)


def domain_label(domain: tuple[str, int] | None) -> str:
    """A domain as the text it was configured with: ``("blur", 2)`` -> ``"blur:2"``, None -> ``"clean"``."""
    return CLEAN if domain is None else f"{domain[0]}:{domain[1]}"


def check_domains(domains: tuple[tuple[str, int] | None, ...]) -> None:
    """Raise a ``ValueError`` naming ``testbed-domains`` if a corruption or severity is unknown."""
    named = [d for d in domains if d is not None]
    if not named:
        return
    from fedrapp_app.testbed import corruptions

    for name, severity in named:
        if name not in corruptions.CORRUPTIONS:
            raise ValueError(
                f"testbed-domains: unknown corruption {name!r}; allowed: 'clean', "
                + ", ".join(repr(c) for c in corruptions.CORRUPTIONS)
                + " (fix: -c \"testbed-domains='blur:2,contrast:2'\")"
            )
        if not 1 <= severity <= corruptions.MAX_SEVERITY:
            raise ValueError(
                f"testbed-domains: severity {severity} of {name!r} is outside 1..{corruptions.MAX_SEVERITY} "
                f"(fix: -c \"testbed-domains='{name}:{min(max(severity, 1), corruptions.MAX_SEVERITY)}'\")"
            )


def validate_spec(spec: DataSpec) -> DataSpec:
    """Check every field without touching any data; raise ``ValueError`` naming the key, value and range.

    Returns the spec unchanged so it can be used inline: ``spec = validate_spec(DataSpec(...))``.
    """
    for name in ("dataset", "source", "data_dir", "hf_repo", "hf_split", "hf_image_column", "hf_label_column",
                 "partition", "testbed_domains", "shift", "shift_times", "stream_order", "corruptions"):  # fmt: skip
        if not isinstance(getattr(spec, name), str):
            raise _bad(name, getattr(spec, name), "a string")
    preset = resolve_preset(spec.dataset)
    if preset is None:
        raise _bad("dataset", spec.dataset, "one of " + ", ".join(PRESETS))
    _check_choice(spec, "source", SOURCES)
    _check_choice(spec, "partition", PARTITIONS)
    for name in ("hf_split", "hf_image_column", "hf_label_column"):
        if not getattr(spec, name).strip():
            raise _bad(name, getattr(spec, name), "a non-empty string")
    _check_int(spec, "num_clients", 1)
    _check_int(spec, "min_partition_size", 0)
    _check_int(spec, "seed", 0)
    _check_int(spec, "batch_size", 1)
    _check_int(spec, "max_samples_per_client", 0)
    _check_int(spec, "testbed_samples", 1)
    _check_int(spec, "decode_workers", 0)
    _check_choice(spec, "shift", SHIFTS)
    _check_choice(spec, "stream_order", STREAM_ORDERS)
    _check_choice(spec, "shift_times", SHIFT_TIMES)
    gamma = spec.stream_dirichlet
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not math.isfinite(gamma) or gamma <= 0:
        raise _bad("stream_dirichlet", gamma, "a finite number > 0 (0.1 = RoTTA's correlated order, large = random)")
    _check_int(spec, "shift_period", 1)
    _check_int(spec, "shift_spread", 0)
    rate = spec.shift_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise _bad("shift_rate", rate, "a number in [0, 1) (0 = a step every shift-period batches)")
    alpha = spec.dirichlet_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise _bad("dirichlet_alpha", alpha, "a finite number > 0 (0.1 = strong label skew, 0.5 = moderate)")
    domains = parse_domains(spec.testbed_domains)
    _check_source_fits(spec, preset.name)
    if preset.name == "testbed":
        check_domains(domains)
        if spec.corruptions.strip():
            raise _bad("corruptions", spec.corruptions, "'' on the testbed, whose domains are testbed-domains")
    else:
        domains = parse_domains(spec.corruptions) if spec.corruptions.strip() else ()
        check_real_domains(domains)
    _check_schedule(spec, preset.name, domains)
    return spec


def check_real_domains(domains: tuple[tuple[str, int] | None, ...]) -> None:
    """A real dataset's ``corruptions``: known ImageNet-C names at severities 1-5, and the library importable."""
    named = [d for d in domains if d is not None]
    if not named:
        return
    from fedrapp_app.data import corruptions

    for name, severity in named:
        corruptions.check_corruption(name, severity)
    try:
        _library_ready()
    except ImportError as err:
        raise ValueError(str(err)) from None


@functools.cache
def _library_ready() -> None:
    from fedrapp_app.data.corruptions import require_library

    require_library()


def _check_schedule(spec: DataSpec, dataset: str, domains: tuple) -> None:
    """A shift schedule needs domains to move through, a spread they can fill and a period shorter than a stream."""
    if spec.shift_times != "shared" and spec.shift not in ("continual", "gradual"):
        raise _bad("shift_times", spec.shift_times, f"'shared' with shift={spec.shift!r}, which has no switch times "
                   "('per-client' needs shift='continual' or 'gradual')")  # fmt: skip
    if spec.shift == "fixed":
        return
    if not domains:
        key, example = (
            ("testbed-domains", "blur:2,contrast:2")
            if dataset == "testbed"
            else ("corruptions", "gaussian_noise:3,defocus_blur:3")
        )
        raise _bad("shift", spec.shift, f"'fixed' without shift domains, or {key} listing the domains to move "
                   f"through (e.g. '{example}')")  # fmt: skip
    count = len({d[0] for d in domains if d is not None}) if spec.shift == "gradual" else len(domains)
    if spec.shift_spread > count:
        what = "corruption families" if spec.shift == "gradual" else "domains"
        raise _bad("shift_spread", spec.shift_spread, f"at most the {count} {what} of testbed-domains (0 = all)")
    per_client = spec.testbed_samples // spec.num_clients if dataset == "testbed" else spec.max_samples_per_client
    if spec.max_samples_per_client:
        per_client = min(per_client, spec.max_samples_per_client)
    if not per_client:  # a real dataset's streams are known once it is read
        return
    batches = -(-per_client // spec.batch_size)
    if spec.shift in ("continual", "gradual") and spec.shift_rate == 0 and spec.shift_period >= batches:
        raise _bad("shift_period", spec.shift_period, f"fewer batches than a client's stream (about {batches} "
                   f"batches of {spec.batch_size}): no client would ever switch (fix: -c \"shift-period="
                   f"{max(1, batches // 4)}\")")  # fmt: skip


def _check_source_fits(spec: DataSpec, dataset: str) -> None:
    is_testbed = dataset == "testbed"
    if is_testbed and spec.source not in ("auto", "testbed"):
        raise _bad("source", spec.source, "'auto' or 'testbed' when dataset='testbed'")
    if not is_testbed and spec.source == "testbed":
        raise _bad("source", spec.source, f"a real source for dataset={dataset!r} ('testbed' needs dataset='testbed')")
    if spec.source in ("coop", "imagefolder") and not spec.data_dir:
        raise _bad("data_dir", spec.data_dir, f"the folder holding the data when source={spec.source!r}")
    if spec.source == "hf" and not (spec.hf_repo or spec.data_dir):
        raise _bad("hf_repo", spec.hf_repo, "a Hub dataset id (or a local dataset path) when source='hf'")
    no_location = not (spec.data_dir or spec.hf_repo or PRESETS[dataset].hub_repo)
    if not is_testbed and spec.source in ("auto", "webdataset") and no_location:
        raise _bad(
            "data_dir", spec.data_dir,
            f"a local folder for dataset={dataset!r}: it has no Hub source (docs/datasets.md says how to prepare it)",
        )  # fmt: skip
