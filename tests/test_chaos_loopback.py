"""Chaos on loopback (slow, about 3 minutes): a SuperNode killed with SIGKILL or stopped with SIGTERM in the
middle of a round and started again, and the SuperLink killed with its process group and started again on its
database with the run resumed (``extended``: the default suite runs the harder case, the SuperLink's PID killed
alone while its ServerApp lives on, in tests/test_superlink_crash.py). Each run must end, score every sample
exactly once, and match an uninterrupted run of the same config as far as the scenario allows
(docs/results/chaos.md).

The scenarios are ``benchmarks/chaos.py``'s; the long one (a node restarted only after the SuperLink's
heartbeat window, about a minute of stall) runs only there. Here ``round-timeout`` bounds the stall.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import chaos  # noqa: E402

pytestmark = pytest.mark.slow
AT_ROUND = 2


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny"), world.CLASSNAMES)


def _accounted(report: dict) -> None:
    """The run ended on its own, every stream position of every client was scored exactly once, nothing
    was left behind."""
    assert report["run_statuses"][-1] == "finished:completed", report["events"]
    assert report["stopped"] == "streams ended" and report["complete"] and report["unscored"] == {}
    assert report["exactly_once"] and report["samples"] == report["baseline_samples"]
    assert report["leftover_processes"] == []


def test_a_node_killed_mid_round_and_restarted_at_once_is_served_again_and_nothing_is_lost(tiny_model, tmp_path):
    # none-fed: a client's rounds depend on its own prompt only, so every scored batch matches the uninterrupted
    # run field by field; only the victim's round numbers move.
    report = chaos.run_scenario(
        "kill-fast", tmp_path, tiny_model, strategy="none-fed", round_timeout=15.0, at_round=AT_ROUND, batches=4
    )
    _accounted(report)
    assert report["prefix_identical"]
    assert report["positions_identical"] == "8/8"
    assert report["statuses"]["missing"] >= 1 and report["node_ids"] == {0: 1, 1: 2}  # a new node id
    # The dead node's round waits round-timeout (15 s), not the SuperLink's heartbeat window (about 60 s).
    assert report["stall_seconds"] < 15.0 + 8.0
    assert report["victim_back"]["rebuilt"] == 0  # it went on from its snapshot


def test_a_node_stopped_with_sigterm_and_restarted_costs_one_round_and_nothing_is_lost(tiny_model, tmp_path):
    report = chaos.run_scenario("sigterm", tmp_path, tiny_model, at_round=AT_ROUND, batches=4)
    _accounted(report)
    # A stopped SuperNode tells the SuperLink: its round is answered "Node Unavailable" at once.
    assert report["cut_round_victim"].startswith("missing") and "Node Unavailable" in report["cut_round_victim"]
    assert report["stall_seconds"] < 10.0
    # FedRAPP: the rounds before match; in the cut round the others scored exactly as uninterrupted (same
    # prompts received), and only the rule's outputs moved (it aggregated without the victim).
    assert report["prefix_identical"] and report["cut_round_survivors_scored_alike"]
    assert not report["identical"]
    assert report["victim_back"] == {"round": report["victim_back"]["round"], "position": AT_ROUND - 1, "rebuilt": 0}


@pytest.mark.extended  # its path runs by default in tests/test_superlink_crash.py: the harder case, the same checks
def test_a_killed_superlink_restarted_on_its_database_resumes_the_run_identically(tiny_model, tmp_path):
    report = chaos.run_scenario("superlink", tmp_path, tiny_model, at_round=AT_ROUND, batches=4)
    _accounted(report)
    assert report["resumed_after_round"] == AT_ROUND - 1  # the cut round is run again entirely
    assert report["identical"]  # every row, field by field (FedRAPP), as the README promises
    assert report["run_statuses"][0] != "finished:completed"  # the killed run never completed
