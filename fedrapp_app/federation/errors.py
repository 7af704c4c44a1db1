"""Errors a person can read: one line per failure, the root exception's type and message, no colour codes.

- ``describe(err)``: what a ClientApp reports when it fails (``"OSError: cannot identify image file ..."``).
- ``clean_reason(reason)``: the same for an error reply that Flower built itself (a ClientApp that could not be
  loaded, an exception wrapped by Ray's simulation backend or by a SuperNode's ``flwr-clientapp``), whose text
  holds colour codes, Ray frames and Python's repr of the exception class.
"""

from __future__ import annotations

import re

#: ANSI escape sequences (colours, cursor moves) as Flower's and Ray's loggers write them.
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
#: How long a reason may get in rounds.jsonl and logs; our own messages are far shorter.
MAX_REASON = 2000

_RAY_MESSAGE = "Exception ClientAppException occurred. Message: "
_CLASS_REPR = re.compile(r"^<class '([\w.()]+)'>:<'(.*)'>$", re.S)
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)): (.+)$")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences."""
    return ANSI.sub("", text)


def _bounded(text: str) -> str:
    text = strip_ansi(text).strip()
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def describe(err: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` of ``err`` itself (not of what it wraps), bounded, without colours."""
    message = str(err).strip()
    return _bounded(f"{type(err).__name__}: {message}" if message else type(err).__name__)


def clean_reason(reason: str) -> str:
    """The root error of a Flower error reply's ``reason``, as ``"<ExceptionType>: <message>"`` where it can
    be found; the text without colour codes otherwise.

    Handles the three shapes Flower 1.42 produces: our own ``describe`` text (returned unchanged), the
    SuperNode's ``"<class 'X'>:<'message'>"`` and Ray's backend text, a traceback that ends with
    ``"Exception ClientAppException occurred. Message: <message>"``.
    """
    text = strip_ansi(reason).strip()
    matched = _CLASS_REPR.match(text)
    if matched:
        cls, text = matched.group(1), matched.group(2).strip()
        if _RAY_MESSAGE not in text and "Traceback" not in text and "\n  File " not in text:
            return _bounded(f"{cls.rsplit('.', 1)[-1]}: {text}" if text else cls)
    if _RAY_MESSAGE in text:
        message = text.rsplit(_RAY_MESSAGE, 1)[1].strip()
        # The root exception's own line in the traceback carries its type; Ray's summary only the message.
        for line in reversed(text.splitlines()):
            found = _EXCEPTION_LINE.match(line.strip())
            if found and found.group(2).strip() == message.splitlines()[0].strip():
                return _bounded(f"{found.group(1).rsplit('.', 1)[-1]}: {message}")
        return _bounded(message)
    return _bounded(text)
