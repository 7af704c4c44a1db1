"""The executor's warm workers: one per (run, FAB hash), forked from a preloaded server, replaced when they die.

A worker process is forked from a multiprocessing forkserver that has imported the heavy libraries once
(``preload``), so a new run's worker starts in a fraction of a second and loads only the app and its model.
It then serves every task of its run (``worker``). At most ``max_workers`` workers live at once; an idle
one is stopped after ``idle_timeout`` seconds, or to make room for a new run's worker (least recently used
first), so a finished run's model does not hold memory forever.

A worker that dies is noticed by its process sentinel. If it held a task: not yet activated, the task goes
to a fresh worker (once); activated, the executor answers it as crashed (``recovery``). Either way the next
task of that run gets a new worker: the node, the executor and the other workers go on.

A SuperNode serves one message at a time: it creates a task, fetches the message's content from the SuperLink,
and waits for the reply before it takes the next message. The exception is a message the SuperNode gives up on
while fetching it without ending its task (Flower 1.42: a run that stopped meanwhile, as after a SuperLink crash;
``RunNotRunningException`` is not an ``Exception`` there, so the message stays in its store and the task stays
running): its worker waits for content that never comes (Flower's limit is two hours) and keeps its model in
memory. Such a task is **reaped**: its worker is stopped and the task ended as failed, without a reply
(``recovery.end_abandoned_task``), as soon as

- a newer task arrives while the task's content has still not arrived (``Started``): the SuperNode only takes a
  new message once the previous one's reply is in, and a reply needs the content, so it went on without it; or
- the content has not arrived after ``orphan_timeout`` seconds (a message of this app is a few prompts: seconds).

Every worker counts against ``max_workers``, busy or idle: a task that needs a new worker while every slot is
busy waits for one (in practice only the moment between a task's reply and its end, when the SuperNode already
hands out the next message). A task of a run whose worker is busy waits for that worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from flwr.supercore import log

from fedrapp_app.deploy.protocol import Activated, Done, Pulled, Ready, Started, TaskSpec
from fedrapp_app.deploy.recovery import answer_orphaned_task, end_abandoned_task
from fedrapp_app.deploy.worker import worker_main

#: Imported once by the worker server: the libraries every round needs (see ``preload``).
DEFAULT_PRELOAD = ("fedrapp_app.deploy.preload",)
#: How many times a task that no worker activated is handed to a fresh worker.
MAX_RESUBMITS = 1
#: Seconds a task may wait for its message's content before it is taken for one the SuperNode gave up on.
ORPHAN_TIMEOUT = 300.0


@dataclass
class TaskRecord:
    """What the pool reports for every task it ended (``on_done``)."""

    spec: TaskSpec
    done: Done
    worker_pid: int
    worker_tasks: int  # tasks this worker has served, this one included (1 = its first: it loaded the app)
    dispatched_at: float  # time.time() when the task was sent to the worker
    ended_at: float  # time.time() when the pool learned the outcome


@dataclass
class _Worker:
    key: tuple[int, str]
    process: BaseProcess
    conn: Connection
    last_used: float
    task: TaskSpec | None = None
    progress: Activated | Pulled | None = None
    started: bool = False  # the task's message arrived whole (``Started``)
    dispatched_at: float = 0.0
    served: int = 0
    resubmits: dict[int, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return int(self.process.pid or 0)


def exit_text(exitcode: int | None) -> str:
    """``"SIGKILL"``, ``"exit code 1"``: how a process ended, as a person reads it."""
    if exitcode is None:
        return "an unknown status"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class WarmPool:
    """Warm workers keyed by ``TaskSpec.key``; one task per worker at a time, the next task of a busy worker's run
    queued for it."""

    def __init__(
        self,
        *,
        max_workers: int = 1,
        idle_timeout: float = 1800.0,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        on_done: Callable[[TaskRecord], None] | None = None,
        target: Callable[..., None] = worker_main,
        answer: Callable[[TaskSpec, Pulled | None, str], bool] = answer_orphaned_task,
        orphan_timeout: float = ORPHAN_TIMEOUT,
        end: Callable[[TaskSpec, str], bool] = end_abandoned_task,
    ) -> None:
        """``target(conn, executor_pid, preload)`` is the worker's main function, ``answer`` what answers a dead
        worker's activated task and ``end`` what ends a reaped one (all replaceable for tests)."""
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be > 0 seconds, got {idle_timeout}")
        if orphan_timeout <= 0:
            raise ValueError(f"orphan_timeout must be > 0 seconds, got {orphan_timeout}")
        self.max_workers = max_workers
        self.idle_timeout = idle_timeout
        self.orphan_timeout = orphan_timeout
        self.preload = tuple(preload)
        self.on_done = on_done or (lambda record: None)
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(self.preload))
        self._workers: dict[tuple[int, str], _Worker] = {}
        self._queued: dict[tuple[int, str], list[TaskSpec]] = {}
        self._waiting: list[TaskSpec] = []  # tasks of runs without a worker, while every slot is busy
        self._target = target
        self._answer = answer
        self._end = end

    def start(self) -> None:
        """Start the worker server now, so that its imports are paid before the first task arrives."""
        multiprocessing.forkserver.ensure_running()

    @property
    def busy(self) -> bool:
        """A task is in flight or queued."""
        return (
            any(w.task is not None for w in self._workers.values()) or any(self._queued.values()) or bool(self._waiting)
        )

    def in_flight(self) -> list[tuple[TaskSpec, float]]:
        """The tasks in flight, each with the seconds since it was sent to its worker."""
        now = time.time()
        return [(w.task, now - w.dispatched_at) for w in self._workers.values() if w.task is not None]

    def worker_pids(self) -> dict[tuple[int, str], int]:
        """The live workers' process ids by key."""
        return {key: w.pid for key, w in self._workers.items()}

    def submit(self, spec: TaskSpec) -> None:
        """Send ``spec`` to its run's worker, starting one (and stopping the least recently used idle one) if
        needed; a task still waiting for its message's content is reaped first: the SuperNode went on without it."""
        for worker in list(self._workers.values()):
            if worker.task is not None and not worker.started and worker.task.task_id != spec.task_id:
                self._reap(
                    worker,
                    f"the SuperNode went on to task {spec.task_id} of run {spec.run_id} while this task still waited "
                    "for its message's content: it gave the message up",
                )
        self._place(spec)

    def _place(self, spec: TaskSpec) -> None:
        worker = self._workers.get(spec.key)
        if worker is not None and not worker.process.is_alive():
            self._drain(worker)  # it died idle and nobody has looked yet: bury it first
            worker = self._workers.get(spec.key)
        if worker is not None and worker.task is not None:  # its run's worker is busy: the task waits for it
            log(INFO, "task %d of run %d waits for task %d of its run", spec.task_id, spec.run_id, worker.task.task_id)
            self._queued.setdefault(spec.key, []).append(spec)
            return
        if worker is None:
            if not self._make_room():
                busy = ", ".join(f"{w.pid} (run {w.key[0]})" for w in self._workers.values())
                log(
                    INFO,
                    "task %d of run %d waits for a worker slot (--max-workers %d, busy: %s)",
                    spec.task_id,
                    spec.run_id,
                    self.max_workers,
                    busy,
                )
                self._waiting.append(spec)
                return
            worker = self._spawn(spec.key)
        self._dispatch(worker, spec)

    def _place_waiting(self) -> None:
        """Give the tasks waiting for a worker slot the slots that are free now, oldest first."""
        while self._waiting:
            spec = self._waiting[0]
            full = spec.key not in self._workers and len(self._workers) >= self.max_workers
            if full and not any(w.task is None for w in self._workers.values()):
                return
            self._waiting.pop(0)
            self._place(spec)

    def _dispatch(self, worker: _Worker, spec: TaskSpec) -> None:
        worker.task, worker.progress, worker.started, worker.dispatched_at = spec, None, False, time.time()
        with contextlib.suppress(OSError):  # it died just now: its burial hands the task to a fresh worker
            worker.conn.send(spec)

    def _next_queued(self, key: tuple[int, str]) -> None:
        """Send the oldest task queued for ``key`` to its run's worker (a new one if it has none)."""
        queue = self._queued.get(key)
        if not queue:
            self._queued.pop(key, None)
            return
        worker = self._workers.get(key)
        if worker is not None and worker.task is not None:
            return
        if worker is None and not self._make_room():  # its worker is gone and every slot is busy: wait for one
            self._waiting.extend(self._queued.pop(key))
            return
        spec = queue.pop(0)
        if worker is None:
            worker = self._spawn(key)
        self._dispatch(worker, spec)

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for news from the workers, then handle all of it."""
        handles: list[object] = []
        for worker in self._workers.values():
            handles += [worker.conn, worker.process.sentinel]
        if not handles:
            time.sleep(timeout)
            return
        for ready in wait(handles, timeout):
            for worker in list(self._workers.values()):
                if ready is worker.conn or ready == worker.process.sentinel:
                    self._drain(worker)

    def reconcile(self) -> None:
        """Stop workers idle for longer than ``idle_timeout`` (a finished run's model is then freed), and reap a task
        whose message's content has not arrived after ``orphan_timeout``."""
        now = time.time()
        for worker in list(self._workers.values()):
            if worker.task is not None and not worker.started and now - worker.dispatched_at > self.orphan_timeout:
                self._reap(
                    worker,
                    f"its message's content has not arrived after {now - worker.dispatched_at:.0f} s (the SuperNode "
                    "gave it up, e.g. after a SuperLink crash)",
                )
        for worker in list(self._workers.values()):
            if worker.task is None and now - worker.last_used > self.idle_timeout:
                log(
                    INFO,
                    "fedrapp worker %d (run %d) idle for %.0f s: stopped",
                    worker.pid,
                    worker.key[0],
                    now - worker.last_used,
                )
                self._stop(worker)

    def close(self) -> None:
        """Stop every worker (a busy one is terminated: Flower's task expiry then answers its message)."""
        for worker in list(self._workers.values()):
            self._stop(worker)

    def _reap(self, worker: _Worker, why: str) -> None:
        """Stop ``worker``, whose task's message the SuperNode gave up on, and end that task as failed without a
        reply; its run's next task gets a fresh worker."""
        spec = worker.task
        assert spec is not None
        self._workers.pop(worker.key, None)
        worker.process.kill()
        worker.process.join()
        worker.conn.close()
        reason = f"task {spec.task_id} of run {spec.run_id} reaped: {why}; its worker {worker.pid} was stopped"
        try:
            ended = self._end(spec, reason)
        except Exception as err:  # noqa: BLE001 - the token's expiry ends the task too
            log(WARNING, "task %d: could not end it (%s); its token expires by itself", spec.task_id, err)
            ended = False
        log(WARNING, "%s%s", reason, "" if ended else " (the SuperNode had ended it already)")
        done = Done(spec.task_id, "failed", reason, "")
        self.on_done(TaskRecord(spec, done, worker.pid, worker.served + 1, worker.dispatched_at, time.time()))
        self._next_queued(worker.key)
        self._place_waiting()

    # -- internals -------------------------------------------------------------------------------------

    def _spawn(self, key: tuple[int, str]) -> _Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=self._target, args=(child, os.getpid(), self.preload), name=f"fedrapp-worker-run{key[0]}"
        )
        process.start()
        child.close()
        worker = _Worker(key, process, parent, last_used=time.time())
        self._workers[key] = worker
        log(INFO, "fedrapp worker %d started for run %d", worker.pid, key[0])
        return worker

    def _make_room(self) -> bool:
        """Stop idle workers, least recently used first, until a new one fits under ``max_workers``; False when
        every slot is busy."""
        idle = sorted((w for w in self._workers.values() if w.task is None), key=lambda w: w.last_used)
        while len(self._workers) >= self.max_workers and idle:
            oldest = idle.pop(0)
            log(INFO, "fedrapp worker %d (run %d) stopped to make room for a new run", oldest.pid, oldest.key[0])
            self._stop(oldest)
        return len(self._workers) < self.max_workers

    def _stop(self, worker: _Worker, grace: float = 5.0) -> None:
        self._workers.pop(worker.key, None)
        if worker.task is None:
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(None)
            worker.process.join(grace)
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(grace)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.conn.close()

    def _drain(self, worker: _Worker) -> None:
        """Handle every message the worker sent; then, if its process ended, its death."""
        while True:
            try:
                if not worker.conn.poll():
                    break
                event = worker.conn.recv()
            except (EOFError, OSError):
                break
            self._handle(worker, event)
        if not worker.process.is_alive() and worker.key in self._workers:
            worker.process.join()
            self._buried(worker)

    def _handle(self, worker: _Worker, event: object) -> None:
        if isinstance(event, Ready):
            return
        if isinstance(event, Activated | Pulled):
            worker.progress = event
            return
        if isinstance(event, Started):
            worker.started = True
            return
        if isinstance(event, Done) and worker.task is not None:
            worker.served += 1
            record = TaskRecord(worker.task, event, worker.pid, worker.served, worker.dispatched_at, time.time())
            worker.task, worker.progress, worker.last_used = None, None, time.time()
            self.on_done(record)
            if worker.process.is_alive():
                self._next_queued(worker.key)
                self._place_waiting()

    def _buried(self, worker: _Worker) -> None:
        """A worker process ended: recover its task, if it held one; its run gets a new worker next time."""
        self._workers.pop(worker.key, None)
        worker.conn.close()
        how = exit_text(worker.process.exitcode)
        spec = worker.task
        if spec is None:
            log(
                INFO if worker.process.exitcode == 1 else WARNING,
                "fedrapp worker %d (run %d) ended with %s",
                worker.pid,
                worker.key[0],
                how,
            )
            self._next_queued(worker.key)
            self._place_waiting()
            return
        reason = (
            f"the ClientApp's worker process (pid {worker.pid}) died with {how} while serving this message; "
            "fedrapp-superexec replaced it"
        )
        log(WARNING, "task %d of run %d: %s", spec.task_id, spec.run_id, reason)
        resubmits = worker.resubmits.get(spec.task_id, 0)
        if worker.progress is None and resubmits < MAX_RESUBMITS:
            # Not activated: the SuperNode still holds the task as starting, so the same token can serve it.
            self._make_room()
            fresh = self._spawn(spec.key)
            fresh.resubmits[spec.task_id] = resubmits + 1
            fresh.task, fresh.dispatched_at = spec, worker.dispatched_at
            fresh.conn.send(spec)
            return
        pulled = worker.progress if isinstance(worker.progress, Pulled) else None
        try:
            answered = self._answer(spec, pulled, reason)
        except Exception as err:  # noqa: BLE001 - the node must go on; Flower's expiry answers the message then
            log(WARNING, "task %d: could not answer it (%s); Flower's task expiry will", spec.task_id, err)
            answered = False
        done = Done(spec.task_id, "failed", reason if answered else reason + " (left to Flower's task expiry)", "")
        self.on_done(TaskRecord(spec, done, worker.pid, worker.served + 1, worker.dispatched_at, time.time()))
        self._next_queued(worker.key)
        self._place_waiting()
