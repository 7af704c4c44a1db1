"""Local test-time methods behind one interface (SPEC §3), found by name in the entry-point group
``fedrapp.methods`` (the built-ins and plugins alike; ``fedrapp_app.registry``).

This module imports no torch: the run config's checks look methods up and check their parameters before
anything heavy; :func:`make_method` imports the implementing class when a client builds the method. The classes
(``AdaPrompt``, ``TPT``, ...) are importable from here as before, loaded on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from fedrapp_app.methods.params import (
    AdaPromptParams,
    IMParams,
    LatteParams,
    MethodSpec,
    TDAParams,
    TPTParams,
    ZeroParams,
    ZeroShotParams,
    stacked_spec,
)
from fedrapp_app.registry import builtins, entry_points
from fedrapp_app.registry.entry_points import Found, PluginError
from fedrapp_app.registry.parameters import build_params

#: The methods registered by this project (its pyproject.toml's entry points).
BUILT_IN = builtins.METHODS


def find_method(name: str) -> Found:
    """The registered local method ``name`` or a ``module:Class`` reference, as a
    :class:`~fedrapp_app.registry.entry_points.Found` whose ``target`` is a :class:`MethodSpec` (a LocalMethod
    subclass is taken with its ``Params`` attribute). Raises ``PluginError`` naming the plugin and the fix."""
    if "+" in name:
        return _stacked(name)
    found = entry_points.find(entry_points.METHODS, name)
    target = found.target
    if not isinstance(target, MethodSpec):
        params = getattr(target, "Params", None)
        if not isinstance(target, type) or params is None:
            raise PluginError(
                f"local method {name!r} from {found.origin} is a {type(target).__name__}, not a LocalMethod class "
                "with a Params attribute or a MethodSpec (see docs/extending.md)"
            )
        doc = (target.__doc__ or "").strip().splitlines()
        target = MethodSpec(
            f"{target.__module__}:{target.__qualname__}",
            params,
            doc[0] if doc else "",
            uploads_payload=bool(getattr(target, "uploads_payload", False)),
        )
    return dataclasses.replace(found, target=target)


def _stacked(name: str) -> Found:
    """``base+head``: a prompt-tuning method with a training-free prediction step (``methods/stacked.py``)."""
    base_name, _, head_name = name.partition("+")
    if not base_name or not head_name or "+" in head_name:
        raise PluginError(f"local method {name!r}: write one method and one head, e.g. 'adaprompt+tda'")
    base, head = find_method(base_name), find_method(head_name)
    heads = sorted(n for n, spec in methods().items() if spec.head)
    if not head.target.head:
        raise PluginError(f"local method {name!r}: {head_name!r} is not a prediction head; the heads are {heads}")
    if base.target.head or base.target.implementation.endswith(":ZeroShot"):
        raise PluginError(
            f"local method {name!r}: {base_name!r} tunes no prompt, so {head_name!r} alone does the same; "
            f"stack a head on a prompt-tuning method (e.g. 'adaprompt+{head_name}')"
        )
    origin = base.origin if base.origin == head.origin else f"{base.origin} + {head.origin}"
    spec = stacked_spec(base.name, base.target, head.name, head.target)
    return Found(name, spec, origin, base.package, parts=(base, head))


def methods() -> dict[str, MethodSpec]:
    """Every registered method by name (built-ins and installed plugins)."""
    return {name: find_method(name).target for name in entry_points.names(entry_points.METHODS)}


def method_params(name: str, params: Mapping[str, Any] | None = None, **overrides: Any) -> Any:
    """The parameters of method ``name``: its defaults with ``params`` and the keyword ``overrides`` applied
    (kebab- or snake-case keys, a key given in both is refused), type- and range-checked (``ValueError``)."""
    spec = find_method(name).target
    values = dict(params or {})
    for key, value in overrides.items():
        if key in values or key.replace("_", "-") in values or key.replace("-", "_") in values:
            raise ValueError(f"parameter {key!r} of local method {name!r} is given twice")
        values[key] = value
    return build_params(spec.params, values, f"local method {name!r}")


def make_method(name: str, params: Mapping[str, Any] | None = None, **overrides: Any) -> Any:
    """Build the local method ``name`` (a :class:`~fedrapp_app.methods.base.LocalMethod`) with hyperparameters
    from ``params`` and/or keyword overrides (see :func:`method_params`)."""
    found = find_method(name)
    values = method_params(name, params, **overrides)
    try:
        method_class = found.target.load()
    except Exception as err:  # a plugin's import may fail in any way; name it
        raise PluginError(
            f"local method {name!r} from {found.origin}: cannot import {found.target.implementation}: "
            f"{type(err).__name__}: {err}"
        ) from err
    return method_class(values)


#: Classes importable from here, loaded on first use (they import torch).
_LAZY = {
    "Adaptation": "fedrapp_app.methods.base",
    "LocalMethod": "fedrapp_app.methods.base",
    "AdaPrompt": "fedrapp_app.methods.adaprompt",
    "ConfidenceBuffer": "fedrapp_app.methods.adaprompt",
    "InformationMaximisation": "fedrapp_app.methods.im",
    "TPT": "fedrapp_app.methods.tpt",
    "TPTOnline": "fedrapp_app.methods.tpt",
    "ZeroShot": "fedrapp_app.methods.zeroshot",
    "ZeroShotEnsemble": "fedrapp_app.methods.zeroshot",
    "Zero": "fedrapp_app.methods.zero",
    "TDA": "fedrapp_app.methods.tda",
    "Latte": "fedrapp_app.methods.latte",
    "Stacked": "fedrapp_app.methods.stacked",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUILT_IN",
    "TPT",
    "AdaPrompt",
    "AdaPromptParams",
    "Adaptation",
    "ConfidenceBuffer",
    "IMParams",
    "InformationMaximisation",
    "Latte",
    "LatteParams",
    "LocalMethod",
    "MethodSpec",
    "TDA",
    "TDAParams",
    "Stacked",
    "TPTOnline",
    "TPTParams",
    "Zero",
    "ZeroParams",
    "ZeroShot",
    "ZeroShotEnsemble",
    "ZeroShotParams",
    "find_method",
    "make_method",
    "method_params",
    "methods",
]
