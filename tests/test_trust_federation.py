"""FedRAPP's trust option (ours, issue 15) through the whole app: the real ServerApp body, strategy and ClientApp
in-process on a tiny random CLIP, and (slow) through Flower's simulation engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import (
    comparable_rows,
    interrupt_after,
    permute_labels,
    read_rows,
    run_federation,
    run_in_flower_simulation,
    small_run,
)

#: FedRAPP's trust option, with a memory target low enough for the tiny model's few rounds to move the memory trust.
TRUST = {"trust": True, "trust-memory-target": 0.1}
#: What the option carries from round to round.
STATE = {"trust-memory", "trust-peers", "trust-memory-wins", "trust-memory-rounds", "probe"}


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


def test_reporting_the_own_prompt_changes_no_prompt_and_no_score(testbed_tiny, tmp_path):
    """report-own-prompt is for the analysis: the same prompts in every round, the same predictions."""
    base = small_run(testbed_tiny, tmp_path, **{"num-rounds": 3, "local-method": "im"})
    plain, plain_grid, _ = run_federation({**base, "run-name": "plain"})
    reported, reported_grid, _ = run_federation({**base, "run-name": "reported", "report-own-prompt": True})
    assert plain_grid.sent.keys() == reported_grid.sent.keys()
    assert all(np.array_equal(plain_grid.sent[k], reported_grid.sent[k]) for k in plain_grid.sent)
    assert plain["micro_accuracy"] == reported["micro_accuracy"]
    rows = read_rows(reported["run_dir"])
    assert all("h_own" not in r for r in rows if r["round"] == 1)  # no own prompt before the first round
    later = [r for r in rows if r["round"] > 1]
    assert later and all(r["h_own"] >= 0 and 0 <= r["acc_own"] <= 1 for r in later)
    assert all(0 <= r["v_pre"] <= 1 and 0 <= r["v_own"] <= 1 for r in later)  # the neighbour votes
    assert all("trust_memory" not in r for r in rows)  # the paper's rule: no trust


def test_the_trust_option_runs_and_scales_mu_and_gamma(testbed_tiny, tmp_path):
    summary, grid, _ = run_federation(small_run(testbed_tiny, tmp_path, **{"num-rounds": 4}, **TRUST))
    assert summary["status"] == "finished" and summary["complete"]
    rows = read_rows(summary["run_dir"])
    assert all(0.0 <= r["trust_memory"] <= 1.0 and 0.0 <= r["trust_peers"] <= 1.0 for r in rows)
    first = [r for r in rows if r["round"] == 1]  # no own prompt yet, no evidence: t = 0, u = 1
    assert first and all(r["trust_memory"] == 0.0 and r["trust_peers"] == 1.0 for r in first)
    assert all(r["mu"] <= r["trust_memory"] + 1e-12 and r["gamma"] <= 0.8 * r["trust_peers"] + 1e-12 for r in rows)
    moved = {(r["trust_memory"], r["trust_peers"]) for r in rows if r["round"] > 1}
    assert len(moved) > 1  # evidence arrived and moved the trusts


def test_a_resumed_trust_run_gives_the_same_results(testbed_tiny, tmp_path):
    """The trusts, the memory trust's counts and the probes are server state: checkpointed after every round and
    restored on resume."""
    base = small_run(testbed_tiny, tmp_path, **{"num-rounds": 4}, **TRUST)
    whole, whole_grid, _ = run_federation({**base, "run-name": "whole"})

    def carries_the_options_state(strategy) -> None:
        assert set(strategy.state.rule_state) == STATE

    cut = {**base, "run-name": "cut"}
    interrupt_after(cut, 2, carries_the_options_state)
    resumed, resumed_grid, _ = run_federation({**cut, "resume": True})
    assert resumed["resumed_after_round"] == 2
    assert comparable_rows(read_rows(whole["run_dir"])) == comparable_rows(read_rows(resumed["run_dir"]))
    assert all(np.array_equal(resumed_grid.sent[k], whole_grid.sent[k]) for k in resumed_grid.sent)
    assert all(np.array_equal(resumed_grid.probes[k], whole_grid.probes[k]) for k in resumed_grid.probes)


def test_labels_never_reach_a_trust(testbed_tiny, tmp_path, monkeypatch):
    """Permuting the labels of every stream changes the scores, not one prompt, one probe nor one trust."""
    config = small_run(testbed_tiny, tmp_path / "a", **{"num-rounds": 3}, **TRUST)
    base, grid_a, _ = run_federation(config)
    permute_labels(monkeypatch, len(world.CLASSNAMES), seed=3)
    other, grid_b, _ = run_federation({**config, "output-dir": str(tmp_path / "b")})
    assert all(np.array_equal(grid_a.sent[k], grid_b.sent[k]) for k in grid_a.sent)
    assert grid_a.probes.keys() == grid_b.probes.keys()
    assert all(np.array_equal(grid_a.probes[k], grid_b.probes[k]) for k in grid_a.probes)
    trusts = [[(r["trust_memory"], r["trust_peers"]) for r in read_rows(s["run_dir"])] for s in (base, other)]
    assert trusts[0] == trusts[1] and base["micro_accuracy"] != other["micro_accuracy"]
    assert len(set(trusts[0])) > 1  # the trusts moved: the evidence arrived


def test_the_probe_travels_to_the_clients_and_is_the_papers_prompt(testbed_tiny, tmp_path):
    """Round 1 sends P0 under both rules, so round 2's probes are exactly the prompts the paper's rule sends in
    round 2 (while the trusts, the memory trust from 0, send other prompts); every client scores its probe from
    round 2 on."""
    base = small_run(testbed_tiny, tmp_path, **{"num-rounds": 3, "local-method": "im"})
    _, paper, _ = run_federation({**base, "run-name": "paper"})
    summary, grid, _ = run_federation({**base, "run-name": "trust", **TRUST})
    assert not any(key[0] == 1 for key in grid.probes)  # no probe before the paper's rule has run once
    second = [key for key in grid.probes if key[0] == 2]
    assert second and all(np.array_equal(grid.probes[key], paper.sent[key]) for key in second)
    assert not all(np.array_equal(grid.sent[key], paper.sent[key]) for key in second)  # the trusts' prompts
    rows = [r for r in read_rows(summary["run_dir"]) if r["round"] > 1]
    assert rows and all(r["h_probe"] >= 0 and r["hm_probe"] >= 0 and 0 <= r["acc_probe"] <= 1 for r in rows)


@pytest.mark.slow
def test_the_trust_option_runs_in_flowers_simulation_engine(testbed_tiny, tmp_path):
    """Through Flower's Ray simulation engine: 3 SuperNodes, 3 rounds, the trusts move and reach the rows; the option
    sends the probe, so a train message carrying two prompts crosses the engine too."""
    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 3}, **TRUST)
    rows = read_rows(run_in_flower_simulation(config, num_supernodes=3)["run_dir"])
    assert len(rows) == 9 and all(r["status"] == "ok" for r in rows)
    assert all("h_own" in r and "h_probe" in r and "trust_memory" in r for r in rows if r["round"] > 1)
    assert all(r["trust_memory"] == 0.0 and r["trust_peers"] == 1.0 for r in rows if r["round"] == 1)
    assert any((r["trust_memory"], r["trust_peers"]) != (0.0, 1.0) for r in rows if r["round"] > 1)
