"""fedrapp-superexec on loopback, against real SuperLinks and SuperNodes (slow: Flower polls every 3 s).

- A probe app (written here, a few lines of Flower) whose ClientApp raises, kills itself or exits on
  command: each failure costs that message only, the worker is replaced after a crash within seconds (not
  after Flower's one-minute expiry), the node and its executor stay, and runs (or bundles) never share a
  worker's module state.
- The real FedRAPP app on one SuperLink and two SuperNodes (client ids from ``--node-config``): Flower's stock
  executor (a ``flwr-clientapp`` per message, as a Flower user deploys it) and the warm one give identical
  rounds.jsonl rows; a SuperNode whose state-dir is not writable fails its rounds with the ClientApp's message,
  the worker stays.

Every process is stopped by its process group when a test ends (``Loopback``), and found by its launch
mark if it escaped.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from flwr.common.constant import ErrorCode

from fedrapp_app.deploy.loopback import Loopback, descendants
from fedrapp_app.running.processes import stat_fields
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import comparable_rows, read_rows, small_run

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

PROBE_PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "warmprobe"
version = "1.0.0"
dependencies = ["flwr"]

[tool.flwr.app]
publisher = "fedrapptest"

[tool.flwr.app.components]
serverapp = "probe_server:app"
clientapp = "probe_client:app"

[tool.flwr.app.config]
rounds = 1
nodes = 2
out = ""
raise-at = ""
kill-at = ""
exit-at = ""
"""

PROBE_SERVER = '''
"""Sends one train message per node and round; writes every reply (or its error) to run_config['out']."""
import json
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    deadline = time.monotonic() + 120
    while len(list(grid.get_node_ids())) < int(config["nodes"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    nodes = sorted(grid.get_node_ids())
    rows = []
    for number in range(1, int(config["rounds"]) + 1):
        started = time.monotonic()
        messages = [
            Message(RecordDict({"c": ConfigRecord({"round": number})}), dst_node_id=node, message_type="train")
            for node in nodes
        ]
        for reply in grid.send_and_receive(messages, timeout=120):
            row = {"round": number, "seconds": time.monotonic() - started}
            if reply.has_error():
                row.update(error_code=reply.error.code, reason=reply.error.reason)
            else:
                row.update(dict(reply.content["m"]))
            rows.append(row)
    Path(str(config["out"])).write_text(json.dumps(rows))
'''

PROBE_CLIENT = '''
"""Counts its calls in module state and its rounds in context.state; fails on command (client:round)."""
import os
import signal
import sys

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

VERSION = {version}
CALLS = 0
app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    global CALLS
    CALLS += 1
    here = f"{{context.node_config['client-id']}}:{{msg.content['c']['round']}}"
    commands = context.run_config
    if here in str(commands["kill-at"]).split(","):
        os.kill(os.getpid(), signal.SIGKILL)
    if here in str(commands["raise-at"]).split(","):
        raise ValueError(f"probe raised at {{here}}")
    if here in str(commands["exit-at"]).split(","):
        sys.exit(3)
    count = int(context.state["probe"]["n"]) + 1 if "probe" in context.state else 1
    context.state["probe"] = ConfigRecord({{"n": count}})
    metrics = {{"client": int(context.node_config["client-id"]), "pid": os.getpid(), "calls": CALLS}}
    metrics.update(state=count, version=VERSION)
    return Message(RecordDict({{"m": MetricRecord(metrics)}}), reply_to=msg)
'''


def probe_app(folder: Path, version: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PROBE_PYPROJECT)
    (folder / "probe_server.py").write_text(PROBE_SERVER)
    (folder / "probe_client.py").write_text(PROBE_CLIENT.format(version=version))
    return folder


def probe_rows(fed: Loopback, app: Path, out: Path, **config) -> dict[tuple[int, int], dict]:
    """Run the probe app; its replies keyed by (round, client) (errors by (round, -1), (round, -2), ...)."""
    output, status, _ = fed.run(app, {"out": str(out), **config}, timeout=300)
    assert status["status"] == "finished:completed", output[-3000:]
    keyed: dict[tuple[int, int], dict] = {}
    for row in json.loads(out.read_text()):
        client = row.get("client", -1 - sum(1 for k in keyed if k[0] == row["round"] and k[1] < 0))
        keyed[(row["round"], client)] = row
    return keyed


def executor_pids(fed: Loopback) -> list[int]:
    return [p.pid for name, p in fed.processes.items() if name.startswith("executor") and p.poll() is None]


