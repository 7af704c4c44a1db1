"""A deployment on loopback (insecure): one SuperLink, N SuperNodes, stock or warm executors, for tests and
benchmarks.

``executor="stock"``: each SuperNode runs Flower's own SuperExec (``--isolation subprocess``), a new
``flwr-clientapp`` process per message. ``executor="warm"``: each SuperNode runs with ``--isolation
process`` and a ``fedrapp-superexec`` next to it (``python -m fedrapp_app.deploy``), writing its per-task
stats to ``folder/stats-<client>.jsonl``.

Single parts can be stopped, killed and started again (``stop_node`` / ``start_node``, ``stop_superlink`` /
``start_superlink``; the SuperLink keeps its port and, with ``database``, its state; ``crash_superlink`` kills
the SuperLink's own process only, leaving its ServerApp to notice), and a run can be
submitted without waiting for it (``submit``): the chaos tests and ``benchmarks/chaos.py`` use that.

Every process gets its own session and is stopped by process group on exit; the environment also carries a
launch mark (``fedrapp_app.running.processes``), so anything that escaped its group is found and stopped too.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from fedrapp_app.running.launch import (
    contained_env,
    free_port,
    run_status,
    stop_process_group,
    toml_value,
    wait_healthy,
    write_connection,
)
from fedrapp_app.running.processes import LAUNCH_ID_ENV, stat_fields, stop_marked

Executor = Literal["stock", "warm"]
CONNECTION = "loopback"
NODE_ID_LINE = re.compile(r"SuperNode ID: (\d+)")
RUN_ID_LINE = re.compile(r"Successfully started run (\d+)")


def run_id_of(output: str) -> int | None:
    """The run id ``flwr run`` printed (None: it submitted nothing)."""
    found = RUN_ID_LINE.search(output)
    return int(found.group(1)) if found else None


def descendants(root: int) -> list[int]:
    """The live processes below ``root`` (not itself), read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        fields = stat_fields(entry.name) if entry.name.isdigit() else None
        if fields is not None and len(fields) > 1 and fields[1].isdigit():
            parents[int(entry.name)] = int(fields[1])
    found, todo = [], [root]
    while todo:
        current = todo.pop()
        children = [pid for pid, parent in parents.items() if parent == current]
        found += children
        todo += children
    return found


