"""Reuse across runs in one process (the benchmark runner): loaded batches and the frozen image tower's outputs.

A run sees each image once, so within a run nothing repeats. A benchmark grid runs many cells over the same
streams (every rule and method of a setting and seed sees the same images), and on the testbed the image tower
is about two thirds of a cell's time and rendering a batch most of the rest. Both depend on the inputs alone: a
batch on (its stream, its position), the tower's output on the checkpoint, device, precision and the pixels. With
:func:`on` (the bench runner's ``run_cell`` turns it on while a cell runs) a stream's batch and the tower's
output for a pixel tensor (looked up by a hash of its bytes) are computed once per process and kept, least
recently used dropped first. Off (the default) nothing is kept and nothing is hashed.

What is kept is what would be computed again (the tower is deterministic on one thread, as the bench runs it),
so the rows do not change: ``tests/test_bench.py`` compares a grid's rows with reuse and without.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # no torch import here: the data layer uses this module too, and its checks stay light
    from torch import Tensor

T = TypeVar("T")

_LOCK = threading.Lock()
_KEPT: OrderedDict[Hashable, object] = OrderedDict()
_CAPACITY = 0  # entries kept while on; 0: off


@contextlib.contextmanager
def on(capacity: int) -> Iterator[None]:
    """Reuse within the block, keeping up to ``capacity`` batches and tower outputs together (least recently used
    dropped first); afterwards as before. What is kept stays for the next block (the next cell of the process)."""
    global _CAPACITY
    with _LOCK:
        before, _CAPACITY = _CAPACITY, int(capacity)
    try:
        yield
    finally:
        with _LOCK:
            _CAPACITY = before


def forget() -> None:
    """Drop everything kept."""
    with _LOCK:
        _KEPT.clear()


def enabled() -> bool:
    return _CAPACITY > 0


def holds(key: Hashable) -> bool:
    """Whether something is kept for ``key``."""
    with _LOCK:
        return key in _KEPT


def kept(key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, or what it returned before for ``key`` (while reuse is on)."""
    if not enabled():
        return compute()
    with _LOCK:
        if key in _KEPT:
            _KEPT.move_to_end(key)
            return _KEPT[key]  # type: ignore[return-value]
    value = compute()
    with _LOCK:
        _KEPT[key] = value
        while len(_KEPT) > _CAPACITY:
            _KEPT.popitem(last=False)
    return value


def pixels_key(pixel_values: Tensor) -> tuple:
    """A key for a pixel tensor [B, 3, H, W]: its shape, dtype and a digest of its bytes."""
    data = pixel_values.detach().cpu().contiguous().numpy().tobytes()
    return tuple(pixel_values.shape), str(pixel_values.dtype), hashlib.blake2b(data, digest_size=20).hexdigest()


def image_features(model_key: Hashable, pixel_values: Tensor, compute: Callable[[], Tensor]) -> Tensor:
    """The tower's output for ``pixel_values`` [B, 3, H, W] under ``model_key`` (``compute()`` when not kept): a
    copy, so a caller may change it in place."""
    if not enabled():
        return compute()
    return kept(("image-features", model_key, pixels_key(pixel_values)), lambda: compute().detach()).clone()
