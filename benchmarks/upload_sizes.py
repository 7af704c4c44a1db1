"""What each client uploads and is sent per round, by (method, rule), from a bench grid's run folders.

Every ``ok`` row of a run's ``rounds.jsonl`` records ``upload_bytes`` (the prompt and any payload the rule read:
Latte's class prototypes) and ``download_bytes`` (the prompt, probes and any payload it was sent); this averages
them per (method, rule) over every row of every cell.

    python benchmarks/upload_sizes.py outputs/bench/latte          # a markdown table (docs/results/training-free.md)
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from fedrapp_app.bench.rows import read_rows


def sizes(bench_dir: Path) -> dict[tuple[str, str], dict[str, float]]:
    """(method, rule) -> mean upload and download bytes per client and round, and the rows counted."""
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for cell in read_rows(bench_dir):
        labels = next(iter(cell["grids"].values()))["labels"]
        key = (str(labels["method"]), str(labels["rule"]))
        for line in (Path(cell["run_dir"]) / "rounds.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row.get("status") == "ok" and "upload_bytes" in row:
                totals[key][0] += row["upload_bytes"]
                totals[key][1] += row.get("download_bytes", 0)
                totals[key][2] += 1
    return {k: {"upload": u / n, "download": d / n, "rows": n} for k, (u, d, n) in totals.items() if n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_dir", type=Path)
    args = parser.parse_args()
    print("| method | rule | upload per round (KB) | sent per round (KB) | rows |")
    print("|---|---|---|---|---|")
    for (method, rule), s in sorted(sizes(args.bench_dir).items()):
        print(f"| {method} | {rule} | {s['upload'] / 1000:.2f} | {s['download'] / 1000:.2f} | {int(s['rows'])} |")


if __name__ == "__main__":
    main()
