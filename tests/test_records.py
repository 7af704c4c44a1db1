"""Wire format of prompts and the validation of every client reply."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedrapp_app.federation.records import (
    METRICS,
    PROMPT,
    RejectedReply,
    arrays_to_record,
    flatten,
    parse_train_reply,
    prompt_to_record,
    record_to_arrays,
    record_to_prompt,
    unflatten,
)

SHAPES = [(4, 8), (5, 8)]


def _blocks(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def _reply(blocks=None, **metrics) -> RecordDict:
    values = {"client-id": 1, "h-pre": 2.0, "h-post": 1.5, "num-examples": 16, "correct": 3, **metrics}
    values = {k: v for k, v in values.items() if v is not None}
    content = {METRICS: MetricRecord(values)}
    if blocks is not False:
        content[PROMPT] = prompt_to_record(blocks if blocks is not None else _blocks())
    return RecordDict(content)


def test_prompt_round_trips_through_records_and_vectors():
    blocks = _blocks()
    back = record_to_prompt(prompt_to_record(blocks))
    assert all(np.array_equal(a, b) for a, b in zip(blocks, back, strict=True))
    vector = flatten(blocks)
    assert vector.shape == (72,) and vector.dtype == np.float32
    assert all(np.array_equal(a, b) for a, b in zip(blocks, unflatten(vector, SHAPES), strict=True))
    with pytest.raises(ValueError, match="does not fit"):
        unflatten(vector[:-1], SHAPES)


@pytest.mark.kernels
def test_method_state_round_trips_bit_exactly():
    state = {"m": np.random.default_rng(0).normal(size=(3, 2)), "step": np.array(7), "f": np.float32([1.5])}
    back = record_to_arrays(arrays_to_record(state))
    assert back.keys() == state.keys()
    for k in state:
        assert back[k].dtype == np.asarray(state[k]).dtype and np.array_equal(back[k], state[k])


def test_a_valid_reply_parses_and_keeps_reporting_metrics_apart():
    upload = parse_train_reply(_reply(), 1, SHAPES, max_norm=1e3)
    assert upload.client_id == 1 and upload.num_examples == 16
    assert np.array_equal(upload.prompt, flatten(_blocks()))
    assert upload.report == {"correct": 3}


def _nan_blocks():
    blocks = _blocks()
    blocks[1][2, 3] = np.nan
    return blocks


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (_reply(**{"client-id": 2}), "went to client 1"),
        (_reply(**{"h-post": None}), "missing metrics"),
        (_reply(**{"h-pre": float("nan")}), "not a finite number"),
        (_reply(**{"h-post": -0.5}), "negative entropy"),
        (_reply(**{"num-examples": 0}), "positive integer"),
        (_reply(**{"num-examples": 2.5}), "positive integer"),
        (_reply(blocks=False), "no ArrayRecord"),
        (_reply(blocks=_blocks()[:1]), "expected ['block-0', 'block-1']"),
        (_reply(blocks=[*_blocks(), np.zeros((1, 8), np.float32)]), "expected ['block-0', 'block-1']"),
        (_reply(blocks=[_blocks()[0], np.zeros((5, 9), np.float32)]), "expected float32[5, 8]"),
        (_reply(blocks=_nan_blocks()), "NaN or Inf"),
        (_reply(blocks=[b * 1e6 for b in _blocks()]), "exceeds the limit"),
        (RecordDict({PROMPT: prompt_to_record(_blocks())}), "no MetricRecord"),
    ],
)
def test_malformed_replies_are_rejected_with_the_reason(content, reason):
    with pytest.raises(RejectedReply) as err:
        parse_train_reply(content, 1, SHAPES, max_norm=1e3)
    assert reason in str(err.value)


def test_wrong_dtype_is_rejected():
    record = ArrayRecord({f"block-{k}": Array(b.astype(np.float64)) for k, b in enumerate(_blocks())})
    content = RecordDict(
        {PROMPT: record, METRICS: MetricRecord({"client-id": 1, "h-pre": 1.0, "h-post": 1.0, "num-examples": 4})}
    )
    with pytest.raises(RejectedReply, match="float64"):
        parse_train_reply(content, 1, SHAPES, max_norm=1e3)
