"""Cells as Ray tasks: ``python -m fedrapp_app.bench <bench.yaml> --ray-address HOST:PORT`` (or ``auto``).

Each pending cell is one Ray task asking for ``--gpus-per-cell`` GPUs and ``--cpus-per-cell`` CPUs, which Ray
places on any node of the cluster that has them free. The task runs the cell exactly as the in-process runner does
(:func:`~fedrapp_app.bench.grid.run_cell`, the same torch threads), so its row is the same, and hands the result back
to the driver, where :class:`~fedrapp_app.bench.grid.BenchRunner` writes the row: the bench folder on the driver's
host is the single record. Ray does not retry a task itself (``max_retries=0``): a task lost with its node or worker
(``NodeDiedError``, ``WorkerCrashedError``, ``ObjectLostError``, ...) is reported lost and the runner runs the cell
again, on a node that is alive. When the driver dies, Ray ends its tasks; running the command again resumes.

What every node needs: this package installed at the same paths (as for ``fedrapp-sim --ray-address``), the model
and the data at the same paths, and the bench folder's ``runs/`` path writable (each cell writes its run folder
there on the node that runs it; a shared file system lets a lost cell continue from its last checkpointed round).
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedrapp_app.bench.grid import CellResult, Outcome, cell_device, reason
from fedrapp_app.bench.schema import BenchError, Cell

#: Ray's exceptions that say the task's node, worker or result is gone, not that the cell failed: run it again.
LOST_ERRORS = (
    "NodeDiedError",
    "WorkerCrashedError",
    "ObjectLostError",
    "OwnerDiedError",
    "LocalRayletDiedError",
    "OutOfMemoryError",
)
#: Seconds a look at the cluster's nodes is reused for (the runner asks for the capacity on every poll).
NODES_TTL = 5.0


def run_cell_task(overrides: dict[str, Any], cell_id: str, runs_dir: str, threads: int | None) -> CellResult:
    """The body of a cell's Ray task (a fresh worker process: Flower quiet, ``threads`` torch threads)."""
    from fedrapp_app.bench.grid import quiet_flower, run_cell, set_threads

    quiet_flower()
    set_threads(threads)
    return run_cell(overrides, cell_id, Path(runs_dir))


def check_head_answers(address: str, timeout: float = 3.0) -> None:
    """``BenchError`` unless ``address`` (``HOST:PORT`` of a Ray head) accepts a TCP connection."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise BenchError(f"--ray-address {address!r}: expected HOST:PORT of the Ray head (e.g. 10.0.0.1:6379) or auto")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as err:
        raise BenchError(
            f"--ray-address {address}: the Ray head does not answer ({reason(err, 120)}). Start it with "
            f"`ray start --head --port={port}` on {host} (and `ray start --address={address}` on the other nodes), "
            "or drop --ray-address to run the cells on this host (--workers N)"
        ) from None


def alive_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The nodes of ``ray.nodes()`` that are alive."""
    return [node for node in nodes if node.get("Alive")]


def _fits(available: float, need: float) -> int:
    return math.floor(available / need + 1e-9) if need > 0 else 1 << 30  # 1e-9: 1 / 0.1 is 9.999...


def cells_at_once(nodes: Sequence[Mapping[str, Any]], gpus_per_cell: float, cpus_per_cell: float) -> int:
    """How many cells the alive ``nodes`` (``ray.nodes()`` entries) run at once with these resources per cell."""
    total = 0
    for node in alive_nodes(nodes):
        resources = node.get("Resources", {})
        total += min(
            _fits(float(resources.get("CPU", 0)), cpus_per_cell), _fits(float(resources.get("GPU", 0)), gpus_per_cell)
        )
    return total


def _per_node(nodes: Sequence[Mapping[str, Any]], resource: str) -> str:
    return ", ".join(f"{float(node.get('Resources', {}).get(resource, 0)):g}" for node in alive_nodes(nodes))


