"""The trust report (fedrapp_app.bench.trust): signal honesty from own-prompt curves, goal tables, figures."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedrapp_app.bench import write_rows
from fedrapp_app.bench.stats import mean_std, settings_of
from fedrapp_app.bench.trust import (
    candidate,
    centred,
    goal_check_markdown,
    goal_markdown,
    honesty,
    main,
    own_prompt_pairs,
    thresholds_within_noise,
    trust_summary_markdown,
    trust_timing,
    trust_timing_markdown,
)


def own_block(
    domain: str, e: list[float], dm: list[float], dacc: list[float], trust: bool = False, nb: list[float] | None = None
) -> dict:
    """One client's curves: round 1 has no own prompt; later rounds have entropy gap e, marginal gap dm, Δacc
    (and, given ``nb``, the neighbour-vote gap V_pre − V_own)."""
    size = len(e) + 1
    h_pre = [1.0] * size
    block = {
        "domain": domain,
        "round": list(range(1, size + 1)),
        "n": [10] * size,
        "acc": [0.5] * size,
        "acc_before": [0.5] * size,
        "h_pre": h_pre,
        "h_post": [0.9] * size,
        "h_own": [None] + [1.0 + x for x in e],
        "acc_own": [None] + [0.5 - x for x in dacc],
        "marginal_received": [None] + [2.0] * len(e),
        "marginal_own": [None] + [2.0 + x for x in dm],
    }
    if trust:
        block.update(trust_memory=[1.0] + [0.5] * len(e), trust_peers=[1.0] * size)
    if nb is not None:
        block.update(v_pre=[None] + [0.2 + x for x in nb], v_own=[None] + [0.2] * len(nb))
    return block


def row(rule: str, strategy: str, seed: int, accuracy: float, clients: dict, grid: str = "g", **config) -> dict:
    labels = {"setting": "S1", "method": "im", "rule": rule, "seed": str(seed)}
    return {
        "key": f"{rule}-{seed}",
        "id": f"{rule}-{seed}",
        "config": {"strategy": strategy, "local-method": "im", "seed": seed, **config},
        "grids": {
            grid: {
                "index": 0,
                "labels": labels,
                "order": [0, 0, 0, seed],
                "compare": ["method", "rule"],
                "oracle": False,
            }
        },
        "summary": {"micro_accuracy": accuracy, "macro_accuracy": accuracy, "micro_accuracy_received_prompt": accuracy},
        "seconds": 1.0,
        "clients": clients,
    }


def test_an_honest_signal_scores_one_and_a_lying_one_a_third():
    # Δacc follows the information gap e − dm exactly; the entropy gap e alone mostly points the other way.
    e, dm = [0.3, -0.1, 0.2], [0.5, -0.4, 0.1]
    dacc = [x - y for x, y in zip(e, dm, strict=True)]  # -0.2, +0.3, +0.1
    flip = [[-x for x in values] for values in (e, dm, dacc)]
    clients = {"0": own_block("blur", e, dm, dacc), "1": own_block("contrast", *flip)}
    pairs = own_prompt_pairs([row("fedrapp", "fedrapp", 0, 0.5, clients)])
    assert len(pairs) == 6  # round 1 had no own prompt
    h = honesty(pairs)
    assert h.agreement["information"] == 1.0 and h.corr["information"] == pytest.approx(1.0)
    assert h.agreement["entropy"] == pytest.approx(1 / 3) and h.corr["entropy"] < 0
    assert h.received_better == pytest.approx(0.5) and h.positive["information"] == pytest.approx(0.5)
    np.testing.assert_allclose(candidate("marginal", pairs.e, pairs.dm)[:3], [-0.5, 0.4, -0.1])
    with pytest.raises(ValueError, match="unknown signal"):
        candidate("loss", pairs.e, pairs.dm)


def test_the_neighbour_vote_is_a_candidate_where_the_rows_have_it_and_nan_where_they_predate_it():
    e, dm, dacc = [0.3, -0.1, 0.2], [0.5, -0.4, 0.1], [-0.2, 0.3, 0.1]
    voted = own_block("blur", e, dm, dacc, nb=[-0.05, 0.1, 0.02])  # the vote's sign is Δacc's
    older = own_block("contrast", e, dm, dacc)  # a row from before the vote was reported
    pairs = own_prompt_pairs([row("fedrapp", "fedrapp", 0, 0.5, {"0": voted, "1": older})])
    np.testing.assert_allclose(pairs.nb[:3], [-0.05, 0.1, 0.02])
    assert np.isnan(pairs.nb[3:]).all()
    h = honesty(pairs)
    assert h.agreement["neighbours"] == 1.0 and h.positive["neighbours"] == pytest.approx(2 / 3)  # over its 3 pairs


def test_centring_removes_each_rounds_mean():
    ident = np.array([0, 0, 1, 1, 1])
    np.testing.assert_allclose(centred(np.array([1.0, 3.0, 0.0, 3.0, 6.0]), ident), [-1, 1, -3, 0, 3])


def test_goal_table_pairs_every_rule_with_none_fed_and_fedavg_on_the_same_seeds():
    rows = [
        row(rule, strategy, seed, acc + seed / 100, {})
        for rule, strategy, acc in (
            ("none-fed", "none-fed", 0.50),
            ("fedavg", "fedavg", 0.48),
            ("trust", "fedrapp", 0.52),
        )
        for seed in (0, 1)
    ]
    text = goal_markdown(settings_of(rows))
    assert "| S1 | im | 50.50 ± 0.71 | 48.50 ± 0.71 | 52.50 ± 0.71 |" in text
    assert "| S1 | im | -2.00 ± 0.00 | +2.00 ± 0.00 |" in text  # vs none-fed: fedavg, trust
    assert "| S1 | im | +2.00 ± 0.00 | +4.00 ± 0.00 |" in text  # vs fedavg: none-fed, trust


def test_goal_check_pools_the_grids_and_judges_each_option_row():
    def cells(rule, strategy, acc, grid, **config):
        return [row(rule, strategy, seed, acc + seed / 100, {}, grid, **config) for seed in (0, 1)]

    rows = cells("none-fed", "none-fed", 0.50, "goal") + cells("fedavg", "fedavg", 0.49, "goal")
    rows += cells("fedrapp", "fedrapp", 0.52, "goal")  # the best FedRAPP gain: +2 points
    rows += cells("trust a", "fedrapp", 0.516, "option", **{"trust-rate": 1.0})  # keeps 80% (a row of 9c3f0c6)
    rows += cells("trust b", "fedrapp", 0.515, "option", trust=True)  # keeps 75%: fails (the switch of today)
    text = goal_check_markdown(settings_of(rows))
    # zero spread over the seeds: each interval is a point, which holds a threshold only where the mean is on it
    assert "| S1 | im | trust a | +1.60 ± 0.00 | +2.60 ± 0.00 | +2.00 | 80% | yes | [+1.60, +1.60] | +1.60 |" in text
    assert "| S1 | im | trust b | +1.50 ± 0.00 | +2.50 ± 0.00 | +2.00 | 75% | **no** | [+1.50, +1.50] | none |" in text
    assert "| S1 | im | fedrapp | +2.00 ± 0.00 | +3.00 ± 0.00 | +2.00 | 100% | yes |" in text  # the paper's, beside
    assert "| fedavg |" not in text  # only the option's rows and the paper's rule are judged
    assert "| trust b | 0 of 1 | +1.50 | +1.50 | 1 of 1 | 0 of 1 |" in text  # the totals per rule
    losing = rows[:4] + cells("trust c", "fedrapp", 0.4975, "option", **{"trust-rate": 1.0})  # 0.25 below none-fed
    assert "| S1 | im | trust c | -0.25 ± 0.00 | +0.75 ± 0.00 | – | – | **no** | [-0.25, -0.25] | none |" in (
        goal_check_markdown(settings_of(losing))
    )
    assert goal_check_markdown(settings_of(rows[:6])) == ""  # no option ran


def test_a_miss_whose_interval_holds_the_threshold_is_marked_within_noise():
    # Δ vs none-fed per seed: −0.55, +0.25 points (mean −0.15, std 0.57): the 95% interval, mean ± 12.71·0.40,
    # holds the −0.2 threshold, so the "yes" is the seeds'; an option 1 point below none-fed on both is a clear miss.
    def cells(rule, strategy, accs, **config):
        return [row(rule, strategy, seed, acc, {}, "g", **config) for seed, acc in enumerate(accs)]

    rows = cells("none-fed", "none-fed", [0.50, 0.50]) + cells("fedavg", "fedavg", [0.49, 0.49])
    rows += cells("trust noisy", "fedrapp", [0.4945, 0.5025], **{"trust-rate": 1.0})
    rows += cells("trust clear", "fedrapp", [0.4900, 0.4900], **{"trust-rate": 1.0})
    text = goal_check_markdown(settings_of(rows))
    noisy = next(line for line in text.splitlines() if line.startswith("| S1 | im | trust noisy |"))
    assert noisy.endswith("| yes | [-5.23, +4.93] | -0.20 |")
    clear = next(line for line in text.splitlines() if line.startswith("| S1 | im | trust clear |"))
    assert clear.endswith("| **no** | [-1.00, -1.00] | none |")
    assert "| trust clear | 0 of 1 | -1.00 | -1.00 | 0 of 1 | 0 of 1 |" in text  # ties FedAvg, not above
    # the 80% check's threshold counts too, and nothing is said under two seeds
    stat = mean_std([0.004, 0.008])  # +0.4, +0.8 points: interval [-1.94, +3.14] holds 80% of a +1 point gain
    assert thresholds_within_noise(stat, 0.01) == pytest.approx([-0.002, 0.008])
    assert thresholds_within_noise(mean_std([0.004]), 0.01) is None


def test_the_report_writes_its_tables_and_figures(tmp_path):
    rng = np.random.default_rng(0)
    clients = {
        str(c): own_block("blur" if c % 2 else "contrast", *(list(rng.normal(0, 0.1, 30)) for _ in range(3)), True)
        for c in range(4)
    }
    rows = [row("trust", "fedrapp", seed, 0.5, clients) for seed in (0, 1)]
    write_rows(tmp_path, rows)
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "trust.md").read_text()
    assert "Signal honesty" in text and "| S1, im, trust | 240 |" in text
    for name in ("signal-g.png", "trust-g.png"):
        with Image.open(tmp_path / "out" / name) as image:
            assert image.size[0] > 300
    assert main([str(tmp_path / "empty")]) == 2


def test_several_bench_directories_pool_their_seeds_and_a_cell_in_two_is_refused(tmp_path, capsys):
    trust = {"trust-rate": 1.0}

    def cells(seeds, rule="trust", acc=0.52):
        return [row("none-fed", "none-fed", seed, 0.50 + seed / 100, {}) for seed in seeds] + [
            row(rule, "fedrapp", seed, acc + seed / 100, {}, **trust) for seed in seeds
        ]

    write_rows(tmp_path / "a", cells([0, 1]))
    write_rows(tmp_path / "b", cells([2]))
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "trust.md").read_text()
    assert text.startswith("# Own-prompt signal and trust option: `a` + `b`")
    assert "| S1 | im | 51.00 ± 1.00 | 53.00 ± 1.00 |" in text  # seeds 0, 1, 2 in one setting
    assert "| S1 | im | trust | +2.00 ± 0.00 |" in text  # judged over the three
    # a rule that ran on seeds 0 and 1 only (the first directory) is left out of the goal check, and said so
    write_rows(tmp_path / "d", [row("trust old", "fedrapp", seed, 0.51, {}, **trust) for seed in (0, 1)])
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "d"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "trust.md").read_text()
    assert "| S1 | im | trust | +2.00 ± 0.00 |" in text and "| S1 | im | trust old |" not in text
    assert "Not judged (fewer seeds than none-fed, whose seeds the best gain is taken over): trust old (2 of 3" in text
    write_rows(tmp_path / "c", cells([1]))  # seed 1's cells again
    assert main([str(tmp_path / "a"), str(tmp_path / "c"), "--out", str(tmp_path / "out")]) == 2
    assert "is in both" in capsys.readouterr().err


def test_the_trust_summary_pools_every_client_round_and_counts_the_votes():
    e, dm, dacc = [0.1, 0.1, 0.1], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    block = own_block("blur", e, dm, dacc, trust=True, nb=[0.1, 0.0, -0.1])  # a win, a tie, a loss
    text = trust_summary_markdown(settings_of([row("trust", "fedrapp", 0, 0.5, {"0": block})]))
    # memory trust 1, 0.5, 0.5, 0.5 -> 0.62; peers all 1; votes: 1 win, 1 tie of 3; Δacc 0: nothing to be right on
    assert "| S1, im, trust | 0.62 | 1.00 | 33% | 33% | – |" in text
    assert trust_summary_markdown(settings_of([row("none-fed", "none-fed", 0, 0.5, {})])) == ""
    scored = own_block("blur", e, dm, [0.1, 0.1, 0.1], trust=True, nb=[0.1, 0.0, -0.1])  # the sent is the better
    text = trust_summary_markdown(settings_of([row("trust", "fedrapp", 0, 0.5, {"0": scored})]))
    assert "| 33% | 33% | 50% |" in text  # the win is right, the loss wrong, the tie not counted


def test_with_a_probe_the_trust_summary_counts_the_probes_contest():
    """Where clients scored the probe, the votes and accuracies of the probe against the own prompt count, not the
    sent prompt's (which lost everywhere here)."""
    e, dm, dacc = [0.1, 0.1], [0.0, 0.0], [-0.1, -0.1]
    block = own_block("blur", e, dm, dacc, trust=True, nb=[-0.1, -0.1])
    block.update(
        v_probe=[None, 0.3, 0.3], v_own_probe=[None, 0.2, 0.2], acc_probe=[None, 0.7, 0.5]
    )  # own acc: 0.6 -> the probe wins by the votes, right in round 2, wrong in round 3
    text = trust_summary_markdown(settings_of([row("trust", "fedrapp", 0, 0.5, {"0": block})]))
    assert "| 100% | 0% | 50% |" in text


def test_the_timing_table_finds_the_lock_and_the_round_the_memory_is_trusted():
    e, dm, dacc = [0.1] * 4, [0.0] * 4, [0.0] * 4
    locked = own_block("blur", e, dm, dacc, trust=True)
    locked.update(trust_memory=[0.0, 0.95, 0.0, 0.0, 0.0], trust_peers=[0.5, 1.0, 0.0, 0.0, 0.0])  # locked from 3
    other = own_block("blur", e, dm, dacc, trust=True)
    other.update(trust_memory=[0.0, 0.9, 0.0, 0.0, 0.0], trust_peers=[0.0, 0.0, 0.0, 0.0, 0.0])
    assert trust_timing({"clients": {"0": locked, "1": other}}) == (3, 2)  # mean memory 0.925 in round 2
    other.update(trust_memory=[0.0, 0.5, 0.0, 0.0, 0.1])  # a trust back above 0 in the last round: no lock
    assert trust_timing({"clients": {"0": locked, "1": other}}) == (None, None)
    text = trust_timing_markdown(settings_of([row("trust", "fedrapp", 0, 0.5, {"0": locked})]))
    assert "| S1, im, trust | 1 of 1 | 3 | 2 |" in text
