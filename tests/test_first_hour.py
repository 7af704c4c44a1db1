"""A user's first hour, in-process: corrupt images, failed snapshot saves, clean error reasons, one client per
SuperNode, one writer per run folder, runs that say when they are incomplete, and checks before the start."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flwr.clientapp import ClientApp
from PIL import Image

import fedrapp_app.federation.client as client_module
import fedrapp_app.federation.strategy as strategy_module
from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.data import build_client_stream
from fedrapp_app.federation.client import app as client_app
from fedrapp_app.federation.errors import clean_reason, describe
from fedrapp_app.federation.inprocess import InProcessGrid
from fedrapp_app.federation.server import run_server
from fedrapp_app.recording.results import read_rows, unscored_samples
from fedrapp_app.recording.runlock import RunFolderBusy, check_free, run_lock
from fedrapp_app.running.launch import app_overrides, parse_pairs, resume_command
from fedrapp_app.running.preflight import PreflightError, check_data, check_model
from fedrapp_app.running.processes import describe_process, marked_pids, stat_fields, stop_marked
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import SpyGrid, run_federation, small_run

ROOT = Path(__file__).resolve().parent.parent
FOLDER_CLASSES = ("circle", "square", "star")


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


@pytest.fixture(scope="module")
def folder_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_folder"), FOLDER_CLASSES)


def image_folder(root: Path, good: int, corrupt: dict[str, int]) -> list[Path]:
    """``good`` PNGs spread over the classes, plus ``corrupt[class]`` files that are not images; the latter."""
    rng = np.random.default_rng(0)
    for i in range(good):
        folder = root / FOLDER_CLASSES[i % len(FOLDER_CLASSES)]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(folder / f"img{i:03d}.png")
    bad = []
    for name, count in corrupt.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for k in range(count):
            path = root / name / f"broken{k}.png"
            path.write_bytes(b"\x89PNG not really an image")
            bad.append(path)
    return bad


def folder_run(model: Path, data: Path, out: Path, **overrides) -> dict:
    return {
        "model": str(model),
        "dataset": "custom",
        "data-dir": str(data),
        "num-clients": 2,
        "partition": "iid",
        "batch-size": 8,
        "num-rounds": 0,
        "adaprompt-threshold": 0.0,
        "adaprompt-buffer-size": 8,
        "output-dir": str(out),
        "run-name": "run",
        "decode-workers": 0,
        **overrides,
    }


# ----------------------------------------------------------------------------------- undecodable samples
def test_a_corrupt_image_is_skipped_and_reported_and_every_other_image_is_scored(folder_tiny, tmp_path):
    bad = image_folder(tmp_path / "data", good=36, corrupt={"square": 1})
    summary, _, _ = run_federation(folder_run(folder_tiny, tmp_path / "data", tmp_path / "out"))
    assert summary["samples"] == 36 and summary["skipped"] == 1 and summary["complete"] is True
    rows = read_rows(Path(summary["run_dir"]) / "rounds.jsonl")
    skipped = [r for r in rows if r.get("skipped")]
    assert len(skipped) == 1 and skipped[0]["status"] == "ok" and str(bad[0]) in skipped[0]["skipped_samples"][0]
    assert summary["per_client_skipped"] == {skipped[0]["client"]: 1}


def test_a_batch_without_a_decodable_sample_is_skipped_and_the_stream_goes_on(folder_tiny, tmp_path):
    image_folder(tmp_path / "data", good=3, corrupt={"circle": 2, "star": 2})
    config = folder_run(folder_tiny, tmp_path / "data", tmp_path / "out", **{"num-clients": 1, "batch-size": 1})
    summary, _, _ = run_federation(config)
    rows = read_rows(Path(summary["run_dir"]) / "rounds.jsonl")
    assert [r["status"] for r in rows].count("skipped") == 4 and summary["samples"] == 3 and summary["skipped"] == 4
    assert summary["complete"] is True and summary["stopped"] == "streams ended"


# ----------------------------------------------------------------------------------- write order on a client
def test_a_failed_snapshot_save_consumes_nothing(testbed_tiny, tmp_path, monkeypatch):
    real = client_module.save_client_snapshot
    failed = []

    def flaky(where, token, client, position, state):
        if client == 1 and position == 2 and not failed:
            failed.append(position)
            raise PermissionError(13, "Permission denied", str(where))
        real(where, token, client, position, state)

    monkeypatch.setattr(client_module, "save_client_snapshot", flaky)
    summary, _, _ = run_federation(small_run(testbed_tiny, tmp_path, **{"num-rounds": 0}))
    rows = read_rows(Path(summary["run_dir"]) / "rounds.jsonl")
    mine = [r for r in rows if r["client"] == 1]
    failed_rows = [r for r in mine if r["status"] == "failed"]
    assert len(failed_rows) == 1 and "state-dir" in failed_rows[0]["reason"]
    positions = [r["client_metrics"]["stream-position"] for r in mine if r["status"] == "ok"]
    assert positions == list(range(len(positions)))  # the failed batch came again; nothing was skipped
    expected = build_client_stream(RunConfig.from_run_config(small_run(testbed_tiny, tmp_path)).data_spec(), 1)
    assert summary["complete"] is True and summary["per_client_samples"][1] == expected.num_samples


def test_snapshots_go_to_the_node_state_dir_else_the_servers_folder_on_its_host_else_a_local_cache(tmp_path):
    from fedrapp_app.federation.client import default_state_dir, snapshot_dir

    here = {"run-token": "t", "state-dir": str(tmp_path / "run"), "server-host": __import__("socket").gethostname()}
    assert snapshot_dir({}, here) == tmp_path / "run"
    assert snapshot_dir({"state-dir": str(tmp_path / "node")}, here) == tmp_path / "node"
    assert snapshot_dir({}, {**here, "server-host": "another-host"}) == default_state_dir()
    assert snapshot_dir({}, {"state-dir": "x"}) is None


# ----------------------------------------------------------------------------------- errors a person can read
RAY_REASON = (
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=1)\n"
    '  File "/x/fedrapp_app/federation/client.py", line 57, in client_id_of\n    raise ValueError(\n'
    "ValueError: the simulation runs 2 SuperNodes but num-clients = 8: fix it\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "flwr.clientapp.client_app.ClientAppException: \n"
    "Exception ClientAppException occurred. Message: the simulation runs 2 SuperNodes but num-clients = 8: fix it'>"
)


def test_error_reasons_are_the_root_exception_in_one_line_without_colour():
    assert clean_reason(RAY_REASON) == "ValueError: the simulation runs 2 SuperNodes but num-clients = 8: fix it"
    assert clean_reason("<class 'OSError'>:<'cannot identify image file'>") == "OSError: cannot identify image file"
    assert clean_reason("\x1b[31mplain\x1b[0m") == "plain"
    assert describe(OSError("cannot identify image file 'x.png'")) == "OSError: cannot identify image file 'x.png'"
    assert len(describe(ValueError("x" * 10_000))) <= 2000


def test_clients_that_cannot_start_fail_the_run_once_in_one_line(tmp_path):
    config = small_run(tmp_path / "missing-model", tmp_path)
    with pytest.raises(RuntimeError, match=r"all 3 node\(s\) reported: FileNotFoundError: model folder") as err:
        run_server(InProcessGrid(client_app, 3, config), config)
    assert "Traceback" not in str(err.value) and "\n" not in str(err.value)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "FileNotFoundError" in summary["error"]


# ----------------------------------------------------------------------------------- one client per SuperNode
def test_num_clients_zero_is_one_client_per_supernode(testbed_tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(strategy_module, "NODE_SETTLE_SECONDS", 0.2)
    overrides = {"num-clients": 0, "num-rounds": 2, "testbed-samples": 120, "partition": "iid"}
    config = small_run(testbed_tiny, tmp_path, **overrides)
    summary, _, _ = run_federation(config, num_nodes=2)
    assert summary["num_clients"] == 2 and summary["config"]["num-clients"] == 2
    assert summary["samples"] == 2 * 2 * 16 and summary["complete"] is True


def test_an_explicit_num_clients_that_disagrees_fails_once_before_any_model_loads(tmp_path):
    config = {**small_run(tmp_path / "no-model-needed", tmp_path), "num-clients": 3}
    grid = InProcessGrid(client_app, 2, config)  # a simulation of 2 SuperNodes
    with pytest.raises(RuntimeError) as err:
        run_server(grid, config)
    message = str(err.value)
    assert message.count("the simulation runs 2 SuperNodes but num-clients = 3") == 1
    assert "all 2 node(s) reported" in message and "model folder" not in message


# ----------------------------------------------------------------------------------- one writer per run folder
def _hold_lock(run_dir: str, ready) -> None:
    with run_lock(Path(run_dir)):
        ready.set()
        time.sleep(600)


@pytest.fixture
def holder(tmp_path) -> Iterator[multiprocessing.Process]:
    """Another process that holds ``tmp_path / "run"``'s lock (killed at the end if the test has not)."""
    ready = multiprocessing.Event()
    process = multiprocessing.Process(target=_hold_lock, args=(str(tmp_path / "run"), ready))
    process.start()
    try:
        assert ready.wait(30)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.join()


