"""FedRAPP's server rule (SPEC §4): reliability-aware memories and personalized peer prompts.

In round t, with A_t the clients that replied (``replied``) and P̃_i their tuned prompts:

1. Update and drift: Δ_i = P̃_i − sent_i, Q_i = log(1 + ‖Δ_i‖²).
2. Informative set: U_t = {i ∈ A_t : ‖Δ_i‖ > min_update_norm}; a client whose method did not move is neutral.
3. Reliability: r_i = λ_drop·z(H_pre − H_post)_i − λ_ent·z(H_post)_i − λ_drift·z(Q)_i, z over U_t
   (population std; 0 if |U_t| < 2 or zero spread), clipped to [−r_clip, r_clip]; r = 0 outside U_t.
4. Memory: μ_i = clip(μ0 − η·r_i, 0, 1); M_i ← μ_i·M_i + (1 − μ_i)·P̃_i for every i ∈ A_t.
5. Peer weights: ρ_j = sigmoid(r_j); sources S_i = {j ∈ U_t∖{i} : cos(Δ_i, Δ_j) > 0} for i ∈ U_t and
   U_t∖{i} for i ∈ A_t∖U_t (cos taken as 0); a_ij = ρ_j·exp(cos(Δ_i, Δ_j)/τ); w_ij = a_ij / Σ_k a_ik.
6. Personalized prompt: γ_i = min(γ_max, 2·γ0·ρ̄_i/(ρ̄_i + ρ_i)) with ρ̄_i = Σ_j w_ij·ρ_j, γ_i = 0 if S_i = ∅;
   P̂_i = (1 − γ_i)·M_i + γ_i·Σ_j w_ij·M_j (the memories after step 4).
7. Clients outside A_t: memory and sent row untouched; never a source, never in a z-statistic.

Update clip (ours, off by default: ``update_clip`` = c > 0): steps 4-6 use P̃_i' = sent_i + Δ_i·min(1,
c·median_{j∈U_t}‖Δ_j‖/‖Δ_i‖) instead of P̃_i; steps 1-3 still see the raw Δ_i, so an outsized update is
still scored as drift. Why: r is built from z-scores, which no client can push beyond √(|U_t| − 1), so the
penalty of an update 100× too large is bounded while its pull on the peers' prompts grows with its size
(docs/results/robustness.md measures it). Clipping directions does not change the cosines of step 5.

The trust option (ours, ``trust = true``) is a layer on top of this rule: ``aggregation/trust.py``.

Choices where SPEC leaves room:

- Step 4 applies to replying clients outside U_t too (r = 0, so μ = μ0): their upload equals what they
  were sent. This is what makes μ0 = η = γ0 = 0 reproduce none-fed exactly, for them as well.
- λ_drop (the coefficient of the entropy drop, 1 in the paper) is a parameter so that "reliability off"
  (r ≡ 0) is just λ_drop = λ_ent = λ_drift = 0; r_clip and min_update_norm are parameters (ours).
- "Zero spread" means a std of at most ``SPREAD_RTOL`` × the largest magnitude, not exactly 0 (see common).
- The memory is rounded to float32 (what the server stores) before step 6, so P̂_i is a convex combination
  of exactly the memories returned. Exactness: with μ = 0 the update is 0·M + 1·P̃ = P̃ and with γ = 0
  no mixing is computed at all, so μ0 = η = γ0 = 0 returns the uploads bit for bit (np.array_equal;
  a −0.0 coordinate may come back as +0.0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedrapp_app.aggregation.common import (
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    Diagnostics,
    Interval,
    RoundInputs,
    RoundOutput,
    Rule,
    RuleParams,
    keep_rows,
    masked_zscore,
    memory_own_weight,
    param,
    validate_round,
)


@dataclass(frozen=True)
class FedRAPPParams(RuleParams):
    """Hyperparameters of :func:`fedrapp_round` (SPEC §4 defaults; all except λ_drop = 1 are ours)."""

    lambda_drop: float = param(1.0, NON_NEGATIVE, "weight of z(H_pre − H_post) in r (paper: 1)")
    lambda_ent: float = param(0.5, NON_NEGATIVE, "weight of −z(H_post) in r")
    lambda_drift: float = param(0.5, NON_NEGATIVE, "weight of −z(Q) in r")
    mu0: float = param(0.5, UNIT, "base memory retention μ0")
    eta: float = param(0.15, NON_NEGATIVE, "how much reliability lowers the retention")
    tau: float = param(0.2, POSITIVE, "temperature of the cosine in the peer weights")
    gamma0: float = param(0.3, UNIT, "base share of the peers in the personalized prompt")
    gamma_max: float = param(0.8, UNIT, "cap on the peers' share")
    r_clip: float = param(3.0, Interval(0.0, np.inf, low_open=True), "r is clipped to [−r_clip, r_clip]")
    min_update_norm: float = param(1e-8, Interval(0.0, np.inf, high_open=True), "‖Δ‖ above which i ∈ U_t")
    update_clip: float = param(
        0.0, NON_NEGATIVE, "ours: memories and mixing use Δ_i clipped to this × the median ‖Δ‖ over U_t (0 = off)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gamma0 > self.gamma_max:
            raise ValueError(
                f"{type(self).__name__}.gamma0 = {self.gamma0!r} exceeds gamma_max = {self.gamma_max!r}: "
                "need 0 <= gamma0 <= gamma_max <= 1"
            )


#: Parameter overrides of the ablations (apply with ``make_params("fedrapp", ABLATIONS[name])``).
ABLATIONS: dict[str, dict[str, float]] = {
    "no-reliability": {"lambda_drop": 0.0, "lambda_ent": 0.0, "lambda_drift": 0.0},  # r ≡ 0, ρ ≡ 1/2
    "no-memory": {"mu0": 0.0, "eta": 0.0},  # μ ≡ 0: M_i = P̃_i
    "no-peers": {"gamma0": 0.0},  # γ ≡ 0: P̂_i = M_i
    "no-drift": {"lambda_drift": 0.0},
    "no-entropy": {"lambda_ent": 0.0},
    "no-entropy-drop": {"lambda_drop": 0.0},
    "none-fed-equivalent": {"mu0": 0.0, "eta": 0.0, "gamma0": 0.0},
}


# ------------------------------------------------------------------------------------- the steps' math
def reliability_scores(
    h_pre: NDArray[np.float64],
    h_post: NDArray[np.float64],
    drift: NDArray[np.float64],
    informative: NDArray[np.bool_],
    params: FedRAPPParams,
) -> NDArray[np.float64]:
    """Step 3: r [N], 0 outside U_t because every z-score is."""
    r = (
        params.lambda_drop * masked_zscore(h_pre - h_post, informative)
        - params.lambda_ent * masked_zscore(h_post, informative)
        - params.lambda_drift * masked_zscore(drift, informative)
    )
    return np.clip(r, -params.r_clip, params.r_clip)


def clipped_updates(
    delta: NDArray[np.float64], delta_norm: NDArray[np.float64], informative: NDArray[np.bool_], clip: float
) -> NDArray[np.float64]:
    """Δ [N, d] with every row's norm capped at ``clip`` × the median ‖Δ_j‖ over U_t (rows outside U_t are 0)."""
    if not informative.any():
        return delta
    cap = clip * float(np.median(delta_norm[informative]))
    scale = np.minimum(1.0, np.divide(cap, delta_norm, out=np.ones_like(delta_norm), where=delta_norm > cap))
    return delta * scale[:, None]


