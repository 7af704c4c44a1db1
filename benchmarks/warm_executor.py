"""Deployment rounds on loopback: Flower's stock executor against fedrapp-superexec (warm workers).

    python benchmarks/warm_executor.py rounds --nodes 2 --rounds 8 --json warm_executor_2nodes.json
    python benchmarks/warm_executor.py rounds --nodes 8 --rounds 6 --json warm_executor_8nodes.json
    python benchmarks/warm_executor.py rounds --nodes 2 --rounds 8 --executor all --json warm_executor_pull_2nodes.json
    python benchmarks/warm_executor.py rounds --nodes 8 --rounds 6 --executor pull --json warm_executor_pull_8nodes.json
    python benchmarks/warm_executor.py memory --rounds 100 --json warm_executor_memory.json
    python benchmarks/warm_executor.py coldstart --json warm_executor_coldstart.json

``rounds``: one SuperLink and N SuperNodes (insecure loopback), the same small FedRAPP run (the shipped
testbed model, AdaPrompt + FedRAPP, IID, one CPU thread per client) once with each executor. Per round:

* ``wall``: the server's time for the round (its progress line);
* ``client``: the longest client ``t-total`` (set-up incl. model load, data, adaptation);
* ``own`` (warm only, exact): per node, from the executor's stats, the time from the SuperNode creating the
  task to the worker reporting it done, minus the ClientApp's own call: polling for the task, pulling it,
  loading the app (first task), pushing the reply. The round's ``own`` is the largest over nodes.
  ``download`` is the part of a worker's pull spent waiting for the SuperNode to download the message from
  the SuperLink (the SuperNode creates the task before it has the message; a fresh process arrives seconds
  later and never waits): Flower's transfer, inside ``own``; ``own_max_without_download`` leaves it out;
* ``flower`` (warm): ``wall - client - own``: what is left is Flower's: the SuperNode's 3 s idle poll
  before it takes the message, its 0.5 s wait for the reply, the transfers, and the ServerApp's pull for
  replies (every 0.2 s, ``federation/exchange.py``; Flower's own grid pulls every 3 s, ``warm-3s-pull``).
  A round's wall is therefore at least the SuperNode's 3 s.

The stock executor cannot be instrumented from outside; its per-message cost shows in ``wall - client``
(medians over rounds 2+, so the random poll phases average out) and, independent of load, in the CPU time
of each node's process tree per message (``cpu_per_message``: the SuperNode, its SuperExec and every
ClientApp process; warm: the SuperNode, fedrapp-superexec, its worker server and workers).

``--executor all`` adds the warm executor with the ServerApp pulling replies every 3 s, as Flower's own
``send_and_receive`` does (``FEDRAPP_PULL_SECONDS=3``; ours pulls every 0.2 s on the deployment grid,
``federation/exchange.py``), and checks that every run wrote the same rows; ``pull`` runs those two alone.

``memory``: one warm node for many rounds; the worker's resident memory after every task.
``coldstart``: what a stock message's fresh process pays before the app computes, phase by phase, with the
on-disk partition cache empty and filled (wall and CPU seconds, median of ``--repeats`` processes).

Every timing is printed with the 1-minute load average (min / mean / max while it ran): this machine's
cores are shared. Starts Flower processes and stops them by process group (``fedrapp_app.deploy.loopback``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import load_average  # noqa: E402

from fedrapp_app.deploy.loopback import Loopback  # noqa: E402
from fedrapp_app.running.processes import stat_fields  # noqa: E402

ROUND_LINE = re.compile(r"round (\d+) \|.*\| ([\d.]+)s\s*$")
TICKS = os.sysconf("SC_CLK_TCK")


# -- measuring ----------------------------------------------------------------------------------------


class LoadSampler:
    """The 1-minute load average, sampled every ``period`` seconds in a thread while a block runs."""

    def __init__(self, period: float = 2.0) -> None:
        self.period = period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(load_average())
            self._stop.wait(self.period)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(load_average())

    def summary(self) -> dict[str, float]:
        return {
            "min": round(min(self.samples), 2),
            "mean": round(statistics.fmean(self.samples), 2),
            "max": round(max(self.samples), 2),
        }


def _proc_stats() -> dict[int, tuple[int, float, float]]:
    """pid -> (parent pid, own CPU seconds, CPU seconds of its reaped children), for every readable process."""
    table = {}
    for entry in Path("/proc").iterdir():
        fields = stat_fields(entry.name) if entry.name.isdigit() else None
        if fields is None:
            continue
        # after the command: state, ppid, ..., utime (11), stime (12), cutime (13), cstime (14), 0-based
        table[int(entry.name)] = (
            int(fields[1]),
            (int(fields[11]) + int(fields[12])) / TICKS,
            (int(fields[13]) + int(fields[14])) / TICKS,
        )
    return table


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds used so far by the processes below ``roots`` (them included), live, zombie or reaped.

    A process that ended and was reaped counts through its parent's children time; one not yet reaped still
    has its own entry. Neither is counted twice.
    """
    table = _proc_stats()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        total += table[pid][1] + table[pid][2]
        todo += children.get(pid, [])
    return total


