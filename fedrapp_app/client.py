"""ClientApp: each round, adapt the received prompt on the next batch of this client's stream and reply.

State that survives between rounds lives in ``context.state`` (the stream position and the local method's
state: AdaPrompt's buffer, optimizer moments, step counters), because the process that serves a node may
change between rounds. The frozen model and the class-name buffers are cached per process (keyed by what
determines them), the streams by the data layer: in simulation one process serves many nodes in turn.

Labels are read in exactly one place, ``_score``, to count correct predictions for the report.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedrapp_app.attacks import poisoned_upload
from fedrapp_app.checkpoint import load_client_snapshot, save_client_snapshot
from fedrapp_app.config import RunConfig, attack_clients
from fedrapp_app.data import ClientStream, build_client_stream
from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.methods import LocalMethod, make_method
from fedrapp_app.records import (
    CONFIG,
    INFO,
    METRICS,
    PROMPT,
    arrays_to_record,
    prompt_to_record,
    record_to_arrays,
    record_to_prompt,
)

STREAM_STATE = "fedrapp-stream"
METHOD_STATE = "fedrapp-method"

_CLIPS: dict[tuple, Any] = {}
_PROMPTED: dict[tuple, PromptedCLIP] = {}


def client_id_of(node_config: Mapping[str, Any], num_clients: int) -> int:
    """The stable client id: ``client-id`` from a SuperNode's node config, else the simulation's partition-id."""
    if "client-id" in node_config:
        client, source = int(node_config["client-id"]), "client-id in the SuperNode's --node-config"
    elif "partition-id" in node_config:
        client, source = int(node_config["partition-id"]), "partition-id of the simulation"
        parts = node_config.get("num-partitions")
        if parts is not None and int(parts) != num_clients:
            raise ValueError(
                f"the simulation runs {parts} SuperNodes but num-clients = {num_clients}: run with "
                f'--federation-config "num-supernodes={num_clients}" or set -c "num-clients={parts}"'
            )
    else:
        raise ValueError('this node has no client id: start the SuperNode with --node-config "client-id=<i>"')
    if not 0 <= client < num_clients:
        raise ValueError(f"client id {client} ({source}) is outside 0..{num_clients - 1} (num-clients)")
    return client


@dataclass
class ClientSetup:
    """Everything a round needs, built from the run config and the node config (cached parts reused)."""

    config: RunConfig
    client_id: int
    stream: ClientStream
    loaded_model: bool  # this call loaded the frozen model (first use in this process)

    def prompted(self) -> PromptedCLIP:
        """The frozen CLIP with this dataset's class names (loaded once per process)."""
        v = self.config
        clip_key = (v["model"], v["device"], v["precision"])
        if clip_key not in _CLIPS:
            _CLIPS[clip_key] = load_clip(str(v["model"]), device=str(v["device"]), precision=str(v["precision"]))
            self.loaded_model = True
        key = (*clip_key, tuple(self.stream.classnames), self.stream.template)
        if key not in _PROMPTED:
            _PROMPTED[key] = PromptedCLIP(_CLIPS[clip_key], list(self.stream.classnames), self.stream.template)
        return _PROMPTED[key]

    def method(self, state: dict[str, np.ndarray] | None) -> LocalMethod:
        """The local method, with its persistent ``state`` restored (None: a fresh method)."""
        name, params = self.config.method_params()
        method = make_method(name, params)
        if state is not None:
            method.load_state_dict(state)
        return method


def setup(context: Context) -> ClientSetup:
    """Validate the run config, find this client's id and its stream (cached per process)."""
    config = RunConfig.from_run_config(context.run_config)
    client = client_id_of(context.node_config, int(config["num-clients"]))
    overrides = {"data_dir": str(context.node_config["data-dir"])} if "data-dir" in context.node_config else {}
    stream = build_client_stream(config.data_spec(**overrides), client)  # cached by the data layer
    return ClientSetup(config, client, stream, loaded_model=False)


def stream_position(context: Context) -> int:
    """How many batches of its stream this client has already processed."""
    return int(context.state[STREAM_STATE]["position"]) if STREAM_STATE in context.state else 0


