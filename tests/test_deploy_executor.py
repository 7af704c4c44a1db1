"""fedrapp-superexec without a SuperNode: the Flower version gate, the command line, the warm pool's
bookkeeping (one worker per run, crash recovery, idle stop) with fake workers, and the stats rows.

The fake workers speak the real executor <-> worker protocol; what they do with a task is spelled in its
token (``"ok"``, ``"die-early"``, ...). They run as real processes forked from the pool's forkserver, which
preloads this module so that each fork is cheap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from fedrapp_app.deploy.cli import CliError, options_from, parser
from fedrapp_app.deploy.executor import WarmExecPlugin, stats_row
from fedrapp_app.deploy.pool import TaskRecord, WarmPool, exit_text
from fedrapp_app.deploy.protocol import Activated, Done, Pulled, Ready, TaskSpec
from fedrapp_app.deploy.version import UnsupportedFlowerError, check_flower_version
from fedrapp_app.deploy.worker import shadowed_preloads
from fedrapp_app.running.processes import stat_fields

ROOT = Path(__file__).resolve().parent.parent
THIS_MODULE = Path(__file__).stem


# -- the Flower version gate ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.42.0", "1.42.7", "1.42.0rc1"])
def test_supported_flower_versions_pass(version):
    assert check_flower_version(version) == version


@pytest.mark.parametrize("version", ["1.41.2", "1.43.0", "2.0.0", "nightly"])
def test_other_flower_versions_are_refused_in_one_line_with_the_fix(version):
    with pytest.raises(UnsupportedFlowerError) as refused:
        check_flower_version(version)
    message = str(refused.value)
    assert "\n" not in message
    assert f"Flower {version} is installed" in message and "1.42.x" in message
    assert "pip install 'flwr[simulation]==1.42.0'" in message


def test_the_installed_flower_is_supported():
    check_flower_version()


def test_fedrapp_supernodes_refusal_names_it_and_flowers_own_supernode():
    with pytest.raises(UnsupportedFlowerError) as refused:
        check_flower_version("1.43.0", program="fedrapp-supernode")
    message = str(refused.value)
    assert message.startswith("fedrapp-supernode supports Flower 1.42.x")
    assert message.endswith("or start Flower's own flower-supernode instead")


def _fake_flower(folder: Path, version: str) -> Path:
    """A folder that makes ``importlib.metadata`` report Flower ``version`` when it comes first on sys.path."""
    info = folder / f"flwr-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flwr\nVersion: {version}\n")
    return folder


def test_the_command_refuses_an_unsupported_flower_before_importing_it(tmp_path):
    fake = _fake_flower(tmp_path / "site", "1.41.0")
    done = subprocess.run(
        [sys.executable, "-m", "fedrapp_app.deploy", "--runtime-api-address", "127.0.0.1:9", "--insecure"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Flower 1.41.0 is installed" in lines[0] and "pip install" in lines[0]


# -- the command line -----------------------------------------------------------------------------------


def _options(*argv: str):
    return options_from(parser().parse_args(["--runtime-api-address", "127.0.0.1:9094", *argv]))


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--max-workers", "0"], "--max-workers"),
        (["--idle-timeout", "0"], "--idle-timeout"),
        (["--poll-interval", "100"], "--poll-interval"),
        (["--allow-runtime-dependency-installation"], "pre-install"),
        (["--insecure", "--root-certificates", "ca.crt"], "contradict"),
        (["--root-certificates", "/no/such/ca.crt"], "no such file"),
        (["--superexec-auth-secret-file", "/no/such/secret"], "cannot read"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(argv, named):
    with pytest.raises(CliError, match=named):
        _options(*argv)


def test_options_have_flower_superexecs_names_and_our_defaults():
    options = _options("--insecure", "--preload", "torch, numpy", "--max-workers", "2")
    assert options.insecure and options.max_workers == 2 and options.preload == ("torch", "numpy")
    assert _options("--insecure", "--preload", "").preload == ()
    assert _options("--insecure").poll_interval == 0.2


def test_the_command_exits_2_on_a_bad_option(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fedrapp_app.deploy", "--runtime-api-address", "x:1", "--max-workers", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "--max-workers must be at least 1" in done.stderr


# -- small pure parts -----------------------------------------------------------------------------------


def test_preloaded_modules_shipped_by_the_bundle_are_found_but_namespace_folders_are_not(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "mod.py").write_text("")
    (tmp_path / "fedrapp_app" / "testbed").mkdir(parents=True)  # a folder of documents, no code
    (tmp_path / "fedrapp_app" / "testbed" / "README.md").write_text("")
    preloaded = ("pkg.sub", "mod", "fedrapp_app.deploy.preload", "torch")
    assert shadowed_preloads(tmp_path, preloaded) == ["mod", "pkg"]


def test_exit_text_names_the_signal():
    assert exit_text(-signal.SIGKILL) == "SIGKILL"
    assert exit_text(1) == "exit code 1"
    assert exit_text(None) == "an unknown status"


def _spec(command: str, run_id: int = 1, task_id: int = 1, **fields) -> TaskSpec:
    values = {
        "task_id": task_id,
        "run_id": run_id,
        "fab_hash": "f" * 64,
        "token": command,
        "runtime_api_address": "",
        "insecure": True,
        "root_certificates_path": None,
        "acquired_at": time.time(),
        **fields,
    }
    return TaskSpec(**values)


def test_stats_row_splits_the_span_into_the_app_and_our_own_share():
    spec = _spec("ok", pending_at="2026-01-01T00:00:00+00:00")
    pending = 1767225600.0
    done = Done(1, "completed", "", "", {"pull": 0.1, "app": 2.0, "push": 0.1, "total": 2.3}, 1.5, 2**20)
    row = stats_row(TaskRecord(spec, done, 42, 3, pending + 0.3, pending + 2.6))
    assert row["span_seconds"] == pytest.approx(2.6) and row["own_seconds"] == pytest.approx(0.6)
    assert (row["worker_pid"], row["worker_tasks"], row["status"]) == (42, 3, "completed")
    assert stats_row(TaskRecord(_spec("ok"), done, 42, 1, 0.0, 1.0))["own_seconds"] is None


def test_client_app_tasks_go_to_the_pool_and_other_tasks_to_flowers_subprocess_executor():
    from flwr.proto.task_pb2 import Task
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor import LaunchResult

    submitted: list[TaskSpec] = []
    launched = []

    class Pool:
        def submit(self, spec: TaskSpec) -> None:
            submitted.append(spec)

    plugin = WarmExecPlugin(_options("--insecure"), Pool())  # type: ignore[arg-type]
    plugin.executor.launch = lambda spec: launched.append(spec) or LaunchResult.accepted()  # type: ignore[method-assign]
    task = Task(task_id=7, run_id=9, type=TaskType.CLIENT_APP, fab_hash="ab" * 32, pending_at="2026-01-01T00:00:00")
    assert plugin.launch_task("tok", task).status == "accepted"
    assert submitted[0].key == (9, "ab" * 32) and submitted[0].token == "tok" and submitted[0].task_id == 7
    assert submitted[0].runtime_api_address == "127.0.0.1:9094" and submitted[0].insecure
    plugin.launch_task("tok2", Task(task_id=8, run_id=9, type=TaskType.AGENT_APP))
    assert len(submitted) == 1 and launched[0].task_type == TaskType.AGENT_APP and launched[0].token == "tok2"


# -- the warm pool, with fake workers -----------------------------------------------------------------


def fake_worker(conn: Connection, executor_pid: int, preloaded: tuple[str, ...]) -> None:
    """A worker whose behaviour per task is its token: ok, die-early, die-once (marker file in
    ``runtime_api_address``), die-activated, die-pulled, exit."""
    conn.send(Ready(os.getpid()))
    while (spec := conn.recv()) is not None:
        command = spec.token
        if command == "die-early" or (command == "die-once" and not Path(spec.runtime_api_address).exists()):
            if command == "die-once":
                Path(spec.runtime_api_address).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        conn.send(Activated(spec.task_id))
        if command == "die-activated":
            os.kill(os.getpid(), signal.SIGKILL)
        conn.send(Pulled(spec.task_id, b"header-" + str(spec.task_id).encode(), 5))
        if command == "die-pulled":
            os.kill(os.getpid(), signal.SIGKILL)
        conn.send(Done(spec.task_id, "completed", "", "", {"app": 0.01, "total": 0.02}, 0.01, 1, command == "exit"))
        if command == "exit":
            sys.exit(1)


class Recorder:
    def __init__(self) -> None:
        self.records: list[TaskRecord] = []
        self.answered: list[tuple[int, bytes | None, str]] = []

    def on_done(self, record: TaskRecord) -> None:
        self.records.append(record)

    def answer(self, spec: TaskSpec, pulled: Pulled | None, reason: str) -> bool:
        self.answered.append((spec.task_id, None if pulled is None else pulled.header, reason))
        return True


@pytest.fixture(scope="module")
def forkserver_imports_this_module():
    """Python 3.11's forkserver ignores the parent's sys.path for its preload, but not PYTHONPATH: without
    this, every fake worker would import this module again (about 1.5 s each)."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), before]))
    yield
    if before is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = before


