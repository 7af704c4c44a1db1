"""The server's side of ``dp = true`` (ours): each client's privacy loss, from what it released.

The server counts every release a client made that reached it (accepted or rejected: the client spent its budget
either way), once per stream position: a client asked again for a position it released (a resume after a crash that
lost the server's last checkpoint) answers with its stored release, marked ``dp-replayed``, which adds no loss the
server has not counted. Each release is counted at the noise multiplier it reports (``dp-noise``: a public function
of the budget and its stream's length); a client whose multiplier changes is still counted, with both, and its
upload is rejected. The client's ε at the run's δ comes from the accountant. The ledger also keeps, per client, the
share its latest upload has in the prompt it is sent next (the rule's ``own_weight``), which the next train message
carries so that the client can put its exact prompt back in that share (``upload.own_share_restored``).
All of it is checkpointed: a resumed run reports the same ε.

The client's own release log is the truth of what it released (``upload.py``); this ledger is what reached the
server, so its ε is never above the client's, which its calibration keeps within the budget.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from fedrapp_app.privacy.accountant import epsilon_of, rdp_epsilon
from fedrapp_app.privacy.mechanism import PROMPT_SHARE

#: How many standard deviations of the noise's norm an honest private upload may exceed the plain bound by.
NORM_SIGMAS = 4.0


class ChangedNoise(ValueError):
    """A release at another noise multiplier than the client's earlier ones: counted, then rejected."""


