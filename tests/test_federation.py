"""Whole federations in-process: the real ServerApp body, strategy and ClientApp on a tiny random CLIP."""

from __future__ import annotations

import json
from pathlib import Path

import flwr
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.clientapp import ClientApp

from fedrapp_app.config import ConfigError
from fedrapp_app.federation.client import METHOD_STATE, STREAM_STATE, client_id_of
from fedrapp_app.federation.client import app as real_client_app
from fedrapp_app.federation.inprocess import InProcessGrid
from fedrapp_app.federation.records import METRICS, PROMPT
from fedrapp_app.federation.server import run_server
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import permute_labels, read_rows, run_federation, small_run


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random CLIP whose vocabulary covers the testbed world's class names."""
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


def test_run_writes_consistent_results(testbed_tiny, tmp_path):
    summary, _, _ = run_federation(small_run(testbed_tiny, tmp_path))
    run_dir = Path(summary["run_dir"])
    rows = read_rows(run_dir)
    assert len(rows) == 3 * 3 and {r["status"] for r in rows} == {"ok"}
    assert {(r["round"], r["client"]) for r in rows} == {(t, c) for t in (1, 2, 3) for c in (0, 1, 2)}
    correct, seen = sum(r["correct"] for r in rows), sum(r["num_examples"] for r in rows)
    assert summary["micro_accuracy"] == pytest.approx(correct / seen)
    assert summary["samples"] == seen == 3 * 3 * 16
    for key in ("h_pre", "h_post", "acc", "acc_before", "r", "mu", "gamma", "peer_weights", "update_norm"):
        assert key in rows[-1]
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["config"]["strategy"] == "fedrapp" and saved["versions"]["flwr"] == flwr.__version__
    assert "commit" in saved["git"]
    assert json.loads((run_dir / "config.json").read_text())["config"]["num-clients"] == 3


def test_streams_run_to_their_end(testbed_tiny, tmp_path):
    """num-rounds = 0: every client's stream is consumed exactly once, then the run stops by itself."""
    summary, _, _ = run_federation(small_run(testbed_tiny, tmp_path, **{"num-rounds": 0}))
    rows = read_rows(summary["run_dir"])
    assert summary["stopped"] == "streams ended"
    assert summary["samples"] == 240  # the partitions cover the testbed pool
    for client in range(3):
        positions = [r["client_metrics"]["stream-position"] for r in rows if r["client"] == client]
        assert positions == list(range(len(positions)))


def test_prompts_move_and_client_state_survives_rounds(testbed_tiny, tmp_path):
    summary, grid, states = run_federation(small_run(testbed_tiny, tmp_path))
    p0 = grid.sent[(1, 1000)]
    assert all(np.array_equal(grid.sent[(1, n)], p0) for n in (1001, 1002))  # everyone starts from P0
    assert not np.array_equal(grid.sent[(3, 1000)], p0)  # adaptation + aggregation moved it
    for context in grid.contexts.values():
        assert int(context.state[STREAM_STATE]["position"]) == 3
        assert any(k.startswith("buffer.") for k in context.state[METHOD_STATE])
    # The server keeps what it sent: the prompt of round t+1 is the strategy's `sent` after round t.
    node_of = {1000: 0, 1001: 1, 1002: 2}
    for node, client in node_of.items():
        assert np.array_equal(grid.sent[(2, node)], states[1][1][client])


def test_labels_never_reach_a_prompt(testbed_tiny, tmp_path, monkeypatch):
    """Permuting the labels of every stream changes the scores but no prompt in any round."""
    base, grid_a, _ = run_federation(small_run(testbed_tiny, tmp_path / "a"))
    permute_labels(monkeypatch, len(world.CLASSNAMES), seed=7)
    other, grid_b, _ = run_federation(small_run(testbed_tiny, tmp_path / "b"))
    assert grid_a.sent.keys() == grid_b.sent.keys()
    assert all(np.array_equal(grid_a.sent[k], grid_b.sent[k]) for k in grid_a.sent)
    assert base["micro_accuracy"] != other["micro_accuracy"]  # the permutation did reach the scoring


