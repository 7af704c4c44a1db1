"""A server facing clients it does not control: fuzzed uploads, clients that fail, vanish or time out,
and a run that is killed and resumed."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrapp_app.config import ConfigError
from fedrapp_app.federation.client import app as client_app
from fedrapp_app.federation.inprocess import InProcessGrid
from fedrapp_app.federation.records import CONFIG, INFO, METRICS, PROMPT, prompt_to_record, record_to_prompt
from fedrapp_app.federation.server import run_server
from fedrapp_app.federation.strategy import PersonalizedPromptStrategy
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import SpyGrid, comparable_rows, read_rows, run_federation, small_run

# ----------------------------------------------------------------------------------- fuzzed uploads
SHAPES = [(2, 4), (3, 4)]
P0 = [np.linspace(-1, 1, 8, dtype=np.float32).reshape(SHAPES[0]), np.ones(SHAPES[1], np.float32)]
NUM_CLIENTS = 4


def _honest(message: Message, client: int) -> RecordDict:
    """A deterministic well-formed reply: the received prompt nudged in a client-specific direction."""
    received = record_to_prompt(message.content[PROMPT])
    rng = np.random.default_rng(client)
    tuned = [b + 0.05 * rng.normal(size=b.shape).astype(np.float32) for b in received]
    metrics = {
        "client-id": client,
        "h-pre": 2.0 + 0.1 * client,
        "h-post": 1.5 + 0.05 * client,
        "num-examples": 8,
        "stream-position": int(message.content[CONFIG]["stream-position"]),
        "remaining-batches": 100,
        "correct": 1,
        "correct-before": 0,
    }
    return RecordDict({PROMPT: prompt_to_record(tuned), METRICS: MetricRecord(metrics)})


def scripted_app(mutate: dict[int, callable]) -> ClientApp:
    """A model-free ClientApp (client id = partition id); ``mutate[c]`` rewrites client c's train reply."""
    app = ClientApp()

    @app.query()
    def query(message, context):
        info = ConfigRecord(
            {
                "client-id": int(context.node_config["partition-id"]),
                "num-batches": 100,
                "position": 0,
                "num-samples": 800,
            }
        )
        return Message(RecordDict({INFO: info, PROMPT: prompt_to_record(P0)}), reply_to=message)

    @app.train()
    def train(message, context):
        client = int(context.node_config["partition-id"])
        content = _honest(message, client)
        return Message(mutate[client](content) if client in mutate else content, reply_to=message)

    return app


def _round_state(mutate: dict, rounds: int = 2):
    """Server state after ``rounds`` rounds of the fedrapp strategy over scripted clients."""
    grid = InProcessGrid(scripted_app(mutate), NUM_CLIENTS, {})
    strategy = PersonalizedPromptStrategy("fedrapp", {}, num_clients=NUM_CLIENTS, node_wait_timeout=5.0)
    strategy.connect(grid)
    for t in range(1, rounds + 1):
        replies = grid.send_and_receive(strategy.configure_train(t, ArrayRecord(), ConfigRecord(), grid))
        strategy.aggregate_train(t, replies)
    return strategy


def _with_prompt(content: RecordDict, blocks) -> RecordDict:
    return RecordDict(
        {
            PROMPT: ArrayRecord({f"block-{k}": Array(np.asarray(b)) for k, b in enumerate(blocks)}),
            METRICS: content[METRICS],
        }
    )


def _with_metrics(content: RecordDict, **changes) -> RecordDict:
    values = {k: v for k, v in content[METRICS].items()}
    values.update({k: v for k, v in changes.items() if v is not None})
    for k, v in changes.items():
        if v is None:
            values.pop(k, None)
    return RecordDict({PROMPT: content[PROMPT], METRICS: MetricRecord(values)})


def _blocks(content):
    return record_to_prompt(content[PROMPT])


