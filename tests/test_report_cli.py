"""``fedrapp-report`` on hand-written run folders: bad input gives one clear line and exit status 2, odd but
valid runs (unknown statuses, skipped samples, a real dataset without shift domains, wall-time fields) render."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedrapp_app.config import DEFAULTS
from fedrapp_app.report import RunError, load_run, main, write_report
from fedrapp_app.report.tables import config_changes, wall_time


def _row(round_number: int, client: int, status: str = "ok", **extra) -> dict:
    row = {"round": round_number, "client": client, "node": 1000 + client, "status": status}
    if status == "ok":
        row.update(num_examples=8, correct=4, correct_before=3, acc=0.5, acc_before=0.375, h_pre=1.0, h_post=0.9)
    return {**row, **extra}


def make_run(folder: Path, rows: list, config: dict | None = None, summary: dict | None = None) -> Path:
    """A run folder written by hand: config.json, rounds.jsonl (dicts, or raw lines as str), summary.json."""
    folder.mkdir(parents=True)
    full = {**DEFAULTS, "num-clients": 2, "strategy": "none-fed", **(config or {})}
    (folder / "config.json").write_text(json.dumps({"config": full, "started": 1000.0, "git": {"commit": "abc"}}))
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    (folder / "rounds.jsonl").write_text("".join(line + "\n" for line in lines))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def _fails(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    assert captured.err.startswith("fedrapp-report: error: ") and captured.err.count("\n") == 1
    return captured.err


def test_a_folder_that_is_not_a_run(tmp_path, capsys):
    err = _fails([str(tmp_path)], capsys)
    assert f"{tmp_path} is not a run folder: it has no rounds.jsonl" in err


def test_the_output_dir_instead_of_a_run_names_the_runs_inside(tmp_path, capsys):
    make_run(tmp_path / "run-a", [_row(1, 0)])
    err = _fails([str(tmp_path)], capsys)
    assert "it holds run folders (run-a): pass one or more of them" in err


def test_a_missing_folder(tmp_path, capsys):
    assert "no such folder" in _fails([str(tmp_path / "nope")], capsys)


def test_an_empty_rounds_file(tmp_path, capsys):
    run = make_run(tmp_path / "r", [])
    err = _fails([str(run)], capsys)
    assert f"{run / 'rounds.jsonl'}: no rows" in err


@pytest.mark.parametrize("with_summary", [True, False])
def test_a_bad_json_line_names_file_and_line(tmp_path, capsys, with_summary):
    run = make_run(tmp_path / "r", [_row(1, 0), "{not json", _row(1, 1)], summary={} if with_summary else None)
    err = _fails([str(run)], capsys)
    assert f"{run / 'rounds.jsonl'}:2: not a JSON row" in err


@pytest.mark.parametrize(
    ("row", "complaint"),
    [
        ({"round": 1, "status": "ok"}, "the row has no 'client'"),
        ({**_row(1, 0), "num_examples": "8"}, "'num_examples' must be int, got '8'"),
        ({**_row(1, 0), "correct": 9}, "0 <= correct, correct_before <= num_examples"),
        ([1, 2], "a row must be a JSON object, found list"),
        ({**_row(1, 0), "peer_weights": {"1": "x"}}, "'peer_weights' must map peer ids to finite numbers"),
    ],
)
def test_a_malformed_row_names_file_line_and_key(tmp_path, capsys, row, complaint):
    run = make_run(tmp_path / "r", [_row(1, 1), json.dumps(row)])
    err = _fails([str(run)], capsys)
    assert f"{run / 'rounds.jsonl'}:2: " in err and complaint in err


def test_a_bad_config_file(tmp_path, capsys):
    run = make_run(tmp_path / "r", [_row(1, 0)])
    (run / "config.json").write_text('{"config": {')
    assert f"{run / 'config.json'}:1: not valid JSON" in _fails([str(run)], capsys)


def test_the_command_line_exits_2_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "fedrapp_app.report", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and "is not a run folder" in result.stderr


def test_help_says_where_reports_go(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "RUN_DIR/report" in text and "compare-<what differs>-vs-" in text


def test_an_odd_but_valid_run_renders(tmp_path):
    """Unknown status, skipped samples, a never-scored client, a dataset without domains, wall-time fields."""
    timing = {"round_seconds": 2.0, "aggregate_seconds": 0.25}
    rows = [
        _row(1, 0, skipped=2, client_metrics={"t-total": 1.5}, **timing),
        _row(1, 1, "skipped", reason="no decodable sample", skipped=8, **timing),
        _row(1, 2, "teleported", reason="a status of a newer version", **timing),
        _row(2, 0, client_metrics={"t-total": 0.5}, round_seconds=1.0, aggregate_seconds=0.5),
    ]
    summary = {"seconds": 10.0, "setup_seconds": 4.0, "status": "finished", "complete": False,
               "unscored": {"2": {"samples": 8, "reasons": ["never scored"]}}}  # fmt: skip
    run_dir = make_run(tmp_path / "r", rows, {"num-clients": 3, "dataset": "dtd", "data-dir": "/x"}, summary)
    run = load_run(run_dir)
    assert run.domains == [None, None, None] and not run.complete
    w = wall_time(run)
    assert (w.total, w.setup, w.rounds, w.server, w.client_sum, w.client_slowest) == (10, 4, 3, 0.75, 2, 2)
    assert w.other is None and w.remainder == 3  # no .lock: when the server started (before the files) is unknown
    page = write_report([run_dir]).read_text()
    assert "| teleported |" in page and "- round 1, client 2: teleported (a status of a newer version)" in page
    assert "- client 2: 8 samples; never scored" in page
    assert "| skipped | teleported | skipped samples |" in page
    assert "| 0 | – | 50.00 | 37.50 | 16 | 2 | 2 | 0 | 0 | 0 | 0 | 0 | 0 | 2 |" in page
    assert "| 1 | – | – | – | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 | 0 | 8 |" in page
    assert "| rest (between the rounds: sampling, checkpoints; after the last: results) | at least 3.0 (" in page
    assert "incomplete: not every sample was scored" in page


def test_config_changes_against_the_defaults():
    config = {**DEFAULTS, "seed": 3, "tau": 0.2, "fraction": 1, "csc": 1, "old-key": "x"}
    del config["mu0"]
    changes = {k: (v, d) for k, v, d in config_changes(config)}
    assert changes == {"seed": (3, 0), "csc": (1, False), "old-key": ("x", None), "mu0": (None, 0.5)}


def test_write_report_names_the_first_bad_folder(tmp_path):
    good = make_run(tmp_path / "good", [_row(1, 0)])
    (tmp_path / "bad").mkdir()
    with pytest.raises(RunError, match="bad is not a run folder"):
        write_report([good, tmp_path / "bad"])
    assert not (tmp_path / "compare-good-vs-bad").exists()  # nothing is written before every folder reads


def test_many_clients_keep_the_figures_small(tmp_path):
    """60 clients over 30 rounds: one tick label per domain, no per-client legend, every figure under 300 KB."""
    rng = np.random.default_rng(0)
    rows = []
    for t in range(1, 31):
        for c in range(60):
            weights = rng.random(60)
            weights[c] = 0.0
            weights /= weights.sum()
            peers = {str(j): float(w) for j, w in enumerate(weights) if w > 0}
            rows.append(_row(t, c, r=float(rng.normal()), mu=0.5, gamma=0.3, peer_weights=peers))
    run_dir = make_run(tmp_path / "big", rows, {"num-clients": 60, "strategy": "fedrapp"}, {"seconds": 60.0})
    page = write_report([run_dir])
    figures = sorted(page.parent.glob("*.png"))
    assert {f.name for f in figures} == {"overview.png", "accuracy.png", "status.png", "peers.png", "fedrapp.png"}
    for figure in figures:
        assert figure.stat().st_size <= 300 * 1024, figure


# ---------------------------------------------------------------------------------- what a new user saw
# The cases below come from a fresh clone's `fedrapp-sim` runs (default config: 8 clients on label-skewed testbed
# streams that end at different rounds, 16 rounds) and `fedrapp-report RUN RUN RUN` on them.
NAMES = {s: f"testbed-testbed-adaprompt-{s}-seed0-20261202-2150{k}4" for k, s in enumerate(("fedrapp", "fedavg"))}
LAST_ROUND = {0: 11, 1: 4, 2: 8, 3: 5, 4: 14, 5: 12, 6: 16, 7: 13}  # each client's last batch, as in those runs


def _default_like_run(folder: Path, strategy: str, exhausted_row: bool = False, **summary_extra) -> Path:
    """A finished run as fedrapp-sim writes it by default: 8 clients whose streams end at LAST_ROUND (their last
    row reports remaining-batches 0 and the server samples them no more), peer weights, FedRAPP's signals."""
    rng = np.random.default_rng(len(strategy))
    rows = []
    for t in range(1, 17):
        for c in range(8):
            if t > LAST_ROUND[c] + exhausted_row:
                continue
            if t == LAST_ROUND[c] + 1:  # a client told it has no batch left
                rows.append(_row(t, c, "exhausted", round_seconds=1.0))
                continue
            weights = rng.random(8)
            weights[c] = 0.0
            weights /= weights.sum()
            rows.append(
                _row(
                    t,
                    c,
                    correct=int(rng.integers(0, 9)),
                    peer_weights={str(j): float(w) for j, w in enumerate(weights) if w},
                    r=float(rng.normal()),
                    mu=0.5,
                    gamma=0.3,
                    client_metrics={"t-total": 0.2, "remaining-batches": 0 if t == LAST_ROUND[c] else 1},
                    round_seconds=1.0,
                    aggregate_seconds=0.01,
                )
            )
    summary = {"seconds": 30.0, "setup_seconds": 10.0, "status": "finished", "stopped": "streams ended"}
    return make_run(folder, rows, {"num-clients": 8, "strategy": strategy}, {**summary, **summary_extra})


