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

Update clipping (ours, off by default: ``update_clip`` = c > 0): steps 4-6 use P̃_i' = sent_i + Δ_i·min(1,
c·median_{j∈U_t}‖Δ_j‖/‖Δ_i‖) instead of P̃_i; steps 1-3 still see the raw Δ_i, so an outsized update is
still scored as drift. Why: r is built from z-scores, which no client can push beyond √(|U_t| − 1), so the
penalty of an update 100× too large is bounded while its pull on the peers' prompts grows with its size
(docs/results/robustness.md measures it). Clipping directions does not change the cosines of step 5.

Trust option (ours, issue 15; off by default: ``trust_rate`` = 0 runs the paper's rule bit for bit). Each client
also reports how its own last tuned prompt P̃_i(t−1) does on the new batch (``h_own``, and the entropies of the
batch-mean prediction of the sent and own prompts, ``hm_pre``/``hm_own``: one extra text pass on the client). The
sent prompt *wins* the round when its score λ_m·H_m − H on the batch is the larger, i.e. when
(H_own − H_pre) − λ_m·(Hm_own − Hm_pre) > 0 (``trust_marginal`` = λ_m; λ_m = 0 is entropy alone, which an
overconfident collapse fools: docs/results/personalization.md measures it). A second evidence (``v_pre``/``v_own``,
``methods.base.neighbour_votes``): where the two prompts label an image differently, its most similar images
that both label alike vote, and the sent prompt wins when it gets more of their votes; each trust reads a mix,
sign((1 − w)·information + w·votes) with w = ``trust_memory_votes`` / ``trust_peer_votes`` (0, the default: the
information gap alone; 1: the votes alone; 0.5: a round counts only where the two agree). Each client carries
two trusts in [0, 1], for its memory and for its peers, starting at ``trust_memory_init`` / ``trust_peer_init``;
a win adds κ·(1 − ρ) and a loss takes κ·ρ (κ = ``trust_rate``, ρ = ``trust_memory_target`` / ``trust_peer_target``: the
share of rounds the sent prompt must win for the trust to hold), ties and missing reports change nothing. Then
μ_i ← trust_mem,i·μ_i and γ_i ← trust_peer,i·γ_i. A client whose sent prompt always loses reaches trust 0 in
⌈1/(κρ)⌉ rounds and is then sent its own upload back: none-fed for it. The trusts are the rule's state
(``RoundOutput.state``), checkpointed by the strategy; they read no label.

Ramp (ours, a second way to turn evidence into a trust; ``trust_memory_ramp`` / ``trust_peer_ramp`` = w > 0 for that
trust, 0 = the steps above): the trust is a ramp of the client's estimated win share ŝ_i, clip((ŝ_i − ρ)/w + ½, 0, 1),
0 below ρ − w/2 and 1 above ρ + w/2. The win share counts the rounds with evidence (wins W_i of rounds n_i) and is
shrunk towards all clients' share with ``trust_pool`` = n₀ pseudo-rounds: ŝ_i = (W_i + n₀·ŝ)/(n_i + n₀), where
ŝ = (ΣW + n₀·s₀)/(Σn + n₀) and s₀ = ρ + w·(init − ½) is the share whose ramp is the initial trust. Why: with
κ = 1 the stepped trust averages the share of rounds won, so a client whose sent prompt wins half its rounds
keeps about half its memory; the ramp gives it all of it, and nothing to a client that wins a share below
ρ − w/2, and ten rounds of one client are few, which the pooling makes up for (docs/results/personalization.md).
κ > 0 still turns the option on; a ramped trust does not read it. A vote tie of a client that was sent its own
prompt back (equal entropies and marginals in its report) is no evidence, whatever ``trust_vote_tie`` says: two
equal prompts are no contest, and as a loss it would lock a client at trust 0 for good.

Kept memory (ours, ``trust_memory_keep`` = 1; 0, the default, is the trust on μ above): the memory M_i follows the
paper's rate μ_i whatever the trust, and the prompts are built from P̃_i + t_i·(M_i − P̃_i) (t_i the memory trust)
instead of M_i. For one round that is what the trust on μ gives; the difference is that a round at trust 0 no
longer replaces the memory by the upload, so what it holds from earlier rounds (the starting prompt's share
included) is there when the trust comes back.

Probe (ours, ``trust_probe`` = 1, with the kept memory): the server also sends each client the paper's prompt P̂_i
(the memories and peers at full trust: what ``trust_rate`` = 0 would send), the client scores it against its own
last tuned prompt beside the received one (``h_probe``, ``hm_probe``, ``v_probe``, ``v_own_probe``: one more text
pass), and the trusts read that contest instead of the sent prompt's. Why: the evidence then no longer depends on
the trusts. A client at trust 0 is sent its own prompt back, which is no contest, so without the probe a ramp pooled
over the federation can lock every client at none-fed for good (docs/results/personalization.md); with it, each
round still measures whether the paper's prompt would have won, and a trust can come back. With
``trust_peer_probe`` = 1 instead, the probe is sent the same way but only the peer trust reads it (the memory trust
reads the sent prompt's contest). The probe is the rule's state (``PROBE``), so a checkpoint carries it.

Choices where SPEC leaves room (also in the report to the lead):

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

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedrapp_app.aggregation.common import (
    NON_NEGATIVE,
    POSITIVE,
    PROBE,
    UNIT,
    Diagnostics,
    Interval,
    RoundOutput,
    RuleParams,
    keep_rows,
    masked_zscore,
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
    trust_rate: float = param(0.0, UNIT, "ours: step of the trusts per round of evidence (0 = off: the paper's rule)")
    trust_memory_init: float = param(1.0, UNIT, "ours: the memory trust before any evidence (1 = the paper's μ)")
    trust_peer_init: float = param(1.0, UNIT, "ours: the peer trust before any evidence (1 = the paper's γ)")
    trust_memory_target: float = param(0.3, UNIT, "ours: share of rounds the sent prompt must win to keep the memory")
    trust_peer_target: float = param(0.3, UNIT, "ours: share of rounds the sent prompt must win to keep the peers")
    trust_marginal: float = param(
        1.0, NON_NEGATIVE, "ours: weight of the marginal-entropy gap in the evidence (0: entropy alone, 1: information)"
    )
    trust_memory_votes: float = param(
        0.0,
        UNIT,
        "ours: the memory trust's evidence, 0 = the information gap, 1 = the neighbour vote, 0.5 = both agree",
    )
    trust_peer_votes: float = param(0.0, UNIT, "ours: the same for the peer trust")
    trust_vote_tie: float = param(
        0.0, Interval(-1.0, 0.0), "ours: the vote evidence of a round the votes tie (0: none; −1: a loss for the sent)"
    )
    trust_memory_ramp: float = param(
        0.0,
        UNIT,
        "ours: 0 = the memory trust moves by steps; w > 0 = it ramps from 0 to 1 as the win share crosses ρ ± w/2",
    )
    trust_peer_ramp: float = param(0.0, UNIT, "ours: the same for the peer trust")
    trust_pool: float = param(
        4.0, NON_NEGATIVE, "ours, ramps only: pseudo-rounds at all clients' win share added to each client's own"
    )
    trust_memory_keep: float = param(
        0.0,
        UNIT,
        "ours: 0 = the memory trust scales μ (a round at trust 0 forgets the memory); 1 = the memory keeps the "
        "paper's rate whatever the trust, which sets how much of it the prompts use",
    )

    trust_probe: float = param(
        0.0,
        UNIT,
        "ours, with trust_memory_keep = 1: 1 = each client also scores the paper's prompt (full trusts) against "
        "its own, and the trusts read that contest, so a trust at 0 still gathers evidence; 0 = the sent prompt's",
    )
    trust_peer_probe: float = param(
        0.0,
        UNIT,
        "ours, with trust_memory_keep = 1: 1 = the probe is sent as with trust_probe, but only the peer trust reads "
        "its contest (the memory trust reads the sent prompt's)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gamma0 > self.gamma_max:
            raise ValueError(
                f"FedRAPPParams.gamma0 = {self.gamma0!r} exceeds gamma_max = {self.gamma_max!r}: "
                "need 0 <= gamma0 <= gamma_max <= 1"
            )
        for name in ("trust_memory_keep", "trust_probe", "trust_peer_probe"):
            if getattr(self, name) not in (0.0, 1.0):
                raise ValueError(f"FedRAPPParams.{name} = {getattr(self, name)!r} must be 0 or 1")
        for name in ("trust_probe", "trust_peer_probe"):
            if getattr(self, name) == 1 and self.trust_memory_keep == 0:
                raise ValueError(
                    f"FedRAPPParams.{name} = 1 needs trust_memory_keep = 1: the probe is the paper's prompt, built "
                    "from the paper's memory, which only the kept memory still holds"
                )
        if self.trust_probe and self.trust_peer_probe:
            raise ValueError(
                "FedRAPPParams.trust_probe = trust_peer_probe = 1: choose one (trust_probe: both trusts read the "
                "probe; trust_peer_probe: the peer trust alone)"
            )
        probed = self.trust_probe or self.trust_peer_probe  # a trust that reads the probe gathers evidence at 0
        if self.trust_rate > 0 and self.trust_memory_init == 0 and self.trust_peer_init == 0 and not probed:
            raise ValueError(
                "FedRAPPParams.trust_memory_init = trust_peer_init = 0 lock every client at none-fed for good: each is "
                "sent its own prompt back, and such a round is no evidence, so no trust is ever earned; "
                "start one of them above 0 (e.g. trust_peer_init = 0.5)"
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


#: |evidence| at most this × the entropies' scale is a tie, no evidence: the client was sent its own prompt back (both
#: trusts 0), and two text passes over equal prompts may differ in the last bits, nothing more.
EVIDENCE_RTOL = 1e-6

#: The names of the trusts in ``RoundOutput.state`` (and the checkpoint): memory (scales μ), peers (scales γ).
TRUSTS = ("trust-memory", "trust-peers")


@dataclass(frozen=True)
class OwnPromptSignals:
    """What clients report about their own last tuned prompt on the new batch [N] each (NaN: not reported).

    ``h_own``: mean prediction entropy of the own prompt; ``hm_pre`` / ``hm_own``: entropy of the batch-mean
    prediction (the marginal) of the sent and of the own prompt; ``v_pre`` / ``v_own``: the neighbour votes for
    each where the two disagree (``methods.base.neighbour_votes``: shares of the batch, in [0, 1]). With the probe
    (``trust_probe``), the same for the paper's prompt the client scored beside: ``h_probe``, ``hm_probe``, and the
    votes ``v_probe`` / ``v_own_probe`` of the probe and of the own prompt where those two disagree.
    """

    h_own: NDArray[np.float64]
    hm_pre: NDArray[np.float64]
    hm_own: NDArray[np.float64]
    v_pre: NDArray[np.float64] | None = None  # None: not reported by anybody
    v_own: NDArray[np.float64] | None = None
    h_probe: NDArray[np.float64] | None = None
    hm_probe: NDArray[np.float64] | None = None
    v_probe: NDArray[np.float64] | None = None
    v_own_probe: NDArray[np.float64] | None = None


def own_prompt_signals(replied: NDArray[np.bool_], **reported: ArrayLike | None) -> OwnPromptSignals:
    """Validated :class:`OwnPromptSignals` from the fields' arrays [N] (a missing field or None: nobody reported
    it); NaN where a client did not reply or reported nothing."""
    n = replied.shape[0]
    unknown = sorted(set(reported) - set(OwnPromptSignals.__dataclass_fields__))
    if unknown:
        raise TypeError(f"unknown own-prompt signal(s) {unknown}")
    arrays = {}
    for name in OwnPromptSignals.__dataclass_fields__:
        value = reported.get(name)
        array = np.full(n, np.nan) if value is None else np.asarray(value, dtype=np.float64)
        if array.shape != (n,):
            raise ValueError(f"{name} has shape {array.shape}, expected ({n},) (NaN where a client reported none)")
        high = 1.0 if name.startswith("v_") else np.inf  # votes are shares of a batch, the rest entropies
        bad = np.flatnonzero(replied & ((array < 0) | (array > high)))
        if bad.size:
            raise ValueError(f"{name} is outside [0, {high}] in row(s) {bad[:10].tolist()}")
        arrays[name] = np.where(replied, array, np.nan)
    return OwnPromptSignals(**arrays)


def probe_contest(h_pre: NDArray[np.float64], own: OwnPromptSignals) -> tuple[NDArray[np.float64], OwnPromptSignals]:
    """The contest a trust that reads the probe sees: where a client scored the probe (``h_probe`` finite), the
    probe's entropies and votes take the sent prompt's place [N]; elsewhere (no probe yet) the sent prompt's stay."""
    if own.h_probe is None:
        return h_pre, own
    probed = np.isfinite(own.h_probe)

    def pick(probe: NDArray[np.float64] | None, sent: NDArray[np.float64] | None) -> NDArray[np.float64] | None:
        if probe is None or sent is None:
            return sent if probe is None else np.where(probed, probe, np.nan)
        return np.where(probed, probe, sent)

    return pick(own.h_probe, h_pre), OwnPromptSignals(
        h_own=own.h_own,
        hm_pre=pick(own.hm_probe, own.hm_pre),
        hm_own=own.hm_own,
        v_pre=pick(own.v_probe, own.v_pre),
        v_own=pick(own.v_own_probe, own.v_own),
    )


def trust_evidence(
    h_pre: NDArray[np.float64], own: OwnPromptSignals, replied: NDArray[np.bool_], marginal: float
) -> NDArray[np.float64]:
    """Per client [N]: +1 where the prompt it was sent beat its own last tuned prompt on the new batch, −1 where it
    lost, 0 without evidence (no reply, nothing reported, a tie).

    A prompt's score on the batch is λ_m·H_m − H (H: mean prediction entropy, H_m: entropy of the batch-mean
    prediction), so the evidence is sign((H_own − H_pre) − λ_m·(Hm_own − Hm_pre)). λ_m = 0: the more confident
    prompt wins (entropy alone); λ_m = 1: the one with the larger information I = H_m − H, confident *and* spread
    over the classes, so that a prompt that grows confident by predicting fewer classes (the overconfident
    collapse) does not count as the better one. With λ_m = 0 the marginals are not read (NaN allowed).
    """
    gap = own.h_own - h_pre
    scale = np.maximum(np.abs(h_pre), np.abs(own.h_own))
    if marginal > 0:
        gap = gap - marginal * (own.hm_own - own.hm_pre)
        scale = np.maximum(scale, marginal * np.maximum(np.abs(own.hm_own), np.abs(own.hm_pre)))
    known = replied & np.isfinite(gap)
    safe = np.where(known, gap, 0.0)
    return np.where(known & (np.abs(safe) > EVIDENCE_RTOL * np.where(known, scale, 0.0)), np.sign(safe), 0.0)


def equal_reports(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.bool_]:
    """|a − b| ≤ ``EVIDENCE_RTOL``·max(|a|, |b|) elementwise [N]; False where either is NaN."""
    with np.errstate(invalid="ignore"):
        return np.abs(a - b) <= EVIDENCE_RTOL * np.maximum(np.abs(a), np.abs(b))


def same_prompt(h_pre: NDArray[np.float64], own: OwnPromptSignals, replied: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Where the client was, as far as its reports tell, sent its own prompt back [N]: H_own = H_pre and, where
    both are reported, Hm_own = Hm_pre (up to ``EVIDENCE_RTOL``). False where H_own is missing."""
    marginals_known = np.isfinite(own.hm_pre) & np.isfinite(own.hm_own)
    return replied & equal_reports(h_pre, own.h_own) & (~marginals_known | equal_reports(own.hm_pre, own.hm_own))


def vote_evidence(
    own: OwnPromptSignals, replied: NDArray[np.bool_], tie: float = 0.0, same: NDArray[np.bool_] | None = None
) -> NDArray[np.float64]:
    """Per client [N]: +1 where the images' neighbours side with the sent prompt (V_pre > V_own), −1 where they
    side with the own one, ``tie`` where the votes are equal (the two prompts label the batch alike, or get as
    many votes: 0 = no evidence; −1 = the sent prompt did not earn its place, a loss), 0 without a report. A tie
    where ``same`` [N] says the client was sent its own prompt back is no evidence, whatever ``tie`` is: two equal
    prompts are no contest (as a loss, a client sent its own prompt would lose every round and never earn trust)."""
    if own.v_pre is None or own.v_own is None:
        return np.zeros(replied.shape[0])
    gap = own.v_pre - own.v_own
    known = replied & np.isfinite(gap)
    safe = np.where(known, gap, 0.0)
    tied = np.full(gap.shape, tie) if same is None else np.where(same, 0.0, tie)
    return np.where(known, np.where(safe == 0, tied, np.sign(safe)), 0.0)


def combined_evidence(
    information: NDArray[np.float64], votes: NDArray[np.float64], weight: float
) -> NDArray[np.float64]:
    """sign((1 − w)·information + w·votes) [N] for evidences in {−1, 0, +1}: w = 0 is the information gap alone,
    w = 1 the neighbour vote alone, w = 0.5 counts a round only where the two agree (or one is silent)."""
    return np.sign((1.0 - weight) * information + weight * votes)


def updated_trust(
    trust: NDArray[np.float64], evidence: NDArray[np.float64], target: float, rate: float
) -> NDArray[np.float64]:
    """Trust after one round [N]: a win (+1) adds ``rate``·(1 − target), a loss (−1) takes ``rate``·target, no
    evidence (0) changes nothing; kept in [0, 1]. It holds where the sent prompt wins a share ``target`` of the
    rounds, grows above it and falls below it; a client that always loses reaches 0 after ⌈1/(rate·target)⌉
    rounds."""
    step = np.where(evidence > 0, 1.0 - target, np.where(evidence < 0, -target, 0.0))
    return np.clip(trust + rate * step, 0.0, 1.0)


@dataclass(frozen=True)
class TrustSetting:
    """How one trust (memory or peers) is made: its initial value, target win share ρ, weight of the neighbour
    vote in its evidence and ramp width (0: steps)."""

    init: float
    target: float
    votes: float
    ramp: float
    probe: bool = False  # it reads the probe's contest (trust_probe, trust_peer_probe), not the sent prompt's

    @property
    def initial_share(self) -> float:
        """s₀: the win share whose ramp is the initial trust (ramps only)."""
        return float(np.clip(self.target + self.ramp * (self.init - 0.5), 0.0, 1.0))


def trust_settings(p: FedRAPPParams) -> dict[str, TrustSetting]:
    """The two trusts' settings, by their names in :data:`TRUSTS`."""
    return {
        "trust-memory": TrustSetting(
            p.trust_memory_init, p.trust_memory_target, p.trust_memory_votes, p.trust_memory_ramp, p.trust_probe == 1
        ),
        "trust-peers": TrustSetting(
            p.trust_peer_init,
            p.trust_peer_target,
            p.trust_peer_votes,
            p.trust_peer_ramp,
            p.trust_probe == 1 or p.trust_peer_probe == 1,
        ),
    }


def previous_trusts(state: Mapping[str, ArrayLike] | None, n: int, p: FedRAPPParams) -> dict[str, NDArray[np.float64]]:
    """The trusts a rule's state carries, [N] each (every client at its initial trust when there are none yet)."""
    out = {}
    for name, setting in trust_settings(p).items():
        if state is None or name not in state:
            out[name] = np.full(n, setting.init)
            continue
        trust = np.asarray(state[name], dtype=np.float64)
        if trust.shape != (n,) or not np.all((trust >= 0) & (trust <= 1)):
            raise ValueError(f"state[{name!r}] must hold {n} values in [0, 1], got {trust!r}")
        out[name] = trust
    return out


def previous_counts(
    state: Mapping[str, ArrayLike] | None, name: str, n: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """A ramped trust's counts from the rule's state, [N] each: the rounds its client's sent prompt won and the
    rounds with evidence (zeros when there are none yet)."""
    counts = []
    for kind in ("wins", "rounds"):
        key = f"{name}-{kind}"
        value = np.zeros(n) if state is None or key not in state else np.asarray(state[key], dtype=np.float64)
        if value.shape != (n,) or not np.all(np.isfinite(value) & (value >= 0)):
            raise ValueError(f"state[{key!r}] must hold {n} counts >= 0, got {value!r}")
        counts.append(value)
    wins, rounds = counts
    if np.any(wins > rounds):
        raise ValueError(
            f"state[{name + '-wins'!r}] exceeds state[{name + '-rounds'!r}] in row(s) "
            f"{np.flatnonzero(wins > rounds)[:10].tolist()}"
        )
    return wins, rounds


def pooled_win_share(
    wins: NDArray[np.float64], rounds: NDArray[np.float64], prior: float, pool: float
) -> NDArray[np.float64]:
    """Each client's estimated win share [N]: ŝ_i = (W_i + n₀·ŝ)/(n_i + n₀), shrunk towards all clients' share
    ŝ = (ΣW + n₀·s₀)/(Σn + n₀) with n₀ = ``pool`` and s₀ = ``prior`` (s₀ where nothing is counted at all)."""
    total = float(rounds.sum()) + pool
    population = (float(wins.sum()) + pool * prior) / total if total > 0 else prior
    counted = rounds + pool
    return np.divide(wins + pool * population, counted, out=np.full_like(wins, population), where=counted > 0)


def ramped_trust(share: NDArray[np.float64], target: float, ramp: float) -> NDArray[np.float64]:
    """clip((share − ρ)/w + ½, 0, 1) [N]: 0 below ρ − w/2, 1 above ρ + w/2, linear between (w = ``ramp`` > 0)."""
    return np.clip((share - target) / ramp + 0.5, 0.0, 1.0)


def round_trusts(
    h_pre: NDArray[np.float64],
    own: OwnPromptSignals,
    replied: NDArray[np.bool_],
    state: Mapping[str, ArrayLike] | None,
    p: FedRAPPParams,
) -> dict[str, NDArray[np.float64]]:
    """This round's memory and peer trusts [N] each: the previous ones moved by this round's evidence (each
    trust's own mix of the information gap and the neighbour vote), by steps or, for a ramped trust, the ramp of
    the pooled win share; a ramped trust also returns its counts ("<name>-wins", "<name>-rounds") for the state.
    Clients that did not reply keep their trusts and counts. A trust that reads the probe (``trust_probe``, or the
    peer trust with ``trust_peer_probe``) takes its evidence from the probe's contest with the own prompt
    (:func:`probe_contest`), not the sent prompt's."""
    contests = {False: (h_pre, own), True: probe_contest(h_pre, own)}
    n = replied.shape[0]
    before = previous_trusts(state, n, p)
    out = {}
    for name, setting in trust_settings(p).items():
        h_rival, rival = contests[setting.probe]
        information = trust_evidence(h_rival, rival, replied, p.trust_marginal)
        votes = vote_evidence(rival, replied, p.trust_vote_tie, same_prompt(h_rival, rival, replied))
        evidence = combined_evidence(information, votes, setting.votes)  # 0 for clients that did not reply
        if setting.ramp == 0:
            out[name] = updated_trust(before[name], evidence, setting.target, p.trust_rate)
            continue
        wins, rounds = previous_counts(state, name, n)
        wins, rounds = wins + (evidence > 0), rounds + (evidence != 0)
        share = pooled_win_share(wins, rounds, setting.initial_share, p.trust_pool)
        out[name] = np.where(replied, ramped_trust(share, setting.target, setting.ramp), before[name])
        out[f"{name}-wins"], out[f"{name}-rounds"] = wins, rounds
    return out


def trusted_memory(
    memory: NDArray[np.float32], used: NDArray[np.float64], trust: NDArray[np.float64], replied: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """The kept memory's share a client's prompt is built from [N, d]: P̃_i + t_i·(M_i − P̃_i) for replying clients
    (M_i [N, d] the paper's memory, P̃_i = ``used`` its upload, t_i = ``trust`` [N]); M_i exactly where t_i = 1 or
    the client did not reply, P̃_i exactly where t_i = 0."""
    t = trust[:, None]
    moved = np.where(t == 0, used, used + t * (memory - used))
    return np.where(replied[:, None] & (t < 1), moved, memory.astype(np.float64))


def probe_prompts(
    papers: NDArray[np.float64],
    state: Mapping[str, ArrayLike] | None,
    sent: NDArray[np.float32],
    absent: NDArray[np.bool_],
) -> NDArray[np.float32]:
    """The probes [N, d] float32 for the next round: the paper's prompts ``papers`` [N, d] for the clients that
    replied; the previous probe (or, before any, the ``sent`` row) for the absent ones."""
    before = sent if state is None or PROBE not in state else np.asarray(state[PROBE], dtype=np.float32)
    if before.shape != sent.shape:
        raise ValueError(f"state[{PROBE!r}] has shape {before.shape}, expected {sent.shape}")
    return keep_rows(papers, before, absent)


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


def fedrapp_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: FedRAPPParams | None = None,
    *,
    h_own: ArrayLike | None = None,
    hm_pre: ArrayLike | None = None,
    hm_own: ArrayLike | None = None,
    v_pre: ArrayLike | None = None,
    v_own: ArrayLike | None = None,
    h_probe: ArrayLike | None = None,
    hm_probe: ArrayLike | None = None,
    v_probe: ArrayLike | None = None,
    v_own_probe: ArrayLike | None = None,
    state: Mapping[str, ArrayLike] | None = None,
) -> RoundOutput:
    """One FedRAPP server round (SPEC §4); shapes as in :class:`~fedrapp_app.aggregation.common.RoundRule`.

    ``num_examples`` is not read (FedRAPP weighs clients by reliability, not by batch size). ``h_own``,
    ``hm_pre``, ``hm_own``, ``v_pre``, ``v_own`` and the probe's ``h_probe``, ``hm_probe``, ``v_probe``,
    ``v_own_probe`` [N] (NaN where not reported; see :class:`OwnPromptSignals`) and ``state`` (the previous round's
    ``RoundOutput.state``) are read by the trust option only (``trust_rate`` > 0, ours; see the module docstring);
    with it off they are ignored. With ``trust_probe`` or ``trust_peer_probe`` the state returned holds ``PROBE``
    [N, d] float32: the prompt each client is to score next round beside its received one.
    """
    p = params if params is not None else FedRAPPParams()
    if not isinstance(p, FedRAPPParams):
        raise TypeError(f"fedrapp_round needs FedRAPPParams, got {type(p).__name__}")
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    absent = ~x.replied

    # 1. update and drift (absent rows: tuned = sent, so Δ = 0)
    delta = x.tuned - x.sent
    delta_norm = np.linalg.norm(delta, axis=1)
    drift = np.log1p(delta_norm**2)
    # 2. informative set U_t
    informative = x.replied & (delta_norm > p.min_update_norm)
    # 3. reliability
    r = reliability_scores(x.h_pre, x.h_post, drift, informative, p)
    # trust option (ours): this round's evidence moves each client's memory and peer trusts, which scale μ and γ
    trusts = None
    if p.trust_rate > 0:
        own = own_prompt_signals(
            x.replied,
            h_own=h_own,
            hm_pre=hm_pre,
            hm_own=hm_own,
            v_pre=v_pre,
            v_own=v_own,
            h_probe=h_probe,
            hm_probe=hm_probe,
            v_probe=v_probe,
            v_own_probe=v_own_probe,
        )
        trusts = round_trusts(x.h_pre, own, x.replied, state, p)
    # 4. memory (μ = 1 marks the untouched rows of absent clients), from the clipped uploads if asked
    used = x.sent + clipped_updates(delta, delta_norm, informative, p.update_clip) if p.update_clip > 0 else x.tuned
    mu = np.where(x.replied, np.clip(p.mu0 - p.eta * r, 0.0, 1.0), 1.0)
    papers_mu = mu
    if trusts is not None:
        mu = np.where(x.replied, trusts["trust-memory"] * mu, 1.0)
    kept = trusts["trust-memory"] if trusts is not None and p.trust_memory_keep == 1.0 else None
    rate = mu if kept is None else papers_mu
    new_memory = keep_rows(rate[:, None] * x.memory + (1.0 - rate[:, None]) * used, x.memory32, absent)
    # the memories the prompts are mixed from: the stored ones or, with a kept memory, P̃_i + t_i·μ_i·(M_i − P̃_i)
    # (M_i the previous memory): what the trust on μ gives, but from the paper's memory, never forgotten
    mixed_from = new_memory if kept is None else trusted_memory(new_memory, used, kept, x.replied)
    # 5. peer weights
    log_rho = log_source_reliability(r)
    w = peer_weights(delta, delta_norm, log_rho, informative, x.replied, p.tau)
    # 6. personalized prompts, mixed from the stored (float32) memories (or their trusted share, above)
    gamma = peer_share(w, np.exp(log_rho), p)
    rule_state = {} if trusts is None else dict(trusts)
    if trusts is not None and (p.trust_probe or p.trust_peer_probe):  # the paper's prompt, for the clients to score
        rule_state[PROBE] = probe_prompts(personalized_prompts(new_memory, w, gamma), state, x.sent32, absent)
    if trusts is not None:
        gamma = trusts["trust-peers"] * gamma
    personalized = personalized_prompts(mixed_from, w, gamma)
    # 7. absent clients are sent again what they were sent
    return RoundOutput(
        memory=new_memory,
        personalized=keep_rows(personalized, x.sent32, absent),
        diagnostics=Diagnostics(
            informative=informative,
            update_norm=delta_norm,
            r=r,
            mu=mu,
            peer_weights=w,
            gamma=gamma,
            trust_memory=None if trusts is None else trusts["trust-memory"],
            trust_peers=None if trusts is None else trusts["trust-peers"],
        ),
        state=rule_state,
    )
