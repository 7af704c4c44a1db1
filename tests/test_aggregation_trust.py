"""FedRAPP's trust option (ours, issue 15) as pure functions: off it is the paper's rule bit for bit; a client whose
sent prompt always loses ends none-fed; relabelling the clients permutes everything; labels never enter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrapp_app.aggregation import FedRAPPParams, fedrapp_round, make_params, make_rule, synthetic_round
from fedrapp_app.aggregation.common import PROBE
from fedrapp_app.aggregation.fedrapp import (
    TRUSTS,
    OwnPromptSignals,
    combined_evidence,
    own_prompt_signals,
    pooled_win_share,
    ramped_trust,
    same_prompt,
    trust_evidence,
    updated_trust,
    vote_evidence,
)

ON = {"trust_rate": 0.5, "trust_memory_target": 0.4, "trust_peer_target": 0.2}


def own_reports(rng: np.random.Generator, kw: dict, win: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Random own-prompt reports of a round; where ``win`` is given, client i's sent prompt wins (True) or loses
    (False) by 0.05 nats of information, with equal marginals."""
    n = len(kw["replied"])
    h_own = np.abs(kw["h_pre"]) + rng.normal(0, 0.05, n)
    hm_pre = rng.uniform(2.0, 3.0, n)
    hm_own = hm_pre + rng.normal(0, 0.05, n)
    if win is not None:
        h_own = np.where(win, kw["h_pre"] + 0.05, kw["h_pre"] - 0.05)
        hm_own = hm_pre.copy()
    absent = ~kw["replied"]
    return {
        k: np.where(absent, np.nan, np.abs(v)) for k, v in (("h_own", h_own), ("hm_pre", hm_pre), ("hm_own", hm_own))
    }


def next_round(rng: np.random.Generator, memory: np.ndarray, sent: np.ndarray, reply_prob: float = 0.8) -> dict:
    """A round after ``memory``/``sent``: uploads are ``sent`` plus a random step (NaN where a client is absent)."""
    n, d = sent.shape
    kw = synthetic_round(rng, n, d, reply_prob=reply_prob)
    kw.update(memory=memory, sent=sent, tuned=(sent + (kw["tuned"] - kw["sent"])).astype(np.float32))
    return kw


def assert_same_output(a, b) -> None:
    assert np.array_equal(a.memory, b.memory) and np.array_equal(a.personalized, b.personalized)
    for name in ("r", "mu", "gamma", "peer_weights"):
        assert np.array_equal(getattr(a.diagnostics, name), getattr(b.diagnostics, name))


# ----------------------------------------------------------------------------------- it reduces to the paper
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), init=st.floats(0, 1), marginal=st.floats(0, 3))
def test_off_it_is_the_papers_rule_bit_for_bit_whatever_it_is_given(seed, init, marginal) -> None:
    rng = np.random.default_rng(seed)
    kw = synthetic_round(rng, 7, 12)
    off = make_params("fedrapp", {"trust_memory_init": init, "trust_peer_init": init, "trust_marginal": marginal})
    state = {name: rng.uniform(0, 1, 7) for name in TRUSTS}
    paper = fedrapp_round(**kw)
    ours = fedrapp_round(**kw, params=off, **own_reports(rng, kw), state=state)
    assert_same_output(paper, ours)
    assert ours.state == {} and ours.diagnostics.trust_memory is None


@pytest.mark.parametrize("seed", range(5))
def test_on_without_evidence_and_full_trust_it_is_the_papers_rule(seed) -> None:
    """Trusts of 1 and nothing reported (a client without an own prompt yet, or a reply of the paper's protocol)."""
    rng = np.random.default_rng(seed)
    memory, sent = (synthetic_round(rng, 6, 20)[k] for k in ("memory", "sent"))
    paper_state, our_state, state = (memory, sent), (memory, sent), None
    for _ in range(4):
        kw = next_round(rng, *paper_state)
        paper = fedrapp_round(**kw)
        ours = fedrapp_round(
            **{**kw, "memory": our_state[0], "sent": our_state[1]}, params=FedRAPPParams(**ON), state=state
        )
        assert_same_output(paper, ours)
        assert all(np.array_equal(v, np.ones(6)) for v in ours.state.values())
        paper_state, our_state, state = (paper.memory, paper.personalized), (ours.memory, ours.personalized), ours.state


