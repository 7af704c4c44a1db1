"""The ServerApp's own pull for replies on Flower's deployment grid (``federation/exchange.py``)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from fedrapp_app.federation import exchange


class _SlowGrid:
    """Replies to message ``i`` appear at the ``ready[i]``-th pull (None: never); counts what was called."""

    def __init__(self, ready: list[int | None]) -> None:
        self.ready, self.pulls, self.send_and_receive_calls = ready, 0, 0

    def push_messages(self, messages):
        return [f"m{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, ids):
        self.pulls += 1
        return [
            SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=f"m{i}"))
            for i, at in enumerate(self.ready)
            if at == self.pulls and f"m{i}" in ids
        ]

    def send_and_receive(self, messages, *, timeout=None):
        self.send_and_receive_calls += 1
        return []


def test_replies_are_pulled_every_fraction_of_a_second_not_every_3_s(monkeypatch):
    monkeypatch.setattr(exchange, "pulls_slowly", lambda grid: True)
    monkeypatch.delenv(exchange.PULL_SECONDS_ENV, raising=False)
    grid = _SlowGrid([1, 3, 2])
    began = time.monotonic()
    replies = exchange.send_and_collect(grid, ["a", "b", "c"], timeout=30)
    took = time.monotonic() - began
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert grid.pulls == 3 and grid.send_and_receive_calls == 0
    assert 2 * exchange.PULL_SECONDS - 0.05 <= took < 1.5  # two waits of 0.2 s, where Flower's loop waits 6 s


def test_a_missing_reply_ends_at_the_timeout_with_the_others(monkeypatch):
    monkeypatch.setattr(exchange, "pulls_slowly", lambda grid: True)
    monkeypatch.setenv(exchange.PULL_SECONDS_ENV, "0.05")
    grid = _SlowGrid([1, None])
    began = time.monotonic()
    replies = exchange.send_and_collect(grid, ["a", "b"], timeout=0.5)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 0.5 <= time.monotonic() - began < 1.5 and grid.pulls >= 5  # the override's 0.05 s cadence


def test_other_grids_keep_their_own_send_and_receive():
    grid = _SlowGrid([1])
    assert exchange.send_and_collect(grid, ["a"], timeout=1) == [] and grid.send_and_receive_calls == 1


@pytest.mark.parametrize(("value", "seconds"), [("3", 3.0), ("0", 0.2), ("-1", 0.2), ("soon", 0.2)])
def test_the_pull_interval_override_takes_positive_numbers_only(monkeypatch, value, seconds):
    monkeypatch.setenv(exchange.PULL_SECONDS_ENV, value)
    assert exchange.pull_seconds() == seconds


def test_flowers_deployment_grid_is_the_one_pulled_by_us():
    from flwr.superlink.grid import HttpGrid, InMemoryGrid

    assert exchange.pulls_slowly(HttpGrid.__new__(HttpGrid))
    assert not exchange.pulls_slowly(InMemoryGrid.__new__(InMemoryGrid))