@pytest.fixture
def pool(forkserver_imports_this_module):
    recorder = Recorder()
    warm = WarmPool(
        max_workers=2,
        idle_timeout=60.0,
        preload=(THIS_MODULE,),
        on_done=recorder.on_done,
        target=fake_worker,
        answer=recorder.answer,
    )
    warm.recorder = recorder  # type: ignore[attr-defined]
    yield warm
    warm.close()


def _serve(pool: WarmPool, spec: TaskSpec, timeout: float = 30.0) -> TaskRecord:
    count = len(pool.recorder.records)  # type: ignore[attr-defined]
    pool.submit(spec)
    deadline = time.monotonic() + timeout
    while pool.busy and time.monotonic() < deadline:
        pool.wait(0.05)
    assert not pool.busy, "the task did not end"
    records = pool.recorder.records  # type: ignore[attr-defined]
    assert len(records) == count + 1
    return records[-1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    fields = stat_fields(pid)
    return fields is not None and fields[:1] != ["Z"]


def test_one_worker_serves_every_task_of_a_run_and_each_run_gets_its_own(pool):
    first = _serve(pool, _spec("ok", run_id=1, task_id=1))
    second = _serve(pool, _spec("ok", run_id=1, task_id=2))
    assert first.worker_pid == second.worker_pid and (first.worker_tasks, second.worker_tasks) == (1, 2)
    other = _serve(pool, _spec("ok", run_id=2, task_id=3))
    assert other.worker_pid != first.worker_pid and other.worker_tasks == 1
    third = _serve(pool, _spec("ok", run_id=3, task_id=4))  # max_workers=2: run 1's worker (least recent) goes
    assert set(pool.worker_pids()) == {(2, "f" * 64), (3, "f" * 64)}
    assert not _alive(first.worker_pid) and _alive(third.worker_pid)
    assert all(r.done.status == "completed" for r in pool.recorder.records)


def test_a_task_whose_worker_died_before_activating_it_goes_to_a_fresh_worker(pool, tmp_path):
    record = _serve(pool, _spec("die-once", runtime_api_address=str(tmp_path / "died")))
    assert record.done.status == "completed" and (tmp_path / "died").exists()
    assert pool.recorder.answered == []


def test_a_worker_that_dies_holding_a_pulled_message_gets_it_answered_and_is_replaced(pool):
    before = _serve(pool, _spec("ok", task_id=1))
    record = _serve(pool, _spec("die-pulled", task_id=2))
    assert pool.recorder.answered[0][:2] == (2, b"header-2")
    assert record.done.status == "failed" and "SIGKILL" in record.done.details and "replaced" in record.done.details
    after = _serve(pool, _spec("ok", task_id=3))
    assert after.done.status == "completed" and after.worker_pid != before.worker_pid and after.worker_tasks == 1


def test_a_worker_that_dies_after_activation_gets_the_message_pulled_and_answered_by_the_executor(pool):
    record = _serve(pool, _spec("die-activated", task_id=5))
    assert pool.recorder.answered == [(5, None, record.done.details)] and record.done.status == "failed"


def test_a_task_that_kills_every_worker_before_activation_is_answered_after_one_retry(pool):
    record = _serve(pool, _spec("die-early", task_id=6))
    assert [a[:2] for a in pool.recorder.answered] == [(6, None)] and record.done.status == "failed"


def test_a_worker_that_exits_after_its_task_is_replaced_for_the_next(pool):
    first = _serve(pool, _spec("exit", task_id=1))
    deadline = time.monotonic() + 10
    while pool.worker_pids() and time.monotonic() < deadline:
        pool.wait(0.05)
    assert pool.worker_pids() == {} and first.done.status == "completed"
    assert _serve(pool, _spec("ok", task_id=2)).worker_pid != first.worker_pid
    assert pool.recorder.answered == []


def test_idle_workers_are_stopped_after_the_idle_timeout_and_close_stops_the_rest(pool):
    first = _serve(pool, _spec("ok", run_id=1))
    pool.idle_timeout = 0.2
    time.sleep(0.3)
    pool.reconcile()
    assert pool.worker_pids() == {} and not _alive(first.worker_pid)
    second = _serve(pool, _spec("ok", run_id=2))
    pool.close()
    assert not _alive(second.worker_pid)


# -- the Runtime API calls of a task ------------------------------------------------------------------


def _http_error(status: int):
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1:9/flwr.proto.Runtime/PushTaskOutput")
    return httpx.HTTPStatusError(str(status), request=request, response=httpx.Response(status, request=request))


def test_a_refused_task_token_fails_the_call_instead_of_interrupting_the_process():
    """Flower's invoker answers HTTP 401 with SIGINT to its own process (the end of a flwr-clientapp); in a
    warm worker or the executor that would end far more than one task."""
    import httpx

    from fedrapp_app.deploy.runtime import task_retry_invoker

    invoker = task_retry_invoker(max_time=30)
    invoker.wait_function = lambda _seconds: None

    def refused():
        raise _http_error(401)

    with pytest.raises(httpx.HTTPStatusError):
        invoker.invoke(refused)
    calls = []

    def unavailable_twice():
        calls.append(1)
        if len(calls) < 3:
            raise _http_error(503)
        return "ok"

    assert invoker.invoke(unavailable_twice) == "ok" and len(calls) == 3


def test_the_heartbeat_interrupts_the_task_only_while_armed_when_the_supernode_drops_it():
    import threading

    from fedrapp_app.deploy.runtime import TaskHeartbeat, take_sigint

    class Refusing:
        def SendTaskHeartbeat(self, _request):  # noqa: N802 - Flower's method name
            raise _http_error(401)

    heartbeat = TaskHeartbeat(Refusing())  # type: ignore[arg-type]
    beat = threading.Thread(target=heartbeat._beat)
    interrupted = False
    previous = signal.getsignal(signal.SIGINT)
    take_sigint()  # as a worker does: pytest may have been started with SIGINT ignored (a background job)
    try:
        beat.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the interrupt lands between two steps of this loop (one long
            time.sleep(0.01)  # sleep is not woken by it)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGINT, previous)
    beat.join()
    assert interrupted, f"no interrupt within 30 s (lost: {heartbeat.lost})"
    assert heartbeat.lost
    disarmed = TaskHeartbeat(Refusing())  # type: ignore[arg-type]
    disarmed.stop()
    assert disarmed._beat() and not disarmed.lost


def test_a_process_started_with_sigint_ignored_takes_it_back():
    """``fedrapp-superexec ... &`` in a script starts it with SIGINT ignored; the executor and its workers rely on
    SIGINT (a lost task's heartbeat, the parent monitor), so they take it back."""
    code = (
        "import os, signal, time\n"
        "from fedrapp_app.deploy.runtime import take_sigint\n"
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)\n"
        "take_sigint()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(30)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=ignore_sigint
    )
    assert done.stdout.split() == ["True", "interrupted"], done.stderr[-2000:]


def test_a_worker_that_died_idle_is_replaced_when_its_run_sends_the_next_task(pool):
    first = _serve(pool, _spec("ok", task_id=1))
    os.kill(first.worker_pid, signal.SIGKILL)
    while _alive(first.worker_pid):
        time.sleep(0.05)
    second = _serve(pool, _spec("ok", task_id=2))  # submitted before the pool noticed the death
    assert second.done.status == "completed" and second.worker_pid != first.worker_pid
    assert pool.recorder.answered == []


def test_the_preload_starts_no_thread_and_no_cuda_so_forking_after_it_is_safe():
    """Workers are forked from the process that ran the preload: a thread or an initialised CUDA context
    there would be copied into every worker in an unusable state."""
    code = (
        "import threading, torch, fedrapp_app.deploy.preload\n"
        "print(threading.active_count(), torch.cuda.is_initialized())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "False"]