def test_a_live_writer_holds_the_run_folder_and_a_dead_one_does_not(holder, tmp_path):
    with pytest.raises(RunFolderBusy, match=f"PID {holder.pid}"):
        check_free(tmp_path / "run")
    with pytest.raises(RunFolderBusy, match="one writer"), run_lock(tmp_path / "run"):
        pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    check_free(tmp_path / "run")  # the kernel dropped the dead holder's lock
    with run_lock(tmp_path / "run"):
        pass


def test_a_waiting_lock_gets_the_folder_once_a_stopping_holder_exits(holder, tmp_path):
    with pytest.raises(RunFolderBusy, match=f"PID {holder.pid}"), run_lock(tmp_path / "run", wait=0.5):
        pass
    threading.Timer(1.0, os.kill, (holder.pid, signal.SIGKILL)).start()  # a holder that takes a moment to die
    started = time.monotonic()
    with run_lock(tmp_path / "run", wait=30):
        assert time.monotonic() - started >= 0.9  # it waited for the holder, then got the folder


def test_a_second_run_on_a_live_run_folder_is_refused_and_writes_nothing(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 1})
    with run_lock(tmp_path / "run"), pytest.raises(RunFolderBusy, match=f"PID {os.getpid()}"):
        run_federation(config)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock"]


