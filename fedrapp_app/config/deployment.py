"""The deployment group: waiting for nodes, timeouts and what the server accepts."""

from __future__ import annotations

import os
from collections.abc import Mapping

from fedrapp_app.config.keys import Group, Key, Scalar, problem

#: Set by fedrapp-sim to the number of SuperNodes it asked Flower's simulation for: all of them are registered
#: before the ServerApp starts, so with num-clients = 0 the count is final once it reaches this number (no settle).
EXPECTED_NODES_ENV = "FEDRAPP_EXPECTED_NODES"


def expected_nodes() -> int:
    """The SuperNodes fedrapp-sim started (:data:`EXPECTED_NODES_ENV`); 0 when unknown (plain flwr run, deployment)."""
    try:
        return max(0, int(os.environ.get(EXPECTED_NODES_ENV, "0")))
    except ValueError:
        return 0


def check(v: Mapping[str, Scalar]) -> list[str]:
    """No more nodes awaited than there are clients."""
    clients = int(v["num-clients"])  # 0: one per SuperNode, known once the run starts
    if clients and v["min-nodes"] > clients:
        return [problem("min-nodes", v["min-nodes"], f"cannot exceed num-clients = {clients}")]
    return []


GROUP = Group(
    "deployment",
    "waiting for nodes, timeouts and what the server accepts",
    (
        Key(
            "min-nodes",
            0,
            "nodes to wait for before round 1; 0 = num-clients (or 1 when num-clients = 0)",
            minimum=0,
        ),
        Key(
            "node-wait-timeout",
            300.0,
            "seconds to wait for min-nodes nodes",
            minimum=0.0,
            exclusive_minimum=True,
            resumable=True,
        ),
        Key(
            "round-timeout",
            900.0,
            "seconds to wait for the replies of a round",
            minimum=0.0,
            exclusive_minimum=True,
            resumable=True,
        ),
        Key(
            "max-norm-ratio",
            100.0,
            "an upload whose norm exceeds this multiple of the initial prompt's is rejected",
            minimum=1.0,
        ),
    ),
    check,
)
