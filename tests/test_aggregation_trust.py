"""FedRAPP's trust option (ours; ``aggregation/trust.py``) as pure functions: at full trust it is the paper's rule
bit for bit; the memory trust is the ramp of the pooled neighbour-vote win share, the peer trust a step per
contest of the probe; a client whose prompts always lose ends none-fed and keeps its memory; the probe is the
paper's prompt; relabelling the clients permutes everything; absent clients and their reports are never read."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrapp_app.aggregation import FedRAPPParams, TrustParams, fedrapp_round, make_params, make_rule, synthetic_round
from fedrapp_app.aggregation.common import PROBE
from fedrapp_app.aggregation.trust import (
    MEMORY,
    MEMORY_RAMP,
    PEERS,
    POOL,
    ROUNDS,
    WINS,
    information_evidence,
    own_prompt_reports,
    pooled_win_share,
    trusted_round,
    vote_evidence,
)

P = TrustParams()
ROUND_ARRAYS = ("tuned", "sent", "memory", "h_pre", "h_post", "replied", "num_examples")


def paper_params(p: TrustParams = P) -> FedRAPPParams:
    """The paper's part of ``p``."""
    return FedRAPPParams(**{f: getattr(p, f) for f in FedRAPPParams.__dataclass_fields__})


def reports(kw: dict, sent_wins: np.ndarray | None = None, probe_wins: np.ndarray | None = None) -> dict:
    """Own-prompt reports of a round [N] (NaN where a client is absent): the sent prompt wins (True) or loses
    (False) its neighbour vote, 0.2 against 0.1; the probe wins or loses its information contest by 0.05 nats;
    None: that contest is not reported."""
    n = len(kw["replied"])
    h_own = np.abs(kw["h_pre"]) + 0.3
    out = {"h_own": h_own, "hm_pre": np.full(n, 2.0), "hm_own": np.full(n, 2.0)}
    if sent_wins is not None:
        out |= {"v_pre": np.where(sent_wins, 0.2, 0.1), "v_own": np.where(sent_wins, 0.1, 0.2)}
    if probe_wins is not None:
        out |= {"h_probe": np.where(probe_wins, h_own - 0.05, h_own + 0.05), "hm_probe": np.full(n, 2.0)}
    return {k: np.where(kw["replied"], v, np.nan) for k, v in out.items()}


def next_round(rng: np.random.Generator, memory: np.ndarray, sent: np.ndarray, reply_prob: float = 0.8) -> dict:
    """A round after ``memory``/``sent``: uploads are ``sent`` plus a random step (NaN where a client is absent)."""
    n, d = sent.shape
    kw = synthetic_round(rng, n, d, reply_prob=reply_prob)
    kw.update(memory=memory, sent=sent, tuned=(sent + (kw["tuned"] - kw["sent"])).astype(np.float32))
    return kw


def full_trust(n: int) -> dict[str, np.ndarray]:
    """A state in which every client won every one of 40 rounds: both trusts 1 and staying there."""
    return {MEMORY: np.ones(n), PEERS: np.ones(n), WINS: np.full(n, 40.0), ROUNDS: np.full(n, 40.0)}


# ----------------------------------------------------------------------------------- it reduces to the paper
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.kernels
def test_at_full_trust_it_sends_the_papers_prompts_and_keeps_the_papers_memory_bit_for_bit(seed) -> None:
    rng = np.random.default_rng(seed)
    kw = synthetic_round(rng, 7, 12)
    paper = fedrapp_round(**kw)
    ours = trusted_round(**kw, **reports(kw, np.ones(7, bool), np.ones(7, bool)), state=full_trust(7))
    assert np.array_equal(ours.memory, paper.memory) and np.array_equal(ours.personalized, paper.personalized)
    for name in ("r", "mu", "gamma", "peer_weights"):
        assert np.array_equal(getattr(ours.diagnostics, name), getattr(paper.diagnostics, name))
    assert np.array_equal(ours.state[PROBE], paper.personalized)


