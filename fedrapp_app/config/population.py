"""The population group: clients that join late, drop out of rounds or only evaluate (ours; docs/shift.md,
``fedrapp_app.federation.population``)."""

from __future__ import annotations

from collections.abc import Mapping

from fedrapp_app.config.keys import Group, Key, Scalar, problem


def check(v: Mapping[str, Scalar]) -> list[str]:
    """Some client takes part in every round's draw, and from round 1."""
    problems = []
    clients = int(v["num-clients"])  # 0: one per SuperNode, known once the run starts
    if not 0 <= v["drop-rate"] < 1:
        problems.append(problem("drop-rate", v["drop-rate"], "must be below 1 (every client would drop every round)"))
    if clients and v["late-clients"] + v["held-out-clients"] >= clients:
        problems.append(
            problem(
                "late-clients",
                v["late-clients"],
                f"late-clients + held-out-clients = {v['late-clients'] + v['held-out-clients']} must leave a client "
                f"of the {clients} that takes part from round 1",
            )
        )
    return problems


GROUP = Group(
    "population",
    "clients that join late, drop out of rounds or only evaluate (ours; docs/shift.md)",
    (
        Key(
            "late-clients",
            0,
            "clients (the ids just below the held-out ones) that take part only from late-round on; their first prompt "
            "is the rule's for a client never seen (FedRAPP, FedAMP: the mean of the memories)",
            minimum=0,
        ),
        Key("late-round", 5, "the round the late clients join in", minimum=2),
        Key(
            "drop-rate",
            0.0,
            "below 1: each client sampled for a round is absent from it with this probability (seeded per round)",
            minimum=0.0,
        ),
        Key(
            "held-out-clients",
            0,
            "clients (the last ids) that are sent the rule's prompt for a client never seen and scored, but whose "
            "uploads never reach the rule",
            minimum=0,
        ),
        Key("held-out-every", 1, "a held-out client takes a batch every this many rounds", minimum=1),
    ),
    check,
)