# ----------------------------------------------------------------------------------- complete or not, and why
def test_a_run_with_a_client_that_always_fails_is_incomplete_and_says_why(testbed_tiny, tmp_path):
    broken = ClientApp()

    @broken.query()
    def query(msg, context):
        return client_app(msg, context)

    @broken.train()
    def train(msg, context):
        if context.node_config["partition-id"] == 2:
            raise OSError("disk on fire")
        return client_app(msg, context)

    summary, _, _ = run_federation(small_run(testbed_tiny, tmp_path, **{"num-rounds": 0}), app=broken)
    assert summary["complete"] is False and summary["status"] == "finished"
    assert set(summary["unscored"]) == {2}
    lost = summary["unscored"][2]
    assert lost["samples"] > 0 and "OSError: disk on fire" in " ".join(lost["reasons"])


def test_a_failed_run_writes_why_into_its_summary(tmp_path, testbed_tiny):
    class Dead(SpyGrid):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.drop = lambda m: m.metadata.message_type == "train"

    with pytest.raises(RuntimeError, match="no sample was ever scored"):
        run_federation(small_run(testbed_tiny, tmp_path, **{"num-rounds": 0}), grid_cls=Dead)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["complete"] is False and "no sample" in summary["error"]


def test_resuming_a_finished_run_runs_nothing(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 2})
    first, _, _ = run_federation(config)
    again, grid, _ = run_federation({**config, "resume": True})
    assert not grid.sent and (again["rounds"], again["micro_accuracy"]) == (first["rounds"], first["micro_accuracy"])


def test_unscored_samples_by_the_plan_of_the_run():
    rows = [
        {"round": 1, "client": 0, "status": "ok", "num_examples": 8},
        {"round": 1, "client": 1, "status": "failed", "reason": "OSError: x"},
        {"round": 2, "client": 1, "status": "ok", "num_examples": 8, "skipped": 2},
    ]
    complete, unscored = unscored_samples(3, {0: 8, 1: 10}, rows, "streams ended", capped=False)
    assert not complete and set(unscored) == {2} and unscored[2]["samples"] is None
    complete, unscored = unscored_samples(2, {0: 16, 1: 10}, rows, "num-rounds reached", capped=True)
    assert not complete and unscored[1]["samples"] == 0 and "OSError" in unscored[1]["reasons"][0]
    complete, unscored = unscored_samples(1, {0: 16}, rows[:1], "num-rounds reached", capped=True)
    assert complete and unscored[0]["samples"] == 8


