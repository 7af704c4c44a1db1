"""``fedrapp-report RUN_DIR [RUN_DIR ...] [--out DIR] [--outcomes DIR ...]`` (also ``python -m fedrapp_app.report``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedrapp_app.report.runs import RunError

_DESCRIPTION = """\
Report of a FedRAPP run from its files alone (config.json, rounds.jsonl, summary.json; no model, no data):
report.md with online accuracy per round and per client, what happened to every client, who learns from
whom (rules with peer weights), FedRAPP's r/mu/gamma, wall time, the config that differs from the
defaults and the provenance, plus PNG figures. An interrupted run (no summary.json yet) is reported as
far as it got, marked incomplete.

With several RUN_DIRs: one comparison page (accuracy curves overlaid, per-client differences to the
first run, the config keys the runs differ in beyond the server rule) and each run's own report under
OUT/runs/<name>/."""

_OUT_HELP = (
    "where to write. Default with one RUN_DIR: RUN_DIR/report. Default with several: a folder "
    "compare-<what differs>-vs-... in the folder that holds the RUN_DIRs (shortened with a hash when long)"
)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, write the report, print its path; 2 (and one line on stderr) on bad input."""
    parser = argparse.ArgumentParser(prog="fedrapp-report", description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="a run folder (output-dir/run-name)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR", help=_OUT_HELP)
    parser.add_argument(
        "--outcomes", type=Path, action="append", default=[], metavar="DIR",
        help="a dp run: a folder with the outcome files its clients kept on another host (their state folder, "
        "copied here); repeat for each host. The run folder's own client-state/ is always read",
    )  # fmt: skip
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.outcomes if not d.is_dir()]
    if missing:
        print(f"fedrapp-report: error: --outcomes {missing[0]}: no such folder", file=sys.stderr)
        return 2
    from fedrapp_app.report.page import write_report  # matplotlib loads only once the arguments are fine

    try:
        print(write_report(args.run_dirs, args.out, args.outcomes))
    except RunError as err:
        print(f"fedrapp-report: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"fedrapp-report: error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0
