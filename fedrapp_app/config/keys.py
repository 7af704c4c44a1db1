"""What a run-config key is: its default, range and meaning (``Key``), a group of keys with the checks that
span them (``Group``), and the one-line messages a bad value gets (``problem``, ``override_hint``).

Every group module (``run.py``, ``data.py``, ...) builds one ``Group`` from these; ``schema.py`` puts the groups
together. Nothing here knows any particular key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

Scalar = bool | int | float | str

_KIND = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


class ConfigError(ValueError):
    """A run-config value is unknown, of the wrong type, out of range or contradicts another one."""


@dataclass(frozen=True)
class Key:
    """One run-config key: its default (which also fixes its type), its allowed values, its meaning."""

    name: str
    default: Scalar
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    everyday: bool = False  # shown in the README and first in pyproject.toml; the rest: docs/configuration.md
    resumable: bool = False  # a resumed run may change it; every other key must equal the checkpointed run's
    group: str = ""  # set by the Group that holds the key

    def check(self, value: Any) -> str | None:
        """Return why ``value`` is not allowed for this key, or None when it is."""
        kind = type(self.default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            return f"must be {_KIND[kind]}, got {_KIND.get(type(value), type(value).__name__)} {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(repr, self.choices))}"
        if self.minimum is not None:
            if self.exclusive_minimum and not value > self.minimum:
                return f"must be > {self.minimum}"
            if not self.exclusive_minimum and not value >= self.minimum:
                return f"must be >= {self.minimum}"
        if self.maximum is not None and not value <= self.maximum:
            return f"must be <= {self.maximum}"
        return None

    def allowed(self) -> str:
        """Human-readable description of the allowed values."""
        if self.choices is not None:
            return "one of " + ", ".join(map(repr, self.choices))
        lo = "" if self.minimum is None else f"{'>' if self.exclusive_minimum else '>='} {self.minimum}"
        hi = "" if self.maximum is None else f"<= {self.maximum}"
        bounds = " and ".join(b for b in (lo, hi) if b)
        return _KIND[type(self.default)] + (f" {bounds}" if bounds else "")


#: A group's check of its keys' combinations: the validated values of every key -> one line per problem.
Check = Callable[[Mapping[str, Scalar]], list[str]]


def _no_check(values: Mapping[str, Scalar]) -> list[str]:
    return []


@dataclass(frozen=True)
class Group:
    """The keys of one concern (the docs' sections), and the check of contradictions between keys that each look
    fine alone (``check(values)``: every key's value, defaults included, after each passed its own range)."""

    name: str
    purpose: str
    keys: tuple[Key, ...]
    check: Check = field(default=_no_check)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(replace(k, group=self.name) for k in self.keys))


def merged_params(own_keys: Mapping[str, str], v: Mapping[str, Scalar], where: str) -> dict[str, Any]:
    """The parameters a built-in's own keys give (``own_keys``: config key -> parameter) with the ``key=value``
    pairs of ``v[where]``; a parameter that has a key of its own is refused there."""
    from fedrapp_app.registry.parameters import parse_assignments

    extra = {k.replace("-", "_"): value for k, value in parse_assignments(str(v[where]), where).items()}
    for key, param in own_keys.items():
        if param in extra:
            raise ValueError(
                f"{param!r} has a key of its own (fix: {override_hint(key, example=v[key])}, not in {where})"
            )
    return {**{param: v[key] for key, param in own_keys.items()}, **extra}


def toml_literal(value: Scalar) -> str:
    """A value as TOML writes it (pyproject.toml, the README's table): strings double-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def override_hint(key: str, value: Scalar | None = None, *, example: Scalar | None = None) -> str:
    """``-c "key=value"`` quoted as flwr's ``-c`` parser needs it: TOML values, strings in single quotes.

    Without ``value`` the value is a ``<value>`` placeholder, quoted when ``example`` (any value of the key: its
    default, the one given) is a string.
    """
    if value is None:
        text = "'<value>'" if isinstance(example, str) else "<value>"
    elif isinstance(value, str):
        text = f"'{value}'"
    else:
        text = toml_literal(value)
    return f'-c "{key}={text}"'


def problem(key: str, value: Any, why: str, example: Scalar | None = None) -> str:
    """The line a bad ``value`` of ``key`` gets: what is wrong and how to change it (``example``: a value of the
    key's type, where ``value`` may not be one; default ``value``)."""
    hint = override_hint(key, example=value if example is None else example)
    return f"  {key} = {value!r}: {why} (fix: {hint} or edit [tool.flwr.app.config])"
