"""The one module a plugin imports: everything a server rule or a local method of one's own needs, the registry
that finds them, and the conformance kit that checks them (docs/extending.md lists every name).

    from fedrapp_app.plugins import UNIT, RuleParams, param, peer_mixing_round, rule, validate_round   # a rule
    from fedrapp_app.plugins import Adaptation, LocalMethod, MethodSpec, check_prompt, entropy        # a method
    from fedrapp_app.plugins import parametrize_with_checks                                           # its tests

Importing it costs no torch: a rule's author never pays for it, and a method's parameters are checked before a
run starts without it. The torch-backed names (``LocalMethod``, ``Adaptation``, the helpers of
``methods/base.py``, ``TrainingFree``) and the conformance kit load on first use.

``fedrapp-list`` (``catalogue``) lists every rule and method the registry finds; ``fedrapp-plugin new``
(``scaffold``) writes a plugin package that installs and passes its tests as generated.
"""

from __future__ import annotations

import importlib
from typing import Any

from fedrapp_app.aggregation import find_rule, make_params, make_rule, rules
from fedrapp_app.aggregation.common import (
    NEWCOMER_PROMPTS,
    PAYLOAD_PREFIX,
    PROBE,
    PROBES,
    Diagnostics,
    NoParams,
    RoundInputs,
    RoundOutput,
    RoundRule,
    Rule,
    RuleParams,
    check_output,
    keep_rows,
    masked_zscore,
    memory_own_weight,
    mixing_diagnostics,
    peer_mixing_round,
    rule,
    send_to_everyone,
    synthetic_round,
    unchanged_round,
    update_norms,
    validate_round,
)
from fedrapp_app.methods import find_method, make_method, method_params, methods
from fedrapp_app.methods.params import MethodSpec
from fedrapp_app.registry.entry_points import (
    KIND,
    METHODS,
    RULES,
    Found,
    PluginError,
    find,
    is_reference,
    names,
    provenance_of,
    registered,
)
from fedrapp_app.registry.parameters import (
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    Interval,
    build_params,
    param,
    parse_assignments,
)

#: Names loaded on first use: they import torch (a method's side) or pytest (the conformance kit).
_LAZY = {
    **dict.fromkeys(
        (
            "Adaptation",
            "LocalMethod",
            "OwnPrompt",
            "adamw_state_arrays",
            "batch_marginal_entropy",
            "check_prompt",
            "check_state_keys",
            "detached",
            "entropy",
            "initial_context",
            "load_adamw_state",
            "mean_entropy",
            "predicted",
            "scored",
            "with_own_score",
        ),
        "fedrapp_app.methods.base",
    ),
    "TrainingFree": "fedrapp_app.methods.trainingfree",
    **dict.fromkeys(
        ("Check", "check_method", "check_rule", "method_checks", "parametrize_with_checks", "rule_checks"),
        "fedrapp_app.plugins.conformance",
    ),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    # the registry
    "KIND",
    "METHODS",
    "RULES",
    "Found",
    "PluginError",
    "find",
    "find_method",
    "find_rule",
    "is_reference",
    "make_method",
    "make_params",
    "make_rule",
    "method_params",
    "methods",
    "names",
    "provenance_of",
    "registered",
    "rules",
    # parameters
    "NON_NEGATIVE",
    "POSITIVE",
    "UNIT",
    "Interval",
    "build_params",
    "param",
    "parse_assignments",
    # a server rule
    "NEWCOMER_PROMPTS",
    "PAYLOAD_PREFIX",
    "PROBE",
    "PROBES",
    "Diagnostics",
    "NoParams",
    "RoundInputs",
    "RoundOutput",
    "RoundRule",
    "Rule",
    "RuleParams",
    "check_output",
    "keep_rows",
    "masked_zscore",
    "memory_own_weight",
    "mixing_diagnostics",
    "peer_mixing_round",
    "rule",
    "send_to_everyone",
    "synthetic_round",
    "unchanged_round",
    "update_norms",
    "validate_round",
    # a local method
    "MethodSpec",
    *sorted(name for name, module in _LAZY.items() if module.startswith("fedrapp_app.methods")),
    # the conformance kit
    *sorted(name for name, module in _LAZY.items() if module == "fedrapp_app.plugins.conformance"),
]