BAD_VALUES = st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -1e30])
MUTATIONS = st.one_of(
    st.tuples(st.just("value"), st.integers(0, 1), BAD_VALUES).map(
        lambda a: (
            lambda c: _with_prompt(c, [b if k != a[1] else np.full_like(b, a[2]) for k, b in enumerate(_blocks(c))])
        )
    ),
    st.tuples(st.just("shape"), st.integers(0, 1), st.integers(1, 6)).map(
        lambda a: (
            lambda c: _with_prompt(
                c, [b if k != a[1] else np.zeros((a[2], 5), np.float32) for k, b in enumerate(_blocks(c))]
            )
        )
    ),
    st.sampled_from([np.float64, np.float16, np.int32]).map(
        lambda dtype: lambda c: _with_prompt(c, [b.astype(dtype) for b in _blocks(c)])
    ),
    st.integers(0, 1).map(lambda n: lambda c: _with_prompt(c, _blocks(c)[:n])),  # missing blocks
    st.just(lambda c: _with_prompt(c, [*_blocks(c), np.zeros((1, 4), np.float32)])),  # extra block
    st.sampled_from(["client-id", "h-pre", "h-post", "num-examples"]).map(
        lambda key: lambda c: _with_metrics(c, **{key: None})
    ),  # missing metric
    st.tuples(st.sampled_from(["h-pre", "h-post"]), st.sampled_from([-1.0, np.nan, np.inf, -np.inf])).map(
        lambda a: lambda c: _with_metrics(c, **{a[0]: a[1]})
    ),  # negative or non-finite entropy
    st.sampled_from([-1, 4, 99]).map(lambda cid: lambda c: _with_metrics(c, **{"client-id": cid})),  # unknown id
    st.just(lambda c: _with_metrics(c, **{"client-id": (int(c[METRICS]["client-id"]) + 1) % NUM_CLIENTS})),
    st.sampled_from([0, -3, 2.5, np.nan]).map(lambda n: lambda c: _with_metrics(c, **{"num-examples": n})),
    st.just(lambda c: RecordDict({METRICS: c[METRICS]})),  # no prompt record
    st.just(lambda c: RecordDict({PROMPT: c[PROMPT]})),  # no metrics record
    st.just(lambda c: RecordDict({PROMPT: c[PROMPT], METRICS: c[METRICS], "extra": ArrayRecord()})),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client=st.integers(0, NUM_CLIENTS - 1), mutation=MUTATIONS)
def test_a_bad_upload_leaves_the_state_of_a_round_without_it(client, mutation):
    """Every malformed reply is rejected; the server state is bit-identical to the round without that reply."""
    spoiled = _round_state({client: mutation}, rounds=2)  # the client uploads garbage in both rounds
    row = next(r for r in spoiled.last_report.rows if r.client_id == client)
    absent = _absent_everywhere(client)
    assert row.status == "rejected" and row.reason
    for name in ("memory", "sent", "exhausted"):
        assert np.array_equal(getattr(spoiled.state, name), getattr(absent.state, name)), name


def _absent_everywhere(client: int):
    grid = InProcessGrid(scripted_app({}), NUM_CLIENTS, {})
    grid.drop = lambda m: m.metadata.dst_node_id == 1000 + client and m.metadata.message_type == "train"
    strategy = PersonalizedPromptStrategy("fedrapp", {}, num_clients=NUM_CLIENTS, node_wait_timeout=5.0)
    strategy.connect(grid)
    for t in (1, 2):
        strategy.aggregate_train(
            t, grid.send_and_receive(strategy.configure_train(t, ArrayRecord(), ConfigRecord(), grid))
        )
    return strategy


def test_a_duplicated_reply_counts_once():
    class Twice(InProcessGrid):
        def pull_messages(self, message_ids):
            replies = list(super().pull_messages(message_ids))
            return replies + replies[:1]

    honest = _round_state({}, rounds=1)
    grid = Twice(scripted_app({}), NUM_CLIENTS, {})
    strategy = PersonalizedPromptStrategy("fedrapp", {}, num_clients=NUM_CLIENTS, node_wait_timeout=5.0)
    strategy.connect(grid)
    strategy.aggregate_train(1, grid.send_and_receive(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)))
    assert np.array_equal(strategy.state.memory, honest.state.memory)
    assert np.array_equal(strategy.state.sent, honest.state.sent)


# ----------------------------------------------------------------------------- failing clients, resume
@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


def test_a_vanished_node_comes_back_from_the_prompt_it_was_last_sent(testbed_tiny, tmp_path):
    class Flaky(SpyGrid):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.drop = lambda m: m.metadata.dst_node_id == 1001 and m.metadata.group_id in ("2", "3")

    summary, grid, states = run_federation(small_run(testbed_tiny, tmp_path, **{"num-rounds": 4}), grid_cls=Flaky)
    rows = {(r["round"], r["client"]): r for r in read_rows(summary["run_dir"])}
    assert rows[(2, 1)]["status"] == rows[(3, 1)]["status"] == "missing"
    assert rows[(4, 1)]["status"] == "ok"
    for t in (2, 3):
        assert np.array_equal(states[t][0][1], states[1][0][1])  # memory untouched while absent
    assert np.array_equal(grid.sent[(4, 1001)], states[1][1][1])  # it restarts from what it was last sent
    # Its stream did not move while it was away: no sample is skipped.
    assert rows[(4, 1)]["client_metrics"]["stream-position"] == 1


