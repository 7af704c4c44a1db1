"""Runs through Flower itself: the simulation engine (``run_simulation`` and ``flwr run`` via ``fedrapp-sim``)
and a deployment of one SuperLink and two SuperNodes on loopback. Slow (Ray start, polling): marked ``slow``.

Every process these tests start is stopped by its PID (process group) when the test ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedrapp_app.client import app as real_client_app
from fedrapp_app.launch import (
    contained_env,
    free_port,
    run_status,
    stop_process_group,
    toml_value,
    wait_healthy,
    write_connection,
)
from fedrapp_app.server import run_server
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import read_rows, small_run

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


def _as_overrides(config: dict) -> str:
    return " ".join(f"{k}={toml_value(v)}" for k, v in config.items())


def test_run_simulation_through_ray(testbed_tiny, tmp_path):
    """Flower's simulation engine (Ray) runs the ServerApp body and the ClientApp for 3 nodes, 2 rounds."""
    from flwr.simulation import run_simulation

    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 2})
    captured = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:  # run_simulation leaves context.run_config empty
        captured["summary"] = run_server(grid, config)

    client = ClientApp()

    def with_config(context: Context) -> Context:  # same node and state; the run config run_simulation lacks
        return Context(context.run_id, context.node_id, context.node_config, context.state, dict(config))

    @client.query()
    def query(msg, context):
        return real_client_app(msg, with_config(context))

    @client.train()
    def train(msg, context):
        return real_client_app(msg, with_config(context))

    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=3,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "include_dashboard": False},
        },
    )
    summary = captured["summary"]
    assert summary["rounds"] == 2 and summary["samples"] == 2 * 3 * 16
    rows = read_rows(summary["run_dir"])
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)


def _fedrapp_sim(args: list[str], flwr_home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedrapp_app.launch", str(ROOT), "--flwr-home", str(flwr_home), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tempfile.gettempdir(),
    )


def test_flwr_run_via_launcher_completes_and_writes_results(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path / "out", **{"num-rounds": 2})
    done = _fedrapp_sim(["-c", _as_overrides(config)], tmp_path / "flwr-home")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "run" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["samples"] == 96
    assert "online accuracy micro" in done.stdout


def test_launcher_reports_a_failed_run_and_refuses_a_bad_config(testbed_tiny, tmp_path):
    bad_model = small_run(tmp_path / "no-such-model", tmp_path / "out", **{"node-wait-timeout": 60.0})
    failed = _fedrapp_sim(["-c", _as_overrides(bad_model)], tmp_path / "flwr-home")
    assert failed.returncode == 1, failed.stdout[-2000:]
    assert "failed" in failed.stderr
    refused = _fedrapp_sim(["-c", "dirichlet-alpha=-1.0"], tmp_path / "flwr-home")
    assert refused.returncode == 2 and "dirichlet-alpha" in refused.stderr


def test_deployment_on_loopback(testbed_tiny, tmp_path):
    """One SuperLink and two SuperNodes (client ids from --node-config) run two rounds, then all stop."""
    env = contained_env(tmp_path / "flwr-home")
    link_port = free_port()
    neutral = tmp_path / "cwd"
    neutral.mkdir()
    processes = []

    def start(command: list[str]) -> subprocess.Popen:
        log = open(tmp_path / f"proc{len(processes)}.log", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            command, cwd=neutral, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        processes.append(process)
        return process

    try:
        link = start(
            [
                "flower-superlink",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
            ]
        )
        wait_healthy(link_port, link)
        for client in (0, 1):
            start(
                [
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"client-id={client}",
                ]
            )
        write_connection(env, "loopback", f"127.0.0.1:{link_port}")
        config = small_run(
            testbed_tiny, tmp_path / "out", **{"num-clients": 2, "num-rounds": 2, "node-wait-timeout": 120.0}
        )
        started = time.monotonic()
        done = subprocess.run(
            ["flwr", "run", str(ROOT), "loopback", "--stream", "-c", _as_overrides(config)],
            cwd=neutral,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        status = run_status(env, neutral, "loopback")
        assert status["status"] == "finished:completed", done.stdout[-3000:] + done.stderr[-3000:]
        rows = read_rows(tmp_path / "out" / "run")
        assert {(r["round"], r["client"]) for r in rows} == {(1, 0), (1, 1), (2, 0), (2, 1)}
        assert all(r["status"] == "ok" for r in rows)
        assert time.monotonic() - started < 300
    finally:
        for process in reversed(processes):
            stop_process_group(process)
    assert all(p.poll() is not None for p in processes)
