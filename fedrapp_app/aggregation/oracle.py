"""``domain-oracle``: a reference, not a strategy a user could deploy.

It knows which shift domain every client's stream comes from (privileged information that only the offline
testbed has) and runs FedAvg within each domain: every client is sent the example-weighted mean of the
uploads of its own domain's replying clients. It shows how much a personalized rule could gain by finding
same-domain peers (``../shared/TESTBED.md``); tables mark it as a reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from fedrapp_app.aggregation.common import (
    RoundOutput,
    Rule,
    keep_rows,
    mixing_diagnostics,
    unchanged_round,
    validate_round,
)


@dataclass(frozen=True)
class DomainOracleParams:
    """``groups[i]``: the domain index of client i (length N)."""

    groups: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        groups = tuple(int(g) for g in self.groups)
        if not groups:
            raise ValueError("domain-oracle needs the domain of every client (groups); only the testbed has them")
        object.__setattr__(self, "groups", groups)


def domain_oracle_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: DomainOracleParams | None = None,
) -> RoundOutput:
    """FedAvg within each domain: P_g(i) = Σ_{j∈g(i), replied} n_j·P̃_j / Σ n_j, sent to every client of g(i).

    Domains where nobody replied keep their rows untouched. Without ``params`` every client is in one
    domain (plain FedAvg); the registry and the run config insist on a real domain map.
    """
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    n = x.replied.shape[0]
    groups = np.zeros(n, dtype=int) if params is None else np.asarray(params.groups)
    if groups.shape != (n,):
        raise ValueError(f"domain-oracle: {groups.size} client domains for {n} clients")
    if not x.replied.any():
        return unchanged_round(x)
    same = groups[:, None] == groups[None, :]  # [N, N]
    weights = same * np.where(x.replied, x.num_examples, 0.0)[None, :]
    totals = weights.sum(axis=1)
    covered = totals > 0  # the client's domain has at least one reply
    xi = np.divide(weights, totals[:, None], out=np.zeros_like(weights), where=covered[:, None])
    mixed = xi @ x.tuned
    return RoundOutput(
        memory=keep_rows(mixed, x.memory32, ~covered),
        personalized=keep_rows(mixed, x.sent32, ~covered),
        diagnostics=mixing_diagnostics(x, (~covered).astype(np.float64), xi),
        own_weight=np.diag(xi).copy(),
    )


DOMAIN_ORACLE = Rule(
    domain_oracle_round,
    DomainOracleParams,
    reference=True,
    summary="a reference with the testbed's privileged domain labels: FedAvg within each shift domain",
)