def test_a_cut_last_line_of_rounds_jsonl_is_dropped_and_a_bad_middle_line_is_an_error(tmp_path):
    path = tmp_path / "rounds.jsonl"
    path.write_text('{"round": 1}\n{"round": 2, "cli')
    assert read_rows(path) == [{"round": 1}]
    path.write_text('{"round": 1}\nnot json\n{"round": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_rows(path)


# ----------------------------------------------------------------------------------- checks before the start
def test_the_model_is_checked_before_the_start(tmp_path, testbed_tiny, monkeypatch):
    check_model("testbed")
    check_model(str(testbed_tiny))
    with pytest.raises(PreflightError, match="no such folder"):
        check_model(str(tmp_path / "nope"))
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(PreflightError, match="not a CLIP checkpoint"):
        check_model(str(tmp_path / "bert"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(PreflightError, match="not in the local Hugging Face cache"):
        check_model("openai/clip-vit-base-patch16")


def test_the_data_is_checked_before_the_start(tmp_path, folder_tiny):
    from fedrapp_app.data import clear_caches

    def config(data: Path, **extra) -> RunConfig:
        clear_caches()
        return RunConfig.from_run_config(folder_run(folder_tiny, data, tmp_path / "out", **extra))

    with pytest.raises(PreflightError, match="does not exist"):
        check_data(config(tmp_path / "missing"))
    image_folder(tmp_path / "ok", good=12, corrupt={})
    check_data(config(tmp_path / "ok"))
    with pytest.raises(PreflightError, match="min-partition-size"):
        check_data(config(tmp_path / "ok", **{"num-clients": 5, "partition": "dirichlet", "min-partition-size": 3}))
    image_folder(tmp_path / "one-bad-class", good=6, corrupt={"triangle": 2})
    with pytest.raises(PreflightError, match="'triangle' can be decoded"):
        check_data(config(tmp_path / "one-bad-class"))
    (tmp_path / "ok" / "empty-class").mkdir()
    with pytest.raises(PreflightError, match="'empty-class' hold no images"):
        check_data(config(tmp_path / "ok"))


def test_fedrapp_sim_refuses_bad_input_in_seconds_with_one_message(tmp_path):
    cases = [
        (["-c", f"model='{tmp_path / 'nope'}'"], "no such folder"),
        (["-c", "num-clients=900"], "testbed pool"),
        (["-c", "strategy=fedvag"], "did you mean 'fedavg'"),
    ]
    typo = tmp_path / "typo.toml"
    typo.write_text("num-client = 4\n")
    cases.append((["-c", str(typo)], "did you mean 'num-clients'"))
    for args, expected in cases:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "fedrapp_app.running.launch", str(ROOT), *args, "-c", f"output-dir='{tmp_path}'"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert time.monotonic() - started < 5, args
        assert done.returncode == 2 and expected in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) <= 2 and "Traceback" not in done.stderr
    assert not any(tmp_path.glob("testbed-*"))  # no results folder


def test_overrides_accept_bare_strings_and_refuse_what_they_cannot_read():
    assert parse_pairs("strategy=fedavg seed=3 csc=true") == {"strategy": "fedavg", "seed": 3, "csc": True}
    assert parse_pairs("strategy='fedavg'") == {"strategy": "fedavg"}
    with pytest.raises(ConfigError, match='-c "seed=<value>"'):
        parse_pairs("seed=three")
    with pytest.raises(ConfigError, match="not key=value"):
        parse_pairs("strategy")


def test_an_override_file_with_a_typo_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("strategy = 'fedavg'\ngama0 = 0.4\n")
    with pytest.raises(ConfigError, match=r"mine.toml: unknown key\(s\) 'gama0' \(did you mean 'gamma0'\?\)"):
        app_overrides(ROOT, [str(path)])


def test_the_resume_command_names_the_run(tmp_path):
    import argparse

    args = argparse.Namespace(app=".", run_config=["strategy=fedavg", "my run.toml"], supernodes=0)
    command = resume_command(args, tmp_path / "out" / "my-run")
    out = tmp_path / "out"
    expected = 'fedrapp-sim . -c strategy=fedavg -c "my run.toml" -c "resume=true run-name=\'my-run\' '
    assert command == expected + f"output-dir='{out}'\""


# ----------------------------------------------------------------------------------- stopping every process
def test_every_marked_process_is_stopped_even_one_that_ignores_sigterm():
    launch = "test-" + os.urandom(4).hex()
    env = {**os.environ, "FEDRAPP_LAUNCH_ID": launch}
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    children = [
        subprocess.Popen([sys.executable, "-c", stubborn], env=env, stdout=subprocess.PIPE, start_new_session=True),
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env),
    ]
    children[0].stdout.readline()
    assert sorted(marked_pids(launch)) == sorted(c.pid for c in children)
    killed = stop_marked(launch, grace=1.0)
    assert killed == [children[0].pid]
    assert all(c.wait(timeout=5) is not None for c in children) and not marked_pids(launch)


def test_a_process_whose_environment_lost_the_mark_is_found_by_its_working_directory(tmp_path):
    """Ray's agents were seen, in some runs, with an unreadable (all-zero) environment, and outlived a Ctrl-C and
    SIGTERM: a process working in the run's scratch folder is the run's, even once the folder is gone."""
    launch = "test-" + os.urandom(4).hex()
    scratch = tmp_path / "scratch"
    (scratch / "below").mkdir(parents=True)
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    unmarked = {k: v for k, v in os.environ.items() if k != "FEDRAPP_LAUNCH_ID"}
    children = [
        subprocess.Popen([sys.executable, "-c", stubborn], cwd=folder, env=unmarked, stdout=subprocess.PIPE)
        for folder in (scratch, scratch / "below")
    ]
    elsewhere = subprocess.Popen([sys.executable, "-c", stubborn], cwd=tmp_path, env=unmarked, stdout=subprocess.PIPE)
    try:
        for child in (*children, elsewhere):
            child.stdout.readline()
        assert marked_pids(launch) == []  # the environment alone misses them
        (tmp_path / "link").symlink_to(scratch)  # a folder named through a link: /proc names the real path
        shutil.rmtree(scratch)  # /proc/<pid>/cwd now reads "<scratch> (deleted)"
        assert sorted(marked_pids(launch, cwd=scratch)) == sorted(c.pid for c in children)
        assert sorted(marked_pids(launch, cwd=tmp_path / "link")) == sorted(c.pid for c in children)
        killed = stop_marked(launch, grace=1.0, cwd=scratch)
        assert sorted(killed) == sorted(c.pid for c in children)  # SIGTERM ignored: SIGKILL
        assert all(c.wait(timeout=5) == -signal.SIGKILL for c in children)
        assert elsewhere.poll() is None  # a process working elsewhere is not the run's
    finally:
        for child in (*children, elsewhere):
            child.kill()
            child.wait()


def test_a_ray_address_that_does_not_answer_is_refused_at_once():
    from fedrapp_app.running.launch import check_ray_address, free_port

    with pytest.raises(ConfigError, match="does not answer.*ray start --head"):
        check_ray_address(f"127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        check_ray_address("my-cluster")


def test_the_launcher_gives_clients_a_gpu_share_on_a_gpu_host_and_refuses_what_would_fail(monkeypatch, tmp_path):
    import argparse

    from fedrapp_app.engine import devices
    from fedrapp_app.running.launch import gpu_share

    def args(**kw) -> argparse.Namespace:
        return argparse.Namespace(**{"ray_address": "", "gpus_per_client": None, **kw})

    count = devices.host_gpu_count
    monkeypatch.setattr(devices, "host_gpu_count", lambda *a, **k: 2)
    share, note = gpu_share("auto", args())
    assert share == 1.0 and "--gpus-per-client 1/k" in note
    assert gpu_share("auto", args(gpus_per_client=0.25)) == (0.25, None)
    with pytest.raises(ConfigError, match="cuda:0"):
        gpu_share("cuda:1", args())
    with pytest.raises(ConfigError, match="--gpus-per-client 1"):
        gpu_share("cuda", args(gpus_per_client=0.0))
    monkeypatch.setattr(devices, "host_gpu_count", lambda *a, **k: 0)
    assert gpu_share("auto", args()) == (0.0, None)
    with pytest.raises(ConfigError, match="no GPU"):
        gpu_share("cuda", args())
    with pytest.raises(ConfigError, match="Ray cluster"):
        gpu_share("cuda", args(ray_address="10.0.0.1:6379"))
    assert gpu_share("cuda", args(ray_address="10.0.0.1:6379", gpus_per_client=0.5)) == (0.5, None)
    driver = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (driver / bus).mkdir(parents=True)
    assert count("", driver) == 0 and count("2,0", driver) == 2 and count("0,7,1", driver) == 1
    assert count("GPU-abc", driver) == 1 and count("1,2", tmp_path / "none") == 0


def test_a_marked_process_that_shows_up_after_the_others_stopped_is_stopped_too():
    """Like an agent Ray restarts while the run stops: on SIGTERM a marked process asks an unmarked helper to start
    a marked one half a second later, and exits at once; the scans that follow the stop find the late one."""
    launch = "test-" + os.urandom(4).hex()
    env = {**os.environ, "FEDRAPP_LAUNCH_ID": launch}
    helper = (
        "import os, subprocess, sys, time; time.sleep(0.5); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={**os.environ, "
        f"'FEDRAPP_LAUNCH_ID': '{launch}'}}, start_new_session=True)"
    )
    respawner = (
        "import os, signal, subprocess, sys, time\n"
        "env = {k: v for k, v in os.environ.items() if k != 'FEDRAPP_LAUNCH_ID'}\n"
        "def late(*_):\n"
        f"    subprocess.Popen([sys.executable, '-c', {helper!r}], env=env, start_new_session=True)\n"
        "    os._exit(0)\n"
        "signal.signal(signal.SIGTERM, late); print('up', flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", respawner], env=env, stdout=subprocess.PIPE)
    parent.stdout.readline()
    killed = stop_marked(launch, grace=1.0)
    parent.wait(timeout=5)
    time.sleep(1.0)
    assert not marked_pids(launch) and len(killed) == 1  # the late one, with SIGKILL


def test_a_marked_process_that_keeps_starting_others_is_stopped_with_all_it_started():
    """A process that ignores SIGTERM and starts a marked child every 20 ms: children it starts between a scan
    and its SIGKILL are found by the scans that follow."""
    launch = "test-" + os.urandom(4).hex()
    env = {**os.environ, "FEDRAPP_LAUNCH_ID": launch}
    spawner = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True)\n"
        "child = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'\n"
        "while True:\n"
        "    subprocess.Popen([sys.executable, '-c', child], start_new_session=True); time.sleep(0.02)"
    )
    parent = subprocess.Popen([sys.executable, "-c", spawner], env=env, stdout=subprocess.PIPE)
    parent.stdout.readline()
    time.sleep(0.5)
    assert len(marked_pids(launch)) > 3
    killed = stop_marked(launch, grace=0.5)
    parent.wait(timeout=5)
    time.sleep(1.0)
    assert not marked_pids(launch) and parent.pid in killed and len(killed) > 3


