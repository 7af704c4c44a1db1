"""Talking to the SuperNode's Runtime API for one task: the token-bound client and the task heartbeat.

Built from Flower's own pieces (``RuntimeHttpClient`` and the interceptors ``flwr-clientapp`` uses), so a
warm worker speaks to the SuperNode exactly as Flower's per-task process does.
"""

from __future__ import annotations

import _thread
import signal
import threading

import httpx
from flwr.common.constant import MAX_RETRY_DELAY
from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import RetryInvoker, exponential
from flwr.supercore.retry.http_retry import _RETRYABLE_STATUS_CODES, _RETRYABLE_TRANSPORT_ERRORS
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor
from flwr.supercore.tls import validate_and_resolve_root_certificates

from fedrapp_app.deploy.protocol import TaskSpec


def task_retry_invoker(max_time: float | None = None) -> RetryInvoker:
    """Flower's HTTP retry policy for a task's calls, without its exit for one-task processes.

    Flower's invoker (``make_simple_http_retry_invoker``) retries connection errors and HTTP 502/503/504
    with exponential backoff, and on HTTP 401 (the task token is no longer valid) sends SIGINT to its own
    process: that ends a ``flwr-clientapp``, but would end a warm worker, or the executor itself while it
    answers a dead worker's task. Here every HTTP error other than 502/503/504 is raised to the caller,
    which fails that task only. ``max_time`` bounds the retries (None: retry while the SuperNode is down).
    """

    def give_up(err: Exception) -> bool:
        return isinstance(err, httpx.HTTPStatusError) and err.response.status_code not in _RETRYABLE_STATUS_CODES

    return RetryInvoker(
        wait_gen_factory=lambda: exponential(max_delay=MAX_RETRY_DELAY),
        recoverable_exceptions=(*_RETRYABLE_TRANSPORT_ERRORS, httpx.HTTPStatusError),
        max_tries=None,
        max_time=max_time,
        should_giveup=give_up,
    )


def task_client(spec: TaskSpec, max_time: float | None = None) -> tuple[RuntimeHttpClient, RetryInvoker]:
    """A Runtime API client that authenticates as ``spec``'s task (as ``flwr-clientapp`` builds it, with
    ``task_retry_invoker``)."""
    retry_invoker = task_retry_invoker(max_time)
    client = RuntimeHttpClient.from_server_address(
        server_address=spec.runtime_api_address,
        insecure=spec.insecure,
        root_certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
        interceptors=[
            RuntimeTracingInterceptor(),
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            RuntimeTokenHttpInterceptor(spec.token),
        ],
        retry_invoker=retry_invoker,
    )
    return client, retry_invoker


def take_sigint() -> None:
    """Make SIGINT raise ``KeyboardInterrupt`` in this process again.

    The executor and its workers rely on it: a lost task's heartbeat interrupts the ClientApp, and Flower's parent
    monitor sends SIGINT when the parent dies. A process started with SIGINT ignored (``fedrapp-superexec ... &``
    from a script, ``nohup``: a background job of a non-interactive shell ignores SIGINT, and so do the processes it
    starts) would otherwise ignore both: an orphaned executor, a ClientApp that runs on for a task that is gone.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)


class TaskHeartbeat:
    """Flower's task heartbeat, for a process that outlives its tasks.

    Flower's heartbeat function raises SIGINT in the process when the SuperNode answers that the task is
    no longer alive (the run was stopped, the task expired): fine for a process that serves one task, fatal
    for a worker that serves many. Here that answer interrupts the main thread only while the task is
    armed (``KeyboardInterrupt`` in the ClientApp, which the worker turns into a failed task and a restart),
    and the heartbeat is disarmed and stopped before the task's output is pushed, so the SuperNode never
    sees a heartbeat for a finished task.
    """

    def __init__(self, client: RuntimeHttpClient) -> None:
        self._request = SendTaskHeartbeatRequest()
        self._client = client
        self._lock = threading.Lock()
        self._armed = True
        self.lost = False
        self._sender = HeartbeatSender(self._beat)

    def _beat(self) -> bool:
        try:
            response = self._client.SendTaskHeartbeat(self._request)
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if err.response.status_code in (httpx.codes.SERVICE_UNAVAILABLE, httpx.codes.GATEWAY_TIMEOUT):
                return False
            self._lose()  # the token is refused: the SuperNode no longer has this task
            return True
        if not response.success:
            self._lose()
        return True

    def _lose(self) -> None:
        with self._lock:
            if self._armed and not self.lost:
                self.lost = True
                _thread.interrupt_main()

    def start(self) -> None:
        self._sender.start()

    def stop(self) -> None:
        """Disarm, then stop the sender thread (idempotent; a sender whose thread died is left alone)."""
        with self._lock:
            self._armed = False
        if self._sender.is_running:
            self._sender.stop()