def _render(fig) -> None:
    """Lay out and draw ``fig`` as the report saves it (a PNG at 100 dpi), so that extents are the saved ones."""
    fig.savefig(io.BytesIO(), format="png", dpi=100)


def _drawn_ticks(axis) -> list:
    """The major ticks of ``axis`` inside its view (matplotlib keeps labels of ticks beyond it, undrawn)."""
    low, high = sorted(axis.get_view_interval())
    return [t for t in axis.get_major_ticks() if low - 1e-9 <= t.get_loc() <= high + 1e-9 and t.label1.get_visible()]


def _boxes(fig) -> list[tuple[str, object, bool]]:
    """(what, window extent, slanted) of every visible non-empty text that matplotlib lays out: the suptitle, the
    axes' titles, axis labels and tick labels, and the legends (one box each), as saved; slanted: a tick label
    drawn at an angle other than 0 or 90 degrees (its box is wider than its glyphs)."""
    _render(fig)
    texts = [("suptitle", fig._suptitle)] if fig._suptitle is not None else []
    for k, ax in enumerate(fig.axes):
        texts += [(f"axes {k} title", ax.title), (f"axes {k} xlabel", ax.xaxis.label)]
        texts += [(f"axes {k} ylabel", ax.yaxis.label)]
        for name, axis in (("xtick", ax.xaxis), ("ytick", ax.yaxis)):
            texts += [(f"axes {k} {name} {t.label1.get_text()!r}", t.label1) for t in _drawn_ticks(axis)]
    out = [
        (what, text.get_window_extent(), "tick" in what and bool(text.get_rotation() % 90))
        for what, text in texts
        if text.get_visible() and text.get_text().strip()
    ]
    legends = [("figure legend", legend) for legend in fig.legends]
    legends += [(f"axes {k} legend", ax.get_legend()) for k, ax in enumerate(fig.axes) if ax.get_legend()]
    return out + [(what, legend.get_window_extent(), False) for what, legend in legends]


