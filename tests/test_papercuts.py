"""A new user's papercuts with fedrapp-sim and plain flwr run: a run folder that cannot be written, explained fixes,
the shipped testbed model given by its path, Flower's home, the launcher's connection in config.toml, Ray's noise,
and a ServerApp that refuses a bad config in one line. No federation runs here: the launcher runs against a fake
SuperLink and flwr run, the ServerApp against a grid it must not touch."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.data.partition import partition_indices
from fedrapp_app.data.spec import DataSpec
from fedrapp_app.federation.server import main as server_main
from fedrapp_app.federation.server import run_server
from fedrapp_app.recording.phases import Clock
from fedrapp_app.recording.runlock import RunFolderUnwritable, check_writable
from fedrapp_app.running import launch as launcher

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_MODEL = ROOT / "fedrapp_app" / "testbed" / "model"


def fedrapp_sim(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """``fedrapp-sim`` as a user runs it (this interpreter's), and the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "fedrapp_app.running.launch", *args], capture_output=True, text=True, timeout=timeout
    )
    return done, time.monotonic() - started


class Untouchable:
    """A grid the ServerApp must not use: a bad config fails before the first message."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the ServerApp used the grid ({name}) before it refused the config")


# ----------------------------------------------------------------------------------- 1. a run folder it cannot write
def immutable_folder(path: Path) -> Path | None:
    """``path``, made immutable (``chattr +i``: even root cannot create files in it), or None where that fails."""
    path.mkdir()
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
    return path if done.returncode == 0 else None


@pytest.fixture
def unwritable(tmp_path) -> list[tuple[str, str]]:
    """(output-dir, what the message says) for each way a folder cannot be written here: a regular file where the
    folder should be, a path under /proc, and an immutable folder where chattr works."""
    (tmp_path / "a-file").write_text("not a folder")
    cases = [(str(tmp_path / "a-file"), "is a file, not a folder"), ("/proc/fedrapp-out", "nothing can be created")]
    frozen = immutable_folder(tmp_path / "frozen")
    if frozen is not None:
        cases.append((str(frozen), "Operation not permitted"))
    yield cases
    if frozen is not None:
        subprocess.run(["chattr", "-i", str(frozen)], check=True)


def test_a_run_folder_that_cannot_be_written_is_named_with_the_reason_and_the_fix(unwritable, tmp_path):
    for output_dir, reason in unwritable:
        with pytest.raises(RunFolderUnwritable) as err:
            check_writable(Path(output_dir) / "run", output_dir)
        message = str(err.value)
        assert f"output-dir = {output_dir!r}" in message and f"{output_dir}/run" in message and reason in message
        assert "-c \"output-dir='" in message and "\n" not in message
    check_writable(tmp_path / "new" / "deeper" / "run", str(tmp_path / "new"))  # a folder that can be made
    assert not (tmp_path / "new").exists()  # ... is checked without leaving anything behind


def test_fedrapp_sim_refuses_an_unwritable_output_dir_in_a_second(unwritable):
    for output_dir, reason in unwritable:
        done, seconds = fedrapp_sim(str(ROOT), "--check", "-c", f"output-dir='{output_dir}'")
        assert done.returncode == 2 and reason in done.stderr and "-c \"output-dir='" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert seconds < 10, seconds  # about a second; the check once started a whole federation (32 s)


def test_the_launchers_checks_refuse_an_unwritable_output_dir_before_the_model_and_data(unwritable, monkeypatch):
    from fedrapp_app.running import preflight

    monkeypatch.setattr(preflight, "preflight", lambda config: pytest.fail("the model and data came first"))
    for output_dir, _ in unwritable:
        args = launcher._parser().parse_args([str(ROOT), "-c", f"output-dir='{output_dir}'"])
        with pytest.raises(ConfigError, match="cannot create and write the run folder"):
            launcher.prepare(args, ROOT)


def test_the_server_app_refuses_an_unwritable_output_dir_before_it_uses_the_grid(unwritable):
    for output_dir, reason in unwritable:
        with pytest.raises(RunFolderUnwritable, match=reason):
            run_server(Untouchable(), {"output-dir": output_dir, "run-name": "run"})


# ----------------------------------------------------------------------------------- 8. a bad config, one ERROR line
class Collect(logging.Handler):
    """Every record that reaches Flower's logger, formatted as Flower's handlers would (traceback included)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s : %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def flower_log() -> Collect:
    handler = Collect()
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"dirichlet-alpha": -1.0}, 'dirichlet-alpha = -1.0: must be > 0.0 (fix: -c "dirichlet-alpha=<value>"'),
        ({"output-dir": "/proc/fedrapp-out"}, "nothing can be created in /proc"),
    ],
)
def test_the_server_app_logs_a_bad_config_as_one_error_line_and_fails_the_run(flower_log, overrides, expected):
    from flwr.common.logger import log

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=overrides)
    with pytest.raises(ConfigError) as err:
        server_main(Untouchable(), context)  # Flower's ServerApp calls this; the raise ends the run failed
    log(logging.ERROR, "%s raised an exception", "Simulation", exc_info=err.value)  # as Flower logs it next
    ours = [line for line in flower_log.lines if expected in line]
    assert len(ours) == 1 and ours[0].startswith("ERROR : ") and "\n" not in ours[0], flower_log.lines
    assert flower_log.lines[-1] == "ERROR : Simulation raised an exception"  # Flower's line, without a traceback
    assert not any("Traceback" in line for line in flower_log.lines)


