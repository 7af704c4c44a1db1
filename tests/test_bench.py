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

    def interrupted_wait(futures, timeout=None, return_when=None):
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


# --------------------------------------------------------------- executors: local workers, GPUs, progress, refusals
def three_cells(model: Path, out: Path) -> dict:
    return {
        "name": "tiny",
        "output": str(out),
        "base": tiny_base(model),
        "grids": {"main": {"axes": {"strategy": ["none-fed", "fedavg", "fedrapp"], "seed": [0]}}},
    }


def fake_result(seconds: float = 1.0) -> grid_module.CellResult:
    """A cell's result without running it (where it ran: this process)."""
    summary = {
        "micro_accuracy": 0.5,
        "macro_accuracy": 0.5,
        "micro_accuracy_received_prompt": 0.4,
        "samples": 32,
        "rounds": 2,
        "run_dir": None,
        "config": {},
    }
    return grid_module.CellResult(summary, [], [], seconds, grid_module.where_this_runs())


class ScriptedExecutor:
    """Runs nothing: each submitted cell ends at the next poll as its strategy's script says, one word per
    submission ("ok", "lost", "error", "twice": reported finished two times)."""

    description = "scripted"

    def __init__(self, script: dict[str, list[str]], at_once: int = 2) -> None:
        self.script, self.at_once = {k: list(v) for k, v in script.items()}, at_once
        self.submitted: list[str] = []
        self.running: list = []
        self.closed: list[bool] = []

    def check(self, cells):
        pass

    def capacity(self):
        return self.at_once

    def submit(self, cell):
        assert len(self.running) < self.at_once, "the runner submitted more cells than run at once"
        self.submitted.append(cell.overrides["strategy"])
        self.running.append(cell)

    def poll(self, timeout):
        outcomes = []
        for cell in self.running:
            words = self.script.get(cell.overrides["strategy"], [])
            word = words.pop(0) if words else "ok"
            if word == "lost":
                outcomes.append(grid_module.Outcome(cell, lost="NodeDiedError: its node died"))
            elif word == "error":
                outcomes.append(grid_module.Outcome(cell, error="ValueError: bad cell", details="Traceback ..."))
            else:
                outcomes += [grid_module.Outcome(cell, result=fake_result())] * (2 if word == "twice" else 1)
        self.running = []
        return outcomes

    def close(self, cancel=False):
        self.closed.append(cancel)


def test_the_runner_writes_each_cell_once_reruns_lost_cells_and_records_failures(tiny_model, tmp_path):
    """Only the runner writes rows: a lost cell runs again, a cell reported twice gets one row, a failed cell a row
    with its reason that the reports never see, and the next run tries it again and replaces that row."""
    runner = BenchRunner(parse_bench(three_cells(tiny_model, tmp_path / "bench")))
    executor = ScriptedExecutor({"none-fed": ["lost", "ok"], "fedavg": ["error"], "fedrapp": ["twice"]})
    runner.run(progress=False, executor=executor)
    assert executor.submitted == ["none-fed", "fedavg", "none-fed", "fedrapp"]  # the lost cell first in line again
    assert executor.closed == [False]
    everything = read_rows(runner.bench_dir, failed=True)
    assert sorted(r["config"]["strategy"] for r in everything) == ["fedavg", "fedrapp", "none-fed"]  # once each
    failed = next(r for r in everything if r["status"] == "failed")
    assert failed["config"]["strategy"] == "fedavg" and failed["error"] == "ValueError: bad cell"
    assert failed["details"] == "Traceback ..." and failed["grids"]["main"]["labels"]["strategy"] == "fedavg"
    assert [r["config"]["strategy"] for r in read_rows(runner.bench_dir)] == ["none-fed", "fedrapp"]
    assert list(runner.failures.values()) == ["ValueError: bad cell"]
    assert all(r["host"] and "ray_node" in r for r in read_rows(runner.bench_dir))

    again = BenchRunner(parse_bench(three_cells(tiny_model, tmp_path / "bench")))
    assert (
        [c.overrides["strategy"] for c in again.pending()]
        == ["fedavg"]
        == [c.overrides["strategy"] for c in again.failed_before()]
    )
    executor = ScriptedExecutor({})
    again.run(progress=False, executor=executor)
    assert executor.submitted == ["fedavg"]
    everything = read_rows(runner.bench_dir, failed=True)
    assert len(everything) == 3 and all(r["status"] == "ok" for r in everything)


