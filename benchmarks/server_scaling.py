"""Time every server rule against the number of clients and fit the growth exponent.

    python benchmarks/server_scaling.py       # N = 10, 100, 1000; d = 3 blocks × 5 × 512 (package installed)
    python benchmarks/server_scaling.py --clients 10 100 --repeats 5 --json scaling.json

Every client replies (the worst case: every pairwise term is live). The domain oracle gets 4 domains
(client i in domain i mod 4, as the testbed assigns them). A round's cost is dominated by [N, d] x [d, N]-sized
matrix products (cosines, distances, then the mix of memories), so expect an exponent between 1 (d-bound,
small N) and 2 (N²·d, large N). The goal: 1000 clients in under 1 s on 2 cores.

Reported per rule and N: the median wall time of ``--repeats`` calls (and the best, the least noisy
statistic on a shared machine), the median process CPU time (all threads: other processes inflate wall
time but hardly the CPU time the rule needs), and the load average when the measurement started.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from fedrapp_app.aggregation import BUILT_IN, DomainOracleParams, find_rule, synthetic_round

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import load_average, wait_for_quiet  # noqa: E402

DOMAINS = 4
#: The built-in rules, timed (not FedRAPP's trust option: without its clients' reports it has nothing to read).
RULES = {name: find_rule(name).target for name in BUILT_IN if name != "fedrapp-trust"}


def time_rule(name: str, kw: dict, repeats: int) -> dict[str, float]:
    """Median and best wall time, and median process CPU time, of ``repeats`` calls (one untimed warm-up)."""
    params = (
        DomainOracleParams(groups=tuple(np.arange(len(kw["replied"])) % DOMAINS)) if name == "domain-oracle" else None
    )
    RULES[name](**kw, params=params)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        RULES[name](**kw, params=params)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"median": statistics.median(wall), "best": min(wall), "cpu": statistics.median(cpu)}


def growth_exponent(clients: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(time) against log(N)."""
    return float(np.polyfit(np.log(clients), np.log(seconds), 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--dim", type=int, default=3 * 5 * 512, help="flattened prompt size d")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-load", type=float, default=1.5, help="wait for a 1-minute load below this")
    parser.add_argument("--patience", type=float, default=0.0, help="seconds to wait for that load")
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = wait_for_quiet(args.max_load, args.patience)
    print(f"d = {args.dim}, every client replies, median of {args.repeats}, {cores} cores, load {load:.2f}")
    table: dict[str, dict[int, dict[str, float]]] = {name: {} for name in RULES}
    for n in args.clients:
        kw = synthetic_round(rng, n, args.dim, reply_prob=1.0)
        for name in RULES:
            table[name][n] = time_rule(name, kw, args.repeats)
    print(f"load after: {load_average():.2f}")
    for label, stat in (("median wall s", "median"), ("best wall s", "best"), ("median CPU s (all threads)", "cpu")):
        print(f"{label:<28}" + "".join(f"N={n:<9d}" for n in args.clients) + "exponent")
        for name, row in table.items():
            times = [row[n][stat] for n in args.clients]
            exponent = growth_exponent(args.clients, times) if len(times) > 1 else float("nan")
            print(f"  {name:<26}" + "".join(f"{t:<11.4f}" for t in times) + f"{exponent:.2f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"dim": args.dim, "cores": cores, "load_before": load, "load_after": load_average(), "table": table},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
