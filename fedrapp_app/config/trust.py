"""The trust group: FedRAPP's trust option (ours; ``fedrapp_app.aggregation.trust``), the rule it selects and its
two targets."""

from __future__ import annotations

from collections.abc import Mapping

from fedrapp_app.config.keys import Group, Key, Scalar, override_hint

#: The option's run-config keys -> the parameters of the rule it selects (``fedrapp-trust``), beside FedRAPP's.
TRUST_KEYS: dict[str, str] = {
    "trust-memory-target": "trust_memory_target",
    "trust-peer-target": "trust_peer_target",
}


def rule_name(v: Mapping[str, Scalar]) -> str:
    """The registry name of the rule the config runs: ``strategy``, or FedRAPP's trust option with trust = true."""
    return "fedrapp-trust" if v["strategy"] == "fedrapp" and v["trust"] else str(v["strategy"])


def check(v: Mapping[str, Scalar]) -> list[str]:
    """The option is FedRAPP's, and its targets act only when it is on."""
    problems = []
    if v["trust"] and v["strategy"] != "fedrapp":
        problems.append(  # the fix is another key's value, so not problem()'s hint to change this one
            f"  trust = True: the trust option is FedRAPP's; strategy = {v['strategy']!r} has none "
            f"(fix: {override_hint('strategy', 'fedrapp')}, or drop trust)"
        )
    inert = [k for k in TRUST_KEYS if v[k] != _DEFAULTS[k]]
    if inert and rule_name(v) != "fedrapp-trust":
        problems.append(  # the fix is another key's value, so not problem()'s hint to change this one
            f"  {inert[0]} = {v[inert[0]]!r}: has no effect: FedRAPP's trust option is off (strategy = "
            f"{v['strategy']!r}, trust = {v['trust']}); it needs strategy='fedrapp' and trust = true "
            f"(fix: {override_hint('trust', True)}, or drop {inert[0]})"
        )
    return problems


GROUP = Group(
    "trust",
    "FedRAPP's trust option (ours)",
    (
        Key(
            "trust",
            False,
            "FedRAPP's trust option (ours): each client's memory and peers are used only as far as they beat its own "
            "last tuned prompt on its new batch (label-free evidence the client reports); false = the paper's rule",
            everyday=True,
        ),
        Key(
            "trust-memory-target",
            0.275,
            "trust option: share of rounds a client's sent prompt must win its neighbour vote for half its memory "
            "(the memory trust ramps from 0 to 1 between this - 0.075 and this + 0.075)",
            minimum=0.0,
            maximum=1.0,
        ),
        Key(
            "trust-peer-target",
            0.15,
            "trust option: share of rounds the paper's prompt must beat a client's own in information for its peer "
            "trust to hold (it rises above, falls below)",
            minimum=0.0,
            maximum=1.0,
        ),
    ),
    check,
)
_DEFAULTS = {key.name: key.default for key in GROUP.keys}