def test_a_cell_lost_again_and_again_fails_and_the_grid_goes_on(tiny_model, tmp_path):
    runner = BenchRunner(parse_bench(three_cells(tiny_model, tmp_path / "bench")))
    executor = ScriptedExecutor({"fedavg": ["lost"] * grid_module.MAX_LOSSES}, at_once=1)
    runner.run(progress=False, executor=executor)
    assert executor.submitted.count("fedavg") == grid_module.MAX_LOSSES
    assert runner.failures == {
        runner.spec.cells[1].id: f"lost {grid_module.MAX_LOSSES} times, last: NodeDiedError: its node died"
    }
    assert [r["config"]["strategy"] for r in read_rows(runner.bench_dir)] == ["none-fed", "fedrapp"]


def test_progress_counts_cells_and_estimates_the_time_left_from_finished_cells():
    now = [0.0]
    progress = grid_module.Progress(10, clock=lambda: now[0])
    cells = [grid_module.Cell({}, f"k{i}") for i in range(5)]
    assert progress.text(2) == "0/10 done, 0 running, time left: after the first cell"
    for cell in cells[:4]:
        progress.started(cell)
    now[0] = 60.0
    progress.finished(cells[0])  # 60 s each, from their submission
    progress.finished(cells[1])
    progress.started(cells[4])
    now[0] = 90.0
    progress.failed_one(cells[2])
    # 5 queued x the 60 s mean + the 2 running: cell 4 has 30 s of it left, cell 3 (90 s in) none; 2 at once
    assert progress.seconds_left(2) == pytest.approx((5 * 60 + 30 + 0) / 2)
    assert progress.text(2) == "2/10 done, 2 running, 1 failed, about 3 min left"
    assert progress.seconds_left(100) == pytest.approx(30.0)  # never less than the longest-running cell needs
    assert [grid_module.format_duration(s) for s in (0.4, 59, 61, 3600 + 5 * 60)] == [
        "0 s",
        "59 s",
        "1 min",
        "1 h 05 min",
    ]


