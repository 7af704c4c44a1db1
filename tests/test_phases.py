"""The launcher's account of the wall time (``recording.phases``), its app staging (``running.stage``), its watch
on the run's own Ray, and the settle-free node count under fedrapp-sim (``federation.strategy.count_nodes``)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from fedrapp_app.config.deployment import EXPECTED_NODES_ENV
from fedrapp_app.federation.strategy import count_nodes
from fedrapp_app.recording.phases import (
    Clock,
    launch_phases,
    phase_line,
    process_start,
    read_launch,
    server_marks,
    write_launch,
)
from fedrapp_app.report import write_report
from fedrapp_app.running.stage import packed_files, stage_app
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import run_federation, small_run

ROOT = Path(__file__).resolve().parent.parent

SUMMARY = {"started": 105.0, "setup_seconds": 8.0, "discovery_seconds": 6.0, "seconds": 30.0}
LAUNCHER = [("checks", 101.0), ("superlink", 102.5), ("submit", 103.0), ("teardown", 137.0), ("stop", 138.0)]


def test_the_phases_are_consecutive_and_add_up_to_the_wall_time():
    phases = launch_phases(100.0, LAUNCHER, server_marks(SUMMARY))
    assert [p["phase"] for p in phases] == [
        "checks",
        "superlink",
        "submit",
        "simulation start",
        "server setup",
        "registration",
        "rounds",
        "teardown",
        "stop",
    ]
    seconds = {p["phase"]: p["seconds"] for p in phases}
    assert seconds["simulation start"] == 2.0  # submit (103) to the ServerApp's start (105)
    assert seconds["server setup"] == 2.0 and seconds["registration"] == 6.0  # setup 8 = 2 before discovery + 6
    assert seconds["rounds"] == 22.0 and seconds["teardown"] == 2.0  # the summary at 135, flwr run's exit at 137
    assert sum(p["seconds"] for p in phases) == pytest.approx(38.0)  # start 100 to the last mark 138
    assert all(p["what"] for p in phases)
    assert phase_line(phases).startswith("38.0 s wall: checks 1.0, superlink 1.5, submit 0.5, simulation start 2.0")


def test_server_phases_off_the_launchers_clock_are_left_out_and_still_add_up():
    earlier = {**SUMMARY, "started": 50.0}  # a summary of an earlier session, or another host's clock
    phases = launch_phases(100.0, LAUNCHER, server_marks(earlier))
    assert [p["phase"] for p in phases] == ["checks", "superlink", "submit", "teardown", "stop"]
    assert sum(p["seconds"] for p in phases) == pytest.approx(38.0)
    assert server_marks(None) == [] and server_marks({"started": 1.0}) == []  # a run that failed before its summary


def test_launch_file_round_trips_and_the_process_start_is_in_the_past(tmp_path):
    phases = launch_phases(100.0, LAUNCHER, [])
    write_launch(tmp_path, 100.0, phases, {"launcher_pid": 7})
    back = read_launch(tmp_path)
    assert back["phases"] == phases and back["seconds"] == pytest.approx(38.0) and back["launcher_pid"] == 7
    (tmp_path / "launch.json").write_text("{not json")
    assert read_launch(tmp_path) is None
    assert time.time() - 30 * 86400 < process_start() <= time.time()
    clock = Clock()
    clock.mark("checks")
    assert clock.marks[0][1] >= clock.start


def _app(tmp_path: Path, gitignore: str) -> Path:
    app = tmp_path / "app"
    app.mkdir()
    for name in ("pyproject.toml", "client_app.py", "server_app.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, app / name)
    (app / ".gitignore").write_text(gitignore)
    (app / "pkg").mkdir()
    (app / "pkg" / "mod.py").write_text("X = 1\n")
    (app / "pkg" / "figure.png").write_bytes(b"\x89PNG")  # not a file type Flower packs
    (app / "outputs" / "run").mkdir(parents=True)
    for i in range(50):
        (app / "outputs" / "run" / f"row{i}.json").write_text("{}")
    (app / "outputs" / "keep.py").write_text("KEEP = 1\n")
    (app / ".git").mkdir()
    (app / ".git" / "config.toml").write_text("x = 1\n")
    (app / "link.py").symlink_to(app / "pkg" / "mod.py")
    return app


@pytest.mark.parametrize("gitignore", ["/outputs/\n*.pyc\n", "outputs/*\n!outputs/keep.py\n"])
def test_the_staged_app_packs_into_the_same_fab_without_the_ignored_folders(tmp_path, gitignore):
    """``flwr run`` on the staged folder builds the very FAB it builds from the app folder (same bytes, so the
    same hash); ignored folders are not walked, unless a negation pattern may take a file back out of one."""
    from flwr.cli.build import build_fab_from_disk

    app = _app(tmp_path, gitignore)
    staged = stage_app(app, tmp_path / "staged")
    assert build_fab_from_disk(staged) == build_fab_from_disk(app)
    files = set(packed_files(app))
    assert {"pyproject.toml", "client_app.py", "pkg/mod.py", ".gitignore"} <= files
    assert not any(f.startswith(("outputs/run", ".git/")) or f in ("link.py", "pkg/figure.png") for f in files)
    assert ("outputs/keep.py" in files) == gitignore.startswith("outputs/*")


class _Grid:
    def __init__(self, nodes: int) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(range(self.nodes))


def test_node_count_under_fedrapp_sim_needs_no_settle_wait(monkeypatch):
    monkeypatch.delenv(EXPECTED_NODES_ENV, raising=False)
    began = time.monotonic()
    assert count_nodes(_Grid(3), 0, timeout=30, settle=0.6) == 3
    assert time.monotonic() - began >= 0.6  # unknown federation size: the count must hold for the settle time
    monkeypatch.setenv(EXPECTED_NODES_ENV, "3")
    began = time.monotonic()
    assert count_nodes(_Grid(3), 0, timeout=30, settle=30) == 3
    assert time.monotonic() - began < 5  # fedrapp-sim started 3 SuperNodes: all there, at once
    monkeypatch.setenv(EXPECTED_NODES_ENV, "4")  # one still missing: the settle rule decides, as without the hint
    began = time.monotonic()
    assert count_nodes(_Grid(3), 0, timeout=30, settle=0.6) == 3
    assert time.monotonic() - began >= 0.6


def test_the_report_shows_the_commands_phases(tmp_path):
    """A run folder with launch.json: the report's wall-time section lists each phase and their total; written
    before the launcher's last phases (as fedrapp-sim writes it), it says where those are."""
    model = make_tiny_clip(tmp_path / "tiny", world.CLASSNAMES)
    config = small_run(model, tmp_path / "out", **{"num-rounds": 1, "num-clients": 2})
    run = Path(run_federation(config)[0]["run_dir"])
    later = "This report was written while the launcher ended the run"
    for marks, total, note in ((LAUNCHER, "38.0", True), ([*LAUNCHER, ("report", 139.0)], "39.0", False)):
        write_launch(run, 100.0, launch_phases(100.0, marks, []), {})
        section = write_report([run]).read_text().split("### What the command waited for (fedrapp-sim)")[1]
        assert "| superlink | 1.5 |" in section and f"| **total** | {total} |" in section
        assert (later in section) == note  # without the report's own phase: where the last phases are