def test_fedrapp_without_memory_and_peers_is_none_fed(testbed_tiny, tmp_path):
    """SPEC §4: mu0 = eta = gamma0 = 0 reproduces none-fed bit for bit, through the whole app."""
    zero = {"strategy": "fedrapp", "mu0": 0.0, "eta": 0.0, "gamma0": 0.0}
    _, fed, _ = run_federation(small_run(testbed_tiny, tmp_path / "a", **zero))
    _, local, _ = run_federation(small_run(testbed_tiny, tmp_path / "b", strategy="none-fed"))
    assert fed.sent.keys() == local.sent.keys()
    assert all(np.array_equal(fed.sent[k], local.sent[k]) for k in fed.sent)


def _tampering_app(round_to_spoil: int) -> ClientApp:
    """The real ClientApp, except: client 1 raises and client 2 uploads NaN in ``round_to_spoil``."""
    app = ClientApp()

    @app.query()
    def query(msg, context):
        return real_client_app(msg, context)

    @app.train()
    def train(msg, context):
        spoil = int(msg.content["config"]["server-round"]) == round_to_spoil
        client = client_id_of(context.node_config, 3)
        if spoil and client == 1:
            raise RuntimeError("injected failure")
        reply = real_client_app(msg, context)
        if spoil and client == 2:
            record = reply.content[PROMPT]
            bad = {k: Array(np.full(v.shape, np.nan, np.float32)) for k, v in record.items()}
            reply.content = RecordDict({PROMPT: ArrayRecord(bad), METRICS: reply.content[METRICS]})
        return reply

    return app


def test_failed_and_malformed_clients_are_absent_for_the_round(testbed_tiny, tmp_path):
    summary, grid, states = run_federation(small_run(testbed_tiny, tmp_path), app=_tampering_app(2))
    rows = {(r["round"], r["client"]): r for r in read_rows(summary["run_dir"])}
    assert rows[(2, 1)]["status"] == "failed" and "injected failure" in rows[(2, 1)]["reason"]
    assert rows[(2, 2)]["status"] == "rejected" and "NaN" in rows[(2, 2)]["reason"]
    assert rows[(2, 0)]["status"] == "ok" and rows[(3, 1)]["status"] == rows[(3, 2)]["status"] == "ok"
    memory_1, sent_1 = states[1]
    memory_2, sent_2 = states[2]
    for absent in (1, 2):  # absent clients' server state is untouched (SPEC §4.7)
        assert np.array_equal(memory_2[absent], memory_1[absent])
        assert np.array_equal(sent_2[absent], sent_1[absent])
    # A returning client starts from the prompt it was last sent.
    assert np.array_equal(grid.sent[(3, 1001)], grid.sent[(2, 1001)])
    # The failed client's stream did not advance (its state update was lost); the rejected one's did.
    assert int(grid.contexts[1001].state[STREAM_STATE]["position"]) == 2
    assert int(grid.contexts[1002].state[STREAM_STATE]["position"]) == 3


def test_bad_config_fails_before_any_message(testbed_tiny, tmp_path):
    grid = InProcessGrid(real_client_app, 3, {})
    sent = []
    grid.drop = lambda message: sent.append(message) or False
    with pytest.raises(ConfigError, match="dirichlet-alpha"):
        run_server(grid, small_run(testbed_tiny, tmp_path, **{"dirichlet-alpha": -1.0}))
    assert sent == []


def test_client_id_comes_from_the_node_config():
    assert client_id_of({"client-id": 2}, 3) == 2
    assert client_id_of({"partition-id": 1, "num-partitions": 3}, 3) == 1
    with pytest.raises(ValueError, match="num-supernodes=4"):
        client_id_of({"partition-id": 1, "num-partitions": 2}, 4)
    with pytest.raises(ValueError, match="outside 0..2"):
        client_id_of({"client-id": 3}, 3)
    with pytest.raises(ValueError, match="--node-config"):
        client_id_of({}, 3)
