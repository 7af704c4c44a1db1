"""FedRAPP's server rule against SPEC §4: a loop-by-loop reference, and every property SPEC lists."""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedrapp_app.aggregation import (
    ABLATIONS,
    FedRAPPParams,
    fedrapp_round,
    make_params,
    none_fed_round,
    synthetic_round,
)
from fedrapp_app.aggregation.common import SPREAD_RTOL, masked_zscore


# ------------------------------------------------------------------------------------------------ helpers
def next_round(rng: np.random.Generator, memory: np.ndarray, sent: np.ndarray) -> dict[str, np.ndarray]:
    """Inputs of the next round of a simulation: uploads are the current ``sent`` plus a random step."""
    n, d = sent.shape
    kw = synthetic_round(rng, n, d)
    step = kw["tuned"] - kw["sent"]  # NaN on the rows of clients that do not reply
    kw.update(memory=memory, sent=sent, tuned=(sent + step).astype(np.float32))
    stalled = np.flatnonzero(kw["replied"])[:1]  # one replying client whose method did not move (Δ = 0)
    if rng.random() < 0.5:
        kw["tuned"][stalled] = sent[stalled]
    return kw


def reference_fedrapp(kw: dict[str, np.ndarray], p: FedRAPPParams) -> tuple[np.ndarray, np.ndarray, list]:
    """SPEC §4 transcribed client by client, in plain Python over float64 (no vectorisation)."""
    tuned, sent, memory = (kw[k].astype(np.float64) for k in ("tuned", "sent", "memory"))
    n = len(kw["replied"])
    replying = [i for i in range(n) if kw["replied"][i]]
    delta = {i: tuned[i] - sent[i] for i in replying}
    norm = {i: float(np.linalg.norm(delta[i])) for i in replying}
    informative = [i for i in replying if norm[i] > p.min_update_norm]

    def z(stat: dict[int, float]) -> dict[int, float]:
        values = [stat[i] for i in informative]
        if len(values) < 2 or statistics.pstdev(values) <= SPREAD_RTOL * max(abs(v) for v in values):
            return dict.fromkeys(informative, 0.0)
        mean, std = statistics.fmean(values), statistics.pstdev(values)
        return {i: (stat[i] - mean) / std for i in informative}

    z_drop = z({i: kw["h_pre"][i] - kw["h_post"][i] for i in replying})
    z_post = z({i: float(kw["h_post"][i]) for i in replying})
    z_q = z({i: math.log1p(norm[i] ** 2) for i in replying})
    r = [0.0] * n
    for i in informative:
        raw = p.lambda_drop * z_drop[i] - p.lambda_ent * z_post[i] - p.lambda_drift * z_q[i]
        r[i] = min(p.r_clip, max(-p.r_clip, raw))
    cap = p.update_clip * statistics.median(norm[i] for i in informative) if informative else math.inf

    def used(i: int) -> np.ndarray:  # the upload the memory takes: Δ clipped when update_clip > 0 (ours)
        if p.update_clip <= 0 or norm[i] <= cap:
            return tuned[i]
        return sent[i] + delta[i] * (cap / norm[i])

    new_memory = memory.copy()
    for i in replying:
        mu = min(1.0, max(0.0, p.mu0 - p.eta * r[i]))
        new_memory[i] = mu * memory[i] + (1 - mu) * used(i)
    new_memory = new_memory.astype(np.float32).astype(np.float64)
    rho = [1 / (1 + math.exp(-v)) for v in r]

    def cos(i: int, j: int) -> float:
        return float(delta[i] @ delta[j]) / (norm[i] * norm[j]) if i in informative else 0.0

    personalized = sent.copy()
    weights = []
    for i in replying:
        sources = [j for j in informative if j != i and (i not in informative or cos(i, j) > 0)]
        a = {j: rho[j] * math.exp(cos(i, j) / p.tau) for j in sources}
        w = {j: a[j] / sum(a.values()) for j in sources}
        weights.append((i, w))
        gamma = 0.0
        if sources:
            rho_bar = sum(w[j] * rho[j] for j in sources)
            gamma = min(p.gamma_max, 2 * p.gamma0 * rho_bar / (rho_bar + rho[i]))
        peers = sum((w[j] * new_memory[j] for j in sources), np.zeros_like(new_memory[i]))
        personalized[i] = (1 - gamma) * new_memory[i] + gamma * peers
    return new_memory, personalized, weights


