"""A SuperLink that dies under its running ServerApp, and the resume submitted right after its restart (issue 29).

Flower 1.42's ServerApp process (``flwr-serverapp``) watches its SuperExec's PID, and the SuperExec the
SuperLink's: a kill -9 of the SuperLink's PID alone reaches the ServerApp as a SIGINT about 2 s later, and
Flower's exit handlers then took 6 more seconds, all of it with the run folder locked, so a resume submitted at
once was refused (``RunFolderBusy``). Now the run gives its folder up on the signal (``release_on_signal``),
and a resume that still finds it held waits for it, bounded (``RESUME_WAIT_SECONDS``), saying so once.

Fast tests (in-process): the wait, the message when the wait runs out, the release on the signal, the
server's log line for a client that goes on at another position than its fresh node reports, and the warm
executor (``fedrapp-superexec``) serving a new run's task while a task its SuperNode gave up on (a message of
the killed run) still waits. Slow: the whole scenario on loopback (``benchmarks/chaos.py --scenario
superlink-crash``).
"""

from __future__ import annotations

import _thread
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from flwr.proto.runtime_pb2 import AcquireTaskResponse
from flwr.proto.task_pb2 import Task
from flwr.supercore.constant import TaskType

from fedrapp_app.deploy import executor as warm_executor
from fedrapp_app.deploy.pool import WarmPool
from fedrapp_app.deploy.protocol import Activated, Done, Pulled, Ready, Started, TaskSpec
from fedrapp_app.federation.client import app as client_app
from fedrapp_app.federation.inprocess import InProcessGrid
from fedrapp_app.federation.server import main as server_main
from fedrapp_app.recording.results import read_rows
from fedrapp_app.recording.runlock import RESUME_WAIT_SECONDS, RunFolderBusy, holder, run_lock
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import run_federation, small_run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import chaos  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny"), world.CLASSNAMES)


class Collect(logging.Handler):
    """The records of Flower's logger (ours is ``flwr.fedrapp``; Flower's does not propagate to the root)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def flower_log() -> Iterator[Collect]:
    handler = Collect()
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _hold_lock(run_dir: str, ready) -> None:
    with run_lock(Path(run_dir)):
        ready.set()
        time.sleep(600)


@contextlib.contextmanager
def held(run_dir: Path, for_seconds: float | None) -> Iterator[multiprocessing.Process]:
    """Another process holds ``run_dir``'s lock (as the ServerApp of a killed SuperLink does) and dies
    ``for_seconds`` after the block starts (None: at the end of the block)."""
    ready = multiprocessing.Event()
    process = multiprocessing.Process(target=_hold_lock, args=(str(run_dir), ready))
    process.start()
    timer = None
    try:
        assert ready.wait(30)
        if for_seconds is not None:
            timer = threading.Timer(for_seconds, os.kill, (process.pid, signal.SIGKILL))
            timer.start()
        yield process
    finally:
        if timer is not None:
            timer.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.join()


def _config(model: Path, out: Path, **overrides) -> dict:
    return small_run(model, out, **{"num-clients": 2, "testbed-samples": 96, "partition": "iid", **overrides})


# ------------------------------------------------------------------------------------------ the bounded wait
def test_a_resume_waits_for_the_stopping_server_app_that_still_holds_the_run_folder(tiny_model, tmp_path, flower_log):
    """Before: RunFolderBusy at once, and the resume failed (``flwr run`` exits 0, the run ``finished:failed``)."""
    config = _config(tiny_model, tmp_path, **{"num-rounds": 1})
    run_federation(config)  # round 1, checkpointed
    with held(tmp_path / "run", for_seconds=1.5) as old_server_app:
        started = time.monotonic()
        summary, _, _ = run_federation({**config, "num-rounds": 2, "resume": True})
        waited = time.monotonic() - started
    assert summary["status"] == "finished" and summary["resumed_after_round"] == 1 and summary["rounds"] == 2
    assert waited >= 1.4
    waits = [line for line in flower_log.lines if "waiting up to" in line]
    assert len(waits) == 1, waits  # said once, naming the holder and the bound
    assert f"PID {old_server_app.pid} on " in waits[0] and f"waiting up to {RESUME_WAIT_SECONDS:g} s" in waits[0]
    assert any("released after" in line for line in flower_log.lines)


def test_a_new_run_on_a_held_folder_is_still_refused_at_once(tiny_model, tmp_path, flower_log):
    """Only a resume waits: a second run started on a live run's folder is a mistake, said at once."""
    with held(tmp_path / "run", for_seconds=None) as other:
        started = time.monotonic()
        with pytest.raises(RunFolderBusy, match=f"being written by PID {other.pid}"):
            run_federation(_config(tiny_model, tmp_path, **{"num-rounds": 1}))
        assert time.monotonic() - started < 5.0
    assert not [line for line in flower_log.lines if "waiting up to" in line]


