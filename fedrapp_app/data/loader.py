"""Image decoding off the critical path: a shared thread pool that decodes a batch in parallel.

PIL releases the GIL while it decodes JPEG/PNG/WebP, so threads give real parallelism here without the
start-up and pickling cost of processes. Every decoded image is converted to RGB exactly once.

A sample that cannot be decoded (a corrupt or truncated file, bytes that are not an image) does not fail its
batch: ``decode_many`` returns an ``Undecodable`` in its place, naming the sample and the reason, and the
stream drops it from the batch and reports it (``skipped``), so one bad file never stops a client.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from PIL import Image

T = TypeVar("T")
R = TypeVar("R")

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Undecodable:
    """A sample whose image could not be decoded: ``name`` (a file path or a sample id) and why."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def decode_image(payload: bytes | str | Path) -> Image.Image:
    """Decode encoded bytes or an image file into a fully loaded RGB ``PIL.Image``.

    ``convert`` forces the decode now (``Image.open`` is lazy), so it happens in the worker thread.
    """
    source = io.BytesIO(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else payload
    with Image.open(source) as image:
        return image.convert("RGB")


def try_decode(payload: bytes | str | Path, name: str) -> Image.Image | Undecodable:
    """``decode_image(payload)``, or an ``Undecodable`` naming the sample when it cannot be decoded."""
    try:
        return decode_image(payload)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        # PIL reports bad data as OSError ("cannot identify image file", "image file is truncated"),
        # ValueError or SyntaxError, depending on the format plugin.
        return Undecodable(name, f"{type(err).__name__}: {err}")


def _pool(workers: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"fedrapp-decode{workers}")
            _POOLS[workers] = pool
        return pool


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]``, run on ``workers`` shared threads (0 or 1 item: in the caller)."""
    if workers <= 0 or len(items) <= 1:
        return [fn(item) for item in items]
    return list(_pool(workers).map(fn, items))


def decode_many(
    payloads: Sequence[bytes | str | Path], workers: int, names: Sequence[str] | None = None
) -> list[Image.Image | Undecodable]:
    """Decode a batch in parallel, in input order; an undecodable item becomes an ``Undecodable``.

    ``names`` label the items in those reports (default: the payload itself when it is a path, else its
    position in the batch).
    """
    if names is None:
        names = [str(p) if isinstance(p, (str, Path)) else f"item {i} of the batch" for i, p in enumerate(payloads)]
    return parallel_map(lambda pair: try_decode(*pair), list(zip(payloads, names, strict=True)), workers)