def test_a_process_with_an_odd_name_anywhere_on_the_host_does_not_stop_the_scan():
    """A process name that is not UTF-8 (a 15-byte cut can split a character), marked or not, is read as bytes."""
    launch = "test-" + os.urandom(4).hex()
    odd_name = "open('/proc/self/comm', 'wb').write(b'a)b \\xe4\\xb8'); print('up', flush=True); "
    odd_name += "__import__('time').sleep(60)"
    odd = [
        subprocess.Popen([sys.executable, "-c", odd_name], env=env, stdout=subprocess.PIPE)
        for env in (dict(os.environ), {**os.environ, "FEDRAPP_LAUNCH_ID": launch})
    ]
    try:
        for process in odd:
            process.stdout.readline()
        assert all(stat_fields(process.pid)[1] == str(os.getpid()) for process in odd)  # the parent, past the name
        assert marked_pids(launch) == [odd[1].pid]
        assert stop_marked(launch, grace=1.0) == [] and odd[1].wait(timeout=5) == -signal.SIGTERM
    finally:
        for process in odd:
            process.kill()
            process.wait()


def test_the_launcher_names_a_process_of_the_run_that_outlives_its_stop(monkeypatch, tmp_path, capsys):
    """SIGKILL cannot take a process stuck in the kernel: the launcher says which one, with its state and signals."""
    from fedrapp_app.running import launch as launcher

    launch = "test-" + os.urandom(4).hex()
    stuck = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "FEDRAPP_LAUNCH_ID": launch}
    )
    # as if SIGKILL had not taken it
    monkeypatch.setattr(launcher, "stop_marked", lambda launch_id, cwd, settle=2.0, spare=(): [])
    try:
        launcher._stop_everything(launch, tmp_path / "scratch")
    finally:
        stuck.kill()
        stuck.wait()
    err = capsys.readouterr().err
    # a scan that fails: say how to finish
    monkeypatch.setattr(launcher, "stop_marked", lambda launch_id, cwd, settle=2.0, spare=(): 1 / 0)
    launcher._stop_everything(launch, tmp_path / "scratch")
    err_failed = capsys.readouterr().err
    assert f"ZeroDivisionError: division by zero); they carry FEDRAPP_LAUNCH_ID={launch}" in err_failed
    assert f"grep -l FEDRAPP_LAUNCH_ID={launch} /proc/[0-9]*/environ" in err_failed
    assert f"ls -l /proc/[0-9]*/cwd | grep {tmp_path / 'scratch'}" in err_failed  # the second mark, below
    assert "1 process(es) of the run outlived SIGKILL" in err and f"\n  {stuck.pid} " in err and "State " in err
    assert describe_process(stuck.pid) == f"{stuck.pid} (gone)"


