"""ClientApp: each round, adapt the received prompt on the next batch of this client's stream and reply.

State that survives between rounds lives in ``context.state`` (the stream position and the local method's
state: AdaPrompt's buffer, optimizer moments, step counters), because the process that serves a node may
change between rounds. The frozen model and the class-name buffers are cached per process (keyed by what
determines them), the streams by the data layer: in simulation one process serves many nodes in turn.

Labels are read in exactly one place, ``_right``, to score predictions for the report (accuracy, calibration,
accuracy per shift domain). Under ``dp = true`` those outcomes never leave the client: its reply carries only the
allow-listed fields (``records.PRIVATE_REPLY_METRICS``), the rest goes to its outcome file
(``recording/outcomes.py``), and a position asked again is answered from its release log (``privacy/upload.py``).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedrapp_app.config import ConfigError, RunConfig, attack_clients
from fedrapp_app.data import ClientStream, StreamBatch, build_client_stream
from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.engine.devices import current_device_description, device_for_node, set_deterministic
from fedrapp_app.federation.attacks import poisoned_upload
from fedrapp_app.federation.errors import describe
from fedrapp_app.federation.records import (
    CONFIG,
    INFO,
    METRICS,
    NOTES,
    PAYLOAD,
    PROBE_METRICS,
    PROBES,
    PROMPT,
    RELEASED_METRICS,
    arrays_to_record,
    parse_outcome,
    private_reply,
    probe_metrics,
    prompt_to_record,
    record_to_arrays,
    record_to_prompt,
    scored_fields,
)
from fedrapp_app.methods import LocalMethod, make_method
from fedrapp_app.methods.base import Adaptation
from fedrapp_app.metrics.calibration import calibration_bins
from fedrapp_app.privacy.upload import (
    ReleaseRefused,
    logged_reply,
    own_share_restored,
    private_upload,
    split_state,
    stored_release,
)
from fedrapp_app.recording.checkpoint import load_client_snapshot, save_client_snapshot
from fedrapp_app.recording.outcomes import append_outcome

STREAM_STATE = "fedrapp-stream"
METHOD_STATE = "fedrapp-method"

log = logging.getLogger("flwr.fedrapp.client")
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
                f"the simulation runs {parts} SuperNodes but num-clients = {num_clients}: drop num-clients (0, "
                f'the default, means one client per SuperNode), set -c "num-clients={parts}", or run '
                f'{num_clients} SuperNodes (--federation-config "num-supernodes={num_clients}")'
            )
    else:
        raise ValueError('this node has no client id: start the SuperNode with --node-config "client-id=<i>"')
    if not 0 <= client < num_clients:
        raise ValueError(
            f"client id {client} ({source}) is outside 0..{num_clients - 1}: the run has num-clients = "
            f'{num_clients}; give the SuperNodes client ids 0..{num_clients - 1} or set -c "num-clients=<n>"'
        )
    return client


def resolved_config(run_config: Mapping[str, Any], message_config: Mapping[str, Any]) -> RunConfig:
    """The validated run config with ``num-clients`` resolved: the run config's own value, or (0 = one client
    per SuperNode) the number the server counted and sends with every message."""
    config = RunConfig.from_run_config(run_config, with_rule=False)  # the rule runs on the server alone
    if config.num_clients:
        return config
    counted = int(message_config.get("num-clients", 0))
    if counted < 1:
        raise ValueError("num-clients = 0 but the server sent no client count: server and client app differ")
    return config.with_num_clients(counted)


@dataclass
class ClientSetup:
    """Everything a round needs, built from the run config and the node config (cached parts reused)."""

    config: RunConfig
    client_id: int
    stream: ClientStream
    loaded_model: bool  # this call loaded the frozen model (first use in this process)
    device: str = "auto"  # the run config's device, or the SuperNode's own (node config ``device``)
    own_prompt: bool = False  # the server's rule reads the clients' own-prompt scores (the server says so)

    def prompted(self) -> PromptedCLIP:
        """The frozen CLIP with this dataset's class names (loaded once per process)."""
        v = self.config
        clip_key = (v["model"], self.device, v["precision"])
        if clip_key not in _CLIPS:
            set_deterministic(bool(v["deterministic"]))  # before this process's first CUDA matmul
            _CLIPS[clip_key] = load_clip(str(v["model"]), device=self.device, precision=str(v["precision"]))
            self.loaded_model = True
            log.info("client %d runs on %s", self.client_id, current_device_description(_CLIPS[clip_key].device))
        stream = self.stream
        key = (*clip_key, tuple(stream.classnames), stream.template, stream.templates)
        if key not in _PROMPTED:
            _PROMPTED[key] = PromptedCLIP(_CLIPS[clip_key], list(stream.classnames), stream.template, stream.templates)
        return _PROMPTED[key]

    def method(self, state: dict[str, np.ndarray] | None) -> LocalMethod:
        """The local method, with its persistent ``state`` restored (None: a fresh method)."""
        name, params = self.config.method_params(own_prompt=self.own_prompt)
        method = make_method(name, params)
        if state is not None:
            method.load_state_dict(state)
        return method


