"""Cells run outside the runner's process: in local worker processes (each on a GPU of its own) and as Ray tasks on
a cluster of two Ray nodes that the slow test starts on this machine (as tests/test_flower_runs.py does).

A spawned worker process imports the module of its task, so this module imports nothing heavy at its top: the
worker tasks below run no cell and start in about a second. Every process a test starts is stopped by it (the Ray
nodes by their mark: ``fedrapp_app.running.processes``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from test_bench import fake_result

from fedrapp_app.bench import BenchRunner, parse_bench, read_rows
from fedrapp_app.bench import grid as grid_module
from fedrapp_app.running.launch import free_port
from fedrapp_app.running.processes import marked_pids, stop_marked

MARK = "FEDRAPP_TEST_MARK"
NODE2_MARK = "FEDRAPP_TEST_NODE2"


# ------------------------------------------------------------------------------------------ local workers
def report_where(overrides, cell_id, runs_dir):
    """A worker task that runs no cell: where it ran (PID, CUDA_VISIBLE_DEVICES), after a sleep long enough for
    both workers of a pool to take cells."""
    time.sleep(0.5)
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


def die_once_for_fedavg(overrides, cell_id, runs_dir):
    """A worker task that runs no cell; its process dies (as when killed, or out of memory) the first time it is
    given the fedavg cell."""
    marker = Path(runs_dir) / f"{cell_id}.died"
    if overrides["strategy"] == "fedavg" and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("")
        os._exit(3)
    return fake_result(0.1)


def test_local_worker_processes_see_distinct_gpus(tmp_path):
    """Two spawned workers on a host with GPUs "3" and "5" (faked): each process has one of them, a different one."""
    executor = grid_module.LocalExecutor(2, tmp_path, gpus=["3", "5"], task=report_where)
    seen = []
    try:
        for batch in range(2):
            for i in range(2):
                executor.submit(grid_module.Cell({}, f"k{batch}{i}"))
            while len(seen) < 2 * (batch + 1):
                seen += [outcome.result for outcome in executor.poll(60)]
    finally:
        executor.close()
    pids, gpus = {pid for pid, _ in seen}, {gpu for _, gpu in seen}
    assert len(set(seen)) == len(pids) == 2 and gpus == {"3", "5"}  # two processes, one GPU each, distinct


def test_a_dead_worker_loses_its_cell_which_runs_again_in_a_new_worker(tmp_path):
    spec = parse_bench({"name": "w", "base": {"num-clients": 2},
                        "grids": {"g": {"axes": {"strategy": ["none-fed", "fedavg", "fedrapp"]}}}})  # fmt: skip
    runner = BenchRunner(spec, tmp_path / "bench")
    executor = grid_module.LocalExecutor(2, runner.runs_dir, gpus=["0", "1"], task=die_once_for_fedavg)
    runner.run(progress=False, executor=executor)
    rows = read_rows(runner.bench_dir, failed=True)
    assert (runner.runs_dir / f"{spec.cells[1].id}.died").is_file()  # the worker did die under the fedavg cell
    assert sorted(r["config"]["strategy"] for r in rows) == ["fedavg", "fedrapp", "none-fed"]  # one row each
    assert [r["status"] for r in rows] == ["ok"] * 3 and not runner.failures
    assert {r["cuda_visible_devices"] for r in rows} <= {"0", "1"}  # set in the worker, recorded in the row


# ------------------------------------------------------------------------------------ a two-node Ray cluster
def tiny_grid(model: Path, out: Path) -> dict:
    """Two short cells (2 rounds), then two long ones (64 rounds), FedRAPP on 2 clients of the tiny model."""
    return {
        "name": "tiny-ray",
        "output": str(out),
        "base": {
            "model": str(model),
            "strategy": "fedrapp",
            "num-clients": 2,
            "batch-size": 16,
            "adaprompt-threshold": 0.0,
            "adaprompt-buffer-size": 16,
            "decode-workers": 0,
            "partition": "iid",
            "testbed-domains": "blur:1,contrast:1",
        },
        "grids": {
            "main": {
                "compare": ["testbed-samples"],
                "axes": {"testbed-samples": [64, 2048], "seed": [0, 1]},
            }
        },
    }


def comparable(row: dict) -> dict:
    """A row without what differs between two runs of the same cell: timings, where it ran, its run folder and the
    resume flag (a lost cell continues from its checkpoint), provenance."""
    where = ("seconds", "finished", "run_dir", "git", "bench_git", "host", "ray_node", "cuda_visible_devices")
    row = {k: v for k, v in row.items() if k not in where}
    row["full_config"] = {k: v for k, v in row["full_config"].items() if k not in ("output-dir", "resume")}
    return row


def wait_for(condition: Callable[[], bool], timeout: float, what: str, driver: subprocess.Popen, log: Path) -> None:
    """Until ``condition()``; an AssertionError with the driver's output when it does not come in ``timeout``
    seconds or the driver has exited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or driver.poll() is not None:
            tail = log.read_text()[-3000:] if log.exists() else ""
            raise AssertionError(f"no {what} ({time.monotonic() - deadline + timeout:.0f} s); driver output:\n{tail}")
        time.sleep(0.2)


