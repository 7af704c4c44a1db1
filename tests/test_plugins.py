"""Rules and methods from outside the package: the example plugins of examples/ (installed as the README's test
command installs them), the module:attribute form, parameters checked before the start, plugins that fail, a
stateful plugin rule resumed, a method missing on a node, and `fedrapp-list`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedrapp_app.aggregation import find_rule, make_rule
from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.federation.client import app as client_app
from fedrapp_app.federation.client import setup
from fedrapp_app.federation.server import run_server
from fedrapp_app.methods import find_method, make_method
from fedrapp_app.plugins.catalogue import main as list_main
from fedrapp_app.recording.checkpoint import ServerCheckpoint
from fedrapp_app.report import write_report
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import SpyGrid, comparable_rows, interrupt_after, read_rows, run_federation, small_run

ROOT = Path(__file__).resolve().parent.parent
INSTALL = "pip install -e examples/rule-mean-mix -e examples/method-confident-half (the README's test command does)"


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


def test_the_example_plugins_are_installed_and_found_through_their_entry_points():
    try:
        rule, method = find_rule("mean-mix"), find_method("confident-half")
    except ValueError as err:
        pytest.fail(f"the example plugins are not installed: {INSTALL}\n{err}")
    assert rule.origin.startswith("fedrapp-mean-mix 0.1.0 (entry point mean-mix = fedrapp_mean_mix:mean_mix)")
    assert method.origin.startswith("fedrapp-confident-half 0.1.0")
    assert rule.package == "fedrapp-mean-mix" and method.package == "fedrapp-confident-half"
    assert make_rule("mean-mix", {"weight": 0.3}).params.weight == 0.3
    assert make_method("confident-half", {"share": 0.25}).params.share == 0.25


def test_the_listing_shows_the_plugins_with_their_parameters_and_origin(capsys):
    assert list_main([]) == 0
    text = capsys.readouterr().out
    assert "  mean-mix: each client gets (1 - weight)" in text and "mean-mix: mean-mix" not in text
    assert "from fedrapp-mean-mix 0.1.0 (entry point mean-mix = fedrapp_mean_mix:mean_mix)" in text
    assert "weight = 0.5 in [0, 1]  [rule-params='weight=...']  share of the mean of all uploads" in text
    assert "share = 0.5 in (0, 1]  [method-params='share=...']" in text
    assert 'lambda-drop = 1.0 in [0, inf)  [-c "lambda-drop=..."]' in text  # a built-in's own key
    assert 'lr = 0.005 in (0, inf)  [-c "adaprompt-lr=..."]' in text  # a built-in method's range
    assert (
        "fedrapp-trust: FedRAPP with its trust option" in text and "selected by strategy='fedrapp' trust=true" in text
    )


# --------------------------------------------------------------------------------------------- same rows
def test_the_plugin_rule_gives_the_rows_of_its_twin_written_by_hand(testbed_tiny, tmp_path):
    """The entry point `mean-mix` (a separate package, its parameter through rule-params) and the same rule written
    out in tests/plugin_rules.py, named as module:attribute: every row, bit for bit."""
    base = small_run(testbed_tiny, tmp_path, **{"num-rounds": 3, "rule-params": "weight=0.3"})
    plugin, plugin_grid, _ = run_federation({**base, "strategy": "mean-mix", "run-name": "plugin"})
    twin, twin_grid, _ = run_federation({**base, "strategy": "plugin_rules:mean_mix_by_hand", "run-name": "twin"})
    rows = comparable_rows(read_rows(plugin["run_dir"]))
    assert rows == comparable_rows(read_rows(twin["run_dir"]))
    assert all(np.array_equal(plugin_grid.sent[k], twin_grid.sent[k]) for k in plugin_grid.sent)
    assert any(r["gamma"] == pytest.approx(0.3 * 2 / 3) for r in rows)  # the weight reached the rule
    none_fed, _, _ = run_federation({**base, "strategy": "none-fed", "rule-params": "", "run-name": "none-fed"})
    assert rows != comparable_rows(read_rows(none_fed["run_dir"]))  # the rule did something
    write_report([Path(plugin["run_dir"])])
    assert (Path(plugin["run_dir"]) / "report" / "peers.png").is_file()  # its peer weights get the figure


def test_the_plugin_method_runs_the_same_by_entry_point_and_as_module_class(testbed_tiny, tmp_path):
    base = small_run(testbed_tiny, tmp_path, **{"num-rounds": 3, "method-params": "share=0.25"})
    plugin, _, _ = run_federation({**base, "local-method": "confident-half", "run-name": "plugin"})
    direct, _, _ = run_federation(
        {**base, "local-method": "fedrapp_confident_half.method:ConfidentHalf", "run-name": "direct"}
    )
    rows = comparable_rows(read_rows(plugin["run_dir"]))
    assert rows == comparable_rows(read_rows(direct["run_dir"]))
    assert all(r["update_norm"] > 0 for r in rows)  # the prompt moved on every client in every round


def test_the_plugin_methods_step_minimises_the_entropy_of_the_most_confident_share(tiny_pclip, make_pixels):
    """By hand: the loss is the mean entropy of the images with the lowest entropy under the received prompt."""
    import torch

    from fedrapp_app.methods.base import entropy

    method = make_method("confident-half", {"share": 0.25})
    prompt = method.initial_prompt(tiny_pclip)
    pixels = make_pixels(8)
    with torch.no_grad():
        logits = tiny_pclip.logits(tiny_pclip.image_features(pixels), tiny_pclip.text_features(prompt))
    expected = float(entropy(logits).sort().values[:2].mean())
    result = method.adapt(tiny_pclip, prompt, pixels, torch.Generator())
    assert result.stats["loss"] == pytest.approx(expected, rel=1e-5)
    assert not torch.equal(result.prompt[0], prompt[0]) and set(method.state_dict()) == {
        "optimizer.step.0",
        "optimizer.exp_avg.0",
        "optimizer.exp_avg_sq.0",
    }


# ------------------------------------------------------------------------------------------ bad parameters
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ("strategy='mean-mix' rule-params='weight=1.5'", "weight = 1.5 is outside its allowed range [0, 1]"),
        ("strategy='mean-mix' rule-params='wieght=0.3'", "unknown parameter 'wieght' for server rule 'mean-mix'"),
        ("local-method='confident-half' method-params='share=0'", "share = 0.0 is outside its allowed range (0, 1]"),
        ("local-method='confident-half' method-params='share=x'", "parameter 'share' expects a float, got 'x'"),
        ("local-method='confident-half' trust=true", "cannot score its own last tuned prompt"),
        ("strategy='plugin_rulez:raises'", "cannot import module 'plugin_rulez'"),
    ],
)
def test_a_plugins_bad_parameter_is_refused_before_the_start_in_one_message(overrides, expected, tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedrapp_app.running.launch",
            str(ROOT),
            "--check",
            "-c",
            f"{overrides} output-dir='{tmp_path}'",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - started < 30


def test_an_int_parameter_is_an_int_even_written_as_a_whole_float():
    from fedrapp_app.registry.parameters import build_params

    @dataclasses.dataclass(frozen=True)
    class Params:
        k: int = 3
        weight: float = 0.5

    built = build_params(Params, {"k": 2.0, "weight": 1}, "server rule 'knn'")  # a YAML grid, a sweep: 2.0
    assert built.k == 2 and type(built.k) is int and type(built.weight) is float
    with pytest.raises(ValueError, match=r"parameter 'k' expects an int, got 2.5 \(write a whole number, e.g. k=3\)"):
        build_params(Params, {"k": 2.5}, "server rule 'knn'")


# --------------------------------------------------------------------------------------- failing plugins
@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ("plugin_rules:raises", "ZeroDivisionError: the plugin divided by zero"),
        ("plugin_rules:wrong_shape", "ValueError: memory has shape (3, "),
        ("plugin_rules:not_finite", "ValueError: personalized is not finite (rows [0])"),
    ],
)
def test_a_plugin_rule_that_fails_fails_its_round_by_name_and_leaves_the_state_as_it_was(
    testbed_tiny, tmp_path, rule, reason
):
    """The rule fails in every round: each round's clients adapted and were scored, the server state stayed as it
    was (every client is sent P0 again, even by a rule that zeroed the arrays it was given), and after three such
    rounds the run fails, naming the rule and its module."""
    config = small_run(testbed_tiny, tmp_path, **{"strategy": rule, "num-rounds": 4})
    states = []

    def keep(round_number, strategy):
        states.append((strategy.state.memory.copy(), strategy.state.sent.copy()))

    grid = SpyGrid(client_app, 3, config)
    with pytest.raises(RuntimeError, match="the server rule failed in 3 rounds in a row"):
        run_server(grid, config, on_round=keep)
    rows = read_rows(Path(tmp_path) / "run")
    assert len(rows) == 9 and all(r["status"] == "ok" and reason in r["rule_error"] for r in rows)
    assert all(f"server rule '{rule}' (module plugin_rules" in r["rule_error"] for r in rows)
    first = {node: prompt for (rnd, node), prompt in grid.sent.items() if rnd == 1}  # P0
    assert len(first) == 3 and all(np.array_equal(grid.sent[(3, node)], p0) for node, p0 in first.items())
    assert len(states) == 3 and all(
        np.array_equal(m, states[0][0]) and np.array_equal(s, states[0][1]) for m, s in states
    )
    summary = json.loads((Path(tmp_path) / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "the server rule failed in 3 rounds in a row" in summary["error"]
    assert summary["rule_failures"]["count"] == 3 and summary["rule_failures"]["rounds"] == [1, 2, 3]
    # a failed run is incomplete, and says per client what was never scored and why (docs/failures.md)
    assert summary["complete"] is False and sorted(summary["unscored"]) == ["0", "1", "2"]
    assert all(u["samples"] > 0 and "the run failed" in u["reasons"][-1] for u in summary["unscored"].values())


def test_a_round_whose_rule_failed_shows_in_the_summary_the_progress_line_the_report_and_the_exit_status(
    testbed_tiny, tmp_path, caplog
):
    import logging

    import plugin_rules

    from fedrapp_app.running.launch import RULE_FAILED, report

    plugin_rules._ROUNDS[0] = 0
    config = small_run(testbed_tiny, tmp_path, **{"strategy": "plugin_rules:fails_in_round_two", "num-rounds": 3})
    with caplog.at_level(logging.INFO, logger="flwr.fedrapp"):
        summary, _, _ = run_federation(config)
    assert summary["status"] == "finished" and summary["complete"] is True
    assert summary["rule_failures"]["count"] == 1 and summary["rule_failures"]["rounds"] == [2]
    assert "RuntimeError: a bad day" in summary["rule_failures"]["last_error"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round 2 |")]
    assert lines and "3 of 3 ok" in lines[0] and "RULE FAILED (state unchanged; 1 round(s) so far)" in lines[0]
    run_dir = Path(summary["run_dir"])
    assert report({"status": "finished:completed"}, run_dir, run_dir / "log") == RULE_FAILED == 3
    assert "The server rule failed in 1 round(s)** (2)" in (run_dir / "report" / "report.md").read_text()


def test_where_the_rule_and_the_method_come_from_is_in_config_summary_and_report(testbed_tiny, tmp_path):
    """An entry point: the distribution, its version and the entry point; module:attribute: the file and its
    SHA-256; the same in config.json and summary.json, and in words in the report."""
    import hashlib

    import plugin_rules

    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 1, "strategy": "plugin_rules:mean_mix_by_hand",
                                                  "local-method": "confident-half"})  # fmt: skip
    summary, _, _ = run_federation(config)
    run_dir = Path(summary["run_dir"])
    stored = json.loads((run_dir / "config.json").read_text())["components"]
    assert stored == summary["components"]
    method, rule = stored["method"], stored["rule"]
    assert method == {"name": "confident-half", "distribution": "fedrapp-confident-half", "version": "0.1.0",
                      "entry_point": "confident-half = fedrapp_confident_half:CONFIDENT_HALF"}  # fmt: skip
    assert rule["file"] == plugin_rules.__file__
    assert rule["sha256"] == hashlib.sha256(Path(plugin_rules.__file__).read_bytes()).hexdigest()
    write_report([run_dir])
    page = (run_dir / "report" / "report.md").read_text()
    assert "Local method: `confident-half` from fedrapp-confident-half 0.1.0" in page
    assert f"Server rule: `plugin_rules:mean_mix_by_hand` from the file `{plugin_rules.__file__}`" in page


@pytest.mark.kernels
def test_a_resumed_run_of_a_stateful_plugin_rule_gives_the_same_rows(testbed_tiny, tmp_path):
    base = small_run(testbed_tiny, tmp_path, **{"strategy": "plugin_rules:counting", "num-rounds": 4})
    whole, whole_grid, _ = run_federation({**base, "run-name": "whole"})

    def counted_twice(strategy) -> None:
        assert strategy.state.rule_state["count"].tolist() == [2.0, 2.0, 2.0]

    cut = {**base, "run-name": "cut"}
    interrupt_after(cut, 2, counted_twice)
    resumed, resumed_grid, _ = run_federation({**cut, "resume": True})
    assert resumed["resumed_after_round"] == 2
    assert comparable_rows(read_rows(whole["run_dir"])) == comparable_rows(read_rows(resumed["run_dir"]))
    assert all(np.array_equal(resumed_grid.sent[k], whole_grid.sent[k]) for k in resumed_grid.sent)
    # the state is what makes the resume exact: a resume whose checkpoint lost it sends other prompts
    lost = {**base, "run-name": "lost"}
    interrupt_after(lost, 2)
    checkpoint = ServerCheckpoint.load(Path(tmp_path) / "lost")
    dataclasses.replace(checkpoint, rule_state={}).save(Path(tmp_path) / "lost")
    _, lost_grid, _ = run_federation({**lost, "resume": True})
    assert not all(np.array_equal(lost_grid.sent[k], whole_grid.sent[k]) for k in lost_grid.sent)


# ------------------------------------------------------------------------------------------ on the nodes
def test_a_node_without_the_method_plugin_fails_before_any_model_loads_naming_the_package(testbed_tiny):
    """The ServerApp's host has the plugin and says where it comes from; a SuperNode that lacks it fails its
    client at once, naming the package to install."""
    from flwr.app import Context, RecordDict

    run_config = {**small_run(testbed_tiny, Path("/tmp")), "local-method": "gone-method"}
    origin = "fedrapp-gone 1.2.0 (entry point gone-method = fedrapp_gone:Gone)"
    context = Context(1, 1, {"partition-id": 0, "num-partitions": 3}, RecordDict(), run_config)
    with pytest.raises(ConfigError, match=r"comes from fedrapp-gone 1\.2\.0 .*install that package on this node"):
        setup(context, {"num-clients": 3, "method-origin": origin})


def test_the_server_tells_the_clients_where_the_method_comes_from_and_whether_to_score_their_own_prompt(
    testbed_tiny, tmp_path
):
    config = small_run(testbed_tiny, tmp_path, **{"num-rounds": 1, "trust": True, "local-method": "im"})
    _, grid, _ = run_federation(config)
    train = [m for m in grid.messages if m.metadata.message_type == "train"]
    query = [m for m in grid.messages if m.metadata.message_type == "query"]
    assert train and query
    for message in train + query:
        assert message.content["config"]["method-origin"].startswith("fedrapp 0.1.0 (entry point im = ")
    assert all(m.content["config"]["own-prompt"] is True for m in train)
    assert RunConfig.from_run_config({"strategy": "no_such:rule"}, with_rule=False).values["strategy"] == "no_such:rule"


def test_a_plugin_is_a_bench_cell_beside_the_built_ins(testbed_tiny, tmp_path):
    """A grid compares the plugins with a built-in under the same harness: one row per cell, the plugin's row as
    its in-process run gives it."""
    from fedrapp_app.bench import BenchRunner, parse_bench
    from fedrapp_app.bench import read_rows as read_bench_rows

    base = {k: v for k, v in small_run(testbed_tiny, tmp_path).items() if k not in ("output-dir", "run-name")}
    source = {
        "name": "plugins",
        "output": str(tmp_path / "bench"),
        "base": {**base, "num-rounds": 2, "local-method": "confident-half"},
        "grids": {
            "main": {
                "compare": ["rule"],
                "axes": {
                    "rule": {"fedavg": {"strategy": "fedavg"}, "mean-mix": {"strategy": "mean-mix"}},
                    "seed": [0],
                },
            }
        },
    }
    runner = BenchRunner(parse_bench(source))
    runner.run(progress=False)
    rows = {r["config"]["strategy"]: r for r in read_bench_rows(runner.bench_dir)}
    assert set(rows) == {"fedavg", "mean-mix"}
    assert all(r["summary"]["samples"] == 2 * 3 * 16 for r in rows.values())
    assert rows["mean-mix"]["components"]["rule"]["distribution"] == "fedrapp-mean-mix"
    assert rows["fedavg"]["components"]["method"]["distribution"] == "fedrapp-confident-half"
    assert all(r["summary"]["rule_failures"] == 0 for r in rows.values())
    alone, _, _ = run_federation(
        {
            **base,
            "num-rounds": 2,
            "local-method": "confident-half",
            "strategy": "mean-mix",
            "output-dir": str(tmp_path / "alone"),
            "run-name": "alone",
        }
    )
    assert rows["mean-mix"]["summary"]["micro_accuracy"] == alone["micro_accuracy"]


def test_this_projects_own_names_are_its_pyproject_entry_points():
    """fedrapp_app/registry/builtins.py names what pyproject.toml registers (the docs list those, not a machine's
    plugins)."""
    import tomllib

    from fedrapp_app.registry import builtins

    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert sorted(points["fedrapp.rules"]) == sorted((*builtins.RULES, *builtins.OPTIONS))
    assert sorted(points["fedrapp.methods"]) == sorted(builtins.METHODS)


def test_the_public_module_gives_a_plugin_everything_and_costs_no_torch():
    """fedrapp_app.plugins: every name it lists resolves; a rule's names and a method's parameters (the example's
    MethodSpec, checked as a run's pre-start checks do) import no torch; the torch-backed names load on use."""
    code = (
        "import sys\n"
        "import fedrapp_app.plugins as p\n"
        "from fedrapp_app.plugins import Diagnostics, Interval, MethodSpec, RoundOutput, RuleParams, param, rule\n"
        "from fedrapp_app.plugins import validate_round\n"
        "p.method_params('confident-half', {'share': 0.3}); p.make_params('mean-mix', {'weight': 0.2})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "missing = [n for n in p.__all__ if getattr(p, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert 'torch' in sys.modules and p.LocalMethod.__module__ == 'fedrapp_app.methods.base'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_extending_md_documents_every_name_the_public_module_gives():
    import fedrapp_app.plugins as public

    page = (ROOT / "docs" / "extending.md").read_text()
    missing = [name for name in public.__all__ if f"`{name}`" not in page and f"`{name}(" not in page]
    assert not missing, f"docs/extending.md does not name {missing}"