def test_free_port_never_hands_out_the_same_port_twice(monkeypatch):
    """The OS may offer a just-probed port again (two SuperNodes once got the same one in CI): free_port skips it."""
    from fedrapp_app.running import launch

    offered = iter([50001, 50001, 50001, 50002])

    class Probe:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(launch.socket, "socket", Probe)
    monkeypatch.setattr(launch, "_GIVEN_PORTS", set())
    assert [launch.free_port(), launch.free_port()] == [50001, 50002]


def test_the_data_check_says_what_it_found_and_warns_on_one_class_and_on_split_folders(tmp_path, folder_tiny):
    """--check passed a folder holding train/ and test/ as a 2-class dataset named test/train, and a one-class folder
    that then scored 100%: it now says what it found and warns on both; an empty folder is refused."""
    from fedrapp_app.data import clear_caches

    def findings(data: Path):
        clear_caches()
        return check_data(RunConfig.from_run_config(folder_run(folder_tiny, data, tmp_path / "out")))

    image_folder(tmp_path / "ok", good=12, corrupt={})
    ok = findings(tmp_path / "ok")
    assert ok.classes == list(FOLDER_CLASSES) and ok.per_client == [6, 6] and ok.warnings() == []
    lines = ok.lines()
    assert "3 classes (circle, square, star)" in lines[0]
    assert lines[1] == "samples per client: 6, 6 (12 in all, 6 to 6)"
    assert lines[2] == "shift domains: none (no corruption)"

    for split in ("train", "test"):  # data-dir one level too high: the splits became the classes
        image_folder(tmp_path / "splits" / split, good=6, corrupt={})
    (warning,) = findings(tmp_path / "splits").warnings()
    assert "'test', 'train' look like split folders" in warning and f"data-dir='{tmp_path}/splits/test'" in warning

    (tmp_path / "one" / "circle").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(8):
        image = Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8))
        image.save(tmp_path / "one" / "circle" / f"{i}.png")
    (warning,) = findings(tmp_path / "one").warnings()
    assert "the dataset has one class ('circle')" in warning and "its accuracy says nothing" in warning

    (tmp_path / "empty").mkdir()
    with pytest.raises(PreflightError):
        findings(tmp_path / "empty")


def test_fedrapp_sim_check_names_the_model_the_classes_and_the_samples():
    done = subprocess.run(
        [sys.executable, "-m", "fedrapp_app.running.launch", str(ROOT), "--check", "-c", "num-clients=4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "model: CLIP (image ViT" in out and "from the shipped offline testbed model" in out
    assert "data: " in out and f"{len(world.CLASSNAMES)} classes ({', '.join(world.CLASSNAMES[:5])}, ...)" in out
    assert "samples per client: " in out and "(5120 in all" in out


def test_a_model_path_that_is_a_file_is_named_as_a_file(tmp_path):
    weights = tmp_path / "clip" / "model.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"x")
    with pytest.raises(PreflightError, match=rf"is a file, not a folder.*model='{tmp_path}/clip'"):
        check_model(str(weights))
    found = check_model("testbed")
    assert found.startswith("CLIP (image ViT") and found.endswith("from the shipped offline testbed model")
