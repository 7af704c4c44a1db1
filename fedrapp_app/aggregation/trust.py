"""FedRAPP's trust option (ours; ``trust = true``, off by default): the paper's rule, used only as far as it beats
each client's own prompt.

The paper's rule sends client i a mix of its memory and its peers' memories whatever happens on its stream. The
trust option scales both by two per-client trusts in [0, 1], earned from label-free evidence the client reports
each round about its own last tuned prompt P̃_i(t−1) on the new batch (one or two extra text passes):

- **Memory trust** t_i: did the prompt the server sent beat the own prompt? Where the two label an image
  differently, its most similar images that both label alike vote (``methods.base.neighbour_votes``: V_sent,
  V_own); the sent prompt wins if V_sent > V_own, loses if V_sent < V_own, and also loses a tie (it changed no
  label for the better) unless the client was sent its own prompt back (no contest, no evidence). t_i is a ramp of
  the client's win share, pooled with all clients': ŝ_i = (W_i + n₀·ŝ)/(n_i + n₀), ŝ = (ΣW + n₀·s₀)/(Σn + n₀),
  t_i = clip((ŝ_i − ρ_m)/w + ½, 0, 1), with ρ_m = ``trust_memory_target``, w = :data:`MEMORY_RAMP`,
  n₀ = :data:`POOL` and s₀ = ρ_m − w/2 (so t_i = 0 before any evidence).
- **Peer trust** u_i, from 1: would the paper's prompt P̂_i (the probe: the server sends it beside the prompt
  and the client scores it) beat the own prompt in information, H_m − H (H the mean prediction entropy, H_m the
  entropy of the batch-mean prediction: confident *and* spread over the classes, which an overconfident collapse
  is not)? A win adds 1 − ρ_p, a loss takes ρ_p (ρ_p = ``trust_peer_target``), kept in [0, 1].
- **Prompts**: the memory follows the paper's rate (it is never forgotten at trust 0); client i is sent
  (1 − u_i·γ_i)·K_i + u_i·γ_i·Σ_j w_ij·K_j with K_i = P̃_i + t_i·(M_i − P̃_i): none-fed at t = u = 0, the paper's
  rule at t = u = 1.

The trusts, the memory trust's counts and the probes are the rule's state (``RoundOutput.state``), checkpointed
with the server's. The constants were chosen on validation seeds (docs/results/personalization.md, which keeps the
numbers of every variant measured, reproducible at commit 9c3f0c6).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedrapp_app.aggregation.common import (
    PROBE,
    UNIT,
    Diagnostics,
    RoundOutput,
    Rule,
    keep_rows,
    memory_own_weight,
    param,
    validate_round,
)
from fedrapp_app.aggregation.fedrapp import FedRAPPParams, PaperSteps, fedrapp_steps, personalized_prompts


@dataclass(frozen=True)
class TrustParams(FedRAPPParams):
    """The paper's hyperparameters and the trust option's two targets (the shares of rounds a client's sent
    prompt, or probe, must win for its trust to hold)."""

    trust_memory_target: float = param(0.275, UNIT, "ours: win share at the middle of the memory trust's ramp")
    trust_peer_target: float = param(0.15, UNIT, "ours: win share at which the peer trust holds")


#: Width w of the memory trust's ramp: 0 below a win share of ρ_m − w/2, 1 above ρ_m + w/2.
MEMORY_RAMP = 0.15
#: Pseudo-rounds n₀ at all clients' win share added to each client's own rounds.
POOL = 4.0
#: A gap of at most this × the entropies' scale is a tie: two text passes over equal prompts may differ in the
#: last bits, nothing more.
EVIDENCE_RTOL = 1e-6

#: The names of the state's entries (checkpointed): the two trusts [N], the memory trust's counts [N], the probes
#: [N, d] (:data:`~fedrapp_app.aggregation.common.PROBE`).
MEMORY, PEERS = "trust-memory", "trust-peers"
WINS, ROUNDS = "trust-memory-wins", "trust-memory-rounds"


@dataclass(frozen=True)
class OwnPromptReports:
    """What clients report about their own last tuned prompt on the new batch, [N] each (NaN: not reported).

    ``h_own``: its mean prediction entropy; ``hm_pre`` / ``hm_own``: the entropy of the batch-mean prediction of
    the sent and of the own prompt; ``v_pre`` / ``v_own``: the neighbour votes for the sent and the own prompt
    where the two disagree (shares of the batch, in [0, 1]); ``h_probe`` / ``hm_probe``: the probe's entropies,
    ``v_probe`` / ``v_own_probe`` the votes in its contest with the own prompt; ``dp_sigma_vote`` /
    ``dp_sigma_entropy``: under dp, the noise std of a released vote and entropy (NaN or 0 without dp): a gap the
    noise could make is no evidence.
    """

    h_own: NDArray[np.float64]
    hm_pre: NDArray[np.float64]
    hm_own: NDArray[np.float64]
    v_pre: NDArray[np.float64]
    v_own: NDArray[np.float64]
    h_probe: NDArray[np.float64]
    hm_probe: NDArray[np.float64]
    v_probe: NDArray[np.float64]
    v_own_probe: NDArray[np.float64]
    dp_sigma_vote: NDArray[np.float64]
    dp_sigma_entropy: NDArray[np.float64]


def own_prompt_reports(replied: NDArray[np.bool_], **reported: ArrayLike | None) -> OwnPromptReports:
    """Validated :class:`OwnPromptReports` from arrays [N] (a field missing or None: nobody reported it); NaN where
    a client did not reply or reported nothing."""
    n = replied.shape[0]
    fields = OwnPromptReports.__dataclass_fields__
    unknown = sorted(set(reported) - set(fields))
    if unknown:
        raise TypeError(f"unknown own-prompt report(s) {unknown}; allowed: {', '.join(fields)}")
    arrays = {}
    for name in fields:
        value = reported.get(name)
        array = np.full(n, np.nan) if value is None else np.asarray(value, dtype=np.float64)
        if array.shape != (n,):
            raise ValueError(f"{name} has shape {array.shape}, expected ({n},) (NaN where a client reported none)")
        high = 1.0 if name.startswith("v_") else np.inf  # votes are shares of a batch, the rest entropies
        bad = np.flatnonzero(replied & ((array < 0) | (array > high)))
        if bad.size:
            raise ValueError(f"{name} is outside [0, {high}] in row(s) {bad[:10].tolist()}")
        arrays[name] = np.where(replied, array, np.nan)
    return OwnPromptReports(**arrays)


# ------------------------------------------------------------------------------------------- evidence
def _equal(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.bool_]:
    """|a − b| ≤ ``EVIDENCE_RTOL``·max(|a|, |b|) elementwise [N]; False where either is NaN."""
    with np.errstate(invalid="ignore"):
        return np.abs(a - b) <= EVIDENCE_RTOL * np.maximum(np.abs(a), np.abs(b))


#: Under dp, a gap counts as evidence only beyond this many standard deviations of the noise it carries.
NOISE_SIGMAS = 2.0


def noise_floor(sigma: NDArray[np.float64], terms: int) -> NDArray[np.float64]:
    """[N]: the smallest gap of ``terms`` released scalars (each of noise std ``sigma``, NaN: none) that is evidence."""
    return NOISE_SIGMAS * math.sqrt(terms) * np.nan_to_num(sigma)


def vote_evidence(h_pre: NDArray[np.float64], own: OwnPromptReports, replied: NDArray[np.bool_]) -> NDArray[np.float64]:
    """The memory trust's evidence [N]: +1 where the neighbours side with the sent prompt (V_sent > V_own), −1 where
    they side with the own one or tie, 0 without a report or where the client was sent its own prompt back (equal
    entropies and, where reported, marginals: two equal prompts are no contest). Under dp a gap within the noise's
    reach is no evidence either way."""
    gap = own.v_pre - own.v_own
    known = replied & np.isfinite(gap)
    marginals_known = np.isfinite(own.hm_pre) & np.isfinite(own.hm_own)
    same = replied & _equal(h_pre, own.h_own) & (~marginals_known | _equal(own.hm_pre, own.hm_own))
    safe = np.where(known, gap, 0.0)
    plain = np.where(safe == 0, np.where(same, 0.0, -1.0), np.sign(safe))
    floor = noise_floor(own.dp_sigma_vote, 2)
    noisy = np.where(np.abs(safe) > floor, np.sign(safe), 0.0)
    return np.where(known, np.where(floor > 0, noisy, plain), 0.0)


def information_evidence(
    h_rival: NDArray[np.float64],
    hm_rival: NDArray[np.float64],
    own: OwnPromptReports,
    replied: NDArray[np.bool_],
) -> NDArray[np.float64]:
    """The peer trust's evidence [N]: sign((H_own − H) − (Hm_own − Hm)), the rival's information (Hm − H) against
    the own prompt's; 0 where either is not reported or the gap is a tie (up to ``EVIDENCE_RTOL``)."""
    gap = (own.h_own - h_rival) - (own.hm_own - hm_rival)
    scale = np.maximum(np.maximum(np.abs(h_rival), np.abs(own.h_own)), np.maximum(np.abs(own.hm_own), np.abs(hm_rival)))
    known = replied & np.isfinite(gap)
    safe = np.where(known, gap, 0.0)
    floor = np.maximum(EVIDENCE_RTOL * np.where(known, scale, 0.0), noise_floor(own.dp_sigma_entropy, 4))
    return np.where(known & (np.abs(safe) > floor), np.sign(safe), 0.0)


