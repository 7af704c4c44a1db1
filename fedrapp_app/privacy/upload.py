"""A client's side of ``dp = true`` (ours): what it releases, its release log, and its exact prompt kept beside.

Each round the client releases its upload through the mechanism (``mechanism.release``) with the noise calibrated
for its stream (``accountant.noise_for_budget`` over its stream's batches: the most rounds it can upload in), and
keeps in its state (persisted with its snapshot, so that it survives a crash and a resume):

- the prompt it tuned (exact) and the one it released (noised): next round, where the server says which share of
  its prompt is this client's own latest upload (``own-weight``, a rule's ``RoundOutput.own_weight``: none-fed 1,
  FedAvg n_i / Σn, ...), the client puts its exact prompt in place of the server's noised copy in that share
  (:func:`own_share_restored`): post-processing on the client, free of privacy cost;
- its **release log**: every stream position it released, and its latest release whole (the prompt and the public
  metrics). A position asked again (a server that crashed after the replies arrived and before its checkpoint,
  then resumed) is answered with the stored release: no new noise, no new ε. A release beyond the calibrated count
  is refused (:class:`ReleaseRefused`).

The noise is drawn from the operating system's entropy: noise seeded by anything the server knows could be drawn
again, and subtracted. ``FEDRAPP_DP_SEED=<secret>`` in the client's environment seeds it for experiments
(:func:`noise_generator`): the whole secret is hashed with the budget, the clip, the run's token (a random nonce per
run, kept in its checkpoint: a resume reproduces its run, two runs never share draws), the run seed, the client, the
stream position and the prompt the client was sent; anyone who knows the secret can still remove the noise.
"""

from __future__ import annotations

import hashlib
import json
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
#: State keys of the release log: every position released [n] int64, and the latest release's position [1] and
#: public metrics (JSON as uint8 bytes: a state holds arrays only).
LOG_POSITIONS, LOG_LATEST, LOG_METRICS = "dp.log.positions", "dp.log.latest", "dp.log.metrics"
#: Every state key of the client's privacy bookkeeping (the local method's state holds none of them).
_PREFIXES = (TUNED, RELEASED, "dp.log.")


class ReleaseRefused(RuntimeError):
    """A release the client must not make: it would exceed the count its noise was calibrated for, or its release
    log is lost and the position may have been released already."""


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


def seeded() -> bool:
    """Whether ``FEDRAPP_DP_SEED`` seeds this process's noise (experiments only)."""
    return bool(os.environ.get(SEED_ENV))


def noise_generator(
    budget: tuple[float, float], clip_rms: float, nonce: str, run_seed: int, client: int, position: int,
    sent: Sequence[np.ndarray],
) -> np.random.Generator:  # fmt: skip
    """The noise's generator: the OS's entropy, or (``FEDRAPP_DP_SEED`` set) a SHA-256 of the whole secret, the
    budget (ε, δ), the clip, the run's ``nonce``, its seed, the client, the stream ``position`` and the blocks of
    the prompt it was ``sent``: a resume draws again what its run drew; any other run, budget or sent prompt, not."""
    secret = os.environ.get(SEED_ENV)
    if not secret:
        return np.random.default_rng()
    digest = hashlib.sha256()
    digest.update(hashlib.sha256(secret.encode()).digest())
    facts = {"budget": [repr(float(b)) for b in budget], "clip": repr(float(clip_rms)), "nonce": str(nonce),
             "seed": int(run_seed), "client": int(client), "position": int(position)}  # fmt: skip
    digest.update(json.dumps(facts, sort_keys=True).encode())
    for block in sent:
        digest.update(np.ascontiguousarray(block, dtype=np.float32).tobytes())
    words = np.frombuffer(digest.digest(), dtype=np.uint32)
    return np.random.default_rng(np.random.SeedSequence(words.tolist()))


@dataclass(frozen=True)
class PrivateUpload:
    """What the client sends (``blocks``, ``scalars``), the public facts the server accounts with (``metrics``:
    ``dp-noise``, the noise multiplier; ``dp-rounds``, the rounds it was calibrated for; ``dp-sigma-*``; ``dp-seeded``)
    and the state to keep (the kept prompts and the release log)."""

    blocks: list[np.ndarray]
    scalars: dict[str, float]
    metrics: dict[str, float]
    state: dict[str, np.ndarray]


def released_positions(kept: Mapping[str, np.ndarray]) -> list[int]:
    """The stream positions the release log in ``kept`` lists (empty before the first release)."""
    return [int(p) for p in np.asarray(kept.get(LOG_POSITIONS, np.zeros(0, np.int64))).ravel()]