def simple_round(n: int = 5, d: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    kw = synthetic_round(np.random.default_rng(seed), n, d, reply_prob=1.0)
    return kw


params_strategy = st.builds(
    lambda g0, gmax, **kw: FedRAPPParams(gamma0=min(g0, gmax), gamma_max=gmax, **kw),
    g0=st.floats(0, 1),
    gmax=st.floats(0, 1),
    lambda_drop=st.floats(0, 3),
    lambda_ent=st.floats(0, 3),
    lambda_drift=st.floats(0, 3),
    mu0=st.floats(0, 1),
    eta=st.floats(0, 2),
    tau=st.floats(0.01, 10),
)


@st.composite
def rounds(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """Small arbitrary rounds, including duplicate rows, zero updates, d = 1 and absent clients."""
    n = draw(st.integers(1, 7))
    d = draw(st.integers(1, 6))
    unit = st.floats(-1, 1, width=32)
    sent = draw(arrays(np.float32, (n, d), elements=unit))
    tuned = sent + draw(arrays(np.float32, (n, d), elements=st.sampled_from([0.0, 0.25, -0.5]) | unit))
    return {
        "tuned": tuned.astype(np.float32),
        "sent": sent,
        "memory": draw(arrays(np.float32, (n, d), elements=unit)),
        "h_pre": draw(arrays(np.float64, n, elements=st.floats(0, 5))),
        "h_post": draw(arrays(np.float64, n, elements=st.floats(0, 5))),
        "replied": draw(arrays(np.bool_, n)),
        "num_examples": np.full(n, 64.0),
    }


# ------------------------------------------------------------------------------------ SPEC, line by line
@pytest.mark.parametrize("update_clip", [0.0, 1.2])
@pytest.mark.parametrize("seed", range(12))
def test_matches_the_reference_transcription_of_spec(seed: int, update_clip: float) -> None:
    rng = np.random.default_rng(seed)
    p = FedRAPPParams(
        tau=float(rng.uniform(0.1, 1.0)), gamma0=0.5, gamma_max=0.7, lambda_drop=1.3, update_clip=update_clip
    )
    kw = next_round(rng, *(synthetic_round(rng, 9, 11)[k] for k in ("memory", "sent")))
    out = fedrapp_round(**kw, params=p)
    memory, personalized, weights = reference_fedrapp(kw, p)
    np.testing.assert_allclose(out.memory, memory, rtol=0, atol=1e-7)
    np.testing.assert_allclose(out.personalized, personalized, rtol=1e-6, atol=1e-7)
    for i, w in weights:
        expected = np.zeros(9)
        expected[list(w)] = list(w.values())
        np.testing.assert_allclose(out.diagnostics.peer_weights[i], expected, atol=1e-12)


# ----------------------------------------------------------------------------------- SPEC's properties
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lambdas=st.tuples(*[st.floats(0, 3)] * 3), tau=st.floats(0.01, 5))
@pytest.mark.kernels
def test_mu0_eta_gamma0_zero_reproduces_none_fed_bit_for_bit(seed, lambdas, tau) -> None:
    rng = np.random.default_rng(seed)
    overrides = dict(ABLATIONS["none-fed-equivalent"], tau=tau)
    overrides.update(zip(("lambda_drop", "lambda_ent", "lambda_drift"), lambdas, strict=True))
    p = make_params("fedrapp", overrides)
    start = synthetic_round(rng, 6, 10)
    state = {"fedrapp": (start["memory"], start["sent"]), "none": (start["memory"], start["sent"])}
    for _ in range(4):
        kw = next_round(rng, *state["fedrapp"])
        ours = fedrapp_round(**kw, params=p)
        theirs = none_fed_round(**{**kw, "memory": state["none"][0], "sent": state["none"][1]})
        assert np.array_equal(ours.memory, theirs.memory)
        assert np.array_equal(ours.personalized, theirs.personalized)
        state = {"fedrapp": (ours.memory, ours.personalized), "none": (theirs.memory, theirs.personalized)}


def test_identical_uploads_give_zero_scores_base_retention_and_one_prompt() -> None:
    rng = np.random.default_rng(3)
    n, d = 6, 7680
    p0 = rng.normal(0, 0.02, d).astype(np.float32)
    upload = (p0 + rng.normal(0, 0.01, d)).astype(np.float32)
    stack = lambda row: np.tile(row, (n, 1))  # noqa: E731
    out = fedrapp_round(
        stack(upload), stack(p0), stack(p0), np.full(n, 2.1), np.full(n, 1.7), np.ones(n, bool), np.ones(n)
    )
    diag = out.diagnostics
    assert diag.informative.all()
    assert np.array_equal(diag.r, np.zeros(n))
    assert np.array_equal(diag.mu, np.full(n, 0.5))
    assert (out.personalized == out.personalized[0]).all()  # exactly the same prompt for everyone
    np.testing.assert_allclose(diag.gamma, 0.3, rtol=1e-12)


def test_zero_spread_is_recognised_despite_rounding_of_the_mean() -> None:
    values = np.full(3, 0.1)  # float64 mean of three 0.1 is 0.1 + 2.8e-17, the std is ~1.4e-17
    assert values.mean() != 0.1
    assert np.array_equal(masked_zscore(values, np.ones(3, bool)), np.zeros(3))


@settings(max_examples=150, deadline=None)
@given(kw=rounds(), p=params_strategy)
def test_weights_are_a_distribution_and_prompts_convex_combinations_of_memories(kw, p) -> None:
    out = fedrapp_round(**kw, params=p)
    d = out.diagnostics
    w, replied = d.peer_weights, kw["replied"]
    assert (w >= 0).all()
    has_sources = w.sum(axis=1) > 0
    np.testing.assert_allclose(w.sum(axis=1)[has_sources], 1.0, rtol=1e-12)
    assert not has_sources[~replied].any()
    assert not w[:, ~d.informative].any() and not np.diag(w).any()  # sources are informative peers
    assert not d.gamma[~has_sources].any()
    assert ((d.gamma >= 0) & (d.gamma <= p.gamma_max)).all()
    assert ((d.mu >= 0) & (d.mu <= 1)).all() and (np.abs(d.r) <= p.r_clip).all()
    assert not d.r[~d.informative].any()

    coeffs = np.diag(1.0 - d.gamma) + d.gamma[:, None] * w
    assert (coeffs >= 0).all()
    np.testing.assert_allclose(coeffs.sum(axis=1), 1.0, rtol=1e-12)
    memory = out.memory.astype(np.float64)
    scale = max(1.0, np.abs(memory).max())
    rows = replied
    np.testing.assert_allclose(out.personalized[rows], (coeffs @ memory)[rows], rtol=0, atol=1e-6 * scale)
    lo, hi = memory.min(axis=0), memory.max(axis=0)
    assert (out.personalized[rows] >= lo - 1e-6 * scale).all() and (out.personalized[rows] <= hi + 1e-6 * scale).all()


@pytest.mark.parametrize("seed", range(6))
def test_relabelling_the_clients_permutes_every_output(seed: int) -> None:
    rng = np.random.default_rng(seed)
    kw = next_round(rng, *(synthetic_round(rng, 10, 33)[k] for k in ("memory", "sent")))
    perm = rng.permutation(10)
    out = fedrapp_round(**kw)
    permuted = fedrapp_round(**{k: v[perm] for k, v in kw.items()})
    for name in ("memory", "personalized"):
        np.testing.assert_allclose(getattr(permuted, name), getattr(out, name)[perm], rtol=1e-6, atol=1e-9)
    a, b = out.diagnostics, permuted.diagnostics
    assert np.array_equal(b.informative, a.informative[perm])
    for name in ("update_norm", "r", "mu", "gamma"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name)[perm], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b.peer_weights, a.peer_weights[np.ix_(perm, perm)], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_larger_entropy_drop_means_lower_retention_and_more_weight_as_a_source(seed: int) -> None:
    # Clients 0 and 1 are identical (same state, upload, H_post) except that 0's entropy dropped more.
    rng = np.random.default_rng(seed)
    kw = synthetic_round(rng, 8, 40, reply_prob=1.0)
    for key in ("tuned", "sent", "memory", "h_post"):
        kw[key][1] = kw[key][0]
    kw["h_pre"][0] = kw["h_pre"][1] + 0.5
    d = fedrapp_round(**kw).diagnostics
    assert d.r[0] > d.r[1] and d.mu[0] < d.mu[1]
    peers_of_both = (d.peer_weights[:, 0] > 0) & (d.peer_weights[:, 1] > 0)
    assert peers_of_both.any()
    assert (d.peer_weights[peers_of_both, 0] > d.peer_weights[peers_of_both, 1]).all()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), extra=st.floats(0.01, 3))
