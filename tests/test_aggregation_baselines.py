"""The baselines' server rules (SPEC §5): none-fed, fedavg, fedamp, fedamp-cos."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrapp_app.aggregation import (
    FedAMPCosParams,
    FedAMPParams,
    fedamp_cos_round,
    fedamp_round,
    fedavg_round,
    none_fed_round,
    synthetic_round,
)


def test_none_fed_continues_from_each_upload() -> None:
    kw = synthetic_round(np.random.default_rng(0), 6, 9)
    out = none_fed_round(**kw)
    r = kw["replied"]
    assert np.array_equal(out.memory[r], kw["tuned"][r]) and np.array_equal(out.personalized[r], kw["tuned"][r])
    assert np.array_equal(out.memory[~r], kw["memory"][~r]) and np.array_equal(out.personalized[~r], kw["sent"][~r])
    assert out.diagnostics.xi is None and not out.diagnostics.gamma.any()


# ------------------------------------------------------------------------------------------------- fedavg
def test_fedavg_is_the_exact_example_weighted_mean_and_reaches_everyone() -> None:
    # Dyadic values: every product and sum below is exact in float64, so equality must be exact.
    tuned = np.array([[0.5, -1.0], [0.25, 2.0], [np.nan, np.nan], [1.0, 0.0]], np.float32)
    sent = np.zeros((4, 2), np.float32)
    replied = np.array([True, True, False, True])
    counts = np.array([1.0, 3.0, 99.0, 4.0])
    out = fedavg_round(tuned, sent, sent, np.ones(4), np.ones(4), replied, counts)
    expected = (1 * tuned[0] + 3 * tuned[1] + 4 * tuned[3]) / 8  # = [0.65625, 0.625]
    assert np.array_equal(out.personalized, np.tile(expected, (4, 1)))
    assert np.array_equal(out.memory, out.personalized)
    assert np.array_equal(out.diagnostics.xi[2], [1 / 8, 3 / 8, 0, 4 / 8])
    assert out.diagnostics.gamma[2] == 1.0  # the absent client's prompt is all peers


def test_fedavg_matches_numpy_average_on_random_rounds() -> None:
    kw = synthetic_round(np.random.default_rng(1), 20, 50)
    out = fedavg_round(**kw)
    r = kw["replied"]
    expected = np.average(kw["tuned"][r].astype(np.float64), axis=0, weights=kw["num_examples"][r])
    np.testing.assert_allclose(out.personalized, np.tile(expected, (20, 1)), rtol=1e-6)
    np.testing.assert_allclose(out.diagnostics.xi.sum(axis=1), 1.0)


@pytest.mark.parametrize(("counts", "match"), [([0.0, 0.0], "positive total"), ([1.0, -2.0], "finite and >= 0")])
def test_fedavg_rejects_unusable_example_counts(counts, match) -> None:
    kw = synthetic_round(np.random.default_rng(2), 2, 3, reply_prob=1.0)
    with pytest.raises(ValueError, match=match):
        fedavg_round(**{**kw, "num_examples": np.array(counts)})


# ------------------------------------------------------------------------------------------------- fedamp
@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 9), sigma=st.floats(1e-4, 100), step=st.floats(1e-4, 1))
def test_fedamp_weights_are_a_distribution_with_enough_self_weight(seed, n, sigma, step) -> None:
    kw = synthetic_round(np.random.default_rng(seed), n, 7, step=step)
    out = fedamp_round(**kw, params=FedAMPParams(sigma=sigma))
    xi, r = out.diagnostics.xi, kw["replied"]
    assert (xi >= 0).all()
    np.testing.assert_allclose(xi.sum(axis=1)[r], 1.0, rtol=1e-12)
    assert (np.diag(xi)[r] >= 0.1 - 1e-12).all()
    assert not xi[~r].any() and not xi[:, ~r].any()
    uploads = np.where(r[:, None], kw["tuned"], 0).astype(np.float64)
    np.testing.assert_allclose(out.personalized[r], (xi @ uploads)[r], rtol=1e-6, atol=1e-7)
    assert np.array_equal(out.personalized[~r], kw["sent"][~r])


def test_fedamp_follows_the_attention_formula_when_no_rescaling_is_needed() -> None:
    kw = synthetic_round(np.random.default_rng(3), 5, 4, reply_prob=1.0, step=0.5)
    p = FedAMPParams(sigma=2.0)
    xi = fedamp_round(**kw, params=p).diagnostics.xi
    tuned = kw["tuned"].astype(np.float64)
    for i in range(5):
        for j in range(5):
            if i != j:
                d2 = float(np.sum((tuned[i] - tuned[j]) ** 2))
                assert math.isclose(xi[i, j], 0.5 / 4 * math.exp(-d2 / 2.0) / 2.0, rel_tol=1e-9)
    np.testing.assert_allclose(np.diag(xi), 1 - (xi.sum(axis=1) - np.diag(xi)), rtol=1e-12)
    assert (np.diag(xi) > 0.5).all()  # peers can weigh at most peer_mass / σ = 0.25 here


def test_fedamp_rescales_peers_that_would_push_the_self_weight_below_its_floor() -> None:
    kw = synthetic_round(np.random.default_rng(4), 4, 6, reply_prob=1.0)
    kw["tuned"][:] = kw["tuned"][0]  # identical prompts: each peer would weigh 0.5/3·exp(0)/0.05 ≈ 3.3
    xi = fedamp_round(**kw, params=FedAMPParams(sigma=0.05)).diagnostics.xi
    np.testing.assert_allclose(np.diag(xi), 0.1, rtol=1e-12)
    off = xi - np.diag(np.diag(xi))
    np.testing.assert_allclose(off[~np.eye(4, dtype=bool)], 0.3, rtol=1e-12)  # the 0.9 shared equally


def test_fedamp_cosine_variant_fixes_the_self_weight_and_follows_exp_sigma_cos() -> None:
    kw = synthetic_round(np.random.default_rng(5), 6, 8, reply_prob=1.0, step=0.2)
    p = FedAMPCosParams(self_weight=0.4, sigma=7.0)
    xi = fedamp_cos_round(**kw, params=p).diagnostics.xi
    np.testing.assert_allclose(np.diag(xi), 0.4, rtol=0, atol=0)
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, rtol=1e-12)
    tuned = kw["tuned"].astype(np.float64)
    unit = tuned / np.linalg.norm(tuned, axis=1, keepdims=True)
    for i in range(6):
        others = [j for j in range(6) if j != i]
        e = np.exp(7.0 * (unit[others] @ unit[i]))
        np.testing.assert_allclose(xi[i, others], 0.6 * e / e.sum(), rtol=1e-9)


@pytest.mark.parametrize("rule", [fedamp_round, fedamp_cos_round])
def test_fedamp_rules_leave_a_lonely_client_with_its_own_upload(rule) -> None:
    kw = synthetic_round(np.random.default_rng(6), 4, 5, reply_prob=1.0)
    kw["replied"][:] = [False, True, False, False]
    out = rule(**kw)
    assert np.array_equal(out.personalized[1], kw["tuned"][1]) and out.diagnostics.xi[1, 1] == 1.0


def test_fedamp_distances_stay_accurate_for_prompts_far_from_the_origin() -> None:
    # ‖a‖² + ‖b‖² − 2a·b loses ~‖a‖²·1e-16 to cancellation; with ‖a‖² ≈ 4e7 that is a visible part of
    # distances of ~1e-3 unless the prompts are centred first.
    rng = np.random.default_rng(7)
    tuned = (1000.0 + rng.normal(0, 0.005, size=(5, 40))).astype(np.float32)
    kw = {"sent": tuned, "memory": tuned, "h_pre": np.ones(5), "h_post": np.ones(5)}
    xi = fedamp_round(tuned, **kw, replied=np.ones(5, bool), num_examples=np.ones(5), params=FedAMPParams(sigma=1e-4))
    t = tuned.astype(np.float64)
    for i, j in [(0, 1), (2, 4), (3, 0)]:
        d2 = float(np.sum((t[i] - t[j]) ** 2))
        assert math.isclose(xi.diagnostics.xi[i, j], 0.5 / 4 * math.exp(-d2 / 1e-4) / 1e-4, rel_tol=1e-7)
