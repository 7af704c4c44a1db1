"""A deployment on loopback (insecure): one SuperLink, N SuperNodes, stock or warm executors, for tests and
benchmarks.

``executor="stock"``: each SuperNode runs Flower's own SuperExec (``--isolation subprocess``), a new
``flwr-clientapp`` process per message. ``executor="warm"``: each SuperNode runs with ``--isolation
process`` and a ``fedrapp-superexec`` next to it (``python -m fedrapp_app.deploy``), writing its per-task
stats to ``folder/stats-<client>.jsonl``.

Every process gets its own session and is stopped by process group on exit; the environment also carries a
launch mark (``fedrapp_app.processes``), so anything that escaped its group is found and stopped too.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from fedrapp_app.launch import (
    contained_env,
    free_port,
    run_status,
    stop_process_group,
    toml_value,
    wait_healthy,
    write_connection,
)
from fedrapp_app.processes import LAUNCH_ID_ENV, stop_marked

Executor = Literal["stock", "warm"]
CONNECTION = "loopback"


class Loopback:
    """Start with ``with Loopback(folder, nodes, executor) as fed: fed.run(app_dir, config)``."""

    def __init__(
        self,
        folder: Path,
        nodes: int,
        executor: Executor,
        *,
        node_config: dict[int, dict[str, Any]] | None = None,
        node_env: dict[str, str] | None = None,
        executor_args: tuple[str, ...] = (),
    ) -> None:
        if executor not in ("stock", "warm"):
            raise ValueError(f"executor must be 'stock' or 'warm', got {executor!r}")
        self.folder = Path(folder)
        self.nodes = nodes
        self.executor = executor
        self.node_config = node_config or {}
        self.launch_id = "loopback-" + uuid.uuid4().hex
        self.env = {**contained_env(self.folder / "flwr-home"), LAUNCH_ID_ENV: self.launch_id}
        self.node_env = {**self.env, **(node_env or {})}
        self.executor_args = executor_args
        self.processes: dict[str, subprocess.Popen] = {}
        self.cwd = self.folder / "cwd"
        self.port = 0
        self.runtime_ports: list[int] = []

    def _start(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            command, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.processes[name] = process
        return process

    def stats_path(self, client: int) -> Path:
        return self.folder / f"stats-{client}.jsonl"

    def start_executor(self, client: int) -> subprocess.Popen:
        """(Re)start the warm executor of SuperNode ``client`` (its old process, if any, is stopped first)."""
        name = f"executor{client}"
        if name in self.processes:
            stop_process_group(self.processes[name])
        command = [sys.executable, "-m", "fedrapp_app.deploy", "--insecure"]
        command += ["--runtime-api-address", f"127.0.0.1:{self.runtime_ports[client]}"]
        command += ["--stats", str(self.stats_path(client)), *self.executor_args]
        return self._start(name, command, self.node_env)

    def __enter__(self) -> Loopback:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(exist_ok=True)
        try:
            self.port = free_port()
            link = self._start(
                "superlink",
                [
                    "flower-superlink",
                    "--insecure",
                    "--disable-runtime-dependency-installation",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                self.env,
            )
            wait_healthy(self.port, link)
            for client in range(self.nodes):
                self.runtime_ports.append(free_port())
                config = {"client-id": client, **self.node_config.get(client, {})}
                command = ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}"]
                command += ["--port", str(self.runtime_ports[client])]
                command += ["--node-config", " ".join(f"{k}={toml_value(v)}" for k, v in config.items())]
                if self.executor == "warm":
                    command += ["--isolation", "process"]
                self._start(f"supernode{client}", command, self.node_env)
                if self.executor == "warm":
                    self.start_executor(client)
            write_connection(self.env, CONNECTION, f"127.0.0.1:{self.port}")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[int]:
        """Stop every process started here; returns the PIDs that only the launch mark found (should be [])."""
        for process in reversed(list(self.processes.values())):
            stop_process_group(process)
        return stop_marked(self.launch_id)

    def run(self, app_dir: Path, config: dict[str, Any], timeout: float = 600.0) -> tuple[str, dict, float]:
        """``flwr run app_dir loopback --stream -c <config>``; returns (its output, the run's status, seconds)."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in config.items())
        started = time.monotonic()
        done = subprocess.run(
            ["flwr", "run", str(app_dir), CONNECTION, "--stream", "-c", overrides],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        seconds = time.monotonic() - started
        return done.stdout + done.stderr, run_status(self.env, self.cwd, CONNECTION), seconds
