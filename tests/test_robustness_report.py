"""benchmarks/robustness_report.py: every column scores the same honest clients; rows are weighted by samples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import robustness_report  # noqa: E402


def row(strategy: str, attack: str, attackers: str, acc: dict[str, list[float]], seed: int = 0) -> dict:
    return {
        "config": {"strategy": strategy, "attack-clients": attackers, "seed": seed},
        "grids": {"robustness": {"labels": {"strategy": strategy, "attack": attack, "seed": str(seed)}}},
        "clients": {c: {"acc": a, "acc_before": [x / 2 for x in a], "n": [10] * len(a)} for c, a in acc.items()},
    }


def test_attackers_of_any_row_are_left_out_of_every_column() -> None:
    clean = row("fedavg", "clean", "", {"0": [1.0, 1.0], "1": [0.5, 0.0], "2": [1.0, 0.5]})
    attacked = row("fedavg", "random-1", "0", {"0": [0.0, 0.0], "1": [0.0, 0.0], "2": [1.0, 0.5]})
    attackers = robustness_report.attackers_of([clean, attacked])
    assert attackers == {0}
    assert robustness_report.honest_accuracy(clean, attackers) == pytest.approx(2.0 / 4)  # clients 1 and 2
    assert robustness_report.honest_accuracy(clean, attackers, "acc_before") == pytest.approx(1.0 / 4)
    table = robustness_report.table([clean, attacked])
    assert "| fedavg | 50.00 ± 0.00 | 37.50 ± 0.00 (-12.50) |" in table
    assert "all but [0]" in table


def test_samples_weigh_the_rounds() -> None:
    r = row("none-fed", "clean", "", {"1": [1.0, 0.0]})
    r["clients"]["1"]["n"] = [30, 10]
    assert robustness_report.honest_accuracy(r, set()) == pytest.approx(0.75)
