"""The launcher's own output, kept working when whoever read it has gone.

``fedrapp-sim ... | tee log``: Ctrl-C stops ``tee`` together with the launcher (the shell signals the whole
pipeline), so the launcher's next line to the pipe fails with ``BrokenPipeError``. Unhandled, that error cut the stop
short: exit status 1 instead of 130, no resume command, no ``summary.json`` saying the run was stopped. Here
``stdout`` and ``stderr`` are wrapped so that a write which fails moves the stream to the terminal the user typed
in (``/dev/tty``), or, where there is none (a batch job, CI), drops what follows: the run, its stop and its
files go on whatever happens to the pipe.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

#: Where the output goes once its pipe is gone: the controlling terminal of the launcher, when it has one.
TERMINAL = "/dev/tty"


def open_terminal() -> TextIO:
    """The user's terminal for writing, else a sink (``os.devnull``): nothing can fail after this."""
    try:
        return open(TERMINAL, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 - lives as long as the stream
    except OSError:
        return open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115


class FallbackStream(io.TextIOBase):
    """A text stream that writes to ``stream`` until a write or flush fails with an ``OSError`` (a broken pipe, a
    closed terminal), then to ``fallback()`` from that line on; it never raises for a lost reader."""

    def __init__(self, stream: TextIO, fallback: Callable[[], TextIO] = open_terminal) -> None:
        super().__init__()
        self.stream, self._fallback, self.moved = stream, fallback, False

    def _move(self) -> None:
        # What the dead stream still buffers would fail again when Python flushes it at exit (exit status 120):
        # its file descriptor takes os.devnull, where that flush goes quietly.
        with contextlib.suppress(OSError, ValueError):
            sink = os.open(os.devnull, os.O_WRONLY)
            os.dup2(sink, self.stream.fileno())
            os.close(sink)
        self.stream, self.moved = self._fallback(), True

    def write(self, text: str) -> int:
        try:
            self.stream.write(text)
            if "\n" in text:  # a pipe is block-buffered: a broken one fails on the flush, here, not at exit
                self.stream.flush()
        except OSError:
            if self.moved:
                return len(text)
            self._move()
            return self.write(text)
        return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            if not self.moved:
                self._move()

    def isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"


@contextlib.contextmanager
def resilient_output(fallback: Callable[[], TextIO] = open_terminal) -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`FallbackStream` for the time inside (both restored after)."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = FallbackStream(sys.stdout, fallback), FallbackStream(sys.stderr, fallback)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        sys.stdout, sys.stderr = before