# ---------------------------------------------------------------------- a client that always loses goes alone
@pytest.mark.parametrize("seed", range(5))
def test_a_client_whose_sent_prompt_always_loses_ends_none_fed(seed) -> None:
    rng = np.random.default_rng(seed)
    n, loser = 6, 2
    p = FedRAPPParams(**ON)
    rounds_to_zero = math.ceil(1 / (p.trust_rate * min(p.trust_memory_target, p.trust_peer_target)))

    def wins(rng: np.random.Generator) -> np.ndarray:
        win = rng.random(n) < 0.5
        win[loser] = False
        return win

    out, kw, _ = play_rounds(rng, p, n, rounds_to_zero + 3, wins)
    assert_none_fed(out, kw, loser)


def play_rounds(rng: np.random.Generator, p: FedRAPPParams, n: int, rounds: int, wins) -> tuple:
    """``rounds`` rounds of n replying clients whose sent prompt wins where ``wins(rng)`` [n] says so: the last
    round's output and inputs, and the rule's state after it."""
    memory, sent = (synthetic_round(rng, n, 16)[k] for k in ("memory", "sent"))
    state = None
    for _ in range(rounds):
        kw = next_round(rng, memory, sent, reply_prob=1.0)
        out = fedrapp_round(**kw, params=p, **own_reports(rng, kw, wins(rng)), state=state)
        memory, sent, state = out.memory, out.personalized, out.state
    return out, kw, state


def assert_none_fed(out, kw: dict, client: int) -> None:
    """Both of ``client``'s trusts, its μ and its γ are 0: its memory is its upload and it is sent its upload back,
    bit for bit."""
    d = out.diagnostics
    assert d.trust_memory[client] == d.trust_peers[client] == 0.0
    assert d.mu[client] == 0.0 and d.gamma[client] == 0.0
    assert np.array_equal(out.memory[client], kw["tuned"][client])
    assert np.array_equal(out.personalized[client], kw["tuned"][client])


def test_a_trust_at_zero_stays_there_without_new_evidence() -> None:
    """Sent its own prompt back, the client reports H_own = H_pre exactly: a tie, no evidence, the trust holds."""
    rng = np.random.default_rng(0)
    kw = synthetic_round(rng, 4, 8, reply_prob=1.0)
    own = {"h_own": kw["h_pre"].copy(), "hm_pre": np.full(4, 2.0), "hm_own": np.full(4, 2.0)}
    zero = {name: np.zeros(4) for name in TRUSTS}
    out = fedrapp_round(**kw, params=FedRAPPParams(**ON), **own, state=zero)
    assert all(np.array_equal(v, np.zeros(4)) for v in out.state.values())


# ------------------------------------------------------------------------------------------- the evidence
def test_the_marginal_guards_against_an_overconfident_collapse() -> None:
    """The sent prompt is more confident (H lower by 0.1) but predicts fewer classes (marginal lower by 0.3): by
    entropy alone it wins; by information (λ_m = 1) it loses."""
    h_pre = np.array([1.0])
    own = OwnPromptSignals(h_own=np.array([1.1]), hm_pre=np.array([2.0]), hm_own=np.array([2.3]))
    replied = np.array([True])
    assert trust_evidence(h_pre, own, replied, marginal=0.0)[0] == 1.0
    assert trust_evidence(h_pre, own, replied, marginal=1.0)[0] == -1.0


def test_no_reply_no_report_and_ties_are_no_evidence() -> None:
    h_pre = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    own = OwnPromptSignals(
        h_own=np.array([1.2, np.nan, 1.0, 1.0 + 1e-9, 0.8]),
        hm_pre=np.array([2.0, 2.0, 2.0, 2.0, 2.0]),
        hm_own=np.array([2.0, 2.0, 2.0, 2.0, 2.0]),
    )
    replied = np.array([False, True, True, True, True])
    assert trust_evidence(h_pre, own, replied, marginal=1.0).tolist() == [0.0, 0.0, 0.0, 0.0, -1.0]


@settings(max_examples=200, deadline=None)
@given(
    trust=st.floats(0, 1),
    target=st.floats(0, 1),
    rate=st.floats(0, 1),
    evidence=st.sampled_from([-1.0, 0.0, 1.0]),
)
def test_a_trust_stays_in_the_unit_interval_and_moves_with_the_evidence(trust, target, rate, evidence) -> None:
    after = updated_trust(np.array([trust]), np.array([evidence]), target, rate)[0]
    assert 0.0 <= after <= 1.0
    assert (after >= trust) if evidence > 0 else (after <= trust) if evidence < 0 else after == trust


def test_a_trust_holds_at_its_target_win_rate() -> None:
    """Wins at rate ρ and losses at 1 − ρ cancel: κ(1 − ρ)·ρ = κρ·(1 − ρ)."""
    trust = np.array([0.5])
    for evidence in [1.0, -1.0, -1.0, -1.0] * 5:  # a win rate of 1/4
        trust = updated_trust(trust, np.array([evidence]), target=0.25, rate=0.2)
    assert trust[0] == pytest.approx(0.5)


