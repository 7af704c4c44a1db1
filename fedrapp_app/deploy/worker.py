"""A warm worker: one long-lived process that serves the ClientApp tasks of one run, one task at a time.

Each task goes through the steps of Flower's ``flwr-clientapp`` (``flwr/supernode/runtime/run_clientapp.py``),
with Flower's own functions where they fit: pull the task input and the message, install the app bundle
(FAB), load the ClientApp, call it, push the reply and the task output. What differs is what happens
between tasks: the process stays, so the ClientApp's module-level caches (the frozen model, the streams)
survive from one round to the next, and the FAB is installed and loaded once per worker.

A worker is dedicated to one (run, FAB hash) pair (``TaskSpec.key``), so the modules a FAB brings, the
process-wide state they keep, and ``sys.path`` entries never reach another run. It is forked from a server
process that has already imported the heavy libraries (``fedrapp_app.deploy.preload``).

Failures, as in Flower: an exception of the ClientApp becomes an error reply for that message (the worker
goes on); a ``BaseException`` (``SystemExit``, an interrupt, a lost task) fails the message and ends the
worker, which the executor replaces.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from logging import DEBUG, ERROR
from multiprocessing.connection import Connection
from pathlib import Path

from flwr.app import Context, Message
from flwr.app.error import Error
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import ClientApp, LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.config import get_project_dir
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
from flwr.supercore import log
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.fab import Fab
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.run import Run
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fedrapp_app.deploy.protocol import Activated, Done, Pulled, Ready, Started, TaskSpec
from fedrapp_app.deploy.runtime import TaskHeartbeat, take_sigint, task_client

Send = Callable[[object], None]
#: Waits (s) between pulls of a message object that is not there yet: from 0.05 s, doubling up to 0.25 s.
#: The SuperNode creates the task before it has fetched the message's objects from the SuperLink; a warm
#: worker asks for them at once. Flower's waits (1 s doubling up to 10 s, sized for a fresh process that
#: arrives seconds later) made a warm worker late by up to a second for data due in milliseconds. Without a
#: cap on tries, Flower's time limit (``PULL_MAX_TIME``) still bounds the wait.
PULL_FIRST_RETRY = 0.05
PULL_RETRY_CAP = 0.25


def rss_bytes() -> int:
    """Resident memory of this process (bytes), from ``/proc/self/statm``."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def shadowed_preloads(app_dir: Path, preloaded: tuple[str, ...]) -> list[str]:
    """Top-level names the app bundle in ``app_dir`` ships that the worker already imported at preload.

    Python keeps the preloaded module, so the bundle's own copy would silently never run. A folder without
    ``__init__.py`` does not count: it is at most a namespace portion, which a regular package wins over
    (a bundle may hold such folders, e.g. a package's documentation without its code).
    """
    tops = sorted({name.split(".")[0] for name in preloaded})
    return [name for name in tops if (app_dir / name / "__init__.py").is_file() or (app_dir / f"{name}.py").is_file()]


class AppLoader:
    """Installs a run's FAB and loads its ClientApp once, then hands out the same ClientApp."""

    def __init__(self, preloaded: tuple[str, ...] = ()) -> None:
        self.preloaded = preloaded
        self._loaded: tuple[str, ClientApp] | None = None

    def client_app(self, run: Run, fab: Fab) -> ClientApp:
        """The ClientApp of ``run``'s bundle ``fab`` (installed and imported at the first call)."""
        if self._loaded is not None:
            if self._loaded[0] != fab.hash_str:  # the pool keys workers by FAB hash: this is a bug, not input
                raise LoadClientAppError(
                    f"this worker serves FAB {self._loaded[0][:12]}, not {fab.hash_str[:12]}: restart fedrapp-superexec"
                )
            return self._loaded[1]
        install_from_fab(fab.content, skip_prompt=True)
        app_dir = get_project_dir(run.fab_id, run.fab_version, fab.hash_str)
        shadowed = shadowed_preloads(app_dir, self.preloaded)
        if shadowed:
            raise LoadClientAppError(
                f"the app bundle ships {', '.join(shadowed)}, which fedrapp-superexec preloads from the installed "
                "packages, so the bundle's copy would not run; start fedrapp-superexec with --preload '' "
                "(or with a --preload list without them)"
            )
        load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        app = load(run.fab_id, run.fab_version, fab.hash_str)
        self._loaded = (fab.hash_str, app)
        return app