def log_source_reliability(r: NDArray[np.float64]) -> NDArray[np.float64]:
    """log ρ = log sigmoid(r) [N], finite for any finite r (ρ itself may underflow if r_clip is huge)."""
    return -np.logaddexp(0.0, -r)


def peer_weights(
    delta: NDArray[np.float64],
    delta_norm: NDArray[np.float64],
    log_rho: NDArray[np.float64],
    informative: NDArray[np.bool_],
    replied: NDArray[np.bool_],
    tau: float,
) -> NDArray[np.float64]:
    """Step 5: w [N, N]; row i sums to 1 over S_i, or is all zero when S_i is empty or i did not reply."""
    n = log_rho.shape[0]
    sources = np.flatnonzero(informative)
    unit = delta[sources] / delta_norm[sources, None]
    cos = np.zeros((n, sources.size))  # rows outside U_t keep cos = 0, as SPEC says
    cos[sources] = np.clip(unit @ unit.T, -1.0, 1.0)
    is_source = replied[:, None] & ((cos > 0) | ~informative[:, None])
    is_source[sources, np.arange(sources.size)] = False  # j ≠ i
    # a_ij in log space, shifted by each row's max so exp cannot overflow however small τ is.
    logits = log_rho[sources][None, :] + cos / tau
    has_sources = is_source.any(axis=1)
    row_max = np.where(has_sources, np.max(np.where(is_source, logits, -np.inf), axis=1, initial=-np.inf), 0.0)
    a = np.exp(np.where(is_source, logits - row_max[:, None], -np.inf))
    w = np.zeros((n, n))
    w[:, sources] = np.divide(a, a.sum(axis=1, keepdims=True), out=np.zeros_like(a), where=has_sources[:, None])
    return w


def peer_share(w: NDArray[np.float64], rho: NDArray[np.float64], params: FedRAPPParams) -> NDArray[np.float64]:
    """Step 6: γ [N], 0 without sources; a client less reliable than its sources leans on them more."""
    rho_bar = w @ rho
    ratio = np.divide(2.0 * rho_bar, rho_bar + rho, out=np.zeros_like(rho), where=rho_bar > 0)
    return np.minimum(params.gamma_max, params.gamma0 * ratio)


