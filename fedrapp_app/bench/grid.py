"""The grid runner: every pending cell through the real ServerApp body, strategy and ClientApp.

Each cell is ``run_server(InProcessGrid(client_app, num-clients, config), config)``, exactly what
``flwr run`` executes, writing its run folder to ``<bench-dir>/runs/<cell>``. One runner (:class:`BenchRunner`)
hands the pending cells to an executor, which only runs them:

* :class:`InlineExecutor` (``--workers 1``): one cell after the other in this process;
* :class:`LocalExecutor` (``--workers N``): N worker processes on this host, each with ``threads`` torch threads
  and, on a GPU host, a GPU of its own (``CUDA_VISIBLE_DEVICES``; round-robin when there are more workers
  than GPUs);
* :class:`~fedrapp_app.bench.ray_cells.RayExecutor` (``--ray-address``): one Ray task per cell, on any node of a
  Ray cluster, with the GPUs and CPUs a cell asks for.

Only the runner writes ``<bench-dir>/cells.jsonl`` (through a rename, after every cell), so the bench folder is the
single record whoever runs the cells: a cell with a row is skipped, and never gets a second one; a cell lost with its
worker process or node is run again (at most :data:`MAX_LOSSES` times); a cell that fails gets a row with its reason
(the grid goes on; the next run tries it again); an interrupted grid resumes where it stopped, a cell that was cut
short from its last checkpointed round. A lock on ``<bench-dir>/.lock`` keeps a second runner out.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import multiprocessing
import os
import secrets
import socket
import sys
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from tqdm import tqdm

from fedrapp_app.bench.rows import make_failed_row, make_row, read_rows, write_rows, write_text_atomic
from fedrapp_app.bench.schema import BenchError, BenchSpec, Cell, irrelevant_keys
from fedrapp_app.config import DEFAULTS, ConfigError, RunConfig
from fedrapp_app.recording.results import git_state, run_rows

log = logging.getLogger("fedrapp.bench")

RUNS_DIR = "runs"
LOCK_FILE = ".lock"
#: How often a cell may be lost with its worker process or node before it counts as failed.
MAX_LOSSES = 3
#: Seconds between two looks at the running cells (the progress line is refreshed as often).
POLL_SECONDS = 2.0


@dataclass(frozen=True)
class CellResult:
    """What a finished cell hands back to the process that writes the rows."""

    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    domains: list[str | None]
    seconds: float
    #: Where the cell ran (:func:`where_this_runs`): recorded in its row, never part of its results.
    ran_on: dict[str, Any] = field(default_factory=dict)


def where_this_runs() -> dict[str, Any]:
    """The host, the Ray node (in a Ray task, else None) and the GPUs (``CUDA_VISIBLE_DEVICES``) of this process."""
    ray = sys.modules.get("ray")
    node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None
    return {
        "host": socket.gethostname(),
        "ray_node": node,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def reason(err: BaseException, limit: int = 500) -> str:
    """An exception in one line: its type and message, whitespace folded, at most ``limit`` characters."""
    text = f"{type(err).__name__}: {' '.join(str(err).split())}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def model_fingerprint(model: str) -> str | None:
    """Hash of a local checkpoint's weight files ("testbed" included); None for a Hub id.

    Rows record it, so a grid never mixes cells computed with different weights under one model name.
    """
    from fedrapp_app.engine.loading import resolve_source

    try:
        where, local = resolve_source(model)
    except FileNotFoundError:
        return None
    if not local:
        return None
    digest = hashlib.sha256()
    for path in sorted(Path(where).glob("*.safetensors")) + sorted(Path(where).glob("*.bin")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


#: The loggers whose per-round INFO lines a grid keeps out of its progress bar.
QUIET = ("flwr", "flwr.fedrapp", "fedrapp")


def quiet_flower() -> None:
    """Keep Flower's per-round INFO lines out of the progress bar (warnings still show)."""
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