def test_a_ray_that_dies_under_the_run_stops_flwr_run_with_its_log(tmp_path, capsys):
    """The run's Ray exits before the run is over: flwr run is stopped (its clients would never answer) and the
    message names Ray's exit status and the end of its log; once the run is over, Ray's exit is expected."""
    import subprocess
    import sys
    import threading

    from fedrapp_app.running.launch import _watch_ray

    log = tmp_path / "ray-head.log"
    log.write_text("starting\nOSError: AF_UNIX path length cannot exceed 107 bytes\n")
    over = threading.Event()
    for run_over in (False, True):
        head = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
        runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
        if run_over:
            over.set()
        _watch_ray(head, log, runner, over)
        try:
            assert (runner.wait(timeout=10) != 0) if not run_over else runner.poll() is None
        finally:
            runner.kill()
            runner.wait()
        err = capsys.readouterr().err
        if run_over:
            assert err == ""
        else:
            assert "the run's Ray stopped (exit status 1)" in err and "path length cannot exceed 107" in err


def test_a_stop_can_spare_a_process_tree_for_later(tmp_path):
    """On Ctrl-C the launcher stops Flower's processes first and the run's Ray after: ``descendants`` finds a
    process's whole tree and ``stop_marked(spare=...)`` leaves it alone."""
    import os
    import subprocess
    import sys
    import uuid

    from fedrapp_app.running.processes import descendants, marked_pids, stop_marked

    mark = uuid.uuid4().hex
    env = {**os.environ, "FEDRAPP_TEST_SPARE": mark}
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    parent = subprocess.Popen([sys.executable, "-c", child + "time.sleep(60)"], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while len(descendants(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = descendants(parent.pid)
        assert len(tree) == 2 and parent.pid in tree and other.pid not in tree
        stop_marked(mark, grace=2.0, variable="FEDRAPP_TEST_SPARE", settle=0.2, spare=tree)
        assert other.wait(timeout=5) is not None and parent.poll() is None  # the spared tree still runs
        assert set(marked_pids(mark, "FEDRAPP_TEST_SPARE")) == tree
    finally:
        stop_marked(mark, grace=2.0, variable="FEDRAPP_TEST_SPARE", settle=0.2)
        parent.wait(timeout=10)
    assert marked_pids(mark, "FEDRAPP_TEST_SPARE") == []