# --------------------------------------------------------------------------------------------- trusts
def _state_vector(
    state: Mapping[str, ArrayLike] | None, name: str, n: int, default: float, high: float = np.inf
) -> NDArray[np.float64]:
    """state[name] as [N] finite values in [0, ``high``] (``default`` everywhere when the state has none yet)."""
    if state is None or name not in state:
        return np.full(n, default)
    value = np.asarray(state[name], dtype=np.float64)
    if value.shape != (n,) or not np.all(np.isfinite(value) & (value >= 0) & (value <= high)):
        raise ValueError(f"state[{name!r}] must hold {n} finite values in [0, {high:g}], got {value!r}")
    return value


def pooled_win_share(
    wins: NDArray[np.float64], rounds: NDArray[np.float64], prior: float, pool: float
) -> NDArray[np.float64]:
    """Each client's estimated win share [N]: ŝ_i = (W_i + n₀·ŝ)/(n_i + n₀), shrunk towards all clients' share
    ŝ = (ΣW + n₀·s₀)/(Σn + n₀) with n₀ = ``pool`` and s₀ = ``prior`` (s₀ where nothing is counted at all)."""
    total = float(rounds.sum()) + pool
    population = (float(wins.sum()) + pool * prior) / total if total > 0 else prior
    counted = rounds + pool
    return np.divide(wins + pool * population, counted, out=np.full_like(wins, population), where=counted > 0)