def setup(context: Context, message_config: Mapping[str, Any]) -> ClientSetup:
    """Validate the run config, find this client's id and its stream (cached per process)."""
    try:
        config = resolved_config(context.run_config, message_config)
    except ConfigError as err:  # a method plugin the ServerApp's host has and this node lacks: say which
        origin = str(message_config.get("method-origin", ""))
        if not origin or "local method" not in str(err):
            raise
        raise ConfigError(
            f"{err}\n  on the server, local-method {context.run_config.get('local-method')!r} comes from {origin}: "
            "install that package on this node too (every SuperNode runs the method)"
        ) from err
    client = client_id_of(context.node_config, config.num_clients)
    overrides = {"data_dir": str(context.node_config["data-dir"])} if "data-dir" in context.node_config else {}
    stream = build_client_stream(config.data_spec(**overrides), client)  # cached by the data layer
    device = device_for_node(str(config["device"]), context.node_config)
    own_prompt = bool(message_config.get("own-prompt", False))
    return ClientSetup(config, client, stream, loaded_model=False, device=device, own_prompt=own_prompt)


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
    where = snapshot_dir(context.node_config, config)
    snapshot = None if where is None else load_client_snapshot(where, str(config["run-token"]), client, expected)
    return expected, (snapshot or None), snapshot is None  # {}: the method had no state yet


def default_state_dir() -> Path:
    """The node-local snapshot folder: ``$XDG_CACHE_HOME/fedrapp/client-state`` (``~/.cache/...``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fedrapp" / "client-state"


def snapshot_dir(node_config: Mapping[str, Any], config: Mapping[str, Any]) -> Path | None:
    """Where this client keeps its snapshots (None: the server asked for none).

    The SuperNode's ``state-dir`` (node config) wins. Otherwise the server's folder (``run_dir/client-state``)
    when this client runs on the server's host (simulation, loopback), since that path is the server's and
    may not exist or be writable on another host; else the node-local ``default_state_dir()``.
    """
    if "run-token" not in config:
        return None
    if node_config.get("state-dir"):
        return Path(str(node_config["state-dir"])).expanduser()
    if config.get("state-dir") and config.get("server-host") == socket.gethostname():
        return Path(str(config["state-dir"]))
    return default_state_dir()


def save_snapshot(where: Path, token: str, client: int, position: int, state: dict[str, np.ndarray]) -> None:
    """``save_client_snapshot`` with an error that says which folder failed and how to choose another."""
    try:
        save_client_snapshot(where, token, client, position, state)
    except OSError as err:
        raise OSError(
            f"cannot write this client's snapshot under {where} ({type(err).__name__}: {err}); give the node a "
            "writable folder: flower-supernode ... --node-config \"state-dir='/path/on/this/host'\""
        ) from err


def step_generator(seed: int, client: int, position: int) -> torch.Generator:
    """The round's random generator (augmentations): a function of (seed, client, position) only."""
    state = np.random.SeedSequence([seed, client, position]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] % (2**63)))


def _right(predictions: torch.Tensor, labels: np.ndarray) -> np.ndarray:
    """bool [B]: which predictions are right (the only use of labels on a client)."""
    return predictions.cpu().numpy() == labels


def _score(predictions: torch.Tensor, labels: np.ndarray) -> int:
    """Number of correct predictions."""
    return int(_right(predictions, labels).sum())