def _slanted_overlaps(fig) -> list[str]:
    """Slanted tick labels overlap when the distance across the slant between neighbours' anchors,
    spacing · sin(angle), is less than a line of text."""
    problems = []
    for k, ax in enumerate(fig.axes):
        ticks = [t for t in _drawn_ticks(ax.xaxis) if t.label1.get_text() and t.label1.get_rotation() % 90]
        ticks.sort(key=lambda t: t.get_loc())
        for a, b in zip(ticks, ticks[1:], strict=False):
            (xa, _), (xb, _) = ax.transData.transform([(a.get_loc(), 0), (b.get_loc(), 0)])
            across = abs(xb - xa) * abs(np.sin(np.radians(a.label1.get_rotation())))
            if across < a.label1.get_fontsize() * fig.dpi / 72:
                problems.append(f"axes {k} xtick {a.label1.get_text()!r} overlaps {b.label1.get_text()!r}")
    return problems


def _layout_problems(fig) -> list[str]:
    """Texts that stick out of the figure or overlap one another (1 px of slack)."""
    boxes = _boxes(fig)
    problems = _slanted_overlaps(fig)
    whole = fig.bbox
    for what, box, _ in boxes:
        if box.x0 < whole.x0 - 1 or box.x1 > whole.x1 + 1 or box.y0 < whole.y0 - 1 or box.y1 > whole.y1 + 1:
            problems.append(f"{what} sticks out of the figure")
    for i, (a, box_a, slanted_a) in enumerate(boxes):
        for b, box_b, slanted_b in boxes[i + 1 :]:
            if slanted_a and slanted_b:
                continue  # checked by _slanted_overlaps
            if "legend" in a and "legend" not in b and b.startswith(a.split(" legend")[0] + " "):
                continue  # an axes legend sits inside its own axes' ticks' span, by design
            if box_a.shrunk(0.98, 0.9).overlaps(box_b.shrunk(0.98, 0.9)):
                problems.append(f"{a} overlaps {b}")
    return problems