def memory_trust(
    evidence: NDArray[np.float64],
    replied: NDArray[np.bool_],
    state: Mapping[str, ArrayLike] | None,
    target: float,
) -> dict[str, NDArray[np.float64]]:
    """The memory trusts [N] after this round's ``evidence`` and their counts (wins, rounds with evidence): the ramp
    of the pooled win share; clients that did not reply keep their trust."""
    n = replied.shape[0]
    wins, rounds = _state_vector(state, WINS, n, 0.0), _state_vector(state, ROUNDS, n, 0.0)
    if np.any(wins > rounds):
        raise ValueError(f"state[{WINS!r}] exceeds state[{ROUNDS!r}] in row(s) {np.flatnonzero(wins > rounds)[:10]}")
    before = _state_vector(state, MEMORY, n, 0.0, high=1.0)
    wins, rounds = wins + (evidence > 0), rounds + (evidence != 0)
    prior = float(np.clip(target - MEMORY_RAMP / 2, 0.0, 1.0))  # s₀: the share whose ramp is 0
    share = pooled_win_share(wins, rounds, prior, POOL)
    trust = np.where(replied, np.clip((share - target) / MEMORY_RAMP + 0.5, 0.0, 1.0), before)
    return {MEMORY: trust, WINS: wins, ROUNDS: rounds}


def peer_trust(
    evidence: NDArray[np.float64], state: Mapping[str, ArrayLike] | None, n: int, target: float, start: float = 1.0
) -> NDArray[np.float64]:
    """The peer trusts [N] after this round's ``evidence``: a win adds 1 − ``target``, a loss takes ``target``, no
    evidence (among it every client that did not reply) changes nothing; kept in [0, 1]; ``start`` before any."""
    before = _state_vector(state, PEERS, n, start, high=1.0)
    step = np.where(evidence > 0, 1.0 - target, np.where(evidence < 0, -target, 0.0))
    return np.clip(before + step, 0.0, 1.0)