@pytest.mark.parametrize("seed", range(4))
def test_the_memory_is_the_papers_whatever_the_trusts_and_the_probe_is_the_papers_prompt(seed) -> None:
    """Trusts anywhere in [0, 1] move what is sent, never the memory; the probe is what the paper's rule sends,
    bit for bit, and an absent client keeps its previous probe."""
    rng = np.random.default_rng(seed)
    kw = next_round(rng, *(synthetic_round(rng, 7, 12)[k] for k in ("memory", "sent")), reply_prob=0.7)
    previous = rng.normal(size=(7, 12)).astype(np.float32)
    state = {MEMORY: rng.uniform(0, 1, 7), PEERS: rng.uniform(0, 1, 7), PROBE: previous}
    ours = trusted_round(**kw, **reports(kw, rng.random(7) < 0.5, rng.random(7) < 0.5), state=state)
    paper = fedrapp_round(**kw)
    absent = ~kw["replied"]
    assert np.array_equal(ours.memory, paper.memory)
    assert not np.allclose(ours.personalized, paper.personalized)
    assert ours.state[PROBE].dtype == np.float32
    assert np.array_equal(ours.state[PROBE][~absent], paper.personalized[~absent])
    assert np.array_equal(ours.state[PROBE][absent], previous[absent])


def test_before_any_evidence_the_memory_trust_is_zero_and_the_peer_trust_one() -> None:
    """The first round: nobody has an own prompt yet (nothing reported). t = 0, so K_i = P̃_i; u = 1."""
    kw = synthetic_round(np.random.default_rng(0), 5, 8, reply_prob=1.0)
    out = trusted_round(**kw)
    assert out.state[MEMORY].tolist() == [0.0] * 5 and out.state[PEERS].tolist() == [1.0] * 5
    assert out.state[WINS].tolist() == out.state[ROUNDS].tolist() == [0.0] * 5
    assert np.array_equal(out.diagnostics.mu, np.zeros(5))


# ------------------------------------------------------------------------------------------- the evidence
def test_the_vote_evidence_a_tie_loses_unless_the_client_was_sent_its_own_prompt() -> None:
    """Client 0: the neighbours side with the sent prompt; 1: with the own one; 2: a tie; 3: a tie of a client sent
    its own prompt back (equal entropies and marginals); 4: a tie where only the marginals differ; 5: no votes
    reported; 6: did not reply."""
    h_pre = np.ones(7)
    own = own_prompt_reports(
        np.array([True] * 6 + [False]),
        h_own=np.array([1.1, 1.1, 1.1, 1.0, 1.0, 1.1, 1.1]),
        hm_pre=np.full(7, 2.0),
        hm_own=np.array([2.0, 2.0, 2.0, 2.0, 2.1, 2.0, 2.0]),
        v_pre=np.array([0.2, 0.1, 0.1, 0.0, 0.0, np.nan, 0.3]),
        v_own=np.array([0.1, 0.2, 0.1, 0.0, 0.0, np.nan, 0.1]),
    )
    replied = np.array([True] * 6 + [False])
    assert vote_evidence(h_pre, own, replied).tolist() == [1.0, -1.0, -1.0, 0.0, -1.0, 0.0, 0.0]


def test_the_information_evidence_guards_against_an_overconfident_collapse_and_ties_are_none() -> None:
    """Client 0's rival is more confident (H lower by 0.1) but predicts fewer classes (marginal lower by 0.3): it
    loses in information. 1: it wins. 2: a tie within rounding. 3: not reported. 4: did not reply."""
    replied = np.array([True, True, True, True, False])
    own = own_prompt_reports(
        replied, h_own=np.array([1.1, 1.1, 1.0, np.nan, 1.1]), hm_own=np.array([2.3, 2.0, 2.0, 2.0, 2.0])
    )
    h_rival, hm_rival = np.array([1.0, 1.0, 1.0 + 1e-9, 1.0, 1.0]), np.array([2.0, 2.0, 2.0, 2.0, 2.0])
    assert information_evidence(h_rival, hm_rival, own, replied).tolist() == [-1.0, 1.0, 0.0, 0.0, 0.0]