def outcome_metrics(result: Adaptation, batch: StreamBatch) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the report reads besides accuracy, as (metrics, notes): the calibration bins of the predictions
    after and before adaptation (``calib-*``, ``calib-before-*``; where the method gives confidences) and, on a
    stream with shift domains, the samples and right predictions per domain (``domain-n``, ``domain-correct``;
    the domains' names in the notes, ``domains``)."""
    right = _right(result.predictions, batch.labels)
    metrics: dict[str, Any] = {}
    pairs = (("calib", result.confidence, right), ("calib-before", result.confidence_before, None))
    for prefix, confidence, correct in pairs:
        if confidence is not None:
            if correct is None:
                correct = _right(result.predictions_before, batch.labels)
            bins = calibration_bins(confidence.cpu().numpy().clip(0.0, 1.0), correct)
            metrics.update({f"{prefix}-{key}": value for key, value in bins.as_lists().items()})
    notes: dict[str, Any] = {}
    if batch.domains:
        names = list(dict.fromkeys(batch.domains))
        where = np.array([names.index(d) for d in batch.domains])
        metrics["domain-n"] = np.bincount(where, minlength=len(names)).tolist()
        metrics["domain-correct"] = np.bincount(where, weights=right, minlength=len(names)).astype(int).tolist()
        notes["domains"] = names
    return metrics, notes


def _reported_errors(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """Turn an exception of ``handler`` into an error reply whose reason is the exception's type and message.

    Without this, Flower's reply carries the whole traceback (in simulation wrapped in Ray's, with colour
    codes), cut before the real error. The traceback is logged here once per distinct error and process.
    ``context.state`` is written last by the handlers, so a failed message leaves it as it was.
    """

    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except Exception as err:  # noqa: BLE001 - reported to the server as data, not raised
            reason = describe(err)
            if reason not in _LOGGED:
                _LOGGED.add(reason)
                log.error("%s failed on node %s: %s", handler.__name__, context.node_id, reason, exc_info=err)
            else:
                log.error("%s failed on node %s: %s", handler.__name__, context.node_id, reason.splitlines()[0])
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)

    return wrapped


_LOGGED: set[str] = set()
app = ClientApp()


@app.query()
@_reported_errors
def query(msg: Message, context: Context) -> Message:
    """Discovery: report the client id, the stream's size and position, and the initial prompt P0."""
    client = setup(context, msg.content.get(CONFIG, {}))
    method = client.method(None)
    p0 = method.initial_prompt(client.prompted())
    template = method.payload_template(client.prompted())  # what it uploads beside the prompt (none: {})
    info = ConfigRecord(
        {
            "client-id": client.client_id,
            "num-batches": client.stream.num_batches,
            "position": stream_position(context),
            "num-samples": client.stream.num_samples,
        }
    )
    records = {INFO: info, PROMPT: prompt_to_record([b.detach().cpu() for b in p0])}
    if template:
        records[PAYLOAD] = arrays_to_record({k: np.asarray(v, dtype=np.float32) for k, v in template.items()})
    return Message(RecordDict(records), reply_to=msg)


@app.train()
@_reported_errors
def train(msg: Message, context: Context) -> Message:
    """Adapt the received prompt on the next batch, predict, and reply with P~, H_pre, H_post and metrics.

    Order matters: everything that can fail (data, adaptation, the snapshot on disk) happens before the
    stream position and method state are written to ``context.state``, so a failed round consumes nothing.
    """
    t_start = time.perf_counter()
    round_config = msg.content[CONFIG]
    client = setup(context, round_config)
    position, method_state, rebuilt = restore_state(context, client.client_id, round_config)
    if position >= client.stream.num_batches:
        return Message(
            RecordDict({METRICS: MetricRecord({"client-id": client.client_id, "exhausted": 1})}),
            reply_to=msg,
        )
    dp = bool(client.config["dp"])
    if dp:
        replayed = _replayed(context, client, round_config, position)
        if replayed is not None:  # released before: the same release again, no new noise and no new loss
            return Message(replayed, reply_to=msg)
        if rebuilt:
            raise ReleaseRefused(
                f"under dp this client's release log is lost (no snapshot of stream position {position}): it cannot "
                "tell whether that position was released already, and a second release of it would exceed the "
                "privacy budget; restore its state folder, or start a new run"
            )
    pclip = client.prompted()
    method_state, kept = split_state(method_state)  # kept: under dp, the last upload and the release log
    method = client.method(method_state)
    t_model = time.perf_counter()

    batch = client.stream.batch(position)
    client.stream.prefetch(position + 1)  # decoded in the background while this round computes
    if batch.skipped:
        log.warning(
            "client %d, batch %d: skipped %d undecodable sample(s): %s",
            client.client_id,
            position,
            len(batch.skipped),
            "; ".join(map(str, batch.skipped)),
        )
    base = {
        "client-id": client.client_id,
        "remaining-batches": client.stream.num_batches - position - 1,
        "stream-position": position,
        "skipped": len(batch.skipped),
    }
    skipped = {"skipped-samples": [str(s) for s in batch.skipped]} if batch.skipped else {}
    notes = ConfigRecord({**placement(), "device": current_device_description(pclip.device), **skipped})
    if not batch.labels.size:  # nothing decodable: the batch is consumed and reported, nothing is adapted
        metrics, notes = {**base, "skipped-batch": 1}, dict(notes)
        if dp:
            metrics, notes = _kept_private(context, client, round_config, position, metrics, notes, 0)
        _advance(context, client, round_config, position, {**(method_state or {}), **kept})
        return Message(_reply(None, metrics, ConfigRecord(notes)), reply_to=msg)

    pixel_values = pclip.preprocess(batch.images)
    t_data = time.perf_counter()
    received = record_to_prompt(msg.content[PROMPT])
    if dp:  # the client's exact prompt in place of the server's noised copy of it, in the rule's share of it
        received_start = own_share_restored(received, kept, float(round_config.get("own-weight", 0.0)))
    prompt = [torch.from_numpy(np.array(b)) for b in (received_start if dp else received)]
    probes = {name: record_to_prompt(msg.content.array_records[name]) for name in PROBES if name in msg.content}
    if probes:  # prompts to score beside (FedRAPP's trust probes)
        method.set_probes(probes)
    if PAYLOAD in msg.content.array_records:  # arrays the rule sent beside the prompt (Latte: peers' prototypes)
        method.receive(record_to_arrays(msg.content.array_records[PAYLOAD]))
    seed = int(client.config["seed"])
    result = method.adapt(pclip, prompt, pixel_values, step_generator(seed, client.client_id, position))
    t_adapt = time.perf_counter()

    upload = [b.detach().cpu().float() for b in result.prompt]
    if client.client_id in attack_clients(str(client.config["attack-clients"])):
        upload = poisoned_upload(
            str(client.config["attack"]),
            upload,
            prompt,
            float(client.config["attack-scale"]),
            step_generator(seed + 1, client.client_id, position),
        )
    metrics = {
        **base,
        "h-pre": float(result.h_pre),
        "h-post": float(result.h_post),
        "num-examples": len(batch.labels),
        "correct": _score(result.predictions, batch.labels),
        "correct-before": _score(result.predictions_before, batch.labels),
        "model-loaded": int(client.loaded_model),
        "state-rebuilt": int(rebuilt),
        "t-setup": t_model - t_start,
        "t-data": t_data - t_model,
        "t-adapt": t_adapt - t_data,
        "pid": os.getpid(),
        **{f"stat-{k}": float(v) for k, v in result.stats.items()},
    }
    outcome, outcome_notes = outcome_metrics(result, batch)
    metrics.update(outcome)
    for key, value in outcome_notes.items():
        notes[key] = value
    if result.h_own is not None:  # the own last tuned prompt on this batch (report-own-prompt; the rule reads h-*)
        own = {
            "h-own": result.h_own,
            "hm-pre": result.hm_pre,
            "hm-own": result.hm_own,
            "v-pre": result.v_pre,
            "v-own": result.v_own,
        }
        metrics.update({k: float(v) for k, v in own.items() if v is not None})
        metrics["correct-own"] = _score(result.predictions_own, batch.labels)
    for name, probe in result.probes.items():  # each probe against the own prompt (the trust option reads these)
        metrics.update(probe_metrics(name, probe))
        metrics[f"correct-{PROBE_METRICS[name]}"] = _score(probe.predictions, batch.labels)
    state = method.state_dict()
    notes = dict(notes)
    if dp:  # the upload and the scalars the rule reads leave only noised, the outcomes not at all
        private = private_upload(
            upload, received, {k: metrics[k] for k in ("h-pre", "h-post", *RELEASED_METRICS) if k in metrics},
            len(pclip.classnames), (float(client.config["dp-epsilon"]), float(client.config["dp-delta"])),
            float(client.config["dp-clip"]), client.stream.num_batches, kept,
            (str(round_config.get("run-token", "")), seed, client.client_id, position),
        )  # fmt: skip
        upload = private.blocks
        exact = {f"exact-{k}": metrics[k] for k in private.scalars}  # for the outcome file: the experimenter's view
        metrics.update({**exact, **private.scalars, **private.metrics, "t-total": time.perf_counter() - t_start})
        metrics, notes = _kept_private(context, client, round_config, position, metrics, notes, len(batch.labels))
        state = {**state, **private.state, **logged_reply(metrics)}
    _advance(context, client, round_config, position, state)
    if not dp:
        metrics["t-total"] = time.perf_counter() - t_start
    reply = _reply(prompt_to_record(upload), metrics, ConfigRecord(notes))
    if result.payload:  # arrays uploaded beside the prompt, as float32 (the server validates them)
        reply[PAYLOAD] = arrays_to_record({k: np.asarray(v, dtype=np.float32) for k, v in result.payload.items()})
    return Message(reply, reply_to=msg)


def _kept_private(
    context: Context,
    client: ClientSetup,
    round_config: Mapping[str, Any],
    position: int,
    metrics: dict[str, Any],
    notes: dict[str, Any],
    num_examples: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Under dp: the reply's allow-listed metrics and notes; everything else this round scored or measured is
    written to the client's outcome file first (the row fields the server would have computed from it)."""
    where = snapshot_dir(context.node_config, round_config)
    if where is None:
        raise ReleaseRefused("dp = true needs a state folder for the release log and the outcome file; none was given")
    public_metrics, public_notes, withheld = private_reply(metrics, notes)
    record: dict[str, Any] = {"round": int(round_config.get("server-round", 0)), "client": client.client_id,
                              "position": position}  # fmt: skip
    if num_examples:
        report, domains = withheld["metrics"], list(withheld["notes"].get("domains") or [])
        fields, rest = scored_fields(report, parse_outcome(report, domains, num_examples), num_examples)
        record.update(fields, client_metrics=rest)
    skipped = [str(s) for s in withheld["notes"].get("skipped-samples") or []]
    if skipped:
        record.update(skipped=len(skipped), skipped_samples=skipped)
    append_outcome(where, str(round_config["run-token"]), client.client_id, record)
    return public_metrics, public_notes


def _replayed(
    context: Context, client: ClientSetup, round_config: Mapping[str, Any], position: int
) -> RecordDict | None:
    """Under dp, the reply to a stream position this client released before (its snapshot of the next position
    holds the release: the server lost it to a crash before its checkpoint), with the state moved past it; None
    where the position was never released. Only a client that restored its state from disk can meet one."""
    where = snapshot_dir(context.node_config, round_config)
    if STREAM_STATE in context.state or where is None:
        return None
    after = load_client_snapshot(where, str(round_config["run-token"]), client.client_id, position + 1)
    stored = None if after is None else stored_release(split_state(after)[1], position)
    if stored is None:
        return None
    blocks, metrics = stored
    log.warning("client %d: stream position %d was released before; its stored release is sent again", client.client_id,
                position)  # fmt: skip
    _advance(context, client, round_config, position, after)
    metrics = {**metrics, "dp-replayed": 1, "model-loaded": 0, "state-rebuilt": 0, "pid": os.getpid()}
    return _reply(prompt_to_record(blocks), metrics, ConfigRecord(placement()))


def _advance(
    context: Context, client: ClientSetup, round_config: Mapping[str, Any], position: int, state: dict | None
) -> None:
    """Save the snapshot of stream position ``position + 1``, then (last: it must not run if the save
    failed) move ``context.state`` there."""
    state = dict(state or {})
    where = snapshot_dir(context.node_config, round_config)
    if where is not None:
        save_snapshot(where, str(round_config["run-token"]), client.client_id, position + 1, state)
    if state:
        context.state[METHOD_STATE] = arrays_to_record(state)
    context.state[STREAM_STATE] = ConfigRecord({"position": position + 1})


def _reply(prompt: ArrayRecord | None, metrics: dict[str, Any], notes: ConfigRecord) -> RecordDict:
    """A train reply: the prompt (absent for a skipped batch), the metrics and the notes."""
    records: dict[str, Any] = {METRICS: MetricRecord(metrics), NOTES: notes}
    if prompt is not None:
        records[PROMPT] = prompt
    return RecordDict(records)


def placement() -> dict[str, str]:
    """Where this client ran, for the results: the host and, in Ray's simulation engine, the Ray node id."""
    where = {"host": socket.gethostname()}
    ray = sys.modules.get("ray")  # only inside a Ray worker is Ray imported (and initialised): no import here
    if ray is not None and ray.is_initialized():
        where["ray-node"] = ray.get_runtime_context().get_node_id()
    return where


__all__ = ["app", "client_id_of", "setup", "step_generator", "CONFIG"]