def test_runs_are_labelled_by_the_config_keys_they_differ_in(tmp_path):
    """Labels say what differs (not the long folder names, which the key gives once)."""
    from fedrapp_app.report.tables import label_keys, run_labels

    fedrapp, fedavg = (load_run(_default_like_run(tmp_path / NAMES[s], s)) for s in ("fedrapp", "fedavg"))
    assert label_keys([fedrapp, fedavg]) == ["strategy"]
    assert run_labels([fedrapp, fedavg]) == ["strategy=fedrapp", "strategy=fedavg"]

    def other(name: str, **config) -> object:
        return load_run(make_run(tmp_path / name, [_row(1, 0)], {"num-clients": 8, **config}))

    # Several keys: strategy first, then in the order of the defaults; the output folder never counts.
    seeded = other("seeded", strategy="fedavg", seed=1, csc=True, **{"output-dir": "/elsewhere"})
    assert run_labels([fedrapp, seeded]) == ["strategy=fedrapp, seed=0, csc=false", "strategy=fedavg, seed=1, csc=true"]
    # Speed-only keys tell runs apart only when nothing else does.
    fast = other("fast", strategy="fedrapp", **{"decode-workers": 1})
    assert run_labels([fedrapp, fast]) == ["decode-workers=4", "decode-workers=1"]
    three = [
        "strategy=fedavg, seed=0, csc=false",
        "strategy=fedrapp, seed=0, csc=false",
        "strategy=fedavg, seed=1, csc=true",
    ]
    assert run_labels([fedavg, fast, seeded]) == three
    # The same config twice (only the folder differs): the words of the folder names that differ.
    again = load_run(_default_like_run(tmp_path / NAMES["fedrapp"].replace("215004", "230000"), "fedrapp"))
    assert label_keys([fedrapp, again]) == []
    assert run_labels([fedrapp, again]) == ["215004", "230000"]
    twin = other("twin", strategy="fedrapp")
    copy = load_run(shutil.copytree(twin.path, tmp_path / "x" / "twin"))
    assert run_labels([twin, copy]) == ["run 1", "run 2"]


def _timed_run(folder: Path, lock_started: float | None, files_opened: float, **summary_extra) -> Path:
    """The wall-time fields of the run that showed `rest (results, shutdown) | -3.6`: summary seconds 49.2 (from
    opening the files), setup 29.2 (from the server's start), 16 rounds of 23.6 s in all."""
    seconds = [2.0, 1.8, 1.8, 1.7, 1.6, 1.6, 1.5, 1.5, 1.5, 1.4, 1.4, 1.3, 1.3, 1.2, 1.0, 1.0]
    assert abs(sum(seconds) - 23.6) < 1e-9
    rows = [_row(t, 0, round_seconds=s, aggregate_seconds=0.01) for t, s in enumerate(seconds, 1)]
    summary = {"seconds": 49.2, "setup_seconds": 29.2, "status": "finished", **summary_extra}
    make_run(folder, rows, {"num-clients": 1}, summary)
    stored = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**stored, "started": files_opened}))
    if lock_started is not None:  # fedrapp_app.recording.runlock writes it when the server takes the folder
        (folder / ".lock").write_text(json.dumps({"pid": 1, "host": "h", "started": lock_started}))
    return folder


