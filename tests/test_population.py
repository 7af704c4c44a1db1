"""Populations (ours, issue 26): late joiners, held-out clients and the drop rate."""

from __future__ import annotations

import numpy as np
import pytest

from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.federation.population import Population
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import comparable_rows, interrupt_after, read_rows, run_federation, small_run


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory):
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_population"), world.CLASSNAMES)


def test_who_is_late_held_out_and_dropped():
    pop = Population(6, late_clients=2, late_round=3, held_out_clients=1, held_out_every=2, drop_rate=0.3, seed=4)
    assert [pop.held_out(c) for c in range(6)] == [False] * 5 + [True]
    assert [pop.late(c) for c in range(6)] == [False, False, False, True, True, False]
    assert [pop.member(c, 2) for c in range(6)] == [True, True, True, False, False, False]
    assert [pop.member(c, 3) for c in range(6)] == [True] * 5 + [False]
    assert [pop.visits(5, r) for r in range(1, 7)] == [False, True, False, True, False, True]
    assert np.array_equal(pop.dropped(7), pop.dropped(7)) and pop.dropped(7).shape == (6,)
    rate = np.mean([Population(50, drop_rate=0.3).dropped(r) for r in range(1, 200)])
    assert 0.27 < rate < 0.33
    assert not Population(6).dropped(3).any() and Population(6).is_default
    with pytest.raises(ValueError, match="leave no client"):
        Population(4, late_clients=2, held_out_clients=2)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"num-clients": 4, "late-clients": 3, "held-out-clients": 1}, "late-clients"),
        ({"drop-rate": 1.0}, "drop-rate"),
        ({"drop-rate": -0.1}, "drop-rate"),
        ({"late-round": 1}, "late-round"),
        ({"held-out-every": 0}, "held-out-every"),
    ],
)
def test_a_population_that_cannot_run_is_refused_before_the_start(overrides, key):
    with pytest.raises(ConfigError, match=key):
        RunConfig.from_run_config(overrides)


@pytest.mark.parametrize("strategy", ["fedrapp", "fedavg", "none-fed"])
def test_a_late_joiners_first_prompt_is_what_the_docs_say(testbed_tiny, tmp_path, strategy):
    """FedRAPP (newcomer = memory-mean): the mean of the memories of the clients that took part; FedAvg
    (newcomer = sent): the global prompt it sends everyone; none-fed: P0, nothing from the others."""
    config = small_run(testbed_tiny, tmp_path, strategy=strategy, **{"num-clients": 4, "late-clients": 1,
                       "late-round": 3, "num-rounds": 4})  # fmt: skip
    _, grid, states = run_federation(config)
    rows = read_rows(tmp_path / "run")
    assert {r["round"] for r in rows if r["client"] == 3 and r["status"] == "ok"} == {3, 4}  # joins in round 3
    waiting = [r for r in rows if r["client"] == 3 and r["status"] != "ok"]  # a row in every round before, saying so
    assert [(r["round"], r["status"], r["reason"]) for r in waiting] == [(1, "late", "joins in round 3"),
                                                                          (2, "late", "joins in round 3")]  # fmt: skip
    assert all("acc" not in r and "num_examples" not in r for r in waiting)
    first = grid.sent[(3, _node_of(grid, 3))]
    memory, sent = states[2]
    expected = memory[:3].astype(np.float64).mean(axis=0).astype(np.float32) if strategy == "fedrapp" else sent[3]
    assert np.array_equal(first, expected)
    p0 = grid.sent[(1, _node_of(grid, 0))]
    if strategy == "none-fed":
        assert np.array_equal(first, p0)
    else:
        assert not np.allclose(first, p0)  # the federation's knowledge, not the initial prompt
    if strategy == "fedrapp":
        assert np.isfinite(states[4][0]).all()


def _node_of(grid, client: int) -> int:
    return next(m.metadata.dst_node_id for m in grid.messages
                if m.metadata.message_type == "train" and int(m.content["config"]["client-id"]) == client)  # fmt: skip


def test_a_held_out_client_is_scored_but_never_read_by_the_rule(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path, **{"num-clients": 4, "held-out-clients": 1, "held-out-every": 2,
                       "num-rounds": 4})  # fmt: skip
    summary, grid, states = run_federation(config)
    rows = read_rows(tmp_path / "run")
    held = [r for r in rows if r["client"] == 3 and r["status"] == "ok"]
    assert [r["round"] for r in held] == [2, 4] and all(r["held_out"] for r in held)
    assert [r["round"] for r in rows if r["client"] == 3 and r["status"] == "not-due"] == [1, 3]
    assert all(3 not in map(int, r.get("peer_weights", {})) for r in rows)  # never a peer of anyone
    p0 = grid.sent[(1, _node_of(grid, 0))]
    for rnd in (1, 2, 3, 4):
        assert np.array_equal(states[rnd][0][3], p0)  # its memory never moves: its uploads never reach the rule
    for rnd in (2, 4):  # each visit: the mean of the participants' memories after the round before
        received = grid.sent[(rnd, _node_of(grid, 3))]
        expected = states[rnd - 1][0][:3].astype(np.float64).mean(axis=0).astype(np.float32)
        assert np.array_equal(received, expected)
    n = sum(r["num_examples"] for r in held)
    assert summary["held_out_samples"] == n
    assert summary["held_out_accuracy"] == pytest.approx(sum(r["correct"] for r in held) / n)


def test_with_a_drop_rate_every_sample_is_scored_once_and_a_resumed_run_drops_the_same(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path / "straight", **{"drop-rate": 0.4, "num-rounds": 0})
    summary, _, _ = run_federation(config)
    everyone = read_rows(tmp_path / "straight" / "run")
    rows = [r for r in everyone if r["status"] != "dropped"]
    per_round = {}
    for r in rows:
        per_round.setdefault(r["round"], set()).add(r["client"])
    assert any(len(clients) < 3 for clients in per_round.values())  # some rounds lost a client
    dropped = [r for r in everyone if r["status"] == "dropped"]
    assert dropped and all(r["reason"] == "absent from this round (drop-rate 0.4)" for r in dropped)
    for t in {r["round"] for r in dropped}:  # a dropped client has a row in its round, beside the others'
        assert len([r for r in everyone if r["round"] == t]) == len({r["client"] for r in everyone if r["round"] >= t})
    assert summary["complete"] and not summary["unscored"]  # the streams went on later: every sample scored
    assert len({(r["client"], r["client_metrics"]["stream-position"]) for r in rows}) == len(rows)  # once each

    resumed = small_run(testbed_tiny, tmp_path / "resumed", **{"drop-rate": 0.4, "num-rounds": 0})
    interrupt_after(resumed, 2)
    run_federation({**resumed, "resume": True})
    assert comparable_rows(read_rows(tmp_path / "resumed" / "run")) == comparable_rows(everyone)


def test_the_progress_line_counts_every_client_of_the_round_by_status():
    from fedrapp_app.recording.results import progress_counts

    rows = [{"status": s} for s in ("ok", "ok", "ok", "ok", "ok", "ok", "dropped", "late")]
    assert progress_counts(rows) == "6 of 8 ok, 1 dropped, 1 not yet joined"
    assert progress_counts([{"status": "dropped"}] * 2) == "0 of 2 ok, 2 dropped"  # not "0/0 clients ok"
