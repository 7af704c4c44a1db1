"""``python -m fedrapp_app.bench <bench.yaml>``: run (or resume) a benchmark grid, then write its report."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from fedrapp_app.bench.grid import BenchRunner
from fedrapp_app.bench.schema import BenchError, load_bench


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``["data-dir=/data", "mu0=0.4"]`` -> ``{"data-dir": "/data", "mu0": 0.4}`` (values read as YAML scalars)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BenchError(f"--set {item!r}: expected KEY=VALUE, e.g. --set data-dir=/data/coop")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


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
    parser.add_argument("--workers", type=int, default=1, help="cells run in parallel processes (default 1)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per worker (default 1; 0 = torch's default)"
    )
    parser.add_argument("--limit", type=int, default=None, help="run at most this many pending cells")
    parser.add_argument("--dry-run", action="store_true", help="validate and list the cells, run nothing")
    parser.add_argument("--no-report", action="store_true", help="do not write the report after the grid")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.threads < 0 or (args.limit is not None and args.limit < 0):
        parser.error("--workers must be >= 1, --threads >= 0 and --limit >= 0")

    try:
        spec = load_bench(args.config, parse_assignments(args.set))
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    runner = BenchRunner(spec, args.out)
    pending = runner.pending()
    print(
        f"{spec.name}: {len(spec.cells)} cells, {len(spec.cells) - len(pending)} finished, "
        f"{len(pending)} to run -> {runner.bench_dir}"
    )
    if args.dry_run:
        for cell in pending:
            print(f"  {cell.id}: {cell.overrides}")
        return 0
    # SIGTERM (kill, a batch system) and a SIGINT the shell had set to be ignored (a background job) stop the grid
    # like Ctrl-C: the queued cells are cancelled, the workers stopped, the finished rows kept
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _interrupt)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rows = runner.run(workers=args.workers, threads=args.threads or None, limit=args.limit)
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
    if runner.failures:
        print(f"{len(runner.failures)} cell(s) failed (rerun the same command to retry them):", file=sys.stderr)
        for cell_id, reason in runner.failures.items():
            print(f"  {cell_id}: {reason[:500]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
