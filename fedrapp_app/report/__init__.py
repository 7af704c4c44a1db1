"""Run reports: ``fedrapp-report RUN_DIR [RUN_DIR ...] [--out DIR]`` turns run folders into a page and figures.

From the run files only (``config.json``, ``rounds.jsonl``, ``summary.json``; no model, no data):

- ``runs.py``    reading and checking a run folder (``load_run``, ``RunError``);
- ``tables.py``  the numbers: per-client accuracy and statuses, peer-weight matrices, signals, wall time,
  config differences, paired comparisons;
- ``figures.py`` the figures (the run at a glance, accuracy, statuses, peers, comparisons);
- ``page.py``    ``report.md`` for one run or a comparison of several (``write_report``);
- ``cli.py``     the command line.
"""

from fedrapp_app.report.cli import main
from fedrapp_app.report.page import write_report
from fedrapp_app.report.runs import Run, RunError, load_run

__all__ = ["Run", "RunError", "load_run", "main", "write_report"]