# ---------------------------------------------------------------------------------- clients and labels
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("switches", [{}, {"trust_memory_keep": 1.0}, {"trust_memory_keep": 1.0, "trust_probe": 1.0}])
def test_relabelling_the_clients_permutes_the_outputs_and_the_trusts(seed, switches) -> None:
    """With the trust on μ, the kept memory, and the kept memory with the probe (whose reports and prompts
    permute too)."""
    rng = np.random.default_rng(seed)
    kw = next_round(rng, *(synthetic_round(rng, 9, 21)[k] for k in ("memory", "sent")))
    own = own_reports(rng, kw)
    own |= probe_reports(kw, own, rng.random(9) < 0.5)
    state = {name: rng.uniform(0, 1, 9) for name in TRUSTS}
    perm = rng.permutation(9)
    p = FedRAPPParams(**ON, **switches)
    out = fedrapp_round(**kw, params=p, **own, state=state)
    permuted = fedrapp_round(
        **{k: v[perm] for k, v in kw.items()},
        params=p,
        **{k: v[perm] for k, v in own.items()},
        state={k: v[perm] for k, v in state.items()},
    )
    for name in ("memory", "personalized"):
        np.testing.assert_allclose(getattr(permuted, name), getattr(out, name)[perm], rtol=1e-6, atol=1e-9)
    for name in TRUSTS:
        assert np.array_equal(permuted.state[name], out.state[name][perm])
    if p.trust_probe:
        np.testing.assert_allclose(permuted.state[PROBE], out.state[PROBE][perm], rtol=1e-6, atol=1e-9)
    for name in ("mu", "gamma"):
        np.testing.assert_allclose(
            getattr(permuted.diagnostics, name), getattr(out.diagnostics, name)[perm], atol=1e-12
        )


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_absent_clients_keep_their_trusts_and_their_reports_are_never_read(seed) -> None:
    rng = np.random.default_rng(seed)
    kw = synthetic_round(rng, 8, 10, reply_prob=0.6)
    own = own_reports(rng, kw)
    state = {name: rng.uniform(0, 1, 8) for name in TRUSTS}
    junk = {k: np.where(kw["replied"], v, rng.uniform(0, 50, 8)) for k, v in own.items()}
    out = fedrapp_round(**kw, params=FedRAPPParams(**ON), **own, state=state)
    again = fedrapp_round(**kw, params=FedRAPPParams(**ON), **junk, state=state)
    absent = ~kw["replied"]
    for name in TRUSTS:
        assert np.array_equal(out.state[name][absent], state[name][absent])
        assert np.array_equal(out.state[name], again.state[name])
    assert np.array_equal(out.personalized, again.personalized)


def test_the_neighbour_vote_is_its_own_evidence_and_half_weight_needs_both() -> None:
    """Client 0: information and votes both say the sent prompt won; client 1: information says won, the votes
    lost; client 2: no votes reported (NaN); client 3: equal votes."""
    h_pre = np.full(4, 1.0)
    own = OwnPromptSignals(
        h_own=np.full(4, 1.2),  # the sent prompt is the more informative on every client
        hm_pre=np.full(4, 2.0),
        hm_own=np.full(4, 2.0),
        v_pre=np.array([0.2, 0.05, np.nan, 0.1]),
        v_own=np.array([0.1, 0.15, np.nan, 0.1]),
    )
    replied = np.ones(4, bool)
    information = trust_evidence(h_pre, own, replied, marginal=1.0)
    votes = vote_evidence(own, replied)
    assert information.tolist() == [1.0, 1.0, 1.0, 1.0] and votes.tolist() == [1.0, -1.0, 0.0, 0.0]
    assert combined_evidence(information, votes, 0.0).tolist() == information.tolist()
    assert combined_evidence(information, votes, 1.0).tolist() == votes.tolist()
    assert combined_evidence(information, votes, 0.5).tolist() == [1.0, 0.0, 1.0, 1.0]  # a disagreement is a tie
    assert vote_evidence(own, replied, tie=-1.0).tolist() == [1.0, -1.0, 0.0, -1.0]  # a tie as a loss; NaN: none
    no_votes = OwnPromptSignals(h_own=own.h_own, hm_pre=own.hm_pre, hm_own=own.hm_own)
    assert vote_evidence(no_votes, replied).tolist() == [0.0] * 4


