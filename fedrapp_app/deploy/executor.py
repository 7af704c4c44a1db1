"""The executor loop: Flower's SuperExec loop, with ClientApp tasks served by warm workers.

``flower-superexec`` (``flwr/supercore/superexec/run_superexec.py``) acquires tasks from the SuperNode's
Runtime API and hands each to an executor, which starts a fresh ``flwr-clientapp`` process per task. This
loop is the same, built from the same Flower classes (the Runtime API client and its interceptors, the
``AutoExecPlugin`` task routing, ``SubprocessExecutor`` for the task types we do not serve warm), except
that ClientApp tasks go to a ``WarmPool``. It asks for a task every ``poll_interval`` while none is in
flight and every ``BUSY_POLL_INTERVAL`` while one is (a SuperNode serves one message at a time, so a task
arriving while one still waits for its message's content means the SuperNode gave that message up: the pool
reaps that task and serves the new one), and wakes up as soon as a worker reports.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from logging import ERROR, INFO, WARNING
from pathlib import Path

from flwr.proto.runtime_pb2 import AcquireTaskRequest
from flwr.proto.task_pb2 import Task
from flwr.supercore import log
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.grpc_health import run_health_server_grpc_no_tls
from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
from flwr.supercore.protobuf.client import ProtobufClientInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor
from flwr.supercore.superexec.executor import LaunchResult, LaunchResultStatus, SubprocessExecutor
from flwr.supercore.superexec.plugin import AutoExecPlugin
from flwr.supercore.tls import validate_and_resolve_root_certificates

from fedrapp_app.deploy.pool import DEFAULT_PRELOAD, TaskRecord, WarmPool
from fedrapp_app.deploy.protocol import TaskSpec

#: The Runtime API method SuperExec authentication protects (as in Flower's SuperExec).
_AUTH_METHODS = frozenset({"/flwr.proto.Runtime/AcquireTask"})
#: Seconds between asks for a task while one is in flight. Flower 1.42's SuperNode can give up on a message
#: without ending its task (a run that stopped while the SuperNode fetched the message, as after a SuperLink
#: restart): that task's worker then waits for content that never comes, while the SuperNode has gone on to the
#: next run's messages. Before the executor asked while a task was in flight, a resumed run's discovery went
#: unanswered on such a node for 140 s (measured); now its arrival also reaps the waiting task (``pool``).
BUSY_POLL_INTERVAL = 1.0


@dataclass(frozen=True)
class ExecutorOptions:
    """How ``fedrapp-superexec`` was started (see ``cli`` for each option's meaning)."""

    runtime_api_address: str
    insecure: bool = False
    root_certificates_path: str | None = None
    auth_secret: bytes | None = None
    parent_pid: int | None = None
    health_server_address: str | None = None
    poll_interval: float = 0.2
    max_workers: int = 1
    idle_timeout: float = 1800.0
    orphan_timeout: float = 300.0
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    stats_path: Path | None = None


def _epoch(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def stats_row(record: TaskRecord) -> dict:
    """One line of the ``--stats`` file: the task, its worker, its phases and where the time went.

    ``own_seconds`` is the executor's share of the task: from the SuperNode creating it to the worker
    reporting it done, minus the ClientApp's own call (None when the SuperNode gave no creation time).
    """
    done, spec = record.done, record.spec
    pending = _epoch(spec.pending_at)
    span = None if pending is None else record.ended_at - pending
    return {
        "task_id": spec.task_id,
        "run_id": spec.run_id,
        "worker_pid": record.worker_pid,
        "worker_tasks": record.worker_tasks,
        "status": done.status,
        "details": done.details,
        "reply_error": done.reply_error,
        "seconds": {k: round(v, 4) for k, v in done.seconds.items()},
        "cpu_seconds": round(done.cpu_seconds, 4),
        "cpu_app_seconds": round(done.cpu_app_seconds, 4),
        "rss_bytes": done.rss_bytes,
        "pending_at": pending,
        "acquired_at": spec.acquired_at,
        "dispatched_at": record.dispatched_at,
        "ended_at": record.ended_at,
        "span_seconds": None if span is None else round(span, 4),
        "own_seconds": None if span is None else round(span - done.seconds.get("app", 0.0), 4),
        "executor_cpu_seconds": round(time.process_time(), 4),
    }


class WarmExecPlugin(AutoExecPlugin):
    """Flower's task routing, with ClientApp tasks sent to the warm pool instead of a new process."""

    def __init__(self, options: ExecutorOptions, pool: WarmPool) -> None:
        super().__init__(
            runtime_api_address=options.runtime_api_address,
            insecure=options.insecure,
            root_certificates_path=options.root_certificates_path,
            runtime_dependency_install=False,
            executor=SubprocessExecutor(),
        )
        self.pool = pool

    def launch_task(self, token: str, task: Task) -> LaunchResult:
        if task.type != TaskType.CLIENT_APP:
            return super().launch_task(token, task)
        spec = TaskSpec(
            task_id=task.task_id,
            run_id=task.run_id,
            fab_hash=task.fab_hash,
            token=token,
            runtime_api_address=self.runtime_api_address,
            insecure=self.insecure,
            root_certificates_path=self.root_certificates_path,
            acquired_at=time.time(),
            pending_at=task.pending_at,
        )
        try:
            self.pool.submit(spec)
        except Exception as err:  # noqa: BLE001 - Flower's expiry returns the task to the queue
            return LaunchResult.failed(f"no warm worker could take it: {type(err).__name__}: {err}")
        return LaunchResult.accepted()


def stats_writer(path: Path | None) -> Callable[[TaskRecord], None]:
    """What the pool calls for every finished task: one log line, and a JSON line in ``path`` if given."""

    def write(record: TaskRecord) -> None:
        row, done = stats_row(record), record.done
        if " reaped: " in done.details:  # the pool said so in its own line
            outcome, level = "", 0
        elif done.status != "completed":
            outcome, level = f"failed ({done.details})", WARNING
        elif done.reply_error:
            outcome, level = f"error reply ({done.reply_error.splitlines()[0][:300]})", WARNING
        else:
            outcome, level = "ok", INFO
        if level:
            log(
                level,
                "task %d of run %d: %s in %.2f s (ClientApp %.2f s, own overhead %s s), worker %d, RSS %.0f MiB",
                row["task_id"],
                row["run_id"],
                outcome,
                done.seconds.get("total", 0.0),
                done.seconds.get("app", 0.0),
                row["own_seconds"],
                record.worker_pid,
                done.rss_bytes / 2**20,
            )
        if path is not None:
            with path.open("a") as out:
                out.write(json.dumps(row) + "\n")

    return write


def serve(options: ExecutorOptions) -> None:
    """Acquire and serve tasks until interrupted (SIGINT, SIGTERM, or the death of ``parent_pid``)."""
    if options.parent_pid is not None:
        start_parent_process_monitor(options.parent_pid)
    if options.stats_path is not None:
        options.stats_path.parent.mkdir(parents=True, exist_ok=True)
    pool = WarmPool(
        max_workers=options.max_workers,
        idle_timeout=options.idle_timeout,
        preload=options.preload,
        on_done=stats_writer(options.stats_path),
        orphan_timeout=options.orphan_timeout,
    )
    interceptors: list[ProtobufClientInterceptor] = [
        RuntimeTracingInterceptor(),
        RuntimeVersionHttpInterceptor(component_name="SuperExec"),
    ]
    if options.auth_secret:
        interceptors.append(
            SuperExecAuthHttpInterceptor(master_secret=options.auth_secret, protected_methods=_AUTH_METHODS)
        )
    health = run_health_server_grpc_no_tls(options.health_server_address) if options.health_server_address else None
    client = RuntimeHttpClient.from_server_address(
        server_address=options.runtime_api_address,
        insecure=options.insecure,
        root_certificates=validate_and_resolve_root_certificates(options.root_certificates_path, options.insecure),
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )
    plugin = WarmExecPlugin(options, pool)
    types = sorted(str(t) for t in plugin.supported_task_types)
    pool.start()
    log(
        INFO,
        "fedrapp-superexec %d serving %s (ClientApp tasks in warm workers)",
        os.getpid(),
        options.runtime_api_address,
    )
    try:
        asked = 0.0
        while True:
            pool.reconcile()
            in_flight = pool.in_flight()
            if not in_flight or time.monotonic() - asked >= max(options.poll_interval, BUSY_POLL_INTERVAL):
                asked = time.monotonic()
                response = client.AcquireTask(AcquireTaskRequest(supported_task_types=types, agentapp_fab_hashes=[]))
                if response.HasField("task") and response.token:
                    result = plugin.launch_task(response.token, response.task)
                    if result.status != LaunchResultStatus.ACCEPTED:
                        log(
                            ERROR, "task %d not launched (%s): %s", response.task.task_id, result.status, result.message
                        )
                    continue
            pool.wait(options.poll_interval)
    finally:
        pool.close()
        client.close()
        if health is not None:
            health.stop(grace=1)
