"""What a private client lets out under ``dp = true``: only the allow-listed fields, each release once, noise that
cannot be cancelled, and nothing non-finite (docs/privacy.md, "What the server sees")."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedrapp_app.federation.client import app as client_app
from fedrapp_app.federation.inprocess import InProcessGrid
from fedrapp_app.federation.records import (
    METRICS,
    NOTES,
    PRIVATE_REPLY_METRICS,
    PRIVATE_REPLY_NOTES,
    PROMPT,
    RELEASED_METRICS,
    flatten,
    record_to_prompt,
)
from fedrapp_app.federation.server import run_server
from fedrapp_app.federation.strategy import PersonalizedPromptStrategy
from fedrapp_app.methods import BUILT_IN, find_method
from fedrapp_app.privacy import accountant
from fedrapp_app.privacy.mechanism import NonFiniteUpload
from fedrapp_app.privacy.upload import (
    SEED_ENV,
    ReleaseRefused,
    private_upload,
    released_positions,
    split_state,
)
from fedrapp_app.recording.checkpoint import CLIENT_STATE_DIR, ServerCheckpoint
from fedrapp_app.recording.outcomes import read_outcomes
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import read_rows, server_rows, small_run

#: The built-in methods dp allows (a method that uploads a payload beside its prompt is refused under dp).
PRIVATE_METHODS = [m for m in BUILT_IN if not find_method(m).target.uploads_payload]


class CaptureGrid(InProcessGrid):
    """An in-process grid that keeps every reply the server pulls: the server's whole view of the clients."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.replies = []

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        self.replies.extend(replies)
        return replies


def train_replies(grid: CaptureGrid) -> list:
    return [m for m in grid.replies if m.metadata.message_type == "train" and m.has_content()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("dp_reply_tiny"), world.CLASSNAMES)


def private_run(tiny: Path, tmp_path: Path, **overrides) -> dict:
    return small_run(tiny, tmp_path, **{"dp": True, "dp-epsilon": 8.0, "strategy": "fedrapp", "num-rounds": 2,
                                        **overrides})  # fmt: skip


# ----- the allow-list ---------------------------------------------------------------------------------------------
#: Every built-in method dp allows with the trust option (which asks the clients for the most fields), and the
#: default without it.
REPLY_CASES = [(m, True) for m in PRIVATE_METHODS] + [("adaprompt", False)]


@pytest.mark.parametrize(("method", "trust"), REPLY_CASES, ids=[f"{m}{'+trust' * t}" for m, t in REPLY_CASES])
def test_a_private_reply_carries_only_the_allow_listed_fields_and_no_exact_statistic(tiny, tmp_path, method, trust):
    config = private_run(tiny, tmp_path, **{"local-method": method, "trust": trust})
    grid = CaptureGrid(client_app, 3, config)
    summary = run_server(grid, config)
    replies = train_replies(grid)
    assert replies and all(r["status"] == "ok" for r in server_rows(summary["run_dir"]))
    outcomes = read_outcomes([Path(summary["run_dir"])])
    released = ("h-pre", "h-post", *RELEASED_METRICS)
    for reply in replies:
        content = reply.content
        metrics, notes = content.metric_records[METRICS], content.config_records.get(NOTES, {})
        assert set(metrics) <= set(PRIVATE_REPLY_METRICS), sorted(set(metrics) - set(PRIVATE_REPLY_METRICS))
        assert set(notes) <= set(PRIVATE_REPLY_NOTES), sorted(set(notes) - set(PRIVATE_REPLY_NOTES))
        assert set(content.array_records) == {PROMPT}  # the noised prompt alone
        # every statistic the mechanism releases went out noised: its exact value (kept in the client's outcome
        # file) appears nowhere in the reply
        outcome = outcomes[(int(reply.metadata.group_id), int(metrics["client-id"]))]
        exact = {k[len("exact-") :]: v for k, v in outcome["client_metrics"].items() if k.startswith("exact-")}
        assert {k for k in released if k in metrics} == set(exact)
        # (a value clamped to an end of its public range, 0, 1 or ln C, says nothing the range does not)
        ends = (0.0, 1.0, math.log(len(world.CLASSNAMES)))
        inside = {name: e for name, e in exact.items() if not any(math.isclose(e, end) for end in ends)}
        same = [(k, name) for k in released if k in metrics for name, e in inside.items()
                if math.isclose(float(metrics[k]), e, abs_tol=1e-9)]  # fmt: skip
        assert not same, same
    # and the experimenter still gets whole rows: the outcome files merged into them
    assert all("correct" in r and "acc" in r for r in read_rows(summary["run_dir"]) if r["status"] == "ok")
    assert summary["samples"] > 0 and 0 <= summary["micro_accuracy"] <= 1


