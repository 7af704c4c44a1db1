"""fedrapp-sim: run the app with flwr run in Flower's simulation engine, safely, in one command.

Plain `flwr run . --stream` works too (see the README), but Flower's defaults get in the way of a
one-command experiment: the auto-started SuperLink installs the app's dependencies with uv for every
run (which would download a CUDA torch), keeps running afterwards, runs apps in its own working
directory (where another app's client_app.py can shadow ours), and flwr run exits 0 when the run
failed. This launcher:

1. validates the run config (the app's defaults + your -c overrides) and checks the model, the data and
   the run folder, before anything starts (seconds, one message; --check stops there);
2. contains Flower's files (FLWR_HOME, RAY_TMPDIR, UV_CACHE_DIR), turns off telemetry, the update check and
   runtime dependency installation;
3. starts its own simulation SuperLink on a free port, from a neutral directory, and adds a connection to it,
   ``[superlink.fedrapp-sim-<port>]``, to ``$FLWR_HOME/config.toml`` (taken out again when it exits);
4. runs flwr run <app> <connection> --stream with one SuperNode per client;
5. reads the run's final status and summary, prints them, and exits non-zero when the run failed, left
   samples unscored or its server rule failed in some round;
6. stops every process the run started (the SuperLink, the simulation, Ray) when the run ends, fails, or on
   Ctrl-C / SIGTERM, and then prints the command that resumes the run.

Exit status: 0 done, 1 the run failed or is incomplete, 2 bad config or input, 3 the run finished with every sample
scored but its server rule failed in some rounds (those rounds sent every client again what it was sent), 130
interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedrapp_app.config import KEY_BY_NAME, ConfigError, RunConfig, override_hint
from fedrapp_app.config.deployment import EXPECTED_NODES_ENV
from fedrapp_app.config.privacy import privacy_words
from fedrapp_app.federation.errors import strip_ansi
from fedrapp_app.recording.phases import Clock, launch_phases, phase_line, server_marks, write_launch
from fedrapp_app.recording.results import clear_results, held_results
from fedrapp_app.recording.runlock import LAUNCHER_PID_ENV, RunFolderBusy, check_free, check_not_taken, check_writable
from fedrapp_app.running.console import resilient_output
from fedrapp_app.running.processes import LAUNCH_ID_ENV, descendants, describe_process, marked_pids, stop_marked
from fedrapp_app.running.stage import stage_app

if TYPE_CHECKING:  # the checks import data code when they run, not when the launcher starts
    from fedrapp_app.running.preflight import Findings

#: Prefix of the connection each launch adds to ``$FLWR_HOME/config.toml`` (``fedrapp-sim-<port>``: two launches
#: sharing a Flower home never use each other's SuperLink), removed again when the launch ends.
CONNECTION = "fedrapp-sim"
#: SuperNodes of the default experiment when num-clients = 0 (one client per SuperNode).
DEFAULT_SUPERNODES = 8
#: Lines of Flower's and Ray's output that do not apply to a fedrapp-sim run or tell the user nothing they can act
#: on, each with the pattern of the lines right after it that belong to it (None: none do). fedrapp-sim sets the
#: federation size itself and gives every client its resources; Ray's tip about accelerator variables (its
#: variable would stop Ray hiding the GPUs from clients given none, which the device rules rely on) comes with
#: the ``warnings.warn(`` source line; abseil's mutex trace lines from Ray's C++ core are debug output.
_NOISE: tuple[tuple[re.Pattern[str], re.Pattern[str] | None], ...] = (
    (re.compile(r"default simulated SuperNodes changed from"), None),
    (re.compile(r"To change federation size, use the following command"), re.compile(r"flwr federation ")),
    (re.compile(r"FutureWarning: Tip: "), re.compile(r"^\s*warnings\.warn\(")),
    (re.compile(r"\[mutex\.cc : \d+\] RAW: Lock blocking"), None),
)


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the launcher."""


#: The ports :func:`free_port` has handed out in this process.
_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 that this process has not handed out before. The probing socket is closed on
    return, so the OS may offer the same port to the next probe: two SuperNodes given two calls' ports once got the
    same one, and the second could not bind it (seen in CI)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


_PAIR = re.compile(r"""\s*([^\s=]+)=("[^"]*"|'[^']*'|[^\s'"]+)\s*""")


