"""Parameters of rules and methods: frozen dataclasses whose fields all have defaults, built from config values.

One builder serves the built-ins and plugins: names may be kebab-case (``gamma-max``, as in a run config) or
snake_case (``gamma_max``); each value is checked against the type of its field's default (an int is a fine
float, a bool is not a number); the dataclass's own ``__post_init__`` checks ranges. Every refusal is a
``ValueError`` that names the owner, the key, what is allowed and the fix. ``parse_assignments`` reads the
``rule-params`` / ``method-params`` strings of a run config (``"weight=0.3 mode='fast'"``).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from typing import Any

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


def _coerce(owner: str, key: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of the field's ``default`` (an int is a fine float; a bool is no number)."""
    problem = f"{owner}: parameter {key!r} expects a {type(default).__name__}, got {value!r}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(problem)
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(problem)
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
    return cls(**chosen)
