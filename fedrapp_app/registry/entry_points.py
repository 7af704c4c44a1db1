"""Where server rules and local methods come from: entry points, for the built-ins and plugins alike.

A package registers a rule or a method under a name in its own ``pyproject.toml``::

    [project.entry-points."fedrapp.rules"]
    mean-mix = "my_rules:MEAN_MIX"           # an aggregation.Rule (e.g. a function decorated with @rule)

    [project.entry-points."fedrapp.methods"]
    confident-half = "my_methods:ConfidentHalf"    # a LocalMethod subclass (or a methods.MethodSpec)

and the run config names it (``strategy = "mean-mix"``, ``local-method = "confident-half"``). A module on
``PYTHONPATH`` serves without packaging: ``strategy = "my_rules:MEAN_MIX"``. This project's own rules and methods
are registered the same way, in its pyproject.toml. Only light imports here: the lookups run in the pre-start
checks. docs/extending.md says how to write one.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

RULES = "fedrapp.rules"
METHODS = "fedrapp.methods"
#: What the groups hold, for messages.
KIND = {RULES: "server rule", METHODS: "local method"}


class PluginError(ValueError):
    """A rule or method that cannot be found or loaded; the message names it, where it comes from and the fix."""


@dataclass(frozen=True)
class Found:
    """A rule or method the registry found: its name, the object, and where it comes from."""

    name: str
    target: Any
    origin: str  # e.g. "fedrapp 0.1.0 (entry point fedavg = fedrapp_app.aggregation.baselines:FEDAVG)"
    package: str  # the distribution that provides it ('' for a module:attribute reference)
    version: str = ""  # the distribution's version ('' for a module:attribute reference)
    entry_point: str = ""  # "name = module:attribute" of the entry point ('' for a reference)
    file: str = ""  # a module:attribute reference: the module's file
    parts: tuple[Found, ...] = ()  # a method made of others ("adaprompt+tda"): each part


def _origin(entry: EntryPoint) -> tuple[str, str]:
    dist = entry.dist
    package = f"{dist.name} {dist.version}" if dist is not None else "an unknown package"
    return f"{package} (entry point {entry.name} = {entry.value})", (dist.name if dist is not None else "")


def provenance_of(found: Found) -> dict[str, Any]:
    """Where a rule or method comes from, for a run's config.json and summary.json and a bench cell: the
    distribution and its version and the entry point, or for a ``module:attribute`` reference the module's file
    and the SHA-256 of its bytes now (what ran, even where no package version says so); a method made of others
    lists each part."""
    if found.parts:
        return {"name": found.name, "parts": [provenance_of(part) for part in found.parts]}
    if found.file:
        try:
            digest = hashlib.sha256(open(found.file, "rb").read()).hexdigest()  # noqa: SIM115 - a few KB, once
        except OSError:
            digest = None
        return {"name": found.name, "reference": found.name, "file": found.file, "sha256": digest}
    return {
        "name": found.name,
        "distribution": found.package or None,
        "version": found.version or None,
        "entry_point": found.entry_point or None,
    }


@functools.cache
def registered(group: str) -> dict[str, EntryPoint]:
    """The entry points of ``group`` by name; a name two installed packages both claim is refused."""
    found: dict[str, EntryPoint] = {}
    for entry in entry_points(group=group):
        if entry.name in found and found[entry.name].value != entry.value:
            raise PluginError(
                f"{KIND[group]} {entry.name!r} is registered twice: {_origin(found[entry.name])[0]} and "
                f"{_origin(entry)[0]}; uninstall one of the two packages"
            )
        found[entry.name] = entry
    return found


def is_reference(name: str) -> bool:
    """``module:attribute``: a direct reference to an object in an importable module (e.g. on PYTHONPATH)."""
    return ":" in name


def find(group: str, name: str) -> Found:
    """The rule or method ``name`` of ``group``: a registered name, or a ``module:attribute`` reference.

    Raises :class:`PluginError` naming what is missing or what failed to import, where it comes from and the fix.
    """
    kind = KIND[group]
    if is_reference(name):
        module_name, _, attribute = name.partition(":")
        where = f"{kind} {name!r} (a module:attribute reference)"
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # a plugin's import may fail in any way; name it
            raise PluginError(
                f"{where}: cannot import module {module_name!r}: {type(err).__name__}: {err} (fix: put the file "
                "on PYTHONPATH where the app runs, or install the package that provides it)"
            ) from err
        try:
            target = getattr(module, attribute)
        except AttributeError as err:
            raise PluginError(f"{where}: module {module_name!r} has no attribute {attribute!r}") from err
        file = str(getattr(module, "__file__", "") or "")
        return Found(name, target, f"module {module_name} ({file or 'no file'})", "", file=file)
    entries = registered(group)
    entry = entries.get(name)
    if entry is None:
        listing = ", ".join(sorted(entries)) or "none (is this project installed? pip install -e .)"
        close = difflib.get_close_matches(name, entries, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        raise PluginError(
            f"unknown {kind} {name!r}{guess}; installed: {listing}. A plugin must be installed where it runs (a "
            "rule: where the ServerApp runs; a method: there and on every SuperNode), or named as module:attribute "
            "(`fedrapp-list` lists what is installed, docs/extending.md says how to add one)"
        )
    origin, package = _origin(entry)
    version = entry.dist.version if entry.dist is not None else ""
    try:
        return Found(name, entry.load(), origin, package, version, f"{entry.name} = {entry.value}")
    except Exception as err:  # a plugin's import may fail in any way; name it
        raise PluginError(f"{kind} {name!r} from {origin} failed to load: {type(err).__name__}: {err}") from err


def names(group: str) -> list[str]:
    """The registered names of ``group``, sorted."""
    return sorted(registered(group))
