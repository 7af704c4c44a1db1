"""The attack group: adversarial clients, for robustness experiments (``fedrapp_app.federation.attacks``)."""

from __future__ import annotations

from collections.abc import Mapping

from fedrapp_app.config.keys import Group, Key, Scalar, problem


def attack_clients(text: str) -> frozenset[int]:
    """Client ids of ``attack-clients`` ('' = none); ValueError on anything but comma-separated integers."""
    return frozenset(int(part) for part in text.split(",") if part.strip())


def check(v: Mapping[str, Scalar]) -> list[str]:
    """The adversarial clients exist and have an attack to make."""
    clients = int(v["num-clients"])  # 0: one per SuperNode, known once the run starts
    try:
        attackers = attack_clients(str(v["attack-clients"]))
    except ValueError:
        return [problem("attack-clients", v["attack-clients"], "must be comma-separated client ids")]
    problems = []
    if clients and any(not 0 <= c < clients for c in attackers):
        problems.append(problem("attack-clients", v["attack-clients"], f"ids must be in 0..{clients - 1}"))
    if attackers and v["attack"] == "none":
        problems.append(problem("attack", "none", "attack-clients is set: choose 'random' or 'scaled'"))
    return problems


GROUP = Group(
    "attack",
    "adversarial clients, for robustness experiments",
    (
        Key(
            "attack",
            "none",
            "what the clients in attack-clients upload instead of their tuned prompt",
            choices=("none", "random", "scaled"),
        ),  # see fedrapp_app/federation/attacks.py
        Key("attack-clients", "", "comma-separated ids of adversarial clients, e.g. '0,5'"),
        Key(
            "attack-scale",
            10.0,
            "scaled attack: the upload is sent + attack-scale * (tuned - sent)",
            minimum=0.0,
        ),
    ),
    check,
)
