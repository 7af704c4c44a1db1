"""``python -m fedrapp_app.bench <bench.yaml>``: run (or resume) a benchmark grid, then write its report.

Where the cells run: in this process (default), in ``--workers N`` processes of this host (each on a GPU of its own
on a GPU host), or as Ray tasks on a cluster (``--ray-address HOST:PORT``, with ``--gpus-per-cell`` and
``--cpus-per-cell``); the rows are the same, and this process writes them. ``--dry-run`` lists the cells and
estimates their cost on a class of GPU (``--gpu-type``, ``--gpus``).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from fedrapp_app.bench.estimate import CPU, GPU_CLASSES, grid_estimate, host_gpu_class
from fedrapp_app.bench.grid import BenchRunner, Executor, LocalExecutor, host_gpus, print_failures
from fedrapp_app.bench.schema import BenchError, load_bench

#: The GPU classes ``--gpu-type`` offers, beside ``cpu``.
GPU_TYPES = sorted(GPU_CLASSES)


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``["data-dir=/data", "mu0=0.4"]`` -> ``{"data-dir": "/data", "mu0": 0.4}`` (values read as YAML scalars)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BenchError(f"--set {item!r}: expected KEY=VALUE, e.g. --set data-dir=/data/coop")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def flag_problem(args: argparse.Namespace) -> str | None:
    """Why these flags do not go together (one line with the fix), or None."""
    if not args.ray_address:
        flags = (("--gpus-per-cell", args.gpus_per_cell), ("--cpus-per-cell", args.cpus_per_cell))
        given = [flag for flag, value in flags if value is not None]
        if given:
            return (
                f"{' and '.join(given)} ask Ray for resources: add --ray-address HOST:PORT (or auto), or, on this "
                "host, use --workers N (each worker gets a GPU of its own)"
            )
    elif args.workers > 1:
        return (
            "--workers is for one host; on a Ray cluster the cells run as tasks, as many at once as the cluster's "
            "resources allow (set them with --gpus-per-cell and --cpus-per-cell)"
        )
    return None


def dry_run_estimate(cells: list[Any], args: argparse.Namespace) -> str:
    """The estimate ``--dry-run`` prints: on ``--gpu-type`` (default this host's GPU; on a host without one its
    CPU; on a GPU the table does not know an h200) and ``--gpus`` (default this host's, or ``--workers``)."""
    gpus_here = host_gpus()
    gpu_type = args.gpu_type or host_gpu_class() or (CPU if not gpus_here else None)
    note = ""
    if gpu_type is None:
        gpu_type = "h200"
        note = f"\n  (this host's GPU is not in the estimate's table; --gpu-type picks one of {', '.join(GPU_TYPES)})"
    elif gpu_type == CPU and not args.gpu_type:
        note = f"\n  (this host has no GPU: the estimate is for its CPU; --gpu-type picks one: {', '.join(GPU_TYPES)})"
    gpus = args.gpus or (max(1, len(gpus_here)) if gpu_type != CPU else args.workers)
    return grid_estimate([cell.overrides for cell in cells], gpu_type, gpus) + note


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedrapp_app.bench", description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="benchmark YAML (e.g. conf/bench/testbed.yaml)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a run-config key of the file's base (repeatable), e.g. --set data-dir=/data",
    )
    parser.add_argument("--out", type=Path, default=None, help="bench directory (default: the YAML's 'output')")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="cells run at once in worker processes of this host, each on a GPU of its own on a GPU host "
        "(round-robin when there are more workers than GPUs); default 1: in this process",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per cell (default 1; 0 = torch's default)"
    )
    parser.add_argument(
        "--ray-address",
        default="",
        metavar="HOST:PORT",
        help="run the cells as Ray tasks on the Ray cluster whose head is at HOST:PORT ('auto': the one started on "
        "this host); every node needs this package, the model and the data at the same paths",
    )
    parser.add_argument(
        "--gpus-per-cell",
        type=float,
        default=None,
        help="with --ray-address: GPUs a cell asks Ray for (0.5 puts two cells on a GPU; default 1 on a cluster "
        "with GPUs when the cells' device is auto or cuda, else 0)",
    )
    parser.add_argument(
        "--cpus-per-cell",
        type=int,
        default=None,
        help="with --ray-address: CPUs a cell asks Ray for (default: --threads)",
    )
    parser.add_argument("--limit", type=int, default=None, help="run at most this many pending cells")
    parser.add_argument(
        "--dry-run", action="store_true", help="validate, list the cells and estimate their cost; run nothing"
    )
    parser.add_argument(
        "--gpu-type",
        choices=[*GPU_TYPES, CPU],
        default=None,
        help="--dry-run's estimate on this class of GPU, or 'cpu' (default: this host's GPU; its CPU on a host "
        "without one)",
    )
    parser.add_argument(
        "--gpus", type=int, default=None, help="--dry-run's estimate on this many GPUs (default: this host's, or 1)"
    )
    parser.add_argument("--no-report", action="store_true", help="do not write the report after the grid")
    args = parser.parse_args(argv)
    for flag, value, low in (
        ("--workers", args.workers, 1),
        ("--threads", args.threads, 0),
        ("--limit", args.limit, 0),
    ):
        if value is not None and value < low:
            parser.error(f"{flag} {value}: must be >= {low}")
    if args.gpus is not None and args.gpus < 1:
        parser.error("--gpus must be >= 1")
    problem = flag_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    try:
        spec = load_bench(args.config, parse_assignments(args.set))
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    runner = BenchRunner(spec, args.out)
    pending = runner.pending()
    failed = len(runner.failed_before())
    print(
        f"{spec.name}: {len(spec.cells)} cells, {len(spec.cells) - len(pending)} finished, "
        f"{len(pending)} to run{f' ({failed} failed before)' if failed else ''} -> {runner.bench_dir}"
    )
    executor: Executor | None = None
    try:
        runner.check()
        if args.ray_address:
            from fedrapp_app.bench.ray_cells import RayExecutor

            executor = RayExecutor(
                args.ray_address, runner.runs_dir, args.threads or None, args.gpus_per_cell, args.cpus_per_cell
            )
        elif args.workers > 1:
            executor = LocalExecutor(args.workers, runner.runs_dir, args.threads or None)
        if executor is not None:
            executor.check(pending[: args.limit])
            print(f"cells run as {executor.description}")
            if getattr(executor, "note", None):
                print(f"note: {executor.note}")
    except BenchError as err:
        if executor is not None:
            executor.close()
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        for cell in pending:
            print(f"  {cell.id}: {cell.overrides}")
        if pending:
            print(dry_run_estimate(pending, args))
        if executor is not None:
            executor.close()
        return 0
    # SIGTERM (kill, a batch system) and a SIGINT the shell had set to be ignored (a background job) stop the grid
    # like Ctrl-C: the queued cells are cancelled, the workers stopped, the finished rows kept
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _interrupt)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rows = runner.run(workers=args.workers, threads=args.threads or None, limit=args.limit, executor=executor)
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {len(runner.rows)} cells have rows; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if not args.no_report and rows:
        from fedrapp_app.bench.report import write_report

        print(f"report: {write_report(runner.bench_dir)}")
    return print_failures(
        runner.failures, f"{len(runner.failures)} cell(s) failed (rerun the same command to retry them):"
    )


if __name__ == "__main__":
    sys.exit(main())