@contextmanager
def cell_settings(threads: int | None) -> Iterator[None]:
    """Quiet loggers and ``threads`` torch threads while a cell runs in this process, as they were afterwards (the
    process goes on: the tests, a user's session)."""
    import torch

    levels = {name: logging.getLogger(name).level for name in QUIET}
    before = torch.get_num_threads()
    quiet_flower()
    set_threads(threads)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        torch.set_num_threads(before)


def set_threads(threads: int | None) -> None:
    """Torch intra-op threads of this process (None keeps torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def print_failures(failures: Mapping[str, str], headline: str) -> int:
    """Each failed cell and its reason on stderr under ``headline``; the exit status: 1 where any failed, else 0."""
    if not failures:
        return 0
    print(headline, file=sys.stderr)
    for cell_id, reason in failures.items():
        print(f"  {cell_id}: {reason[:500]}", file=sys.stderr)
    return 1


#: The grid's own secret for seeded dp noise, in its runs folder (readable by its owner only).
DP_SECRET_FILE = "dp-noise-secret"


def grid_secret(runs_dir: Path) -> str:
    """The secret that seeds this grid's dp noise: drawn from the OS once per grid (the first cell to need it
    writes it, the others and a rerun read it), so that no two grids share noise and nobody without the file can
    draw it again."""
    path = Path(runs_dir) / DP_SECRET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    log.warning("dp cells: their noise is seeded by a secret drawn for this grid, kept in %s", path)
    return path.read_text().strip()


@contextmanager
def _seeded_dp_noise(runs_dir: Path, private: bool) -> Iterator[None]:
    """Under dp a cell's noise seeded (``FEDRAPP_DP_SEED``: the user's, else the grid's own secret,
    :func:`grid_secret`): a benchmark is an experiment whose cut cells resume to the rows a whole one gives; a
    deployment draws its noise from the OS (docs/privacy.md). Each run's folder says ``noise_seeded``."""
    from fedrapp_app.privacy.upload import SEED_ENV

    if not private or os.environ.get(SEED_ENV):
        yield
        return
    os.environ[SEED_ENV] = grid_secret(runs_dir)
    try:
        yield
    finally:
        os.environ.pop(SEED_ENV, None)


#: Batches and image-tower outputs a worker process keeps for its next cells (``engine.reuse``): a testbed setting
#: and seed has 80 batches of each (about 0.2 MB a rendered batch, a few KB of features), so 1024 hold a setting's
#: three seeds, which the grid runs one after the other.
REUSE_ENTRIES = 1024


def run_cell(
    overrides: Mapping[str, Any],
    cell_id: str,
    runs_dir: Path,
    on_round: Callable[[int, Any], None] | None = None,
) -> CellResult:
    """Run one cell in this process, in ``runs_dir/cell_id``.

    A cell cut short (its run folder holds a server checkpoint) resumes after its last finished round
    (``resume = true``: the same results as an uninterrupted run); a checkpoint of a run with other
    settings, or rows without a checkpoint, are overwritten by a fresh run (``run_server(..., overwrite=True)``).
    """
    from fedrapp_app.config import RunConfig
    from fedrapp_app.data import client_domains
    from fedrapp_app.engine import reuse
    from fedrapp_app.federation.client import app as client_app
    from fedrapp_app.federation.inprocess import InProcessGrid
    from fedrapp_app.federation.server import run_server
    from fedrapp_app.recording.checkpoint import SERVER_FILE

    resume = (Path(runs_dir) / cell_id / SERVER_FILE).is_file()
    config = {**overrides, "output-dir": str(runs_dir), "run-name": cell_id, "resume": resume}
    validated = RunConfig.from_run_config(config)
    start = time.perf_counter()
    with (
        reuse.on(REUSE_ENTRIES),
        _seeded_dp_noise(runs_dir, bool(validated["dp"])),
    ):  # a setting's cells see the same batches: render, embed once
        grid = InProcessGrid(client_app, int(validated["num-clients"]), config)
        try:  # the runner owns its cell folders: without a checkpoint, what a folder holds is a cut cell's leftovers
            summary = run_server(grid, config, on_round=on_round, overwrite=not resume)
        except ConfigError as err:  # the config was valid above: the checkpoint is of another run
            if not resume:
                raise
            log.warning("cell %s: its checkpoint cannot be resumed (%s); running it from the start", cell_id, err)
            config["resume"] = False
            grid = InProcessGrid(client_app, int(validated["num-clients"]), config)
            summary = run_server(grid, config, on_round=on_round, overwrite=True)
    seconds = time.perf_counter() - start
    run_dir = Path(summary["run_dir"])
    rounds = run_rows(run_dir)  # under dp with the clients' outcomes merged
    return CellResult(summary, rounds, client_domains(validated.data_spec()), seconds, where_this_runs())