def parse_pairs(text: str) -> dict[str, Any]:
    """``k=v k2=v2`` as flwr's ``-c`` reads it (TOML values), but a bare word for a string key is taken as that
    string (``strategy=fedavg`` means ``strategy='fedavg'``); anything else unreadable is a ``ConfigError``."""
    values: dict[str, Any] = {}
    position = 0
    while position < len(text.rstrip()):
        found = _PAIR.match(text, position)
        if found is None:
            rest = text[position:].split()[0]
            raise ConfigError(
                f'cannot read -c "{text}": {rest!r} is not key=value (e.g. -c "seed=1 strategy=\'fedavg\'")'
            )
        key, raw = found.groups()
        position = found.end()
        if key in values:
            raise ConfigError(
                f'cannot read -c "{text}": {key!r} is given twice (fix: give it once; later -c options override '
                "earlier ones)"
            )
        try:
            values[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            spec = KEY_BY_NAME.get(key)
            if spec is None or not isinstance(spec.default, str):
                raise ConfigError(
                    f'cannot read -c "{text}": {raw!r} is not a value for {key!r} (numbers, true/false, or a '
                    f"quoted string: {override_hint(key) if spec else repr(key)})"
                ) from None
            values[key] = raw
    return values


def app_overrides(app_dir: Path, overrides: list[str]) -> dict:
    """The app's ``[tool.flwr.app.config]`` defaults merged with ``-c`` overrides (file or ``k=v`` strings).

    A key of an override file that the app does not know is refused here, naming the file.
    """
    project = tomllib.loads((app_dir / "pyproject.toml").read_text())
    values = dict(project["tool"]["flwr"]["app"]["config"])
    for override in overrides:
        if override.endswith(".toml"):
            path = Path(override).expanduser()
            if not path.is_absolute():
                path = Path.cwd() / path
            try:
                loaded = tomllib.loads(path.read_text())
            except OSError as err:
                raise ConfigError(f"cannot read the override file {path}: {err}") from err
            except tomllib.TOMLDecodeError as err:
                raise ConfigError(
                    f"cannot read the override file {path}: {err} (fix: TOML, one key = value per line, strings in "
                    "quotes: seed = 1, strategy = 'fedavg'; as pyproject-run.toml)"
                ) from err
            nested = loaded.get("tool", {}).get("flwr", {}).get("app", {}).get("config")
            if isinstance(nested, dict) and set(loaded) == {"tool"}:
                raise ConfigError(
                    f"{path} holds a [tool.flwr.app.config] table: an override file has its keys at the top level "
                    "(fix: remove the table header, as in pyproject-run.toml)"
                )
            unknown = sorted(set(loaded) - set(KEY_BY_NAME))
            if unknown:
                import difflib

                hints = [
                    f"{k!r}"
                    + (
                        f" (did you mean {close[0]!r}?)"
                        if (close := difflib.get_close_matches(k, KEY_BY_NAME, 1))
                        else ""
                    )
                    for k in unknown
                ]
                raise ConfigError(f"{path}: unknown key(s) {', '.join(hints)}; see the README's configuration table")
            values.update(loaded)
        else:
            values.update(parse_pairs(override))
    return values


def toml_value(value: object) -> str:
    """A run-config value as one TOML token that flwr's ``k=v`` parser reads back unchanged."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if "'" in text and '"' in text:
        raise ConfigError(f"value {text!r} holds both quote characters; flwr's -c parser cannot pass it")
    return f"'{text}'" if '"' in text else json.dumps(text)


def contained_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower's processes: files under ``flwr_home``, no telemetry, no runtime installs."""
    env = dict(os.environ)
    env.setdefault("FLWR_HOME", str(flwr_home))
    env.setdefault("RAY_TMPDIR", str(Path(tempfile.gettempdir()) / f"fedrapp-ray-{os.getuid()}"))
    env.setdefault("UV_CACHE_DIR", str(Path(env["FLWR_HOME"]) / "uv-cache"))
    env.update(
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        RAY_DEDUP_LOGS="0",
    )
    return env


def flwr_home(option: str | None, app_dir: Path, environ: dict[str, str] | None = None) -> Path:
    """Flower's home for a launch: ``--flwr-home``, else an existing ``FLWR_HOME``, else ``<app>/.flwr-home``."""
    environ = os.environ if environ is None else environ
    return Path(option or environ.get("FLWR_HOME") or app_dir / ".flwr-home").expanduser().resolve()


def _table_header(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\s*\[\s*superlink\s*\.\s*(?:{re.escape(name)}|\"{re.escape(name)}\")\s*\]\s*(?:#.*)?$")


_CONNECTION_KEY = re.compile(r"^\s*(?:address|insecure)\s*=.*$")


def without_connection(text: str, name: str) -> str:
    """``text`` (a ``config.toml``) without the table ``[superlink.<name>]`` that :func:`add_connection` wrote: its
    header and its ``address``/``insecure`` lines, and the blank line put before it; every other line stays."""
    header = _table_header(name)
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if not header.match(lines[i].rstrip("\r\n")):
            kept.append(lines[i])
            i += 1
            continue
        i += 1
        while i < len(lines) and _CONNECTION_KEY.match(lines[i].rstrip("\r\n")):
            i += 1
        if kept and not kept[-1].strip() and (i == len(lines) or not lines[i].strip()):
            kept.pop()  # the blank line before the table, where nothing but a blank line or the end follows it
    return "".join(kept)


def add_connection(env: dict[str, str], name: str, address: str) -> Path:
    """Append an insecure connection ``[superlink.<name>]`` -> ``address`` to ``$FLWR_HOME/config.toml`` as text (the
    user's own entries and comments stay as they are; a file that does not exist is created with Flower's
    defaults first). Returns the file, for :func:`remove_connection`."""
    path = Path(env["FLWR_HOME"]) / "config.toml"
    if not path.is_file():
        code = "from flwr.cli.flower_config import init_flwr_config\ninit_flwr_config()\n"
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    text = without_connection(path.read_text(), name)  # a table of that name left by a launch that was killed
    if text and not text.endswith("\n"):
        text += "\n"
    path.write_text(text + f'\n[superlink.{name}]\naddress = "{address}"\ninsecure = true\n')
    return path


def remove_connection(path: Path, name: str) -> None:
    """Take the connection :func:`add_connection` wrote out of ``path`` again, and nothing else (Flower may have
    rewritten the file meanwhile: the table is found by its header, wherever it is)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    remaining = without_connection(text, name)
    if remaining != text:
        path.write_text(remaining)


def write_connection(env: dict[str, str], name: str, address: str) -> None:
    """Add an insecure connection ``name`` -> ``address`` to ``$FLWR_HOME/config.toml``."""
    code = (
        "from flwr.cli.flower_config import init_flwr_config, read_flower_config, write_flower_config\n"
        "init_flwr_config()\n"
        "cfg, _ = read_flower_config()\n"
        f"cfg.setdefault('superlink', {{}})[{name!r}] = {{'address': {address!r}, 'insecure': True}}\n"
        "write_flower_config(cfg)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)


def wait_healthy(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the SuperLink exited at start (code {process.returncode}); see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the SuperLink did not answer on port {port} within {timeout:.0f}s")


def start_ray_head(env: dict[str, str], cwd: Path, log: Path, temp_dir: Path) -> tuple[subprocess.Popen, str]:
    """Start the run's own local Ray (``ray start --head --block`` on 127.0.0.1, a free port) and return it with
    its address, for ``RAY_ADDRESS``: Flower's Ray backend then joins it (``ray.init()`` waits for it to come up)
    instead of starting Ray itself once the simulation runs, so Ray's start overlaps the SuperLink's start and
    flwr run's packing. Its processes carry the launch's mark and are stopped with the run's.

    ``temp_dir`` is the cluster's own (short: Ray's socket paths live under it): ``ray start`` notes its
    cluster in ``<temp dir>/ray_current_cluster``, where any later plain ``ray.init()`` sharing the folder
    would try to join it, and hang once it is gone. The caller removes the folder after the stop."""
    port = free_port()
    command = ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}"]
    command += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    with log.open("w") as out:
        head = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return head, f"127.0.0.1:{port}"


def ray_failure(head: subprocess.Popen, log: Path) -> str:
    """One message for a run's Ray that exited: its exit status and the last lines of its log."""
    try:
        tail = " | ".join(line.strip() for line in log.read_text(errors="replace").splitlines()[-3:] if line.strip())
    except OSError:
        tail = ""
    return f"the run's Ray stopped (exit status {head.returncode}); its log {log} ends: {tail or '(empty)'}"


def _watch_ray(head: subprocess.Popen, log: Path, runner: subprocess.Popen, run_over: threading.Event) -> None:
    """Stop flwr run when the run's Ray exits before the run is over (its clients would never answer)."""
    head.wait()
    if run_over.is_set():
        return
    print(f"fedrapp-sim: {ray_failure(head, log)}; stopping the run", file=sys.stderr, flush=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(runner.pid, signal.SIGTERM)


def stop_process_group(process: subprocess.Popen) -> None:
    """Stop a process started with ``start_new_session=True`` and its process group, by its PID."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_status(env: dict[str, str], cwd: Path, connection: str = CONNECTION, run_id: int | None = None) -> dict:
    """Run ``run_id`` (default: the newest run) of the SuperLink behind ``connection``, as ``flwr list --format
    json`` reports it."""
    command = ["flwr", "list", connection, "--format", "json"]
    if run_id is not None:
        command += ["--run-id", str(run_id)]
    out = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    try:
        runs = json.loads(out.stdout)["runs"]
    except (json.JSONDecodeError, KeyError) as err:
        raise RuntimeError(f"could not read the run status: {out.stdout[-500:]} {out.stderr[-500:]}") from err
    if not runs:
        raise RuntimeError("the SuperLink holds no run: flwr run did not submit it (see the output above)")
    # Flower lists the newest first (by pending time, in whole seconds); on a tie its order decides.
    return max(enumerate(runs), key=lambda item: (str(item[1].get("pending-at", "")), -item[0]))[1]


def quiet(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` without the ones of :data:`_NOISE` (each with the lines right after it that belong to it)."""
    follows: re.Pattern[str] | None = None
    for line in lines:
        plain = strip_ansi(line)
        if follows is not None and follows.search(plain):
            continue
        follows = None
        noise = next(((after,) for pattern, after in _NOISE if pattern.search(plain)), None)
        if noise is not None:
            follows = noise[0]
            continue
        yield line


#: flwr run's line once the SuperLink accepted the run (the end of the ``submit`` phase).
_SUBMITTED = re.compile(r"Successfully started run")


def _stream(process: subprocess.Popen, colour: bool, clock: Clock | None = None) -> None:
    """Copy the run's output to ours, line by line, without the notes of :data:`_NOISE`; mark ``submit`` on
    ``clock`` when flwr run says the run started."""
    assert process.stdout is not None
    for line in quiet(process.stdout):
        if clock is not None and _SUBMITTED.search(line) and not any(n == "submit" for n, _ in clock.marks):
            clock.mark("submit")
        sys.stdout.write(line if colour else strip_ansi(line))
        sys.stdout.flush()


def _shell_word(text: str) -> str:
    """``text`` quoted for a POSIX shell, in double quotes when that needs no escapes (easier to read)."""
    if re.fullmatch(r"[\w@%+=:,./-]+", text):
        return text
    return f'"{text}"' if not re.search(r'["$`\\!]', text) else shlex.quote(text)


def _toml_string(text: str) -> str:
    """A TOML string, single-quoted when it can be (so that it sits inside a double-quoted shell word)."""
    return f"'{text}'" if "'" not in text else json.dumps(text)


def resume_command(args: argparse.Namespace, run_dir: Path) -> str:
    """The command that continues the run in ``run_dir``: the same overrides plus resume, name and folder."""
    parts = ["fedrapp-sim", _shell_word(args.app)]
    for override in args.run_config:
        parts += ["-c", _shell_word(override)]
    if args.supernodes:
        parts += ["--supernodes", str(args.supernodes)]
    for flag in ("gpus_per_client", "ray_address"):
        if getattr(args, flag, None):
            parts += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    extra = f"resume=true run-name={_toml_string(run_dir.name)} output-dir={_toml_string(str(run_dir.parent))}"
    return " ".join([*parts, "-c", _shell_word(extra)])


def _on_signal(signum: int, _frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def seed_list(text: str) -> list[int]:
    """``--seeds``: '0,1,2', '0-4' or a mix ('0-2,7'), each a seed >= 0, none twice."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            if high and int(high) < int(low):
                raise argparse.ArgumentTypeError(
                    f"{text!r}: {part.strip()} is a reversed range (fix: {high.strip()}-{low.strip()}, low to high)"
                )
            seeds += list(range(int(low), int(high) + 1)) if high else [int(low)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seeds like 0,1,2 or a range 0-4") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: seeds must be >= 0, each once")
    return seeds


def _at_least_one(text: str) -> int:
    """``--supernodes``: an integer of at least 1 (omit the option for one SuperNode per client)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} SuperNodes: at least 1 (or leave --supernodes out: one per client)")
    return value


def _parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="fedrapp-sim",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n")[-1],
        allow_abbrev=False,  # --supernode 3 is a typo, not --supernodes
    )
    parser.add_argument(
        "app",
        nargs="?",
        default=None,
        help="the FedRAPP app folder (its pyproject.toml holds [tool.flwr.app]); default: here if it is one, else "
        "the folder this FedRAPP was installed from (pip install -e)",
    )
    parser.add_argument(
        "-c",
        "--run-config",
        action="append",
        default=[],
        help="override: 'k=v k2=v2' or a .toml file (repeatable; later wins), as for flwr run",
    )
    parser.add_argument(
        "--supernodes",
        type=_at_least_one,
        default=0,
        help=f"simulated SuperNodes, one client each (default: num-clients, or {DEFAULT_SUPERNODES} when it is 0)",
    )
    parser.add_argument("--cpus-per-client", type=int, default=1, help="CPU cores per simulated client")
    parser.add_argument(
        "--gpus-per-client",
        type=float,
        default=None,
        help="GPU share per simulated client, e.g. 0.25 puts four clients on one GPU (default: 1 on a host with "
        "GPUs when device is 'auto' or 'cuda', else 0)",
    )
    parser.add_argument(
        "--ray-address",
        default="",
        metavar="HOST:PORT",
        help="run the simulation on an existing Ray cluster (its head's address, as 'ray start --head' prints it; "
        "every Ray node needs this package installed at the same paths). Default: a local Ray, stopped with the run",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the config (the app's defaults + -c), the run folder, the model and the data, then exit without "
        "starting anything (0: all fine; 2: the message says what to fix); also names the key behind plain flwr run's "
        "'[code: 15] Invalid run configuration.'",
    )
    parser.add_argument(
        "--seeds",
        type=seed_list,
        default=None,
        metavar="0,1,2",
        help="run the experiment once per seed ('0,1,2' or a range '0-4'), one after the other, each in "
        "<run-name>-seed<s>, then write one report with the mean and 95%% interval over the seeds; Ctrl-C stops it, "
        "and the printed command resumes it (finished seeds are skipped)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="which rule on this setting (-c): none-fed, FedAvg, FedRAPP and its trust option (and -c's own strategy "
        "when it is another), over --seeds (default 0,1,2), each run in this process; writes one page and one figure "
        "with each rule's gain over none-fed, paired by seed, and its 95%% interval; the same command resumes it",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results a run folder holds (a finished run, or a stopped one waiting for its resume) with "
        "this run; without it such a folder is refused before anything starts. The old run's files are removed "
        "just before the start, once every check has passed",
    )
    parser.add_argument(
        "--flwr-home",
        default=None,
        help="Flower's home (config.toml, the SuperLink's log, installed apps). Default: $FLWR_HOME when that is set, "
        "else <app>/.flwr-home",
    )
    return parser


def gpu_share(device: str, args: argparse.Namespace) -> tuple[float, str | None]:
    """Each simulated client's GPU share (``--gpus-per-client`` or the rule for this host) and a note; a
    ``ConfigError`` for a combination that would fail in every client (``engine.devices.launcher_gpu_share``)."""
    from fedrapp_app.engine.devices import host_gpu_count, launcher_gpu_share, parse_device

    if args.ray_address:  # the GPUs are the cluster's, not this host's: Ray places the shares asked for
        share = float(args.gpus_per_client or 0.0)
        if parse_device(device)[0] == "cuda" and share == 0:
            raise ConfigError(
                f"device={device!r} on a Ray cluster: give each client a GPU share with --gpus-per-client "
                "(1, or 0.25 to put four clients on a GPU); without one Ray hides the GPUs from the clients"
            )
        return share, None
    try:
        return launcher_gpu_share(device, host_gpu_count(), args.gpus_per_client)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """``ConfigError`` unless ``address`` (``HOST:PORT`` of a Ray head's GCS) accepts a TCP connection."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray-address {address!r}: expected HOST:PORT of the Ray head, e.g. 10.0.0.1:6379")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as err:
        raise ConfigError(
            f"--ray-address {address}: the Ray head does not answer ({type(err).__name__}: {err}). Start it with "
            f"`ray start --head --port={port}` on {host} (and `ray start --address={address}` on the other nodes), "
            "or drop --ray-address to run a local Ray"
        ) from None


def prepare(args: argparse.Namespace, app_dir: Path) -> tuple[dict, RunConfig, Path, Findings | None]:
    """Validate everything knowable before a start: the config, the folder, the model and the data.

    Returns (merged overrides, config with num-clients resolved, run folder, what the model and data checks found:
    None for a finished run's resume, which checks nothing more). Raises ``ConfigError``,
    ``PreflightError``, ``RunFolderBusy`` or ``FileNotFoundError`` with a message for the user.
    """
    from fedrapp_app.federation.server import finished_already, run_dir_of
    from fedrapp_app.recording.checkpoint import SERVER_FILE
    from fedrapp_app.running.preflight import preflight

    values = app_overrides(app_dir, args.run_config)
    config = RunConfig.from_run_config(values)
    if args.ray_address:
        check_ray_address(args.ray_address)
    args.gpu_share, note = gpu_share(str(config["device"]), args)
    if note:
        print(f"fedrapp-sim: {note}", flush=True)
    supernodes = args.supernodes or config.num_clients or DEFAULT_SUPERNODES
    if config.num_clients and config.num_clients != supernodes:
        raise ConfigError(
            f"num-clients = {config.num_clients} but --supernodes {supernodes}: one client runs on each SuperNode; "
            "drop one of them"
        )
    resolved = config.with_num_clients(supernodes)
    # Results go where the user is, not where the SuperLink runs; the name is fixed here so we can read it.
    run_dir = run_dir_of(config)
    if config["resume"] and not (run_dir / SERVER_FILE).is_file():
        raise FileNotFoundError(
            f"resume = true but {run_dir / SERVER_FILE} does not exist: give the run-name (and output-dir) of "
            "the run to continue, or drop resume to start a new run"
        )
    check_writable(run_dir, str(config["output-dir"]))
    check_free(run_dir)
    if getattr(args, "overwrite", False):
        if config["resume"]:
            raise ConfigError("--overwrite and resume = true contradict each other: a resume continues the run's files")
    elif not config["resume"]:
        check_not_taken(run_dir)  # a finished or stopped run is never replaced without --overwrite
    if config["resume"] and finished_already(run_dir, config) is not None:
        return values, resolved, run_dir, None
    return values, resolved, run_dir, preflight(resolved)


def is_app_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a Flower app: a pyproject.toml with a ``[tool.flwr.app.config]`` table."""
    try:
        project = tomllib.loads((folder / "pyproject.toml").read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return isinstance(project.get("tool", {}).get("flwr", {}).get("app", {}).get("config"), dict)


def installed_app_folder() -> Path | None:
    """The FedRAPP app folder this code was installed from (``pip install -e``, a checkout), or None (a wheel)."""
    folder = Path(__file__).resolve().parents[2]
    return folder if is_app_folder(folder) else None


def app_folder(given: str | None, cwd: Path | None = None) -> Path:
    """The app folder to run: ``given``, or without it the working directory when it is an app folder (the
    project's own), else the one this FedRAPP was installed from (a plugin's folder, anywhere else). A
    ``ConfigError`` says what to pass instead."""
    installed = installed_app_folder()
    fix = (
        f"pass FedRAPP's own folder, e.g. fedrapp-sim {installed}" if installed
        else "pass the folder of a FedRAPP checkout (git clone, then pip install -e . there)"
    )  # fmt: skip
    if given is not None:
        folder = Path(given).expanduser().resolve()
        if not is_app_folder(folder):
            what = "holds no pyproject.toml" if not (folder / "pyproject.toml").is_file() else (
                "is not a FedRAPP app folder (its pyproject.toml has no [tool.flwr.app.config] table)")  # fmt: skip
            raise ConfigError(f"{folder} {what}: {fix}")
        return folder
    here = (cwd or Path.cwd()).resolve()
    if is_app_folder(here):
        return here
    if installed is None:
        raise ConfigError(f"{here} is not a FedRAPP app folder and this FedRAPP was not installed from one: {fix}")
    return installed


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        app_dir = app_folder(args.app)
    except ConfigError as err:
        parser.error(str(err))
    if args.app is None:  # as the resume command will name it
        args.app = "." if app_dir == Path.cwd().resolve() else str(app_dir)
        if args.app != ".":
            print(f"fedrapp-sim: the app folder: {app_dir} (FedRAPP's own; the working directory is none)", flush=True)
    with resilient_output():  # `fedrapp-sim | tee log` and Ctrl-C: the stop, its files and 130 all the same
        if args.compare:
            return compare_rules(args, app_dir)
        if args.seeds:
            return run_seeds(args, app_dir)
        return run_one(args, app_dir)


def compare_rules(args: argparse.Namespace, app_dir: Path) -> int:
    """``--compare``: the rules on this setting (``running.compare``), ``num-clients`` resolved as a run would; the
    page calls only what ``-c`` changed the user's setting."""
    from fedrapp_app.bench.compare import DEFAULT_SEEDS, user_keys
    from fedrapp_app.running.compare import run_compare

    cluster = [flag for flag, on in (("--ray-address", args.ray_address), ("--overwrite", args.overwrite)) if on]
    if cluster:
        print(
            f"fedrapp-sim: {cluster[0]} does not go with --compare, whose runs go in this process and resume what "
            "they find (a grid on a Ray cluster: python -m fedrapp_app.bench <bench.yaml> --ray-address HOST:PORT)",
            file=sys.stderr,
        )
        return 2
    try:
        values = app_overrides(app_dir, args.run_config)
        config = RunConfig.from_run_config(values)
        if args.supernodes and config.num_clients and config.num_clients != args.supernodes:
            raise ConfigError(f"num-clients = {config.num_clients} but --supernodes {args.supernodes}: drop one")
    except ConfigError as err:
        print(f"fedrapp-sim: {err}", file=sys.stderr)
        return 2
    clients = config.num_clients or args.supernodes or DEFAULT_SUPERNODES
    setting = {**values, "num-clients": clients}
    return run_compare(setting, args.seeds or DEFAULT_SEEDS, check=args.check, given=user_keys(values))


def run_seeds(args: argparse.Namespace, app_dir: Path) -> int:
    """``--seeds``: the run once per seed, in ``<run-name>-seed<s>`` (a resume continues the seed it stopped in and
    skips the finished ones), then the seeds' report; stops at the first seed that fails or is interrupted."""
    from fedrapp_app.recording.checkpoint import SERVER_FILE

    try:
        values = app_overrides(app_dir, args.run_config)
        base = RunConfig.from_run_config({k: v for k, v in values.items() if k != "seed"})
    except ConfigError as err:
        print(f"fedrapp-sim: {err}", file=sys.stderr)
        return 2
    name = str(base["run-name"]) or base.run_name().replace(f"-seed{base['seed']}", "") + time.strftime(
        "-seeds-%Y%m%d-%H%M%S"
    )
    out_dir = Path(str(base["output-dir"])).expanduser().resolve()
    resume = bool(base["resume"])
    run_dirs = []
    for seed in args.seeds:
        run_dir = out_dir / f"{name}-seed{seed}"
        run_dirs.append(run_dir)
        again = resume and (run_dir / SERVER_FILE).is_file()
        extra = f"seed={seed} run-name={_toml_string(run_dir.name)} resume={'true' if again else 'false'}"
        one = argparse.Namespace(**{**vars(args), "seeds": None, "run_config": [*args.run_config, extra]})
        print(f"fedrapp-sim: seed {seed} ({len(run_dirs)} of {len(args.seeds)}) -> {run_dir}", flush=True)
        code = run_one(one, app_dir, Clock() if len(run_dirs) == 1 else Clock(time.time()))  # each seed's wait
        if code == 130:
            seeds = ",".join(map(str, args.seeds))
            resume_args = [*args.run_config, f"run-name={_toml_string(name)} resume=true"]
            parts = [
                "fedrapp-sim",
                _shell_word(args.app),
                "--seeds",
                seeds,
                *(w for o in resume_args for w in ("-c", _shell_word(o))),
            ]
            print(
                f"fedrapp-sim: the seeds stopped at seed {seed}; continue them with:\n  {' '.join(parts)}",
                file=sys.stderr,
            )
            return code
        if code != 0:
            print(f"fedrapp-sim: seed {seed} ended with status {code}: the seeds stop here", file=sys.stderr)
            return code
    if args.check:  # nothing ran: no report to write
        print(f"fedrapp-sim: the {len(run_dirs)} seeds' report would go to {out_dir / f'{name}-seeds'}")
        return 0
    from fedrapp_app.report.seeds import write_seeds_report

    page = write_seeds_report(run_dirs, out_dir / f"{name}-seeds")
    print(f"fedrapp-sim: {len(run_dirs)} seeds; mean and 95% interval over them in {page}")
    return 0


def run_one(args: argparse.Namespace, app_dir: Path, clock: Clock | None = None) -> int:
    """One run: the pre-start checks, then the launch (or, with --check, nothing). ``clock``: the phases' clock
    (default: from this process's start; ``--seeds`` gives each seed its own)."""
    from fedrapp_app.federation.server import finished_already
    from fedrapp_app.running.preflight import PreflightError

    clock = clock or Clock()
    try:
        values, config, run_dir, findings = prepare(args, app_dir)
    except (ConfigError, PreflightError, RunFolderBusy, FileNotFoundError, OSError) as err:
        print(f"fedrapp-sim: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nfedrapp-sim: interrupted before the start; nothing ran", file=sys.stderr)
        return 130
    replaced = held_results(run_dir) if args.overwrite and not config["resume"] else None
    if findings is not None:
        for line in findings.lines() if args.check else ():
            print(f"fedrapp-sim: {line}")
        for warning in findings.warnings():  # a run would start: say what looks wrong before it does
            print(f"fedrapp-sim: warning: {warning}", file=sys.stderr, flush=True)
    if args.check:
        print(
            f"fedrapp-sim: the config, the run folder, the model and the data are fine for {config.num_clients} "
            f"clients; results would go to {run_dir}"
            + (f", replacing {replaced}" if replaced else "")
            + " (--check: nothing started)"
        )
        return 0
    if replaced:
        clear_results(run_dir)
        print(f"fedrapp-sim: --overwrite: removed {replaced} from {run_dir}", flush=True)
    if config["resume"]:
        done = finished_already(run_dir, config)
        if done is not None:
            print(
                f"fedrapp-sim: run {run_dir} already finished ({done.get('stopped')}, {done.get('rounds')} rounds): "
                "nothing to resume. Raise num-rounds to run more rounds, or choose a new run-name."
            )
            return 0
    clock.mark("checks")
    return launch(args, app_dir, values, config, run_dir, clock)


def launch(
    args: argparse.Namespace, app_dir: Path, values: dict, config: RunConfig, run_dir: Path, clock: Clock
) -> int:
    """Start the SuperLink, run the app, report; stop every process of the run whatever happens."""
    launch_id = uuid.uuid4().hex
    home = flwr_home(args.flwr_home, app_dir)
    env = contained_env(home)
    env["FLWR_HOME"] = str(home)  # contained_env keeps an existing FLWR_HOME; --flwr-home wins over it
    env["UV_CACHE_DIR"] = os.environ.get("UV_CACHE_DIR") or str(home / "uv-cache")
    env.update({LAUNCH_ID_ENV: launch_id, LAUNCHER_PID_ENV: str(os.getpid())})
    env[EXPECTED_NODES_ENV] = str(config.num_clients)  # the ServerApp need not wait for more SuperNodes
    if args.ray_address:  # Flower's Ray backend calls ray.init(), which joins the cluster named here
        env["RAY_ADDRESS"] = args.ray_address
    else:
        env.pop("RAY_ADDRESS", None)
    Path(env["FLWR_HOME"]).mkdir(parents=True, exist_ok=True)
    port = free_port()
    connection = f"{CONNECTION}-{port}"
    added: Path | None = None
    reporter: Reporter | None = None
    neutral = Path(tempfile.mkdtemp(prefix="fedrapp-superlink-"))
    log_path = Path(env["FLWR_HOME"]) / "superlink.log"
    forced = {"output-dir": str(run_dir.parent), "run-name": run_dir.name}
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    status: dict = {}
    ray_head: subprocess.Popen | None = None
    # This run's Ray alone, under RAY_TMPDIR (short, as Ray's socket paths under it must be: not TMPDIR).
    ray_temp = Path(env["RAY_TMPDIR"]) / f"run-{launch_id[:8]}"
    ray_log = Path(env["FLWR_HOME"]) / "ray-head.log"
    run_over = threading.Event()  # set once flwr run has returned: Ray may stop from then on
    ray_stop: threading.Thread | None = None
    try:
        if not args.ray_address:  # Ray starts while the SuperLink starts and flwr run packs the app (seconds)
            ray_head, env["RAY_ADDRESS"] = start_ray_head(env, neutral, ray_log, ray_temp)
        superlink = subprocess.Popen(
            ["flower-superlink", "--insecure", "--simulation", "--disable-runtime-dependency-installation"]
            + ["--host", "127.0.0.1", "--port", str(port), "--log-file", str(log_path)],
            cwd=neutral,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        staged = stage_app(app_dir, neutral / "app")  # while the SuperLink starts: what flwr run packs, no more
        wait_healthy(port, superlink)
        clock.mark("superlink")
        added = add_connection(env, connection, f"127.0.0.1:{port}")
        federation = (
            f"num-supernodes={config.num_clients} client-resources-num-cpus={args.cpus_per_client} "
            f"client-resources-num-gpus={args.gpu_share}"
        )
        # flwr run refuses a .toml file beside k=v pairs: pass the merged config as k=v pairs.
        merged = {**values, **forced}
        command = ["flwr", "run", str(staged), connection, "--stream", "--federation-config", federation]
        command += ["-c", " ".join(f"{k}={toml_value(v)}" for k, v in merged.items())]
        cluster = f" on the Ray cluster at {args.ray_address}" if args.ray_address else ""
        print(
            f"fedrapp-sim: {config.num_clients} clients on {config.num_clients} simulated SuperNodes{cluster}; "
            f"SuperLink pid {superlink.pid} on 127.0.0.1:{port} (log {log_path}); results in {run_dir}",
            flush=True,
        )
        if ray_head is not None and ray_head.poll() is not None:
            raise RuntimeError(ray_failure(ray_head, ray_log))
        runner = subprocess.Popen(
            command,
            cwd=neutral,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        if ray_head is not None:  # a Ray that dies under the run would leave it waiting for its clients
            threading.Thread(target=_watch_ray, args=(ray_head, ray_log, runner, run_over), daemon=True).start()
        _stream(runner, colour=sys.stdout.isatty(), clock=clock)
        runner.wait()
        run_over.set()
        clock.mark("teardown")
        if ray_head is not None:
            # The simulation is over: Ray stops (seconds, on its own SIGTERM handling) while the status is read.
            ray_stop = threading.Thread(target=stop_process_group, args=(ray_head,), daemon=True)
            ray_stop.start()
        reporter = Reporter(run_dir, clock)  # writes the report while the status is read and the processes stop
        status = run_status(env, neutral, connection)
        clock.mark("status")
    except (Interrupted, KeyboardInterrupt) as err:
        run_over.set()  # Ray is stopped on purpose from here on
        why = str(err) or "SIGINT"
        print(f"\nfedrapp-sim: {why}: stopping the run and every process it started ...", file=sys.stderr, flush=True)
        # Flower first, the run's Ray after (in the finally below): a ServerApp that saw its Ray workers die
        # would record the round it was in with those clients missing, and a resume would differ from a whole run.
        ray_tree = descendants(ray_head.pid) if ray_head is not None and ray_head.poll() is None else set()
        _stop_everything(launch_id, neutral, spare=ray_tree)
        message = _interrupted_message(args, run_dir)
        from fedrapp_app.federation.server import mark_interrupted

        try:  # the folder says so too; the run's checkpoint is safe either way
            mark_interrupted(run_dir, f"stopped by {why}; {message.split(': ', 1)[-1]}")
        except Exception as err:  # noqa: BLE001 - the resume command below matters more than this note
            print(f"fedrapp-sim: could not note the stop in {run_dir / 'summary.json'}: {err}", file=sys.stderr)
        print(f"fedrapp-sim: {message}", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.SubprocessError, OSError) as err:
        print(f"fedrapp-sim: {err}", file=sys.stderr)
        if reporter is not None:
            reporter.finish()
        return 1
    finally:
        if added is not None:  # the SuperLink is gone after this launch: so is its connection
            try:
                remove_connection(added, connection)
            except OSError as err:
                print(f"fedrapp-sim: could not remove [superlink.{connection}] from {added}: {err}", file=sys.stderr)
        run_over.set()
        if ray_stop is not None:
            ray_stop.join(timeout=30)
        # Ray stopped on its own already (or ran elsewhere): no agent of it can start again while we stop the rest.
        ray_gone = ray_head is None or ray_head.poll() is not None
        _stop_everything(launch_id, neutral, settle=0.5 if ray_gone else 2.0)
        shutil.rmtree(ray_temp, ignore_errors=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
    clock.mark("stop")
    return report(status, run_dir, log_path, clock, reporter)


def _stop_everything(launch_id: str, neutral: Path, settle: float = 2.0, spare: Collection[int] = ()) -> None:
    """Every process of this launch (``processes.stop_marked``: its mark, or its working directory in the
    launcher's scratch folder ``neutral``; ``settle``: how long no new one may show up) but ``spare``, then that
    folder."""
    try:
        stop_marked(launch_id, cwd=neutral, settle=settle, spare=spare)
        left = marked_pids(launch_id, cwd=neutral, spare=spare)
        if left:  # SIGKILL cannot take a process stuck in the kernel (state D): say which, so none goes unseen
            lines = "".join(f"\n  {describe_process(pid)}" for pid in left)
            print(f"fedrapp-sim: {len(left)} process(es) of the run outlived SIGKILL:{lines}", file=sys.stderr)
    except (Interrupted, KeyboardInterrupt):
        pass  # a second Ctrl-C cuts this stop short; launch() stops once more in its finally
    except Exception as err:  # noqa: BLE001 - the resume command and the report matter more; say how to finish
        print(
            f"fedrapp-sim: could not stop the run's processes ({type(err).__name__}: {err}); they carry "
            f"{LAUNCH_ID_ENV}={launch_id} in their environment or work in {neutral}; list them with: "
            f"grep -l {LAUNCH_ID_ENV}={launch_id} /proc/[0-9]*/environ; ls -l /proc/[0-9]*/cwd | grep {neutral}",
            file=sys.stderr,
        )
    if not spare:
        shutil.rmtree(neutral, ignore_errors=True)


def _interrupted_message(args: argparse.Namespace, run_dir: Path) -> str:
    from fedrapp_app.recording.checkpoint import SERVER_FILE, ServerCheckpoint

    if not (run_dir / SERVER_FILE).is_file():
        return "stopped before the first round ended; nothing to resume: start it again"
    done = ServerCheckpoint.load(run_dir).round
    return (
        f"stopped; the run's checkpoint holds {done} round(s) in {run_dir}. Continue it with:\n"
        f"  {resume_command(args, run_dir)}"
    )


#: The exit status of a run that scored every sample but whose server rule failed in some rounds.
RULE_FAILED = 3


def report(
    status: dict, run_dir: Path, log_path: Path, clock: Clock | None = None, reporter: Reporter | None = None
) -> int:
    """Print the run's outcome from the SuperLink's status and the run folder; the exit status. ``reporter``: the
    report already being written (else it is written here); ``clock``: the phases, recorded and printed."""
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    _print_client_errors(run_dir)
    (reporter or Reporter(run_dir, clock, background=False)).finish()
    if clock is not None:
        clock.mark("report")
        print(f"fedrapp-sim: {_record_phases(run_dir, clock, summary)}")
    if status.get("status") != "finished:completed":
        details = (summary or {}).get("error") or status.get("status-details")
        print(
            f"fedrapp-sim: the run failed: {details}\n  (status {status.get('status')}; SuperLink log {log_path})",
            file=sys.stderr,
        )
        return 1
    if summary is None:
        print(f"fedrapp-sim: the run completed but wrote no {summary_path}", file=sys.stderr)
        return 1
    expected = sum(summary.get("per_client_samples", {}).values()) + sum(
        (u.get("samples") or 0) for u in summary.get("unscored", {}).values()
    )
    privacy = privacy_words(summary.get("config") or {})
    print(
        f"fedrapp-sim: {summary['rounds']} rounds, {summary['samples']} of {expected} samples scored "
        f"({summary.get('stopped')}); online accuracy micro {100 * summary['micro_accuracy']:.2f}% "
        f"macro {100 * summary['macro_accuracy']:.2f}%"
        + (f" under {privacy} per client (the report's Privacy section: ε spent)" if privacy else "")
        + f"; results in {run_dir}"
    )
    if summary.get("skipped"):
        print(
            f"fedrapp-sim: {summary['skipped']} undecodable sample(s) skipped (see 'skipped_samples' in rounds.jsonl)"
        )
    from fedrapp_app.recording.results import unmoved_warning

    warning = unmoved_warning(summary)
    if warning:
        print(f"fedrapp-sim: warning: {warning}")
    failures = summary.get("rule_failures") or {}
    if failures.get("count"):
        print(
            f"fedrapp-sim: the server rule FAILED in {failures['count']} round(s) {failures['rounds']} (the server "
            f"state stayed as it was and every client was sent again what it was sent); last: {failures['last_error']}",
            file=sys.stderr,
        )
    if summary.get("complete", True):
        return RULE_FAILED if failures.get("count") else 0
    print("fedrapp-sim: INCOMPLETE: samples were never scored:", file=sys.stderr)
    for client, info in sorted(summary.get("unscored", {}).items(), key=lambda kv: int(kv[0])):
        count = "all" if info.get("samples") is None else info["samples"]
        print(f"  client {client}: {count} unscored: {'; '.join(info.get('reasons', []))}", file=sys.stderr)
    return 1


def _record_phases(run_dir: Path, clock: Clock, summary: dict | None) -> str:
    """Write the phases so far to ``launch.json`` (when the run folder exists); their one-line account."""
    phases = launch_phases(clock.start, list(clock.marks), server_marks(summary))  # the report's thread reads too
    if run_dir.is_dir():
        try:
            write_launch(run_dir, clock.start, phases, {"launcher_pid": os.getpid()})
        except OSError as err:
            print(f"fedrapp-sim: could not write the phases to {run_dir}: {err}", file=sys.stderr)
    return phase_line(phases)


class Reporter:
    """The run's report (``fedrapp-report``), written on a thread from the moment the run ended (the launcher reads
    the run's status and stops its processes meanwhile) or at once (``background=False``); never fails the run.
    The phases so far go to ``launch.json`` first, so that the report shows them."""

    def __init__(self, run_dir: Path, clock: Clock | None, background: bool = True) -> None:
        self.run_dir, self.clock = run_dir, clock
        self.lines: list[tuple[str, bool]] = []  # (line, to stderr)
        self._thread = threading.Thread(target=self._write, name="fedrapp-report", daemon=True)
        if background:
            self._thread.start()
        else:
            self._write()

    def _write(self) -> None:
        from fedrapp_app.report import RunError, write_report

        rounds = self.run_dir / "rounds.jsonl"
        if not rounds.is_file() or not rounds.stat().st_size:
            return  # nothing ran: the failure message says why
        if self.clock is not None:
            summary_path = self.run_dir / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
            _record_phases(self.run_dir, self.clock, summary)
        try:
            self.lines.append((f"fedrapp-sim: report in {write_report([self.run_dir])}", False))
        except (RunError, OSError, ValueError) as err:
            self.lines.append((f"fedrapp-sim: no report ({err})", True))

    def finish(self) -> None:
        """Wait for the report and print what it said."""
        if self._thread.is_alive():
            self._thread.join()
        for line, error in self.lines:
            print(line, file=sys.stderr if error else sys.stdout)


def _print_client_errors(run_dir: Path) -> None:
    """Each distinct client error of the run once, with the clients and rounds it hit."""
    from fedrapp_app.recording.results import read_rows

    path = run_dir / "rounds.jsonl"
    if not path.is_file():
        return
    seen: dict[str, list[tuple[int, int]]] = {}
    for row in read_rows(path):
        if row["status"] in ("failed", "rejected", "missing") and row.get("reason"):
            seen.setdefault(f"{row['status']}: {row['reason']}", []).append((row["client"], row["round"]))
    for reason, hits in seen.items():
        clients = sorted({c for c, _ in hits})
        rounds = sorted({r for _, r in hits})
        print(
            f"fedrapp-sim: client error ({len(hits)}x, clients {clients}, rounds {rounds[0]}-{rounds[-1]}): {reason}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    sys.exit(main())
