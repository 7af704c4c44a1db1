"""An in-process ``Grid``: runs the real ClientApp for N simulated nodes inside this process, without Ray.

Tests and the benchmark runner use it to drive the same ServerApp body, strategy and ClientApp code as
``flwr run``, deterministically and fast. Each node has its own ``Context`` (``node_config`` with
``partition-id`` / ``num-partitions`` as in Flower's simulation, persistent ``state``); a ClientApp that
raises produces an error reply and, as in Flower, loses that round's state update. ``drop`` lets a test
make nodes unreachable.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

CLIENT_APP_EXCEPTION = 2  # Flower's error code for "ClientApp raised"
SERVER_NODE_ID = 1  # Flower's SuperLink node id, the source of server messages


class InProcessGrid(Grid):
    """Deliver each message to ``client_app`` right away, in message order, and keep the replies."""

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: dict[str, Any],
        node_configs: list[dict[str, Any]] | None = None,
        run_id: int = 1,
    ) -> None:
        node_configs = node_configs or [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]
        self.client_app = client_app
        self.contexts = {
            1000 + i: Context(
                run_id=run_id, node_id=1000 + i, node_config=cfg, state=RecordDict(), run_config=dict(run_config)
            )
            for i, cfg in enumerate(node_configs)
        }
        self.drop: Callable[[Message], bool] = lambda message: False
        self._replies: dict[str, Message] = {}
        self._run = Run.create_empty(run_id)
        # Messages created in this process get their source identity from here (set by Flower's runtime).
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SERVER_NODE_ID

    def set_run(self, run: Run) -> None:  # noqa: D102 - Grid API
        self._run = run

    @property
    def run(self) -> Run:  # noqa: D102 - Grid API
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:  # noqa: D102 - Grid API
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102 - Grid API
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Run the ClientApp on each message now; an unreachable (dropped) node simply never replies."""
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            ids.append(message.metadata.message_id)
            if self.drop(message):
                continue
            context = self.contexts[message.metadata.dst_node_id]
            trial = copy.deepcopy(context)
            try:
                reply = self.client_app(message, trial)
            except Exception as err:  # noqa: BLE001 - a ClientApp failure is data for the server
                # The reason as a SuperNode's flwr-clientapp writes it (run_clientapp.py).
                reason = str(type(err)) + ":<'" + str(err) + "'>"
                reply = Message(Error(code=CLIENT_APP_EXCEPTION, reason=reason), reply_to=message)
            else:
                context.state = trial.state
            self._replies[message.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102 - Grid API
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push, then pull everything that was answered (timeouts do not apply in-process)."""
        return self.pull_messages(list(self.push_messages(messages)))