def test_a_folder_still_held_after_the_wait_fails_saying_to_wait_and_how_long(tmp_path, flower_log):
    with held(tmp_path / "run", for_seconds=None) as other:
        started = time.monotonic()
        with pytest.raises(RunFolderBusy) as err, run_lock(tmp_path / "run", wait=0.6):
            pass
        assert time.monotonic() - started >= 0.6
    message = str(err.value)
    assert f"still being written by PID {other.pid} on " in message and "after waiting 0.6 s" in message
    assert f"wait until PID {other.pid} has exited" in message and "submit again" in message
    assert len([line for line in flower_log.lines if "waiting up to 0.6 s" in line]) == 1


# ------------------------------------------------------------------------------------ the release on a signal
class SignalledInRound2(InProcessGrid):
    """In round 2 the main thread waits in a long sleep, as in Flower's 3 s reply poll or its retry backoff (up
    to 20 s) while the SuperLink is gone, and another thread raises SIGINT, as Flower's parent monitor does when
    the ServerApp's SuperExec has died."""

    sleep = 20.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.raised_at: float | None = None

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train" and messages[0].metadata.group_id == "2":

            def monitor() -> None:
                time.sleep(0.3)
                self.raised_at = time.monotonic()
                signal.raise_signal(signal.SIGINT)  # raised in this thread, as flwr's start_parent_process_monitor

            threading.Thread(target=monitor, daemon=True).start()
            time.sleep(self.sleep)
        return super().send_and_receive(messages, timeout=timeout)


def test_a_server_app_told_to_stop_frees_its_run_folder_at_once_before_flowers_exit_handlers_run(tiny_model, tmp_path):
    """Before: Flower's handler ran first (pushing the task's status, flushing logs: 4-6 s with the SuperLink
    gone) with the run folder still locked, and only once the main thread's wait had ended."""
    config = _config(tiny_model, tmp_path, **{"num-rounds": 3})
    run_dir = tmp_path / "run"
    grid = SignalledInRound2(client_app, 2, config)
    seen: dict = {}

    def flower_graceful_exit(signum, frame) -> None:  # what run_serverapp registers: flwr_exit ends in sys.exit
        seen["after"] = time.monotonic() - grid.raised_at
        seen["signal"] = signum
        seen["holder"] = holder(run_dir)
        summary = run_dir / "summary.json"
        seen["summary"] = json.loads(summary.read_text()) if summary.is_file() else None
        raise SystemExit(0)

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    original = signal.signal(signal.SIGINT, flower_graceful_exit)
    usr1 = signal.getsignal(signal.SIGUSR1)
    try:
        with pytest.raises(SystemExit):
            server_main(grid, context)
        assert signal.getsignal(signal.SIGINT) is flower_graceful_exit  # put back as they were
        assert signal.getsignal(signal.SIGUSR1) is usr1 and signal.set_wakeup_fd(-1) == -1
    finally:
        signal.signal(signal.SIGINT, original)
    assert seen["signal"] == signal.SIGINT
    assert seen["after"] < 3.0, seen["after"]  # not at the end of the main thread's 20 s wait
    assert seen["holder"] is None  # the folder was free when Flower's exit began
    assert seen["summary"]["status"] == "interrupted" and "got SIGINT" in seen["summary"]["error"]
    assert seen["summary"]["rounds"] == 1  # round 1 kept, round 2 cut: a resume goes on after round 1


