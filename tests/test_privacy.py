"""Client-level differential privacy (issue 38): the mechanism's clip and noise, and the accountant."""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp

from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.privacy import accountant
from fedrapp_app.privacy.mechanism import PROMPT_SHARE, calibrate, clip_update, release
from fedrapp_app.privacy.upload import SEED_ENV
from fedrapp_app.report import write_report
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import comparable_rows, interrupt_after, read_rows, run_federation, small_run

BOUNDS = {"h-pre": (0.0, math.log(30)), "h-post": (0.0, math.log(30))}


# ----- the mechanism ---------------------------------------------------------------------------------------------
def test_the_noise_is_the_calibrated_gaussian_and_each_release_is_one_mechanism_of_noise_multiplier_z():
    z, clip_rms, dim = 1.7, 0.01, 400
    cal = calibrate(z, clip_rms, dim, BOUNDS)
    clip = clip_rms * math.sqrt(dim)
    assert cal.clip == pytest.approx(clip)
    # the parts' sensitivities over their noise add up to 1/z^2: one Gaussian mechanism on the whitened upload
    spent = (2 * clip / cal.prompt_sigma) ** 2 + sum(
        ((hi - lo) / cal.scalar_sigma[k]) ** 2 for k, (lo, hi) in BOUNDS.items()
    )
    assert spent == pytest.approx(1 / z**2)
    assert (2 * clip / cal.prompt_sigma) ** 2 == pytest.approx(PROMPT_SHARE / z**2)

    rng = np.random.default_rng(0)
    sent = np.zeros(dim)
    tuned = np.full(dim, clip_rms / 10)  # well inside the clip: the release is tuned + noise
    draws = np.stack([release(tuned, sent, {}, cal, rng).prompt - tuned for _ in range(300)])
    assert draws.mean() == pytest.approx(0.0, abs=4 * cal.prompt_sigma / math.sqrt(draws.size))
    assert draws.std() == pytest.approx(cal.prompt_sigma, rel=0.01)  # 120,000 draws: within 1%
    scalars = [release(tuned, sent, {"h-pre": 1.5}, calibrate(0.05, clip_rms, dim, BOUNDS), rng).scalars["h-pre"]
               for _ in range(4000)]  # fmt: skip
    assert np.std(scalars) == pytest.approx(calibrate(0.05, clip_rms, dim, BOUNDS).scalar_sigma["h-pre"], rel=0.05)


def test_no_released_update_exceeds_the_clip_and_a_small_one_is_kept_as_it_is():
    rng = np.random.default_rng(1)
    cal = calibrate(0.0, 0.01, 100, {})  # no noise: what is released is the clipped update itself
    sent = rng.normal(size=100)
    for scale in (1e-4, 1e-2, 1.0, 100.0):
        tuned = sent + rng.normal(size=100) * scale
        out = release(tuned, sent, {}, cal, rng)
        assert np.linalg.norm(out.prompt - sent) <= cal.clip * (1 + 1e-5)
        if np.linalg.norm(tuned - sent) <= cal.clip:
            assert np.array_equal(out.prompt, tuned.astype(np.float32))
    clipped, norm = clip_update(np.array([3.0, 4.0]), 1.0)
    assert norm == 5.0 and np.allclose(clipped, [0.6, 0.8])


def test_an_honest_private_upload_passes_the_norm_bound_when_its_sent_prompt_outgrew_the_plain_one():
    """Found on the validation grid: FedAvg and FedRAPP mix noised uploads, so a sent prompt carries earlier
    rounds' noise; an honest upload (sent + clipped update + noise) was rejected against the plain bound."""
    from fedrapp_app.privacy.ledger import PrivacyLedger

    rng = np.random.default_rng(0)
    dim, clip_rms, z, max_norm = 15_360, 0.02, 3.0, 100.0
    ledger = PrivacyLedger.empty(4, 1e-5, clip_rms)
    plain = max_norm + ledger.norm_allowance(z, dim)  # the bound before the fix
    sent = rng.normal(size=dim) * 3 * plain / math.sqrt(dim)  # a sent prompt of about 3x that norm
    calibration = calibrate(z, clip_rms, dim, {})
    for _ in range(20):
        update = rng.normal(size=dim)  # far above the clip: clipped to it
        honest = sent + clip_update(update, calibration.clip)[0] + rng.normal(scale=calibration.prompt_sigma, size=dim)
        assert plain < np.linalg.norm(honest) <= ledger.upload_bound(max_norm, float(np.linalg.norm(sent)), z, dim)
    assert ledger.upload_bound(max_norm, 1.0, z, dim) == plain  # never stricter than the plain bound
    assert np.linalg.norm(sent * 2) > ledger.upload_bound(max_norm, float(np.linalg.norm(sent)), z, dim)