def resolve_gpus_per_cell(
    requested: float | None, nodes: Sequence[Mapping[str, Any]], cells: Sequence[Cell]
) -> tuple[float, str | None]:
    """The GPUs each cell asks Ray for, and a note for the user; ``BenchError`` for a request no node can meet or
    one that would fail in every cell (one line, naming the flag to change).

    Without ``--gpus-per-cell``, a cell whose ``device`` is ``auto`` or ``cuda`` gets one whole GPU when the cluster
    has GPUs (Ray hides the GPUs from a task without a GPU share), else none.
    """
    from fedrapp_app.engine.devices import parse_device  # no torch

    devices = {parse_device(cell_device(cell)) for cell in cells}
    for kind, index in devices:
        if kind == "cuda" and index:
            raise BenchError(
                f"device='cuda:{index}': a Ray task sees only the GPUs of its share, from cuda:0; use device='cuda' "
                "or 'auto' (e.g. --set device=cuda) and give each cell its GPUs with --gpus-per-cell"
            )
    most = max((float(node.get("Resources", {}).get("GPU", 0)) for node in alive_nodes(nodes)), default=0.0)
    wants_gpu = any(kind in ("auto", "cuda") for kind, _ in devices)
    note = None
    if requested is None:
        gpus = 1.0 if most >= 1 and wants_gpu else 0.0
        if gpus:
            note = (
                "each cell gets a whole GPU (--gpus-per-cell 1); --gpus-per-cell 0.5 puts two cells on a GPU once "
                "benchmarks/gpu_step.py says they fit"
            )
    else:
        gpus = float(requested)
        if not math.isfinite(gpus) or gpus < 0 or (gpus > 1 and not gpus.is_integer()):
            raise BenchError(
                f"--gpus-per-cell {requested}: Ray takes a fraction below 1 (0.5: two cells on a GPU) or a whole number"
            )
    if gpus > most:
        fix = f"use --gpus-per-cell {most:g} or less" if most else "use --gpus-per-cell 0 (the cells on the CPU)"
        raise BenchError(
            f"--gpus-per-cell {gpus:g}, but no node of the Ray cluster has that many GPUs (GPUs of its "
            f"{len(alive_nodes(nodes))} alive node(s): {_per_node(nodes, 'GPU')}): Ray would never start a cell; "
            f"{fix}, or add a node with more (ray start --address=<head> --num-gpus=N)"
        )
    if gpus == 0 and any(kind == "cuda" for kind, _ in devices):
        raise BenchError(
            "device='cuda' with no GPU share per cell: Ray hides the GPUs from a task without one, so CUDA would be "
            "unavailable in every cell; pass --gpus-per-cell 1 (or 0.5), or set device='auto' or 'cpu'"
        )
    if gpus == 0 and most >= 1 and wants_gpu:
        note = "--gpus-per-cell 0: the cells run on the CPU although the cluster has GPUs (Ray hides them)"
    return gpus, note


def check_cpus_per_cell(cpus: float, nodes: Sequence[Mapping[str, Any]]) -> None:
    """``BenchError`` when no alive node has ``cpus`` CPUs (Ray would never start a cell)."""
    most = max((float(node.get("Resources", {}).get("CPU", 0)) for node in alive_nodes(nodes)), default=0.0)
    if cpus > most:
        raise BenchError(
            f"--cpus-per-cell {cpus:g}, but no node of the Ray cluster has that many CPUs (CPUs of its "
            f"{len(alive_nodes(nodes))} alive node(s): {_per_node(nodes, 'CPU')}): Ray would never start a cell; "
            f"use --cpus-per-cell {max(1, math.floor(most))} or less"
        )


#: Keys whose value may be a local path.
PATH_KEYS = ("model", "data-dir")


