"""Server rules as pure numpy functions (SPEC §4–5), and the registry that finds them (entry points) and binds
their parameters from config.

>>> rule = make_rule("fedrapp", {"gamma0": 0.2})  # a registered name (built-in or plugin) or module:attribute
>>> out = rule(tuned, sent, memory, h_pre, h_post, replied, num_examples)  # doctest: +SKIP
>>> out.personalized  # [N, d] float32: what each client is sent next  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from numpy.typing import ArrayLike

from fedrapp_app.aggregation.baselines import (
    FedAMPCosParams,
    FedAMPParams,
    FedAvgParams,
    NoneFedParams,
    fedamp_cos_round,
    fedamp_round,
    fedavg_round,
    none_fed_round,
)
from fedrapp_app.aggregation.common import (
    NON_NEGATIVE,
    PAYLOAD_PREFIX,
    POSITIVE,
    UNIT,
    Diagnostics,
    Interval,
    NoParams,
    RoundInputs,
    RoundOutput,
    RoundRule,
    Rule,
    RuleParams,
    check_output,
    param,
    peer_mixing_round,
    rule,
    send_to_everyone,
    synthetic_round,
    validate_round,
)
from fedrapp_app.aggregation.fedrapp import ABLATIONS, FedRAPPParams, fedrapp_round
from fedrapp_app.aggregation.latte import LatteRuleParams, latte_round
from fedrapp_app.aggregation.oracle import DomainOracleParams, domain_oracle_round
from fedrapp_app.aggregation.robust import (
    FedMedianParams,
    FedTrimmedAvgParams,
    KrumParams,
    fedmedian_round,
    fedtrimmedavg_round,
    krum_round,
)
from fedrapp_app.aggregation.trust import TrustParams, trusted_round
from fedrapp_app.registry import builtins, entry_points
from fedrapp_app.registry.entry_points import Found, PluginError
from fedrapp_app.registry.parameters import build_params

__all__ = [
    "ABLATIONS",
    "NON_NEGATIVE",
    "PAYLOAD_PREFIX",
    "POSITIVE",
    "UNIT",
    "Interval",
    "BUILT_IN",
    "BoundRule",
    "Diagnostics",
    "DomainOracleParams",
    "FedAMPCosParams",
    "FedAMPParams",
    "FedAvgParams",
    "FedMedianParams",
    "FedRAPPParams",
    "FedTrimmedAvgParams",
    "KrumParams",
    "LatteRuleParams",
    "NoParams",
    "NoneFedParams",
    "RoundInputs",
    "RoundOutput",
    "RoundRule",
    "Rule",
    "RuleParams",
    "TrustParams",
    "check_output",
    "domain_oracle_round",
    "fedamp_cos_round",
    "fedamp_round",
    "fedavg_round",
    "fedmedian_round",
    "fedrapp_round",
    "fedtrimmedavg_round",
    "find_rule",
    "krum_round",
    "latte_round",
    "make_params",
    "make_rule",
    "none_fed_round",
    "param",
    "peer_mixing_round",
    "rule",
    "rules",
    "send_to_everyone",
    "synthetic_round",
    "trusted_round",
    "validate_round",
]


def find_rule(name: str) -> Found:
    """The registered rule ``name`` (entry-point group ``fedrapp.rules``) or a ``module:attribute`` reference, as
    a :class:`~fedrapp_app.registry.entry_points.Found` whose ``target`` is a :class:`Rule` (a bare round function is
    taken as a rule without parameters). Raises ``PluginError`` naming the plugin and the fix."""
    found = entry_points.find(entry_points.RULES, name)
    target = found.target
    if not isinstance(target, Rule):
        if not callable(target):
            raise PluginError(
                f"server rule {name!r} from {found.origin} is a {type(target).__name__}, not a Rule or a round "
                "function (see docs/extending.md)"
            )
        target = Rule(target, summary=(target.__doc__ or "").strip().split("\n")[0])
    return replace(found, target=target)


def rules() -> dict[str, Rule]:
    """Every registered rule by name (built-ins and installed plugins), loaded."""
    return {name: find_rule(name).target for name in entry_points.names(entry_points.RULES)}


#: The rules registered by this project (its pyproject.toml's entry points).
BUILT_IN = (*builtins.RULES, *builtins.OPTIONS)


def make_params(name: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """Hyperparameters of rule ``name``: its defaults with ``overrides`` applied (kebab- or snake-case keys),
    type- and range-checked (``ValueError`` naming the key, what is allowed and the fix)."""
    return build_params(find_rule(name).target.params, overrides, f"server rule {name!r}")


@dataclass(frozen=True)
class BoundRule:
    """A server rule with its hyperparameters bound; call it with the seven round arrays."""

    name: str
    rule: Rule
    params: Any
    origin: str = ""

    def __call__(
        self,
        tuned: ArrayLike,
        sent: ArrayLike,
        memory: ArrayLike,
        h_pre: ArrayLike,
        h_post: ArrayLike,
        replied: ArrayLike,
        num_examples: ArrayLike,
        *,
        own: Mapping[str, ArrayLike] | None = None,
        state: Mapping[str, ArrayLike] | None = None,
        payload: Mapping[str, ArrayLike] | None = None,
    ) -> RoundOutput:
        """The rule on one round; ``own`` (``trust.OwnPromptReports``'s fields [N], NaN where not reported) and
        ``state`` reach only a stateful rule, ``payload`` (the arrays uploaded beside the prompts, [N, ...] by
        name) only a rule that reads it."""
        extra: dict[str, Any] = {"payload": dict(payload or {})} if self.rule.reads_payload else {}
        if self.rule.stateful:
            extra.update(own or {})
            extra["state"] = state
        return self.rule(tuned, sent, memory, h_pre, h_post, replied, num_examples, self.params, **extra)

    def summary(self) -> dict[str, Any]:
        """The rule's name and every hyperparameter, for the run log."""
        return {"rule": self.name, **asdict(self.params)}


def make_rule(name: str, overrides: Mapping[str, Any] | None = None) -> BoundRule:
    """Rule ``name`` (see :func:`find_rule`) bound to :func:`make_params` ``(name, overrides)``."""
    found = find_rule(name)
    params = build_params(found.target.params, overrides, f"server rule {name!r}")
    return BoundRule(name, found.target, params, found.origin)
