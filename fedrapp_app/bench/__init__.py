"""The benchmark: a grid of run configs through the real Flower app in-process, and reports from its rows.

``python -m fedrapp_app.bench conf/bench/testbed.yaml`` runs (or resumes) a grid;
``python -m fedrapp_app.bench.report <bench-dir>`` redraws its tables and figures from ``cells.jsonl``.
"""

from fedrapp_app.bench.grid import BenchRunner, CellResult, run_cell
from fedrapp_app.bench.rows import read_rows, write_rows
from fedrapp_app.bench.schema import BenchError, BenchSpec, Cell, identity, identity_key, load_bench, parse_bench

__all__ = [
    "BenchError",
    "BenchRunner",
    "BenchSpec",
    "Cell",
    "CellResult",
    "identity",
    "identity_key",
    "load_bench",
    "parse_bench",
    "read_rows",
    "run_cell",
    "write_rows",
]