# ------------------------------------------------------------------------------------------------ executors
@dataclass(frozen=True)
class Outcome:
    """What an executor reports for a cell that stopped running: its result, or why it failed, or that it was lost.

    ``error``: the cell raised (one line, :func:`reason`; ``details`` may hold its traceback); ``lost``: its worker
    process or node died under it, which says nothing about the cell: the runner runs it again.
    """

    cell: Cell
    result: CellResult | None = None
    error: str | None = None
    lost: str | None = None
    details: str | None = None


class Executor(Protocol):
    """Runs cells for :class:`BenchRunner`, which alone decides what runs and writes the rows."""

    #: Where the cells run, for the user (e.g. "2 worker processes on GPUs 0, 1").
    description: str

    def check(self, cells: Sequence[Cell]) -> None:
        """Raise ``BenchError`` (one line, naming the fix) if these cells cannot run here; called before any starts."""

    def capacity(self) -> int:
        """How many cells may run at once now (>= 1; ``BenchError`` when none ever could any more)."""

    def submit(self, cell: Cell) -> None:
        """Start ``cell`` (or queue it to start at the next :meth:`poll`)."""

    def poll(self, timeout: float) -> list[Outcome]:
        """The submitted cells that stopped running, waiting up to ``timeout`` seconds for the first."""

    def close(self, cancel: bool = False) -> None:
        """Release the workers; ``cancel``: stop the running cells first (Ctrl-C, an error in the runner)."""


def cell_device(cell: Cell) -> str:
    """The ``device`` a cell asks for (its override, else the default)."""
    return str(cell.overrides.get("device", DEFAULTS["device"]))


class InlineExecutor:
    """``--workers 1``: each cell runs in this process, when :meth:`poll` is called (Ctrl-C stops it at once)."""

    description = "in this process"

    def __init__(
        self, runs_dir: Path, threads: int | None = 1, on_round: Callable[[Cell, int], None] | None = None
    ) -> None:
        self.runs_dir, self.threads, self.on_round = Path(runs_dir), threads, on_round
        self._queue: deque[Cell] = deque()

    def check(self, cells: Sequence[Cell]) -> None:
        """Nothing to check: the cells run here, as this process can."""

    def capacity(self) -> int:
        return 1

    def submit(self, cell: Cell) -> None:
        self._queue.append(cell)

    def poll(self, timeout: float) -> list[Outcome]:
        if not self._queue:
            return []
        cell = self._queue.popleft()

        def on_round(round_number: int, strategy: Any) -> None:
            if self.on_round is not None:
                self.on_round(cell, round_number)

        try:
            with cell_settings(self.threads):
                result = run_cell(cell.overrides, cell.id, self.runs_dir, on_round)
        except Exception as err:  # noqa: BLE001 - one broken cell must not lose the others
            return [Outcome(cell, error=reason(err), details=traceback.format_exc())]
        return [Outcome(cell, result=result)]

    def close(self, cancel: bool = False) -> None:
        self._queue.clear()