def personalized_prompts(
    memory: NDArray[np.floating], w: NDArray[np.float64], gamma: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Step 6: P̂ [N, d] = (1 − γ)·M + γ·(w @ M) in float64; rows with γ = 0 are M exactly (no mixing)."""
    prompts = memory.astype(np.float64)  # a fresh array; mixing in float64 keeps the exactness properties
    rows = np.flatnonzero(gamma > 0)
    if rows.size:
        cols = np.flatnonzero(w[rows].any(axis=0))
        mixed = w[np.ix_(rows, cols)] @ prompts[cols]
        g = gamma[rows, None]
        prompts[rows] = (1.0 - g) * prompts[rows] + g * mixed  # mixed was computed before any overwrite
    return prompts


# --------------------------------------------------------------------------------------------- a round
@dataclass(frozen=True)
class PaperSteps:
    """Steps 1-6 of one round (before step 7 puts back the rows of the clients that did not reply).

    ``used`` [N, d] float64 are the uploads steps 4-6 use (P̃_i, or P̃_i' with the update clip; ``sent_i`` for
    clients that did not reply); ``memory`` [N, d] float32 the memories after step 4 (absent rows untouched);
    ``personalized`` [N, d] float64 the prompts P̂_i of step 6 (absent rows: their memory, not what they are sent).
    """

    inputs: RoundInputs
    informative: NDArray[np.bool_]  # [N] U_t
    update_norm: NDArray[np.float64]  # [N] ‖Δ_i‖
    r: NDArray[np.float64]  # [N]
    mu: NDArray[np.float64]  # [N] μ_i; 1 for the untouched rows of absent clients
    used: NDArray[np.float64]  # [N, d]
    memory: NDArray[np.float32]  # [N, d]
    peer_weights: NDArray[np.float64]  # [N, N] w
    gamma: NDArray[np.float64]  # [N] γ_i
    personalized: NDArray[np.float64]  # [N, d] P̂


def fedrapp_steps(x: RoundInputs, p: FedRAPPParams) -> PaperSteps:
    """Steps 1-6 of SPEC §4 on validated inputs (the trust option reads them too)."""
    # 1. update and drift (absent rows: tuned = sent, so Δ = 0)
    delta = x.tuned - x.sent
    delta_norm = np.linalg.norm(delta, axis=1)
    drift = np.log1p(delta_norm**2)
    # 2. informative set U_t
    informative = x.replied & (delta_norm > p.min_update_norm)
    # 3. reliability
    r = reliability_scores(x.h_pre, x.h_post, drift, informative, p)
    # 4. memory (μ = 1 marks the untouched rows of absent clients), from the clipped uploads with the update clip
    used = x.sent + clipped_updates(delta, delta_norm, informative, p.update_clip) if p.update_clip > 0 else x.tuned
    mu = np.where(x.replied, np.clip(p.mu0 - p.eta * r, 0.0, 1.0), 1.0)
    memory = keep_rows(mu[:, None] * x.memory + (1.0 - mu[:, None]) * used, x.memory32, ~x.replied)
    # 5. peer weights
    log_rho = log_source_reliability(r)
    w = peer_weights(delta, delta_norm, log_rho, informative, x.replied, p.tau)
    # 6. personalized prompts, mixed from the stored (float32) memories
    gamma = peer_share(w, np.exp(log_rho), p)
    personalized = personalized_prompts(memory, w, gamma)
    return PaperSteps(x, informative, delta_norm, r, mu, used, memory, w, gamma, personalized)


def fedrapp_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: FedRAPPParams | None = None,
) -> RoundOutput:
    """One FedRAPP server round (SPEC §4); shapes as in :class:`~fedrapp_app.aggregation.common.RoundRule`.

    ``num_examples`` is not read (FedRAPP weighs clients by reliability, not by batch size).
    """
    p = params if params is not None else FedRAPPParams()
    if type(p) is not FedRAPPParams:
        raise TypeError(f"fedrapp_round needs FedRAPPParams, got {type(p).__name__}")
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    s = fedrapp_steps(x, p)
    # 7. absent clients are sent again what they were sent
    return RoundOutput(
        memory=s.memory,
        personalized=keep_rows(s.personalized, x.sent32, ~x.replied),
        diagnostics=Diagnostics(s.informative, s.update_norm, s.r, s.mu, s.peer_weights, s.gamma),
        own_weight=memory_own_weight(x, s.mu, s.gamma),  # read under dp only (docs/privacy.md)
    )


FEDRAPP = Rule(
    fedrapp_round,
    FedRAPPParams,
    summary="FedRAPP (the paper's rule): reliability-aware memories and peer prompts",
    newcomer="memory-mean",
)