@dataclass
class PrivacyLedger:
    """Per-client accounting over N clients: ``releases[i]`` ``{noise multiplier: count}``, ``counted_upto`` [N] the
    stream position after the client's latest counted release (0 before any), ``own_weight`` [N] the share of each
    client's latest upload in what it is sent next."""

    delta: float
    clip_rms: float
    releases: list[Counter]
    counted_upto: NDArray[np.int64]
    own_weight: NDArray[np.float64]
    spent: dict[int, float] = field(default_factory=dict)  # client -> ε after its latest upload
    seeded: set[int] = field(default_factory=set)  # clients whose noise FEDRAPP_DP_SEED seeds (their reply says)

    @classmethod
    def empty(cls, num_clients: int, delta: float, clip_rms: float) -> PrivacyLedger:
        return cls(
            delta, clip_rms, [Counter() for _ in range(num_clients)], np.zeros(num_clients, np.int64),
            np.zeros(num_clients),
        )  # fmt: skip

    def record(self, client: int, noise_multiplier: float, position: int, replayed: bool = False) -> float:
        """Count the release of ``client``'s stream ``position`` at ``noise_multiplier`` (a ``replayed`` one only if
        that position was never counted); return its ε after it. ``ValueError`` for a multiplier that is not one
        (nothing counted), ``ChangedNoise`` for one that differs from the client's earlier ones (counted)."""
        if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
            raise ValueError(f"dp-noise = {noise_multiplier!r} is not a noise multiplier (a finite number >= 0)")
        counted = not (replayed and position < self.counted_upto[client])
        known = sorted(self.releases[client])
        if counted:
            self.releases[client][float(noise_multiplier)] += 1
            self.counted_upto[client] = max(int(self.counted_upto[client]), int(position) + 1)
        self.spent[client] = self.epsilon(client)
        if known and float(noise_multiplier) not in known:
            raise ChangedNoise(
                f"dp-noise = {noise_multiplier!r}, but the client released at {known[0]!r} before (counted: its ε "
                f"is now {self.spent[client]:.3g})"
            )
        return self.spent[client]

    def uploads(self, client: int) -> int:
        """How many releases of ``client`` are counted."""
        return sum(self.releases[client].values())

    def epsilon(self, client: int) -> float:
        """The client's ε at the run's δ after every release counted so far (0 before any)."""
        return epsilon_of(self.releases[client], self.delta)

    def norm_allowance(self, noise_multiplier: float, dim: int) -> float:
        """How far beyond the plain norm bound a private upload of ``dim`` numbers may go: the noise's norm,
        ≈ σ·√d with σ at most z·2C/√(prompt share) and C = clip·√d, times :data:`NORM_SIGMAS`."""
        sigma = noise_multiplier * 2.0 * self.clip_rms * math.sqrt(dim) / math.sqrt(PROMPT_SHARE)
        return NORM_SIGMAS * sigma * math.sqrt(dim) + 2.0 * self.clip_rms * math.sqrt(dim)

    def upload_bound(self, max_norm: float, sent_norm: float, noise_multiplier: float, dim: int) -> float:
        """The norm a private upload may have: the plain bound, or the norm of the prompt the client was sent where
        that is larger (the rules mix noised uploads, so a sent prompt carries noise of earlier rounds and may
        outgrow the plain bound), plus :meth:`norm_allowance` (an honest upload is sent + clipped update + noise)."""
        return max(max_norm, sent_norm) + self.norm_allowance(noise_multiplier, dim)

    def arrays(self) -> dict[str, NDArray]:
        """The checkpoint's arrays: ``releases`` [M, 3] rows (client, noise multiplier, count), ``counted-upto``
        [N], ``own-weight`` [N], ``seeded`` [N] bool."""
        rows = [(c, z, n) for c, counts in enumerate(self.releases) for z, n in sorted(counts.items())]
        return {
            "releases": np.asarray(rows, dtype=np.float64).reshape(-1, 3),
            "counted-upto": self.counted_upto.copy(),
            "own-weight": self.own_weight.copy(),
            "seeded": np.isin(np.arange(len(self.releases)), sorted(self.seeded)),
        }

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue from a checkpoint's arrays (a run resumed under dp; none: nothing was released yet)."""
        n = len(self.releases)
        if "releases" not in arrays and "uploads" in arrays:  # a checkpoint of an older version: one z per client
            uploads, noise = np.asarray(arrays["uploads"]), np.asarray(arrays.get("noise", np.full(n, np.nan)))
            arrays = {**arrays, "releases": np.asarray([(c, noise[c], uploads[c]) for c in range(n) if uploads[c] > 0])}
        if "releases" in arrays:
            rows = np.asarray(arrays["releases"], dtype=np.float64).reshape(-1, 3)
            if rows.size and not (rows[:, 0].min() >= 0 and rows[:, 0].max() < n):
                raise ValueError(f"the checkpoint's privacy releases name clients outside 0..{n - 1}")
            self.releases = [Counter() for _ in range(n)]
            for client, z, count in rows:
                self.releases[int(client)][float(z)] += int(count)
        for name, attribute, dtype in (("counted-upto", "counted_upto", np.int64), ("own-weight", "own_weight", None)):
            if name in arrays:
                value = np.asarray(arrays[name], dtype=dtype or np.float64)
                if value.shape != (n,):
                    raise ValueError(f"the checkpoint's privacy {name} has shape {value.shape}, expected {(n,)}")
                setattr(self, attribute, value.copy())
        if "seeded" in arrays:
            self.seeded = {int(c) for c in np.flatnonzero(np.asarray(arrays["seeded"], dtype=bool))}

    def summary(self) -> dict:
        """What ``summary.json`` says: δ, the clip, each client's ε (PLD; and RDP's, a looser bound), its noise
        multiplier(s) and releases counted, and the largest ε."""
        clients = [c for c in range(len(self.releases)) if self.uploads(c) > 0]
        spent = {str(c): self.epsilon(c) for c in clients}
        return {
            "delta": self.delta,
            "clip": self.clip_rms,
            "accountant": "pld",
            "epsilon": spent,
            "epsilon_rdp": {str(c): rdp_epsilon(self.releases[c], self.delta) for c in clients},
            "noise_multiplier": {str(c): max(self.releases[c]) for c in clients},
            "uploads": {str(c): self.uploads(c) for c in clients},
            "max_epsilon": max(spent.values(), default=0.0),
            "noise_seeded": sorted(self.seeded),
        }