def test_the_server_refuses_a_private_reply_that_carries_more_after_counting_it(tiny, tmp_path):
    """A client of another version that sends a label count under dp: its reply is rejected for the round, its
    release still counted (it left the client)."""

    def leaky(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "train" and reply.has_content():
            reply.content[METRICS]["correct"] = 3
        return reply

    config = private_run(tiny, tmp_path, **{"num-rounds": 1})
    summary = run_server(CaptureGrid(leaky, 3, config), config)
    rows = server_rows(summary["run_dir"])
    assert all(r["status"] == "rejected" and "['correct']" in r["reason"] for r in rows)
    assert all(e > 0 for e in summary["privacy"]["epsilon"].values())


# ----- a release once, whatever the server forgets ------------------------------------------------------------------
def test_a_server_killed_before_its_checkpoint_gets_the_same_releases_and_the_true_epsilon_stays_in_budget(
    tiny, tmp_path, monkeypatch
):
    budget = 2.0
    config = private_run(tiny, tmp_path, **{"dp-epsilon": budget, "num-rounds": 4, "run-name": "cut"})
    aggregate = PersonalizedPromptStrategy.aggregate_train

    def killed_at_3(self, server_round, replies):
        if server_round == 3:  # the replies arrived; the server dies before it counts them or writes its checkpoint
            raise KeyboardInterrupt("killed after round 3's replies arrived")
        return aggregate(self, server_round, replies)

    first = CaptureGrid(client_app, 3, config)
    with monkeypatch.context() as patch:
        patch.setattr(PersonalizedPromptStrategy, "aggregate_train", killed_at_3)
        with pytest.raises(KeyboardInterrupt):
            run_server(first, config)
    lost = {int(r.content[METRICS]["client-id"]): r for r in train_replies(first) if r.metadata.group_id == "3"}
    assert len(lost) == 3

    second = CaptureGrid(client_app, 3, config)  # fresh processes: each client restores its state from disk
    summary = run_server(second, {**config, "resume": True})
    again = {int(r.content[METRICS]["client-id"]): r for r in train_replies(second) if r.metadata.group_id == "3"}
    run_dir = Path(summary["run_dir"])
    token = ServerCheckpoint.load(run_dir).token
    for client, reply in again.items():
        metrics = reply.content[METRICS]
        assert metrics["dp-replayed"] == 1  # answered from the release log: the same release, no new noise
        assert np.array_equal(flatten(record_to_prompt(reply.content[PROMPT])),
                              flatten(record_to_prompt(lost[client].content[PROMPT])))  # fmt: skip
        # the true loss: every position the client ever released (its own log), against the ledger's count
        snapshots = (run_dir / CLIENT_STATE_DIR / token).glob(f"client-{client}-pos*.npz")
        snapshot = max(snapshots, key=lambda path: int(path.stem.rsplit("pos", 1)[1]))  # the latest
        with np.load(snapshot) as state:
            positions = released_positions(split_state(dict(state))[1])
        assert len(positions) == len(set(positions)) == 4
        z = float(metrics["dp-noise"])
        true_epsilon = accountant.epsilon(z, len(positions), summary["privacy"]["delta"])
        assert summary["privacy"]["epsilon"][str(client)] == pytest.approx(true_epsilon) and true_epsilon <= budget


def test_a_release_past_the_calibrated_count_or_of_a_released_position_is_refused():
    tuned, sent = [np.ones((2, 3), np.float32)], [np.zeros((2, 3), np.float32)]
    scalars = {"h-pre": 1.0, "h-post": 0.5}
    args = (scalars, 10, (8.0, 1e-5), 0.01, 2)
    first = private_upload(tuned, sent, *args, {}, ("run", 0, 0, 0))
    with pytest.raises(ReleaseRefused, match="stream position 0 was released before"):
        private_upload(tuned, sent, *args, first.state, ("run", 0, 0, 0))
    second = private_upload(tuned, sent, *args, first.state, ("run", 0, 0, 1))
    assert released_positions(second.state) == [0, 1]
    with pytest.raises(ReleaseRefused, match="released 2 uploads, the most its noise was calibrated for"):
        private_upload(tuned, sent, *args, second.state, ("run", 0, 0, 2))


# ----- seeded noise ----------------------------------------------------------------------------------------------
def _release(epsilon: float, tuned, sent, nonce: str = "run-a") -> tuple[np.ndarray, float]:
    out = private_upload(tuned, sent, {"h-pre": 1.0}, 10, (epsilon, 1e-5), 0.01, 16, {}, (nonce, 0, 0, 0))
    return flatten(out.blocks), float(out.metrics["dp-noise"])


def test_seeded_runs_at_two_epsilons_cannot_be_subtracted(monkeypatch):
    """With the same draws at every ε, r_a = u + σ_a n and r_b = u + σ_b n give n = (r_a - r_b)/(σ_a - σ_b), then
    the update u. Each draw depends on ε, so that estimate is noise."""
    monkeypatch.setenv(SEED_ENV, "fedrapp-" + "0123456789abcdef" * 2)
    rng = np.random.default_rng(0)
    sent = [rng.normal(size=(4, 512)).astype(np.float32)]
    update = rng.normal(size=(4, 512)).astype(np.float32)
    update *= 0.01 * math.sqrt(update.size) / np.linalg.norm(update)  # at the clip: released unscaled
    tuned = [sent[0] + update]
    (r_a, z_a), (r_b, z_b) = _release(4.0, tuned, sent), _release(8.0, tuned, sent)
    clip = 0.01 * math.sqrt(update.size)
    noise = (r_a - r_b) / ((z_a - z_b) * clip)
    recovered = r_a - flatten(sent) - z_a * clip * noise
    assert abs(np.corrcoef(recovered, update.ravel())[0, 1]) < 0.2
    # the control: the same ε twice (a resumed run) draws the same noise, which that attack would cancel exactly
    assert np.array_equal(_release(4.0, tuned, sent)[0], r_a)


def test_the_whole_secret_and_the_runs_nonce_seed_the_noise(monkeypatch):
    tuned, sent = [np.ones((2, 8), np.float32)], [np.zeros((2, 8), np.float32)]
    monkeypatch.setenv(SEED_ENV, "fedrapp-bench")
    bench = _release(8.0, tuned, sent)[0]
    monkeypatch.setenv(SEED_ENV, "fedrapp-" + "9" * 32)  # the same first 8 bytes
    assert not np.array_equal(_release(8.0, tuned, sent)[0], bench)
    monkeypatch.setenv(SEED_ENV, "fedrapp-bench")
    assert np.array_equal(_release(8.0, tuned, sent)[0], bench)
    assert not np.array_equal(_release(8.0, tuned, sent, nonce="run-b")[0], bench)  # two runs never share draws


def test_a_seeded_run_says_so_in_its_files(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv(SEED_ENV, "an experiment's secret")
    config = private_run(tiny, tmp_path, **{"num-rounds": 1})
    summary = run_server(CaptureGrid(client_app, 3, config), config)
    import json

    assert summary["noise_seeded"] is True and summary["privacy"]["noise_seeded"] == [0, 1, 2]
    assert json.loads((Path(summary["run_dir"]) / "config.json").read_text())["noise_seeded"] is True


# ----- non-finite values ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["tuned", "sent", "scalar"])
def test_a_non_finite_value_is_refused_before_any_release(where):
    tuned, sent = [np.ones((2, 3), np.float32)], [np.zeros((2, 3), np.float32)]
    scalars = {"h-pre": 1.0, "h-post": 0.5}
    if where == "tuned":
        tuned[0][1, 2] = np.nan
    elif where == "sent":
        sent[0][0, 0] = np.inf
    else:
        scalars["h-post"] = float("nan")
    with pytest.raises(NonFiniteUpload, match=where if where != "scalar" else "h-post"):
        private_upload(tuned, sent, scalars, 10, (8.0, 1e-5), 0.01, 4, {}, ("run", 0, 0, 0))


# ----- the experimenter's view: outcome files on other hosts -------------------------------------------------------
def test_the_report_merges_outcome_files_kept_on_another_host(tiny, tmp_path):
    import shutil

    from fedrapp_app.report.cli import main as report_main
    from fedrapp_app.report.runs import RunError, load_run

    config = private_run(tiny, tmp_path, **{"num-rounds": 2})
    summary = run_server(CaptureGrid(client_app, 3, config), config)
    run_dir = Path(summary["run_dir"])
    whole = load_run(run_dir)
    assert whole.rows and all("correct" in r for r in whole.rows if r["status"] == "ok") and not whole.notes
    # the clients ran on another host: their state folder is not in the run folder
    elsewhere = tmp_path / "node-state"
    shutil.move(run_dir / CLIENT_STATE_DIR, elsewhere)
    with pytest.raises(RunError, match="pass each with --outcomes DIR"):
        load_run(run_dir)
    merged = load_run(run_dir, [elsewhere])
    assert [r["correct"] for r in merged.rows] == [r["correct"] for r in whole.rows]
    assert report_main([str(run_dir), "--outcomes", str(elsewhere), "--out", str(tmp_path / "page")]) == 0
    assert report_main([str(run_dir), "--outcomes", str(tmp_path / "nowhere")]) == 2


def test_a_grid_draws_its_own_dp_secret_once_and_keeps_it_private(tmp_path, monkeypatch):
    import os
    import stat

    from fedrapp_app.bench.grid import DP_SECRET_FILE, _seeded_dp_noise, grid_secret

    monkeypatch.delenv(SEED_ENV, raising=False)
    secret = grid_secret(tmp_path / "a")
    assert len(secret) == 64 and grid_secret(tmp_path / "a") == secret != grid_secret(tmp_path / "b")
    assert stat.S_IMODE((tmp_path / "a" / DP_SECRET_FILE).stat().st_mode) == 0o600
    with _seeded_dp_noise(tmp_path / "a", private=True):
        assert os.environ[SEED_ENV] == secret
    assert SEED_ENV not in os.environ
    with _seeded_dp_noise(tmp_path / "c", private=False):  # no dp: nothing seeded, no secret drawn
        assert SEED_ENV not in os.environ and not (tmp_path / "c").exists()
    monkeypatch.setenv(SEED_ENV, "the user's")
    with _seeded_dp_noise(tmp_path / "a", private=True):
        assert os.environ[SEED_ENV] == "the user's"
