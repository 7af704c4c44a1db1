"""Which Flower versions the warm executor supports, checked before any of Flower's internals is imported.

The executor composes modules of Flower that are not a stable public API (the SuperExec loop's Runtime API
client, ``run_clientapp``'s task steps, the SuperNode's task states), so it runs only on the Flower minor
series it was written and tested against. This module imports nothing from Flower: it must be able to
refuse a version whose modules have moved.
"""

from __future__ import annotations

import importlib.metadata
import re

#: Flower (major, minor) series this executor is tested on; every patch release of them is accepted.
SUPPORTED_SERIES: tuple[tuple[int, int], ...] = ((1, 42),)
#: The distribution names Flower is published under (Flower's own version helper reads the same two).
FLOWER_DISTRIBUTIONS = ("flwr", "flwr-nightly")


class UnsupportedFlowerError(RuntimeError):
    """The installed Flower is not one the warm executor supports (the message is one line with the fix)."""


def supported_text() -> str:
    """``"1.42.x"`` (or ``"1.41.x or 1.42.x"``): the supported series, as a person reads them."""
    return " or ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED_SERIES)


def installed_flower() -> str | None:
    """The version of the installed Flower distribution, or None when none is installed."""
    for name in FLOWER_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_flower_version(version: str | None = None, program: str = "fedrapp-superexec") -> str:
    """Return ``version`` (default: the installed Flower's) if ``program`` (``fedrapp-superexec``,
    ``fedrapp-supernode``) supports it.

    Raises
    ------
    UnsupportedFlowerError
        Flower is missing or outside ``SUPPORTED_SERIES``; the message names both versions and the fix.
    """
    found = installed_flower() if version is None else version
    newest_major, newest_minor = SUPPORTED_SERIES[-1]
    fix = (
        f"install it with: pip install 'flwr[simulation]=={newest_major}.{newest_minor}.0' "
        f"(the version fedrapp pins), or start Flower's own {program.replace('fedrapp-', 'flower-')} instead"
    )
    if found is None:
        raise UnsupportedFlowerError(f"{program} needs Flower {supported_text()}, but none is installed; {fix}")
    parsed = re.match(r"(\d+)\.(\d+)", found)
    if parsed is None or (int(parsed.group(1)), int(parsed.group(2))) not in SUPPORTED_SERIES:
        raise UnsupportedFlowerError(
            f"{program} supports Flower {supported_text()}, but Flower {found} is installed; {fix}"
        )
    return found