def pull_input(
    client: RuntimeHttpClient, spec: TaskSpec, send: Send, seconds: dict[str, float]
) -> tuple[Message, Context, Run, Fab]:
    """Flower's ``pull_task_input``, with the executor told after each of its two steps.

    After ``PullTaskInput`` the SuperNode counts the task as running (``Activated``); after ``PullMessages``
    the message is out of the SuperNode's queue (``Pulled``, with its header, so the executor can still
    answer it if this process dies).
    """
    started = time.perf_counter()
    response = client.PullTaskInput(PullTaskInputRequest())
    seconds["pull-input"] = time.perf_counter() - started
    send(Activated(spec.task_id))
    TaskIdentity.task_id = response.task_id
    TaskIdentity.run_id = response.run.run_id
    TaskIdentity.node_id = response.context.node_id
    context = context_from_proto(response.context)
    run = run_from_proto(response.run)
    fab = fab_from_proto(response.fab)

    started = time.perf_counter()
    pulled = client.PullMessages(PullAppMessagesRequest())
    seconds["pull-message"] = time.perf_counter() - started
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    send(Pulled(spec.task_id, pulled.messages_list[0].SerializeToString(), context.node_id))
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    started = time.perf_counter()
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
        initial_backoff=PULL_FIRST_RETRY,
        backoff_cap=PULL_RETRY_CAP,
        max_tries_per_object=None,
    )
    # mostly waiting for the SuperNode to download the message from the SuperLink (see PULL_FIRST_RETRY)
    seconds["pull-objects"] = time.perf_counter() - started
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower does: not part of the deflated message
    return message, context, run, fab


def _error_reply(err: BaseException, message: Message) -> Message:
    """The error reply ``flwr-clientapp`` sends for an exception of the ClientApp (same code, same reason)."""
    code = (
        ErrorCode.LOAD_CLIENT_APP_EXCEPTION
        if isinstance(err, LoadClientAppError)
        else ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    )
    reason = str(type(err)) + ":<'" + str(err) + "'>"
    if isinstance(err, LoadClientAppError):
        reason = "An exception was raised when attempting to load `ClientApp`: " + str(err)
    return Message(Error(code=code, reason=reason), reply_to=message)


def serve_task(spec: TaskSpec, loader: AppLoader, send: Send) -> Done:
    """Serve one task end to end; never raises (the outcome is in the returned ``Done``)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    seconds: dict[str, float] = {}
    client, retry_invoker = task_client(spec)
    heartbeat = TaskHeartbeat(client)
    message: Message | None = None
    context: Context | None = None
    reply: Message | None = None
    status, details, exit_after = SubStatus.FAILED, "ClientApp task failed due to unknown reason", False
    cpu_app = 0.0
    try:
        heartbeat.start()
        message, context, run, fab = pull_input(client, spec, send, seconds)
        send(Started(spec.task_id))
        seconds["pull"] = time.perf_counter() - started
        mark = time.perf_counter()
        app = loader.client_app(run, fab)
        seconds["load"] = time.perf_counter() - mark
        mark, cpu_mark = time.perf_counter(), time.process_time()
        reply = app(message=message, context=context)
        seconds["app"], cpu_app = time.perf_counter() - mark, time.process_time() - cpu_mark
        status, details = SubStatus.COMPLETED, ""
    except BaseException as err:  # noqa: BLE001 - every outcome is reported to the SuperNode, as flwr-clientapp does
        exit_after = not isinstance(err, Exception) or heartbeat.lost
        log(ERROR, "ClientApp raised an exception (task %d of run %d)", spec.task_id, spec.run_id, exc_info=err)
        details = (
            "task lost: the SuperNode no longer knows it"
            if heartbeat.lost
            else str(type(err)) + ":<'" + str(err) + "'>"
        )
        if message is not None:
            reply = _error_reply(err, message)
    finally:
        heartbeat.stop()  # before the task output: no heartbeat may reach a finished task
        mark = time.perf_counter()
        if reply is not None and context is not None:
            try:
                push_message(client, reply, context)
            except Exception as err:  # noqa: BLE001 - as flwr-clientapp: logged, the task output still goes out
                log(ERROR, "Failed to push reply message", exc_info=err)
        retry_invoker.max_tries = 1  # as flwr-clientapp's exit: do not block on the task output
        push_task_output(client=client, context=context, sub_status=status, details=details)
        client.close()
        seconds["push"] = time.perf_counter() - mark
    seconds["total"] = time.perf_counter() - started
    reply_error = reply.error.reason if reply is not None and reply.has_error() else ""
    return Done(
        spec.task_id,
        "completed" if status == SubStatus.COMPLETED else "failed",
        details,
        reply_error,
        seconds,
        time.process_time() - cpu_started,
        rss_bytes(),
        exit_after,
        cpu_app,
    )


def worker_main(conn: Connection, executor_pid: int, preloaded: tuple[str, ...]) -> None:
    """The worker process: serve the tasks the executor sends until it sends ``None`` or goes away."""
    take_sigint()  # the heartbeat and the parent monitor below interrupt through SIGINT
    start_parent_process_monitor(executor_pid)  # SIGINT here when the executor dies (we are the forkserver's child)
    loader = AppLoader(preloaded)
    conn.send(Ready(os.getpid()))
    log(DEBUG, "fedrapp worker %d ready", os.getpid())
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if spec is None:
            return
        done = serve_task(spec, loader, conn.send)
        conn.send(done)
        if done.exit_after:
            sys.exit(1)


__all__ = ["AppLoader", "pull_input", "rss_bytes", "serve_task", "shadowed_preloads", "worker_main"]
