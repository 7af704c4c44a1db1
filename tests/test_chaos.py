"""Node restarts as Flower's SuperLink shows them, in-process (fast): the chaos scenarios' server-side logic.

A SuperNode killed with SIGKILL stays listed as connected until the SuperLink misses two of its 30 s
heartbeats; restarted before that (without authentication) it comes back at once under a new node id. The
loopback versions of these scenarios are in ``test_chaos_loopback.py`` and ``benchmarks/chaos.py``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedrapp_app.running.launch import run_status
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import SpyGrid, comparable_rows, read_rows, run_federation, small_run

OLD, NEW = 1001, 1003  # client 1's node before and after its restart


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


class RestartInsideTheHeartbeatWindow(SpyGrid):
    """Client 1's node (``OLD``) dies after round ``dies_after``; its SuperNode restarts at once as ``NEW``
    (empty context, same node config), while the SuperLink keeps listing ``OLD`` as connected for
    ``window`` more rounds (messages to it are never answered: with a short round-timeout they come back
    missing)."""

    dies_after = 1
    window = 2

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.round = 0
        self.drop = lambda m: m.metadata.dst_node_id == OLD and m.metadata.message_type == "train" and self.dead

    @property
    def dead(self) -> bool:
        return self.round > self.dies_after

    def push_messages(self, messages):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            self.round = int(messages[0].metadata.group_id)
        return super().push_messages(messages)

    def get_node_ids(self):
        if self.round >= self.dies_after and NEW not in self.contexts:  # the restarted SuperNode registers
            old = self.contexts[OLD]
            self.contexts[NEW] = Context(
                run_id=old.run_id,
                node_id=NEW,
                node_config=dict(old.node_config),
                state=RecordDict(),
                run_config=dict(old.run_config),
            )
        listed = list(self.contexts)
        if self.round >= self.dies_after + self.window:  # the SuperLink noticed the missed heartbeats
            listed.remove(OLD)
        return listed


@pytest.mark.slow  # two small federations in-process: about 15 s of CPU
def test_a_node_restarted_inside_the_heartbeat_window_is_served_once_its_old_id_is_gone(testbed_tiny, tmp_path):
    config = small_run(
        testbed_tiny,
        tmp_path,
        **{"num-clients": 2, "num-rounds": 0, "strategy": "none-fed", "testbed-samples": 96, "partition": "iid"},
    )
    whole, _, _ = run_federation({**config, "run-name": "whole"})
    summary, grid, _ = run_federation({**config, "run-name": "chaos"}, grid_cls=RestartInsideTheHeartbeatWindow)

    rows = read_rows(summary["run_dir"])
    victim = [r for r in rows if r["client"] == 1]
    # Refused while its old id is listed (rounds 2-3 go to the dead node: missing), served from round 4 on.
    assert [r["status"] for r in victim[:4]] == ["ok", "missing", "missing", "ok"]
    assert {r["node"] for r in victim[3:]} == {NEW}
    # Every sample scored exactly once: the run is complete and each stream position was scored once.
    assert summary["complete"] and summary["unscored"] == {}
    assert summary["per_client_samples"] == whole["per_client_samples"]
    positions = [r["client_metrics"]["stream-position"] for r in victim if r["status"] == "ok"]
    assert positions == list(range(len(positions)))
    # none-fed: a client's prompt depends on its own rounds only, so each (client, position) is scored exactly
    # as in the uninterrupted run; only the round number moves for the victim.
    assert _by_position(rows) == _by_position(read_rows(whole["run_dir"]))
    assert grid.contexts[NEW].state  # the restarted node's context went on (from the snapshot on disk)


class EveryNodeRestarts(SpyGrid):
    """Every SuperNode is stopped with SIGTERM in round ``stop_round`` (they leave the SuperLink at once; that
    round's messages are never answered) and, unless ``down_seconds`` is None, starts again that many seconds
    later with new node ids and empty contexts."""

    stop_round = 2
    down_seconds: float | None = 2.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gone: set[int] = set()
        self.back_at: float | None = None
        self.drop = lambda m: m.metadata.dst_node_id in self.gone

    def push_messages(self, messages):
        messages = list(messages)
        if messages and messages[0].metadata.group_id == str(self.stop_round) and not self.gone:
            self.gone = set(self.contexts)
            self.back_at = None if self.down_seconds is None else time.monotonic() + self.down_seconds
        return super().push_messages(messages)

    def get_node_ids(self):
        if self.back_at is not None and time.monotonic() >= self.back_at:
            self.back_at = None
            for node in sorted(self.gone):
                old = self.contexts[node]
                self.contexts[node + 100] = Context(
                    run_id=old.run_id,
                    node_id=node + 100,
                    node_config=dict(old.node_config),
                    state=RecordDict(),
                    run_config=dict(old.run_config),
                )
        return [n for n in self.contexts if n not in self.gone]


@pytest.mark.slow  # two small federations in-process: about 15 s of CPU
def test_a_run_waits_for_its_restarting_nodes_instead_of_stopping(testbed_tiny, tmp_path):
    """Before, every round to the vanished nodes ended at once, and after three of them the run stopped with
    most samples unscored, although the nodes were back two seconds later."""
    config = small_run(testbed_tiny, tmp_path, **{"num-clients": 2, "num-rounds": 0, "testbed-samples": 96})
    whole, _, _ = run_federation({**config, "partition": "iid", "run-name": "whole"})
    started = time.monotonic()
    summary, _, _ = run_federation({**config, "partition": "iid", "run-name": "chaos"}, grid_cls=EveryNodeRestarts)
    assert time.monotonic() - started < 60

    rows = read_rows(summary["run_dir"])
    assert [r["status"] for r in rows if r["round"] == 2] == ["missing", "missing"]
    assert all(r["status"] == "ok" and r["node"] >= 1100 for r in rows if r["round"] > 2)
    assert summary["complete"] and summary["per_client_samples"] == whole["per_client_samples"]
    # Everybody missed the same round, so the rule skipped it: FedRAPP's rows are the uninterrupted run's,
    # one round later, field by field.
    assert _by_position(rows) == _by_position(read_rows(whole["run_dir"]))


def test_a_run_whose_nodes_never_come_back_stops_after_node_wait_timeout(tmp_path, testbed_tiny):
    class NeverBack(EveryNodeRestarts):
        down_seconds = None

    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 0, "node-wait-timeout": 3.0})
    started = time.monotonic()
    summary, _, _ = run_federation(config, grid_cls=NeverBack)
    assert time.monotonic() - started < 3.0 + 20  # one wait of node-wait-timeout, not one per round
    assert summary["stopped"].startswith("no valid reply for 3 rounds") and not summary["complete"]
    reasons = [r["reason"] for r in read_rows(summary["run_dir"]) if r["round"] > 2]
    assert reasons and all("was not connected (stopped or restarting)" in why for why in reasons)


def _by_position(rows: list[dict]) -> dict[tuple[int, int], dict]:
    """Scored rows keyed by (client, stream position), without the round number."""
    out = {}
    for row in comparable_rows([r for r in rows if r["status"] == "ok"]):
        out[(row.pop("client"), row["client_metrics"]["stream-position"])] = {**row, "round": None}
    return out


def test_the_run_status_is_the_newest_runs_or_the_one_asked_for(tmp_path, monkeypatch):
    """``flwr list`` lists the newest run first: a SuperLink that ran several runs (a resume after a restart)
    must report the newest one's status, not the first one's."""
    runs = [
        {"run-id": "7", "status": "finished:completed", "pending-at": "2026-11-30 22:48:40Z"},
        {"run-id": "9", "status": "finished:failed", "pending-at": "2026-11-30 22:47:27Z"},
    ]
    calls = []

    def fake_flwr(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps({"runs": runs}), stderr="")

    monkeypatch.setattr(subprocess, "run", fake_flwr)
    assert run_status({}, tmp_path, "loopback")["run-id"] == "7"
    runs.reverse()  # whatever the order, the newest by pending time
    assert run_status({}, tmp_path, "loopback")["run-id"] == "7"
    run_status({}, tmp_path, "loopback", run_id=9)
    assert calls[-1][-2:] == ["--run-id", "9"]
