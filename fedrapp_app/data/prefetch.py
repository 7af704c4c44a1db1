"""Decode the next batch while the current one computes: one background thread per process, bounded.

A client asks for batch p + 1 to be prepared while it adapts on batch p. Whether that pays depends on who
serves the client's next message: the same process (a warm deployed worker, the in-process benchmark) or
another one (Flower's simulation hands each message to any idle Ray actor; a stock SuperNode starts a new
process per message). So the prefetcher

- runs one daemon thread per process (a daemon never delays the exit of a per-message process),
- keeps at most ``max_pending`` prepared batches (decoded images are its memory cost, whatever the number of
  clients a process serves), dropping the oldest,
- and turns itself off in a process where prepared batches are mostly dropped unused (one actor serving
  hundreds of clients), so that no decoding is done twice for nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("flwr.fedrapp.data")


class Prefetcher:
    """Background preparation of values by key, at most ``max_pending`` kept (see the module docstring).

    ``min_events`` prepared values must have been taken or dropped before the hit rate is judged; below
    ``min_hit_rate`` the prefetcher stops preparing anything (``submit`` becomes a no-op).
    """

    def __init__(self, max_pending: int = 16, min_events: int = 32, min_hit_rate: float = 0.25) -> None:
        self.max_pending = max_pending
        self.min_events = min_events
        self.min_hit_rate = min_hit_rate
        self.enabled = True
        self.hits = 0
        self.dropped = 0
        self._pending: OrderedDict[Hashable, Future[Any]] = OrderedDict()
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, key: Hashable, prepare: Callable[[], Any]) -> None:
        """Start ``prepare()`` in the background for ``key`` (nothing if already pending or switched off)."""
        with self._lock:
            if not self.enabled or key in self._pending:
                return
            while len(self._pending) >= self.max_pending:
                _, oldest = self._pending.popitem(last=False)
                oldest.cancel()
                self.dropped += 1
            future: Future[Any] = Future()
            self._pending[key] = future
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="fedrapp-prefetch", daemon=True)
                self._thread.start()
            self._judge()
        self._jobs.put((future, prepare))

    def take(self, key: Hashable) -> Future[Any] | None:
        """The pending preparation of ``key`` (removed), or None when there is none."""
        with self._lock:
            future = self._pending.pop(key, None)
            if future is not None:
                self.hits += 1
            return future

    def _judge(self) -> None:
        events = self.hits + self.dropped
        if events >= self.min_events and self.hits < self.min_hit_rate * events:
            self.enabled = False
            log.info(
                "prefetching off in this process: %d of %d prepared batches were dropped unused (it serves many "
                "clients whose next batches go to other processes)",
                self.dropped,
                events,
            )

    def _work(self) -> None:
        while True:
            future, prepare = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue  # dropped before it started
            try:
                future.set_result(prepare())
            except BaseException as err:  # noqa: BLE001 - handed to whoever takes the batch
                future.set_exception(err)


#: The process's prefetcher, shared by every stream of the process.
PREFETCHER = Prefetcher()
