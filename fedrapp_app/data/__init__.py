"""The data layer (SPEC §6): dataset presets, sources, partitions over clients and per-client test streams.

Entry points: ``DataSpec`` + ``validate_spec`` (run config), ``build_source(spec)``,
``partition_indices(labels, spec)`` and ``build_client_stream(spec, client_id)``.
"""

from fedrapp_app.data.errors import DataUnavailableError
from fedrapp_app.data.partition import label_histograms, label_skew, partition_indices
from fedrapp_app.data.presets import PAPER_DATASETS, PRESETS, DatasetPreset, clean_classnames, get_preset
from fedrapp_app.data.sources import Source, build_source, cached_source, resolve_source
from fedrapp_app.data.spec import DataSpec, parse_domains, validate_spec
from fedrapp_app.data.streams import (
    ClientStream,
    StreamBatch,
    build_client_stream,
    clear_caches,
    client_domains,
    client_partitions,
)

__all__ = [
    "PAPER_DATASETS",
    "PRESETS",
    "ClientStream",
    "DataSpec",
    "DataUnavailableError",
    "DatasetPreset",
    "Source",
    "StreamBatch",
    "build_client_stream",
    "build_source",
    "cached_source",
    "clean_classnames",
    "clear_caches",
    "client_domains",
    "client_partitions",
    "get_preset",
    "label_histograms",
    "label_skew",
    "parse_domains",
    "partition_indices",
    "resolve_source",
    "validate_spec",
]