def test_local_workers_get_a_gpu_each_round_robin(monkeypatch):
    assert grid_module.worker_gpus(4, ["0", "1"]) == ["0", "1", "0", "1"]
    assert grid_module.worker_gpus(2, ["3", "5", "7"]) == ["3", "5"]
    assert grid_module.worker_gpus(2, []) is None  # no GPU: the workers run as the cells' device says
    monkeypatch.setattr("fedrapp_app.engine.devices.host_gpu_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert grid_module.host_gpus() == ["4", "6"]  # this process's GPUs, by the names it was given
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert grid_module.host_gpus() == ["0", "1"]
    executor = grid_module.LocalExecutor(4, Path("/unused"), gpus=["0", "1"])
    assert executor.description == "4 worker processes on GPUs 0, 1, 2 per GPU"
    with pytest.raises(BenchError, match=r"device='cuda:1', but each worker process sees only its own GPU"):
        executor.check([grid_module.Cell({"device": "cuda:1"}, "k")])


def test_refusals_come_before_any_cell_in_one_line(tiny_model, tmp_path, capsys):
    import fcntl

    from fedrapp_app.bench.__main__ import main
    from fedrapp_app.bench.ray_cells import check_head_answers
    from fedrapp_app.running.launch import free_port

    source = three_cells(tiny_model, tmp_path / "bench")
    BenchRunner(parse_bench(source)).run(progress=False, executor=ScriptedExecutor({}, at_once=3))
    # a bench folder written by another bench file
    other = BenchRunner(parse_bench({**source, "name": "other"}))
    with pytest.raises(BenchError, match=r"holds the grid of bench file 'tiny' .*--out .*/other\b"):
        other.run(progress=False, executor=ScriptedExecutor({}))
    # a second runner on the same folder
    source["grids"]["main"]["axes"]["seed"] = [0, 1]
    with open(tmp_path / "bench" / grid_module.LOCK_FILE, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        executor = ScriptedExecutor({})
        with pytest.raises(BenchError, match="one runner per bench folder"):
            BenchRunner(parse_bench(source)).run(progress=False, executor=executor)
        assert executor.submitted == []
    # a Ray head that does not answer
    port = free_port()
    with pytest.raises(BenchError, match=rf"127.0.0.1:{port}: the Ray head does not answer .*ray start --head"):
        check_head_answers(f"127.0.0.1:{port}")
    yaml_file = tmp_path / "tiny.yaml"
    yaml_file.write_text(json.dumps({**source, "output": str(tmp_path / "fresh")}))
    capsys.readouterr()
    assert main([str(yaml_file), "--ray-address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: --ray-address 127.0.0.1:{port}: the Ray head does not answer") and err.count("\n") == 1
    )
    assert not (tmp_path / "fresh").exists()  # nothing ran, nothing was written
    for flags, message in (
        (["--gpus-per-cell", "0"], "--gpus-per-cell ask Ray for resources: add --ray-address"),
        (["--ray-address", "auto", "--workers", "2"], "--workers is for one host"),
    ):
        assert main([str(yaml_file), *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def node(gpus: float, cpus: float, alive: bool = True) -> dict:
    """An entry of ray.nodes()."""
    return {"Alive": alive, "Resources": {"GPU": gpus, "CPU": cpus} if alive else {}}


def test_ray_resources_are_checked_against_the_nodes_before_any_cell():
    from fedrapp_app.bench.ray_cells import cells_at_once, check_cpus_per_cell, resolve_gpus_per_cell

    cells = [grid_module.Cell({}, "k")]  # device auto
    nodes = [node(1, 4), node(2, 8), node(8, 64, alive=False)]  # the 8-GPU node is dead
    with pytest.raises(BenchError, match=r"--gpus-per-cell 4, but no node .* alive node\(s\): 1, 2\).*2 or less"):
        resolve_gpus_per_cell(4, nodes, cells)
    with pytest.raises(BenchError, match="a fraction below 1"):
        resolve_gpus_per_cell(1.5, nodes, cells)
    assert resolve_gpus_per_cell(None, nodes, cells)[0] == 1.0  # a whole GPU per cell by default
    assert resolve_gpus_per_cell(None, [node(0, 4)], cells) == (0.0, None)  # no GPU in the cluster: on the CPU
    with pytest.raises(BenchError, match="has no GPU|that many GPUs.*--gpus-per-cell 0"):
        resolve_gpus_per_cell(1, [node(0, 4)], cells)
    with pytest.raises(BenchError, match="device='cuda' with no GPU share"):
        resolve_gpus_per_cell(0, nodes, [grid_module.Cell({"device": "cuda"}, "k")])
    with pytest.raises(BenchError, match="device='cuda:1': a Ray task sees only"):
        resolve_gpus_per_cell(1, nodes, [grid_module.Cell({"device": "cuda:1"}, "k")])
    with pytest.raises(BenchError, match=r"--cpus-per-cell 16, but .*: 4, 8\).*8 or less"):
        check_cpus_per_cell(16, nodes)
    assert cells_at_once(nodes, 1.0, 1.0) == 1 + 2
    assert cells_at_once(nodes, 0.5, 2.0) == 2 + 4
    assert cells_at_once([node(1, 16)], 0.1, 1.0) == 10  # 1 / 0.1 is 9.999... in floating point
    assert cells_at_once(nodes, 0.0, 3.0) == 1 + 2  # CPU-bound
    # mid-grid, the only nodes with GPUs died: the runner stops (rows kept) instead of waiting for ever
    import time

    from fedrapp_app.bench.ray_cells import RayExecutor

    executor = RayExecutor("10.0.0.1:6379", Path("/unused"), gpus_per_cell=1)
    executor.gpus, executor._nodes, executor._nodes_at = 1.0, [node(0, 8), node(4, 8, alive=False)], time.monotonic()
    with pytest.raises(BenchError, match=r"no alive node of the Ray cluster at 10.0.0.1:6379 can run a cell any more"):
        executor.capacity()


def test_dry_run_estimates_the_paper_grid_on_one_h200_and_on_eight(capsys, tmp_path):
    from fedrapp_app.bench.__main__ import main
    from fedrapp_app.bench.estimate import GPU_CLASSES, cell_estimate, gpu_class_of, host_gpu_class, wall_minutes

    paper = Path(__file__).resolve().parents[1] / "conf" / "bench" / "paper.yaml"
    assert main([str(paper), "--dry-run", "--out", str(tmp_path), "--gpu-type", "h200", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    minutes = [cell_estimate(c.overrides, GPU_CLASSES["h200"])[0] for c in load_bench(paper).cells]
    assert len(minutes) == 210
    hours_one, minutes_eight = wall_minutes(minutes, 1) / 60, wall_minutes(minutes, 8)
    assert f"210 of 210 cells: {sum(minutes) / 60:.1f} GPU-hours; on 1 GPU about {hours_one:.1f} h, on 8 GPUs " \
           f"about {minutes_eight:.0f} min" in out  # fmt: skip
    assert sum(minutes) / 8 <= minutes_eight <= sum(minutes) / 8 + max(minutes)
    assert "estimate on NVIDIA H200 SXM" in out and "up to 21.0 GB of GPU memory per cell" in out
    assert cell_estimate({"dataset": "fgvc", "model": "/my/clip"}, GPU_CLASSES["h200"]) == "dataset 'fgvc'"
    assert wall_minutes([5, 1, 1, 1, 1, 1], 2) == 5 and wall_minutes([2] * 8, 8) == 2
    names = (
        "NVIDIA H200",
        "NVIDIA H100 PCIe",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA L4",
        "Tesla V100",
    )
    assert [gpu_class_of(n) for n in names] == ["h200", "h100-pcie", "h100", "a100", "l4", None]
    (tmp_path / "gpus" / "0000:01:00.0").mkdir(parents=True)
    (tmp_path / "gpus" / "0000:01:00.0" / "information").write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 1\n")
    assert host_gpu_class(tmp_path / "gpus") == "h100" and host_gpu_class(tmp_path / "none") is None


def test_failed_rows_stay_out_of_the_reports(tiny_model, tmp_path, monkeypatch):
    runner = run_bench(two_cells(tiny_model, tmp_path / "bench"), monkeypatch, CountingRunCell())
    rows = read_rows(runner.bench_dir)
    failed = grid_module.make_failed_row("abc", "broken_abc", {"strategy": "fedavg"}, {}, "ValueError: no")
    write_rows(runner.bench_dir, [*rows, failed])
    assert read_rows(runner.bench_dir) == rows and read_rows(runner.bench_dir, failed=True)[-1] == failed
    assert write_report(runner.bench_dir).is_file()


def test_a_grid_run_in_this_process_leaves_its_loggers_and_threads_as_it_found_them(tiny_model, tmp_path):
    """The in-process executor quiets Flower's loggers and sets torch's threads for its cells only: a later run in
    the same process (a test, a user's session) logs and computes as before. (A grid here once left the
    ``flwr.fedrapp`` loggers at WARNING, and later tests saw no INFO line.)"""
    import logging

    import torch

    import fedrapp_app.federation.server  # noqa: F401 - Flower sets its logger's level when first imported, not the grid

    levels = {name: logging.getLogger(name).level for name in grid_module.QUIET}
    threads = torch.get_num_threads()
    BenchRunner(parse_bench(two_cells(tiny_model, tmp_path / "bench"))).run(progress=False)
    assert {name: logging.getLogger(name).level for name in grid_module.QUIET} == levels
    assert torch.get_num_threads() == threads


# ------------------------------------------------------------------------------- reuse across cells
@pytest.mark.kernels
def test_cells_reuse_batches_and_tower_outputs_with_the_same_rows(tiny_model, tmp_path, monkeypatch):
    """The bench keeps a setting's batches and image-tower outputs for its next cells (engine.reuse): the second
    cell of the same streams runs the tower on nothing new, and its rows equal a cell run with reuse off."""
    from fedrapp_app.engine import reuse

    def rows(cell_id: str, strategy: str) -> list[dict]:
        result = grid_module.run_cell({**tiny_base(tiny_model), "strategy": strategy}, cell_id, tmp_path)
        timing = ("seconds", "client_metrics")
        return [{k: v for k, v in row.items() if not k.endswith(timing)} for row in result.rounds]

    monkeypatch.setattr(grid_module, "REUSE_ENTRIES", 0)
    fresh = rows("fresh", "fedavg")
    monkeypatch.setattr(grid_module, "REUSE_ENTRIES", 64)
    reuse.forget()  # what earlier tests' cells left
    monkeypatch.setattr(reuse, "kept", _count_misses(reuse.kept, misses := []))
    rows("first", "none-fed")
    first_misses = len(misses)
    reused = rows("second", "fedavg")
    assert reused == fresh
    assert first_misses > 0 and len(misses) == first_misses  # the second cell computed nothing again
    assert not reuse.enabled()  # off again after the cell


def _count_misses(kept, misses: list):
    def counting(key, compute):
        def computed():
            misses.append(key)
            return compute()

        return kept(key, computed)

    return counting


# ------------------------------------------------------------------------------------- the goal report
def goal_row(labels: dict, config: dict, seed: int, accuracy: float) -> dict:
    full = {**grid_module.DEFAULTS, **config, "seed": seed}
    return {
        "status": "ok",
        "full_config": full,
        "summary": {"micro_accuracy": accuracy},
        "grids": {"g": {"labels": {**labels, "seed": str(seed)}}},
    }


def test_the_goal_report_keys_cells_by_config_not_by_label_names(tmp_path):
    """Two grids that call the same setting and rules by other names land in one table; the gain is paired by
    seed against the better of none-fed and FedAvg; a miss by more than 0.2 points is marked."""
    from fedrapp_app.bench.goal import collect, goal_tables, identity

    continual = {"shift": "continual", "shift-period": 2}
    rows = []
    for seed, (nf, fa, ours, theirs) in enumerate([(0.50, 0.55, 0.549, 0.540), (0.52, 0.51, 0.525, 0.50)]):
        rows += [
            goal_row({"stream": "moving", "rule": "local"}, {**continual, "strategy": "none-fed"}, seed, nf),
            goal_row({"setting": "cont", "rule": "avg"}, {**continual, "strategy": "fedavg"}, seed, fa),
            goal_row(
                {"setting": "cont", "rule": "ours"}, {**continual, "strategy": "fedrapp", "trust": True}, seed, ours
            ),
            goal_row({"x": "y"}, {**continual, "strategy": "fedrapp"}, seed, theirs),
        ]
    assert identity(rows[0]["full_config"]).setting == identity(rows[1]["full_config"]).setting
    collected = collect(rows)
    text, verdicts = goal_tables(collected, {})
    ours_key = next(k for k in verdicts if "trust=True" in k[2])
    theirs_key = next(k for k in verdicts if k[2] == "strategy=fedrapp")
    assert verdicts[ours_key].gain.mean == pytest.approx(np.mean([0.549 - 0.55, 0.525 - 0.52]))
    assert verdicts[ours_key].met and not verdicts[theirs_key].met  # -0.10 vs best: met; -0.60 + ...: missed
    assert "✗" in text and "Goal met: strategy=fedrapp trust=True: 1 of 1, strategy=fedrapp: 0 of 1" in text


def test_the_goal_report_ignores_the_privacy_budget_of_a_cell_without_dp():
    """A cell recorded under another dp-clip default is the same cell while dp is off (found when the default moved)."""
    from fedrapp_app.bench.goal import identity

    plain = {**grid_module.DEFAULTS, "strategy": "fedavg"}
    assert identity({**plain, "dp-clip": 0.123}) == identity(plain)
    assert identity({**plain, "dp": True, "dp-clip": 0.123}) != identity({**plain, "dp": True})


def test_the_estimate_covers_the_testbed_other_clips_and_a_cpu(tmp_path, capsys, monkeypatch):
    """The estimate knew ViT-B/16 on a GPU only: a testbed grid (the first one a user runs) and a CPU host got none."""
    from fedrapp_app.bench import __main__ as bench_main
    from fedrapp_app.bench.estimate import (
        GPU_CLASSES,
        TESTBED_STEP_SECONDS,
        Architecture,
        architecture_of,
        cell_estimate,
    )

    minutes, memory = cell_estimate({"num-clients": 8}, None)  # the default run: 5120 renders, batch 64, 8 clients
    assert minutes == pytest.approx((80 + 4) * TESTBED_STEP_SECONDS / 60) and memory is None
    assert cell_estimate({"num-clients": 8}, GPU_CLASSES["h100"])[0] == minutes  # the tiny model is CPU-bound
    assert "local-method 'tpt'" in cell_estimate({"num-clients": 8, "local-method": "tpt"}, None)
    paper = {"dataset": "dtd", "num-clients": 10, "precision": "bf16", "model": "openai/clip-vit-base-patch16"}
    h200 = GPU_CLASSES["h200"]
    b16, b32 = cell_estimate(paper, h200), cell_estimate({**paper, "model": "openai/clip-vit-base-patch32"}, h200)
    l14 = cell_estimate({**paper, "model": "openai/clip-vit-large-patch14"}, h200)
    assert b32[0] < b16[0] < l14[0]  # time follows the towers' sizes
    assert b32[1] == b16[1] < l14[1]  # memory too, but the frozen image tower saves nothing for a backward pass
    assert cell_estimate(paper, None)[0] > 20 * b16[0]  # on a 2-core CPU: hours, not minutes
    folder = tmp_path / "my-clip"  # a local checkpoint: its own config.json says what it is
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vision_config": {"image_size": 224, "patch_size": 14}}))
    assert architecture_of(str(folder)) == Architecture(12, 768, 257, 12, 512)
    assert "its config.json is neither here nor known" in cell_estimate({**paper, "model": "org/unknown"}, h200)

    monkeypatch.setattr(bench_main, "host_gpus", lambda: [])  # a host without a GPU: its CPU, not an h200
    monkeypatch.setattr(bench_main, "host_gpu_class", lambda: None)
    testbed = Path(__file__).resolve().parents[1] / "conf" / "bench" / "testbed.yaml"
    assert bench_main.main([str(testbed), "--dry-run", "--out", str(tmp_path / "bench")]) == 0
    out = capsys.readouterr().out
    assert "estimate on a 2-core CPU" in out and "78 of 87 cells" in out and "this host has no GPU" in out
    assert "local-method 'tpt-online'" in out  # the cells it cannot cover are named


def test_a_bench_cell_without_num_clients_is_refused_before_it_waits_for_supernodes(tmp_path, capsys):
    """num-clients = 0 (one client per SuperNode) in a bench cell waited node-wait-timeout (300 s) per cell and failed
    with 'start the SuperNodes'; --dry-run passed it."""
    from fedrapp_app.bench.__main__ import main

    bench = tmp_path / "no-clients.yaml"
    bench.write_text("grids: {g: {axes: {strategy: [none-fed, fedrapp], seed: [0]}}}\n")
    for extra in ([], ["--dry-run"]):
        assert main([str(bench), "--out", str(tmp_path / "out"), *extra]) == 2
        err = capsys.readouterr().err
        assert "num-clients = 0, which means one client per SuperNode" in err and "--set num-clients=8" in err
    assert not (tmp_path / "out" / "runs").exists()
    assert main([str(bench), "--out", str(tmp_path / "out"), "--dry-run", "--set", "num-clients=8"]) == 0


def test_the_trust_options_cells_are_paired_with_none_fed_in_the_gains_and_figures(tmp_path, monkeypatch):
    """A {strategy: fedrapp, trust: true} cell looked its reference up as a none-fed cell with trust = true, so the
    gain table showed '–' and the gain figure left it out (the pattern of continual.yaml and training-free.yaml)."""
    import fedrapp_app.bench.report as report_module
    from fedrapp_app.bench.schema import reference_key

    root = Path(__file__).resolve().parents[1] / "conf" / "bench"
    for name in ("continual.yaml", "training-free.yaml"):
        spec = load_bench(root / name)
        keys = {cell.key for cell in spec.cells}
        trust = [cell for cell in spec.cells if cell.overrides.get("trust")]
        assert trust and all(reference_key(cell.overrides) in keys for cell in trust), name

    rows = []
    for seed, (local, option) in enumerate([(0.50, 0.52), (0.60, 0.61), (0.55, 0.57)]):
        rows.append(fake_row(identity_key({"strategy": "none-fed", "seed": seed}), "none-fed", seed, local))
        trust = fake_row(f"t{seed}", "fedrapp+trust", seed, option, trust=True)
        trust["config"]["strategy"] = "fedrapp"
        rows.append(trust)
    settings = settings_of(rows)
    gain = settings[1].gain(by_key(rows))
    assert gain.n == 3 and gain.mean == pytest.approx((0.02 + 0.01 + 0.02) / 3)
    assert "| fedrapp+trust | +1.67 ± 0.58 |" in grid_markdown(settings, set(), by_key(rows), {}, 0)
    drawn = {}
    monkeypatch.setattr(report_module, "gains_figure", lambda gains, title, path: drawn.update(gains))
    assert write_gain_figures(settings, by_key(rows), tmp_path) == {"g": "gains-g.png"}
    assert [label for label, _ in drawn["iid"]] == ["fedrapp+trust"]


def test_failed_cells_are_listed_with_their_reasons_and_give_exit_status_1(capsys):
    from fedrapp_app.bench.grid import print_failures

    assert print_failures({}, "never printed") == 0 and capsys.readouterr().err == ""
    assert print_failures({"cell-a": "x" * 600, "cell-b": "bad config"}, "2 cell(s) failed") == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["2 cell(s) failed", "  cell-a: " + "x" * 500, "  cell-b: bad config"]
