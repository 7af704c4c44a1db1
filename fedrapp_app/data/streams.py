"""Per-client test streams: a client's partition in a seeded order, cut into batches.

The stream position (the index of the next batch) is all a client needs to resume: ``batch(position)`` is a
pure function of (spec, client id, position). On the testbed a client also has a shift domain: with D
domains configured, client ``i`` gets domain ``i mod D`` (``client_domains`` exposes the whole map, e.g.
for a domain-oracle reference), or, with a ``shift`` schedule, a domain that moves along its stream
(``data/shift.py``). ``stream-order='class'`` orders a stream class after class instead of at random.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from fedrapp_app.data.corruptions import corrupt_image, sample_seed
from fedrapp_app.data.loader import Undecodable
from fedrapp_app.data.partition import cached_partition_indices, partition_cache_dir
from fedrapp_app.data.prefetch import PREFETCHER
from fedrapp_app.data.presets import get_preset
from fedrapp_app.data.shift import Domain, ShiftPlan, class_order, dirichlet_order
from fedrapp_app.data.sources import Source, cached_source, clear_source_cache
from fedrapp_app.data.sources.testbed import TestbedSource
from fedrapp_app.data.spec import DataSpec, domain_label, parse_domains, validate_spec, without_stream_fields
from fedrapp_app.engine import reuse

_STREAM_ORDER = 201  # SeedSequence key of the stream orders (distinct from the testbed pool's keys)
_STREAM_TOKENS = itertools.count()


@dataclass(frozen=True)
class StreamBatch:
    """One batch of a client's stream.

    Attributes
    ----------
    images : B RGB images (PIL), not preprocessed; B may be below the batch size (last batch, skipped samples).
    labels : int64 [B], only for scoring predictions.
    indices : int64 [B], the samples' positions in the source.
    position : the batch's position in the stream (0-based).
    skipped : the samples of this batch that could not be decoded (dropped from the arrays above).
    domains : the shift domain of every image (``"blur:2"``, ``"clean"``); empty without domains.
    """

    images: list[Image.Image]
    labels: np.ndarray
    indices: np.ndarray
    position: int
    skipped: tuple[Undecodable, ...] = ()
    domains: tuple[str, ...] = ()


class ClientStream:
    """A client's test stream: ``num_batches`` batches of ``batch_size`` (the last one may be smaller).

    Attributes
    ----------
    client_id : the client's index in 0..num-clients-1.
    domain : the client's testbed shift domain (``"blur:2"``, ``"clean"``) when it is one for the whole stream
        (``shift='fixed'``), else None (no domains, or a schedule: ``domains_at`` then says).
    order : int64 [num_samples], source positions in stream order.
    """

    def __init__(
        self, source: Source, order: np.ndarray, batch_size: int, client_id: int, plan: ShiftPlan | None = None
    ) -> None:
        self.source = source
        self.order = np.asarray(order, dtype=np.int64)
        self.batch_size = batch_size
        self.client_id = client_id
        self.plan = plan if plan is not None and plan.domains else None
        fixed = self.plan is not None and self.plan.shift == "fixed"
        self.domain = domain_label(self.plan.domain(client_id, 0)) if fixed else None
        if self.plan is not None and self.plan.shift == "mixed":
            self._mixed = self.plan.sample_domains(client_id, self.num_samples)
        self._steps = self.plan.steps(self.num_batches, client_id) if self.plan is not None else None
        self._token = next(_STREAM_TOKENS)  # names this stream's batches in the process's prefetcher

    @property
    def num_samples(self) -> int:
        return len(self.order)

    @property
    def num_batches(self) -> int:
        return -(-self.num_samples // self.batch_size)

    @property
    def classnames(self) -> list[str]:
        return self.source.classnames

    @property
    def template(self) -> str:
        return self.source.template

    @property
    def templates(self) -> tuple[str, ...]:
        """The dataset's prompt ensemble (the template alone where the preset names none)."""
        return tuple(self.source.templates) or (self.source.template,)

    def indices_at(self, position: int) -> np.ndarray:
        """int64 [B]: the source positions of batch ``position`` (no image is read)."""
        if (
            isinstance(position, bool)
            or not isinstance(position, (int, np.integer))
            or not (0 <= position < self.num_batches)
        ):
            raise IndexError(
                f"client {self.client_id}: stream position {position!r} is outside 0..{self.num_batches - 1} "
                f"({self.num_samples} samples in batches of {self.batch_size})"
            )
        start = int(position) * self.batch_size
        return self.order[start : start + self.batch_size]

    def domains_at(self, position: int) -> list[Domain | None] | None:
        """The shift domain of every sample of batch ``position`` (None = clean), or None without domains."""
        indices = self.indices_at(position)
        if self.plan is None:
            return None
        if self.plan.shift == "mixed":
            start = int(position) * self.batch_size
            return [self.plan.domains[k] for k in self._mixed[start : start + len(indices)]]
        return [self.plan.domain(self.client_id, int(self._steps[position]))] * len(indices)

    def _corrupted(self, item: Image.Image | Undecodable, domain: Domain | None, index: int):
        """A real image in its ImageNet-C domain (``data/corruptions.py``), seeded by (seed, sample)."""
        if domain is None or isinstance(item, Undecodable):
            return item
        assert self.plan is not None
        try:
            return corrupt_image(item, domain[0], domain[1], sample_seed(self.plan.seed, index))
        except ValueError as err:  # an image too small for the corruption: skipped and reported, like a bad file
            return Undecodable(f"sample {index}", str(err))

    def _load(self, position: int) -> StreamBatch:
        indices = self.indices_at(position)
        domains = self.domains_at(position)
        if domains is None:
            loaded = self.source.load(indices)
        elif not isinstance(self.source, TestbedSource):  # a real dataset: ImageNet-C corruptions of its images
            loaded = [self._corrupted(item, domain, index) for item, domain, index in
                      zip(self.source.load(indices), domains, indices, strict=True)]  # fmt: skip
        else:
            loaded = [None] * len(indices)
            for domain in dict.fromkeys(domains):  # one render per domain present, back in stream order
                where = [k for k, d in enumerate(domains) if d == domain]
                for k, item in zip(where, self.source.load(indices[where], domain), strict=True):
                    loaded[k] = item
        keep = np.array([not isinstance(item, Undecodable) for item in loaded], dtype=bool)
        kept = indices[keep]
        return StreamBatch(
            [item for item in loaded if not isinstance(item, Undecodable)],
            self.source.labels()[kept].copy(),
            kept.copy(),
            int(position),
            tuple(item for item in loaded if isinstance(item, Undecodable)),
            tuple(domain_label(d) for d, k in zip(domains, keep, strict=True) if k) if domains is not None else (),
        )

    def batch(self, position: int) -> StreamBatch:
        """Batch ``position`` of the stream (taken from a prefetch if one was started; kept for the next run of the
        process where the bench runner turned reuse on: ``engine.reuse``)."""
        if not isinstance(position, (int, np.integer)) or isinstance(position, bool):
            return self._load(position)  # indices_at refuses it, naming the stream

        def fetch() -> StreamBatch:
            pending = PREFETCHER.take((self._token, int(position)))
            return pending.result() if pending is not None else self._load(position)

        return reuse.kept(self._reuse_key(position), fetch)

    def prefetch(self, position: int) -> None:
        """Start decoding batch ``position`` in the background (no-op past the end, if already started or kept).

        The process's one prefetcher (``fedrapp_app.data.prefetch``) bounds what waits and stops when the
        batches it prepares go unused."""
        if 0 <= position < self.num_batches and not reuse.holds(self._reuse_key(position)):
            PREFETCHER.submit((self._token, position), lambda: self._load(position))

    def _reuse_key(self, position: int) -> tuple:
        return "stream-batch", self._token, int(position)

    def iter_batches(self, start: int = 0) -> Iterator[StreamBatch]:
        """Batches ``start``, ``start + 1``, ... to the end, decoding the next one while the caller works."""
        for position in range(start, self.num_batches):
            self.prefetch(position + 1)
            yield self.batch(position)

    def __repr__(self) -> str:
        return (
            f"ClientStream(client_id={self.client_id}, domain={self.domain!r}, num_samples={self.num_samples}, "
            f"num_batches={self.num_batches}, batch_size={self.batch_size}, source={self.source.description!r})"
        )


