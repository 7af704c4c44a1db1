"""Local test-time methods behind one interface (SPEC §3), built by name through an explicit registry."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedrapp_app.methods.adaprompt import AdaPrompt, AdaPromptParams, ConfidenceBuffer
from fedrapp_app.methods.base import Adaptation, LocalMethod
from fedrapp_app.methods.im import IMParams, InformationMaximisation
from fedrapp_app.methods.tpt import TPT, TPTOnline, TPTParams
from fedrapp_app.methods.zeroshot import ZeroShot, ZeroShotParams

#: name -> (method class, its hyperparameter dataclass)
METHODS: dict[str, tuple[type[LocalMethod], type]] = {
    "zeroshot": (ZeroShot, ZeroShotParams),
    "tpt": (TPT, TPTParams),
    "tpt-online": (TPTOnline, TPTParams),
    "adaprompt": (AdaPrompt, AdaPromptParams),
    "im": (InformationMaximisation, IMParams),  # ours (SHOT-style information maximisation)
}


def _coerce(method: str, key: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of the field's default (config files give ints for floats)."""
    problem = f"{method}: parameter {key!r} expects a {type(default).__name__}, got {value!r}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(problem)
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(problem)
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(problem)
        return float(value)
    if isinstance(default, tuple):
        if isinstance(value, str) or not all(isinstance(item, str) for item in value):
            raise ValueError(problem)
        return tuple(value)
    if not isinstance(value, type(default)):
        raise ValueError(problem)
    return value


def make_method(name: str, params: Mapping[str, Any] | None = None, **overrides: Any) -> LocalMethod:
    """Build the local method ``name`` with hyperparameters from ``params`` and/or keyword overrides.

    Keys may be kebab-case (``n-views``) or snake_case (``n_views``). Unknown names or parameters raise
    ``ValueError`` listing the allowed ones.
    """
    if name not in METHODS:
        raise ValueError(f"unknown local method {name!r}; choose one of {sorted(METHODS)}")
    method_class, params_class = METHODS[name]
    fields = {field.name: field for field in dataclasses.fields(params_class)}
    values: dict[str, Any] = {}
    for key, value in [*(params or {}).items(), *overrides.items()]:
        field_name = key.replace("-", "_")
        if field_name not in fields:
            allowed = ", ".join(f.replace("_", "-") for f in fields)
            raise ValueError(f"unknown parameter {key!r} for method {name!r}; allowed: {allowed}")
        if field_name in values:
            raise ValueError(f"parameter {key!r} of method {name!r} is given twice")
        values[field_name] = _coerce(name, key, value, fields[field_name].default)
    return method_class(params_class(**values))


__all__ = [
    "METHODS",
    "TPT",
    "AdaPrompt",
    "AdaPromptParams",
    "Adaptation",
    "ConfidenceBuffer",
    "IMParams",
    "InformationMaximisation",
    "LocalMethod",
    "TPTOnline",
    "TPTParams",
    "ZeroShot",
    "ZeroShotParams",
    "make_method",
]