class KillAfterPush(SpyGrid):
    """Delivers the messages of round ``kill_round`` (clients compute and save), then 'dies'."""

    kill_round = 3

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        if messages and messages[0].metadata.group_id == str(self.kill_round):
            raise KeyboardInterrupt("killed in the middle of a round")
        return replies


def _kill_after_round_2(round_number: int, strategy) -> None:
    if round_number == 2:
        raise KeyboardInterrupt("killed after round 2")


@pytest.mark.parametrize("kill", ["between-rounds", "inside-a-round"])
def test_a_killed_run_resumes_to_the_same_results(testbed_tiny, tmp_path, kill):
    base = small_run(testbed_tiny, tmp_path, **{"num-rounds": 4})
    whole, whole_grid, _ = run_federation({**base, "run-name": "whole"})

    cut = {**base, "run-name": "cut"}
    with pytest.raises(KeyboardInterrupt):
        if kill == "between-rounds":
            run_server(SpyGrid(client_app, 3, cut), cut, on_round=_kill_after_round_2)
        else:
            run_federation(cut, grid_cls=KillAfterPush)
    # A new run in new processes: client state comes back from the snapshots, server state from the checkpoint.
    resumed, resumed_grid, _ = run_federation({**cut, "resume": True})
    assert resumed["resumed_after_round"] == 2
    assert comparable_rows(read_rows(whole["run_dir"])) == comparable_rows(read_rows(resumed["run_dir"]))
    assert resumed["micro_accuracy"] == whole["micro_accuracy"] and resumed["samples"] == whole["samples"]
    for key in ((3, 1000), (4, 1001), (4, 1002)):
        assert np.array_equal(resumed_grid.sent[key], whole_grid.sent[key])


def test_without_snapshots_a_resumed_client_rebuilds_from_its_stream_position(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 4, "run-name": "cut"})
    with pytest.raises(KeyboardInterrupt):
        run_federation(config, grid_cls=KillAfterPush)
    shutil.rmtree(tmp_path / "cut" / "client-state")
    resumed, _, _ = run_federation({**config, "resume": True})
    rows = [r for r in read_rows(resumed["run_dir"]) if r["round"] == 3]
    assert all(r["client_metrics"]["state-rebuilt"] == 1 for r in rows)
    assert all(r["client_metrics"]["stream-position"] == 2 for r in rows)  # no batch repeated or skipped
    assert resumed["samples"] == 4 * 3 * 16


def test_resume_refuses_a_different_experiment(testbed_tiny, tmp_path):
    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 1, "run-name": "r"})
    run_federation(config)
    with pytest.raises(ConfigError, match="tau"):
        run_federation({**config, "resume": True, "tau": 0.5})
    with pytest.raises(ConfigError, match="run-name"):
        run_federation({**config, "resume": True, "run-name": ""})
    with pytest.raises(FileNotFoundError, match="resume = false"):
        run_federation({**config, "resume": True, "run-name": "never-ran"})


def test_a_client_that_never_returns_ends_the_run_gracefully(testbed_tiny, tmp_path):
    class Dead(SpyGrid):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.drop = lambda m: m.metadata.dst_node_id == 1002 and m.metadata.message_type == "train"

    summary, _, _ = run_federation(small_run(testbed_tiny, tmp_path, **{"num-rounds": 0}), grid_cls=Dead)
    assert "clients [2] did not finish" in summary["stopped"]
    assert summary["per_client_samples"].keys() == {0, 1}  # the others' streams were processed to the end


def test_a_run_in_which_no_client_ever_answers_fails(tmp_path):
    grid = InProcessGrid(scripted_app({}), NUM_CLIENTS, {})
    grid.drop = lambda m: m.metadata.message_type == "train"
    config = {"model": "/unused", "num-clients": NUM_CLIENTS, "output-dir": str(tmp_path), "run-name": "r"}
    with pytest.raises(RuntimeError, match="no sample was ever scored"):
        run_server(grid, config)