# --------------------------------------------------------------------------------------------- the trusts
def test_the_memory_trust_is_the_ramp_of_the_pooled_vote_share_by_hand() -> None:
    """One round, five clients with counts: two win their vote, three lose."""
    rng = np.random.default_rng(5)
    kw = synthetic_round(rng, 5, 6, reply_prob=1.0)
    win = np.array([True, False, False, True, False])
    wins, rounds = np.array([3.0, 1, 0, 1, 0]), np.array([4.0, 6, 3, 8, 0])
    out = trusted_round(**kw, **reports(kw, win), state={WINS: wins, ROUNDS: rounds})
    wins, rounds = wins + win, rounds + 1
    prior = P.trust_memory_target - MEMORY_RAMP / 2  # s₀: the share whose ramp is 0
    population = (wins.sum() + POOL * prior) / (rounds.sum() + POOL)
    share = (wins + POOL * population) / (rounds + POOL)
    expected = np.clip((share - P.trust_memory_target) / MEMORY_RAMP + 0.5, 0, 1)
    np.testing.assert_allclose(out.state[MEMORY], expected, atol=1e-12)
    assert np.count_nonzero((expected > 0) & (expected < 1)) >= 2  # the case is on the ramp, not at its ends
    assert out.state[WINS].tolist() == wins.tolist() and out.state[ROUNDS].tolist() == rounds.tolist()


def test_the_win_share_is_each_clients_own_without_pooling_and_all_clients_with_much() -> None:
    wins, rounds = np.array([0.0, 3.0, 1.0, 0.0]), np.array([4.0, 4.0, 2.0, 0.0])
    assert pooled_win_share(wins, rounds, prior=0.1, pool=0.0).tolist() == [0.0, 0.75, 0.5, 0.4]
    np.testing.assert_allclose(pooled_win_share(wins, rounds, prior=0.1, pool=1e12), 0.1, atol=1e-9)
    # by hand, n0 = 2: all clients' share (4 + 2·0.1)/(10 + 2) = 0.35; client 1: (3 + 2·0.35)/(4 + 2)
    np.testing.assert_allclose(pooled_win_share(wins, rounds, 0.1, 2.0)[1], (3 + 0.7) / 6)


def test_the_peer_trust_steps_by_the_probes_contest_and_holds_at_its_target_win_share() -> None:
    """A win adds 1 − ρ_p, a loss takes ρ_p, kept in [0, 1]; winning a share ρ_p of the rounds holds it. A client
    without a probe score (nothing reported) keeps its trust."""
    kw = synthetic_round(np.random.default_rng(1), 3, 6, reply_prob=1.0)
    rho = P.trust_peer_target
    out = trusted_round(**kw, **reports(kw, probe_wins=np.array([True, False, False])), state={PEERS: np.full(3, 0.5)})
    np.testing.assert_allclose(out.state[PEERS], [min(1.0, 0.5 + 1 - rho), 0.5 - rho, 0.5 - rho])
    assert rho == 0.15  # the sequence below stays inside (0, 1) for this target: no clipping
    trust, wins = np.full(3, 0.12), ([True] + [False] * 6) * 2 + [True] + [False] * 5  # a win share of 3/20 = ρ_p
    for won in wins:
        trust = trusted_round(**kw, **reports(kw, probe_wins=np.full(3, won)), state={PEERS: trust}).state[PEERS]
    np.testing.assert_allclose(trust, 0.12, atol=1e-12)
    silent = trusted_round(**kw, **reports(kw), state={PEERS: np.full(3, 0.3)})
    assert silent.state[PEERS].tolist() == [0.3] * 3


@pytest.mark.parametrize("seed", range(4))
def test_a_client_whose_prompts_always_lose_ends_none_fed_but_keeps_its_memory(seed) -> None:
    """The even clients' sent prompts and probes win every round, the odd ones' lose: a loser is sent its own upload
    back, bit for bit, while its memory still follows the paper's rate; a winner keeps both trusts at 1."""
    rng = np.random.default_rng(seed)
    n, loser = 6, 3
    winners = np.arange(n) % 2 == 0
    memory, sent = (synthetic_round(rng, n, 16)[k] for k in ("memory", "sent"))
    state = None
    for _ in range(20):
        kw = next_round(rng, memory, sent, reply_prob=1.0)
        out = trusted_round(**kw, **reports(kw, winners, winners), state=state)
        memory, sent, state = out.memory, out.personalized, out.state
    d = out.diagnostics
    assert d.trust_memory[loser] == d.trust_peers[loser] == 0.0 and d.mu[loser] == d.gamma[loser] == 0.0
    assert np.array_equal(out.personalized[loser], kw["tuned"][loser])
    assert np.array_equal(out.memory, fedrapp_round(**kw).memory)  # the memories are the paper's
    assert not np.allclose(out.memory[loser], kw["tuned"][loser])
    assert d.trust_memory[0] == d.trust_peers[0] == 1.0