def test_other_exceptions_keep_their_traceback_in_flowers_log(flower_log, tmp_path):
    from flwr.common.logger import log

    config = {"output-dir": str(tmp_path), "run-name": "run", "num-clients": 2}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    try:
        server_main(Untouchable(), context)
    except AssertionError as err:  # a bug, not the user's input: the traceback stays
        log(logging.ERROR, "%s raised an exception", "Simulation", exc_info=err)
    assert "Traceback" in flower_log.lines[-1] and "used the grid" in flower_log.lines[-1]


# ----------------------------------------------------------------------------------- 2. the testbed pool's fix
def test_the_testbed_pool_fix_says_why_and_each_fix_it_names_works():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"num-clients": 600})
    message = str(err.value)
    assert "600 clients x min-partition-size = 10 samples = 6000" in message
    assert (
        '-c "testbed-samples=24000", 4x the 6000 that just fit: a Dirichlet draw leaves many clients short' in message
    )
    assert '-c "num-clients=512"' in message and '-c "min-partition-size=8"' in message
    for fixed in ({"testbed-samples": 24000}, {"num-clients": 512}, {"min-partition-size": 8}):
        RunConfig.from_run_config({"num-clients": 600, **fixed})
    with pytest.raises(ConfigError, match=r'-c "testbed-samples=384000", one batch of batch-size = 64 per client'):
        RunConfig.from_run_config({"num-clients": 6000, "partition": "iid"})


def test_the_suggested_testbed_pool_partitions_for_600_clients_at_the_default_alpha_and_seed():
    from fedrapp_app.data.streams import cached_source

    spec = RunConfig.from_run_config({"num-clients": 600, "testbed-samples": 24000}).data_spec()
    labels = cached_source(spec).labels()
    parts = partition_indices(labels, spec)
    assert len(parts) == 600 and min(len(p) for p in parts) >= 10 and sum(len(p) for p in parts) == 24000


# ----------------------------------------------------------------------------------- 3. the testbed model by its path
def test_the_shipped_testbed_model_given_by_its_path_cannot_score_a_real_dataset(tmp_path):
    link = tmp_path / "my-model"
    link.symlink_to(SHIPPED_MODEL)
    for model in (str(SHIPPED_MODEL), f"{SHIPPED_MODEL}/", str(link), str(SHIPPED_MODEL / ".." / "model")):
        with pytest.raises(ConfigError, match="the testbed CLIP only knows the testbed world's words"):
            RunConfig.from_run_config({"model": model, "dataset": "dtd", "data-dir": str(tmp_path)})
    RunConfig.from_run_config({"model": str(SHIPPED_MODEL)})  # with the testbed's own data it is the testbed


# ----------------------------------------------------------------------------------- 4. min-partition-size's fix
def test_the_min_partition_size_error_gives_fixes_in_the_c_form_and_they_work():
    labels = np.arange(12) % 3
    spec = DataSpec(num_clients=5, partition="dirichlet", min_partition_size=3)
    with pytest.raises(ValueError) as err:
        partition_indices(labels, spec)
    message = str(err.value)
    assert '-c "min-partition-size=2"' in message and '-c "num-clients=4"' in message
    assert "-c \"partition='iid'\"" in message
    for fixed in ({"min_partition_size": 2}, {"num_clients": 4}, {"partition": "iid"}):
        assert len(partition_indices(labels, DataSpec(**{**spec.__dict__, **fixed}))) == fixed.get("num_clients", 5)
    with pytest.raises(ValueError, match='-c "num-clients=12"'):
        partition_indices(labels, DataSpec(num_clients=13, partition="iid"))