def host_gpus() -> list[str]:
    """The GPUs this host offers a new process, as ``CUDA_VISIBLE_DEVICES`` entries: this process's own list when
    it has one (``"2,3"`` -> ``["2", "3"]``), else ``"0"`` ... ``"N-1"``; empty without an NVIDIA driver."""
    from fedrapp_app.engine.devices import host_gpu_count  # no torch

    count = host_gpu_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(count)]
    return [entry.strip() for entry in visible.split(",")][:count]


def worker_gpus(workers: int, gpus: Sequence[str]) -> list[str] | None:
    """The ``CUDA_VISIBLE_DEVICES`` of each of ``workers`` local worker processes: one GPU each, round-robin over
    ``gpus`` (two workers per GPU when there are twice as many workers as GPUs); None on a host without GPUs."""
    if not gpus:
        return None
    return [gpus[i % len(gpus)] for i in range(workers)]


def _worker_init(threads: int | None, gpu_slots: Any = None) -> None:
    # Before the first CUDA call of this process (the cell loads the model later), so that it sees one GPU, as cuda:0
    if gpu_slots is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_slots.get_nowait()
    quiet_flower()
    set_threads(threads)


def stop_pool(pool: ProcessPoolExecutor, grace: float = 5.0) -> None:
    """Cancel a pool's queued tasks and stop its workers: SIGTERM, up to ``grace`` seconds, then SIGKILL."""
    processes = list(getattr(pool, "_processes", {}).values())  # the executor has no public handle on them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    deadline = time.monotonic() + grace
    while any(process.is_alive() for process in processes) and time.monotonic() < deadline:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(0.5)


def _run_in_worker(overrides: dict[str, Any], cell_id: str, runs_dir: str) -> CellResult:
    return run_cell(overrides, cell_id, Path(runs_dir))


class LocalExecutor:
    """``--workers N``: cells in N spawned worker processes of this host, each on a GPU of its own when there are
    GPUs (``gpus``: the host's, :func:`host_gpus`). A worker that dies (killed, out of memory) breaks the pool: its
    cells are reported lost and a new pool takes the next ones."""

    def __init__(
        self,
        workers: int,
        runs_dir: Path,
        threads: int | None = 1,
        gpus: Sequence[str] | None = None,
        task: Callable[[dict[str, Any], str, str], Any] = _run_in_worker,
    ) -> None:
        self.workers, self.runs_dir, self.threads, self.task = workers, Path(runs_dir), threads, task
        self.placement = worker_gpus(workers, host_gpus() if gpus is None else gpus)
        self._pool: ProcessPoolExecutor | None = None
        self._running: dict[Future, Cell] = {}
        self._pool_of: dict[str, ProcessPoolExecutor] = {}  # cell key -> the pool it was submitted to
        if self.placement is None:
            self.description = f"{workers} worker processes"
        else:
            gpus_used = list(dict.fromkeys(self.placement))
            shared = f", {math.ceil(workers / len(gpus_used))} per GPU" if workers > len(gpus_used) else ""
            self.description = f"{workers} worker processes on GPUs {', '.join(gpus_used)}{shared}"

    def check(self, cells: Sequence[Cell]) -> None:
        if self.placement is None:
            return
        from fedrapp_app.engine.devices import parse_device

        for cell in cells:
            kind, index = parse_device(cell_device(cell))
            if kind == "cuda" and index:
                raise BenchError(
                    f"cell {cell.id} has device='cuda:{index}', but each worker process sees only its own GPU, "
                    "as cuda:0 (--workers places the workers on the host's GPUs): use device='cuda' or 'auto' "
                    "(e.g. --set device=cuda)"
                )

    def capacity(self) -> int:
        return self.workers

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn: a fresh interpreter per worker (fork after torch has started threads is unsafe)
        context = multiprocessing.get_context("spawn")
        slots = None
        if self.placement is not None:  # one entry per worker: the pool never starts more than `workers` processes
            slots = context.Queue()
            for gpu in self.placement:
                slots.put(gpu)
        return ProcessPoolExecutor(
            self.workers, mp_context=context, initializer=_worker_init, initargs=(self.threads, slots)
        )

    def submit(self, cell: Cell) -> None:
        if self._pool is not None and self._pool_broken():  # a worker died since the last poll
            stop_pool(self._pool)  # its running cells end lost at the next poll, and run again
            self._pool = None
        if self._pool is None:
            self._pool = self._new_pool()
        self._running[self._pool.submit(self.task, dict(cell.overrides), cell.id, str(self.runs_dir))] = cell
        self._pool_of[cell.key] = self._pool

    def _pool_broken(self) -> bool:
        """The pool lost a worker: it takes no more work (ProcessPoolExecutor's own flag)."""
        return bool(getattr(self._pool, "_broken", False))

    def poll(self, timeout: float) -> list[Outcome]:
        if not self._running:
            return []
        done, _ = wait(self._running, timeout=timeout, return_when=FIRST_COMPLETED)
        outcomes, broken = [], set()
        for future in done:
            cell = self._running.pop(future)
            pool = self._pool_of.pop(cell.key, None)
            try:
                result = future.result()
            except BrokenProcessPool as err:
                outcomes.append(Outcome(cell, lost=f"a worker process died ({reason(err, 200)})"))
                broken.add(id(pool))
            except Exception as err:  # noqa: BLE001 - the cell's own error, raised in the worker
                outcomes.append(Outcome(cell, error=reason(err), details="".join(traceback.format_exception(err))))
            else:
                outcomes.append(Outcome(cell, result=result))
        if self._pool is not None and id(self._pool) in broken:
            stop_pool(self._pool)  # broken: its other cells end lost too; the next submit starts a new pool
            self._pool = None
        return outcomes

    def close(self, cancel: bool = False) -> None:
        if self._pool is None:
            return
        if cancel:
            # Ctrl-C / SIGTERM (or a bug): leaving the pool normally would wait for every queued cell to run; cancel
            # them and stop the workers now. Finished cells already have their rows.
            stop_pool(self._pool)
        else:
            self._pool.shutdown()
        self._pool = None
        self._running.clear()
        self._pool_of.clear()