def test_wall_time_parts_add_up_to_the_total_without_a_negative_rest(tmp_path):
    """summary seconds count from opening the run's files, setup from the server's start 3.7 s earlier (the lock,
    counting the SuperNodes, provenance): the total is start to summary, and the rest is what is left (0.1 s)."""
    run = load_run(_timed_run(tmp_path / "r", lock_started=1000.0, files_opened=1003.7))
    w = wall_time(run)
    assert w.before_files == pytest.approx(3.7) and not w.from_files
    assert w.total == pytest.approx(49.2 + 3.7)
    parts = (w.setup, w.rounds, w.other)
    assert all(p is not None and p >= 0 for p in parts)
    assert sum(parts) == pytest.approx(w.total) and w.other == pytest.approx(0.1)
    page = write_report([run.path]).read_text()
    section = page[page.index("## Wall time") : page.index("## Config")]
    assert "| total (start to the summary) | 52.9 |" in section
    assert "| setup (start to the first round), of which 3.7 s before the run's files were opened | 29.2 |" in section
    assert "| rest (between the rounds: sampling, checkpoints; after the last: results) | 0.1 |" in section
    assert "add up to the total" in section and "| -" not in section


def test_wall_time_without_the_start_says_the_parts_overlap(tmp_path):
    """No .lock (a copied folder): the server's start is unknown, so the remainder −3.6 is not shown as a part."""
    run = load_run(_timed_run(tmp_path / "r", lock_started=None, files_opened=1003.7))
    w = wall_time(run)
    assert w.from_files and w.total == pytest.approx(49.2) and w.other is None
    assert w.overlap == pytest.approx(3.6)
    section = write_report([run.path]).read_text().split("## Wall time")[1]
    assert "| n/a: setup began at least 3.6 s before the total's clock |" in section
    assert "-3.6" not in section and "overlap" in section
    # A lock that a later session rewrote (after config.json was written) is not this session's start either.
    shutil.copytree(run.path, tmp_path / "later")
    (tmp_path / "later" / ".lock").write_text(json.dumps({"started": 1100.0}))
    assert wall_time(load_run(tmp_path / "later")).overlap == pytest.approx(3.6)


def test_wall_time_of_a_resumed_run_leaves_out_the_earlier_session(tmp_path):
    """After a resume the total covers the new session only: the rounds of the earlier one are shown apart."""
    run = load_run(_timed_run(tmp_path / "r", lock_started=1000.0, files_opened=900.0, resumed_after_round=10))
    w = wall_time(run)
    assert w.rounds == pytest.approx(1.3 + 1.3 + 1.2 + 1.0 + 1.0 + 1.4)
    assert w.rounds_before_resume == pytest.approx(23.6 - w.rounds)
    assert w.from_files and w.other is None and w.overlap is None  # 29.2 + 7.2 < 49.2: no overlap, rest unknown
    page = write_report([run.path]).read_text()
    assert "| rounds before the resume (an earlier session, not in the total) | 16.4 |" in page
    assert "| rest (between the rounds: sampling, checkpoints; after the last: results) | at least 12.8 " in page


def test_a_client_whose_stream_ended_is_not_called_not_sampled(tmp_path):
    """Streams end at different rounds (the last row says no batch is left, or the client answers exhausted):
    from then on its cells say 'stream ended'; only a client skipped by sampling is 'not sampled'."""
    from fedrapp_app.report.figures import build_status
    from fedrapp_app.report.tables import status_grid

    for exhausted_row in (False, True):
        run = load_run(_default_like_run(tmp_path / f"r{exhausted_row}", "none-fed", exhausted_row=exhausted_row))
        grid = status_grid(run)
        for c, last in LAST_ROUND.items():
            assert [grid.of(c, t) for t in range(1, 17)] == ["ok"] * last + ["stream ended"] * (16 - last), c
        legend = [t.get_text() for t in build_status(run, "t").axes[0].get_legend().get_texts()]
        assert legend == ["stream ended", "ok"]
    # fraction < 1: client 1 is not sampled in round 2 but its stream goes on (num-rounds reached, no end seen).
    rows = [_row(1, 0), _row(1, 1), _row(2, 0), _row(3, 0), _row(3, 1, "exhausted")]
    run = load_run(
        make_run(tmp_path / "sampled", rows, summary={"status": "finished", "stopped": "num-rounds reached"})
    )
    grid = status_grid(run)
    assert [grid.of(1, t) for t in (1, 2, 3)] == ["ok", "not sampled", "stream ended"]
    assert [grid.of(0, t) for t in (1, 2, 3)] == ["ok", "ok", "ok"]
    legend = [t.get_text() for t in build_status(run, "t").axes[0].get_legend().get_texts()]
    assert legend == ["not sampled", "stream ended", "ok"]


