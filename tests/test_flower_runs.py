"""Runs through Flower itself: the simulation engine (``run_simulation``, ``flwr run`` via ``fedrapp-sim`` and
plain ``flwr run .``) and a Ray cluster of two nodes. Slow (Ray start, polling): marked ``slow``. A deployment of
one SuperLink and two SuperNodes on loopback: tests/test_deploy_executor_loopback.py, tests/test_guide.py.

Every process these tests start is stopped by its PID (process group) when the test ends.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from fedrapp_app.recording.phases import PHASES
from fedrapp_app.running.launch import (
    contained_env,
    free_port,
    run_status,
    toml_value,
)
from fedrapp_app.running.processes import LAUNCH_ID_ENV, describe_process, marked_pids, stop_marked
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import comparable_rows, read_rows, run_in_flower_simulation, small_run

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


def _as_overrides(config: dict) -> str:
    return " ".join(f"{k}={toml_value(v)}" for k, v in config.items())


def test_run_simulation_through_ray(testbed_tiny, tmp_path):
    """Flower's simulation engine (Ray) runs the ServerApp body and the ClientApp for 3 nodes, 2 rounds."""
    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 2})
    summary = run_in_flower_simulation(config, num_supernodes=3)
    assert summary["rounds"] == 2 and summary["samples"] == 2 * 3 * 16
    rows = read_rows(summary["run_dir"])
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)


def _fedrapp_sim(args: list[str], flwr_home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedrapp_app.running.launch", str(ROOT), "--flwr-home", str(flwr_home), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tempfile.gettempdir(),
    )


#: The rule and the method of examples/ (installed as the README's test command installs them), by their entry-point
#: names, with a parameter each.
PLUGINS = {"strategy": "mean-mix", "rule-params": "weight=0.3", "local-method": "confident-half"}


def test_flwr_run_via_launcher_completes_and_writes_results(testbed_tiny, tmp_path):
    """... with the example plugins, and accounts for the wall time it took, phase by phase (launch.json, the
    report, its last lines)."""
    config = small_run(testbed_tiny, tmp_path / "out", **{"num-rounds": 2}, **PLUGINS)
    began = time.time()
    done = _fedrapp_sim(["-c", _as_overrides(config)], tmp_path / "flwr-home")
    waited = time.time() - began
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "run" / "summary.json").read_text())
    assert summary["complete"] and summary["rounds"] == 2 and summary["samples"] == 96
    assert summary["config"]["strategy"] == "mean-mix"
    rows = read_rows(tmp_path / "out" / "run")
    assert all(r["status"] == "ok" and r["gamma"] > 0 for r in rows)  # mixed by the plugin rule
    assert all(r["client_metrics"]["stat-loss"] > 0 for r in rows)  # adapted by the plugin method
    assert "online accuracy micro" in done.stdout
    launch = json.loads((tmp_path / "out" / "run" / "launch.json").read_text())
    assert [p["phase"] for p in launch["phases"]] == list(PHASES)  # every phase, the server's on the same clock
    assert launch["seconds"] == pytest.approx(sum(p["seconds"] for p in launch["phases"]), abs=0.01)
    assert waited - 2.0 < launch["seconds"] <= waited + 0.1  # what the command took, but Python's exit
    rounds = next(p["seconds"] for p in launch["phases"] if p["phase"] == "rounds")
    assert rounds == pytest.approx(summary["seconds"] - summary["setup_seconds"], abs=0.01)
    assert f"{launch['seconds']:.1f} s wall: checks " in done.stdout
    assert "asking 3 SuperNode(s) for their client" in done.stdout and "3 of 3 SuperNode(s) answered" in done.stdout
    page = (tmp_path / "out" / "run" / "report" / "report.md").read_text()
    assert "### What the command waited for (fedrapp-sim)" in page and "| registration |" in page