def test_the_probe_lets_a_client_at_zero_trust_earn_its_peers_back() -> None:
    """A client at t = u = 0 is sent its own upload back: its sent prompt is no contest (equal reports), so the
    memory trust gets no evidence; the probe (the paper's prompt) wins and the peer trust comes back."""
    kw = synthetic_round(np.random.default_rng(7), 4, 6, reply_prob=1.0)
    same = {"h_own": kw["h_pre"].copy(), "hm_pre": np.full(4, 2.0), "hm_own": np.full(4, 2.0)}
    same |= {"v_pre": np.zeros(4), "v_own": np.zeros(4)}
    probe = {"h_probe": kw["h_pre"] - 0.05, "hm_probe": np.full(4, 2.0)}
    state = {MEMORY: np.zeros(4), PEERS: np.zeros(4), WINS: np.zeros(4), ROUNDS: np.full(4, 3.0)}
    out = trusted_round(**kw, **same, **probe, state=state)
    assert out.state[ROUNDS].tolist() == [3.0] * 4  # no vote evidence
    assert out.state[PEERS].tolist() == [1 - P.trust_peer_target] * 4


# ---------------------------------------------------------------------------------- clients and labels
@pytest.mark.parametrize("seed", range(6))
def test_relabelling_the_clients_permutes_the_outputs_the_trusts_and_the_probes(seed) -> None:
    rng = np.random.default_rng(seed)
    kw = next_round(rng, *(synthetic_round(rng, 9, 21)[k] for k in ("memory", "sent")), reply_prob=0.7)
    own = reports(kw, rng.random(9) < 0.5, rng.random(9) < 0.5)
    rounds = rng.integers(0, 6, 9).astype(float)
    state = {MEMORY: rng.uniform(0, 1, 9), PEERS: rng.uniform(0, 1, 9), ROUNDS: rounds}
    state |= {WINS: np.floor(rounds * rng.uniform(0, 1, 9)), PROBE: rng.normal(size=(9, 21)).astype(np.float32)}
    out = trusted_round(**kw, **own, state=state)
    perm = rng.permutation(9)
    permuted = trusted_round(
        **{k: v[perm] for k, v in kw.items()},
        **{k: v[perm] for k, v in own.items()},
        state={k: v[perm] for k, v in state.items()},
    )
    for name in ("memory", "personalized"):
        np.testing.assert_allclose(getattr(permuted, name), getattr(out, name)[perm], rtol=1e-6, atol=1e-9)
    assert set(out.state) == set(state)
    for name, value in out.state.items():
        np.testing.assert_allclose(permuted.state[name], value[perm], rtol=1e-6, atol=1e-9)
    for name in ("mu", "gamma"):
        np.testing.assert_allclose(getattr(permuted.diagnostics, name), getattr(out.diagnostics, name)[perm])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_absent_clients_keep_their_trusts_and_counts_and_their_reports_are_never_read(seed) -> None:
    rng = np.random.default_rng(seed)
    kw = synthetic_round(rng, 8, 10, reply_prob=0.6)
    own = reports(kw, rng.random(8) < 0.5, rng.random(8) < 0.5)
    rounds = rng.integers(0, 6, 8).astype(float)
    state = {MEMORY: rng.uniform(0, 1, 8), PEERS: rng.uniform(0, 1, 8), ROUNDS: rounds, WINS: rounds // 2}
    junk = {k: np.where(kw["replied"], v, rng.uniform(0, 1, 8)) for k, v in own.items()}
    out = trusted_round(**kw, **own, state=state)
    again = trusted_round(**kw, **junk, state=state)
    absent = ~kw["replied"]
    for name in (MEMORY, PEERS, WINS, ROUNDS):
        assert np.array_equal(out.state[name][absent], state[name][absent])
        assert np.array_equal(out.state[name], again.state[name])
    assert np.array_equal(out.personalized, again.personalized)


# ------------------------------------------------------------------------------------------- bad inputs
def test_bad_trust_inputs_are_refused_with_their_name() -> None:
    kw = synthetic_round(np.random.default_rng(1), 3, 4, reply_prob=1.0)
    with pytest.raises(ValueError, match="trust-memory"):
        trusted_round(**kw, state={MEMORY: np.array([0.5, 1.5, 0.2])})
    with pytest.raises(ValueError, match="trust-memory-rounds"):
        trusted_round(**kw, state={ROUNDS: np.array([1.0, -1.0, 0.0])})
    with pytest.raises(ValueError, match="trust-memory-wins.*exceeds"):
        trusted_round(**kw, state={WINS: np.array([2.0, 0, 0]), ROUNDS: np.array([1.0, 0, 0])})
    with pytest.raises(ValueError, match="probe.*shape"):
        trusted_round(**kw, state={PROBE: np.zeros((3, 5), np.float32)})
    with pytest.raises(ValueError, match="h_own has shape"):
        trusted_round(**kw, h_own=np.ones(2))
    with pytest.raises(ValueError, match=r"v_own is outside \[0, 1.0\] in row\(s\) \[2\]"):
        trusted_round(**kw, v_own=np.array([0.0, 1.0, 1.5]))
    with pytest.raises(TypeError, match="unknown own-prompt report"):
        trusted_round(**kw, v_elsewhere=np.zeros(3))
    with pytest.raises(ValueError, match="trust_peer_target"):
        make_params("fedrapp-trust", {"trust_peer_target": 1.5})
    with pytest.raises(TypeError, match="needs FedRAPPParams"):
        fedrapp_round(**kw, params=P)  # the paper's rule does not silently drop the option's parameters
    with pytest.raises(TypeError, match="needs TrustParams"):
        trusted_round(**kw, params=paper_params())


def test_the_bound_rule_hands_the_reports_and_the_state_to_the_trust_option_only() -> None:
    rng = np.random.default_rng(2)
    kw = synthetic_round(rng, 5, 6, reply_prob=1.0)
    own = reports(kw, rng.random(5) < 0.5, rng.random(5) < 0.5)
    arrays = [kw[k] for k in ROUND_ARRAYS]
    out = make_rule("fedrapp-trust", {"trust-peer-target": 0.3})(*arrays, own=own)
    assert set(out.state) == {MEMORY, PEERS, WINS, ROUNDS, PROBE}
    assert out.state[PEERS].tolist() == [1.0 if won else 0.7 for won in own["h_probe"] < own["h_own"]]
    paper = make_rule("fedrapp")(*arrays, own=own, state=out.state)
    assert paper.state == {} and np.array_equal(paper.personalized, fedrapp_round(**kw).personalized)
    with pytest.raises(ValueError, match="unknown parameter 'trust-peer-target'"):
        make_rule("fedrapp", {"trust-peer-target": 0.3})


# ----------------------------------------------------------------------------------- under dp (issue 38)
def test_under_dp_a_gap_the_noise_could_make_is_no_evidence_and_the_peers_start_untrusted() -> None:
    """The server sees the clients' evidence noised: a vote gap or an information gap within two standard
    deviations of its noise counts neither way, and without clear evidence nothing is trusted (none-fed)."""
    rng = np.random.default_rng(7)
    kw = synthetic_round(rng, 5, 6, reply_prob=1.0)
    clear = reports(kw, np.ones(5, bool), np.ones(5, bool))  # gaps 0.1 (votes) and 0.05 (information)
    plain = trusted_round(**kw, **clear)
    assert plain.state[PEERS].tolist() == [1.0] * 5  # without dp: the peers trusted from the start (and winning)
    noisy = {**clear, "dp_sigma_vote": np.full(5, 0.1), "dp_sigma_entropy": np.full(5, 0.1)}
    out = trusted_round(**kw, **noisy)
    assert out.state[WINS].tolist() == [0.0] * 5 and out.state[ROUNDS].tolist() == [0.0] * 5  # no evidence counted
    assert out.state[PEERS].tolist() == [0.0] * 5 and out.state[MEMORY].tolist() == [0.0] * 5
    assert np.allclose(out.personalized, kw["tuned"])  # trust 0 everywhere: each client is sent its own upload
    tiny = {**clear, "dp_sigma_vote": np.full(5, 0.01), "dp_sigma_entropy": np.full(5, 0.001)}
    sure = trusted_round(**kw, **tiny)  # the same gaps, now well beyond the noise: evidence again
    assert sure.state[WINS].tolist() == [1.0] * 5 and sure.state[PEERS].tolist() == [1.0 - P.trust_peer_target] * 5