def own_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` itself (its threads, not its children)."""
    return _proc_stats()[pid][1]


def node_roots(fed: Loopback, client: int) -> list[int]:
    names = [f"supernode{client}", f"executor{client}"]
    return [fed.processes[n].pid for n in names if n in fed.processes]


def settle(fed: Loopback, quiet: float = 0.5, timeout: float = 180.0) -> None:
    """Wait until the nodes' processes stop using CPU (the executors' worker servers finished importing)."""
    roots = [pid for client in range(fed.nodes) for pid in node_roots(fed, client)]
    deadline, before = time.monotonic() + timeout, tree_cpu(roots)
    while time.monotonic() < deadline:
        time.sleep(2.0)
        now = tree_cpu(roots)
        if now - before < quiet:
            return
        before = now


# -- a loopback run -----------------------------------------------------------------------------------


def run_config(out_dir: Path, nodes: int, rounds: int, batch: int) -> dict[str, Any]:
    return {
        "model": "testbed",
        "num-clients": nodes,
        "num-rounds": rounds,
        "batch-size": batch,
        "testbed-samples": batch * nodes * (rounds + 1),
        "partition": "iid",
        "decode-workers": 0,
        "output-dir": str(out_dir),
        "run-name": "run",
        "node-wait-timeout": 300.0,
    }


def loopback_run(executor: str, nodes: int, rounds: int, batch: int, folder: Path) -> dict[str, Any]:
    """One run with ``executor`` ('stock' or 'warm'); the raw material of ``round_table``."""
    node_env = {"OMP_NUM_THREADS": "1", "FEDRAPP_PARTITION_CACHE": str(folder / "partitions")}
    config = run_config(folder / "out", nodes, rounds, batch)
    with Loopback(folder / "fed", nodes, executor, node_env=node_env) as fed:  # type: ignore[arg-type]
        settle(fed)
        supernodes = [fed.processes[f"supernode{c}"].pid for c in range(nodes)]
        cpu_before = [tree_cpu(node_roots(fed, c)) for c in range(nodes)]
        supernode_before = [own_cpu(pid) for pid in supernodes]
        with LoadSampler() as load:
            output, status, seconds = fed.run(ROOT, config, timeout=3600)
        time.sleep(5.0)  # the last ClientApp processes finish their teardown (stock)
        cpu = [tree_cpu(node_roots(fed, c)) - before for c, before in enumerate(cpu_before)]
        supernode_cpu = [own_cpu(pid) - before for pid, before in zip(supernodes, supernode_before, strict=True)]
        stats = {}
        if executor == "warm":
            stats = {c: [json.loads(x) for x in fed.stats_path(c).read_text().splitlines()] for c in range(nodes)}
    if status.get("status") != "finished:completed":
        raise RuntimeError(f"the {executor} run ended as {status.get('status')}:\n{output[-3000:]}")
    rows = [json.loads(line) for line in (folder / "out" / "run" / "rounds.jsonl").read_text().splitlines()]
    walls = {int(m.group(1)): float(m.group(2)) for m in map(ROUND_LINE.search, output.splitlines()) if m}
    return {
        "executor": executor,
        "walls": walls,
        "rows": rows,
        "stats": stats,
        "cpu_per_node": cpu,
        "supernode_cpu_per_node": supernode_cpu,
        "status": status,
        "seconds": seconds,
        "load": load.summary(),
    }


def round_table(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per round: wall, client compute, wall - client; warm: our own overhead (max, median over nodes) and
    Flower's remainder. A node's stats hold its discovery query first, then one train task per round."""
    table = []
    for number, wall in sorted(raw["walls"].items()):
        clients = {r["client"]: r["client_metrics"] for r in raw["rows"] if r["round"] == number}
        compute = max(m["t-total"] for m in clients.values())
        row: dict[str, Any] = {
            "round": number,
            "wall": wall,
            "client": round(compute, 3),
            "wall_minus_client": round(wall - compute, 3),
            "setup_max": round(max(m["t-setup"] for m in clients.values()), 3),
            "model_loaded": sum(int(m["model-loaded"]) for m in clients.values()),
        }
        if raw["stats"]:
            tasks = [raw["stats"][c][number] for c in clients]
            own = [t["own_seconds"] for t in tasks]
            # the part of a worker's pull spent waiting for the SuperNode to download the message objects
            # from the SuperLink (it creates the task before it has them): Flower's transfer, not ours
            download = [t["seconds"].get("pull-objects", 0.0) for t in tasks]
            row["own_max"] = round(max(own), 3)
            row["own_median"] = round(statistics.median(own), 3)
            row["own_max_without_download"] = round(max(o - d for o, d in zip(own, download, strict=True)), 3)
            row["download_max"] = round(max(download), 3)
            row["flower"] = round(wall - compute - max(own), 3)
        table.append(row)
    return table


def summarize(raw: dict[str, Any], table: list[dict[str, Any]]) -> dict[str, Any]:
    later = table[1:]
    messages = len(table) + 1  # the discovery query, then one train message per round
    summary: dict[str, Any] = {
        "rounds_2plus_median_wall": statistics.median(r["wall"] for r in later),
        "rounds_2plus_median_client": statistics.median(r["client"] for r in later),
        "rounds_2plus_median_wall_minus_client": statistics.median(r["wall_minus_client"] for r in later),
        "cpu_per_message": round(statistics.fmean(raw["cpu_per_node"]) / messages, 3),
        # the SuperNode process alone (its polling and Runtime API), the same program under both executors
        "supernode_cpu_per_message": round(statistics.fmean(raw["supernode_cpu_per_node"]) / messages, 3),
        "flower_clientapp_seconds_per_message": round(
            raw["status"]["compute-time"]["clientapp-seconds"] / (messages * len(raw["cpu_per_node"])), 3
        ),
    }
    if raw["stats"]:
        tasks = [s for node in raw["stats"].values() for s in node[2:]]  # rounds 2+
        summary.update(
            rounds_2plus_own_median=statistics.median(r["own_median"] for r in later),
            rounds_2plus_own_max=max(r["own_max"] for r in later),
            rounds_2plus_own_max_without_download=max(r["own_max_without_download"] for r in later),
            rounds_2plus_flower_median=statistics.median(r["flower"] for r in later),
            app_cpu_per_message=round(statistics.fmean(s["cpu_app_seconds"] for s in tasks), 3),
            worker_rss_mib_last=round(max(node[-1]["rss_bytes"] for node in raw["stats"].values()) / 2**20, 1),
        )
    return summary


def print_run(raw: dict[str, Any], table: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    load = raw["load"]
    print(
        f"\n{raw['executor']} executor, {len(raw['cpu_per_node'])} SuperNodes: load {load['min']}-{load['max']} "
        f"(mean {load['mean']}), run {raw['seconds']:.0f} s"
    )
    header = f"{'round':>5} {'wall':>7} {'client':>7} {'wall-cl':>8} {'setup':>6} {'loaded':>6}"
    print(header + (f" {'own max':>8} {'own med':>8} {'download':>8} {'flower':>7}" if raw["stats"] else ""))
    for row in table:
        line = (
            f"{row['round']:>5} {row['wall']:>7.2f} {row['client']:>7.2f} {row['wall_minus_client']:>8.2f} "
            f"{row['setup_max']:>6.2f} {row['model_loaded']:>6}"
        )
        if raw["stats"]:
            line += f" {row['own_max']:>8.2f} {row['own_median']:>8.2f} {row['download_max']:>8.2f}"
            line += f" {row['flower']:>7.2f}"
        print(line)
    for key, value in summary.items():
        print(f"  {key}: {value}")


#: ``--executor`` -> the runs it makes: (name, executor, the ServerApp's pull interval for replies or None for
#: ours, ``federation.exchange.PULL_SECONDS``). ``warm-3s-pull``: the warm executor with the ServerApp pulling
#: every 3 s, as Flower's own ``send_and_receive`` does (the product before issue 37).
VARIANTS = {
    "stock": [("stock", "stock", None)],
    "warm": [("warm", "warm", None)],
    "both": [("stock", "stock", None), ("warm", "warm", None)],
    "all": [("stock", "stock", None), ("warm-3s-pull", "warm", "3"), ("warm", "warm", None)],
    "pull": [("warm-3s-pull", "warm", "3"), ("warm", "warm", None)],
}


def rounds_mode(args: argparse.Namespace) -> dict[str, Any]:
    from fedrapp_app.federation.exchange import PULL_SECONDS_ENV
    from fedrapp_app.recording.results import comparable_rows

    results: dict[str, Any] = {"nodes": args.nodes, "rounds": args.rounds, "batch": args.batch, "runs": {}}
    rows: dict[str, list] = {}
    for name, executor, pull in VARIANTS[args.executor]:
        os.environ.pop(PULL_SECONDS_ENV, None)
        if pull is not None:  # the SuperLink's environment, so the ServerApp process it starts
            os.environ[PULL_SECONDS_ENV] = pull
        with tempfile.TemporaryDirectory(prefix=f"fedrapp-{executor}-") as folder:
            raw = loopback_run(executor, args.nodes, args.rounds, args.batch, Path(folder))
        os.environ.pop(PULL_SECONDS_ENV, None)
        raw["executor"] = name
        rows[name] = comparable_rows(raw["rows"])
        table = round_table(raw)
        summary = summarize(raw, table)
        print_run(raw, table, summary)
        results["runs"][name] = {
            "load": raw["load"],
            "seconds": raw["seconds"],
            "table": table,
            "summary": summary,
            "cpu_per_node": raw["cpu_per_node"],
            "supernode_cpu_per_node": raw["supernode_cpu_per_node"],
            "compute_time": raw["status"]["compute-time"],
            "stats": raw["stats"],
        }
    runs = results["runs"]
    results["rows_identical"] = all(r == next(iter(rows.values())) for r in rows.values())
    print(f"\nrows identical across the runs (timings, pids, node ids left out): {results['rows_identical']}")
    if {"stock", "warm"} <= set(runs):
        # Flower's polls are the same in both runs; the stock run's own overhead is what its wall - client
        # exceeds the warm run's polls by (an estimate: two runs, medians over rounds 2+).
        stock, warm = runs["stock"]["summary"], runs["warm"]["summary"]
        results["stock_own_estimate"] = round(
            stock["rounds_2plus_median_wall_minus_client"] - warm["rounds_2plus_flower_median"], 3
        )
        results["cpu_per_message_stock_over_warm"] = round(stock["cpu_per_message"] / warm["cpu_per_message"], 2)
        print(f"\nstock own overhead per round (estimate): {results['stock_own_estimate']} s")
    return results


# -- memory over many rounds --------------------------------------------------------------------------


def memory_mode(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fedrapp-memory-") as folder:
        raw = loopback_run("warm", args.nodes, args.rounds, args.batch, Path(folder))
    series = {c: [s["rss_bytes"] / 2**20 for s in node] for c, node in raw["stats"].items()}
    result: dict[str, Any] = {"nodes": args.nodes, "rounds": args.rounds, "load": raw["load"], "per_node": {}}
    print(f"warm worker RSS over {args.rounds} rounds, load {raw['load']}")
    for client, rss in series.items():
        pids = {s["worker_pid"] for s in raw["stats"][client]}
        trains = rss[1:]  # after the query, one value per round
        tail = trains[len(trains) // 10 :]  # from round ~10 on: after the first rounds' caches fill
        slope = statistics.linear_regression(range(len(tail)), tail).slope if len(tail) > 1 else 0.0
        entry = {
            "workers": len(pids),
            "after_query_mib": round(rss[0], 1),
            "round_1_mib": round(trains[0], 1),
            "round_10_mib": round(trains[min(9, len(trains) - 1)], 1),
            "last_mib": round(trains[-1], 1),
            "max_mib": round(max(trains), 1),
            "slope_mib_per_100_rounds": round(100 * slope, 2),
            "series_mib": [round(x, 1) for x in rss],
        }
        result["per_node"][client] = entry
        print(f"  node {client}: " + ", ".join(f"{k} {v}" for k, v in entry.items() if k != "series_mib"))
    return result


# -- the cold start of a stock message ----------------------------------------------------------------

COLD_PHASES = """
import json, sys, time
mark = [time.perf_counter(), time.process_time()]
phases = {}
def phase(name):
    global mark
    now = [time.perf_counter(), time.process_time()]
    phases[name] = {"wall": now[0] - mark[0], "cpu": now[1] - mark[1]}
    mark = now
import flwr.clientapp
phase("import flwr")
import fedrapp_app.federation.client as client
phase("import fedrapp_app.federation.client (torch, transformers)")
from fedrapp_app.config import RunConfig
config = RunConfig.from_run_config(json.loads(sys.argv[1]))
stream = client.build_client_stream(config.data_spec(), 0)
phase("build the stream")
pclip = client.ClientSetup(config, 0, stream, False).prompted()
phase("load the model + class-name buffers")
print(json.dumps(phases))
"""


def coldstart_mode(args: argparse.Namespace) -> dict[str, Any]:
    config = json.dumps({"testbed-samples": 64 * 8 * 10, "num-clients": 8, "batch-size": 64})
    result: dict[str, Any] = {"repeats": args.repeats, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="fedrapp-cold-") as folder, LoadSampler() as load:
        for case in ("cache empty", "cache filled"):
            runs = []
            for _ in range(args.repeats):
                cache = Path(folder) / ("empty-" + str(len(runs)) if case == "cache empty" else "filled")
                env = {**os.environ, "FEDRAPP_PARTITION_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
                if case == "cache filled" and not cache.exists():  # fill it once, untimed
                    subprocess.run(
                        [sys.executable, "-c", COLD_PHASES, config], env=env, check=True, capture_output=True
                    )
                done = subprocess.run(
                    [sys.executable, "-c", COLD_PHASES, config], env=env, check=True, capture_output=True, text=True
                )
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            result["cases"][case] = {
                name: {key: round(statistics.median(r[name][key] for r in runs), 3) for key in ("wall", "cpu")}
                for name in runs[0]
            }
    result["load"] = load.summary()
    print(f"fresh-process phases of a stock message, median of {args.repeats}; load {result['load']}")
    for case, phases in result["cases"].items():
        print(f"  {case}:")
        for name, values in phases.items():
            print(f"    {name:50s} wall {values['wall']:6.2f} s  cpu {values['cpu']:6.2f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["rounds", "memory", "coldstart"])
    parser.add_argument("--nodes", type=int, default=None, help="SuperNodes (rounds: 2; memory: 1)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (rounds: 8; memory: 100)")
    parser.add_argument("--batch", type=int, default=None, help="test samples per client and round (32; memory 16)")
    parser.add_argument(
        "--executor", choices=list(VARIANTS), default="both", help="all: stock, warm-3s-pull, warm; pull: the last two"
    )
    parser.add_argument("--repeats", type=int, default=3, help="coldstart: fresh processes per case")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    memory = args.mode == "memory"
    args.nodes = args.nodes or (1 if memory else 2)
    args.rounds = args.rounds or (100 if memory else 8)
    args.batch = args.batch or (16 if memory else 32)
    started = load_average()
    result = {"rounds": rounds_mode, "memory": memory_mode, "coldstart": coldstart_mode}[args.mode](args)
    result.update(mode=args.mode, load_before=started, load_after=load_average(), command=" ".join(sys.argv))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