# ----------------------------------------------------------------------------------- 5. Flower's home
def test_flowers_home_is_the_option_else_flwr_home_else_the_apps_folder(tmp_path):
    app = tmp_path / "app"
    assert launcher.flwr_home(None, app, {}) == app / ".flwr-home"
    assert launcher.flwr_home(None, app, {"FLWR_HOME": str(tmp_path / "env")}) == tmp_path / "env"
    assert launcher.flwr_home(str(tmp_path / "opt"), app, {"FLWR_HOME": str(tmp_path / "env")}) == tmp_path / "opt"
    text = launcher._parser().format_help()
    assert "$FLWR_HOME when that is set" in " ".join(text.split())


# ----------------------------------------------------------------------------------- 6. the launcher's connection
USER_CONFIG = """# my Flower config: keep this comment
[superlink]
default = "local"

[superlink.local]
address = ":local:"

# the GPU box
[superlink.gpu]
address = "10.0.0.1:9093"
root-certificates = "/certs/ca.crt"
"""


def test_the_launchers_connection_is_taken_out_and_nothing_else(tmp_path):
    env = {**os.environ, "FLWR_HOME": str(tmp_path)}
    path = tmp_path / "config.toml"
    for before in (USER_CONFIG, USER_CONFIG.rstrip("\n"), USER_CONFIG + "\n\n"):
        path.write_text(before)
        launcher.add_connection(env, "fedrapp-sim-4242", "127.0.0.1:4242")
        added = path.read_text()
        assert added.startswith(before) and added.endswith(
            '[superlink.fedrapp-sim-4242]\naddress = "127.0.0.1:4242"\ninsecure = true\n'
        )
        launcher.remove_connection(path, "fedrapp-sim-4242")
        assert path.read_text().rstrip("\n") == before.rstrip("\n") and path.read_text().startswith(before)
    # Flower rewrote the file meanwhile (tomli_w, as its own writes do): the table goes, its neighbours stay
    rewritten = (
        '[superlink]\ndefault = "local"\n\n[superlink.fedrapp-sim-4242]\naddress = "127.0.0.1:4242"\n'
        'insecure = true\n\n[superlink.gpu]\naddress = "10.0.0.1:9093"\n'
    )
    path.write_text(rewritten)
    launcher.remove_connection(path, "fedrapp-sim-4242")
    assert path.read_text() == '[superlink]\ndefault = "local"\n\n[superlink.gpu]\naddress = "10.0.0.1:9093"\n'


class FakeProcess:
    """A process the launcher started: the SuperLink (it waits) or flwr run (it prints ``lines``)."""

    pid = 999_999_999

    def __init__(self, lines: list[str]) -> None:
        self.stdout = iter(lines)
        self.returncode = 0

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode


class FakeRayHead(FakeProcess):
    """The run's Ray head (``ray start --head --block``): running until it is stopped."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines)
        self.returncode = None

    def wait(self, timeout=None):
        self.returncode = 0
        return 0


NOISY_LINES = [
    "INFO :      Starting Flower Simulation\n",
    "WARNING :   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
    "INFO :      To change federation size, use the following command:\n",
    "INFO :      \tflwr federation simulation-config @none/default <superlink> --num-supernodes <N>\n",
    "/work/venv/lib/python3.11/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of "
    "Ray, Ray will no longer override accelerator visible devices env var if num_gpus=0 or num_gpus=None (default). "
    "To enable this behavior and turn off this error message, set RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0\n",
    "  warnings.warn(\n",
    "[mutex.cc : 452] RAW: Lock blocking 0x600002cd0cd8   @\n",
    "\x1b[36m(raylet)\x1b[0m [mutex.cc : 452] RAW: Lock blocking 0x55d0c4a0d8d8   @\n",
    "\x1b[36m(ClientAppActor pid=14187)\x1b[0m \x1b[92mINFO \x1b[0m:      client 1 runs on cpu\n",
    "INFO :      round 1 | 2/2 clients ok | acc 57.8%\n",
]


def interrupted_output():
    """flwr run's output, cut by a Ctrl-C (the launcher's SIGINT handler raises where the launcher is)."""
    yield NOISY_LINES[0]
    launcher._on_signal(2, None)


def fake_launch(monkeypatch, tmp_path: Path, end: str, home: Path) -> tuple[int, list[str]]:
    """``launch()`` with a fake SuperLink and flwr run that ends as ``end`` says ('done', 'failed', 'ctrl-c'); the
    exit status and config.toml as it was while the run ran."""
    during: list[str] = []
    real_popen = subprocess.Popen

    def popen(command, *args, **kwargs):
        if command[0] == "flower-superlink":
            return FakeProcess([])
        if command[:2] == ["ray", "start"]:  # the run's own Ray head: up until stopped
            return FakeRayHead([])
        if command[:2] == ["flwr", "run"]:
            during.append((Path(kwargs["env"]["FLWR_HOME"]) / "config.toml").read_text())
            process = FakeProcess(NOISY_LINES)
            if end == "ctrl-c":
                process.stdout = interrupted_output()
            return process
        return real_popen(command, *args, **kwargs)

    def status(env, cwd, connection=launcher.CONNECTION, run_id=None):
        if end == "failed":
            raise RuntimeError("could not read the run status")
        return {"status": "finished:completed"}

    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    monkeypatch.setattr(launcher, "wait_healthy", lambda port, process: None)
    monkeypatch.setattr(launcher, "_watch_ray", lambda *args: None)  # the fake Ray head never dies under the run
    monkeypatch.setattr(launcher, "run_status", status)
    monkeypatch.setattr(launcher, "_stop_everything", lambda launch_id, neutral, settle=2.0, spare=(): None)
    monkeypatch.setattr(launcher, "report", lambda status, run_dir, log_path, clock=None, reporter=None: 0)
    args = launcher._parser().parse_args([str(ROOT), "--flwr-home", str(home)])
    args.gpu_share = 0.0
    config = RunConfig.from_run_config({"num-clients": 2})
    code = launcher.launch(args, ROOT, {}, config, tmp_path / "out" / "run", Clock())
    return code, during


@pytest.mark.parametrize(("end", "code"), [("done", 0), ("failed", 1), ("ctrl-c", 130)])
def test_fedrapp_sim_takes_its_connection_out_of_config_toml_when_it_exits(monkeypatch, tmp_path, end, code):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(USER_CONFIG)
    exit_code, during = fake_launch(monkeypatch, tmp_path, end, home)
    assert exit_code == code and during[0].startswith(USER_CONFIG) and "\n[superlink.fedrapp-sim-" in during[0]
    assert (home / "config.toml").read_text() == USER_CONFIG  # the user's file, byte for byte


def test_fedrapp_sim_leaves_flowers_default_config_without_its_connection(monkeypatch, tmp_path, capsys):
    home = tmp_path / "new-home"
    code, during = fake_launch(monkeypatch, tmp_path, "done", home)
    assert code == 0 and "[superlink.fedrapp-sim-" in during[0] and 'address = "127.0.0.1:' in during[0]
    left = (home / "config.toml").read_text()
    assert "fedrapp-sim" not in left and "[superlink.local]" in left  # Flower's defaults stay


def test_fedrapp_sim_uses_flwr_home_from_the_environment_and_option(monkeypatch, tmp_path):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "env-home"))
    fake_launch(monkeypatch, tmp_path, "done", tmp_path / "opt-home")  # --flwr-home wins over FLWR_HOME
    assert (tmp_path / "opt-home" / "config.toml").is_file() and not (tmp_path / "env-home").exists()


# ----------------------------------------------------------------------------------- 7. Ray's noise
def test_rays_tip_and_mutex_lines_and_flowers_federation_notes_are_not_printed(monkeypatch, tmp_path, capsys):
    kept = list(launcher.quiet(NOISY_LINES))
    assert [launcher.strip_ansi(line) for line in kept] == [
        "INFO :      Starting Flower Simulation\n",
        "(ClientAppActor pid=14187) INFO :      client 1 runs on cpu\n",
        "INFO :      round 1 | 2/2 clients ok | acc 57.8%\n",
    ]
    after_tip = [NOISY_LINES[4], "INFO :      results go to x\n"]  # a line after the tip that is not its source
    assert list(launcher.quiet(after_tip)) == after_tip[1:]
    home = tmp_path / "home"
    fake_launch(monkeypatch, tmp_path, "done", home)  # what fedrapp-sim prints of flwr run's output
    printed = capsys.readouterr().out
    assert "round 1 | 2/2" in printed and "mutex.cc" not in printed and "FutureWarning" not in printed
    assert "warnings.warn(" not in printed and "flwr federation" not in printed


def test_a_model_folder_without_weights_is_refused_before_the_start_and_the_testbeds_says_why(tmp_path, monkeypatch):
    """A copy of the app from Flower Hub has the testbed model's config but not its weights (Hub takes no
    .safetensors): the check named the folder fine and the run failed later, loading. Now it is refused at once."""
    import shutil

    import fedrapp_app.running.preflight as preflight
    from fedrapp_app.running.preflight import PreflightError, check_model

    shipped = Path(preflight.__file__).parents[1] / "testbed" / "model"
    bare = tmp_path / "model"
    shutil.copytree(shipped, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(PreflightError, match=r"holds no weights \(model.safetensors.*copy the checkpoint's weights"):
        check_model(str(bare))
    monkeypatch.setattr(preflight, "_TESTBED_MODEL", bare)
    with pytest.raises(PreflightError, match="testbed model has lost its weights.*Flower Hub"):
        check_model("testbed")
    (bare / "pytorch_model.bin.index.json").write_text("{}")  # a sharded checkpoint's index counts
    check_model(str(bare))


# ----------------------------------------------------------------------------------- issue 39's papercuts
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--supernodes", "0", "--check"], "0 SuperNodes: at least 1 (or leave --supernodes out"),
        (["--supernode", "3", "--check"], "unrecognized arguments: --supernode 3"),  # no abbreviation of --supernodes
        (["--check", "-c", "seed=1 seed=2"], "'seed' is given twice (fix: give it once"),
        (["--check", "-c", "shift='continual' shift-spread=7"], "shift-spread=7 is invalid: expected at most the 4 "),
        (["--check", "-c", "testbed-domains='fog:2'"], "unknown corruption 'fog'"),
    ],
)
def test_a_cli_papercut_is_refused_in_one_line_with_the_fix(args, message):
    done, _ = fedrapp_sim(str(ROOT), *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    if "shift-spread" in message or "testbed-domains" in " ".join(args):
        assert "(fix: -c" in done.stderr


def test_an_override_file_with_the_pyproject_table_or_bad_toml_says_how_to_fix_it(tmp_path):
    table = tmp_path / "table.toml"
    table.write_text("[tool.flwr.app.config]\nseed = 1\n")
    done, _ = fedrapp_sim(str(ROOT), "--check", "-c", str(table))
    assert done.returncode == 2 and "holds a [tool.flwr.app.config] table" in done.stderr
    assert "remove the table header" in done.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("seed = \n")
    done, _ = fedrapp_sim(str(ROOT), "--check", "-c", str(broken))
    assert done.returncode == 2 and "fix: TOML, one key = value per line" in done.stderr


def test_the_bench_names_the_option_that_is_wrong():
    done = subprocess.run(
        [sys.executable, "-m", "fedrapp_app.bench", str(ROOT / "conf/bench/testbed.yaml"), "--workers", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--workers 0: must be >= 1" in done.stderr


def test_a_relative_model_or_data_folder_reaches_a_ray_cell_as_an_absolute_path(tmp_path, monkeypatch):
    from fedrapp_app.bench.ray_cells import absolute_paths

    monkeypatch.chdir(tmp_path)
    out = absolute_paths({"model": "./models/clip", "data-dir": "data/dtd", "seed": 1})
    assert out == {"model": str(tmp_path / "models/clip"), "data-dir": str(tmp_path / "data/dtd"), "seed": 1}
    hub = {"model": "openai/clip-vit-base-patch16", "data-dir": "/abs/dtd"}
    assert absolute_paths(hub) == hub  # a Hub id and an absolute folder stay as they are
    assert absolute_paths({"model": "testbed"}) == {"model": "testbed"}


def test_a_seed_list_reads_lists_and_ranges_and_refuses_the_rest():
    import argparse

    from fedrapp_app.running.launch import seed_list

    assert seed_list("0,1,2") == [0, 1, 2] and seed_list("0-3") == [0, 1, 2, 3] and seed_list("0-1,7") == [0, 1, 7]
    for bad in ("", "a", "1,1", "-1", "3-x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_list(bad)


# ----------------------------------------------------------------------------------- a new user's first comparison
@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../../escape", "points outside output-dir"),
        ("exp/a b", "is a path, not a folder name"),
        ("..", "points outside output-dir"),
        ("a\\b", "is a path, not a folder name"),
    ],
)
def test_a_run_name_is_one_folder_inside_output_dir_and_the_fix_it_names_works(name, why, tmp_path):
    """run-name='../../escape' wrote outside output-dir (in a deployment a remote -c chose paths on the SuperLink's
    host); 'exp/a b' broke --seeds (the runs went to one folder, the report looked in another)."""
    import re

    from fedrapp_app.federation.server import run_dir_of

    with pytest.raises(ConfigError, match=re.escape(why)) as refused:
        RunConfig.from_run_config({"run-name": name, "output-dir": str(tmp_path)})
    fixed = re.search(r"fix: -c \"run-name='([^']*)'\"", str(refused.value)).group(1)
    config = RunConfig.from_run_config({"run-name": fixed, "output-dir": str(tmp_path)})
    assert run_dir_of(config).parent == tmp_path.resolve()
    derived = RunConfig.from_run_config({"model": "/models/my/clip/", "output-dir": str(tmp_path)})
    assert run_dir_of(derived).parent == tmp_path.resolve() and run_dir_of(derived).name.startswith("testbed-clip-")


def test_fedrapp_sim_refuses_a_run_name_that_leaves_output_dir_before_anything_is_written(tmp_path):
    done, _ = fedrapp_sim(str(ROOT), "-c", f"output-dir='{tmp_path / 'out'}' run-name='../../escape'")
    assert done.returncode == 2 and "points outside output-dir" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "escape").exists()


def test_check_with_seeds_checks_each_seed_and_writes_no_report(tmp_path):
    """``--check --seeds 0,1`` crashed after every check passed: it wrote a seeds report for runs that never ran."""
    done, _ = fedrapp_sim(
        str(ROOT), "--check", "--seeds", "0,1", "-c", f"output-dir='{tmp_path}' run-name='s' num-clients=4",
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.count("are fine for 4 clients") == 2 and "seeds' report would go to" in done.stdout
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written


def test_a_reversed_seed_range_is_called_one():
    import argparse

    from fedrapp_app.running.launch import seed_list

    with pytest.raises(argparse.ArgumentTypeError, match=r"3-1 is a reversed range \(fix: 1-3"):
        seed_list("3-1")


CUT_PIPE = """
import signal, sys, time
from pathlib import Path
from fedrapp_app.running.console import resilient_output

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even where the test runs in the background