# ------------------------------------------------------------------------------------------------ the log line
class Client1RestartsAfterRound1(InProcessGrid):
    """Client 1's SuperNode (node 1001) restarts after round 1 with a new node id and an empty context, and
    leaves the SuperLink's list at once (a SIGTERM)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.round = 0

    def push_messages(self, messages):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            self.round = int(messages[0].metadata.group_id)
        return super().push_messages(messages)

    def get_node_ids(self):
        if self.round >= 1 and 1001 in self.contexts:
            old = self.contexts.pop(1001)
            self.contexts[1101] = Context(
                run_id=old.run_id,
                node_id=1101,
                node_config=dict(old.node_config),
                state=RecordDict(),
                run_config=dict(old.run_config),
            )
        return list(self.contexts)


def test_the_server_logs_the_position_a_restarted_nodes_client_goes_on_at(tiny_model, tmp_path, flower_log):
    """Before: "node 1101 serves client 1 (3 batches, at 0)", the new node's own report, while the client went on
    at position 1."""
    config = _config(tiny_model, tmp_path, **{"num-rounds": 2})
    summary, _, _ = run_federation(config, grid_cls=Client1RestartsAfterRound1)
    assert "node 1101 serves client 1 (3 batches, resumes at 1; its node reported 0)" in flower_log.lines
    assert "node 1000 serves client 0 (3 batches, at 0)" in flower_log.lines
    rows = read_rows(tmp_path / "run" / "rounds.jsonl")
    assert [r["client_metrics"]["stream-position"] for r in rows if r["client"] == 1] == [0, 1]
    assert summary["status"] == "finished"


def test_a_resumed_run_logs_the_positions_its_clients_go_on_at(tiny_model, tmp_path, flower_log):
    config = _config(tiny_model, tmp_path, **{"num-rounds": 1})
    run_federation(config)
    run_federation({**config, "num-rounds": 2, "resume": True})
    assert "resumed after round 1; the clients go on at stream positions {0: 1, 1: 1}" in flower_log.lines


# ---------------------------------------------------------------------- the warm executor after the restart
def hanging_or_ok_worker(conn, executor_pid: int, preloaded: tuple[str, ...]) -> None:
    """A warm worker (the executor <-> worker protocol) whose task token says what it does: ``ok``, ``slow``
    (0.5 s in the ClientApp), or ``hang`` (it pulls the task's message header and then waits for its content
    forever, as a worker does whose message the SuperNode gave up on)."""
    conn.send(Ready(os.getpid()))
    while (spec := conn.recv()) is not None:
        conn.send(Activated(spec.task_id))
        conn.send(Pulled(spec.task_id, b"header", 5))
        if spec.token == "hang":
            time.sleep(3600)
        conn.send(Started(spec.task_id))
        if spec.token == "slow":
            time.sleep(0.5)
        conn.send(Done(spec.task_id, "completed", "", "", {"app": 0.01, "total": 0.02}, 0.01, 1, False))


class SuperNodeAfterTheRestart:
    """The Runtime API of a SuperNode after a SuperLink restart: first a task of the killed run whose message
    it gave up on, then the resumed run's discovery query; stops the executor (KeyboardInterrupt) once that
    query is answered."""

    def __init__(self, done: list) -> None:
        self.done = done
        self.tasks = [(1, 111, "hang"), (2, 222, "ok")]  # (task id, run id, what its worker does)

    def AcquireTask(self, request):  # noqa: N802 - Flower's Runtime API name
        if any(record.spec.task_id == 2 for record in self.done):
            raise KeyboardInterrupt
        if not self.tasks:
            return AcquireTaskResponse()
        task_id, run_id, token = self.tasks.pop(0)
        task = Task(task_id=task_id, run_id=run_id, type=TaskType.CLIENT_APP, fab_hash="f" * 64)
        return AcquireTaskResponse(task=task, token=token)

    def close(self) -> None:
        pass


def test_the_warm_executor_serves_a_new_runs_task_and_reaps_the_one_its_supernode_gave_up_on(monkeypatch):
    """Flower 1.42's SuperNode can leave a task open for a message it gave up on (a run that stopped while it
    fetched the message, as after a SuperLink restart) and go on to the next run's messages. Before, the warm
    executor asked for nothing while a task was in flight: the resumed run's discovery went unanswered for
    140 s on both nodes (followed on loopback with TLS; node-wait-timeout 120 s: the resume failed). Then it served
    the new task next to the old one, whose worker lived on beside the new run's, despite --max-workers 1 (issue
    36: ~384 MB, minutes after the crash). Now the old task is reaped the moment the new one arrives."""
    done: list = []
    ended: list = []
    monkeypatch.setattr(
        warm_executor.RuntimeHttpClient, "from_server_address", lambda **kwargs: SuperNodeAfterTheRestart(done)
    )
    pool = WarmPool(
        preload=(Path(__file__).stem,),
        on_done=done.append,
        target=hanging_or_ok_worker,
        end=lambda spec, reason: ended.append((spec.task_id, reason)) or True,
    )
    monkeypatch.setattr(warm_executor, "WarmPool", lambda **kwargs: pool)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    )
    guard = threading.Timer(60.0, _thread.interrupt_main)  # the old loop never asks again: end it
    guard.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            warm_executor.serve(warm_executor.ExecutorOptions(runtime_api_address="127.0.0.1:9", insecure=True))
    finally:
        guard.cancel()
    served = {record.spec.task_id: record for record in done}
    assert 2 in served and served[2].done.status == "completed", "the new run's task was not served"
    assert served[1].done.status == "failed" and "went on to task 2 of run 222" in served[1].done.details
    assert [task for task, _ in ended] == [1]  # ended without a reply, which would stand in for task 2's
    assert not chaos.alive(served[1].worker_pid) and served[1].worker_pid != served[2].worker_pid
    assert time.monotonic() - started < 30.0


@pytest.fixture
def fake_pool(monkeypatch):
    """A pool of fake workers (``hanging_or_ok_worker``), one slot; what it ended, and every record."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    )
    done: list = []
    ended: list = []
    pool = WarmPool(
        preload=(Path(__file__).stem,),
        on_done=done.append,
        target=hanging_or_ok_worker,
        end=lambda spec, reason: ended.append(spec.task_id) or True,
    )
    pool.done, pool.ended = done, ended  # type: ignore[attr-defined]
    yield pool
    pool.close()


