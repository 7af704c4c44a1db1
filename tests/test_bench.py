"""The benchmark runner and its reports: YAML validation, cells, skip/resume, reports from rows, statistics."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

import fedrapp_app.bench.grid as grid_module
from fedrapp_app.bench import BenchError, BenchRunner, load_bench, parse_bench, read_rows, write_rows
from fedrapp_app.bench.report import grid_markdown, write_gain_figures, write_report
from fedrapp_app.bench.schema import identity_key
from fedrapp_app.bench.stats import Setting, best_settings, by_key, fedrapp_signals, mean_std, settings_of, t975
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("bench_tiny"), world.CLASSNAMES)


def tiny_base(model: Path) -> dict:
    """2 clients, 2 rounds of 16 images; AdaPrompt updates from the first round on the random model."""
    return {
        "model": str(model),
        "num-clients": 2,
        "testbed-samples": 128,
        "batch-size": 16,
        "num-rounds": 2,
        "adaprompt-threshold": 0.0,
        "adaprompt-buffer-size": 16,
        "decode-workers": 0,
        "partition": "iid",
        "testbed-domains": "blur:1,contrast:1",
    }


def two_cells(model: Path, out: Path) -> dict:
    return {
        "name": "tiny",
        "output": str(out),
        "base": tiny_base(model),
        "grids": {"main": {"axes": {"strategy": ["none-fed", "fedrapp"], "seed": [0]}}},
    }


# ----------------------------------------------------------------------------------- YAML and cells
def test_bad_run_config_values_fail_with_the_run_configs_message():
    with pytest.raises(BenchError, match=r"(?s)base: .*mu-0 = 0.2: unknown key \(did you mean 'mu0'\?\)"):
        parse_bench({"base": {"mu-0": 0.2}, "grids": {"g": {"axes": {"seed": [0]}}}})
    with pytest.raises(BenchError, match=r"(?s)cell fedx/0: .*strategy = 'fedx': unknown server rule 'fedx'"):
        parse_bench({"grids": {"g": {"axes": {"strategy": ["fedx"], "seed": [0]}}}})
    with pytest.raises(BenchError, match=r"(?s)cell bad: .*eta = -1.0: must be >= 0"):
        parse_bench({"grids": {"g": {"compare": ["v"], "axes": {"v": {"bad": {"eta": -1.0}}}}}})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"grids": {"g": {"axes": {"seed": [0]}}}, "bsae": {}}, r"unknown entry \['bsae'\]"),
        ({"grids": {}}, "has no grids"),
        ({"grids": {"g": {"axes": {"seed": [0]}, "comapre": []}}}, r"unknown entry \['comapre'\]"),
        ({"grids": {"g": {"axes": {"variant": [1, 2]}}}}, "not a run-config key; name the variants"),
        ({"grids": {"g": {"axes": {"seed": [0, 0]}}}}, "repeats a value"),
        ({"grids": {"g": {"compare": ["partition"], "axes": {"seed": [0]}}}}, r"compare lists \['partition'\]"),
        ({"grids": {"g": {"axes": {"seed": [0]}}}, "base": {"run-name": "x"}}, "set by the benchmark runner"),
        ({"grids": {"g": {"axes": {"seed": [0]}}}}, "say which axes hold the compared methods"),
    ],
)
def test_malformed_files_are_rejected_before_anything_runs(source, message):
    with pytest.raises(BenchError, match=message):
        parse_bench(source)


def test_load_bench_names_the_file(tmp_path):
    with pytest.raises(BenchError, match="not found"):
        load_bench(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("grids: {g: {axes: {strategy: [nope]}}}\n")
    with pytest.raises(BenchError, match=r"(?s)bad\.yaml: .*strategy = 'nope'"):
        load_bench(bad)


def test_cells_are_run_configs_deduplicated_by_what_changes_results():
    spec = parse_bench(
        {
            "base": {"partition": "iid"},
            "grids": {
                "main": {
                    "axes": {
                        "local-method": ["zeroshot", "adaprompt"],
                        "strategy": ["none-fed", "fedrapp"],
                        "seed": [0, 1],
                    }
                },
                "ablations": {
                    "compare": ["variant"],
                    "base": {"local-method": "adaprompt"},
                    "axes": {
                        "variant": {
                            "fedrapp": {"strategy": "fedrapp"},
                            "no-peers": {"strategy": "fedrapp", "gamma0": 0},
                            "none-fed": {"strategy": "none-fed", "mu0": 0.0},
                        },
                        "seed": [0, 1],
                    },
                },
            },
        }
    )
    # zeroshot: once per seed (strategy irrelevant), labelled "zeroshot", run with none-fed;
    # ablations: fedrapp and none-fed (whose mu0 cannot matter) are the main grid's cells; no-peers is new.
    assert len(spec.cells) == 2 * (1 + 2) + 2
    zeroshot = [c for c in spec.cells if c.overrides["local-method"] == "zeroshot"]
    assert [c.overrides["strategy"] for c in zeroshot] == ["none-fed", "none-fed"]
    assert zeroshot[0].memberships[0].labels == {"local-method": "zeroshot", "strategy": "zeroshot", "seed": "0"}
    shared = [c for c in spec.cells if len(c.memberships) == 2]
    assert sorted(m.labels["variant"] for c in shared for m in c.memberships if m.grid == "ablations") == [
        "fedrapp",
        "fedrapp",
        "none-fed",
        "none-fed",
    ]
    # Identity ignores other rules' and methods' keys and speed keys; not the rule's own keys.
    base = {"strategy": "none-fed", "local-method": "adaprompt"}
    assert identity_key(base) == identity_key({**base, "mu0": 0.0, "tpt-views": 8, "decode-workers": 0})
    assert identity_key({**base, "strategy": "fedrapp"}) != identity_key({**base, "strategy": "fedrapp", "mu0": 0})
    assert identity_key({**base, "gamma0": 0}) == identity_key({**base, "gamma0": 0.0})


# ------------------------------------------------------------------------------ running, skip, resume
class CountingRunCell:
    """Wraps ``grid.run_cell``: counts calls, can raise KeyboardInterrupt in call ``stop_at`` after a round."""

    def __init__(self, stop_at: int | None = None, after_round: int = 0) -> None:
        self.calls: list[str] = []
        self.stop_at, self.after_round = stop_at, after_round
        self.real = grid_module.run_cell

    def __call__(self, overrides, cell_id, runs_dir, on_round=None):
        self.calls.append(cell_id)
        stop = len(self.calls) == self.stop_at

        def observe(round_number, strategy):
            if stop and round_number > self.after_round:
                raise KeyboardInterrupt
            if on_round:
                on_round(round_number, strategy)

        if stop and self.after_round == 0:
            raise KeyboardInterrupt
        return self.real(overrides, cell_id, runs_dir, observe)


def test_an_interrupted_parallel_grid_cancels_its_queue_and_stops_its_workers(tiny_model, tmp_path, monkeypatch):
    """Ctrl-C / SIGTERM while cells run in worker processes: leaving the pool must not wait for the queued cells
    (the executor's ``with`` would run them all), and no worker may outlive the grid."""
    stopped = []
    real_stop = grid_module.stop_pool

    def spy(pool, grace=5.0):
        stopped.append(list(pool._processes.values()))
        real_stop(pool, grace)

    def interrupted_wait(futures, return_when):
        raise KeyboardInterrupt  # the signal arrives while the runner waits for its first cell

    monkeypatch.setattr(grid_module, "stop_pool", spy)
    monkeypatch.setattr(grid_module, "wait", interrupted_wait)
    runner = BenchRunner(parse_bench(two_cells(tiny_model, tmp_path / "bench")))
    with pytest.raises(KeyboardInterrupt):
        runner.run(workers=2, progress=False)
    assert len(stopped) == 1 and stopped[0]  # the workers had started
    assert not any(process.is_alive() for process in stopped[0])
    assert read_rows(runner.bench_dir) == []


def test_stop_pool_cancels_queued_tasks_and_kills_running_ones():
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    futures = [pool.submit(time.sleep, 120) for _ in range(8)]
    deadline = time.monotonic() + 60
    while not all(f.running() for f in futures[:2]) and time.monotonic() < deadline:
        time.sleep(0.1)  # two sleep in the workers; the executor has moved up to 3 more into its call queue
    processes = list(pool._processes.values())
    started = time.monotonic()
    grid_module.stop_pool(pool, grace=5.0)
    assert time.monotonic() - started < 15
    assert processes and not any(process.is_alive() for process in processes)
    # no task ran to its end (the queued ones are cancelled or failed by the executor's own thread, in its time)
    assert not [f for f in futures if f.done() and not f.cancelled() and f.exception(timeout=0) is None]


def run_bench(source: dict, monkeypatch, wrapper: CountingRunCell) -> BenchRunner:
    monkeypatch.setattr(grid_module, "run_cell", wrapper)
    runner = BenchRunner(parse_bench(source))
    with contextlib.suppress(KeyboardInterrupt):  # an interrupted grid, as after Ctrl-C
        runner.run(progress=False)
    return runner


def test_grid_writes_one_row_per_cell_skips_finished_cells_and_resumes(tiny_model, tmp_path, monkeypatch):
    source = two_cells(tiny_model, tmp_path / "bench")
    first = run_bench(source, monkeypatch, CountingRunCell(stop_at=2))  # interrupted before the 2nd cell ran
    rows = read_rows(first.bench_dir)
    assert [r["config"]["strategy"] for r in rows] == ["none-fed"]
    assert (first.bench_dir / "bench.yaml").is_file()

    resumed = CountingRunCell()
    second = run_bench(source, monkeypatch, resumed)
    assert len(resumed.calls) == 1  # only the cell without a row
    rows = read_rows(second.bench_dir)
    assert [r["config"]["strategy"] for r in rows] == ["none-fed", "fedrapp"]

    again = CountingRunCell()
    run_bench(source, monkeypatch, again)
    assert again.calls == []  # everything finished: nothing runs
    row = rows[1]
    assert row["summary"]["samples"] == 2 * 2 * 16 and row["summary"]["rounds"] == 2
    assert row["rounds"]["round"] == [1, 2] and sum(row["rounds"]["n"]) == 64
    assert sum(row["rounds"]["correct"]) / 64 == pytest.approx(row["summary"]["micro_accuracy"])
    assert set(row["clients"]) == {"0", "1"} and row["clients"]["1"]["domain"] == "contrast:1"
    assert all(v is not None for v in row["clients"]["0"]["mu"])  # FedRAPP's per-client diagnostics are kept
    assert row["grids"]["main"]["labels"] == {"strategy": "fedrapp", "seed": "0"}


def test_a_cell_cut_mid_run_continues_from_its_checkpoint(tiny_model, tmp_path, monkeypatch):
    whole = run_bench(two_cells(tiny_model, tmp_path / "whole"), monkeypatch, CountingRunCell())
    source = two_cells(tiny_model, tmp_path / "cut")
    run_bench(source, monkeypatch, CountingRunCell(stop_at=2, after_round=1))  # killed after round 1 of cell 2
    assert len(read_rows(tmp_path / "cut")) == 1
    resumed = CountingRunCell()
    run_bench(source, monkeypatch, resumed)
    assert len(resumed.calls) == 1
    cut_row, whole_row = read_rows(tmp_path / "cut")[1], read_rows(whole.bench_dir)[1]
    assert cut_row["full_config"]["resume"] is True
    for key in ("micro_accuracy", "macro_accuracy", "micro_accuracy_received_prompt", "samples"):
        assert cut_row["summary"][key] == whole_row["summary"][key]
    assert cut_row["rounds"] == whole_row["rounds"] and cut_row["clients"] == whole_row["clients"]


def test_renamed_labels_need_no_rerun(tiny_model, tmp_path, monkeypatch):
    source = two_cells(tiny_model, tmp_path / "bench")
    run_bench(source, monkeypatch, CountingRunCell())
    renamed = {
        **source,
        "grids": {
            "main": {
                "compare": ["rule"],
                "axes": {"rule": {"local": {"strategy": "none-fed"}, "ours": {"strategy": "fedrapp"}}, "seed": [0]},
            }
        },
    }
    again = CountingRunCell()
    run_bench(renamed, monkeypatch, again)
    assert again.calls == []
    assert [r["grids"]["main"]["labels"]["rule"] for r in read_rows(tmp_path / "bench")] == ["local", "ours"]


def test_report_is_regenerated_from_the_rows_alone(tiny_model, tmp_path, monkeypatch):
    runner = run_bench(two_cells(tiny_model, tmp_path / "bench"), monkeypatch, CountingRunCell())
    shutil.rmtree(runner.bench_dir / "runs")  # the reports must not need the run folders
    report = write_report(runner.bench_dir)
    text = report.read_text()
    rows = read_rows(runner.bench_dir)
    for row in rows:
        assert f"{100 * row['summary']['micro_accuracy']:.2f}" in text
    gain = 100 * (rows[1]["summary"]["micro_accuracy"] - rows[0]["summary"]["micro_accuracy"])
    assert f"{gain:+.2f}" in text
    assert "### FedRAPP's signals" in text and "| all | fedrapp |" in text
    out = report.parent
    assert (out / "curves-main-all.png").stat().st_size > 0
    assert (out / "fedrapp-main-all-fedrapp.png").stat().st_size > 0
    with (out / "settings.csv").open() as f:
        records = list(csv.DictReader(f))
    assert [r["method"] for r in records] == ["none-fed", "fedrapp"]
    assert float(records[1]["gain_vs_none_fed_mean"]) == pytest.approx(gain / 100)
    assert sum(r["best"] == "True" for r in records) >= 1


# ------------------------------------------------------------------------------------- statistics
def fake_row(
    key: str, strategy: str, seed: int, micro: float, context: str = "iid", oracle: bool = False, **config
) -> dict:
    labels = {"partition": context, "strategy": strategy, "seed": str(seed)}
    return {
        "key": key,
        "config": {"strategy": strategy, "seed": seed, **config},
        "grids": {
            "g": {"index": 0, "labels": labels, "order": [0, 0, seed], "compare": ["strategy"], "oracle": oracle}
        },
        "summary": {"micro_accuracy": micro, "macro_accuracy": micro, "micro_accuracy_received_prompt": micro},
        "seconds": 1.0,
    }


def test_mean_and_sample_std_over_seeds():
    stat = mean_std([0.5, 0.7, None, 0.6, float("nan")])
    assert stat.n == 3 and stat.mean == pytest.approx(0.6) and stat.std == pytest.approx(0.1)  # ddof = 1
    assert stat.format() == "60.00 ± 10.00"
    single = mean_std([0.25])
    assert single.n == 1 and math.isnan(single.std) and single.format() == "25.00"
    assert mean_std([]).format() == "–"
    assert mean_std([0.012, 0.02]).format(signed=True) == "+1.60 ± 0.57"


def test_gain_is_paired_by_seed_and_best_skips_oracles():
    rows = []
    for seed, (local, ours, oracle) in enumerate([(0.50, 0.53, 0.70), (0.60, 0.61, 0.71)]):
        rows.append(fake_row(identity_key({"strategy": "none-fed", "seed": seed}), "none-fed", seed, local))
        rows.append(fake_row(f"f{seed}", "fedrapp", seed, ours))
        rows.append(fake_row(f"o{seed}", "oracle", seed, oracle, oracle=True))
    settings = settings_of(rows)
    assert [s.method for s in settings] == ["none-fed", "fedrapp", "oracle"]
    fedrapp: Setting = settings[1]
    gain = fedrapp.gain(by_key(rows))
    # paired: mean of (0.03, 0.01), not the difference of the means' spreads
    assert gain.mean == pytest.approx(0.02) and gain.std == pytest.approx(math.sqrt(2) * 0.01)
    assert settings[0].gain(by_key(rows)) is None
    assert best_settings(settings) == {1}  # the oracle is higher but never marked
    assert json.dumps(settings[1].labels) == json.dumps({"partition": "iid", "strategy": "fedrapp"})


def test_gain_interval_is_the_student_t_interval_over_seeds():
    gain = mean_std([0.01, 0.02, 0.03])  # mean 0.02, std 0.01, t(2) = 4.303
    low, high = gain.ci95()
    assert (low, high) == pytest.approx((0.02 - 4.303 * 0.01 / math.sqrt(3), 0.02 + 4.303 * 0.01 / math.sqrt(3)))
    assert gain.format_ci95() == "[-0.48, +4.48]"
    assert mean_std([0.01]).format_ci95() == "–" and all(math.isnan(v) for v in mean_std([0.01]).ci95())
    assert t975(1) == 12.706 and t975(100) == 1.960
    with pytest.raises(ValueError, match="at least 1 degree of freedom"):
        t975(0)


def test_a_setting_missing_seeds_is_flagged_and_never_best():
    rows = []
    for seed in (0, 1, 2):
        rows.append(fake_row(identity_key({"strategy": "none-fed", "seed": seed}), "none-fed", seed, 0.50))
    rows.append(fake_row("f0", "fedrapp", 0, 0.90))  # one lucky seed of a grid still running
    settings = settings_of(rows)
    best = best_settings(settings)
    assert best == {0}
    text = grid_markdown(settings, best, by_key(rows), {}, 0)
    assert "| fedrapp | 90.00 (1 of 3 seeds) |" in text and "| none-fed | **50.00 ± 0.00** |" in text
    assert "+40.00 (1 of 3 seeds)" in text


def test_gain_figure_needs_two_paired_seeds(tmp_path):
    def rows_of(seeds):
        rows = []
        for seed in seeds:
            rows.append(fake_row(identity_key({"strategy": "none-fed", "seed": seed}), "none-fed", seed, 0.5))
            rows.append(fake_row(f"f{seed}", "fedrapp", seed, 0.5 + 0.01 * seed))
        return rows

    rows = rows_of([0, 1, 2])
    assert write_gain_figures(settings_of(rows), by_key(rows), tmp_path) == {"g": "gains-g.png"}
    assert (tmp_path / "gains-g.png").read_bytes()[:4] == b"\x89PNG"
    single = rows_of([0])  # one seed: no interval to draw
    assert write_gain_figures(settings_of(single), by_key(single), tmp_path / "none") == {}


def trace(rounds, norms, rs, gains, drops):
    """One client's FedRAPP trace (acc_before 0.5, H_post 1)."""
    return {
        "round": rounds,
        "update_norm": norms,
        "r": rs,
        "mu": [0.5 - 0.15 * r for r in rs],
        "gamma": [0.3] * len(rounds),
        "h_pre": [1 + d for d in drops],
        "h_post": [1.0] * len(rounds),
        "acc": [0.5 + g for g in gains],
        "acc_before": [0.5] * len(rounds),
    }


def test_fedrapp_signals_score_r_against_the_in_round_gain_within_rounds():
    # round 1: nobody updated (left out); rounds 2-3: r ranks the clients exactly as their gains do, but
    # round 3's gains are all 0.1 higher: only the within-round order may count
    clients = {
        "0": trace([1, 2, 3], [0.0, 0.2, 0.2], [0.0, 1.0, 1.0], [0.0, 0.02, 0.12], [0.0, 0.1, 0.0]),
        "1": trace([1, 2, 3], [0.0, 0.1, 0.3], [0.0, -1.0, -1.0], [0.0, -0.02, 0.08], [0.0, 0.0, 0.1]),
        "2": trace([1, 2, 3], [0.0, 0.3, 0.1], [0.0, 0.0, 0.0], [0.0, 0.0, 0.1], [0.0, 0.05, 0.05]),
    }
    sig = fedrapp_signals([{"clients": clients}])
    assert sig.pairs == 6 and sig.update_share == pytest.approx(6 / 9)
    assert sig.r_vs_gain == pytest.approx(1.0)
    assert sig.drop_vs_gain == pytest.approx(0.0, abs=1e-12)  # the drops are uncorrelated with the gains
    assert sig.norm_cv == pytest.approx(float(np.std([0.2, 0.1, 0.3]) / 0.2))
    assert sig.in_round_gain == pytest.approx(0.05) and sig.gamma == pytest.approx(0.3)
    assert fedrapp_signals([{"clients": {"0": trace([1], [0.0], [0.0], [0.0], [0.0])}}]) is None


# ------------------------------------------------------------------------------- command line, estimate
def test_command_line_validates_lists_and_overrides_the_base(tmp_path, capsys):
    from fedrapp_app.bench.__main__ import main, parse_assignments

    assert parse_assignments(["data-dir=/data", "mu0=0.4", "tpt-augmix=true", "hf-repo="]) == {
        "data-dir": "/data",
        "mu0": 0.4,
        "tpt-augmix": True,
        "hf-repo": "",
    }
    with pytest.raises(BenchError, match="KEY=VALUE"):
        parse_assignments(["mu0"])
    conf = Path(__file__).resolve().parents[1] / "conf" / "bench"
    assert main([str(conf / "testbed.yaml"), "--dry-run", "--out", str(tmp_path)]) == 0
    assert main([str(conf / "paper.yaml"), "--dry-run", "--out", str(tmp_path), "--set", "data-dir=/x"]) == 0
    assert "'data-dir': '/x'" in capsys.readouterr().out
    assert main([str(conf / "paper.yaml"), "--dry-run", "--set", "mu0=-1"]) == 2
    assert "mu0 = -1: must be >= 0.0" in capsys.readouterr().err


def test_estimate_scales_measured_costs_linearly_in_the_classes():
    from fedrapp_app.bench.estimate import StepCost, estimate_table

    cost = StepCost(flops=(2e12, 1e10), saved_bytes=(0.0, 2**20), cpu_seconds=1.0)
    assert cost.at(1000) == (2e12 + 1e13, 1000 * 2**20)
    table = estimate_table(
        cost,
        StepCost((2e12, 0.0), (0.0, 0.0), 1.0),
        (0.0, 0.0),
        0.0,
        peak_tflops=1000,
        utilization=0.5,
        step_overhead=0.0,
        decode_workers=1,
        clients=10,
    )
    imagenet = next(line for line in table.splitlines() if line.startswith("| imagenet |"))
    steps = math.ceil(50000 / 64) + 5
    # steps x 12 TFLOP at 500 TFLOP/s; memory: 1.5 x 1000 MiB saved + 1 GiB
    assert imagenet == (
        f"| imagenet | 1000 | 50000 | {steps} | {steps * 12:.0f} | {steps * 12 / 500 / 60:.1f} | "
        f"{steps * 2 / 500 / 60:.1f} | {1.5 * 1000 / 1024 + 1:.1f} |"
    )


def test_cells_of_other_weights_are_never_mixed(tiny_model, tmp_path, monkeypatch):
    model = shutil.copytree(tiny_model, tmp_path / "model")
    source = two_cells(model, tmp_path / "bench")
    runner = run_bench(source, monkeypatch, CountingRunCell(stop_at=2))
    assert read_rows(runner.bench_dir)[0]["model_fingerprint"] == grid_module.model_fingerprint(str(model))
    make_tiny_clip(model, world.CLASSNAMES, seed=1)  # the same folder, new weights
    with pytest.raises(BenchError, match="other weights of model"):
        BenchRunner(parse_bench(source)).run(progress=False)


def test_cells_computed_with_other_defaults_are_never_mixed(tiny_model, tmp_path, monkeypatch):
    source = two_cells(tiny_model, tmp_path / "bench")
    runner = run_bench(source, monkeypatch, CountingRunCell(stop_at=2))
    rows = read_rows(runner.bench_dir)
    assert rows[0]["bench_git"] == runner.git
    rows[0]["full_config"]["adaprompt-lr"] = 1e-3  # as if the default had been 1e-3 when it ran
    rows[0]["full_config"]["tpt-lr"] = 1e-3  # a key AdaPrompt never reads: not a conflict
    write_rows(runner.bench_dir, rows)
    with pytest.raises(BenchError, match=r"other defaults \(adaprompt-lr: 0.001 -> 0.005\)"):
        BenchRunner(parse_bench(source)).run(progress=False)


def test_a_checkpoint_of_other_settings_is_run_again(tiny_model, tmp_path, monkeypatch):
    """A leftover checkpoint whose run differs in a key the identity ignores (another rule's) is not resumed."""
    source = two_cells(tiny_model, tmp_path / "bench")
    run_bench(source, monkeypatch, CountingRunCell(stop_at=2, after_round=1))
    source["base"]["fedamp-sigma"] = 2.0  # not part of the identity, but part of the checkpointed config
    run_bench(source, monkeypatch, CountingRunCell())
    rows = read_rows(tmp_path / "bench")
    assert len(rows) == 2 and rows[1]["full_config"]["resume"] is False and rows[1]["summary"]["rounds"] == 2


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "conf" / "bench").glob("*.yaml")), ids=str)
def test_every_shipped_bench_file_loads_and_every_cell_config_validates(path):
    """A key renamed or removed in the run config must not leave a shipped grid that fails when a user runs it."""
    spec = load_bench(path)
    assert spec.cells