def absolute_paths(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` with a relative local ``model`` or ``data-dir`` made absolute from the driver's working folder,
    as a cell in this process reads it: a Ray task runs where its node's ``ray start`` ran, where the relative path
    means something else (a cell's identity keeps the path as written). A Hub id (``org/name``) stays as it is."""
    out = dict(overrides)
    for key in PATH_KEYS:
        value = str(out.get(key, ""))
        local = value.startswith((".", "~")) or value.count("/") > 1 or (key == "data-dir" and value != "")
        if local and not Path(value).expanduser().is_absolute():
            out[key] = str(Path(value).expanduser().resolve())
    return out


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``HOST:PORT`` or ``auto``) as a driver; ``BenchError`` in one line."""
    import ray

    if address != "auto":
        check_head_answers(address)
    # Ray's notice that it will stop hiding GPUs from tasks without a GPU share some day: not the user's concern
    warnings.filterwarnings("ignore", message=r"Tip: In future versions of Ray", category=FutureWarning)
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        start = "`ray start --head` on this host" if address == "auto" else f"the Ray head at {address}"
        raise BenchError(
            f"--ray-address {address}: cannot join the Ray cluster ({first}); check {start} (the same Python and Ray "
            "version on every node), or drop --ray-address to run the cells on this host"
        ) from None


class RayExecutor:
    """Cells as Ray tasks on the cluster at ``address`` (see the module docstring).

    ``gpus_per_cell`` None: one GPU per cell on a cluster with GPUs (:func:`resolve_gpus_per_cell`);
    ``cpus_per_cell`` None: ``threads`` (the cell's torch threads), at least 1.
    """

    def __init__(
        self,
        address: str,
        runs_dir: Path,
        threads: int | None = 1,
        gpus_per_cell: float | None = None,
        cpus_per_cell: float | None = None,
    ) -> None:
        self.address, self.runs_dir, self.threads = address, Path(runs_dir), threads
        self.requested_gpus = gpus_per_cell
        self.cpus = float(cpus_per_cell if cpus_per_cell is not None else max(1, threads or 1))
        self.gpus = 0.0
        self.note: str | None = None
        self.description = f"Ray tasks on the cluster at {address}"
        self._task: Any = None
        self._refs: dict[Any, Cell] = {}
        self._nodes: list[Mapping[str, Any]] = []
        self._nodes_at = -math.inf

    def check(self, cells: Sequence[Cell]) -> None:
        """Join the cluster and refuse resources no node has (before any cell starts)."""
        import ray

        if self.cpus <= 0:
            raise BenchError(f"--cpus-per-cell {self.cpus:g}: each cell needs at least 1 CPU")
        if not ray.is_initialized():
            connect(self.address)
        nodes = self.nodes()
        check_cpus_per_cell(self.cpus, nodes)
        self.gpus, self.note = resolve_gpus_per_cell(self.requested_gpus, nodes, cells)
        self._task = ray.remote(run_cell_task)
        alive = alive_nodes(nodes)
        self.description = (
            f"Ray tasks on the cluster at {self.address} ({len(alive)} node(s), {self.gpus:g} GPU and "
            f"{self.cpus:g} CPU per cell: {self.capacity()} cell(s) at once)"
        )

    def nodes(self) -> list[Mapping[str, Any]]:
        """The cluster's nodes (``ray.nodes()``), looked up at most every :data:`NODES_TTL` seconds."""
        import ray

        if time.monotonic() - self._nodes_at > NODES_TTL:
            self._nodes, self._nodes_at = ray.nodes(), time.monotonic()
        return self._nodes

    def capacity(self) -> int:
        at_once = cells_at_once(self.nodes(), self.gpus, self.cpus)
        if at_once == 0:
            raise BenchError(
                f"no alive node of the Ray cluster at {self.address} can run a cell any more ({self.gpus:g} GPU and "
                f"{self.cpus:g} CPU per cell; GPUs of the alive nodes: {_per_node(self.nodes(), 'GPU') or 'none'}): "
                "add a node (ray start --address=<head> ...) and run the same command again; finished cells are kept"
            )
        return at_once

    def submit(self, cell: Cell) -> None:
        task = self._task.options(num_cpus=self.cpus, num_gpus=self.gpus, max_retries=0, name=f"bench {cell.id}")
        self._refs[task.remote(absolute_paths(cell.overrides), cell.id, str(self.runs_dir), self.threads)] = cell

    def poll(self, timeout: float) -> list[Outcome]:
        import ray
        from ray.exceptions import RayError, RayTaskError

        if not self._refs:
            return []
        ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=0)
        outcomes = []
        for ref in ready:
            cell = self._refs.pop(ref)
            try:
                outcomes.append(Outcome(cell, result=ray.get(ref)))
            except RayTaskError as err:  # the cell raised: its own exception, with the remote traceback
                cause = err.cause if isinstance(err.cause, BaseException) else err
                outcomes.append(Outcome(cell, error=reason(cause), details=str(err)))
            except RayError as err:
                if type(err).__name__ in LOST_ERRORS or any(k.__name__ in LOST_ERRORS for k in type(err).__mro__):
                    outcomes.append(Outcome(cell, lost=reason(err, 200)))
                    self._nodes_at = -math.inf  # a node may be gone: look again
                else:
                    outcomes.append(Outcome(cell, error=reason(err)))
        return outcomes

    def close(self, cancel: bool = False) -> None:
        import ray

        if cancel:
            for ref in self._refs:
                with contextlib.suppress(Exception):  # already ended, or its node is gone: the shutdown ends it
                    ray.cancel(ref, force=True)
        self._refs.clear()
        if ray.is_initialized():
            ray.shutdown()  # the cluster runs on; the driver's job (and any task of it left) ends
