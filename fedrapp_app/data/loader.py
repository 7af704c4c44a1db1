"""Image decoding off the critical path: a shared thread pool that decodes a batch in parallel.

PIL releases the GIL while it decodes JPEG/PNG/WebP, so threads give real parallelism here without the
start-up and pickling cost of processes. Every decoded image is converted to RGB exactly once.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from PIL import Image

T = TypeVar("T")
R = TypeVar("R")

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def decode_image(payload: bytes | str | Path) -> Image.Image:
    """Decode encoded bytes or an image file into a fully loaded RGB ``PIL.Image``.

    ``convert`` forces the decode now (``Image.open`` is lazy), so it happens in the worker thread.
    """
    source = io.BytesIO(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else payload
    with Image.open(source) as image:
        return image.convert("RGB")


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


def decode_many(payloads: Sequence[bytes | str | Path], workers: int) -> list[Image.Image]:
    """Decode a batch of encoded images in parallel; the order of the output is the order of the input."""
    return parallel_map(decode_image, payloads, workers)
