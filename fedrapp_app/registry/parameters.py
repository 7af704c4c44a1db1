"""Parameters of rules and methods: frozen dataclasses whose fields all have defaults, built from config values.

One builder serves the built-ins and plugins: names may be kebab-case (``gamma-max``, as in a run config) or
snake_case (``gamma_max``); each value is checked against the type of its field's default (an int is a fine
float, a bool is not a number); the dataclass's own ``__post_init__`` checks ranges. Every refusal is a
``ValueError`` that names the owner, the key, what is allowed and the fix. ``parse_assignments`` reads the
``rule-params`` / ``method-params`` strings of a run config (``"weight=0.3 mode='fast'"``).

A field made with :func:`param` (``weight: float = param(0.5, UNIT, "share of the mean")``) carries its allowed
range and meaning: :func:`build_params` checks the range for any dataclass (a rule's ``RuleParams`` checks it
itself too), and ``fedrapp-list`` prints both.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Interval:
    """A range of allowed parameter values, printed the mathematical way (``[0, 1]``, ``(0, inf)``)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below  # False for NaN

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


UNIT = Interval(0.0, 1.0)
NON_NEGATIVE = Interval(0.0, math.inf, high_open=True)
POSITIVE = Interval(0.0, math.inf, low_open=True, high_open=True)


def param(default: Any, allowed: Interval | None = None, help: str = "") -> Any:
    """A parameter field with its default, its allowed range (checked by :func:`build_params`; None: any value
    of the default's type) and a one-line meaning (for ``fedrapp-list`` and errors)."""
    metadata: dict[str, Any] = {"help": help}
    if allowed is not None:
        metadata["allowed"] = allowed
    return dataclasses.field(default=default, metadata=metadata)


def allowed_range(f: dataclasses.Field) -> Interval | None:
    """The range a field made with :func:`param` allows (None: not declared)."""
    allowed = f.metadata.get("allowed")
    return allowed if isinstance(allowed, Interval) else None


def check_ranges(values: Any, owner: str) -> None:
    """Refuse a dataclass instance whose numeric field lies outside its declared range (``ValueError``)."""
    for f in dataclasses.fields(values):
        allowed, value = allowed_range(f), getattr(values, f.name)
        if allowed is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value not in allowed:
            raise ValueError(f"{owner}: {f.name.replace('_', '-')} = {value!r} is outside its allowed range {allowed}")


#: ``key=value`` pairs separated by spaces or commas; values in quotes may hold spaces.
_PAIR = re.compile(r"""([A-Za-z_][\w-]*)\s*=\s*('[^']*'|"[^"]*"|[^\s,]+)""")


def parse_assignments(text: str, where: str) -> dict[str, Any]:
    """``"weight=0.3, mode='fast' on=true"`` -> ``{"weight": 0.3, "mode": "fast", "on": True}``: TOML values; a bare
    word that is not a TOML value is a string. ``where`` names the source in the error."""
    out: dict[str, Any] = {}
    rest = _PAIR.sub("", text).replace(",", " ").strip()
    if rest:
        raise ValueError(f"{where}: cannot read {rest!r}; write key=value pairs, e.g. \"weight=0.3 mode='fast'\"")
    for key, raw in _PAIR.findall(text):
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        if key in out:
            raise ValueError(f"{where}: {key!r} is given twice")
        out[key] = value
    return out


def field_names(cls: type) -> list[str]:
    """The parameter names of ``cls`` in kebab-case (how a run config spells them)."""
    return [f.name.replace("_", "-") for f in dataclasses.fields(cls)]


#: How an error names the type a parameter expects.
_KINDS = {bool: "a bool (true or false)", int: "an int", float: "a float", tuple: "a list", str: "a str"}


def _coerce(owner: str, key: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of the field's ``default``: an int is a fine float, a whole float (``2.0``,
    as a YAML grid or a sweep may write it) a fine int and arrives as an int; a bool is no number."""
    kind = _KINDS.get(type(default), f"a {type(default).__name__}")
    problem = f"{owner}: parameter {key!r} expects {kind}, got {value!r}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(problem)
        return value
    if isinstance(default, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{problem} (write a whole number, e.g. {key}={default!r})")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(problem)
        return float(value)
    if isinstance(default, tuple):
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ValueError(problem)
        return tuple(value)
    if not isinstance(value, type(default)):
        raise ValueError(problem)
    return value


def build_params(cls: type, values: Mapping[str, Any] | None, owner: str) -> Any:
    """``cls(**values)`` for the parameters dataclass ``cls`` of ``owner`` (e.g. "server rule 'fedavg'"), with
    ``values`` keyed kebab- or snake-case, checked as the module docstring says."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{owner}: its parameters must be a dataclass, got {cls!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    required = [name for name, f in fields.items() if f.default is dataclasses.MISSING and f.init]
    required = [n for n in required if fields[n].default_factory is dataclasses.MISSING]  # type: ignore[misc]
    if required:
        raise TypeError(f"{owner}: every parameter needs a default, {required} have none ({cls.__name__})")
    chosen: dict[str, Any] = {}
    for key, value in (values or {}).items():
        name = str(key).replace("-", "_")
        if name not in fields:
            allowed = ", ".join(field_names(cls)) or "none"
            raise ValueError(f"unknown parameter {key!r} for {owner}; allowed: {allowed}")
        if name in chosen:
            raise ValueError(f"parameter {name.replace('_', '-')!r} of {owner} is given twice")
        default = fields[name].default
        chosen[name] = value if default is dataclasses.MISSING else _coerce(owner, key, value, default)
    built = cls(**chosen)
    check_ranges(built, owner)
    return built
