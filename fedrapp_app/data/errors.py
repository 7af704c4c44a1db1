"""Errors of the data layer: a bad setting is a ``ValueError``; missing data is a ``DataUnavailableError``."""

from __future__ import annotations

from collections.abc import Sequence


class DataUnavailableError(RuntimeError):
    """A dataset could not be found or fetched: the message says what was tried and how to fix it."""


def unavailable(
    what: str,
    tried: str,
    *,
    fix: Sequence[str],
    keys: Sequence[str],
    cause: BaseException | None = None,
) -> DataUnavailableError:
    """Build a ``DataUnavailableError`` whose message a user can act on without reading a traceback.

    Parameters
    ----------
    what : the dataset, e.g. ``"oxford-pets (test split)"``.
    tried : the source and location that failed, e.g. ``"webdataset from the Hub repo clip-benchmark/..."``.
    fix : one line per way to make the data available (download command, expected layout, ...).
    keys : the run-config keys that point at the data (kebab-case), e.g. ``("data-dir", "hf-repo")``.
    cause : the underlying exception; summarised on one line (the full chain stays attached by ``from``).
    """
    lines = [f"dataset {what} is not available: tried {tried}."]
    if cause is not None:
        summary = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        lines.append(f"  cause: {type(cause).__name__}: {summary}"[:400])
    lines.append("  to fix it:")
    lines.extend(f"    - {line}" for line in fix)
    lines.append("  config keys that point at the data: " + ", ".join(keys))
    return DataUnavailableError("\n".join(lines))
