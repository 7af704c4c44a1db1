"""Answering a task whose worker died, so the round goes on at once instead of after Flower's task expiry.

When ``flwr-clientapp`` is killed, the SuperNode notices only when the task's heartbeat expires (about a
minute), then answers the message with "ClientApp stopped responding". The executor holds the task's token
and knows how far the worker got (``protocol``), so it can do better:

- before ``Activated``: the SuperNode still counts the task as starting; the token stays valid, and the
  executor gives the same task to a fresh worker (``pool``; not here);
- after ``Activated`` (the message may or may not have been pulled) or ``Pulled``: the executor answers the
  message with a ``CLIENT_APP_CRASHED`` error reply and ends the task as failed, leaving the node's context
  as it was (what a killed ``flwr-clientapp`` leaves too).

A task whose message the SuperNode gave up on (``pool``: its worker stopped before the content arrived) is ended
as failed **without** a reply (``end_abandoned_task``): nobody waits for one, and a reply left in the SuperNode's
store would be sent in place of the next message's, whose own reply then waits for a message that never comes.
"""

from __future__ import annotations

from logging import WARNING

import httpx
from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import message_from_proto
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PushTaskOutputRequest
from flwr.supercore import log
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fedrapp_app.deploy.protocol import Pulled, TaskSpec
from fedrapp_app.deploy.runtime import task_client

#: Seconds the executor keeps retrying to answer a dead worker's task before leaving it to Flower's expiry
#: (it serves no other task meanwhile).
RECOVERY_MAX_TIME = 10.0


def answer_orphaned_task(spec: TaskSpec, pulled: Pulled | None, reason: str) -> bool:
    """Reply to ``spec``'s message with a crash error and finish the task as failed.

    ``pulled`` is the header the worker sent, if it got that far; otherwise the message is pulled here
    (it is still queued when the worker died before pulling it). Returns False when there is no message to
    answer (the dead worker pulled it without saying so): Flower's task expiry answers it then.
    """
    client, retry_invoker = task_client(spec, max_time=RECOVERY_MAX_TIME)
    try:
        if pulled is not None:
            header = ProtoMessage.FromString(pulled.header)
        else:
            queued = client.PullMessages(PullAppMessagesRequest())
            if not queued.messages_list:
                log(
                    WARNING,
                    "task %d: its message left the queue with the dead worker; Flower's expiry answers it",
                    spec.task_id,
                )
                return False
            header = queued.messages_list[0]
        message = message_from_proto(header)
        reply = Message(Error(code=ErrorCode.CLIENT_APP_CRASHED, reason=reason), reply_to=message)
        node = Context(
            run_id=message.metadata.run_id,
            node_id=message.metadata.dst_node_id,
            node_config={},
            state=RecordDict(),
            run_config={},
        )
        push_message(client, reply, node)
        retry_invoker.max_tries = 1
        push_task_output(client=client, context=None, sub_status=SubStatus.FAILED, details=reason)
        return True
    finally:
        client.close()


def end_abandoned_task(spec: TaskSpec, reason: str) -> bool:
    """End ``spec``'s task as failed with ``reason`` and no reply (its message was given up by the SuperNode).
    Returns False when the SuperNode did not take it (it had ended the task itself, or is gone): the task then ends
    by itself when its token expires, a minute after its last heartbeat."""
    client, _ = task_client(spec, max_time=RECOVERY_MAX_TIME)
    try:
        client.PushTaskOutput(PushTaskOutputRequest(sub_status=SubStatus.FAILED, details=reason))
        return True
    except httpx.HTTPError:  # best effort: the token's expiry ends the task too
        return False
    finally:
        client.close()
