"""The baselines' server rules (SPEC §5): none-fed, fedavg, fedamp and its cosine variant (HeurFedAMP).

All share FedRAPP's signature; ``h_pre`` and ``h_post`` are validated but not read. What happens to the
rows of clients that did not reply:

- none-fed and the two fedamp rules leave them untouched (memory row kept, ``sent`` row sent again); the
  FedAMP messages u_i are computed over the replying clients only, as in FedAMP with partial participation.
- fedavg sends the new global prompt to everyone, absent clients included (they get it when next sampled),
  and stores it as every client's memory; if nobody replied nothing changes.

In every rule the "memory" is the server's per-client prompt state after the round: the upload for
none-fed, the global prompt for fedavg, the message u_i for fedamp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedrapp_app.aggregation.common import (
    POSITIVE,
    UNIT,
    RoundOutput,
    Rule,
    RuleParams,
    keep_rows,
    mixing_diagnostics,
    param,
    peer_mixing_round,
    send_to_everyone,
    unchanged_round,
    validate_round,
)


@dataclass(frozen=True)
class NoneFedParams(RuleParams):
    """none-fed has no hyperparameters."""


@dataclass(frozen=True)
class FedAvgParams(RuleParams):
    """fedavg has no hyperparameters (the weights are the clients' ``num_examples``)."""


@dataclass(frozen=True)
class FedAMPParams(RuleParams):
    """Hyperparameters of :func:`fedamp_round` (FedAMP with the exponential attention-inducing function).

    sigma = 1 is the default of FedAMP's public implementations. Its scale is the squared distance between
    prompts: for CLIP-sized prompts (‖P‖² of a few units, per-round steps of order 0.1) it keeps the peers
    close to uniform at first and lets clients whose prompts drift apart weigh each other less.
    """

    sigma: float = param(1.0, POSITIVE, "scale of the squared prompt distance in exp(−‖P̃_i − P̃_j‖²/σ)/σ")
    peer_mass: float = param(0.5, UNIT, "α·(n − 1): the most the peers can weigh before the σ factor")
    min_self_weight: float = param(0.1, UNIT, "peers are rescaled so that ξ_ii >= this")


@dataclass(frozen=True)
class FedAMPCosParams(RuleParams):
    """Hyperparameters of :func:`fedamp_cos_round` (HeurFedAMP).

    sigma = 10: prompts that all start at P⁰ have cosines close to 1, so a scale of about 10 is needed for
    a cosine difference of 0.1 to change a weight by e.
    """

    self_weight: float = param(0.5, UNIT, "ξ_ii, fixed")
    sigma: float = param(10.0, POSITIVE, "scale in exp(σ·cos(P̃_i, P̃_j))")


def _check_params(rule: str, params: RuleParams | None, kind: type[RuleParams]) -> RuleParams:
    p = params if params is not None else kind()
    if not isinstance(p, kind):
        raise TypeError(f"{rule} needs {kind.__name__}, got {type(p).__name__}")
    return p


def none_fed_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: NoneFedParams | None = None,
) -> RoundOutput:
    """none-fed: each replying client continues from its own upload, M_i = P̂_i = P̃_i; nothing is mixed."""
    _check_params("none_fed_round", params, NoneFedParams)
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    absent = ~x.replied
    return RoundOutput(
        memory=keep_rows(x.tuned, x.memory32, absent),
        personalized=keep_rows(x.tuned, x.sent32, absent),
        diagnostics=mixing_diagnostics(x, absent.astype(np.float64), None),
        own_weight=x.replied.astype(np.float64),  # each client continues from its own upload alone
    )


def fedavg_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: FedAvgParams | None = None,
) -> RoundOutput:
    """fedavg: P_g = Σ_i n_i·P̃_i / Σ_i n_i over the replies, sent to (and stored for) every client.

    ``num_examples`` of replying clients must be finite and >= 0 with a positive sum.
    """
    _check_params("fedavg_round", params, FedAvgParams)
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    if not x.replied.any():
        return unchanged_round(x)
    counts = x.num_examples
    bad = np.flatnonzero(x.replied & ~(np.isfinite(counts) & (counts >= 0)))
    if bad.size:
        raise ValueError(f"num_examples must be finite and >= 0 for replying clients; bad rows {bad[:10].tolist()}")
    total = counts.sum()
    if not total > 0:
        raise ValueError("fedavg needs a positive total of num_examples over the replying clients, got 0")
    global_prompt = (counts @ x.tuned) / total  # absent rows have count 0 and a finite (sent) row
    return send_to_everyone(x, global_prompt, np.tile(counts / total, (x.replied.shape[0], 1)))


