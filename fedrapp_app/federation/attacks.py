"""What an adversarial client uploads instead of its tuned prompt (robustness experiments only).

- ``random``: a random prompt with the honest tuned prompt's per-block norms (it passes the norm check);
- ``scaled``: the honest update blown up, ``sent + scale · (tuned − sent)``.

The attacker still adapts and predicts honestly on its own batch; only its upload is poisoned.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

ATTACKS = ("none", "random", "scaled")


def poisoned_upload(
    attack: str, tuned: Sequence[Tensor], received: Sequence[Tensor], scale: float, generator: torch.Generator
) -> list[Tensor]:
    """The blocks an attacker uploads in place of ``tuned`` (float32, cpu)."""
    if attack == "random":
        out = []
        for block in tuned:
            noise = torch.randn(block.shape, generator=generator, dtype=torch.float32)
            out.append(noise * (block.norm() / noise.norm().clamp_min(1e-12)))
        return out
    if attack == "scaled":
        return [r + scale * (t - r) for t, r in zip(tuned, received, strict=True)]
    raise ValueError(f"unknown attack {attack!r}; allowed: {', '.join(ATTACKS)}")
