"""What flwr run's packing of the app costs, from the app folder itself and from fedrapp-sim's staged copy.

    python benchmarks/fab_packing.py            # this checkout (with whatever outputs/ holds)
    python benchmarks/fab_packing.py --app DIR

``flwr run <folder>`` builds the FAB with ``flwr.cli.build.build_fab_from_disk``, which walks every file under
the folder before it drops what ``.gitignore`` and Flower's rules exclude. fedrapp-sim gives it a scratch copy
(``running/stage.py``) holding only the files it packs. Both are timed here (median of ``--repeats``, after one
warm-up each, so both read from the page cache), with the number of files under the folder, and the two FABs
are compared byte for byte.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from flwr.cli.build import build_fab_from_disk  # noqa: E402

from fedrapp_app.running.stage import stage_app  # noqa: E402


def median_seconds(work, repeats: int):
    work()  # warm-up: the file system's caches, Flower's imports
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", type=Path, default=ROOT)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    app = args.app.resolve()
    files = sum(len(names) for _, _, names in os.walk(app))
    direct, fab = median_seconds(lambda: build_fab_from_disk(app), args.repeats)

    def staged():
        with tempfile.TemporaryDirectory(prefix="fedrapp-stage-") as scratch:
            return build_fab_from_disk(stage_app(app, Path(scratch) / "app"))

    via_stage, fab_staged = median_seconds(staged, args.repeats)
    print(f"app folder {app}: {files} files under it; FAB {len(fab)} bytes")
    print(f"flwr run's packing of the folder:        {direct:.2f} s (median of {args.repeats})")
    print(f"fedrapp-sim's staged copy, then packing:  {via_stage:.2f} s")
    print(f"the same FAB, byte for byte: {fab == fab_staged}")
    return 0 if fab == fab_staged else 1


if __name__ == "__main__":
    sys.exit(main())
