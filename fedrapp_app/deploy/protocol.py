"""What the executor and its workers say to each other over their pipe (plain picklable dataclasses).

Executor -> worker: a ``TaskSpec`` per task, ``None`` to stop. Worker -> executor, per task and in this
order: ``Activated`` (the SuperNode moved the task to running), ``Pulled`` (the message's header is in the
worker's hands), ``Started`` (its content arrived whole: the ClientApp is being called), ``Done`` (reply and
task output pushed). A worker that dies mid-task leaves the executor the last of these it sent, which says how
the task can be recovered (see ``recovery``); a task that never reaches ``Started`` may be one whose message the
SuperNode gave up on (see ``pool``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskSpec:
    """One ClientApp task as the SuperNode's Runtime API handed it to the executor.

    Attributes
    ----------
    task_id, run_id : the SuperNode's ids of the task and of its run.
    fab_hash : SHA-256 of the run's app bundle (FAB).
    token : the task token (authenticates every Runtime API call of this task).
    runtime_api_address : the SuperNode's Runtime API, ``host:port``.
    insecure : connect without TLS.
    root_certificates_path : PEM file of the CA that signed the Runtime API's certificate (TLS), else None.
    acquired_at : ``time.time()`` when the executor acquired the task.
    pending_at : the SuperNode's creation time of the task (ISO 8601, '' if it did not say).
    """

    task_id: int
    run_id: int
    fab_hash: str
    token: str
    runtime_api_address: str
    insecure: bool
    root_certificates_path: str | None
    acquired_at: float
    pending_at: str = ""

    @property
    def key(self) -> tuple[int, str]:
        """What a worker is dedicated to: one run with one app bundle (its modules and caches belong to it)."""
        return (self.run_id, self.fab_hash)


@dataclass(frozen=True)
class Ready:
    """The worker started (forked from the preloaded server) and waits for tasks."""

    pid: int


@dataclass(frozen=True)
class Activated:
    """The task's input (context, run, FAB) was pulled: the SuperNode now counts the task as running."""

    task_id: int


@dataclass(frozen=True)
class Pulled:
    """The task's message was pulled; ``header`` is its ``flwr.proto`` Message without content (bytes)."""

    task_id: int
    header: bytes
    node_id: int


@dataclass(frozen=True)
class Started:
    """The task's message arrived whole (its content pulled from the SuperNode): the ClientApp is loaded and
    called next. Until then a task waits on the SuperNode, which may have given the message up."""

    task_id: int


@dataclass(frozen=True)
class Done:
    """The task ended: reply (if any) and task output pushed.

    Attributes
    ----------
    status : ``"completed"`` or ``"failed"`` (Flower's task sub-status).
    details : why it failed ('' when completed); the ClientApp's own error reply is in ``reply_error``.
    reply_error : reason of the error reply the ClientApp returned ('' when it replied with content).
    seconds : wall time per phase (``pull``, ``load``, ``app``, ``push``, ``total``).
    cpu_seconds : CPU time (user + system) of the worker during the task.
    rss_bytes : the worker's resident memory after the task.
    exit_after : the worker ends after this task (the app raised a BaseException such as SystemExit).
    cpu_app_seconds : the part of ``cpu_seconds`` spent in the ClientApp's call.
    """

    task_id: int
    status: str
    details: str
    reply_error: str
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    rss_bytes: int = 0
    exit_after: bool = False
    cpu_app_seconds: float = 0.0