def running_on(run_dir: Path) -> str | None:
    """The Ray node of a cell that has finished a round (the first row of its ``rounds.jsonl``), else None."""
    rounds = run_dir / "rounds.jsonl"
    lines = rounds.read_text().splitlines() if rounds.is_file() else []
    return json.loads(lines[0])["ray_node"] if lines and lines[0].endswith("}") else None


@pytest.mark.slow
def test_a_grid_on_a_two_node_ray_cluster_loses_no_cell_with_a_node_or_the_driver_and_matches_the_in_process_rows(
    tmp_path,
):
    """A Ray head and a second Ray node on this machine, one (logical) GPU each, cells asking for one GPU: the two
    short cells run at once, one on each node, then one long cell on each. Node 2 is killed (SIGKILL, all its
    processes) while the long cells run: its cell is lost and run again on the head; the driver is killed (SIGKILL)
    after the third row; the same command then completes the grid. No finished row changes, every cell has one
    row, and the rows are those of the in-process runner."""
    from fedrapp_app.testbed import world
    from fedrapp_app.testbed.tiny import make_tiny_clip

    model = make_tiny_clip(tmp_path / "model", world.CLASSNAMES)
    source = tiny_grid(model, tmp_path / "ray")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(source, sort_keys=False))  # the file's order is the cells' order
    spec = parse_bench(source)
    short, long = spec.cells[:2], spec.cells[2:]

    marker = "bench-ray-" + uuid.uuid4().hex
    ray_tmp = tempfile.mkdtemp(prefix="fr-ray-")  # short: Ray's socket paths must fit in 107 bytes
    node2_dir, driver_dir = Path(ray_tmp) / "node2", Path(ray_tmp) / "driver"
    node2_dir.mkdir()
    driver_dir.mkdir()
    env = {**os.environ, MARK: marker, "RAY_TMPDIR": ray_tmp}
    port = free_port()
    ray = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--num-cpus=1",
        "--num-gpus=1",
        "--disable-usage-stats",
    ]
    command = [sys.executable, "-m", "fedrapp_app.bench", str(config), "--ray-address", f"127.0.0.1:{port}"]
    command += ["--gpus-per-cell", "1", "--no-report"]
    log = tmp_path / "driver.log"
    driver = None
    started = time.monotonic()
    try:
        # every process of a node works in (a folder below) ray_tmp and carries the mark: the stops below find them
        subprocess.run([*ray, "--head", f"--port={port}", "--include-dashboard=false"], env=env, check=True,
                       capture_output=True, timeout=120, cwd=ray_tmp)  # fmt: skip
        subprocess.run([*ray, f"--address=127.0.0.1:{port}"], env={**env, NODE2_MARK: marker}, check=True,
                       capture_output=True, timeout=120, cwd=node2_dir)  # fmt: skip

        refused = subprocess.run([*command[:-3], "--gpus-per-cell", "2"], env=env, cwd=driver_dir,
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.startswith("error: --gpus-per-cell 2, but no node of the Ray cluster has that many")
        assert refused.stderr.count("\n") == 1 and not (tmp_path / "ray").exists()  # before anything ran

        with log.open("w") as out:
            driver = subprocess.Popen(command, env=env, cwd=driver_dir, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)  # fmt: skip
        rows_file = tmp_path / "ray" / "cells.jsonl"

        def rows() -> list[dict]:
            return read_rows(tmp_path / "ray") if rows_file.exists() else []

        wait_for(lambda: len(rows()) >= 2, 300, "row of the two short cells", driver, log)
        first = rows()
        assert {r["key"] for r in first} == {c.key for c in short}  # they ran at once: long ones started after
        assert len({r["ray_node"] for r in first}) == 2  # one cell on each node
        runs = tmp_path / "ray" / "runs"
        wait_for(lambda: all(running_on(runs / c.id) for c in long), 300, "round of both long cells", driver, log)
        nodes = {c.key: running_on(runs / c.id) for c in long}
        assert set(nodes.values()) == {r["ray_node"] for r in first}  # one long cell on each node, mid-way
        assert stop_marked(marker, grace=0.0, variable=NODE2_MARK, cwd=node2_dir, settle=1.0)  # kill -9 node 2
        killed_at = time.monotonic()

        # the runner hears of the loss when Ray has marked node 2 dead (its heartbeats missed): tens of seconds
        wait_for(
            lambda: len(rows()) >= 3 and "was lost (" in log.read_text(), 300, "third row and lost cell", driver, log
        )
        os.killpg(driver.pid, signal.SIGKILL)  # the driver dies too
        driver.wait(timeout=30)
        before = rows()
        assert len(before) == 3 and before[:2] == first  # no finished row lost or changed
        assert re.search(r"was lost \((NodeDiedError|WorkerCrashedError): ", log.read_text())
        timings = f"node 2 killed {killed_at - started:.0f} s in, driver killed {time.monotonic() - started:.0f} s in"

        resumed = subprocess.run(command, env=env, cwd=driver_dir, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert "4 cells, 3 finished, 1 to run" in resumed.stdout
        after = read_rows(tmp_path / "ray", failed=True)
        assert after[:3] == before and len(after) == 4 and len({r["key"] for r in after}) == 4
        assert all(r["status"] == "ok" and r["cuda_visible_devices"] == "0" for r in after)  # Ray's GPU, as cuda:0
        lost = next(r for r in after if r["key"] not in {b["key"] for b in before})
        finished_on = {r["key"]: r["ray_node"] for r in after}
        assert finished_on[lost["key"]] != nodes[lost["key"]]  # the lost cell was finished on the surviving node
        survivor = next(k for k in nodes if k != lost["key"])
        assert finished_on[survivor] == nodes[survivor] == finished_on[lost["key"]]
        assert marked_pids(marker, MARK, ray_tmp), "the driver must not stop the user's Ray cluster"
        print(f"{timings}; resumed grid done {time.monotonic() - started:.0f} s in")
    finally:
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        stop_marked(marker, grace=5.0, variable=MARK, cwd=ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not marked_pids(marker, MARK, ray_tmp)

    in_process = BenchRunner(parse_bench({**source, "output": str(tmp_path / "in-process")}))
    in_process.run(progress=False)
    by_key = {row["key"]: comparable(row) for row in read_rows(tmp_path / "in-process")}
    assert {row["key"]: comparable(row) for row in after} == by_key
