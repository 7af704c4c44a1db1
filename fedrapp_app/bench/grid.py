"""The grid runner: every pending cell through the real ServerApp body, strategy and ClientApp, in-process.

Each cell is ``run_server(InProcessGrid(client_app, num-clients, config), config)``, exactly what
``flwr run`` executes, writing its run folder to ``<bench-dir>/runs/<cell>``. After each cell its row is
added to ``<bench-dir>/cells.jsonl`` (atomically); cells whose identity key already has a row are skipped,
and a cell that was cut short continues from its last checkpointed round, so an interrupted grid resumes
where it stopped. ``workers > 1`` runs cells in parallel processes (each
with ``threads`` torch threads).
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from fedrapp_app.bench.rows import make_row, read_rows, write_rows, write_text_atomic
from fedrapp_app.bench.schema import BenchError, BenchSpec, Cell, irrelevant_keys
from fedrapp_app.config import DEFAULTS, ConfigError, RunConfig
from fedrapp_app.results import git_state

log = logging.getLogger("fedrapp.bench")

RUNS_DIR = "runs"


@dataclass(frozen=True)
class CellResult:
    """What a finished cell hands back to the process that writes the rows."""

    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    domains: list[str | None]
    seconds: float


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


def quiet_flower() -> None:
    """Keep Flower's per-round INFO lines out of the progress bar (warnings still show)."""
    for name in ("flwr", "flwr.fedrapp", "fedrapp"):
        logging.getLogger(name).setLevel(logging.WARNING)


def set_threads(threads: int | None) -> None:
    """Torch intra-op threads of this process (None keeps torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def run_cell(
    overrides: Mapping[str, Any],
    cell_id: str,
    runs_dir: Path,
    on_round: Callable[[int, Any], None] | None = None,
) -> CellResult:
    """Run one cell in this process, in ``runs_dir/cell_id``.

    A cell cut short (its run folder holds a server checkpoint) resumes after its last finished round
    (``resume = true``: the same results as an uninterrupted run); a checkpoint of a run with other
    settings is overwritten by a fresh run.
    """
    from fedrapp_app.checkpoint import SERVER_FILE
    from fedrapp_app.client import app as client_app
    from fedrapp_app.config import RunConfig
    from fedrapp_app.data import client_domains
    from fedrapp_app.inprocess import InProcessGrid
    from fedrapp_app.server import run_server

    resume = (Path(runs_dir) / cell_id / SERVER_FILE).is_file()
    config = {**overrides, "output-dir": str(runs_dir), "run-name": cell_id, "resume": resume}
    validated = RunConfig.from_run_config(config)
    start = time.perf_counter()
    grid = InProcessGrid(client_app, int(validated["num-clients"]), config)
    try:
        summary = run_server(grid, config, on_round=on_round)
    except ConfigError as err:  # the config was valid above: the checkpoint is of another run
        if not resume:
            raise
        log.warning("cell %s: its checkpoint cannot be resumed (%s); running it from the start", cell_id, err)
        config["resume"] = False
        grid = InProcessGrid(client_app, int(validated["num-clients"]), config)
        summary = run_server(grid, config, on_round=on_round)
    seconds = time.perf_counter() - start
    run_dir = Path(summary["run_dir"])
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines() if line]
    return CellResult(summary, rounds, client_domains(validated.data_spec()), seconds)


def _worker_init(threads: int | None) -> None:
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


class BenchRunner:
    """Runs the pending cells of a :class:`BenchSpec` into ``bench_dir`` and keeps ``cells.jsonl`` current."""

    def __init__(self, spec: BenchSpec, bench_dir: str | Path | None = None) -> None:
        self.spec = spec
        self.bench_dir = Path(bench_dir or spec.output).expanduser().resolve()
        self.runs_dir = self.bench_dir / RUNS_DIR
        self.rows = read_rows(self.bench_dir)
        self.failures: dict[str, str] = {}
        self._fingerprints: dict[str, str | None] = {}
        # The code a long grid runs is the code it started with, whatever HEAD says later.
        self.git = git_state(Path(__file__).resolve().parent)

    def memberships(self, cell: Cell) -> dict[str, Any]:
        return {m.grid: m.to_json(self.spec.oracles) for m in cell.memberships}

    def pending(self) -> list[Cell]:
        """Cells without a row, in the file's order."""
        done = {row["key"] for row in self.rows}
        return [cell for cell in self.spec.cells if cell.key not in done]

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
            write_rows(self.bench_dir, self.rows)

    def fingerprint(self, overrides: Mapping[str, Any]) -> str | None:
        model = str(overrides.get("model", DEFAULTS["model"]))
        if model not in self._fingerprints:
            self._fingerprints[model] = model_fingerprint(model)
        return self._fingerprints[model]

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
        self.rows.append(row)
        write_rows(self.bench_dir, self.rows)  # after every cell: an interruption loses at most running cells

    def run(
        self, workers: int = 1, threads: int | None = 1, limit: int | None = None, progress: bool = True
    ) -> list[dict[str, Any]]:
        """Run every pending cell (at most ``limit``); return all rows. Failed cells are listed in ``failures``."""
        self.check_finished()
        self.bench_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.bench_dir / "bench.yaml", yaml.safe_dump(self.spec.source, sort_keys=False))
        self.refresh_labels()
        todo = self.pending()[:limit]
        skipped = len(self.spec.cells) - len(self.pending())
        bar = tqdm(
            total=len(todo),
            desc=f"{self.spec.name} ({skipped} done before)",
            unit="cell",
            disable=not progress,
            dynamic_ncols=True,
        )
        try:
            if workers <= 1:
                self._run_serial(todo, threads, bar)
            else:
                self._run_parallel(todo, workers, threads, bar)
        finally:
            bar.close()
        return self.rows

    def _run_serial(self, todo: list[Cell], threads: int | None, bar: tqdm) -> None:
        quiet_flower()
        set_threads(threads)
        for cell in todo:
            bar.set_postfix_str(cell.id)

            def on_round(round_number: int, strategy: Any, cell: Cell = cell) -> None:
                bar.set_postfix_str(f"{cell.id} round {round_number}")

            try:
                result = run_cell(cell.overrides, cell.id, self.runs_dir, on_round)
            except Exception as err:  # noqa: BLE001 - one broken cell must not lose the others
                self._failed(cell, err)
            else:
                self._finish(cell, result)
            bar.update()

    def _run_parallel(self, todo: list[Cell], workers: int, threads: int | None, bar: tqdm) -> None:
        # spawn: a fresh interpreter per worker (fork after torch has started threads is unsafe)
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init, initargs=(threads,))
        try:
            running: dict[Future, Cell] = {
                pool.submit(_run_in_worker, dict(c.overrides), c.id, str(self.runs_dir)): c for c in todo
            }
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    cell = running.pop(future)
                    try:
                        self._finish(cell, future.result())
                    except Exception as err:  # noqa: BLE001
                        self._failed(cell, err)
                    bar.set_postfix_str(cell.id)
                    bar.update()
        except BaseException:
            # Ctrl-C / SIGTERM (or a bug here): leaving the pool's ``with`` would wait for every queued cell to
            # run; cancel them and stop the workers now. Finished cells already have their rows.
            stop_pool(pool)
            raise
        pool.shutdown()

    def _failed(self, cell: Cell, err: BaseException) -> None:
        self.failures[cell.id] = f"{type(err).__name__}: {err}"
        log.error("cell %s failed: %s", cell.id, self.failures[cell.id])
