"""The run report (``fedrapp-report``): built from short in-process runs of four server rules, one with a client
that fails in one round, and a copy of it cut short as an interrupted run; every number is recomputed here from
``rounds.jsonl`` on its own."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fedrapp_app.federation.client import app as client_app
from fedrapp_app.report import load_run, write_report
from fedrapp_app.report.tables import client_stats, compare, peer_matrix, same_domain_share, totals, wall_time
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import read_rows, run_federation, small_run

MAX_FIGURE_BYTES = 300 * 1024
FAILING = (1, 2)  # (client, round) whose ClientApp raises
DOMAINS = "gaussian_noise:1,blur:2"  # clients 0, 2 in one domain, 1, 3 in the other


def failing_app(client: int, round_number: int):
    """The real ClientApp, except that ``client`` raises when it trains in ``round_number``."""

    def app(message, context):
        if (
            message.metadata.message_type == "train"
            and int(context.node_config["partition-id"]) == client
            and message.metadata.group_id == str(round_number)
        ):
            raise RuntimeError("injected failure for the report test")
        return client_app(message, context)

    return app


@pytest.fixture(scope="module")
def testbed_tiny_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


@pytest.fixture(scope="module")
def runs(testbed_tiny_report: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run folders: fedrapp (client 1 fails in round 2), fedavg, fedamp, none-fed, and 'interrupted' (the
    fedrapp run without summary.json, its rows cut after round 2 and a half-written last line)."""
    out = tmp_path_factory.mktemp("runs")
    base = small_run(testbed_tiny_report, out, **{"num-clients": 4, "testbed-domains": DOMAINS})
    folders = {}
    for strategy in ("fedrapp", "fedavg", "fedamp", "none-fed"):
        app = failing_app(*FAILING) if strategy == "fedrapp" else client_app
        summary, _, _ = run_federation({**base, "strategy": strategy, "run-name": strategy}, app=app)
        folders[strategy] = Path(summary["run_dir"])
    cut = out / "interrupted"
    shutil.copytree(folders["fedrapp"], cut)
    (cut / "summary.json").unlink()
    lines = (cut / "rounds.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["round"] <= 2]
    (cut / "rounds.jsonl").write_text("\n".join(kept) + "\n" + lines[len(kept)][:40])
    folders["interrupted"] = cut
    return folders


@pytest.fixture(scope="module")
def reports(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("reports")
    return {name: write_report([folder], out / name) for name, folder in runs.items()}


def _per_client(rows):
    """client -> [samples, correct, correct_before] over scored rows, recomputed independently."""
    out = {}
    for r in rows:
        if r["status"] == "ok":
            n = out.setdefault(r["client"], [0, 0, 0])
            n[0] += r["num_examples"]
            n[1] += r["correct"]
            n[2] += r["correct_before"]
    return out


# ------------------------------------------------------------------------------------------------ files
def test_every_run_gets_every_file_and_small_figures(reports):
    for name, page in reports.items():
        files = {p.name for p in page.parent.iterdir()}
        expected = {"report.md", "overview.png", "accuracy.png", "status.png", "domains.png"}  # testbed: domains
        expected |= {"peers.png"} if name != "none-fed" else set()
        expected |= {"fedrapp.png"} if name in ("fedrapp", "interrupted") else set()
        assert files == expected, name
        for figure in page.parent.glob("*.png"):
            size = figure.stat().st_size
            assert 0 < size <= MAX_FIGURE_BYTES, f"{figure}: {size} bytes"
            assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_output_is_the_run_folder_report(runs, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(runs["fedavg"], folder)
    assert write_report([folder]) == folder / "report" / "report.md"


# ---------------------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("name", ["fedrapp", "fedavg", "interrupted"])
def test_client_numbers_equal_those_recomputed_from_the_rows(runs, reports, name):
    run = load_run(runs[name])
    rows = read_rows(runs[name]) if name != "interrupted" else run.rows
    mine = _per_client(rows)
    stats = client_stats(run)
    assert [s.client for s in stats] == [0, 1, 2, 3]
    for s in stats:
        samples, correct, before = mine.get(s.client, [0, 0, 0])
        assert (s.samples, s.correct, s.correct_before) == (samples, correct, before)
        seen = Counter(r["status"] for r in rows if r["client"] == s.client)
        assert {k: v for k, v in s.statuses.items() if v} == dict(seen)
        assert s.rounds_scored == sum(r["client"] == s.client and r["status"] == "ok" for r in rows)
    t = totals(stats, run)
    total = sum(v[0] for v in mine.values())
    assert t.samples == total and t.micro == sum(v[1] for v in mine.values()) / total
    assert t.macro == pytest.approx(np.mean([v[1] / v[0] for v in mine.values()]), abs=1e-15)
    page = reports[name].read_text()
    assert f"| online accuracy (%) | **{100 * t.micro:.2f}** | {100 * t.macro:.2f} |" in page
    for s in stats:
        numbers = f"{100 * s.accuracy:.2f} | {100 * s.accuracy_received:.2f} | {s.samples}"
        assert f"| {s.client} | {s.domain} | {numbers} |" in page
    if run.summary is not None:  # the report agrees with what the server wrote
        assert t.micro == pytest.approx(run.summary["micro_accuracy"], abs=1e-15)
        for c, acc in run.summary["per_client_accuracy"].items():
            assert stats[int(c)].accuracy == pytest.approx(acc, abs=1e-15)
        assert "disagrees" not in page


def test_the_failed_client_is_counted_and_its_reason_listed(runs, reports):
    client, round_number = FAILING
    stats = client_stats(load_run(runs["fedrapp"]))
    assert stats[client].statuses["failed"] == 1
    assert all(s.statuses["failed"] == 0 for s in stats if s.client != client)
    page = reports["fedrapp"].read_text()
    assert f"- round {round_number}, client {client}: failed (" in page
    assert "injected failure for the report test" in page


def test_the_peer_matrix_is_the_mean_of_the_rows_peer_weights(runs):
    run = load_run(runs["fedrapp"])
    assert run.domains == ["gaussian_noise:1", "blur:2", "gaussian_noise:1", "blur:2"]
    matrix = peer_matrix(run)
    for i in range(4):
        rounds = [r["peer_weights"] for r in read_rows(runs["fedrapp"]) if r["client"] == i and r.get("peer_weights")]
        expected = [sum(w.get(str(j), 0.0) for w in rounds) / len(rounds) for j in range(4)]
        np.testing.assert_allclose(matrix.weights[i], expected, rtol=1e-12)
        assert matrix.weights[i].sum() == pytest.approx(1.0)
        assert matrix.weights[i, i] == 0.0
    np.testing.assert_allclose(matrix.mixing.sum(axis=1), 1.0)
    shares = same_domain_share(matrix, run.domains)
    for i, (share, uniform) in shares.items():
        assert share == pytest.approx(matrix.weights[i, (i + 2) % 4])  # its one same-domain peer
        assert uniform == pytest.approx(1 / 3)


def test_fedamp_mixing_is_its_xi(runs):
    """FedAMP's ξ_ii = 1 − γ_i is at least its minimum self weight (0.1) in every round, so in the mean too."""
    run = load_run(runs["fedamp"])
    matrix = peer_matrix(run)
    np.testing.assert_allclose(matrix.mixing.sum(axis=1), 1.0)
    assert (np.diag(matrix.mixing) >= 0.1 - 1e-9).all() and (np.diag(matrix.mixing) < 1).all()
    first = next(r for r in run.rows if r["round"] == 1 and r["client"] == 0)
    assert sum(first["peer_weights"].values()) == pytest.approx(1.0)


def test_none_fed_has_no_peer_section(runs, reports):
    assert peer_matrix(load_run(runs["none-fed"])) is None
    assert "Who learns from whom" not in reports["none-fed"].read_text()


def test_an_interrupted_run_is_reported_as_far_as_it_got(runs, reports):
    run = load_run(runs["interrupted"])
    assert not run.complete and max(r["round"] for r in run.rows) == 2
    page = reports["interrupted"].read_text()
    assert "**Incomplete run.**" in page and "no summary.json" in page
    assert "was cut off mid-write and is left out" in page
    assert "start to the last row written so far" in page


def test_fedrapp_signals_and_wall_time_are_reported(runs, reports):
    page = reports["fedrapp"].read_text()
    assert "## FedRAPP's server signals" in page
    rows = read_rows(runs["fedrapp"])
    round_seconds = {r["round"]: r["round_seconds"] for r in rows}
    assert f"| rounds | {sum(round_seconds.values()):.1f} |" in page
    client = sum(r["client_metrics"]["t-total"] for r in rows if r["status"] == "ok")
    assert (
        f"| client compute, all client rounds summed (client-seconds, not a part of the total) | {client:.1f} |" in page
    )
    # The summary's seconds count from the server's start: setup, rounds and rest do not overlap and add up.
    w = wall_time(load_run(runs["fedrapp"]))
    assert w.before_files == 0.0 and not w.from_files and w.other is not None and w.other >= 0
    assert w.setup + w.rounds + w.other == pytest.approx(w.total)


def test_the_summarys_seconds_cover_the_setup_and_every_round(testbed_tiny_report, tmp_path, monkeypatch):
    """The summary's ``seconds`` count from the server's start, as ``setup_seconds`` do: what happens before the
    run's files open (the run-folder check, the lock, counting SuperNodes, a slow git call for the provenance) is
    inside both, so setup + rounds never exceed the total (the report printed a negative rest)."""
    import fedrapp_app.federation.server as server
    import fedrapp_app.recording.results as results

    def slowly(function):
        def slow(*args, **kwargs):
            time.sleep(0.2)
            return function(*args, **kwargs)

        return slow

    monkeypatch.setattr(server, "check_writable", slowly(server.check_writable))
    monkeypatch.setattr(results, "provenance", slowly(results.provenance))
    summary, _, _ = run_federation(small_run(testbed_tiny_report, tmp_path, **{"num-rounds": 2}))
    rounds = sum({r["round"]: r["round_seconds"] for r in read_rows(summary["run_dir"])}.values())
    assert summary["seconds"] >= summary["setup_seconds"] + rounds >= 0.4


# ------------------------------------------------------------------------------------------- comparison
def test_two_runs_side_by_side(runs):
    page = write_report([runs["fedrapp"], runs["fedavg"]])
    assert page == runs["fedrapp"].parent / "compare-strategy-fedrapp-vs-strategy-fedavg" / "report.md"  # by label
    text = page.read_text()
    assert "per-client differences are paired" in text
    assert (page.parent / "runs" / "fedavg" / "report.md").is_file()
    size = (page.parent / "compare.png").stat().st_size
    assert 0 < size <= MAX_FIGURE_BYTES
    a, b = (_per_client(read_rows(runs[n])) for n in ("fedrapp", "fedavg"))
    for c in range(4):
        delta = 100 * (b[c][1] / b[c][0] - a[c][1] / a[c][0])
        assert f"| {c} | " in text and f" {delta:+.2f} |" in text
    assert all(a[c][0] == b[c][0] for c in range(4)) and "different number of samples" not in text


def test_runs_that_differ_beyond_the_strategy_are_flagged(runs, tmp_path):
    other = tmp_path / "seed1"  # the interrupted fedrapp run, as if it had another seed
    shutil.copytree(runs["interrupted"], other)
    stored = json.loads((other / "config.json").read_text())
    stored["config"].update({"seed": 1, "tpt-lr": 0.1})  # tpt-lr cannot matter to adaprompt runs
    (other / "config.json").write_text(json.dumps(stored))
    comparison = compare([load_run(runs["fedavg"]), load_run(runs["fedamp"]), load_run(other)])
    assert comparison.differing == ["seed"]
    text = write_report([runs["fedavg"], other], tmp_path / "cmp").read_text()
    assert "did not see the same streams" in text and "`seed` (0 / 1)" in text  # the seed fixes the streams
    assert "**Incomplete runs**: `strategy=fedrapp, seed=1`" in text and "different number of samples" in text
    assert "| `strategy=fedavg, seed=0` (reference) | [fedavg](runs/fedavg/report.md) |" in text


def test_runs_that_differ_in_the_local_method_on_the_same_streams_are_paired(runs, tmp_path):
    """The pairing comes from the streams' fingerprint, not from which keys differ: another local method on the
    same streams is a paired comparison, with ECE and per-domain accuracy beside accuracy."""
    other = tmp_path / "tda"
    shutil.copytree(runs["fedavg"], other)
    stored = json.loads((other / "config.json").read_text())
    stored["config"]["local-method"] = "tda"
    (other / "config.json").write_text(json.dumps(stored))
    text = write_report([runs["fedavg"], other]).read_text()
    assert "Every client saw the same stream in every run" in text and "`local-method`" in text
    assert "did not see the same streams" not in text
    assert "| ECE (%) |" in text and "(%) |" in text.split("| ECE (%) |")[1].split("\n")[0]  # a column per domain


def test_a_rule_hyperparameter_is_not_a_difference(runs, tmp_path):
    other = tmp_path / "tau"
    shutil.copytree(runs["fedrapp"], other)
    stored = json.loads((other / "config.json").read_text())
    stored["config"]["tau"] = 0.5
    (other / "config.json").write_text(json.dumps(stored))
    assert compare([load_run(runs["fedavg"]), load_run(other)]).differing == []


def test_a_method_that_never_moves_a_prompt_is_reported_with_the_reason(testbed_tiny_report, tmp_path):
    """AdaPrompt whose buffer never fills (no pseudo-label above a threshold of 0.99) uploads what it was sent in every
    round: the summary, the report and the warning say so, with the reason, instead of '3 of 3 ok' alone."""
    config = small_run(testbed_tiny_report, tmp_path, **{"adaprompt-threshold": 0.99, "num-rounds": 2})
    summary, _, _ = run_federation(config)
    assert summary["unmoved_share"] == 1.0 and "buffer was not full" in summary["unmoved_reason"]
    page = write_report(Path(summary["run_dir"])).read_text()
    assert "moved no prompt in 100.0% of the scored client-rounds" in page
    assert "**Warning.** The local method moved no prompt in any round" in page and "nothing to share" in page
    moving, _, _ = run_federation({**config, "adaprompt-threshold": 0.0, "run-name": "moving"})
    assert moving["unmoved_share"] == 0.0  # the threshold of small_run: it updates from the first round


def test_the_report_says_what_each_point_rests_on_and_follows_each_domain_over_the_stream():
    from fedrapp_app.report.figures import domain_curves, thin_rounds
    from fedrapp_app.report.page import domains_seen

    rows = [
        {"round": 1, "client": 0, "status": "ok", "domain": "blur:2", "domains": {"blur:2": [10, 5]}},
        {"round": 1, "client": 1, "status": "ok", "domain": "contrast:2", "domains": {"contrast:2": [10, 2]}},
        {"round": 2, "client": 0, "status": "ok", "domain": "contrast:2", "domains": {"contrast:2": [10, 4]}},
        {"round": 2, "client": 1, "status": "dropped"},
        {
            "round": 3,
            "client": 0,
            "status": "ok",
            "domain": "mixed",
            "domains": {"blur:2": [4, 4], "contrast:2": [6, 0]},
        },
    ]
    curves = domain_curves(rows)
    assert curves["blur:2"][0].tolist() == [1, 3] and curves["blur:2"][1].tolist() == [0.5, 1.0]
    assert curves["contrast:2"][1].tolist() == [0.2, 0.4, 0.0]  # pooled over the clients in it that round
    pooled = {"rounds": {"round": [1, 2, 3], "clients": [2, 1, 1]}, "clients": {0: {}, 1: {}}}
    assert thin_rounds(pooled).tolist() == []  # 1 of 2 clients is half, not fewer
    pooled["clients"][2] = {}
    assert thin_rounds(pooled).tolist() == [2, 3]  # 1 of 3 clients: marked on the curve

    class FakeRun:
        pass

    run = FakeRun()
    run.rows = rows
    assert domains_seen(run) == {0: "blur:2 → contrast:2 → mixed", 1: "contrast:2"}


def test_a_runs_report_says_how_it_compares_with_none_fed_beside_it(runs, reports, tmp_path):
    """A one-run report could not say whether its accuracy was good: the none-fed run on the same streams, when one
    is beside it, gives the paired gain; without one the report names the command that makes one."""
    text = reports["fedavg"].read_text()

    def micro(name: str) -> float:
        run = load_run(runs[name])
        return totals(client_stats(run), run).micro

    none_fed, gain = micro("none-fed"), 100 * (micro("fedavg") - micro("none-fed"))
    assert f"Beside it, none-fed on the same streams (`none-fed`): {100 * none_fed:.2f}% micro" in text
    assert f"gains **{gain:+.2f} points**" in text
    assert "Beside it, none-fed" not in reports["none-fed"].read_text()
    alone = tmp_path / "alone" / "fedavg"
    shutil.copytree(runs["fedavg"], alone)
    assert "No none-fed run on the same streams is beside this one" in write_report([alone]).read_text()
    assert "`fedrapp-sim --compare`" in write_report([alone]).read_text()


def test_the_config_section_lists_the_users_settings_not_where_it_wrote_or_what_the_run_resolved(runs, tmp_path):
    """The config section listed keys the user never set: where the run wrote, and num-clients that a
    run with num-clients = 0 set itself from its SuperNodes."""
    folder = tmp_path / "fedavg"
    shutil.copytree(runs["fedavg"], folder)
    stored = json.loads((folder / "config.json").read_text())
    stored["resolved"] = {"num-clients": "0 in the config: one client per SuperNode"}
    (folder / "config.json").write_text(json.dumps(stored))
    section = write_report([folder], tmp_path / "page").read_text().split("## Config and provenance")[1]
    table = section.split("\n\n")[2]
    assert "| strategy | `'fedavg'` |" in table and "output-dir" not in table and "run-name" not in table
    assert "num-clients" not in table
    assert "Set by the run when it started: num-clients = `4` (0 in the config: one client per SuperNode)." in section


def test_the_seeds_report_titles_the_setting_and_keeps_intervals_inside_0_100(runs, tmp_path):
    from fedrapp_app.bench.stats import ACCURACY, mean_std
    from fedrapp_app.report.seeds import write_seeds_report

    wide = mean_std([0.2, 0.9])  # two seeds far apart: the raw interval runs far past 0 and 100
    assert wide.ci95()[0] < 0 and wide.ci95()[1] > 1 and wide.ci95(ACCURACY) == (0.0, 1.0)
    assert wide.format_ci95(signed=False, bounds=ACCURACY) == "[0.00, 100.00]"
    folders = []
    for seed in (0, 1):
        folder = tmp_path / f"none-fed-seed{seed}"
        shutil.copytree(runs["none-fed"], folder)
        stored = json.loads((folder / "config.json").read_text())
        stored["config"]["seed"] = seed
        (folder / "config.json").write_text(json.dumps(stored))
        folders.append(folder)
    text = write_seeds_report(folders, tmp_path / "seeds").read_text()
    assert text.startswith("# none-fed + adaprompt, testbed: 2 seeds (0, 1)\n")
    mean_row = next(line for line in text.splitlines() if line.startswith("| mean ± std"))
    assert "[+" not in mean_row and "[-" not in mean_row and "interval is wide (t = 12.7)" in text