def client_domains(spec: DataSpec) -> list[str | None]:
    """The shift domain of every client (``i mod D`` over the configured domains); all None without domains or
    with a shift schedule (a client's domain then moves: ``ClientStream.domains_at``).

    This is the map a domain-oracle reference groups clients by; labels play no part in it.
    """
    validate_spec(spec)
    plan = shift_plan(spec)
    if plan is None or spec.shift != "fixed":
        return [None] * spec.num_clients
    return [domain_label(plan.domain(i, 0)) for i in range(spec.num_clients)]


def shift_plan(spec: DataSpec) -> ShiftPlan | None:
    """The spec's shift schedule over its domains (the testbed's ``testbed-domains``, a real dataset's ImageNet-C
    ``corruptions``); None without domains (no corruption)."""
    if get_preset(spec.dataset).name == "testbed":
        from fedrapp_app.testbed.corruptions import MAX_SEVERITY

        domains = parse_domains(spec.testbed_domains)
    else:
        from fedrapp_app.data.corruptions import MAX_SEVERITY

        domains = parse_domains(spec.corruptions) if spec.corruptions.strip() else ()
    if not domains:
        return None

    return ShiftPlan(spec.shift, domains, spec.shift_period, float(spec.shift_rate), spec.shift_spread, spec.seed,
                     MAX_SEVERITY, spec.shift_times)  # fmt: skip


