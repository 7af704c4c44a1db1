"""Send messages and collect their replies without waiting on Flower's 3 s pull of the deployment grid.

Flower's ``Grid.send_and_receive`` pushes the messages, then pulls the replies every 3 s on the deployment
grid (``HttpGrid``, the ServerApp of ``flwr run`` against a SuperLink; the simulation's in-memory grid pulls
every 0.1 s). A reply that arrives just after a pull waits up to 3 s more, so a deployed round took 3 or 6 s
for well under a second of work. :func:`send_and_collect` does the same push and pulls, every
:data:`PULL_SECONDS` on that grid; any other grid (the simulation's, the in-process one, a test's) keeps its
own ``send_and_receive``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

#: Seconds between two pulls for replies on Flower's deployment grid. ``FEDRAPP_PULL_SECONDS`` overrides it
#: (``3`` is Flower's own cadence: benchmarks/warm_executor.py measures both); one pull is one small request
#: to the SuperLink.
PULL_SECONDS = 0.2
PULL_SECONDS_ENV = "FEDRAPP_PULL_SECONDS"


def pull_seconds() -> float:
    """:data:`PULL_SECONDS`, or the positive number in ``FEDRAPP_PULL_SECONDS``."""
    try:
        value = float(os.environ.get(PULL_SECONDS_ENV, PULL_SECONDS))
    except ValueError:
        return PULL_SECONDS
    return value if value > 0 else PULL_SECONDS


def pulls_slowly(grid: Grid) -> bool:
    """Whether ``grid`` is Flower's deployment grid, whose ``send_and_receive`` pulls every 3 s."""
    try:
        from flwr.superlink.grid import HttpGrid
    except ImportError:  # another Flower layout: keep its own send_and_receive
        return False
    return isinstance(grid, HttpGrid)


def send_and_collect(grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
    """``grid.send_and_receive(messages, timeout=timeout)``, pulling every :func:`pull_seconds` on the
    deployment grid: push, then pull until every message has its reply or ``timeout`` seconds have passed
    (None: no limit), as Flower's own loop does."""
    if not pulls_slowly(grid):
        return list(grid.send_and_receive(messages, timeout=timeout))
    waiting = set(grid.push_messages(messages))
    end = None if timeout is None else time.time() + timeout
    replies: list[Message] = []
    interval = pull_seconds()
    while end is None or time.time() < end:
        pulled = list(grid.pull_messages(waiting))
        replies += pulled
        waiting.difference_update(m.metadata.reply_to_message_id for m in pulled)
        if not waiting:
            break
        time.sleep(interval)
    return replies