def test_launcher_reports_a_failed_run_and_refuses_a_bad_config(testbed_tiny, tmp_path):
    broken = tmp_path / "broken-model"  # a CLIP checkpoint whose weights file is garbage: it passes the checks
    shutil.copytree(testbed_tiny, broken)  # (which look for the files, not inside them) and fails to load
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    bad_model = small_run(broken, tmp_path / "out", **{"node-wait-timeout": 60.0})
    failed = _fedrapp_sim(["-c", _as_overrides(bad_model)], tmp_path / "flwr-home")
    assert failed.returncode == 1, failed.stdout[-2000:]
    assert "the run failed: RuntimeError: no ClientApp could start; all 3 node(s) reported: SafetensorError" in (
        failed.stderr
    )
    assert "\x1b[" not in failed.stdout + failed.stderr  # no colour codes in redirected output
    summary = json.loads((tmp_path / "out" / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "SafetensorError" in summary["error"]
    refused = _fedrapp_sim(["-c", "dirichlet-alpha=-1.0"], tmp_path / "flwr-home")
    assert refused.returncode == 2 and "dirichlet-alpha" in refused.stderr


def _plain_flwr_run(overrides: dict, tmp_path: Path) -> dict:
    """`flwr run . --stream -c ...` as a Flower user types it (Flower's local SuperLink, its default 2 SuperNodes),
    in a Flower home of its own; every process it leaves is stopped. Returns the run's final status."""
    marker = "plain-" + uuid.uuid4().hex
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {**contained_env(tmp_path / "flwr-home"), LAUNCH_ID_ENV: marker}
    try:
        done = subprocess.run(
            ["flwr", "run", ".", "--stream", "-c", _as_overrides(overrides)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        status = run_status(env, tmp_path, "local")
    finally:
        stop_marked(marker)  # Flower leaves its local SuperLink running
    assert status["status"] == "finished:completed", done.stdout[-3000:] + done.stderr[-3000:]
    assert not marked_pids(marker)
    return status


def _resume_command(stderr: str) -> list[str]:
    """The command fedrapp-sim printed to continue an interrupted run, runnable from this test."""
    line = stderr.split("Continue it with:\n", 1)[1].splitlines()[0].strip()
    words = shlex.split(line)
    assert words[0] == "fedrapp-sim"
    return [sys.executable, "-m", "fedrapp_app.running.launch", *words[1:]]


def test_sigint_stops_every_process_of_the_run_and_the_resume_matches_an_uninterrupted_run(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path / "out", **{"num-rounds": 0, "testbed-samples": 480, "batch-size": 8})
    whole = _fedrapp_sim(["-c", _as_overrides({**config, "run-name": "whole"})], tmp_path / "flwr-home")
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-2000:]

    marker = "sigint-" + uuid.uuid4().hex
    args = [sys.executable, "-m", "fedrapp_app.running.launch", str(ROOT), "--flwr-home", str(tmp_path / "flwr-home")]
    args += ["-c", _as_overrides({**config, "run-name": "cut"})]
    # The launcher's scratch folder (the working directory of every process it starts) goes under a folder of the
    # test's own, so that a process whose environment lost the mark is found too (Ray's agents were seen with an
    # all-zero environment in some runs); Ray's folder stays where it was (its socket paths must stay short).
    scratch = Path(tempfile.mkdtemp(prefix="fedrapp-sigint-"))
    ray_tmp = os.environ.get("RAY_TMPDIR", str(Path(tempfile.gettempdir()) / f"fedrapp-ray-{os.getuid()}"))
    cut = subprocess.Popen(
        args,
        cwd=tempfile.gettempdir(),
        env={**os.environ, "FEDRAPP_TEST_MARK": marker, "TMPDIR": str(scratch), "RAY_TMPDIR": ray_tmp},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    rounds = tmp_path / "out" / "cut" / "rounds.jsonl"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and cut.poll() is None:
            if rounds.is_file() and len({json.loads(line)["round"] for line in rounds.read_text().splitlines()}) >= 2:
                break
            time.sleep(0.2)
        assert cut.poll() is None, "the run ended before it could be interrupted"
        second = subprocess.run(args, capture_output=True, text=True, timeout=60)  # a second writer
        assert second.returncode == 2 and "being written by PID" in second.stderr, second.stderr
        os.killpg(cut.pid, signal.SIGINT)  # Ctrl-C in a terminal signals the whole foreground group
        _, stderr = cut.communicate(timeout=60)
        exited = time.monotonic()  # the launcher stops every process before it exits (SIGKILL after its grace)
        while marked_pids(marker, "FEDRAPP_TEST_MARK", scratch) and time.monotonic() - exited < 15:
            time.sleep(0.5)
        left = [describe_process(pid) for pid in marked_pids(marker, "FEDRAPP_TEST_MARK", scratch)]
        assert not left, f"processes outlived the launcher's exit after Ctrl-C by 15 s: {left}; {stderr[-1500:]}"
    finally:
        if cut.poll() is None:
            os.killpg(cut.pid, signal.SIGKILL)
        stop_marked(marker, grace=1.0, variable="FEDRAPP_TEST_MARK", cwd=scratch)  # none left for the next tests
        shutil.rmtree(scratch, ignore_errors=True)
    assert cut.returncode == 130, stderr[-3000:]
    assert (tmp_path / "out" / "cut" / "summary.json").is_file(), stderr[-3000:]
    interrupted = json.loads((tmp_path / "out" / "cut" / "summary.json").read_text())
    assert interrupted["status"] == "interrupted" and interrupted["complete"] is False, (
        f"{interrupted.get('status')}: {interrupted.get('error')}; {stderr[-2000:]}"
    )

    resumed = subprocess.run(_resume_command(stderr), cwd=tempfile.gettempdir(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert comparable_rows(read_rows(tmp_path / "out" / "whole")) == comparable_rows(
        read_rows(tmp_path / "out" / "cut")
    )
    first = json.loads((tmp_path / "out" / "whole" / "summary.json").read_text())
    again = json.loads((tmp_path / "out" / "cut" / "summary.json").read_text())
    assert (again["micro_accuracy"], again["samples"], again["complete"]) == (
        first["micro_accuracy"],
        first["samples"],
        True,
    )


def test_simulation_on_an_existing_ray_cluster_places_clients_on_both_nodes(testbed_tiny, tmp_path):
    """A Ray head and a second Ray node on this machine; fedrapp-sim --ray-address runs the clients on both."""
    marker = "ray-cluster-" + uuid.uuid4().hex
    ray_tmp = tempfile.mkdtemp(prefix="fr-ray-")  # short: Ray's socket paths must fit in 107 bytes
    env = {**os.environ, "FEDRAPP_TEST_MARK": marker, "RAY_TMPDIR": ray_tmp}
    port = free_port()
    ray = [sys.executable, "-m", "ray.scripts.scripts", "start", "--num-cpus=1", "--disable-usage-stats"]
    try:
        # started in ray_tmp, which every process of the cluster inherits as its working directory: the stop
        # below finds by it what lost the mark (Ray's agents were seen with an all-zero environment)
        subprocess.run([*ray, "--head", f"--port={port}", "--include-dashboard=false"], env=env, check=True,
                       capture_output=True, timeout=120, cwd=ray_tmp)  # fmt: skip
        subprocess.run([*ray, f"--address=127.0.0.1:{port}"], env=env, check=True, capture_output=True, timeout=120,
                       cwd=ray_tmp)  # fmt: skip
        config = small_run(testbed_tiny, tmp_path / "out", **{"num-clients": 4, "testbed-samples": 256})
        done = _fedrapp_sim(["--ray-address", f"127.0.0.1:{port}", "-c", _as_overrides(config)], tmp_path / "flwr-home")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        rows = read_rows(tmp_path / "out" / "run")
        placed = {r["ray_node"] for r in rows if r["status"] == "ok"}
        assert len(placed) == 2, placed  # both Ray nodes served clients
        assert marked_pids(marker, "FEDRAPP_TEST_MARK"), "fedrapp-sim must not stop the user's Ray cluster"
    finally:
        stop_marked(marker, grace=5.0, variable="FEDRAPP_TEST_MARK", cwd=ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not marked_pids(marker, "FEDRAPP_TEST_MARK", ray_tmp)


def test_the_example_plugins_run_through_plain_flwr_run(testbed_tiny, tmp_path):
    """The example plugins through plain `flwr run .` as a Flower user types it (Flower's own SuperLink and its
    default 2 SuperNodes), whose run scores every sample of both streams (through fedrapp-sim:
    test_flwr_run_via_launcher_completes_and_writes_results)."""
    # Plain `flwr run` leaves num-clients to Flower's federation (its default 2 SuperNodes), streams to their end.
    plain = {k: v for k, v in small_run(testbed_tiny, tmp_path / "plain").items() if k != "num-clients"}
    _plain_flwr_run({**plain, "num-rounds": 0, **PLUGINS}, tmp_path / "plain-flower")
    summary = json.loads((tmp_path / "plain" / "run" / "summary.json").read_text())
    assert summary["complete"] and summary["num_clients"] == 2 and summary["samples"] == 240
    assert summary["config"]["local-method"] == "confident-half"


def test_several_seeds_run_in_turn_report_their_mean_and_resume_by_skipping_the_finished_ones(testbed_tiny, tmp_path):
    """fedrapp-sim --seeds 0,1: one run per seed in <name>-seed<s>, then one report over the seeds; the same command
    with resume=true finds both finished and only rewrites the report."""
    config = small_run(testbed_tiny, tmp_path / "out", **{"num-rounds": 1, "run-name": "exp"})
    done = _fedrapp_sim(["--seeds", "0,1", "-c", _as_overrides(config)], tmp_path / "flwr-home")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for seed in (0, 1):
        summary = json.loads((tmp_path / "out" / f"exp-seed{seed}" / "summary.json").read_text())
        assert summary["config"]["seed"] == seed and summary["rounds"] == 1
    seeds = json.loads((tmp_path / "out" / "exp-seeds" / "seeds.json").read_text())
    assert [s["seed"] for s in seeds["seeds"]] == [0, 1] and seeds["over_seeds"]["micro_accuracy"]["seeds"] == 2
    page = (tmp_path / "out" / "exp-seeds" / "report.md").read_text()
    assert ": 2 seeds (0, 1)" in page and "| mean ± std [95% interval] |" in page
    again = _fedrapp_sim(["--seeds", "0,1", "-c", _as_overrides({**config, "resume": True})], tmp_path / "flwr-home")
    assert again.returncode == 0 and again.stdout.count("already finished") == 2, again.stdout[-2000:]