def _spec(task_id: int, run_id: int, token: str) -> TaskSpec:
    return TaskSpec(task_id, run_id, "f" * 64, token, "127.0.0.1:9", True, None, time.time())


def _until(pool: WarmPool, done, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        pool.reconcile()
        pool.wait(0.05)
    assert done(), "gave up waiting"


def _workers_alive(pool: WarmPool) -> list[int]:
    return [pid for pid in pool.worker_pids().values() if chaos.alive(pid)]


def test_a_task_for_a_busy_workers_run_waits_for_it_and_is_served_next(fake_pool):
    """Now that the executor asks while a task is in flight, a task of the same run can arrive before the worker
    is free (its reply is in, its task not yet ended): it is queued for that worker (before, it would have replaced
    the task in flight in the books)."""
    fake_pool.submit(_spec(1, 7, "slow"))
    _until(fake_pool, lambda: any(w.started for w in fake_pool._workers.values()))
    fake_pool.submit(_spec(2, 7, "ok"))
    _until(fake_pool, lambda: not fake_pool.busy)
    done = fake_pool.done
    assert [record.spec.task_id for record in done] == [1, 2] and fake_pool.ended == []
    assert done[0].worker_pid == done[1].worker_pid and [r.worker_tasks for r in done] == [1, 2]


def test_a_task_whose_message_never_comes_is_reaped_after_the_orphan_timeout(fake_pool):
    """No next task arrives (nobody resumed the crashed run): the worker and its model still go, within the bound."""
    fake_pool.orphan_timeout = 1.0
    fake_pool.submit(_spec(1, 111, "hang"))
    started = time.monotonic()
    _until(fake_pool, lambda: not fake_pool.busy)
    assert 1.0 <= time.monotonic() - started < 10.0
    [record] = fake_pool.done
    assert record.done.status == "failed" and "has not arrived after" in record.done.details
    assert fake_pool.ended == [1] and not chaos.alive(record.worker_pid) and fake_pool.worker_pids() == {}


def test_every_worker_counts_against_max_workers_a_new_runs_task_waits_for_the_busy_slot(fake_pool):
    """The moment between a task's reply and its end, when the SuperNode already hands out the next run's message:
    the new run's worker starts only once the old task is done (before: two workers, with --max-workers 1)."""
    fake_pool.submit(_spec(1, 111, "ok"))
    _until(fake_pool, lambda: not fake_pool.busy)
    fake_pool.submit(_spec(2, 111, "slow"))
    _until(fake_pool, lambda: any(w.started for w in fake_pool._workers.values()))
    fake_pool.submit(_spec(3, 222, "ok"))  # a task of another run while run 111's worker is in its ClientApp
    assert len(_workers_alive(fake_pool)) == 1 and fake_pool.busy
    _until(fake_pool, lambda: not fake_pool.busy)
    records = {r.spec.task_id: r for r in fake_pool.done}
    assert [records[t].done.status for t in (1, 2, 3)] == ["completed"] * 3 and fake_pool.ended == []  # none reaped
    assert records[3].worker_pid != records[2].worker_pid and not chaos.alive(records[2].worker_pid)
    assert list(fake_pool.worker_pids()) == [(222, "f" * 64)]


# ------------------------------------------------------------------------------------------- loopback (slow)
@pytest.mark.slow
def test_a_superlink_killed_alone_restarted_and_resumed_at_once_ends_identical(tiny_model, tmp_path):
    """kill -9 of the SuperLink's PID only (its SuperExec and ServerApp live on and must notice), the SuperLink
    started again at once on its --database, the run resubmitted at once with resume = true: the resume
    runs (before: refused, "run folder ... is being written by PID <the orphan ServerApp>") and its rows are the
    uninterrupted run's, field by field. About 2 minutes."""
    report = chaos.run_scenario("superlink-crash", tmp_path, tiny_model, at_round=2, batches=4)
    assert report["run_statuses"][-1] == "finished:completed", report["events"]
    assert report["stopped"] == "streams ended" and report["complete"] and report["unscored"] == {}
    assert report["exactly_once"] and report["samples"] == report["baseline_samples"]
    assert report["resumed_after_round"] == 1  # the cut round is run again entirely
    assert report["identical"]  # every row, field by field (FedRAPP)
    assert report["leftover_processes"] == []
    exits = report["orphan_exit_seconds"]
    assert any(name.startswith("flwr-serverapp") for name in exits), exits
    assert all(seconds is not None for seconds in exits.values()), exits  # the orphans ended by themselves
    # The orphan ServerApp gave the run folder up on Flower's SIGINT, about 2 s after the kill (before: 8.5 s, at
    # the end of Flower's exit handlers). Bounded loosely: the machine is shared.
    assert report["orphan_released_lock_seconds"] < 6.0, report["orphan_released_lock_seconds"]
