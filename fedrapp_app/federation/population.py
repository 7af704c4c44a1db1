"""Who takes part in a round (ours, issue 26): clients that join late, drop out of rounds, or only evaluate.

With N clients, the last ``held-out-clients`` ids (H) are **held out**: every ``held-out-every`` rounds they are
sent the prompt the rule gives a client it has never seen, adapt and are scored like the others, but their
uploads never reach the rule (ATP's unseen clients). The ``late-clients`` ids just before them (L) **join late**:
they take part from round ``late-round`` on, their first prompt again the one for a client never seen. Every
other client takes part from round 1. With ``drop-rate`` q, each client sampled for a round is absent from it
with probability q (FLiP's and PFLlib's client drop), drawn from (seed, round) alone: the same clients drop on a
resumed run, and q = 0 draws nothing.

A client that does not take part in a round keeps its stream position: its batches come later, and samples the
run never reached are reported as unscored with the reason (docs/failures.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fedrapp_app.config import RunConfig

_DROPS = 401  # SeedSequence key of the per-round drop draws (distinct from the other seeded draws)


@dataclass(frozen=True)
class Population:
    """The population settings of a run over ``num_clients`` clients (ids 0 .. N-1)."""

    num_clients: int
    late_clients: int = 0
    late_round: int = 5
    drop_rate: float = 0.0
    held_out_clients: int = 0
    held_out_every: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_clients and self.late_clients + self.held_out_clients >= self.num_clients:
            raise ValueError(
                f"late-clients={self.late_clients} + held-out-clients={self.held_out_clients} leave no client of the "
                f"{self.num_clients} that takes part from round 1 (fix: lower them to a sum below num-clients)"
            )

    @classmethod
    def of(cls, config: RunConfig) -> Population:
        """The population a validated config asks for (its num-clients resolved)."""
        v = config.values
        return cls(
            config.num_clients, int(v["late-clients"]), int(v["late-round"]), float(v["drop-rate"]),
            int(v["held-out-clients"]), int(v["held-out-every"]), int(v["seed"]),
        )  # fmt: skip

    @property
    def is_default(self) -> bool:
        """Everyone takes part in every round it is sampled for (the paper's protocol)."""
        return not (self.late_clients or self.held_out_clients or self.drop_rate)

    def held_out(self, client: int) -> bool:
        return client >= self.num_clients - self.held_out_clients

    def late(self, client: int) -> bool:
        return not self.held_out(client) and client >= self.num_clients - self.held_out_clients - self.late_clients

    def member(self, client: int, round_number: int) -> bool:
        """The client is one whose uploads the rule reads, and it has joined by ``round_number``."""
        return not self.held_out(client) and (not self.late(client) or round_number >= self.late_round)

    def visits(self, client: int, round_number: int) -> bool:
        """A held-out client is visited in this round (rounds k, 2k, ...)."""
        return self.held_out(client) and round_number % self.held_out_every == 0

    def dropped(self, round_number: int) -> np.ndarray:
        """bool [N]: the clients absent from round ``round_number`` (all False with drop-rate 0)."""
        if not self.drop_rate:
            return np.zeros(self.num_clients, dtype=bool)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _DROPS, round_number]))
        return rng.random(self.num_clients) < self.drop_rate


def newcomer_prompt(memory: np.ndarray, members: list[int], fallback: np.ndarray) -> np.ndarray:
    """The prompt for a client the federation has never seen under a rule whose newcomers get the mean of the
    memories: the mean of ``members``' rows of ``memory`` [N, d] (float32 [d]), or ``fallback`` [d] with none."""
    if not members:
        return fallback.astype(np.float32)
    return memory[members].astype(np.float64).mean(axis=0).astype(np.float32)
