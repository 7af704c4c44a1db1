"""The privacy-utility report (``bench/privacy.py``): budgets read from configs, drops paired by seed with the same
rule without dp, the goal's verdict, the figures and the attacks' table."""

from __future__ import annotations

import json
import math

import pytest

from fedrapp_app.bench import privacy
from fedrapp_app.config import DEFAULTS


def row(config: dict, seed: int, accuracy: float, label: str) -> dict:
    return {
        "status": "ok",
        "full_config": {**DEFAULTS, **config, "seed": seed},
        "summary": {"micro_accuracy": accuracy},
        "grids": {"g": {"labels": {"setting": "S1", "rule": label, "seed": str(seed)}}},
    }


def test_budget_names_off_clip_only_epsilon_and_a_clip_that_is_not_the_default():
    assert privacy.budget({}) == "off" and privacy.budget({"dp": False, "dp-epsilon": 1.0}) == "off"
    assert privacy.budget({"dp": True, "dp-epsilon": math.inf}) == "∞"
    assert privacy.budget({"dp": True, "dp-epsilon": 8.0}) == "8"
    assert privacy.budget({"dp": True, "dp-epsilon": 2.0, "dp-clip": DEFAULTS["dp-clip"] * 2}).startswith("2, clip ")
    ordered = sorted(["1", "off", "8", "∞", "2"], key=privacy._order)
    assert ordered == ["off", "∞", "8", "2", "1"]


def test_the_goal_pairs_the_drop_by_seed_and_needs_both_halves(tmp_path):
    setting = {"testbed-domains": "blur:2,contrast:2"}
    trust = {**setting, "strategy": "fedrapp", "trust": True}
    rows = []
    for seed, (nf, off, eps8, eps1) in enumerate([(0.50, 0.56, 0.55, 0.49), (0.52, 0.57, 0.545, 0.50)]):
        rows += [
            row({**setting, "strategy": "none-fed"}, seed, nf, "none-fed"),
            row(trust, seed, off, "trust"),
            row({**trust, "dp": True, "dp-epsilon": 8.0}, seed, eps8, "trust"),
            row({**trust, "dp": True, "dp-epsilon": 1.0}, seed, eps1, "trust"),
        ]
    tables, goal, data = privacy.privacy_tables(privacy.collect(rows), privacy.names_of(rows))
    at8 = next(d for d in data if d["budget"] == "8")
    assert at8["drop"] == pytest.approx(((0.55 - 0.56) + (0.545 - 0.57)) / 2)
    assert at8["vs_none_fed"] == pytest.approx(((0.55 - 0.50) + (0.545 - 0.52)) / 2)
    # at eps 8: -1.75 points from its own, above none-fed: met; at eps 1 below none-fed: the goal breaks there
    assert "| yes | 8 |" in goal
    assert "| none-fed | 51.00 ± 1.41 | – | – |" in tables  # none-fed without dp only
    # the same grid one point lower at eps 8: the drop is 2.75 points, the goal is missed
    lower = [{**r, "summary": {"micro_accuracy": r["summary"]["micro_accuracy"] - 0.01}} if r["full_config"].get(
        "dp-epsilon") == 8.0 and r["full_config"]["dp"] else r for r in rows]  # fmt: skip
    assert "| no | none |" in privacy.privacy_tables(privacy.collect(lower), {})[1]


def test_the_report_writes_its_tables_figures_and_the_attacks(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    rows = [row({"strategy": "fedavg", "dp": dp, "dp-epsilon": eps}, s, 0.5 + s / 100, "fedavg")
            for s in (0, 1) for dp, eps in ((False, 8.0), (True, 8.0), (True, math.inf))]  # fmt: skip
    (bench / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    leakage = tmp_path / "leak.json"
    scores = {"domain_accuracy": 0.25, "class_precision": 0.1}
    results = [{"method": "im+csc", "epsilon": e, "seed": s, "pair_auc": a, **scores}
               for e, a in (("inf", 0.9), ("8", 0.5)) for s in (0, 1)]  # fmt: skip
    leakage.write_text(json.dumps(results))
    other = tmp_path / "leak-more.json"
    other.write_text(json.dumps([{**results[0], "method": "adaprompt"}]))
    path = privacy.write_report(bench, tmp_path / "out", [leakage, other])
    text = path.read_text()
    assert "| im+csc | no dp | 0.90 ± 0.00 |" in text and "| im+csc | 8 | 0.50 ± 0.00 |" in text
    assert text.index("| im+csc | no dp |") < text.index("| im+csc | 8 |") and "| adaprompt | no dp |" in text
    assert (tmp_path / "out" / "privacy-utility.png").stat().st_size > 0
    assert (tmp_path / "out" / "leakage.png").stat().st_size > 0
    assert {d["budget"] for d in json.loads((tmp_path / "out" / "privacy.json").read_text())["cells"]} == {
        "off",
        "8",
        "∞",
    }
    with pytest.raises(SystemExit, match="no finished cell"):
        privacy.write_report(tmp_path / "empty", tmp_path / "out2")
