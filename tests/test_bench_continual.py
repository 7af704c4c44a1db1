"""The report of conf/bench/continual.yaml (fedrapp_app/bench/continual.py) on hand-made cells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedrapp_app.bench.continual import memory_at_switches, write_report


def _cell(bench: Path, stream: str, rule: str, seed: int, acc: float, **summary) -> dict:
    run_dir = bench / "runs" / f"{stream}-{rule}-{seed}"
    run_dir.mkdir(parents=True)
    strategy = {"local": "none-fed", "none-fed": "none-fed"}.get(rule, "fedrapp")
    config = {"strategy": strategy, "num-clients": 4, **summary.pop("config", {})}
    (run_dir / "summary.json").write_text(json.dumps({"micro_accuracy": acc, "config": config, **summary}))
    return {
        "key": f"{stream}-{rule}-{seed}",
        "id": f"{stream}-{rule}-{seed}",
        "status": "ok",
        "config": {"seed": seed},
        "grids": {"streams": {"labels": {"stream": stream, "rule": rule, "method": "adaprompt", "seed": seed}}},
        "summary": {"micro_accuracy": acc, "ece": 0.1, "ece_before": 0.2},
        "run_dir": str(run_dir),
    }


def test_the_report_marks_a_gain_below_the_goal_and_lists_the_switches(tmp_path):
    switches = {"switches": 4, "post_switch_accuracy": 0.5, "recovery_batches": 1.0, "unrecovered": 1,
                "forgetting": 0.02}  # fmt: skip
    late = {"config": {"num-clients": 4, "late-clients": 1}, "per_client_accuracy": {"2": 0.5, "3": 0.25},
            "per_client_samples": {"2": 10, "3": 30}}  # fmt: skip
    cells = [
        _cell(tmp_path, "continual", "none-fed", 0, 0.600, switches=switches),
        _cell(tmp_path, "continual", "none-fed", 1, 0.620, switches=switches),
        _cell(tmp_path, "continual", "fedrapp", 0, 0.590, switches=switches),  # -1.0 points
        _cell(tmp_path, "continual", "fedrapp", 1, 0.615, switches=switches),  # -0.5 points
        _cell(tmp_path, "late", "fedrapp", 0, 0.5, **late),
        _cell(tmp_path, "held-out", "fedrapp", 0, 0.5, held_out_accuracy=0.375),
    ]
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    text = write_report(tmp_path, tmp_path / "out").read_text()
    assert "| fedrapp | 60.25 ± 1.77 (-0.75 ± 0.35 ✗) |" in text
    assert "| continual | fedrapp | 8 | 50.00 ± 0.00 | 1.00 ± 0.00 | 2 | +2.00 ± 0.00 |" in text
    assert "| fedrapp | 25.00 | 37.50 |" in text  # late joiner: client 3 alone; held-out accuracy


def test_the_report_finds_moving_streams_and_populations_by_config_whatever_their_labels(tmp_path):
    """A grid of one's own, with other label names: the gains, the switches and the late joiners are still found
    (from the cells' configs and summaries), and a table with nothing to show says so."""
    switches = {"switches": 2, "post_switch_accuracy": 0.5, "recovery_batches": 1.0, "unrecovered": 0,
                "forgetting": 0.0}  # fmt: skip
    late = {"config": {"late-clients": 1}, "per_client_accuracy": {"3": 0.25}, "per_client_samples": {"3": 30}}
    cells = [
        _cell(tmp_path, "my moving one", "local", 0, 0.600, switches=switches),
        _cell(tmp_path, "my moving one", "mine", 0, 0.610, switches=switches),
        _cell(tmp_path, "newcomers", "mine", 0, 0.5, **late),
    ]
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    text = write_report(tmp_path, tmp_path / "out").read_text()
    assert "| mine | 61.00 (+1.00) | 50.00 |" in text  # the gain over the rule whose config is none-fed
    assert "| my moving one | mine | 2 | 50.00 | 1.00 | 0 | +0.00 |" in text
    assert "| mine | 25.00 | – |" in text
    empty = [_cell(tmp_path / "b", "still", "local", 0, 0.6), _cell(tmp_path / "b", "still", "mine", 0, 0.6)]
    (tmp_path / "b" / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in empty))
    text = write_report(tmp_path / "b", tmp_path / "b" / "out").read_text()
    assert "No cell of this method has a client that switched domains" in text
    assert "No cell of this method has late or held-out clients" in text


def _row(rnd: int, client: int, domain: str, mu: float, peers: dict) -> dict:
    return {"round": rnd, "client": client, "status": "ok", "domain": domain, "mu": mu, "peer_weights": peers}


def test_memory_at_switches_counts_batches_since_a_switch_and_the_same_domain_peer_share(tmp_path):
    rows = [
        _row(1, 0, "A", 0.5, {"1": 1.0}),  # first batches: left out (the memory is P0's)
        _row(1, 1, "A", 0.5, {"0": 1.0}),
        _row(2, 0, "A", 0.7, {"1": 0.25, "2": 0.75}),  # no switch yet (3+); client 2 is in A too: share .75
        _row(2, 1, "B", 0.3, {"0": 1.0}),  # switched: 0 batches since; its peer 0 is in A: share 0
        _row(2, 2, "A", 0.6, {}),  # its first batch: left out
        _row(3, 1, "B", 0.4, {"0": 0.5, "2": 0.5}),  # 1 batch since its switch; nobody else in B: share 0
    ]
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = memory_at_switches([tmp_path], horizon=3)
    assert sorted(table) == [0, 1, 3]
    assert (table[0][0].mean, table[0][1].mean) == (pytest.approx(0.3), pytest.approx(0.0))
    assert (table[1][0].mean, table[1][1].mean) == (pytest.approx(0.4), pytest.approx(0.0))
    assert (table[3][0].mean, table[3][1].mean) == (pytest.approx(0.7), pytest.approx(0.75))
    assert sorted(memory_at_switches([tmp_path], horizon=0)) == [0]  # fixed streams: one row