@example(seed=76519665, extra=3.0)  # two informative clients: r is 0 within rounding before and after
def test_raising_one_clients_entropy_drop_never_raises_its_retention(seed, extra) -> None:
    kw = synthetic_round(np.random.default_rng(seed), 7, 12)
    k = int(np.flatnonzero(kw["replied"])[0])
    before = fedrapp_round(**kw).diagnostics.mu[k]
    kw["h_pre"][k] += extra
    # up to rounding: with two informative clients every z-score is ±1 and r sums to 0 within an ulp or two
    assert fedrapp_round(**kw).diagnostics.mu[k] <= before + 1e-12


# ------------------------------------------------------------------------------------------ edge cases
def test_absent_clients_are_untouched_and_their_uploads_never_read() -> None:
    kw = synthetic_round(np.random.default_rng(1), 9, 16, reply_prob=0.5)
    absent = ~kw["replied"]
    garbage = {**kw, "tuned": np.where(absent[:, None], 1e30, kw["tuned"]).astype(np.float32)}
    garbage.update(h_pre=np.where(absent, -7.0, kw["h_pre"]), h_post=np.where(absent, np.inf, kw["h_post"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, other = fedrapp_round(**kw), fedrapp_round(**garbage)
    assert np.array_equal(out.memory, other.memory) and np.array_equal(out.personalized, other.personalized)
    assert np.array_equal(out.memory[absent], kw["memory"][absent])
    assert np.array_equal(out.personalized[absent], kw["sent"][absent])
    d = out.diagnostics
    assert not d.peer_weights[:, absent].any() and not d.peer_weights[absent].any()
    assert np.array_equal(d.mu[absent], np.ones(absent.sum())) and not d.r[absent].any()


def test_a_single_replying_client_keeps_its_own_memory() -> None:
    kw = synthetic_round(np.random.default_rng(2), 5, 6)
    kw["replied"][:] = False
    kw["replied"][3] = True
    out = fedrapp_round(**kw)
    d = out.diagnostics
    assert not d.r.any() and d.mu[3] == 0.5 and not d.gamma.any() and not d.peer_weights.any()
    expected = (0.5 * kw["memory"][3].astype(np.float64) + 0.5 * kw["tuned"][3]).astype(np.float32)
    assert np.array_equal(out.memory[3], expected)
    assert np.array_equal(out.personalized[3], out.memory[3])


def test_fewer_than_two_informative_clients_zero_every_score() -> None:
    kw = simple_round(n=3)
    kw["tuned"][1] = kw["sent"][1]  # replied, but its method did not move
    kw["replied"][2] = False
    d = fedrapp_round(**kw).diagnostics
    assert d.informative.tolist() == [True, False, False]
    assert not d.r.any() and np.array_equal(d.mu, [0.5, 0.5, 1.0])
    # The stalled client leans on the one informative peer (ρ = ρ̄ = 1/2, so γ = γ0); that peer has none.
    assert d.peer_weights[1].tolist() == [1.0, 0.0, 0.0] and d.gamma.tolist() == [0.0, 0.3, 0.0]


def test_a_statistic_without_spread_contributes_nothing() -> None:
    kw = simple_round(n=6, seed=4)
    kw["h_post"][:] = 1.25
    p = FedRAPPParams(lambda_drift=0.0, r_clip=np.inf)
    r = fedrapp_round(**kw, params=p).diagnostics.r
    np.testing.assert_allclose(r, masked_zscore(kw["h_pre"] - kw["h_post"], np.ones(6, bool)), atol=1e-12)


def test_sources_need_a_positive_cosine_unless_the_receiver_did_not_move() -> None:
    n, d = 5, 3
    sent = np.zeros((n, d), np.float32)
    tuned = np.array([[1, 0, 0], [-1, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 1]], np.float32)
    h = np.array([2.0, 2.5, 1.0, 2.0, 1.5])
    out = fedrapp_round(tuned, sent, sent, h, h - 0.5, np.ones(n, bool), np.ones(n))
    w = out.diagnostics.peer_weights
    assert w[0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]  # 1 points the other way, 4 is orthogonal (cos = 0)
    assert not w[1].any() and not w[4].any()
    informative = [0, 1, 2, 4]
    assert (w[3, informative] > 0).all()  # the stalled client 3 takes every informative client, cos as 0
    rho = 1 / (1 + np.exp(-out.diagnostics.r[informative]))
    np.testing.assert_allclose(w[3, informative], rho / rho.sum(), rtol=1e-12)


def test_tiny_temperature_is_stable() -> None:
    kw = simple_round(n=6, d=20, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fedrapp_round(**kw, params=FedRAPPParams(tau=1e-9))
    w = out.diagnostics.peer_weights
    assert np.isfinite(out.personalized).all()
    has = w.sum(axis=1) > 0
    np.testing.assert_allclose(w[has].sum(axis=1), 1.0)
    assert np.isin(np.round(w[has], 6), [0.0, 1.0]).all()  # the most similar source takes everything


def test_scores_are_clipped() -> None:
    kw = synthetic_round(np.random.default_rng(6), 30, 4, reply_prob=1.0)
    kw["h_post"][:] = 1.0
    kw["h_pre"][:] = 1.5
    kw["h_pre"][7] = 50.0  # one outlier: z = sqrt(29) ≈ 5.4 before clipping
    r = fedrapp_round(**kw, params=FedRAPPParams(lambda_drift=0.0)).diagnostics.r
    assert r[7] == 3.0 and r.max() == 3.0


def test_update_clip_bounds_an_outsized_upload_but_not_its_reliability_penalty() -> None:
    """One client uploads its update ×100: with update_clip the honest clients' prompts stay near the
    attack-free ones, the attacker's r is the same as without clipping (scored on the raw drift)."""
    clean = synthetic_round(np.random.default_rng(11), 10, 16, reply_prob=1.0)
    attacked = {k: v.copy() for k, v in clean.items()}
    attacked["tuned"][0] = clean["sent"][0] + 100.0 * (clean["tuned"][0] - clean["sent"][0])
    honest = np.arange(1, 10)

    def pull(p: FedRAPPParams) -> float:
        gap = fedrapp_round(**attacked, params=p).personalized - fedrapp_round(**clean, params=p).personalized
        return float(np.linalg.norm(gap[honest], axis=1).max())

    step = float(np.linalg.norm(clean["tuned"] - clean["sent"], axis=1).max())
    unclipped, clipped = pull(FedRAPPParams()), pull(FedRAPPParams(update_clip=2.0))
    assert unclipped > step  # the ×100 update moves an honest prompt more than any honest update did
    assert clipped < unclipped / 10 and clipped < step / 10
    r = [fedrapp_round(**attacked, params=FedRAPPParams(update_clip=c)).diagnostics.r for c in (0.0, 2.0)]
    np.testing.assert_array_equal(r[0], r[1])
    assert r[0][0] == r[0].min()


def test_a_huge_update_clip_changes_nothing_but_rounding() -> None:
    kw = synthetic_round(np.random.default_rng(12), 8, 6)
    off, on = fedrapp_round(**kw), fedrapp_round(**kw, params=FedRAPPParams(update_clip=1e9))
    np.testing.assert_allclose(on.memory, off.memory, rtol=0, atol=1e-7)
    np.testing.assert_allclose(on.personalized, off.personalized, rtol=0, atol=1e-7)


def test_nobody_replied_changes_nothing() -> None:
    kw = synthetic_round(np.random.default_rng(7), 4, 5)
    kw["replied"][:] = False
    out = fedrapp_round(**kw)
    assert np.array_equal(out.memory, kw["memory"]) and np.array_equal(out.personalized, kw["sent"])


@pytest.mark.parametrize(
    ("ablation", "check"),
    [
        ("no-reliability", lambda kw, out: not out.diagnostics.r.any()),
        (
            "no-memory",
            lambda kw, out: (
                np.array_equal(out.memory[kw["replied"]], kw["tuned"][kw["replied"]])
                and not out.diagnostics.mu[kw["replied"]].any()
            ),
        ),
        (
            "no-peers",
            lambda kw, out: (
                not out.diagnostics.gamma.any()
                and np.array_equal(out.personalized[kw["replied"]], out.memory[kw["replied"]])
            ),
        ),
    ],
)
def test_ablations_switch_off_what_they_name(ablation, check) -> None:
    kw = synthetic_round(np.random.default_rng(8), 8, 10)
    out = fedrapp_round(**kw, params=make_params("fedrapp", ABLATIONS[ablation]))
    assert check(kw, out)
    assert fedrapp_round(**kw).diagnostics.gamma.any()  # the default does mix, so the check can fail