def test_released_scalars_stay_in_their_public_range():
    rng = np.random.default_rng(2)
    cal = calibrate(3.0, 0.01, 10, {**BOUNDS, "v-pre": (0.0, 1.0)})
    for _ in range(200):
        out = release(np.zeros(10), np.zeros(10), {"h-pre": 2.0, "h-post": 9.0, "v-pre": 0.3}, cal, rng).scalars
        assert 0 <= out["h-pre"] <= math.log(30) and 0 <= out["h-post"] <= math.log(30) and 0 <= out["v-pre"] <= 1


def test_a_scalar_without_a_public_range_is_not_released():
    with pytest.raises(ValueError, match="no public range for the scalar"):
        release(np.zeros(3), np.zeros(3), {"correct": 5.0}, calibrate(1.0, 0.1, 3, BOUNDS), np.random.default_rng())


# ----- the accountant ----------------------------------------------------------------------------------------------
def _exact_gaussian_delta(epsilon: float, z: float, uploads: int) -> float:
    """δ(ε) of ``uploads`` composed Gaussian mechanisms of noise multiplier z: exactly one Gaussian mechanism of
    multiplier z / sqrt(uploads) (Balle & Wang 2018, Theorem 8)."""
    from statistics import NormalDist

    mu = math.sqrt(uploads) / z
    phi = NormalDist().cdf
    return phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * phi(-epsilon / mu - mu / 2)


def test_the_epsilon_is_the_librarys_pld_an_upper_bound_within_a_percent_of_the_exact_one():
    for z, uploads in ((0.8, 1), (2.5, 16), (7.0, 80)):
        library = pld.PLDAccountant(value_discretization_interval=accountant.PLD_INTERVAL)
        library.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), uploads))
        eps = accountant.epsilon(z, uploads, 1e-5)
        assert eps == library.get_epsilon(1e-5)
        # the exact (ε, δ) curve: at the accountant's ε the true δ is at most 1e-5 (an upper bound), and 1% less ε
        # would already exceed it (the bound is tight)
        assert _exact_gaussian_delta(eps, z, uploads) <= 1e-5 < _exact_gaussian_delta(0.99 * eps, z, uploads)
        rdp_library = rdp.RdpAccountant()
        rdp_library.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), uploads))
        assert accountant.rdp_epsilon({z: uploads}, 1e-5) == rdp_library.get_epsilon(1e-5) > eps
    assert accountant.epsilon(2.0, 0, 1e-5) == 0.0 and accountant.epsilon(0.0, 3, 1e-5) == math.inf
    # mixed noise multipliers compose: two releases at z and z' lie between two at z and two at z'
    assert (
        accountant.epsilon(3.0, 2, 1e-5)
        < accountant.epsilon_of({3.0: 1, 2.0: 1}, 1e-5)
        < accountant.epsilon(2.0, 2, 1e-5)
    )


def test_pld_needs_less_noise_than_rdp_for_the_default_schedule():
    z = accountant.noise_for_budget(8.0, 1e-5, 16)
    rdp_z = dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        lambda s: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s), 16),
        8.0,
        1e-5,
    )
    assert 0.9 * rdp_z < z < 0.97 * rdp_z  # about 6% less noise for the same (ε, δ)