def test_the_comparison_labels_runs_by_what_differs_and_keys_the_folders_once(tmp_path):
    folders = [_default_like_run(tmp_path / NAMES[s], s) for s in ("fedrapp", "fedavg")]
    page = write_report(folders, tmp_path / "cmp").read_text()
    assert page.startswith("# Comparison: `strategy=fedrapp` vs `strategy=fedavg`")
    per_client = page[page.index("## Per client") :]
    assert "| client | domain | strategy=fedrapp (%) | strategy=fedavg (%) | Δ strategy=fedavg |" in per_client
    for name in NAMES.values():  # the key: each folder named once, as the link to its report
        assert page.count(name) == 2 + page.split("Regenerate: `")[1].split("`")[0].count(name)
        assert f"[{name}](runs/{name}/report.md)" in page
        assert name not in per_client


def test_the_comparison_figure_has_nothing_clipped_or_overlapping(tmp_path):
    """Three runs with default names (those that clipped the title and crowded the panels): every title, label
    and tick label lies inside the figure and overlaps no other; both lower panels have a y label."""
    from fedrapp_app.report.figures import build_compare
    from fedrapp_app.report.tables import compare, round_curves, run_labels

    names = [*NAMES.values(), "testbed-testbed-adaprompt-none-fed-seed0-20261202-215201"]
    runs = [load_run(_default_like_run(tmp_path / n, n.split("-")[3].replace("none", "none-fed"))) for n in names]
    labels = run_labels(runs)
    assert labels == ["strategy=fedrapp", "strategy=fedavg", "strategy=none-fed"]
    fig = build_compare(compare(runs), [round_curves(r) for r in runs], runs[0].domains, labels, names)
    assert _layout_problems(fig) == []
    lower = fig.axes[2:4]
    assert all(ax.get_ylabel() for ax in lower)
    ticks = [t.get_text() for t in lower[1].get_xticklabels()]
    assert ticks[:2] == ["0 gaussian_noise:1", "4 gaussian_noise:1"]
    key = [t.get_text() for t in fig.legends[0].get_texts()]
    assert key[0] == f"strategy=fedrapp (reference):  {names[0]}" and all(
        n in k for n, k in zip(names, key, strict=True)
    )
    assert names[0] not in fig._suptitle.get_text()


def test_the_signals_legend_covers_no_curve(tmp_path):
    """fedrapp.png: the clients' legend (and the uniform-weights one) sits beside the panels, not on them."""
    from fedrapp_app.report.figures import build_signals
    from fedrapp_app.report.tables import round_curves

    run = load_run(_default_like_run(tmp_path / NAMES["fedrapp"], "fedrapp"))
    fig = build_signals(round_curves(run), "signals")
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    _render(fig)
    legend = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_window_extent()), ax.get_title()
    assert len(fig.legends[0].get_texts()) == 9  # 8 clients and the uniform-weights line
    assert _layout_problems(fig) == []


def test_the_overview_counts_clients_on_an_axis_of_their_own(tmp_path):
    """overview.png: the clients scored per round are bars on a labelled count axis, not on the accuracy axis."""
    from fedrapp_app.report.figures import build_overview
    from fedrapp_app.report.tables import client_stats, peer_matrix, round_curves

    run = load_run(_default_like_run(tmp_path / NAMES["fedrapp"], "fedrapp"))
    fig = build_overview(run, round_curves(run), client_stats(run), peer_matrix(run), None, "title")
    accuracy, counts = fig.axes[0], fig.axes[1]
    assert "accuracy" in accuracy.get_ylabel() and not accuracy.patches  # no bars on the accuracy axis
    assert "clients" in counts.get_ylabel()
    heights = [bar.get_height() for bar in counts.patches]
    assert heights == [sum(last >= t for last in LAST_ROUND.values()) for t in range(1, 17)]
    _render(fig)
    ticks = [t.get_text() for t in counts.get_yticklabels() if t.get_visible() and t.get_text()]
    assert ticks and all(t.isdigit() for t in ticks) and max(int(t) for t in ticks) <= 8
    assert counts.get_ylim()[1] == 8
    assert _layout_problems(fig) == []