def test_a_trust_that_reads_the_votes_follows_them_not_the_entropies() -> None:
    """Memory trust on the votes, peer trust on the information: a client whose sent prompt is the more informative
    but loses the neighbour vote keeps its peer trust and loses its memory trust."""
    rng = np.random.default_rng(3)
    kw = synthetic_round(rng, 3, 6, reply_prob=1.0)
    reports = {
        "h_own": kw["h_pre"] + 0.1,
        "hm_pre": np.full(3, 2.0),
        "hm_own": np.full(3, 2.0),
        "v_pre": np.zeros(3),
        "v_own": np.full(3, 0.2),
    }
    params = FedRAPPParams(**ON, trust_memory_votes=1.0)
    out = fedrapp_round(**kw, params=params, **reports)
    assert np.allclose(out.state["trust-memory"], 1.0 - 0.5 * 0.4)  # lost: −κ·ρ_memory
    assert np.allclose(out.state["trust-peers"], 1.0)  # won: +κ·(1 − ρ_peers), clipped at 1


def test_bad_trust_inputs_are_refused_with_their_name() -> None:
    rng = np.random.default_rng(1)
    kw = synthetic_round(rng, 3, 4, reply_prob=1.0)
    p = FedRAPPParams(**ON)
    with pytest.raises(ValueError, match="trust-memory"):
        fedrapp_round(**kw, params=p, state={"trust-memory": np.array([0.5, 1.5, 0.2])})
    with pytest.raises(ValueError, match="h_own has shape"):
        fedrapp_round(**kw, params=p, h_own=np.ones(2))
    with pytest.raises(ValueError, match=r"hm_pre is outside \[0, inf\] in row\(s\) \[1\]"):
        own_prompt_signals(np.ones(3, bool), hm_pre=np.array([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match=r"v_own is outside \[0, 1.0\] in row\(s\) \[2\]"):
        own_prompt_signals(np.ones(3, bool), v_own=np.array([0.0, 1.0, 1.5]))
    with pytest.raises(ValueError, match="trust_rate"):
        make_params("fedrapp", {"trust_rate": 1.5})


def test_the_bound_rule_hands_the_reports_and_the_state_to_fedrapp_only() -> None:
    rng = np.random.default_rng(2)
    kw = synthetic_round(rng, 5, 6, reply_prob=1.0)
    own = own_reports(rng, kw)
    rule = make_rule("fedrapp", {"trust-rate": 0.5})
    out = rule(*(kw[k] for k in ("tuned", "sent", "memory", "h_pre", "h_post", "replied", "num_examples")), own=own)
    assert set(out.state) == set(TRUSTS)
    fedavg = make_rule("fedavg")(
        *(kw[k] for k in ("tuned", "sent", "memory", "h_pre", "h_post", "replied", "num_examples")),
        own=own,
        state=out.state,
    )
    assert fedavg.state == {}


# ------------------------------------------------------------------------------------------------- the ramp
RAMP = {
    "trust_rate": 1.0,
    "trust_memory_init": 0.0,
    "trust_memory_target": 0.225,
    "trust_memory_ramp": 0.15,
    "trust_peer_target": 0.3,
    "trust_peer_ramp": 0.2,
}


@settings(max_examples=200, deadline=None)
@given(share=st.floats(0, 1), target=st.floats(0, 1), ramp=st.floats(0.01, 1))
def test_the_ramp_is_zero_below_one_above_and_linear_between(share, target, ramp) -> None:
    trust = ramped_trust(np.array([share]), target, ramp)[0]
    if share <= target - ramp / 2:
        assert trust == 0.0
    elif share >= target + ramp / 2:
        assert trust == 1.0
    else:
        assert trust == pytest.approx((share - (target - ramp / 2)) / ramp)


def test_the_win_share_is_each_clients_own_without_pooling_and_all_clients_with_much() -> None:
    wins, rounds = np.array([0.0, 3.0, 1.0, 0.0]), np.array([4.0, 4.0, 2.0, 0.0])
    alone = pooled_win_share(wins, rounds, prior=0.1, pool=0.0)
    assert alone.tolist() == [0.0, 0.75, 0.5, 0.4]  # a client without evidence gets all clients' share, 4/10
    pooled = pooled_win_share(wins, rounds, prior=0.1, pool=1e12)
    np.testing.assert_allclose(pooled, 0.1, atol=1e-9)  # a pool that large is the prior for everyone
    # by hand, n0 = 2: all clients' share (4 + 2·0.1)/(10 + 2) = 0.35; client 1: (3 + 2·0.35)/(4 + 2)
    np.testing.assert_allclose(pooled_win_share(wins, rounds, 0.1, 2.0)[1], (3 + 0.7) / 6)
    assert pooled_win_share(np.zeros(3), np.zeros(3), prior=0.2, pool=0.0).tolist() == [0.2] * 3


@pytest.mark.parametrize("seed", range(4))
def test_a_ramped_client_whose_sent_prompt_always_loses_ends_none_fed(seed) -> None:
    """The even clients win every round, the odd ones lose every round: all clients' share is 1/2, and a loser's
    own rounds soon outweigh the pool, so both its trusts reach 0; a winner's stay at 1."""
    n = 6
    out, kw, state = play_rounds(
        np.random.default_rng(seed), FedRAPPParams(**RAMP), n, 30, lambda _: np.arange(n) % 2 == 0
    )
    assert_none_fed(out, kw, 3)
    assert out.diagnostics.trust_memory[0] == out.diagnostics.trust_peers[0] == 1.0  # an always-winner keeps both
    assert state["trust-memory-rounds"].tolist() == [30.0] * n and state["trust-memory-wins"].tolist() == [30, 0] * 3


def test_a_ramped_trust_is_the_ramp_of_the_pooled_share_by_hand() -> None:
    """One round, five clients: two win, three lose (information evidence), memory ramp 0.15-0.30 from 0."""
    rng = np.random.default_rng(5)
    kw = synthetic_round(rng, 5, 6, reply_prob=1.0)
    win = np.array([True, False, False, True, False])
    out = fedrapp_round(**kw, params=FedRAPPParams(**RAMP), **own_reports(rng, kw, win))
    population = (2 + 4 * 0.15) / (5 + 4)  # s₀ = 0.225 + 0.15·(0 − ½) = 0.15, n₀ = 4 (the default pool)
    share = (win + 4 * population) / (1 + 4)
    np.testing.assert_allclose(out.state["trust-memory"], np.clip((share - 0.225) / 0.15 + 0.5, 0, 1))
    assert out.state["trust-memory-wins"].tolist() == win.astype(float).tolist()
    assert out.state["trust-memory-rounds"].tolist() == [1.0] * 5


@pytest.mark.parametrize("seed", range(4))
def test_ramped_trusts_permute_with_the_clients_and_absent_ones_keep_theirs(seed) -> None:
    rng = np.random.default_rng(seed)
    kw = next_round(rng, *(synthetic_round(rng, 9, 21)[k] for k in ("memory", "sent")), reply_prob=0.7)
    own = own_reports(rng, kw)
    rounds = rng.integers(0, 6, 9).astype(float)
    state = {name: rng.uniform(0, 1, 9) for name in TRUSTS}
    for name in TRUSTS:
        state[f"{name}-rounds"] = rounds
        state[f"{name}-wins"] = np.floor(rounds * rng.uniform(0, 1, 9))
    p = FedRAPPParams(**RAMP)
    out = fedrapp_round(**kw, params=p, **own, state=state)
    perm = rng.permutation(9)
    permuted = fedrapp_round(
        **{k: v[perm] for k, v in kw.items()},
        params=p,
        **{k: v[perm] for k, v in own.items()},
        state={k: v[perm] for k, v in state.items()},
    )
    assert set(out.state) == set(state)
    for name, value in out.state.items():
        np.testing.assert_allclose(permuted.state[name], value[perm], atol=1e-12)
        absent = ~kw["replied"]
        assert np.array_equal(value[absent], state[name][absent])
    np.testing.assert_allclose(permuted.personalized, out.personalized[perm], rtol=1e-6, atol=1e-9)


def test_bad_ramp_counts_are_refused_with_their_name() -> None:
    rng = np.random.default_rng(1)
    kw = synthetic_round(rng, 3, 4, reply_prob=1.0)
    p = FedRAPPParams(**RAMP)
    with pytest.raises(ValueError, match="trust-memory-rounds"):
        fedrapp_round(**kw, params=p, state={"trust-memory-rounds": np.array([1.0, -1.0, 0.0])})
    with pytest.raises(ValueError, match="trust-memory-wins.*exceeds"):
        fedrapp_round(
            **kw,
            params=p,
            state={"trust-memory-wins": np.array([2.0, 0, 0]), "trust-memory-rounds": np.array([1.0, 0, 0])},
        )
    with pytest.raises(ValueError, match="trust_pool"):
        make_params("fedrapp", {"trust_pool": -1.0})


def test_a_client_sent_its_own_prompt_back_gives_no_vote_evidence_even_where_a_tie_loses() -> None:
    """Client 0 was sent its own prompt (equal reports, no disagreement); client 1's prompts differ in their
    marginals only, client 2's in their entropies: their equal votes are a tie, a loss with tie = −1."""
    h_pre = np.ones(3)
    own = OwnPromptSignals(
        h_own=np.array([1.0, 1.0, 1.1]),
        hm_pre=np.full(3, 2.0),
        hm_own=np.array([2.0, 2.1, 2.0]),
        v_pre=np.zeros(3),
        v_own=np.zeros(3),
    )
    replied = np.ones(3, bool)
    same = same_prompt(h_pre, own, replied)
    assert same.tolist() == [True, False, False]
    assert vote_evidence(own, replied, tie=-1.0, same=same).tolist() == [0.0, -1.0, -1.0]
    split = OwnPromptSignals(**{**own.__dict__, "v_pre": np.array([0.1, 0.0, 0.0])})  # votes differ: a contest
    assert vote_evidence(split, replied, tie=-1.0, same=same).tolist() == [1.0, -1.0, -1.0]
    no_marginals = OwnPromptSignals(h_own=own.h_own, hm_pre=np.full(3, np.nan), hm_own=np.full(3, np.nan))
    assert same_prompt(h_pre, no_marginals, replied).tolist() == [True, True, False]  # H alone then
    assert not same_prompt(h_pre, no_marginals, np.array([False, True, True]))[0]  # no reply: nothing is the same


def test_a_ramped_client_at_zero_is_not_locked_out_when_its_peers_start_winning() -> None:
    """Client 0 sits at trust 0 and is sent its own prompt back (no evidence, its counts stay); the other clients'
    sent prompts win, all clients' share rises, and client 0's trusts rise with it."""
    rng = np.random.default_rng(7)
    n = 5
    kw = synthetic_round(rng, n, 6, reply_prob=1.0)
    p = FedRAPPParams(**RAMP, trust_memory_votes=1.0, trust_peer_votes=1.0, trust_vote_tie=-1.0)
    reports = {
        "h_own": np.where(np.arange(n) == 0, kw["h_pre"], kw["h_pre"] + 0.1),
        "hm_pre": np.full(n, 2.0),
        "hm_own": np.full(n, 2.0),
        "v_pre": np.where(np.arange(n) == 0, 0.0, 0.2),
        "v_own": np.where(np.arange(n) == 0, 0.0, 0.1),
    }
    counts = {"wins": np.array([0.0, 1, 1, 1, 1]), "rounds": np.array([3.0, 1, 1, 1, 1])}
    state = {name: np.array([0.0, 1, 1, 1, 1]) for name in TRUSTS}
    state |= {f"{name}-{kind}": value for name in TRUSTS for kind, value in counts.items()}
    before = fedrapp_round(**kw, params=p, **reports, state=state).state
    for name in TRUSTS:
        assert before[f"{name}-rounds"].tolist() == [3.0, 2, 2, 2, 2]  # client 0: no evidence, its count stays
        assert before[f"{name}-wins"].tolist() == [0.0, 2, 2, 2, 2]
        assert before[name][0] > 0.0  # all clients won 8 of 11 rounds: their share lifts client 0


# ---------------------------------------------------------------------------------------- the kept memory (ours)
KEEP = {**ON, "trust_memory_keep": 1.0}


@pytest.mark.parametrize("seed", range(4))
def test_a_kept_memory_is_the_papers_memory_whatever_the_trusts(seed) -> None:
    """The memory follows the paper's rate μ, bit for bit, with trusts anywhere in [0, 1]; with full trusts and
    no evidence the prompts are the paper's as well."""
    rng = np.random.default_rng(seed)
    kw = next_round(rng, *(synthetic_round(rng, 7, 12)[k] for k in ("memory", "sent")))
    paper = fedrapp_round(**kw)
    state = {name: rng.uniform(0, 1, 7) for name in TRUSTS}
    kept = fedrapp_round(**kw, params=FedRAPPParams(**KEEP), **own_reports(rng, kw), state=state)
    assert np.array_equal(kept.memory, paper.memory)
    assert not np.allclose(kept.personalized, paper.personalized)  # the trusts moved the prompts, not the memory
    assert_same_output(fedrapp_round(**kw, params=FedRAPPParams(**KEEP)), paper)  # full trust, nothing reported


@pytest.mark.parametrize("seed", range(4))
def test_for_one_round_a_kept_memory_sends_what_the_trust_on_mu_sends(seed) -> None:
    """From the same previous memory, P̃ + t·μ·(M − P̃) either way: the two differ only in what is stored."""
    rng = np.random.default_rng(seed)
    kw = next_round(rng, *(synthetic_round(rng, 7, 12)[k] for k in ("memory", "sent")))
    own, state = own_reports(rng, kw), {name: rng.uniform(0, 1, 7) for name in TRUSTS}
    on_mu = fedrapp_round(**kw, params=FedRAPPParams(**ON), **own, state=state)
    kept = fedrapp_round(**kw, params=FedRAPPParams(**KEEP), **own, state=state)
    np.testing.assert_allclose(kept.personalized, on_mu.personalized, rtol=1e-5, atol=1e-6)
    assert np.array_equal(kept.diagnostics.mu, on_mu.diagnostics.mu)


@pytest.mark.parametrize("seed", range(4))
def test_a_kept_memory_client_whose_sent_prompt_always_loses_is_sent_its_upload_but_keeps_its_memory(seed) -> None:
    rng = np.random.default_rng(seed)
    n, loser = 6, 2
    p = FedRAPPParams(**KEEP)

    def wins(rng: np.random.Generator) -> np.ndarray:
        win = rng.random(n) < 0.5
        win[loser] = False
        return win

    rounds_to_zero = math.ceil(1 / (p.trust_rate * min(p.trust_memory_target, p.trust_peer_target)))
    out, kw, _ = play_rounds(rng, p, n, rounds_to_zero + 3, wins)
    assert out.diagnostics.trust_memory[loser] == out.diagnostics.trust_peers[loser] == 0.0
    assert np.array_equal(out.personalized[loser], kw["tuned"][loser])  # none-fed for it
    assert not np.allclose(out.memory[loser], kw["tuned"][loser])  # but the memory is still there


def test_a_kept_memory_is_a_switch() -> None:
    with pytest.raises(ValueError, match="trust_memory_keep = 0.5 must be 0 or 1"):
        FedRAPPParams(**{**ON, "trust_memory_keep": 0.5})


# ------------------------------------------------------------------------------------------ the probe (ours)
PROBE_ON = {**KEEP, "trust_probe": 1.0}


def probe_reports(kw: dict, own: dict, win: np.ndarray) -> dict[str, np.ndarray]:
    """The probe's reports where it wins (True) or loses (False) against the own prompt of the reports ``own`` by
    0.05 nats of entropy (the own marginal, votes 0.2 against 0.1 for the winner); NaN where a client is absent."""
    absent = ~kw["replied"]
    reports = {
        "h_probe": np.where(win, own["h_own"] - 0.05, own["h_own"] + 0.05),
        "hm_probe": own["hm_own"],
        "v_probe": np.where(win, 0.2, 0.1),
        "v_own_probe": np.where(win, 0.1, 0.2),
    }
    return {k: np.where(absent, np.nan, v) for k, v in reports.items()}


@pytest.mark.parametrize("seed", range(4))
def test_the_probe_is_the_papers_prompt_bit_for_bit_whatever_the_trusts_and_absent_clients_keep_theirs(seed) -> None:
    rng = np.random.default_rng(seed)
    kw = next_round(rng, *(synthetic_round(rng, 7, 12)[k] for k in ("memory", "sent")), reply_prob=0.7)
    state = {name: rng.uniform(0, 1, 7) for name in TRUSTS}
    out = fedrapp_round(**kw, params=FedRAPPParams(**PROBE_ON), **own_reports(rng, kw), state=state)
    paper = fedrapp_round(**kw)
    assert np.array_equal(out.state[PROBE], paper.personalized) and out.state[PROBE].dtype == np.float32
    assert not np.allclose(out.personalized, paper.personalized)  # what is sent is the trusts' prompt
    previous = rng.normal(size=(7, 12)).astype(np.float32)
    again = fedrapp_round(**kw, params=FedRAPPParams(**PROBE_ON), **own_reports(rng, kw), state={PROBE: previous})
    absent = ~kw["replied"]
    assert np.array_equal(again.state[PROBE][absent], previous[absent])
    assert np.array_equal(again.state[PROBE][~absent], paper.personalized[~absent])


def test_with_the_probe_the_trusts_read_the_probes_contest_and_fall_back_to_the_sent_prompts() -> None:
    """The sent prompt loses every contest; the probe wins for clients 0-2 and loses for 3-4; client 5 scored no
    probe, so its sent prompt's loss counts."""
    rng = np.random.default_rng(3)
    n = 6
    kw = synthetic_round(rng, n, 8, reply_prob=1.0)
    reports = own_reports(rng, kw, np.zeros(n, bool)) | {"v_pre": np.full(n, 0.1), "v_own": np.full(n, 0.2)}
    probe = probe_reports(kw, reports, np.arange(n) < 3)
    probe = {k: np.where(np.arange(n) == 5, np.nan, v) for k, v in probe.items()}
    for votes in (0.0, 1.0):  # the information gap, the votes
        p = FedRAPPParams(**{**PROBE_ON, "trust_memory_votes": votes, "trust_peer_votes": votes})
        half = {name: np.full(n, 0.5) for name in TRUSTS}
        out = fedrapp_round(**kw, params=p, **reports, **probe, state=half)
        without = fedrapp_round(
            **kw, params=FedRAPPParams(**{**KEEP, "trust_memory_votes": votes}), **reports, state=half
        )
        for name in TRUSTS:
            assert np.all(out.state[name][:3] > 0.5) and np.all(out.state[name][3:] < 0.5)
            assert np.all(without.state[name] < 0.5)  # the sent prompt's contest: every client loses


def test_with_the_peer_probe_only_the_peer_trust_reads_the_probe() -> None:
    """The sent prompt loses every contest, the probe wins for clients 0-2 and loses for 3-5: the memory trust
    reads the sent prompt's losses, the peer trust the probe's contest; the probe is sent either way."""
    rng = np.random.default_rng(4)
    n = 6
    kw = synthetic_round(rng, n, 8, reply_prob=1.0)
    reports = own_reports(rng, kw, np.zeros(n, bool)) | {"v_pre": np.full(n, 0.1), "v_own": np.full(n, 0.2)}
    probe = probe_reports(kw, reports, np.arange(n) < 3)
    half = {name: np.full(n, 0.5) for name in TRUSTS}
    p = FedRAPPParams(**{**KEEP, "trust_peer_probe": 1.0})
    out = fedrapp_round(**kw, params=p, **reports, **probe, state=half)
    assert np.all(out.state["trust-memory"] < 0.5)
    assert np.all(out.state["trust-peers"][:3] > 0.5) and np.all(out.state["trust-peers"][3:] < 0.5)
    assert np.array_equal(out.state[PROBE], fedrapp_round(**kw).personalized)


def test_the_probe_lifts_the_lock_of_a_client_sent_its_own_prompt_back() -> None:
    """Both trusts start at 0 (allowed with the probe) and the sent prompt's contest is never evidence (a client
    sent its own upload back reports equal scores); the probe wins every round, and the ramped trusts rise from 0
    to 1. Without the probe such a client's rounds count nothing."""
    rng = np.random.default_rng(5)
    n = 4
    p = FedRAPPParams(
        trust_rate=1.0,
        trust_memory_init=0.0,
        trust_peer_init=0.0,
        trust_memory_ramp=0.15,
        trust_peer_ramp=0.15,
        trust_memory_target=0.275,
        trust_peer_target=0.275,
        trust_memory_keep=1.0,
        trust_probe=1.0,
    )
    memory, sent = (synthetic_round(rng, n, 10)[k] for k in ("memory", "sent"))
    state, trusts = None, []
    for _ in range(6):
        kw = next_round(rng, memory, sent, reply_prob=1.0)
        same = {"h_own": kw["h_pre"].copy(), "hm_pre": np.full(n, 2.0), "hm_own": np.full(n, 2.0)}  # no contest
        out = fedrapp_round(**kw, params=p, **same, **probe_reports(kw, same, np.ones(n, bool)), state=state)
        memory, sent, state = out.memory, out.personalized, out.state
        trusts.append(state["trust-memory"].copy())
    assert np.all(np.diff(np.array(trusts), axis=0) >= 0) and np.all(trusts[-1] == 1.0)
    locked = FedRAPPParams(**{**p.__dict__, "trust_probe": 0.0, "trust_peer_init": 0.5})
    kw = next_round(rng, memory, sent, reply_prob=1.0)
    same = {"h_own": kw["h_pre"].copy(), "hm_pre": np.full(n, 2.0), "hm_own": np.full(n, 2.0)}
    zero = {name: np.zeros(n) for name in TRUSTS}
    assert np.all(fedrapp_round(**kw, params=locked, **same, state=zero).state["trust-memory-rounds"] == 0)


def test_the_probe_is_a_switch_that_needs_the_kept_memory() -> None:
    with pytest.raises(ValueError, match="trust_probe = 0.5 must be 0 or 1"):
        FedRAPPParams(**{**PROBE_ON, "trust_probe": 0.5})
    with pytest.raises(ValueError, match="trust_probe = 1 needs trust_memory_keep = 1"):
        FedRAPPParams(**{**ON, "trust_probe": 1.0})
    with pytest.raises(ValueError, match="lock every client at none-fed"):
        FedRAPPParams(**{**KEEP, "trust_memory_init": 0.0, "trust_peer_init": 0.0})
    FedRAPPParams(**{**PROBE_ON, "trust_memory_init": 0.0, "trust_peer_init": 0.0})  # no lock with the probe
    with pytest.raises(ValueError, match="choose one"):
        FedRAPPParams(**{**PROBE_ON, "trust_peer_probe": 1.0})
    with pytest.raises(ValueError, match="trust_peer_probe = 1 needs trust_memory_keep = 1"):
        FedRAPPParams(**{**ON, "trust_peer_probe": 1.0})