# ------------------------------------------------------------------------------------------------- progress
def format_duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``3 h 05 min`` (rounded; the estimate is no more precise)."""
    if seconds < 60:
        return f"{max(0, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """Cells done, running and failed in this run, and the time left, estimated from the wall time of the cells
    finished so far.

    The time left is the larger of (a) the queued cells' mean run time plus what is left of the running cells',
    spread over the cells that run at once, and (b) what is left of the longest-running cell.
    """

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.clock = total, clock
        self.done = self.failed = 0
        self.durations: list[float] = []
        self.running: dict[str, float] = {}  # cell key -> start

    def started(self, cell: Cell) -> None:
        self.running[cell.key] = self.clock()

    def lost(self, cell: Cell) -> None:
        self.running.pop(cell.key, None)

    def finished(self, cell: Cell) -> None:
        """A cell ended with its row; its duration counts from its submission (a worker's start, Ray's queue and the
        transfer of its result included)."""
        self.durations.append(self.clock() - self.running.pop(cell.key))
        self.done += 1

    def failed_one(self, cell: Cell) -> None:
        self.running.pop(cell.key, None)
        self.failed += 1

    def seconds_left(self, at_once: int) -> float | None:
        """Estimated seconds until every cell has ended (None before the first one finished)."""
        if not self.durations:
            return None
        mean = sum(self.durations) / len(self.durations)
        now = self.clock()
        running_left = [max(mean - (now - start), 0.0) for start in self.running.values()]
        queued = self.total - self.done - self.failed - len(self.running)
        spread = (queued * mean + sum(running_left)) / max(1, at_once)
        return max(spread, max(running_left, default=0.0))

    def text(self, at_once: int) -> str:
        """E.g. ``3/12 done, 2 running, 1 failed, about 4 min left``."""
        left = self.seconds_left(at_once)
        eta = "time left: after the first cell" if left is None else f"about {format_duration(left)} left"
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.done}/{self.total} done, {len(self.running)} running{failed}, {eta}"


def _where(result: CellResult) -> str:
    """`` on <host>, GPU 3`` for a progress line (empty when the result does not say)."""
    host, gpus = result.ran_on.get("host"), result.ran_on.get("cuda_visible_devices")
    return (f" on {host}" if host else "") + (f", GPU {gpus}" if gpus else "")


class ProgressBar(tqdm):
    """tqdm's bar with the grid's status after it (``{status}``, :meth:`Progress.text`) instead of its rate and ETA,
    which count cells as if they ran one at a time."""

    status = ""

    @property
    def format_dict(self) -> dict[str, Any]:
        return {**super().format_dict, "status": self.status}

    def show(self, status: str) -> None:
        self.status = status
        self.refresh()


# --------------------------------------------------------------------------------------------------- runner
class BenchRunner:
    """Runs the pending cells of a :class:`BenchSpec` into ``bench_dir`` and keeps ``cells.jsonl`` current."""

    def __init__(self, spec: BenchSpec, bench_dir: str | Path | None = None) -> None:
        self.spec = spec
        self.bench_dir = Path(bench_dir or spec.output).expanduser().resolve()
        self.runs_dir = self.bench_dir / RUNS_DIR
        self.rows: list[dict[str, Any]] = []  # finished cells
        self.failed_rows: dict[str, dict[str, Any]] = {}  # cell key -> the row of its last failure
        for row in read_rows(self.bench_dir, failed=True):
            if row.get("status") == "failed":
                self.failed_rows[row["key"]] = row
            else:
                self.rows.append(row)
        self.failures: dict[str, str] = {}  # this run's: cell id -> reason
        self._fingerprints: dict[str, str | None] = {}
        # The code a long grid runs is the code it started with, whatever HEAD says later.
        self.git = git_state(Path(__file__).resolve().parent)

    def memberships(self, cell: Cell) -> dict[str, Any]:
        return {m.grid: m.to_json(self.spec.oracles) for m in cell.memberships}

    def pending(self) -> list[Cell]:
        """Cells without a finished row (failed ones included: they run again), in the file's order."""
        done = {row["key"] for row in self.rows}
        return [cell for cell in self.spec.cells if cell.key not in done]

    def failed_before(self) -> list[Cell]:
        """Pending cells whose last run failed (their rows say why)."""
        return [cell for cell in self.pending() if cell.key in self.failed_rows]

    def refresh_labels(self) -> None:
        """Give finished rows the labels the YAML gives them now (a renamed variant needs no rerun)."""
        current = {cell.key: cell for cell in self.spec.cells}
        changed = False
        for row in self.rows:
            cell = current.get(row["key"])
            if cell is not None and row["grids"] != self.memberships(cell):
                row["grids"] = self.memberships(cell)
                changed = True
        if changed:
            self._write()

    def fingerprint(self, overrides: Mapping[str, Any]) -> str | None:
        model = str(overrides.get("model", DEFAULTS["model"]))
        if model not in self._fingerprints:
            self._fingerprints[model] = model_fingerprint(model)
        return self._fingerprints[model]

    def check(self) -> None:
        """Refuse cells that cannot run here, a bench folder of another bench file, and finished rows of another
        experiment (``BenchError``)."""
        self.check_clients()
        self.check_folder()
        self.check_finished()

    def check_clients(self) -> None:
        """Refuse cells without a number of clients: ``num-clients = 0`` means one per SuperNode, and a cell runs
        with none (in this process, a worker or a Ray task): it would wait ``node-wait-timeout`` and fail."""
        unset = [cell.id for cell in self.spec.cells if not cell.overrides.get("num-clients", DEFAULTS["num-clients"])]
        if unset:
            raise BenchError(
                f"{len(unset)} cell(s) (e.g. {unset[0]}) have num-clients = 0, which means one client per SuperNode; "
                "a bench cell runs without SuperNodes (it would wait node-wait-timeout for them and fail). Fix: set "
                "num-clients in the file's base (e.g. num-clients: 8, what fedrapp-sim runs by default), or "
                "--set num-clients=8"
            )

    def check_folder(self) -> None:
        """Refuse a bench folder whose ``bench.yaml`` is another bench file's (another ``name``): its rows would
        be mixed with this file's in one report."""
        stored = self.bench_dir / "bench.yaml"
        if not stored.is_file():
            return
        try:
            source = yaml.safe_load(stored.read_text())
        except yaml.YAMLError:
            source = None
        name = source.get("name") if isinstance(source, dict) else None
        if name is not None and str(name) != self.spec.name:
            raise BenchError(
                f"{self.bench_dir} holds the grid of bench file {name!r} (its bench.yaml), not of {self.spec.name!r}: "
                f"run this file into a folder of its own (--out {self.bench_dir.parent / self.spec.name}), or delete "
                f"{self.bench_dir} to start over"
            )

    def check_finished(self) -> None:
        """Refuse to add cells to rows computed with other weights or other defaults than the current ones.

        Cell identities hold only overrides, so a changed default or retrained checkpoint would otherwise
        mix two experiments in one table.
        """
        problems = []
        for row in self.rows:
            config = row["config"]
            fingerprint = row.get("model_fingerprint")
            if fingerprint is not None and fingerprint != self.fingerprint(config):
                problems.append(
                    f"{row['id']}: computed with other weights of model {config.get('model', DEFAULTS['model'])!r}"
                )
                continue
            changed = self._changed_defaults(row)
            if changed:
                problems.append(f"{row['id']}: computed with other defaults ({changed})")
        if problems:
            listing = "\n  ".join(problems[:5]) + (f"\n  ... and {len(problems) - 5} more" if len(problems) > 5 else "")
            raise BenchError(
                f"{len(problems)} finished cell(s) in {self.bench_dir} belong to another experiment:\n"
                f"  {listing}\nrun into a new --out, or delete those rows from cells.jsonl to "
                "recompute them"
            )

    @staticmethod
    def _changed_defaults(row: Mapping[str, Any]) -> str:
        """Relevant keys whose value in the row's run differs from what its overrides give now."""
        old = row.get("full_config") or {}
        try:
            now = RunConfig.from_run_config(dict(row["config"])).values
        except ConfigError as err:
            return f"its overrides are no longer valid: {err}"
        skip = irrelevant_keys(str(now["strategy"]), str(now["local-method"]))
        changed = [f"{k}: {old[k]!r} -> {now[k]!r}" for k in now if k in old and k not in skip and old[k] != now[k]]
        return ", ".join(changed)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Hold ``<bench-dir>/.lock`` (one runner per bench folder: two would overwrite each other's rows)."""
        with open(self.bench_dir / LOCK_FILE, "a+") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                raise BenchError(
                    f"{self.bench_dir} is being written by {holder}: one runner per bench folder. Wait for it to "
                    "end, or stop it (Ctrl-C, or kill -INT <pid>) and run this command again to resume"
                ) from None
            f.seek(0)
            f.truncate()
            f.write(f"python -m fedrapp_app.bench (PID {os.getpid()} on {socket.gethostname()})")
            f.flush()
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _write(self) -> None:
        write_rows(self.bench_dir, [*self.rows, *self.failed_rows.values()])

    def _finish(self, cell: Cell, result: CellResult) -> None:
        row = make_row(
            cell.key,
            cell.id,
            cell.overrides,
            self.memberships(cell),
            result.summary,
            result.rounds,
            result.domains,
            result.seconds,
        )
        row["model_fingerprint"] = self.fingerprint(cell.overrides)
        row["bench_git"] = self.git
        row.update(result.ran_on)
        self.rows.append(row)
        self.failed_rows.pop(cell.key, None)
        self._write()  # after every cell: an interruption loses at most running cells

    def _failed(self, cell: Cell, outcome: Outcome) -> None:
        self.failures[cell.id] = outcome.error or "unknown error"
        self.failed_rows[cell.key] = make_failed_row(
            cell.key, cell.id, cell.overrides, self.memberships(cell), self.failures[cell.id], outcome.details
        )
        self._write()

    def run(
        self,
        workers: int = 1,
        threads: int | None = 1,
        limit: int | None = None,
        progress: bool = True,
        executor: Executor | None = None,
    ) -> list[dict[str, Any]]:
        """Run every pending cell (at most ``limit``); return the finished rows. Failed cells get a row that says
        why and are listed in ``failures``. ``executor`` runs the cells (default: this process for ``workers``
        1, else :class:`LocalExecutor`); every check (folder, finished rows, the executor's) comes before any cell
        starts."""
        self.check()
        self.bench_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            todo = self.pending()[:limit]
            skipped = len(self.spec.cells) - len(self.pending())
            # the bar on a terminal; elsewhere (a log file, a batch job) one line per cell that ends
            bar = ProgressBar(
                total=len(todo),
                desc=f"{self.spec.name} ({skipped} done before)",
                unit="cell",
                disable=not (progress and sys.stderr.isatty()),
                dynamic_ncols=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {status}",
            )
            if executor is None:
                if workers <= 1:
                    executor = InlineExecutor(
                        self.runs_dir,
                        threads,
                        lambda cell, n: bar.show(f"{bar.status.split(';')[0]}; {cell.id} round {n}"),
                    )
                else:
                    executor = LocalExecutor(workers, self.runs_dir, threads)
            try:
                executor.check(todo)
                source = {"name": self.spec.name, **{k: v for k, v in self.spec.source.items() if k != "name"}}
                write_text_atomic(self.bench_dir / "bench.yaml", yaml.safe_dump(source, sort_keys=False))
                self.refresh_labels()
                self._run_cells(todo, executor, bar, progress)
            except BaseException:
                # Ctrl-C / SIGTERM, a refusal, or a bug here: stop the running cells now (their rows are not
                # written; they run again on resume). Finished cells already have their rows.
                executor.close(cancel=True)
                raise
            finally:
                bar.close()
            executor.close()
        return self.rows

    def _run_cells(self, todo: list[Cell], executor: Executor, bar: ProgressBar, progress: bool) -> None:
        queue = deque(todo)
        losses: Counter[str] = Counter()
        state = Progress(len(todo))

        def show(event: str | None = None) -> None:
            text = state.text(executor.capacity())
            bar.show(text)
            if event and progress:
                bar.write(f"{event} [{text}]", file=sys.stderr)

        while queue or state.running:
            while queue and len(state.running) < executor.capacity():
                cell = queue.popleft()
                executor.submit(cell)
                state.started(cell)
            show()
            for outcome in executor.poll(POLL_SECONDS):
                cell = outcome.cell
                if cell.key not in state.running:  # a second word on a cell that ended: its row is written
                    continue
                if outcome.lost is not None:
                    losses[cell.key] += 1
                    state.lost(cell)
                    if losses[cell.key] < MAX_LOSSES:
                        queue.appendleft(cell)
                        show(f"cell {cell.id} was lost ({outcome.lost}); running it again")
                        continue
                    outcome = Outcome(cell, error=f"lost {losses[cell.key]} times, last: {outcome.lost}")
                if outcome.result is not None:
                    self._finish(cell, outcome.result)
                    state.finished(cell)
                    bar.update()
                    show(
                        f"cell {cell.id} finished in {format_duration(outcome.result.seconds)}{_where(outcome.result)}"
                    )
                else:
                    self._failed(cell, outcome)
                    state.failed_one(cell)
                    bar.update()
                    show(f"cell {cell.id} failed: {self.failures[cell.id]}")
