"""Time every server rule against the number of clients and fit the growth exponent.

    python benchmarks/server_scaling.py       # N = 10, 100, 1000; d = 3 blocks × 5 × 512 (package installed)
    python benchmarks/server_scaling.py --clients 10 100 --repeats 5 --json scaling.json

Every client replies (the worst case: every pairwise term is live). A round's cost is dominated by two
[N, d] × [d, N]-sized matrix products (cosines, then the mix of memories), so expect an exponent between
1 (d-bound, small N) and 2 (N²·d, large N). The goal: 1000 clients in under 1 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from fedrapp_app.aggregation import RULES, synthetic_round


def time_rule(name: str, kw: dict[str, np.ndarray], repeats: int) -> tuple[float, float]:
    """Best wall time and best process CPU time of ``repeats`` calls, in seconds.

    The minimum is the least noisy statistic on a shared machine; CPU time (all threads) is reported too
    because other processes inflate wall time but hardly the CPU time the rule itself needs.
    """
    wall, cpu = math.inf, math.inf
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        RULES[name](**kw)
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def growth_exponent(clients: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(time) against log(N)."""
    return float(np.polyfit(np.log(clients), np.log(seconds), 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--dim", type=int, default=3 * 5 * 512, help="flattened prompt size d")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"d = {args.dim}, every client replies, best of {args.repeats}, {cores} cores, load {load:.1f}")
    wall: dict[str, dict[int, float]] = {name: {} for name in RULES}
    cpu: dict[str, dict[int, float]] = {name: {} for name in RULES}
    for n in args.clients:
        kw = synthetic_round(rng, n, args.dim, reply_prob=1.0)
        for name in RULES:
            wall[name][n], cpu[name][n] = time_rule(name, kw, args.repeats)

    for label, table in (("wall seconds", wall), ("CPU seconds (all threads)", cpu)):
        print(f"{label:<28}" + "".join(f"N={n:<9d}" for n in args.clients) + "exponent")
        for name, row in table.items():
            times = list(row.values())
            exponent = growth_exponent(args.clients, times) if len(times) > 1 else float("nan")
            print(f"  {name:<26}" + "".join(f"{t:<11.4f}" for t in times) + f"{exponent:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"dim": args.dim, "wall": wall, "cpu": cpu}, indent=2))


if __name__ == "__main__":
    main()
