"""Large federations in Flower's simulation engine: time and memory of `fedrapp-sim` with N simulated clients.

For each N, one `fedrapp-sim` run on the offline testbed (N clients x `--samples-per-client` samples, IID, a
batch of `--batch-size`, `--rounds` rounds), measured from outside:

- wall time of the whole command, and from the run's files: the time to discover the nodes, each round's wall
  time, the server's own time per round (configure, validate, rule, rows: the round minus the wait for
  replies), the rule's time, and the checkpoint writes;
- peak resident memory (sum over processes, sampled every 0.5 s) of the simulation process (it hosts the
  ServerApp and Flower's simulation driver), of the client actors, and of Ray's own processes.

The processes of a run are found by a mark in their environment (as `fedrapp-sim` finds them to stop them).
`--row-bytes` only measures what one FedRAPP round writes to rounds.jsonl for N clients, with every positive
peer weight in each row (as before) and with a row's 32 largest (now): no simulation, seconds.

    python benchmarks/large_federation.py --clients 100 300 1000 --json docs/results/raw/large_federation.json
    python benchmarks/large_federation.py --clients 10 100 300 1000 --row-bytes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "FEDRAPP_BENCH_MARK"


def _category(cmdline: str) -> str:
    if "flwr-simulation" in cmdline:
        return "simulation"
    if "ClientAppActor" in cmdline or "ray::" in cmdline or "default_worker.py" in cmdline:
        return "client actors"
    if any(name in cmdline for name in ("raylet", "gcs_server", "ray/dashboard", "log_monitor", "ray/_private")):
        return "ray system"
    if "flower-superlink" in cmdline or "flower-superexec" in cmdline:
        return "superlink"
    return "other"


def sample_memory(mark: str) -> dict[str, float]:
    """MiB of resident memory per process category, over the processes carrying ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    totals: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            rss_pages = int((entry / "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        category = _category(cmdline)
        totals[category] = totals.get(category, 0.0) + rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    return totals


class PeakMemory(threading.Thread):
    """Samples ``sample_memory`` until stopped; keeps each category's peak and the peak of the total."""

    def __init__(self, mark: str, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.mark, self.every = mark, every
        self.peaks: dict[str, float] = {}
        self.peak_total = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            now = sample_memory(self.mark)
            for category, mib in now.items():
                self.peaks[category] = max(self.peaks.get(category, 0.0), mib)
            self.peak_total = max(self.peak_total, sum(now.values()))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_one(clients: int, per_client: int, batch: int, rounds: int, workdir: Path) -> dict:
    """One fedrapp-sim run with ``clients`` clients; its timings and peak memory."""
    mark = uuid.uuid4().hex
    overrides = (
        f"num-clients={clients} testbed-samples={clients * per_client} partition='iid' batch-size={batch} "
        f"num-rounds={rounds} output-dir='{workdir}' run-name='n{clients}' node-wait-timeout=1800.0 "
        "round-timeout=3600.0"
    )
    command = [sys.executable, "-m", "fedrapp_app.running.launch", str(ROOT), "--flwr-home", str(workdir / "flwr-home")]
    command += ["-c", overrides]
    memory = PeakMemory(mark)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    memory.start()
    done = subprocess.run(command, env={**os.environ, MARK: mark}, capture_output=True, text=True)
    wall = time.perf_counter() - started
    memory.stop()
    if done.returncode != 0:
        raise RuntimeError(f"N={clients}: fedrapp-sim exited {done.returncode}:\n{done.stderr[-3000:]}")
    run_dir = workdir / f"n{clients}"
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    per_round = {}
    for row in rows:
        per_round.setdefault(row["round"], row)
    return {
        "clients": clients,
        "samples": summary["samples"],
        "command_wall_s": wall,
        "run_s": summary["seconds"],
        "before_round_1_s": wall - summary["seconds"] + summary["setup_seconds"],
        "discovery_s": summary["discovery_seconds"],
        "rounds": [
            {
                "round": r,
                "wall_s": row["round_seconds"],
                "server_s": row["server_seconds"],
                "rule_s": row["aggregate_seconds"],
                "clients": sum(1 for x in rows if x["round"] == r),
            }
            for r, row in sorted(per_round.items())
        ],
        "checkpoint_s": summary["checkpoint_seconds"],
        "rounds_jsonl_mib": (run_dir / "rounds.jsonl").stat().st_size / 2**20,
        "peak_mib": memory.peaks,
        "peak_total_mib": memory.peak_total,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "complete": summary["complete"],
    }


def row_bytes(clients: int, dim: int = 3 * 5 * 512, seed: int = 0) -> tuple[int, int]:
    """Bytes of the peer weights one FedRAPP round (every client replying) writes into rounds.jsonl: every
    positive weight per row, and the rows' ``MAX_ROW_PEERS`` largest plus the rest (``server.top_peers``)."""
    import numpy as np

    from fedrapp_app.aggregation import make_rule, synthetic_round
    from fedrapp_app.federation.server import top_peers

    kw = synthetic_round(np.random.default_rng(seed), clients, dim, reply_prob=1.0)
    weights = make_rule("fedrapp", {})(**kw).diagnostics.peer_weights
    every = sum(len(json.dumps({int(j): float(w) for j, w in enumerate(row) if w > 0})) for row in weights)
    kept = 0
    for row in weights:
        peers, rest = top_peers(row)
        kept += len(json.dumps(peers)) + (len(json.dumps({"peer_weights_rest": rest})) if rest else 0)
    return every, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--samples-per-client", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--row-bytes", action="store_true", help="only the size of the peer weights per round")
    args = parser.parse_args()
    if args.row_bytes:
        for clients in args.clients:
            every, kept = row_bytes(clients)
            print(f"N={clients}: peer weights per round {every / 2**20:.2f} MiB with every peer, "
                  f"{kept / 2**20:.3f} MiB with the 32 largest per row")  # fmt: skip
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="fedrapp-large-") as tmp:
        for clients in args.clients:
            result = run_one(clients, args.samples_per_client, args.batch_size, args.rounds, Path(tmp))
            results.append(result)
            rounds = ", ".join(
                f"r{r['round']}: {r['wall_s']:.1f} s wall / {r['server_s']:.2f} s server / {r['rule_s']:.3f} s rule"
                for r in result["rounds"]
            )
            peaks = ", ".join(f"{k} {v:.0f}" for k, v in sorted(result["peak_mib"].items()))
            print(
                f"N={clients}: {result['command_wall_s']:.0f} s in all, {result['before_round_1_s']:.1f} s before "
                f"round 1 (discovery {result['discovery_s']:.1f} s); {rounds}; checkpoints "
                f"{result['checkpoint_s']:.2f} s; rounds.jsonl {result['rounds_jsonl_mib']:.1f} MiB; peak MiB: "
                f"{peaks} (total {result['peak_total_mib']:.0f}); load {result['load_before']:.1f}"
                f"->{result['load_after']:.1f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