def test_failures_cost_one_message_and_runs_never_share_a_worker(tmp_path):
    app = probe_app(tmp_path / "probe")
    with Loopback(tmp_path / "fed", 2, "warm", executor_args=("--preload", "")) as fed:
        executors = executor_pids(fed)
        first = probe_rows(
            fed, app, tmp_path / "run1.json", rounds=4, **{"raise-at": "0:2", "kill-at": "1:2", "exit-at": "0:4"}
        )
        # Round 1: both clients served; round 2: client 0 raised, client 1's worker was killed mid-message.
        assert (first[(1, 0)]["calls"], first[(1, 1)]["calls"]) == (1, 1)
        errors = sorted((r["error_code"], r["reason"]) for k, r in first.items() if k[0] == 2)
        assert errors[0][0] == ErrorCode.CLIENT_APP_RAISED_EXCEPTION and "probe raised at 0:2" in errors[0][1]
        assert errors[1][0] == ErrorCode.CLIENT_APP_CRASHED and "SIGKILL" in errors[1][1]
        assert max(r["seconds"] for k, r in first.items() if k[0] == 2) < 30  # Flower's expiry alone: ~60 s
        # Round 3: client 0's worker survived its exception; client 1 has a new worker; node state goes on.
        assert first[(3, 0)]["pid"] == first[(1, 0)]["pid"] and first[(3, 0)]["calls"] == 3
        assert first[(3, 1)]["pid"] != first[(1, 1)]["pid"] and first[(3, 1)]["calls"] == 1
        assert (first[(3, 0)]["state"], first[(3, 1)]["state"]) == (2, 2)
        # Round 4: client 0's app called sys.exit: that message fails, the next run gets a new worker.
        assert any(r.get("error_code") == ErrorCode.CLIENT_APP_RAISED_EXCEPTION for k, r in first.items() if k[0] == 4)
        assert first[(4, 1)]["pid"] == first[(3, 1)]["pid"] and first[(4, 1)]["state"] == 3

        # A second run of the same bundle, then a changed bundle: fresh module state, the new code.
        second = probe_rows(fed, app, tmp_path / "run2.json", rounds=1)
        assert [second[(1, c)]["calls"] for c in (0, 1)] == [1, 1]
        assert {second[(1, c)]["pid"] for c in (0, 1)}.isdisjoint({r.get("pid") for r in first.values()})
        third = probe_rows(fed, probe_app(tmp_path / "probe2", version=2), tmp_path / "run3.json", rounds=1)
        assert [third[(1, c)]["version"] for c in (0, 1)] == [2, 2]
        assert [third[(1, c)]["calls"] for c in (0, 1)] == [1, 1]

        assert executor_pids(fed) == executors and all(p.poll() is None for p in fed.processes.values())
        stats = [json.loads(line) for line in fed.stats_path(1).read_text().splitlines()]
        crashed = [s for s in stats if "SIGKILL" in s["details"]]
        assert len(crashed) == 1 and crashed[0]["status"] == "failed"

        # The executor itself killed: its worker server and workers go too; a new executor serves the node.
        victim = fed.processes["executor0"]
        below = descendants(victim.pid)
        assert len(below) >= 2  # the worker server and run 3's worker
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in below) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in below)
        fed.start_executor(0)
        fourth = probe_rows(fed, app, tmp_path / "run4.json", rounds=1)
        assert [fourth[(1, c)]["calls"] for c in (0, 1)] == [1, 1]
    assert fed.stop() == []


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[:1] != ["Z"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny"), world.CLASSNAMES)


def _fedrapp_run(folder: Path, model: Path, executor: str, **node_settings) -> tuple[list[dict], Loopback]:
    config = small_run(model, folder / "out", **{"num-clients": 2, "num-rounds": 2, "node-wait-timeout": 120.0})
    with Loopback(folder / "fed", 2, executor, node_config=node_settings.get("node_config")) as fed:
        output, status, _ = fed.run(ROOT, config)
        assert status["status"] == "finished:completed", output[-3000:]
    return read_rows(folder / "out" / "run"), fed


def test_warm_and_stock_executors_give_identical_rounds(tiny_model, tmp_path):
    warm, fed = _fedrapp_run(tmp_path / "warm", tiny_model, "warm")
    started = time.monotonic()
    stock, stock_fed = _fedrapp_run(tmp_path / "stock", tiny_model, "stock")
    assert time.monotonic() - started < 300  # start, two rounds and stop of a stock deployment
    assert all(p.poll() is not None for p in stock_fed.processes.values())  # everything stopped with it
    assert len(warm) == 4 and all(r["status"] == "ok" for r in warm)
    assert {(r["round"], r["client"]) for r in stock} == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert all(r["status"] == "ok" for r in stock)
    assert comparable_rows(warm) == comparable_rows(stock)
    # Warm: each node's rounds were served by one process, which loaded the model before round 1 (query).
    for client in (0, 1):
        pids = {r["client_metrics"]["pid"] for r in warm if r["client"] == client}
        assert len(pids) == 1
        assert all(r["client_metrics"]["model-loaded"] == 0 for r in warm if r["client"] == client)
        stats = [json.loads(line) for line in fed.stats_path(client).read_text().splitlines()]
        assert [s["worker_tasks"] for s in stats] == [1, 2, 3] and {s["worker_pid"] for s in stats} == pids
    # Stock: a new process for every message.
    assert len({r["client_metrics"]["pid"] for r in stock}) == 4


def test_an_unwritable_state_dir_fails_that_nodes_rounds_with_its_message_and_the_worker_stays(tiny_model, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rows, fed = _fedrapp_run(
        tmp_path / "run", tiny_model, "warm", node_config={1: {"state-dir": str(blocker / "state")}}
    )
    bad = [r for r in rows if r["client"] == 1 or r["status"] != "ok"]
    assert bad and all(r["status"] == "failed" and "state-dir" in r["reason"] for r in bad)
    assert all(r["status"] == "ok" for r in rows if r not in bad)
    stats = [json.loads(line) for line in fed.stats_path(1).read_text().splitlines()]
    assert len({s["worker_pid"] for s in stats}) == 1 and all(s["status"] == "completed" for s in stats)
    assert sum("state-dir" in s["reply_error"] for s in stats) == len(bad)