def stored_release(kept: Mapping[str, np.ndarray], position: int) -> tuple[list[np.ndarray], dict] | None:
    """The stored release of stream ``position`` (its prompt blocks and its reply's public metrics), or None where
    the log's latest release is of another position."""
    if LOG_METRICS not in kept or int(np.asarray(kept.get(LOG_LATEST, [-1])).ravel()[0]) != position:
        return None
    count = sum(1 for key in kept if key.startswith(RELEASED))
    blocks = [np.asarray(kept[f"{RELEASED}{k}"], dtype=np.float32) for k in range(count)]
    return blocks, json.loads(np.asarray(kept[LOG_METRICS], dtype=np.uint8).tobytes().decode())


def private_upload(
    tuned: Sequence[np.ndarray],
    sent: Sequence[np.ndarray],
    scalars: Mapping[str, float],
    num_classes: int,
    budget: tuple[float, float],
    clip_rms: float,
    stream_batches: int,
    kept: Mapping[str, np.ndarray],
    where: tuple[str, int, int, int],
) -> PrivateUpload:
    """Release this round's upload: ``tuned`` and ``sent`` are the K blocks of the tuned prompt and of the prompt
    the server sent, ``scalars`` what the rule reads; ``budget`` (ε, δ) over ``stream_batches`` rounds; ``kept``
    the client's privacy state so far (its release log); ``where`` (run nonce, run seed, client, stream position).

    ``ReleaseRefused`` where the log already holds ``stream_batches`` releases or this position; ``NonFiniteUpload``
    (``mechanism``) for a NaN or Inf anywhere: nothing is drawn or released then."""
    nonce, run_seed, client, position = where
    done = released_positions(kept)
    if position in done:
        raise ReleaseRefused(f"stream position {position} was released before: it is answered from the release log")
    if len(done) >= stream_batches:
        raise ReleaseRefused(
            f"this client released {len(done)} uploads, the most its noise was calibrated for (dp-rounds = "
            f"{stream_batches}): another would exceed the privacy budget"
        )
    epsilon, delta = budget
    z = noise_for_budget(epsilon, delta, stream_batches)
    flat_tuned = np.concatenate([np.asarray(b, dtype=np.float32).ravel() for b in tuned])
    flat_sent = np.concatenate([np.asarray(b, dtype=np.float32).ravel() for b in sent])
    cal = calibrate(z, clip_rms, flat_tuned.size, scalar_bounds(list(scalars), num_classes))
    rng = noise_generator(budget, clip_rms, nonce, run_seed, client, position, sent)
    out = release(flat_tuned, flat_sent, scalars, cal, rng)
    shapes = [np.shape(b) for b in tuned]
    blocks = np.split(out.prompt, np.cumsum([math.prod(s) for s in shapes])[:-1])
    released = [b.reshape(s) for b, s in zip(blocks, shapes, strict=True)]
    public = {"dp-noise": z, "dp-rounds": float(stream_batches), "dp-seeded": int(seeded())}
    for kind, prefix in (("vote", "v-"), ("entropy", "h")):  # the noise std of each kind of scalar released
        sigmas = [s for name, s in cal.scalar_sigma.items() if name.startswith(prefix)]
        if sigmas:
            public[f"dp-sigma-{kind}"] = max(sigmas)
    state = {f"{TUNED}{k}": np.asarray(b, dtype=np.float32).copy() for k, b in enumerate(tuned)}
    state.update({f"{RELEASED}{k}": b.copy() for k, b in enumerate(released)})
    state[LOG_POSITIONS] = np.asarray([*done, position], dtype=np.int64)
    state[LOG_LATEST] = np.asarray([position], dtype=np.int64)
    return PrivateUpload(released, out.scalars, public, state)


def logged_reply(metrics: Mapping[str, float | int]) -> dict[str, np.ndarray]:
    """The state entry that stores a release's whole public reply (its metrics), for :func:`stored_release`."""
    return {LOG_METRICS: np.frombuffer(json.dumps(dict(metrics), sort_keys=True).encode(), dtype=np.uint8).copy()}


def split_state(state: Mapping[str, np.ndarray] | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the local method's state, the privacy bookkeeping: kept prompts and release log) of a client's state
    (either may be empty)."""
    state = dict(state or {})
    kept = {k: v for k, v in state.items() if k.startswith(_PREFIXES)}
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