@pytest.mark.parametrize("budget", [1.0, 2.0, 4.0, 8.0])
def test_the_noise_chosen_for_a_budget_meets_it_over_the_rounds_and_no_less_noise_would(budget):
    z = accountant.noise_for_budget(budget, 1e-5, 16)
    assert accountant.epsilon(z, 16, 1e-5) <= budget < accountant.epsilon(z * 0.98, 16, 1e-5)
    assert accountant.epsilon(z, 8, 1e-5) < budget  # fewer rounds (a shorter stream, drops): less spent
    assert accountant.noise_for_budget(math.inf, 1e-5, 16) == 0.0


@pytest.mark.parametrize(
    ("epsilon", "delta", "match"),
    [
        (0.0, 1e-5, "must be > 0"),
        (-1.0, 1e-5, "must be > 0"),
        (8.0, 0.0, r"\(0, 1\)"),
        (8.0, 1.0, r"\(0, 1\)"),
        (0.01, 1e-5, "needs a noise multiplier above 100"),
    ],  # fmt: skip
)
def test_a_malformed_or_impossible_budget_is_refused_with_the_fix(epsilon, delta, match):
    with pytest.raises(accountant.BudgetError, match=match):
        accountant.noise_for_budget(epsilon, delta, 80)


# ----- through the whole app ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("dp_tiny"), world.CLASSNAMES)


def without_dp(rows: list[dict]) -> list[dict]:
    """Comparable rows without what dp adds (each client's epsilon, its noise multiplier and calibration)."""
    out = comparable_rows(rows)
    for row in out:
        row.pop("dp_epsilon", None)
        for key in ("dp-noise", "dp-rounds", "dp-seeded"):
            row["client_metrics"].pop(key, None)
        for key in [k for k in row["client_metrics"] if k.startswith("exact-")]:  # the client's own copy, kept
            del row["client_metrics"][key]
    return out


@pytest.mark.parametrize(
    "rule",
    [{"strategy": "none-fed"}, {"strategy": "fedavg"}, {"strategy": "fedrapp"}, {"strategy": "fedrapp", "trust": True}],
    ids=["none-fed", "fedavg", "fedrapp", "fedrapp+trust"],
)
def test_no_noise_and_a_clip_above_every_update_give_the_non_private_rows(testbed_tiny, tmp_path, rule):
    base = small_run(testbed_tiny, tmp_path, **{"local-method": "im", **rule})
    plain, _, _ = run_federation({**base, "run-name": "plain"})
    private, _, _ = run_federation({**base, "run-name": "dp", "dp": True, "dp-epsilon": math.inf, "dp-clip": 1e6})
    assert without_dp(read_rows(private["run_dir"])) == without_dp(read_rows(plain["run_dir"]))
    assert all(row["dp_epsilon"] == math.inf for row in read_rows(private["run_dir"]) if row["status"] == "ok")
    assert "privacy" not in plain and private["privacy"]["max_epsilon"] == math.inf
    assert all("dp_epsilon" not in row for row in read_rows(plain["run_dir"]))  # dp = false: rows as before


