"""The server rule group: how the server mixes the clients' prompts (FedRAPP: SPEC §4; the baselines: SPEC §5;
``fedrapp_app.aggregation``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedrapp_app.config.keys import Group, Key, Scalar, merged_params, problem
from fedrapp_app.config.trust import TRUST_KEYS, rule_name

#: Run-config keys of each server rule's hyperparameters -> the rule's parameter names.
RULE_KEYS: dict[str, dict[str, str]] = {
    "fedrapp": {
        "lambda-drop": "lambda_drop",
        "lambda-ent": "lambda_ent",
        "lambda-drift": "lambda_drift",
        "mu0": "mu0",
        "eta": "eta",
        "tau": "tau",
        "gamma0": "gamma0",
        "gamma-max": "gamma_max",
        "update-clip": "update_clip",
    },
    "none-fed": {},
    "fedavg": {},
    "fedamp": {"fedamp-sigma": "sigma", "fedamp-self-min": "min_self_weight"},
    "fedamp-cos": {"fedamp-cos-sigma": "sigma", "fedamp-cos-self-weight": "self_weight"},
    "fedmedian": {},
    "fedtrimmedavg": {"trimmed-beta": "beta"},
    "krum": {"krum-malicious": "num_malicious"},
    "domain-oracle": {},  # its parameter, the client -> domain map, comes from the data spec
}
#: FedRAPP with its trust option (``trust = true``): the paper's keys and the option's two targets.
RULE_KEYS["fedrapp-trust"] = {**RULE_KEYS["fedrapp"], **TRUST_KEYS}


def resolve_rule(v: Mapping[str, Scalar]):
    """The :class:`~fedrapp_app.aggregation.Rule` the config runs (``PluginError`` if it is not installed here)."""
    from fedrapp_app.aggregation import find_rule

    return find_rule(rule_name(v)).target


def rule_values(v: Mapping[str, Scalar], groups: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """The rule's parameters the config gives (its own keys and ``rule-params``), checked: a ``ValueError`` or
    ``TypeError`` names the bad one. A reference rule (the domain oracle) also gets ``groups``, the client ->
    domain map (a placeholder for the checks made before the clients are known)."""
    from fedrapp_app.registry.parameters import build_params

    name = rule_name(v)
    rule = resolve_rule(v)
    values = merged_params(RULE_KEYS.get(name, {}), v, "rule-params")
    if rule.reference:
        values["groups"] = groups
    build_params(rule.params, values, f"server rule {name!r}")
    return values


def check(v: Mapping[str, Scalar]) -> list[str]:
    """FedRAPP's peer share: its base no larger than its cap."""
    if v["gamma0"] > v["gamma-max"]:
        return [problem("gamma0", v["gamma0"], f"cannot exceed gamma-max = {v['gamma-max']}")]
    return []


GROUP = Group(
    "server rule",
    "how the server mixes the clients' prompts",
    (
        Key(
            "lambda-drop",
            1.0,
            "FedRAPP weight of the entropy drop H_pre - H_post in the reliability",
            minimum=0.0,
        ),
        Key(
            "lambda-ent",
            0.5,
            "FedRAPP weight of the post-adaptation entropy in the reliability",
            minimum=0.0,
        ),
        Key("lambda-drift", 0.5, "FedRAPP weight of the prompt drift in the reliability", minimum=0.0),
        Key("mu0", 0.5, "FedRAPP base memory rate", minimum=0.0, maximum=1.0),
        Key("eta", 0.15, "FedRAPP reliability slope of the memory rate", minimum=0.0),
        Key(
            "tau",
            0.2,
            "FedRAPP temperature of the peer weights",
            minimum=0.0,
            exclusive_minimum=True,
        ),
        Key(
            "gamma0",
            0.3,
            "FedRAPP base share of the peers in the personalized prompt",
            minimum=0.0,
            maximum=1.0,
        ),
        Key("gamma-max", 0.8, "FedRAPP cap of the peers' share", minimum=0.0, maximum=1.0),
        Key(
            "update-clip",
            0.0,
            "FedRAPP (ours): memories and peer mixing use each update clipped to this multiple "
            "of the round's median update norm; the reliability still sees the raw update (0 = off)",
            minimum=0.0,
        ),
        Key(
            "fedamp-sigma",
            1.0,
            "FedAMP kernel scale sigma of exp(-||Pi - Pj||^2 / sigma)",
            minimum=0.0,
            exclusive_minimum=True,
        ),
        Key("fedamp-self-min", 0.1, "FedAMP smallest self weight xi_ii", minimum=0.0, maximum=1.0),
        Key(
            "fedamp-cos-sigma",
            10.0,
            "HeurFedAMP (fedamp-cos) sharpness of exp(sigma * cos)",
            minimum=0.0,
            exclusive_minimum=True,
        ),
        Key(
            "fedamp-cos-self-weight",
            0.5,
            "HeurFedAMP (fedamp-cos) fixed self weight xi_ii",
            minimum=0.0,
            maximum=1.0,
        ),
        Key("trimmed-beta", 0.2, "FedTrimmedAvg share cut at each end", minimum=0.0, maximum=0.49),
        Key("krum-malicious", 1.0, "Krum: number of adversarial clients tolerated", minimum=0.0),
        Key(
            "rule-params",
            "",
            "parameters of the strategy's rule as key=value pairs, e.g. 'weight=0.3 mode=\"fast\"' (any rule, plugins "
            "included; fedrapp-list shows each rule's parameters); a built-in's own key above may not be given here "
            "too",
        ),
    ),
    check,
)
