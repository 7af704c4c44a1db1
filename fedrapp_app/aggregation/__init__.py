"""Server rules as pure numpy functions (SPEC §4–5), and the registry that builds them from config.

>>> rule = make_rule("fedrapp", {"gamma0": 0.2})
>>> out = rule(tuned, sent, memory, h_pre, h_post, replied, num_examples)  # doctest: +SKIP
>>> out.personalized  # [N, d] float32: what each client is sent next  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
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
from fedrapp_app.aggregation.common import Diagnostics, RoundOutput, RoundRule, RuleParams, synthetic_round
from fedrapp_app.aggregation.fedrapp import ABLATIONS, FedRAPPParams, fedrapp_round
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

__all__ = [
    "krum_round",
    "fedtrimmedavg_round",
    "fedmedian_round",
    "KrumParams",
    "FedTrimmedAvgParams",
    "FedMedianParams",
    "ABLATIONS",
    "PARAMS",
    "REFERENCES",
    "RULES",
    "STATEFUL",
    "BoundRule",
    "Diagnostics",
    "DomainOracleParams",
    "FedAMPCosParams",
    "FedAMPParams",
    "FedAvgParams",
    "FedRAPPParams",
    "NoneFedParams",
    "RoundOutput",
    "RoundRule",
    "RuleParams",
    "TrustParams",
    "domain_oracle_round",
    "fedamp_cos_round",
    "fedamp_round",
    "fedavg_round",
    "fedrapp_round",
    "make_params",
    "make_rule",
    "none_fed_round",
    "synthetic_round",
    "trusted_round",
]

RULES: dict[str, RoundRule] = {
    "fedrapp": fedrapp_round,
    "fedrapp-trust": trusted_round,  # FedRAPP with its trust option (ours): strategy = "fedrapp", trust = true
    "none-fed": none_fed_round,
    "fedavg": fedavg_round,
    "fedamp": fedamp_round,
    "fedamp-cos": fedamp_cos_round,
    "fedmedian": fedmedian_round,
    "fedtrimmedavg": fedtrimmedavg_round,
    "krum": krum_round,
    "domain-oracle": domain_oracle_round,  # a reference with privileged information, not a deployable rule
}

PARAMS: dict[str, type[RuleParams]] = {
    "fedrapp": FedRAPPParams,
    "fedrapp-trust": TrustParams,
    "none-fed": NoneFedParams,
    "fedavg": FedAvgParams,
    "fedamp": FedAMPParams,
    "fedamp-cos": FedAMPCosParams,
    "fedmedian": FedMedianParams,
    "fedtrimmedavg": FedTrimmedAvgParams,
    "krum": KrumParams,
    "domain-oracle": DomainOracleParams,
}

#: Rules that use information a real deployment does not have; every table marks them as references.
REFERENCES = frozenset({"domain-oracle"})

#: Rules that take the keyword inputs ``state`` (what the rule carried from its previous round, ``RoundOutput.state``)
#: and the clients' reports about their own last tuned prompt (``trust.OwnPromptReports``'s fields, NaN where none).
STATEFUL = frozenset({"fedrapp-trust"})


def _check_name(name: str) -> str:
    if name not in RULES:
        raise ValueError(f"unknown server rule {name!r}; allowed: {', '.join(RULES)}")
    return name


def make_params(name: str, overrides: Mapping[str, Any] | None = None) -> RuleParams:
    """Hyperparameters of rule ``name``: the SPEC defaults with ``overrides`` applied, range-checked.

    Keys may be snake_case (``gamma_max``) or kebab-case (``gamma-max``, as in a Flower run config).
    """
    cls = PARAMS[_check_name(name)]
    allowed = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        field_name = str(key).replace("-", "_")
        if field_name not in allowed:
            listing = ", ".join(allowed) if allowed else "none"
            raise ValueError(f"unknown parameter {key!r} for server rule {name!r}; allowed: {listing}")
        if field_name in values:
            raise ValueError(f"parameter {field_name!r} of server rule {name!r} is given twice")
        values[field_name] = value
    return cls(**values)


@dataclass(frozen=True)
class BoundRule:
    """A server rule with its hyperparameters bound; call it with the seven round arrays."""

    name: str
    params: RuleParams

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
    ) -> RoundOutput:
        """The rule on one round; ``own`` (``trust.OwnPromptReports``'s fields [N], NaN where not reported) and
        ``state`` reach only the rules in :data:`STATEFUL`."""
        rule = RULES[self.name]
        if self.name in STATEFUL:
            return rule(  # type: ignore[call-arg]
                tuned, sent, memory, h_pre, h_post, replied, num_examples, self.params, **(own or {}), state=state
            )
        return rule(tuned, sent, memory, h_pre, h_post, replied, num_examples, self.params)

    def summary(self) -> dict[str, Any]:
        """The rule's name and every hyperparameter, for the run log."""
        return {"rule": self.name, **asdict(self.params)}  # type: ignore[call-overload]


def make_rule(name: str, overrides: Mapping[str, Any] | None = None) -> BoundRule:
    """Rule ``name`` (one of :data:`RULES`) bound to :func:`make_params` ``(name, overrides)``."""
    return BoundRule(name, make_params(name, overrides))