def body():
    try:
        print("fedrapp-sim: round 1", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        for k in range(50):  # the stop's lines, each to a pipe nobody reads any more
            print(f"fedrapp-sim: stopping {k}", file=sys.stderr)
            print(f"fedrapp-sim: stopping {k}")
        Path(sys.argv[1]).write_text("interrupted")  # summary.json and the resume command come after those lines
        return 130
    return 0

if sys.argv[2] == "wrapped":
    with resilient_output():
        sys.exit(body())
sys.exit(body())
"""


@pytest.mark.parametrize(("how", "code"), [("wrapped", 130), ("bare", 1)])
def test_ctrl_c_under_tee_exits_130_and_writes_its_files_though_the_pipe_is_gone(tmp_path, how, code):
    """``fedrapp-sim ... | tee log`` and Ctrl-C: the shell stops tee too, the launcher's next line hit a broken pipe,
    and the stop ended with status 1, no resume command and no summary.json. The launcher's output is wrapped
    (running.console) so that the stop goes on; 'bare' shows the failure the wrapper prevents."""
    import signal

    summary = tmp_path / "summary.json"
    child = subprocess.Popen(
        [sys.executable, "-c", CUT_PIPE, str(summary), how],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert child.stdout.readline() == "fedrapp-sim: round 1\n"
    child.stdout.close()  # tee is gone
    child.stderr.close()
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=30) == code
    assert summary.is_file() == (how == "wrapped")


def test_a_dp_run_says_so_in_words():
    from fedrapp_app.config.privacy import privacy_words

    assert privacy_words({"dp": False, "dp-epsilon": 8.0}) is None
    assert privacy_words({"dp": True, "dp-epsilon": 8.0, "dp-delta": 1e-5}) == "dp ε = 8, δ = 1e-05"
    assert privacy_words({"dp": True, "dp-epsilon": float("inf")}).startswith("dp ε = ∞ (clipping, no noise)")
