"""Client-level differential privacy of an upload (ours): clip on the client, add Gaussian noise there.

What a client uploads in a round is one vector: its prompt update Δ = P̃ − sent (d numbers, the prompt it tuned
minus the prompt it was sent) and the scalars the server's rule reads (H_pre and H_post, and the own-prompt
reports where the rule reads them). Under ``dp = true`` the client releases

    P̃' = sent + clip(Δ, C) + N(0, σ_Δ² I_d),      s'_k = clamp(clamp(s_k, lo_k, hi_k) + N(0, σ_k²), lo_k, hi_k)

with clip(Δ, C) = Δ · min(1, C / ‖Δ‖₂) and C = ``dp-clip`` · √d (``dp-clip`` bounds the update's root mean square
per coordinate, so one value serves a shared and a class-specific context alike). The protected unit is the
client's whole stream: replacing it by any other changes the clipped update by at most 2C and scalar k by at most
hi_k − lo_k (its public range: an entropy lies in [0, ln C_classes], a vote in [0, 1]), so the round is one Gaussian
mechanism of noise multiplier z (noise std over sensitivity, on the whitened vector) when

    (2C / σ_Δ)² + Σ_k ((hi_k − lo_k) / σ_k)² = 1 / z²,

the prompt taking the share :data:`PROMPT_SHARE` of it and the scalars the rest, evenly. Clamping the noised
scalars back into their range is post-processing (no privacy cost) and keeps them valid for the rules. Over a run
the rounds a client uploads in compose (``accountant.py``). All arrays here are numpy; nothing reads a label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: Share of the round's privacy loss spent on the prompt update; the scalars share the rest evenly. The update is
#: what every rule mixes; the scalars only steer the reliability and the trusts.
PROMPT_SHARE = 0.9


@dataclass(frozen=True)
class Calibration:
    """The noise of one round's release, from the noise multiplier z, the clip and the scalars' ranges.

    ``clip``: C, the L2 bound of the prompt update; ``prompt_sigma``: σ_Δ, per coordinate; ``scalar_sigma``:
    σ_k per released scalar; ``bounds``: each scalar's public range (lo, hi).
    """

    noise_multiplier: float
    clip: float
    prompt_sigma: float
    scalar_sigma: dict[str, float]
    bounds: dict[str, tuple[float, float]]


def calibrate(
    noise_multiplier: float, clip_rms: float, dim: int, bounds: Mapping[str, tuple[float, float]]
) -> Calibration:
    """The per-part noise that makes one release a Gaussian mechanism of ``noise_multiplier`` z (see the module).

    ``clip_rms``: ``dp-clip``, so C = clip_rms·√``dim``; ``bounds``: the released scalars' ranges (lo < hi).
    z = 0 is clipping without noise (ε = ∞)."""
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise multiplier {noise_multiplier!r} must be a finite number >= 0")
    if not (clip_rms > 0 and math.isfinite(clip_rms)) or dim < 1:
        raise ValueError(f"the clip ({clip_rms!r}) must be finite and > 0 and the prompt size ({dim}) at least 1")
    for name, (lo, hi) in bounds.items():
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"the range of {name} must be finite with lo < hi, got ({lo}, {hi})")
    clip = clip_rms * math.sqrt(dim)
    share = PROMPT_SHARE if bounds else 1.0
    scalar_share = (1.0 - share) / len(bounds) if bounds else 0.0
    z = float(noise_multiplier)
    return Calibration(
        noise_multiplier=z,
        clip=clip,
        prompt_sigma=z * 2.0 * clip / math.sqrt(share),
        scalar_sigma={name: z * (hi - lo) / math.sqrt(scalar_share) for name, (lo, hi) in bounds.items()},
        bounds={name: (float(lo), float(hi)) for name, (lo, hi) in bounds.items()},
    )


def clip_update(delta: NDArray[np.floating], bound: float) -> tuple[NDArray[np.float64], float]:
    """``delta`` [d] scaled to L2 norm at most ``bound`` (unchanged when within it), and its norm before."""
    delta = np.asarray(delta, dtype=np.float64)
    norm = float(np.linalg.norm(delta))
    return (delta * (bound / norm) if norm > bound else delta.copy()), norm


class NonFiniteUpload(ValueError):
    """A tuned prompt, a sent prompt or a scalar that is NaN or infinite: nothing is released (the clip and the
    clamp cannot bound it: ``nan > bound`` is false), and no draw is made."""


@dataclass(frozen=True)
class Release:
    """One round's private upload: the prompt P̃' [d] float32, the released scalars, and (for the client's own
    bookkeeping, never uploaded) the update's norm before clipping."""

    prompt: NDArray[np.float32]
    scalars: dict[str, float]
    update_norm: float


def release(
    tuned: NDArray[np.floating],
    sent: NDArray[np.floating],
    scalars: Mapping[str, float],
    calibration: Calibration,
    rng: np.random.Generator,
) -> Release:
    """The private version of an upload: the tuned prompt ``tuned`` [d], the prompt it was ``sent`` [d] and the
    ``scalars`` (each named in ``calibration.bounds``; a missing one is not released)."""
    tuned = np.asarray(tuned, dtype=np.float64)
    sent = np.asarray(sent, dtype=np.float64)
    if tuned.shape != sent.shape or tuned.ndim != 1:
        raise ValueError(f"tuned {tuned.shape} and sent {sent.shape} must be flat and of one size")
    unknown = sorted(set(scalars) - set(calibration.bounds))
    if unknown:
        raise ValueError(f"no public range for the scalar(s) {unknown}: they cannot be released privately")
    bad = [name for name, array in (("the tuned prompt", tuned), ("the sent prompt", sent))
           if not np.isfinite(array).all()]  # fmt: skip
    bad += [name for name in sorted(scalars) if not math.isfinite(float(scalars[name]))]
    if bad:
        raise NonFiniteUpload(f"{', '.join(bad)} hold(s) NaN or Inf: nothing was released this round")
    update, norm = clip_update(tuned - sent, calibration.clip)
    sigma = calibration.prompt_sigma
    if sigma > 0:
        prompt = sent + update + rng.normal(0.0, sigma, size=update.shape)
    else:  # clipping only (epsilon = infinity): an update within the clip is uploaded exactly
        prompt = tuned if norm <= calibration.clip else sent + update
    released = {}
    for name in sorted(scalars):  # a fixed order: the same draws for the same scalars
        lo, hi = calibration.bounds[name]
        value = min(max(float(scalars[name]), lo), hi)
        sigma = calibration.scalar_sigma[name]
        released[name] = min(max(value + float(rng.normal(0.0, sigma)) if sigma > 0 else value, lo), hi)
    return Release(prompt.astype(np.float32), released, norm)