def previous_probes(state: Mapping[str, ArrayLike] | None, sent32: NDArray[np.float32]) -> NDArray[np.float32]:
    """The probes [N, d] float32 sent last round (before any: the ``sent`` rows)."""
    if state is None or PROBE not in state:
        return sent32
    probes = np.asarray(state[PROBE], dtype=np.float32)
    if probes.shape != sent32.shape:
        raise ValueError(f"state[{PROBE!r}] has shape {probes.shape}, expected {sent32.shape}")
    return probes


# --------------------------------------------------------------------------------------------- a round
def trusted_prompts(
    s: PaperSteps, t: NDArray[np.float64], u: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The prompts [N, d] float64 and peer shares u·γ [N] the trusts give: mixed from K_i = P̃_i + t_i·(M_i − P̃_i)
    (M_i exactly where t_i = 1 or the client did not reply, P̃_i exactly where t_i = 0)."""
    tm = t[:, None]
    moved = np.where(tm == 0, s.used, s.used + tm * (s.memory - s.used))
    kept = np.where(s.inputs.replied[:, None] & (tm < 1), moved, s.memory.astype(np.float64))
    gamma = u * s.gamma
    return personalized_prompts(kept, s.peer_weights, gamma), gamma


def trusted_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: TrustParams | None = None,
    *,
    state: Mapping[str, ArrayLike] | None = None,
    **reports: ArrayLike | None,
) -> RoundOutput:
    """One round of FedRAPP with the trust option; shapes as in :class:`~fedrapp_app.aggregation.common.RoundRule`.

    ``reports``: the fields of :class:`OwnPromptReports` ([N] each, NaN where not reported); ``state``: the previous
    round's ``RoundOutput.state``. The state returned holds the trusts, the memory trust's counts and
    :data:`~fedrapp_app.aggregation.common.PROBE` [N, d] float32, the paper's prompt each client scores next round.
    """
    p = params if params is not None else TrustParams()
    if not isinstance(p, TrustParams):
        raise TypeError(f"trusted_round needs TrustParams, got {type(p).__name__}")
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    own = own_prompt_reports(x.replied, **reports)
    s = fedrapp_steps(x, p)  # the paper's rule, steps 1-6
    absent = ~x.replied

    trusts = memory_trust(vote_evidence(x.h_pre, own, x.replied), x.replied, state, p.trust_memory_target)
    probed = np.isfinite(own.h_probe)  # the peer trust reads the probe's contest, where the client scored one
    peer_evidence = np.where(probed, information_evidence(own.h_probe, own.hm_probe, own, x.replied), 0.0)
    # Under dp the server sees the clients' evidence through noise: the peers are trusted only once it is clear.
    private = bool(np.any(np.nan_to_num(own.dp_sigma_vote) > 0) or np.any(np.nan_to_num(own.dp_sigma_entropy) > 0))
    trusts[PEERS] = peer_trust(peer_evidence, state, x.replied.shape[0], p.trust_peer_target, 0.0 if private else 1.0)
    t, u = trusts[MEMORY], trusts[PEERS]

    personalized, gamma = trusted_prompts(s, t, u)
    probes = keep_rows(s.personalized, previous_probes(state, x.sent32), absent)  # the paper's prompts
    own_weight = memory_own_weight(x, t * s.mu, gamma)  # K_i holds P̃_i at 1 − t_i·μ_i, the mix K_i at 1 − u_i·γ_i
    return RoundOutput(
        memory=s.memory,
        personalized=keep_rows(personalized, x.sent32, absent),  # step 7: absent clients are sent what they were
        diagnostics=Diagnostics(
            s.informative,
            s.update_norm,
            s.r,
            np.where(x.replied, t * s.mu, 1.0),  # the memory's weight in what the prompts are mixed from
            s.peer_weights,
            gamma,
            trust_memory=t,
            trust_peers=u,
        ),
        state={**trusts, PROBE: probes},
        own_weight=own_weight,
    )


FEDRAPP_TRUST = Rule(
    trusted_round,
    TrustParams,
    stateful=True,
    reads_own_prompt=True,
    selected_by="strategy='fedrapp' trust=true",
    summary="FedRAPP with its trust option (ours): memory and peers only as far as they beat the own prompt",
    newcomer="memory-mean",
)
