"""The server's side of ``dp = true`` (ours, issue 38): each client's privacy loss, from what it released.

The server counts every upload a client released (accepted or rejected: the client spent its budget either way)
with the noise multiplier the client reports (``dp-noise``: a public function of the budget and its stream's
length), and computes the client's ε at the run's δ after each through the accountant. It also keeps, per client,
the share its latest upload has in the prompt it is sent next (the rule's ``own_weight``), which the next train
message carries so that the client can put its exact prompt back in that share (``upload.own_share_restored``).
All of it is checkpointed: a resumed run reports the same ε.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from fedrapp_app.privacy.accountant import epsilon
from fedrapp_app.privacy.mechanism import PROMPT_SHARE

#: How many standard deviations of the noise's norm an honest private upload may exceed the plain bound by.
NORM_SIGMAS = 4.0


@dataclass
class PrivacyLedger:
    """Per-client accounting over N clients: ``uploads`` [N] released, ``noise`` [N] their noise multiplier (NaN
    before the first), ``own_weight`` [N] the share of each client's latest upload in what it is sent next."""

    delta: float
    clip_rms: float
    uploads: NDArray[np.float64]
    noise: NDArray[np.float64]
    own_weight: NDArray[np.float64]
    spent: dict[int, float] = field(default_factory=dict)  # client -> ε after its latest upload

    @classmethod
    def empty(cls, num_clients: int, delta: float, clip_rms: float) -> PrivacyLedger:
        zeros = np.zeros(num_clients)
        return cls(delta, clip_rms, zeros.copy(), np.full(num_clients, np.nan), zeros.copy())

    def record(self, client: int, noise_multiplier: float) -> float:
        """Count one release of ``client`` at ``noise_multiplier``; return its ε after it."""
        if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
            raise ValueError(f"dp-noise = {noise_multiplier!r} is not a noise multiplier (a finite number >= 0)")
        known = self.noise[client]
        if np.isfinite(known) and known != noise_multiplier:
            raise ValueError(f"dp-noise = {noise_multiplier!r}, but the client released at {known!r} before")
        self.noise[client] = noise_multiplier
        self.uploads[client] += 1
        self.spent[client] = self.epsilon(client)
        return self.spent[client]

    def epsilon(self, client: int) -> float:
        """The client's ε at the run's δ after every release counted so far (0 before any)."""
        return epsilon(float(np.nan_to_num(self.noise[client])), int(self.uploads[client]), self.delta)

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

    def arrays(self) -> dict[str, NDArray[np.float64]]:
        """The checkpoint's arrays."""
        return {"uploads": self.uploads.copy(), "noise": self.noise.copy(), "own-weight": self.own_weight.copy()}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue from a checkpoint's arrays (a run resumed under dp; none: nothing was released yet)."""
        for name, attribute in (("uploads", "uploads"), ("noise", "noise"), ("own-weight", "own_weight")):
            if name in arrays:
                value = np.asarray(arrays[name], dtype=np.float64)
                if value.shape != self.uploads.shape:
                    raise ValueError(
                        f"the checkpoint's privacy {name} has shape {value.shape}, expected {self.uploads.shape}"
                    )
                setattr(self, attribute, value.copy())

    def summary(self) -> dict:
        """What ``summary.json`` says: δ, each client's ε and noise multiplier, and the largest ε."""
        clients = [c for c in range(len(self.uploads)) if self.uploads[c] > 0]
        spent = {str(c): self.epsilon(c) for c in clients}
        return {
            "delta": self.delta,
            "clip": self.clip_rms,
            "epsilon": spent,
            "noise_multiplier": {str(c): float(self.noise[c]) for c in clients},
            "uploads": {str(c): int(self.uploads[c]) for c in clients},
            "max_epsilon": max(spent.values(), default=0.0),
        }
