"""Byzantine-robust global baselines (Flower's median, trimmed mean and Krum) on flattened prompts."""

from __future__ import annotations

import numpy as np

from fedrapp_app.aggregation import make_rule


def _round(tuned, replied=None):
    tuned = np.asarray(tuned, dtype=np.float32)
    n = tuned.shape[0]
    replied = np.ones(n, bool) if replied is None else np.asarray(replied)
    zeros = np.zeros_like(tuned)
    return zeros, dict(
        tuned=tuned,
        sent=zeros,
        memory=zeros,
        h_pre=np.ones(n),
        h_post=np.ones(n),
        replied=replied,
        num_examples=np.ones(n),
    )


def test_median_and_trimmed_mean_are_coordinate_wise_and_ignore_absent_rows():
    tuned = [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [100.0, -100.0], [np.nan, np.nan]]
    _, kw = _round(tuned, replied=[True, True, True, True, False])
    median = make_rule("fedmedian")(**kw).personalized
    np.testing.assert_allclose(median, np.tile([2.5, 15.0], (5, 1)))
    trimmed = make_rule("fedtrimmedavg", {"beta": 0.25})(**kw).personalized  # cuts 1 of 4 at each end
    np.testing.assert_allclose(trimmed, np.tile([2.5, 15.0], (5, 1)))


def test_krum_picks_an_honest_upload_and_ignores_a_far_outlier():
    rng = np.random.default_rng(0)
    honest = 0.01 * rng.normal(size=(5, 8))
    tuned = np.vstack([honest, np.full((1, 8), 50.0)])
    _, kw = _round(tuned)
    chosen = make_rule("krum", {"num_malicious": 1})(**kw).personalized[0]
    assert any(np.allclose(chosen, h.astype(np.float32)) for h in honest)


def test_nobody_replied_changes_nothing():
    _, kw = _round([[1.0, 2.0], [3.0, 4.0]], replied=[False, False])
    for name in ("fedmedian", "fedtrimmedavg", "krum"):
        out = make_rule(name)(**kw)
        np.testing.assert_array_equal(out.personalized, kw["sent"])