def process_name(pid: int) -> str:
    """What ``pid`` runs, as a short name: the basename of its command's first word that is not the interpreter
    (``flwr-serverapp``, ``flower-superexec``); '' once it is gone."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return ""
    words = [w for w in words if w]
    if len(words) > 1 and Path(words[0]).name.startswith("python"):
        words = words[1:]
    return Path(words[0]).name if words else ""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    fields = stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        fields = stat_fields(entry.name) if entry.name.isdigit() else None
        if fields is not None and len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


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
        database: Path | None = None,
    ) -> None:
        if executor not in ("stock", "warm"):
            raise ValueError(f"executor must be 'stock' or 'warm', got {executor!r}")
        self.folder = Path(folder)
        self.nodes = nodes
        self.executor = executor
        self.node_config = node_config or {}
        self.database = database
        self.launch_id = "loopback-" + uuid.uuid4().hex
        self.env = {**contained_env(self.folder / "flwr-home"), LAUNCH_ID_ENV: self.launch_id}
        self.node_env = {**self.env, **(node_env or {})}
        self.executor_args = executor_args
        self.processes: dict[str, subprocess.Popen] = {}  # the current process of each part
        self._others: list[subprocess.Popen] = []  # replaced parts and submitted runs (stopped by stop())
        self.cwd = self.folder / "cwd"
        self.port = 0
        self.runtime_ports: list[int] = []

    def _start(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        if name in self.processes:
            self._others.append(self.processes.pop(name))
        log = open(self.folder / f"{name}.log", "a")  # noqa: SIM115 - closed with the process
        log.write(f"--- started at {time.time():.3f}: {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(
            command, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()  # the child holds its own copy
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

    def start_superlink(self) -> subprocess.Popen:
        """Start the SuperLink (again: on the same port and ``database``) and wait until it answers."""
        if "superlink" in self.processes and self.processes["superlink"].poll() is None:
            raise RuntimeError("the SuperLink is already running; stop it first (stop_superlink)")
        self.port = self.port or free_port()
        command = ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        if self.database is not None:
            command += ["--database", str(self.database)]
        link = self._start("superlink", command, self.env)
        wait_healthy(self.port, link)
        return link

    def stop_superlink(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Signal the SuperLink's process group (its SuperExec and ServerApp included) and wait for it (up to
        ``timeout`` seconds, then SIGTERM and SIGKILL)."""
        self._signal_group("superlink", sig, timeout)

    def crash_superlink(self) -> dict[int, str]:
        """SIGKILL the SuperLink's own process only, by its PID (not its process group): what the OOM killer or
        a crash of the SuperLink alone does. Its SuperExec and ServerApp are left to notice on their own; returns
        them as ``{pid: name}`` (they are reparented, still in the SuperLink's process group, which ``stop``
        ends)."""
        link = self.processes["superlink"]
        below = {pid: process_name(pid) for pid in descendants(link.pid)}
        os.kill(link.pid, signal.SIGKILL)
        link.wait()
        return below

    def start_node(self, client: int) -> subprocess.Popen:
        """Start SuperNode ``client`` (again) and, for the warm executor, its ``fedrapp-superexec`` unless that
        one still runs (it reconnects to the restarted SuperNode on its own)."""
        name = f"supernode{client}"
        if name in self.processes and self.processes[name].poll() is None:
            raise RuntimeError(f"SuperNode {client} is already running; stop it first (stop_node)")
        while len(self.runtime_ports) <= client:
            self.runtime_ports.append(free_port())
        config = {"client-id": client, **self.node_config.get(client, {})}
        command = ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}"]
        command += ["--port", str(self.runtime_ports[client])]
        command += ["--node-config", " ".join(f"{k}={toml_value(v)}" for k, v in config.items())]
        if self.executor == "warm":
            command += ["--isolation", "process"]
        node = self._start(name, command, self.node_env)
        executor = self.processes.get(f"executor{client}")
        if self.executor == "warm" and (executor is None or executor.poll() is not None):
            self.start_executor(client)
        return node

    def stop_node(self, client: int, sig: int = signal.SIGTERM, executor: bool = True) -> None:
        """Signal SuperNode ``client``: its process group and every process below it (the ClientApp of a stock
        node); with ``executor`` (warm) its ``fedrapp-superexec`` and workers too, as when a host dies."""
        self._signal_group(f"supernode{client}", sig)
        if executor and f"executor{client}" in self.processes:
            self._signal_group(f"executor{client}", sig)

    def _signal_group(self, name: str, sig: int, timeout: float = 30.0) -> None:
        """Signal part ``name``'s process group and wait until every process of it has exited (a SuperLink's
        ServerApp can outlive the SuperLink by seconds); after ``timeout``, SIGKILL what is left."""
        process = self.processes[name]
        if process.poll() is not None and not group_members(process.pid):
            return
        below = descendants(process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        if sig == signal.SIGKILL:  # a crash takes everything below the process down at once
            for pid in below:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while (process.poll() is None or group_members(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if process.poll() is None or group_members(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def node_ids(self, client: int) -> list[int]:
        """The node ids SuperNode ``client`` was given so far (one per start), read from its log."""
        path = self.folder / f"supernode{client}.log"
        return [int(m) for m in NODE_ID_LINE.findall(path.read_text())] if path.is_file() else []

    def __enter__(self) -> Loopback:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(exist_ok=True)
        try:
            self.start_superlink()
            for client in range(self.nodes):
                self.start_node(client)
            write_connection(self.env, CONNECTION, f"127.0.0.1:{self.port}")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[int]:
        """Stop every process started here; returns the PIDs that only the launch mark or the working directory
        found (should be [])."""
        for process in reversed([*self._others, *self.processes.values()]):
            stop_process_group(process)
        return stop_marked(self.launch_id, cwd=self.cwd.resolve())

    def _run_command(self, app_dir: Path, config: dict[str, Any]) -> list[str]:
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in config.items())
        return ["flwr", "run", str(app_dir), CONNECTION, "--stream", "-c", overrides]

    def submit(self, app_dir: Path, config: dict[str, Any], log: Path) -> subprocess.Popen:
        """Start ``flwr run app_dir loopback --stream -c <config>`` without waiting; its output goes to ``log``."""
        with open(log, "a") as out:
            process = subprocess.Popen(
                self._run_command(app_dir, config),
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._others.append(process)
        return process

    def status(self, run_id: int | None = None) -> dict:
        """Run ``run_id``'s status (default: the newest run's), as ``flwr list --format json`` reports it."""
        return run_status(self.env, self.cwd, CONNECTION, run_id)

    def run(self, app_dir: Path, config: dict[str, Any], timeout: float = 600.0) -> tuple[str, dict, float]:
        """``flwr run app_dir loopback --stream -c <config>``; returns (its output, the run's status, seconds)."""
        started = time.monotonic()
        done = subprocess.run(
            self._run_command(app_dir, config),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        return output, self.status(run_id_of(output)), seconds
