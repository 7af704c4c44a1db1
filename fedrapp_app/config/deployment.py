"""The deployment group: waiting for nodes, timeouts and what the server accepts."""

from __future__ import annotations

from collections.abc import Mapping

from fedrapp_app.config.keys import Group, Key, Scalar, problem


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