_PARTITIONS: OrderedDict[DataSpec, list[np.ndarray]] = OrderedDict()
_PARTITIONS_LOCK = threading.Lock()
_STREAMS: OrderedDict[tuple[DataSpec, int], ClientStream] = OrderedDict()
_STREAMS_LOCK = threading.Lock()


def _partition_key(spec: DataSpec) -> DataSpec:
    return replace(without_stream_fields(spec), decode_workers=DataSpec().decode_workers)


def client_partitions(spec: DataSpec) -> list[np.ndarray]:
    """Every client's partition of the spec's source: cached per process (a process serves many rounds) and
    on disk (``partition.cached_partition_indices``: a deployed node's fresh process per message reads it
    instead of partitioning again)."""
    key = _partition_key(spec)
    with _PARTITIONS_LOCK:
        if key in _PARTITIONS:
            _PARTITIONS.move_to_end(key)
            return _PARTITIONS[key]
    parts = cached_partition_indices(cached_source(spec).labels(), spec, partition_cache_dir())
    with _PARTITIONS_LOCK:
        _PARTITIONS[key] = parts
        while len(_PARTITIONS) > 8:
            _PARTITIONS.popitem(last=False)
    return parts


def clear_caches() -> None:
    """Forget cached sources, partitions and streams (tests; or after the data on disk changed)."""
    clear_source_cache()
    with _PARTITIONS_LOCK:
        _PARTITIONS.clear()
    with _STREAMS_LOCK:
        _STREAMS.clear()


def stream_order(
    partition: np.ndarray,
    seed: int,
    client_id: int,
    labels: np.ndarray | None = None,
    order: str = "random",
    gamma: float = 0.1,
) -> np.ndarray:
    """A client's partition in its stream order, seeded by (seed, client id): at random, or, given the source's
    ``labels`` (int [N]), class after class (``order='class'``, ``shift.class_order``) or in RoTTA's Dirichlet-in-time
    order (``order='dirichlet'``, ``shift.dirichlet_order`` with ``gamma``)."""
    if order == "class":
        return partition[class_order(np.asarray(labels)[partition], seed, client_id, _STREAM_ORDER)]
    if order == "dirichlet":
        return partition[dirichlet_order(np.asarray(labels)[partition], gamma, seed, client_id, _STREAM_ORDER)]
    rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM_ORDER, client_id]))
    return partition[rng.permutation(len(partition))]


def build_client_stream(spec: DataSpec, client_id: int) -> ClientStream:
    """The test stream of client ``client_id``: deterministic from ``spec.seed``.

    Opens the source (cached per process), partitions its labels (cached), orders this client's part and
    truncates it to ``max_samples_per_client``; images are read only when a batch is asked for. The same
    stream object comes back for the same (spec, client id) in a process, so a batch prefetched in one
    round (``stream.prefetch(position + 1)``) is ready in the next.
    """
    validate_spec(spec)
    if (
        isinstance(client_id, bool)
        or not isinstance(client_id, (int, np.integer))
        or not (0 <= client_id < spec.num_clients)
    ):
        raise ValueError(f"client id {client_id!r} is outside 0..num-clients-1 (num-clients={spec.num_clients})")
    key = (spec, int(client_id))
    with _STREAMS_LOCK:
        if key in _STREAMS:
            _STREAMS.move_to_end(key)
            return _STREAMS[key]
    stream = _new_stream(spec, int(client_id))
    with _STREAMS_LOCK:
        stream = _STREAMS.setdefault(key, stream)
        while len(_STREAMS) > 256:
            _STREAMS.popitem(last=False)
    return stream


def _new_stream(spec: DataSpec, client_id: int) -> ClientStream:
    source = cached_source(spec)
    labels = source.labels() if spec.stream_order != "random" else None
    order = stream_order(client_partitions(spec)[client_id], spec.seed, client_id, labels, spec.stream_order,
                         float(spec.stream_dirichlet))  # fmt: skip
    if spec.max_samples_per_client:
        order = order[: spec.max_samples_per_client]
    return ClientStream(source, order, spec.batch_size, client_id, shift_plan(spec))
