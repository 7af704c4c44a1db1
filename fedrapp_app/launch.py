"""``fedrapp-sim``: run the app with ``flwr run`` in Flower's simulation engine, safely, in one command.

Plain ``flwr run . --stream`` works too (see the README), but Flower's defaults get in the way of a
one-command experiment: the auto-started SuperLink installs the app's dependencies with ``uv`` for every
run (which would download a CUDA torch), keeps running afterwards, runs apps in its own working
directory (where another app's ``client_app.py`` can shadow ours), and ``flwr run`` exits 0 when the run
failed. This launcher:

1. validates the run config (the app's defaults + your ``-c`` overrides) before anything starts;
2. contains Flower's files (``FLWR_HOME``, ``RAY_TMPDIR``, ``UV_CACHE_DIR``), turns off telemetry, the update
   check and runtime dependency installation;
3. starts its own simulation SuperLink on a free port, from a neutral directory;
4. runs ``flwr run <app> <connection> --stream`` with ``num-supernodes = num-clients``;
5. reads the run's final status from the SuperLink, prints the summary, and exits non-zero on failure;
6. stops the SuperLink (and its simulation processes) by PID, whatever happened.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

from fedrapp_app.config import ConfigError, RunConfig

CONNECTION = "fedrapp-sim"
#: SuperNodes of the default experiment when num-clients = 0 (one client per SuperNode).
DEFAULT_SUPERNODES = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def app_overrides(app_dir: Path, overrides: list[str]) -> dict:
    """The app's ``[tool.flwr.app.config]`` defaults merged with ``-c`` overrides (file or ``k=v`` strings)."""
    from flwr.common.config import parse_config_args

    project = tomllib.loads((app_dir / "pyproject.toml").read_text())
    values = dict(project["tool"]["flwr"]["app"]["config"])
    for override in overrides:
        if override.endswith(".toml"):
            path = Path(override).expanduser()
            if not path.is_absolute():
                path = Path.cwd() / path
            values.update(parse_config_args([str(path)]))
        else:
            values.update(parse_config_args([override]))
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


def stop_process_group(process: subprocess.Popen) -> None:
    """Stop the SuperLink's whole process group (the ServerApp, the simulation, Ray) by its PID."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_status(env: dict[str, str], cwd: Path, connection: str = CONNECTION) -> dict:
    """The latest run of the SuperLink behind ``connection``, as ``flwr list --format json`` reports it."""
    out = subprocess.run(
        ["flwr", "list", connection, "--format", "json"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    try:
        runs = json.loads(out.stdout)["runs"]
    except (json.JSONDecodeError, KeyError) as err:
        raise RuntimeError(f"could not read the run status: {out.stdout[-500:]} {out.stderr[-500:]}") from err
    if not runs:
        raise RuntimeError("the SuperLink holds no run: flwr run did not submit it (see the output above)")
    return runs[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedrapp-sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("app", nargs="?", default=".", help="the app folder (holding pyproject.toml)")
    parser.add_argument(
        "-c",
        "--run-config",
        action="append",
        default=[],
        help="override: 'k=v k2=v2' or a .toml file (repeatable), as for flwr run",
    )
    parser.add_argument("--cpus-per-client", type=int, default=1, help="CPU cores per simulated client")
    parser.add_argument(
        "--gpus-per-client",
        type=float,
        default=0.0,
        help="GPU share per simulated client, e.g. 0.25 puts four clients on one GPU",
    )
    parser.add_argument("--flwr-home", default=None, help="Flower's home (default: <app>/.flwr-home)")
    args = parser.parse_args(argv)

    app_dir = Path(args.app).expanduser().resolve()
    if not (app_dir / "pyproject.toml").is_file():
        parser.error(f"{app_dir} holds no pyproject.toml: pass the FedRAPP app folder")
    try:
        values = app_overrides(app_dir, args.run_config)
        config = RunConfig.from_run_config(values)
    except (ConfigError, ValueError, OSError) as err:
        print(f"fedrapp-sim: {err}", file=sys.stderr)
        return 2
    # Results go where the user is, not where the SuperLink runs; the name is fixed here so we can read it.
    from fedrapp_app.server import run_dir_of

    run_dir = run_dir_of(config)
    forced = {"output-dir": str(run_dir.parent), "run-name": run_dir.name}
    num_clients = config.num_clients or DEFAULT_SUPERNODES

    env = contained_env(Path(args.flwr_home or app_dir / ".flwr-home").resolve())
    Path(env["FLWR_HOME"]).mkdir(parents=True, exist_ok=True)
    port = free_port()
    neutral = Path(tempfile.mkdtemp(prefix="fedrapp-superlink-"))
    log_path = Path(env["FLWR_HOME"]) / "superlink.log"
    superlink = subprocess.Popen(
        [
            "flower-superlink",
            "--insecure",
            "--simulation",
            "--disable-runtime-dependency-installation",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-file",
            str(log_path),
        ],
        cwd=neutral,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_healthy(port, superlink)
        write_connection(env, CONNECTION, f"127.0.0.1:{port}")
        federation = (
            f"num-supernodes={num_clients} client-resources-num-cpus={args.cpus_per_client} "
            f"client-resources-num-gpus={args.gpus_per_client}"
        )
        # flwr run refuses a .toml file beside k=v pairs: pass the merged config as k=v pairs.
        merged = {**values, **forced}
        command = [
            "flwr",
            "run",
            str(app_dir),
            CONNECTION,
            "--stream",
            "--federation-config",
            federation,
            "-c",
            " ".join(f"{k}={toml_value(v)}" for k, v in merged.items()),
        ]
        print(f"fedrapp-sim: SuperLink pid {superlink.pid} on 127.0.0.1:{port} (log {log_path})", flush=True)
        subprocess.run(command, cwd=neutral, env=env, check=False)
        status = run_status(env, neutral)
    except KeyboardInterrupt:
        print("fedrapp-sim: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.SubprocessError) as err:
        print(f"fedrapp-sim: {err}", file=sys.stderr)
        return 1
    finally:
        stop_process_group(superlink)

    if status.get("status") != "finished:completed":
        print(
            f"fedrapp-sim: run {status.get('run-id')} ended as {status.get('status')}: "
            f"{status.get('status-details')} (SuperLink log: {log_path})",
            file=sys.stderr,
        )
        return 1
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        print(f"fedrapp-sim: the run completed but wrote no {summary_path}", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    print(
        f"fedrapp-sim: done. online accuracy micro {100 * summary['micro_accuracy']:.2f}% "
        f"macro {100 * summary['macro_accuracy']:.2f}% over {summary['samples']} samples in "
        f"{summary['rounds']} rounds; results in {run_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