def test_the_server_sees_noised_uploads_and_counts_each_clients_epsilon(testbed_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv(SEED_ENV, "test")  # reproducible noise (experiments only)
    config = small_run(testbed_tiny, tmp_path, **{"local-method": "im", "strategy": "fedavg", "dp": True,
                                                   "dp-epsilon": 4.0, "num-rounds": 4})  # fmt: skip
    summary, grid, _ = run_federation(config)
    rows = [r for r in read_rows(summary["run_dir"]) if r["status"] == "ok"]
    privacy = summary["privacy"]
    for client in range(3):
        mine = [r for r in rows if r["client"] == client]
        z = privacy["noise_multiplier"][str(client)]
        assert z == mine[0]["client_metrics"]["dp-noise"] > 0
        batches = mine[0]["client_metrics"]["dp-rounds"]
        assert accountant.epsilon(z, int(batches), 1e-5) <= 4.0  # calibrated for its whole stream
        assert [r["dp_epsilon"] for r in mine] == [accountant.epsilon(z, k + 1, 1e-5) for k in range(len(mine))]
        assert privacy["epsilon"][str(client)] == mine[-1]["dp_epsilon"] <= 4.0
    page = write_report(Path(summary["run_dir"])).read_text()
    assert "## Privacy" in page and f"the largest epsilon spent is {privacy['max_epsilon']:.3g}" in page
    # what the server sees moved by the noise, not the step: far beyond the clip's bound C = dp-clip * sqrt(d)
    dim = int(np.load(Path(summary["run_dir"]) / "checkpoint.npz")["p0"].size)
    assert all(r["update_norm"] > 10 * privacy["clip"] * math.sqrt(dim) for r in rows)


@pytest.mark.kernels
def test_none_fed_under_dp_is_none_fed_the_client_keeping_its_exact_prompt(testbed_tiny, tmp_path):
    """none-fed sends each client its own (noised) upload back with own-weight 1: the client puts its exact prompt
    in its place, so every prediction is the non-private one while the server only ever saw noise."""
    base = small_run(testbed_tiny, tmp_path, **{"local-method": "im", "strategy": "none-fed"})
    plain, _, _ = run_federation({**base, "run-name": "plain"})
    private, grid, _ = run_federation({**base, "run-name": "dp", "dp": True, "dp-epsilon": 1.0})
    keys = ("client", "round", "correct", "correct_before")
    assert [{k: r.get(k) for k in keys} for r in read_rows(private["run_dir"])] == [
        {k: r.get(k) for k in keys} for r in read_rows(plain["run_dir"])
    ]
    sent_later = [prompt for (rnd, _), prompt in grid.sent.items() if rnd > 1]
    p0 = next(prompt for (rnd, _), prompt in grid.sent.items() if rnd == 1)
    assert all(np.linalg.norm(prompt - p0) > 1.0 for prompt in sent_later)  # what the server holds is noise


def test_a_resumed_private_run_reports_the_same_epsilon(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path, **{"local-method": "im", "strategy": "fedrapp", "dp": True,
                                                   "dp-epsilon": 2.0, "num-rounds": 4})  # fmt: skip
    whole, _, _ = run_federation({**config, "run-name": "whole"})
    interrupt_after({**config, "run-name": "cut"}, 2)
    resumed, _, _ = run_federation({**config, "run-name": "cut", "resume": True})
    assert resumed["privacy"] == whole["privacy"]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"dp": True, "dp-epsilon": 0.0}, "dp-epsilon = 0.0: must be > 0.0"),
        ({"dp": True, "dp-delta": 1.0}, "dp-delta = 1.0: must be < 1"),
        ({"dp": True, "dp-clip": -1.0}, "dp-clip = -1.0: must be > 0.0"),
        ({"dp": True, "dp-clip": math.inf}, "dp-clip = inf: must be a finite number > 0"),
        ({"dp": True, "dp-delta": 0.5, "num-clients": 4}, r"dp-delta = 0.5: must be < 1/num-clients = 0.25"),
        ({"dp": True, "dp-delta": 0.1, "num-clients": 10}, r"dp-delta = 0.1: must be < 1/num-clients = 0.1"),
        ({"dp-epsilon": 2.0}, "dp-epsilon = 2.0: has no effect: differential privacy is off"),
    ],
)
def test_a_malformed_budget_is_refused_before_anything_loads(overrides, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_run_config(overrides)


def test_a_budget_no_noise_can_meet_is_refused_before_the_start_and_by_the_client(testbed_tiny, tmp_path):
    from fedrapp_app.running.preflight import PreflightError, check_privacy_budget

    config = RunConfig.from_run_config({"num-clients": 8, "dp": True, "dp-epsilon": 0.01})
    with pytest.raises(PreflightError, match="needs a noise multiplier above 100.*fix: a larger dp-epsilon"):
        check_privacy_budget(config)
    run = small_run(testbed_tiny, tmp_path, **{"dp": True, "dp-epsilon": 0.001, "num-rounds": 1})
    summary, _, _ = run_federation(run)  # a plain `flwr run` has no pre-start check: the clients refuse to upload
    rows = read_rows(summary["run_dir"])
    assert rows and all(r["status"] == "failed" and "needs a noise multiplier above 100" in r["reason"] for r in rows)
    assert summary["complete"] is False