def fedamp_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: FedAMPParams | None = None,
) -> RoundOutput:
    """fedamp: u_i = Σ_j ξ_ij·P̃_j over the n replying clients (SPEC §5), sent to client i.

    ξ_ij = α·exp(−‖P̃_i − P̃_j‖²/σ)/σ for j ≠ i with α = peer_mass/(n − 1); when the peers weigh more than
    1 − min_self_weight they are rescaled to exactly that, and ξ_ii = 1 − Σ_{j≠i} ξ_ij (so ξ_ii >= 0.1 by
    default, up to one rounding). A client alone gets ξ_ii = 1, u_i = P̃_i.
    """
    p = _check_params("fedamp_round", params, FedAMPParams)
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return peer_mixing_round(x, lambda uploads: _fedamp_mixing(uploads, p))


def _fedamp_mixing(uploads: NDArray[np.float64], p: FedAMPParams) -> NDArray[np.float64]:
    """FedAMP's ξ [k, k] for k >= 2 uploads [k, D] (rows sum to 1)."""
    k = uploads.shape[0]
    # Squared distances through a Gram matrix of centred uploads: centring first keeps the
    # ‖a‖² + ‖b‖² − 2a·b cancellation small for prompts that are close to each other.
    centred = uploads - uploads.mean(axis=0)
    sq = np.einsum("ij,ij->i", centred, centred)
    dist2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (centred @ centred.T), 0.0)
    peers = (p.peer_mass / (k - 1)) * np.exp(-dist2 / p.sigma) / p.sigma
    np.fill_diagonal(peers, 0.0)
    mass = peers.sum(axis=1)
    budget = 1.0 - p.min_self_weight
    peers *= np.where(mass > budget, budget / np.maximum(mass, np.finfo(float).tiny), 1.0)[:, None]
    return peers + np.diag(1.0 - peers.sum(axis=1))


def fedamp_cos_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: FedAMPCosParams | None = None,
) -> RoundOutput:
    """fedamp-cos (HeurFedAMP): ξ_ii = self_weight, ξ_ij ∝ exp(σ·cos(P̃_i, P̃_j)) for j ≠ i, rows sum to 1.

    A zero prompt has cosine 0 with everything. A client alone gets ξ_ii = 1.
    """
    p = _check_params("fedamp_cos_round", params, FedAMPCosParams)
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return peer_mixing_round(x, lambda uploads: _fedamp_cos_mixing(uploads, p))


def _fedamp_cos_mixing(uploads: NDArray[np.float64], p: FedAMPCosParams) -> NDArray[np.float64]:
    """HeurFedAMP's ξ [k, k] for k >= 2 uploads [k, D] (rows sum to 1)."""
    norms = np.linalg.norm(uploads, axis=1)
    unit = np.divide(uploads, norms[:, None], out=np.zeros_like(uploads), where=norms[:, None] > 0)
    logits = p.sigma * np.clip(unit @ unit.T, -1.0, 1.0)
    np.fill_diagonal(logits, -np.inf)
    attention = np.exp(logits - logits.max(axis=1, keepdims=True))  # softmax over j ≠ i, overflow-free
    xi = (1.0 - p.self_weight) * attention / attention.sum(axis=1, keepdims=True)
    np.fill_diagonal(xi, p.self_weight)
    return xi


NONE_FED = Rule(none_fed_round, NoneFedParams, summary="none-fed: each client continues from its own upload")
FEDAVG = Rule(fedavg_round, FedAvgParams, summary="FedAvg: the example-weighted mean of the uploads, sent to everyone")
FEDAMP = Rule(
    fedamp_round,
    FedAMPParams,
    summary="FedAMP: attentive message passing, exp(-distance) peer weights",
    newcomer="memory-mean",
)
FEDAMP_COS = Rule(
    fedamp_cos_round, FedAMPCosParams, summary="HeurFedAMP: FedAMP with cosine peer weights", newcomer="memory-mean"
)
