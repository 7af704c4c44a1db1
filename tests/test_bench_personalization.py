"""The personalization report: per-domain accuracy, same-domain peer share against uniform weights, figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from fedrapp_app.bench import write_rows
from fedrapp_app.bench.personalization import (
    domain_accuracy,
    full_rounds,
    main,
    pivot_markdown,
    pooled_share,
    share_curves,
    uniform_share,
    write_personalization,
)
from fedrapp_app.bench.stats import settings_of


def block(domain: str, rounds: list[int], acc: list[float], n: list[int], share: list[float | None]) -> dict:
    size = len(rounds)
    return {
        "domain": domain,
        "round": rounds,
        "n": n,
        "acc": acc,
        "acc_before": acc,
        "h_pre": [1.0] * size,
        "h_post": [0.9] * size,
        "update_norm": [0.1] * size,
        "r": [0.5] * size,
        "mu": [0.4] * size,
        "gamma": [0.3] * size,
        "same_domain_share": share,
    }


def fake_row(key: str, strategy: str, seed: int, shares: tuple[float, float] = (0.5, 0.5)) -> dict:
    """Three clients: 0 and 2 blur, 1 contrast; client 2 skips round 2 and has no peers in round 1."""
    clients = {
        "0": block("blur", [1, 2], [0.5, 0.7], [10, 30], [shares[0], shares[1]]),
        "1": block("contrast", [1, 2], [0.2, 0.4], [20, 20], [0.0, 0.0]),
        "2": block("blur", [1], [1.0], [10], [None]),
    }
    labels = {"strategy": strategy, "seed": str(seed)}
    return {
        "key": key,
        "id": key,
        "config": {"strategy": strategy, "local-method": "im", "seed": seed},
        "grids": {"S1": {"index": 0, "labels": labels, "order": [0, seed], "compare": ["strategy"], "oracle": False}},
        "summary": {"micro_accuracy": 0.5, "macro_accuracy": 0.5, "micro_accuracy_received_prompt": 0.5},
        "seconds": 1.0,
        "clients": clients,
    }


def test_uniform_share_counts_the_other_clients_of_the_same_domain_that_took_part():
    domains = {0: "blur", 1: "contrast", 2: "blur", 3: "blur", 4: "contrast"}
    assert uniform_share(domains, 0) == pytest.approx(2 / 4)
    assert uniform_share(domains, 1) == pytest.approx(1 / 4)
    assert uniform_share(domains, 0, present=[0, 1, 2]) == pytest.approx(1 / 2)
    assert uniform_share(domains, 1, present=[1, 4]) == pytest.approx(1.0)
    assert uniform_share(domains, 0, present=[0]) is None  # nobody to share with


def test_share_curves_mark_missing_rounds_and_clients_without_peers():
    rounds, shares, uniform = share_curves(fake_row("a", "fedrapp", 0, shares=(0.25, 1.0)))
    assert rounds.tolist() == [1, 2]
    assert shares[0].tolist() == [0.25, 1.0] and shares[1].tolist() == [0.0, 0.0]
    assert math.isnan(shares[2, 0]) and math.isnan(shares[2, 1])  # no peers, then absent
    # round 1: all three clients; round 2: clients 0 and 1 only (of different domains)
    assert uniform[:, 0].tolist() == [0.5, 0.0, 0.5] and uniform[:2, 1].tolist() == [0.0, 0.0]
    assert math.isnan(uniform[2, 1])
    assert full_rounds(fake_row("a", "fedrapp", 0)).tolist() == [True, False]


def test_pooled_share_averages_clients_and_rounds_per_seed_then_over_seeds():
    rows = [fake_row("a", "fedrapp", 0, shares=(1.0, 1.0)), fake_row("b", "fedrapp", 1, shares=(0.5, 0.5))]
    ours, uniform = pooled_share(rows)
    # seed 0: mean(1, 1, 0, 0) = 0.5; seed 1: mean(0.5, 0.5, 0, 0) = 0.25; client 2 never had peers
    assert ours.n == 2 and ours.mean == pytest.approx(0.375)
    assert ours.std == pytest.approx(np.std([0.5, 0.25], ddof=1))
    assert uniform.mean == pytest.approx((0.5 + 0 + 0 + 0) / 4) and uniform.std == pytest.approx(0.0)
    full, full_uniform = pooled_share(rows[:1], full_only=True)
    assert full.mean == pytest.approx(0.5) and full_uniform.mean == pytest.approx(0.25)  # round 1, clients 0, 1


def test_domain_accuracy_pools_the_samples_of_each_domains_clients():
    acc = domain_accuracy(fake_row("a", "fedrapp", 0))
    # blur: (0.5·10 + 0.7·30 + 1.0·10) / 50; contrast: (0.2·20 + 0.4·20) / 40
    assert acc == {"blur": pytest.approx(36 / 50), "contrast": pytest.approx(12 / 40)}


def test_report_writes_tables_and_figures_from_the_rows(tmp_path):
    rows = [fake_row(f"f{s}", "fedrapp", s) for s in (0, 1)] + [fake_row(f"n{s}", "none-fed", s) for s in (0, 1)]
    rows += [fake_row(f"a{s}", "fedamp", s, shares=(1.0, 1.0)) for s in (0, 1)]
    for row in rows[2:4]:
        for b in row["clients"].values():
            b["same_domain_share"] = [None] * len(b["round"])
    write_rows(tmp_path, rows)
    path = write_personalization(tmp_path, tmp_path / "out")
    text = path.read_text()
    assert "| fedrapp | 72.00 ± 0.00 | 30.00 ± 0.00 |" in text
    share_rows = [line for line in text.splitlines() if line.startswith("| fed") and "12.5 ± 0.0" in line]
    # the peer-weighting rules only (none-fed has no peers); FedAMP's share is its own
    assert share_rows == [
        "| fedrapp | 25.0 ± 0.0 | 12.5 ± 0.0 | 25.0 ± 0.0 | 25.0 ± 0.0 |",
        "| fedamp | 50.0 ± 0.0 | 12.5 ± 0.0 | 50.0 ± 0.0 | 25.0 ± 0.0 |",
    ]
    for name in ("share-S1.png", "traces-S1.png"):
        with Image.open(tmp_path / "out" / name) as image:
            assert image.mode == "P" and image.width > 300  # a palette PNG: small enough to commit
    assert "traces" not in text.split("![share S1]")[0]  # FedAMP joins the share figure, not the r/μ/γ traces


def test_command_line_names_a_grid_without_domains(tmp_path, capsys):
    row = fake_row("a", "fedrapp", 0)
    row["clients"]["1"]["domain"] = None
    write_rows(tmp_path, [row])
    assert main([str(tmp_path)]) == 2
    assert "testbed-domains" in capsys.readouterr().err
    assert main([str(tmp_path / "empty")]) == 2


def pivot_row(method: str, rule: str, seed: int, micro: float, oracle: bool = False) -> dict:
    strategy = {"oracle": "domain-oracle"}.get(rule, rule)
    config = {"local-method": "zeroshot" if method == "zeroshot" else method, "strategy": strategy, "seed": seed}
    labels = {"method": method, "rule": rule, "seed": str(seed)}
    return {
        "key": f"{method}-{rule}-{seed}",
        "config": config,
        "grids": {
            "S1": {"index": 0, "labels": labels, "order": [0, 0, seed], "compare": ["method", "rule"], "oracle": oracle}
        },
        "summary": {"micro_accuracy": micro},
        "seconds": 1.0,
    }


def test_pivot_puts_rules_in_rows_bolds_the_best_non_oracle_and_pairs_the_gaps_by_seed():
    rows = [pivot_row("zeroshot", "none-fed", s, 0.40) for s in (0, 1)]
    for method, base in (("im", 0.50), ("adaprompt", 0.45)):
        for seed, shift in ((0, 0.0), (1, 0.10)):  # seed 1 is easier for every rule: gaps must be paired
            rows.append(pivot_row(method, "none-fed", seed, base + shift))
            rows.append(pivot_row(method, "oracle", seed, base + shift + 0.03, oracle=True))
            rows.append(pivot_row(method, "fedrapp", seed, base + shift + 0.01 * (seed + 1)))
            rows.append(pivot_row(method, "fedavg", seed, base + shift - 0.02))
    text = pivot_markdown(settings_of(rows))
    lines = text.splitlines()
    assert lines[0] == "| rule | im | adaprompt |"
    assert lines[2] == "| zeroshot | 40.00 ± 0.00 | 40.00 ± 0.00 |"
    assert lines[4] == "| oracle (oracle, reference) | 58.00 ± 7.07 | 53.00 ± 7.07 |"  # higher, never bold
    assert lines[5] == "| fedrapp | **56.50 ± 7.78** | **51.50 ± 7.78** |"
    assert "| fedrapp | +1.50 ± 0.71 | +1.50 ± 0.71 |" in text  # vs none-fed: (+1, +2) per seed
    assert "| fedrapp | -1.50 ± 0.71 | -1.50 ± 0.71 |" in text  # vs the oracle: (-2, -1) per seed
    vs_fedavg = text.split("| Δ vs FedAvg (paired, points) | im | adaprompt |")[1].split("\n\n")[0]
    assert "| fedrapp | +3.50 ± 0.71 | +3.50 ± 0.71 |" in vs_fedavg  # (+3, +4) per seed
    assert "| none-fed | +2.00 ± 0.00 | +2.00 ± 0.00 |" in vs_fedavg
    with pytest.raises(ValueError, match="two axes"):
        pivot_markdown(settings_of([fake_row("a", "fedrapp", 0)]))
