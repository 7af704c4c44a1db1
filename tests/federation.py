"""Helpers for tests that run whole federations in-process (real strategy, ServerApp body and ClientApp)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message

from fedrapp_app.federation.client import app as client_app
from fedrapp_app.federation.inprocess import InProcessGrid
from fedrapp_app.federation.records import PROBE, PROMPT, flatten, record_to_prompt
from fedrapp_app.federation.server import run_server
from fedrapp_app.recording.results import comparable_rows, run_rows  # noqa: F401 - the tests import comparable_rows from here


def small_run(model_dir: Path, out_dir: Path, **overrides: Any) -> dict[str, Any]:
    """A run config small enough for a unit test: 3 clients, 16-image batches, a tiny random CLIP.

    The tiny model's predictions are near uniform, so AdaPrompt gets a threshold of 0 and a buffer of 16
    to make it update (and the prompt move) from the first round.
    """
    return {
        "model": str(model_dir),
        "num-clients": 3,
        "testbed-samples": 240,
        "batch-size": 16,
        "num-rounds": 3,
        "adaprompt-threshold": 0.0,
        "adaprompt-buffer-size": 16,
        "output-dir": str(out_dir),
        "run-name": "run",
        "decode-workers": 0,
        **overrides,
    }


class SpyGrid(InProcessGrid):
    """An in-process grid that keeps every message it was given, and every train message's prompt (and probe,
    where there is one), per round and destination node."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.messages: list[Message] = []  # every message pushed, in order
        self.sent: dict[tuple[int, int], np.ndarray] = {}  # (round, node) -> flattened prompt
        self.probes: dict[tuple[int, int], np.ndarray] = {}  # the same for the probes (FedRAPP's trust probe)

    def push_messages(self, messages):
        messages = list(messages)
        self.messages.extend(messages)
        for m in messages:
            if m.metadata.message_type == "train":
                key = (int(m.metadata.group_id), m.metadata.dst_node_id)
                self.sent[key] = flatten(record_to_prompt(m.content[PROMPT]))
                if PROBE in m.content.array_records:
                    self.probes[key] = flatten(record_to_prompt(m.content.array_records[PROBE]))
        return super().push_messages(messages)


def run_federation(config: dict[str, Any], app=client_app, grid_cls=SpyGrid, num_nodes: int | None = None):
    """Run ``config`` in-process; return (summary, grid, per-round copies of the server memory and sent)."""
    grid = grid_cls(app, num_nodes or int(config["num-clients"]), config)
    states: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def keep(round_number: int, strategy) -> None:
        states[round_number] = (strategy.state.memory.copy(), strategy.state.sent.copy())

    summary = run_server(grid, config, on_round=keep)
    return summary, grid, states


def interrupt_after(config: dict[str, Any], stop_round: int, check=None) -> None:
    """Run ``config`` in-process and stop it (as a Ctrl-C would) after round ``stop_round``, its checkpoint written;
    ``check(strategy)`` first looks at the server state there."""
    import pytest

    def stop(round_number: int, strategy) -> None:
        if round_number == stop_round:
            if check is not None:
                check(strategy)
            raise KeyboardInterrupt(f"stopped after round {stop_round}")

    with pytest.raises(KeyboardInterrupt):
        run_server(SpyGrid(client_app, int(config["num-clients"]), config), config, on_round=stop)


def run_in_flower_simulation(config: dict[str, Any], num_supernodes: int = 3) -> dict[str, Any]:
    """Run ``config`` through Flower's simulation engine (Ray, ``run_simulation``): the real ServerApp body and
    ClientApp handlers on ``num_supernodes`` simulated nodes, one CPU each. Returns the run's summary."""
    from flwr.app import Context
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    captured: dict[str, Any] = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:  # run_simulation leaves context.run_config empty
        captured["summary"] = run_server(grid, config)

    client = ClientApp()

    def with_config(context: Context) -> Context:  # same node and state; the run config run_simulation lacks
        return Context(context.run_id, context.node_id, context.node_config, context.state, dict(config))

    @client.query()
    def query(msg, context):
        return client_app(msg, with_config(context))

    @client.train()
    def train(msg, context):
        return client_app(msg, with_config(context))

    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=num_supernodes,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "include_dashboard": False},
        },
    )
    return captured["summary"]


def permute_labels(monkeypatch, num_classes: int, seed: int) -> None:
    """From now on every client stream yields its batches with the labels permuted (images, order, positions
    unchanged): whatever reads a label then differs, whatever does not stays bit for bit the same."""
    from fedrapp_app.data import ClientStream

    permutation = np.random.default_rng(seed).permutation(num_classes)
    original = ClientStream.batch

    def permuted(self, position):
        batch = original(self, position)
        return dataclasses.replace(batch, labels=permutation[batch.labels])

    monkeypatch.setattr(ClientStream, "batch", permuted)


def read_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's rounds.jsonl (under dp with the clients' outcome files merged, as the report reads them;
    :func:`server_rows` for the server's own view)."""
    return run_rows(run_dir)


def server_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's rounds.jsonl as the server wrote them (under dp: without the clients' outcomes)."""
    return [json.loads(line) for line in (Path(run_dir) / "rounds.jsonl").read_text().splitlines()]


def reply_with(message: Message, content) -> Message:
    """A reply to ``message`` carrying ``content`` (for ClientApp wrappers that tamper with replies)."""
    return Message(content, reply_to=message)