def restore_state(context: Context, client: int, config: Mapping[str, Any]) -> tuple[int, dict | None, bool]:
    """(stream position, method state, rebuilt?) to continue from.

    Normally both come from ``context.state``. A client that has none (a resumed run, a restarted SuperNode)
    but is expected at position p > 0 loads its snapshot of p from disk; without a snapshot it goes on at
    p with a fresh method state (``rebuilt``: its buffer and optimizer moments start again).
    """
    if STREAM_STATE in context.state:
        state = record_to_arrays(context.state[METHOD_STATE]) if METHOD_STATE in context.state else None
        return stream_position(context), state, False
    expected = int(config.get("stream-position", 0))
    if expected <= 0:
        return 0, None, False
    where = _snapshot_dir(context, config)
    snapshot = None if where is None else load_client_snapshot(where, str(config["run-token"]), client, expected)
    return expected, snapshot, snapshot is None


def _snapshot_dir(context: Context, config: Mapping[str, Any]) -> Path | None:
    """Where this client keeps its snapshots: the node config's ``state-dir``, else the server's choice."""
    where = context.node_config.get("state-dir") or config.get("state-dir")
    return Path(str(where)) if where and "run-token" in config else None


def step_generator(seed: int, client: int, position: int) -> torch.Generator:
    """The round's random generator (augmentations): a function of (seed, client, position) only."""
    state = np.random.SeedSequence([seed, client, position]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] % (2**63)))


def _score(predictions: torch.Tensor, labels: np.ndarray) -> int:
    """Number of correct predictions (the only use of labels on a client)."""
    return int((predictions.cpu().numpy() == labels).sum())


app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Discovery: report the client id, the stream's size and position, and the initial prompt P0."""
    client = setup(context)
    p0 = client.method(None).initial_prompt(client.prompted())
    info = ConfigRecord(
        {
            "client-id": client.client_id,
            "num-batches": client.stream.num_batches,
            "position": stream_position(context),
            "num-samples": client.stream.num_samples,
        }
    )
    return Message(RecordDict({INFO: info, PROMPT: prompt_to_record([b.detach().cpu() for b in p0])}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Adapt the received prompt on the next batch, predict, and reply with P~, H_pre, H_post and metrics."""
    t_start = time.perf_counter()
    client = setup(context)
    round_config = msg.content[CONFIG]
    position, method_state, rebuilt = restore_state(context, client.client_id, round_config)
    if position >= client.stream.num_batches:
        return Message(
            RecordDict({METRICS: MetricRecord({"client-id": client.client_id, "exhausted": 1})}), reply_to=msg
        )
    pclip = client.prompted()
    method = client.method(method_state)
    t_model = time.perf_counter()

    batch = client.stream.batch(position)
    client.stream.prefetch(position + 1)  # decoded in the background while this round computes
    pixel_values = pclip.preprocess(batch.images)
    t_data = time.perf_counter()

    prompt = [torch.from_numpy(np.array(b)) for b in record_to_prompt(msg.content[PROMPT])]
    seed = int(client.config["seed"])
    result = method.adapt(pclip, prompt, pixel_values, step_generator(seed, client.client_id, position))
    t_adapt = time.perf_counter()

    new_state = method.state_dict()
    context.state[METHOD_STATE] = arrays_to_record(new_state)
    context.state[STREAM_STATE] = ConfigRecord({"position": position + 1})
    snapshots = _snapshot_dir(context, round_config)
    if snapshots is not None:
        save_client_snapshot(snapshots, str(round_config["run-token"]), client.client_id, position + 1, new_state)
    n = len(batch.labels)
    metrics = {
        "client-id": client.client_id,
        "h-pre": float(result.h_pre),
        "h-post": float(result.h_post),
        "num-examples": n,
        "remaining-batches": client.stream.num_batches - position - 1,
        "stream-position": position,
        "correct": _score(result.predictions, batch.labels),
        "correct-before": _score(result.predictions_before, batch.labels),
        "model-loaded": int(client.loaded_model),
        "state-rebuilt": int(rebuilt),
        "t-setup": t_model - t_start,
        "t-data": t_data - t_model,
        "t-adapt": t_adapt - t_data,
        "t-total": time.perf_counter() - t_start,
        "pid": os.getpid(),
        **{f"stat-{k}": float(v) for k, v in result.stats.items()},
    }
    upload = [b.detach().cpu().float() for b in result.prompt]
    if client.client_id in attack_clients(str(client.config["attack-clients"])):
        upload = poisoned_upload(
            str(client.config["attack"]),
            upload,
            prompt,
            float(client.config["attack-scale"]),
            step_generator(seed + 1, client.client_id, position),
        )
    reply = RecordDict({PROMPT: prompt_to_record(upload), METRICS: MetricRecord(metrics)})
    return Message(reply, reply_to=msg)


__all__ = ["app", "client_id_of", "setup", "step_generator", "CONFIG"]
