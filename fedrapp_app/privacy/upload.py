"""A client's side of ``dp = true`` (ours, issue 38): what it releases, and its exact prompt kept beside.

Each round the client releases its upload through the mechanism (``mechanism.release``) with the noise calibrated
for its stream (``accountant.noise_for_budget`` over its stream's batches: the most rounds it can upload in), and
keeps two things in its state: the prompt it tuned (exact) and the one it released (noised). Next round, where the
server says which share of its prompt is this client's own latest upload (``own-weight``, a rule's
``RoundOutput.own_weight``: none-fed 1, FedAvg n_i / Σn, ...), the client puts its exact prompt in place of the
server's noised copy in that share (:func:`own_share_restored`): post-processing on the client, free of privacy
cost, which keeps none-fed (and the trust option at trust 0) exactly what it is without privacy.

The noise is drawn from the operating system's entropy: noise seeded by the run's ``seed`` could be drawn again,
and subtracted, by the server, which knows the run config. ``FEDRAPP_DP_SEED`` in the client's environment makes it
reproducible for experiments (the benchmark runner), and removable by anyone who knows it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedrapp_app.privacy.accountant import noise_for_budget
from fedrapp_app.privacy.mechanism import calibrate, release

#: Environment variable that seeds the noise (experiments only: see the module docstring).
SEED_ENV = "FEDRAPP_DP_SEED"
#: State keys (prefixes) of the kept prompts, beside the local method's own.
TUNED, RELEASED = "dp.tuned.", "dp.released."
_NOISE_KEY = 383  # SeedSequence key of the noise draws under FEDRAPP_DP_SEED


def scalar_bounds(names: Sequence[str], num_classes: int) -> dict[str, tuple[float, float]]:
    """The public range of each released scalar: an entropy (``h-*``, ``hm-*``) lies in [0, ln C], a neighbour
    vote (``v-*``) in [0, 1]."""
    bounds = {}
    for name in names:
        if name.startswith("v-"):
            bounds[name] = (0.0, 1.0)
        elif name.startswith(("h-", "hm-")):
            bounds[name] = (0.0, math.log(max(num_classes, 2)))
        else:
            raise ValueError(f"{name!r} has no public range: it cannot be released under dp")
    return bounds


def noise_generator(run_seed: int, client: int, position: int) -> np.random.Generator:
    """The noise's generator: the OS's entropy, or (``FEDRAPP_DP_SEED`` set) a function of that seed, the run's
    seed, the client and the stream position."""
    secret = os.environ.get(SEED_ENV)
    if not secret:
        return np.random.default_rng()
    words = [int.from_bytes(secret.encode(), "little") % 2**63, _NOISE_KEY, run_seed, client, position]
    return np.random.default_rng(np.random.SeedSequence(words))


@dataclass(frozen=True)
class PrivateUpload:
    """What the client sends (``blocks``, ``scalars``), the public facts the server accounts with (``metrics``:
    ``dp-noise``, the noise multiplier; ``dp-rounds``, the rounds it was calibrated for) and the state to keep."""

    blocks: list[np.ndarray]
    scalars: dict[str, float]
    metrics: dict[str, float]
    state: dict[str, np.ndarray]


def private_upload(
    tuned: Sequence[np.ndarray],
    sent: Sequence[np.ndarray],
    scalars: Mapping[str, float],
    num_classes: int,
    budget: tuple[float, float],
    clip_rms: float,
    stream_batches: int,
    run_seed: int,
    client: int,
    position: int,
) -> PrivateUpload:
    """Release this round's upload: ``tuned`` and ``sent`` are the K blocks of the tuned prompt and of the prompt
    the server sent, ``scalars`` what the rule reads; ``budget`` (ε, δ) over ``stream_batches`` rounds."""
    epsilon, delta = budget
    z = noise_for_budget(epsilon, delta, stream_batches)
    flat_tuned = np.concatenate([np.asarray(b, dtype=np.float32).ravel() for b in tuned])
    flat_sent = np.concatenate([np.asarray(b, dtype=np.float32).ravel() for b in sent])
    cal = calibrate(z, clip_rms, flat_tuned.size, scalar_bounds(list(scalars), num_classes))
    out = release(flat_tuned, flat_sent, scalars, cal, noise_generator(run_seed, client, position))
    shapes = [np.shape(b) for b in tuned]
    blocks = np.split(out.prompt, np.cumsum([math.prod(s) for s in shapes])[:-1])
    released = [b.reshape(s) for b, s in zip(blocks, shapes, strict=True)]
    state = {f"{TUNED}{k}": np.asarray(b, dtype=np.float32).copy() for k, b in enumerate(tuned)}
    state.update({f"{RELEASED}{k}": b.copy() for k, b in enumerate(released)})
    public = {"dp-noise": z, "dp-rounds": float(stream_batches)}
    for kind, prefix in (("vote", "v-"), ("entropy", "h")):  # the noise std of each kind of scalar released
        sigmas = [s for name, s in cal.scalar_sigma.items() if name.startswith(prefix)]
        if sigmas:
            public[f"dp-sigma-{kind}"] = max(sigmas)
    return PrivateUpload(released, out.scalars, public, state)


def split_state(state: Mapping[str, np.ndarray] | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the local method's state, the kept prompts) of a client's state (either may be empty)."""
    state = dict(state or {})
    kept = {k: v for k, v in state.items() if k.startswith((TUNED, RELEASED))}
    return {k: v for k, v in state.items() if k not in kept}, kept


def own_share_restored(
    received: Sequence[np.ndarray], kept: Mapping[str, np.ndarray], own_weight: float
) -> list[np.ndarray]:
    """The received prompt with its share ``own_weight`` of this client's noised latest upload replaced by its
    exact tuned prompt: received + w·(tuned − released); unchanged without a kept upload or with w = 0."""
    count = sum(1 for key in kept if key.startswith(TUNED))
    if not own_weight or not count:
        return [np.asarray(b, dtype=np.float32) for b in received]
    if count != len(received):
        raise ValueError(f"the kept upload has {count} blocks, the received prompt {len(received)}")
    restored = []
    for k, block in enumerate(received):
        tuned, released = kept[f"{TUNED}{k}"], kept[f"{RELEASED}{k}"]
        if np.shape(tuned) != np.shape(block):
            raise ValueError(f"the kept upload's block {k} is {np.shape(tuned)}, the received one {np.shape(block)}")
        restored.append(
            (np.asarray(block, np.float64) + own_weight * (tuned - released.astype(np.float64))).astype(np.float32)
        )
    return restored
