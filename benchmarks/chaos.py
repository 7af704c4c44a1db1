"""Chaos on loopback: kill, stop and restart SuperNodes and the SuperLink in the middle of a FedRAPP run.

    python benchmarks/chaos.py --scenario all --json chaos.json          # every scenario, ~9 min
    python benchmarks/chaos.py --scenario kill-fast --round-timeout 20    # one scenario, the stall bounded
    python benchmarks/chaos.py --scenario kill-fast --strategy none-fed   # per-position identity

A SuperLink and ``--nodes`` SuperNodes on loopback (insecure, ``fedrapp_app.deploy.loopback``; warm executor
by default), a tiny random CLIP, a run that goes on until every client's stream has ended (``num-rounds = 0``,
``--batches`` batches of 16 per client). In round ``--at-round`` the chaos strikes at the most demanding
moment: the victim (client ``--victim``) has computed its batch and saved its snapshot of the next stream
position, its reply is not delivered yet.

* ``kill-fast``: kill -9 the victim's node (its SuperNode, its executor and the ClientApp, as when a host
  dies) and start it again at once. Without authentication it comes back with a new node id while the
  SuperLink still lists the old one until it misses two heartbeats.
* ``kill-late``: the same kill; the node is started again only once the SuperLink has declared it
  unavailable (after the heartbeat window).
* ``sigterm``: SIGTERM the victim's SuperNode (its executor stays, as when a service manager restarts only
  the SuperNode) and start it again at once.
* ``superlink``: kill -9 the SuperLink (with its SuperExec and the ServerApp), start it again on the same
  ``--database`` and port, and resume the run (``resume = true``, the same ``run-name``).
* ``superlink-term``: the same with SIGTERM (a graceful stop; it is given up to two minutes to exit).
* ``superlink-crash``: kill -9 the SuperLink's own PID only (not its process group: as the OOM killer or a
  crash does); its SuperExec and ServerApp live on and must notice by themselves. The SuperLink is started
  again at once on the same ``--database`` and port and the run resumed at once; the report says when each
  orphan exited (``orphan_exit_seconds``, from the kill) and whether the resume waited for the run lock.
* ``restart-all``: SIGTERM every SuperNode at once and start them all again (a rolling upgrade done badly).

Each scenario's run is compared with an uninterrupted run of the same config (in-process: the same server
and ClientApp code; ``--baseline loopback`` runs it on loopback instead) and reports: the stall (kill to the
end of the cut round), the rows and their statuses, samples scored / unscored (``summary.json``), whether
every stream position of every client was scored exactly once, and how identical the rows are:
``identical`` (every row, field by field, ``tests/federation.py: comparable_rows``), ``prefix`` (rows
before the cut round), ``per position`` (scored rows keyed by client and stream position, round numbers
aside). What identical can mean per scenario is in docs/results/chaos.md.

Every process is stopped by process group (and launch mark) when a scenario ends. ``FLWR_HOME``,
``RAY_TMPDIR`` and ``UV_CACHE_DIR`` default to folders inside the work folder (``--folder``, else a new
temporary one).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import load_average  # noqa: E402

from fedrapp_app.deploy.loopback import Loopback, alive, run_id_of  # noqa: E402
from fedrapp_app.federation.client import app as client_app  # noqa: E402
from fedrapp_app.federation.inprocess import InProcessGrid  # noqa: E402
from fedrapp_app.federation.server import run_server  # noqa: E402
from fedrapp_app.recording.results import read_rows  # noqa: E402
from fedrapp_app.testbed import world  # noqa: E402
from fedrapp_app.testbed.tiny import make_tiny_clip  # noqa: E402

from federation import comparable_rows, small_run  # noqa: E402

#: Row fields the server rule computes (the rest of a row is the client's own outcome).
RULE_FIELDS = ("update_norm", "informative", "r", "mu", "gamma", "peer_weights", "peer_weights_rest", "trust")
SCENARIOS = ("kill-fast", "kill-late", "sigterm", "superlink", "superlink-term", "superlink-crash", "restart-all")
BATCH = 16
#: What "identical to an uninterrupted run" can mean in each scenario (docs/results/chaos.md explains it).
EXPECTED = {
    "kill-fast": "prefix; per position for none-fed (the victim misses rounds: FedRAPP's peers change)",
    "kill-late": "prefix; per position for none-fed (the victim misses rounds: FedRAPP's peers change)",
    "sigterm": "prefix; per position for none-fed (the victim misses rounds: FedRAPP's peers change)",
    "superlink": "identical (the cut round is re-run entirely from the checkpoint and the snapshots)",
    "superlink-term": "identical (the cut round is re-run entirely from the checkpoint and the snapshots)",
    "superlink-crash": "identical (the cut round is re-run entirely from the checkpoint and the snapshots)",
    "restart-all": "prefix; per position when every client missed the same round (the rule skipped it)",
}


def chaos_config(model: Path, out: Path, strategy: str, round_timeout: float, nodes: int, batches: int) -> dict:
    """The scenario's run: ``nodes`` clients with ``batches`` batches of 16 each, until every stream ends."""
    return small_run(
        model,
        out,
        **{
            "num-clients": nodes,
            "num-rounds": 0,
            "testbed-samples": BATCH * batches * nodes,
            "partition": "iid",
            "strategy": strategy,
            "node-wait-timeout": 120.0,
            "round-timeout": round_timeout,
        },
    )


def baseline_rows(config: dict, nodes: int) -> list[dict]:
    """The rows of the uninterrupted run, in-process (same ServerApp body and ClientApp; ``client-id`` as
    the SuperNodes have it), with one thread per client as the nodes have it."""
    config = {**config, "run-name": "baseline"}
    torch.set_num_threads(1)  # as the nodes run (OMP_NUM_THREADS=1): float sums depend on the thread count
    grid = InProcessGrid(client_app, nodes, config, node_configs=[{"client-id": c} for c in range(nodes)])
    run_server(grid, config)
    return read_rows(Path(config["output-dir"]) / "baseline" / "rounds.jsonl")


class Watch:
    """Polls the run folder: when each round's rows appeared, and named events, on one clock."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.start = time.monotonic()
        self.events: list[tuple[float, str]] = []
        self.round_seen: dict[int, float] = {}
        self.rows: list[dict] = []

    def now(self) -> float:
        return time.monotonic() - self.start

    def event(self, text: str) -> float:
        t = self.now()
        self.events.append((round(t, 2), text))
        print(f"  [{t:7.1f}s] {text}", flush=True)
        return t

    def poll(self) -> None:
        path = self.run_dir / "rounds.jsonl"
        if not path.is_file():
            return
        rows = read_rows(path)
        if len(rows) < len(self.rows):  # a resume rewrote the file (rows after its checkpoint dropped)
            self.rows = self.rows[: len(rows)]
        for row in rows[len(self.rows) :]:
            if row["round"] not in self.round_seen:
                self.round_seen[row["round"]] = self.now()
            reason = f" ({row['reason'][:80]})" if row.get("reason") else ""
            self.event(f"round {row['round']} client {row['client']}: {row['status']}{reason}")
        self.rows = rows

    def snapshot(self, client: int, position: int) -> bool:
        """The client has saved its snapshot of ``position`` (it finished the batch before it)."""
        return any(self.run_dir.glob(f"client-state/*/client-{client}-pos{position}.npz"))

    def until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what}")
            self.poll()
            time.sleep(0.02)
        self.poll()


def flock_holders(path: Path) -> set[int]:
    """The PIDs holding a ``flock`` on ``path``, read from /proc/locks (which takes no lock: a probe with
    ``flock`` itself could make a ServerApp that takes the lock at that moment find it busy)."""
    try:
        st = path.stat()
    except OSError:
        return set()
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields and "FLOCK" in fields and inode in fields:
            holders.add(int(fields[fields.index("FLOCK") + 3]))
    return holders


class Orphans(threading.Thread):
    """Watches the processes a crash left running (``{pid: name}``): when each exited and when none of them
    held ``lock`` (the run folder's lock file) any more, in seconds after ``since`` (a ``time.monotonic()``);
    gives up after ``timeout`` seconds."""

    def __init__(self, pids: dict[int, str], since: float, lock: Path, timeout: float = 300.0) -> None:
        super().__init__(daemon=True)
        self.pids, self.since, self.lock, self.timeout = pids, since, lock, timeout
        self.exited: dict[int, float] = {}
        self.released: float | None = None
        self.start()

    def run(self) -> None:
        while len(self.exited) < len(self.pids) and time.monotonic() - self.since < self.timeout:
            if self.released is None and not flock_holders(self.lock) & set(self.pids):
                self.released = time.monotonic() - self.since
            for pid in self.pids:
                if pid not in self.exited and not alive(pid):
                    self.exited[pid] = time.monotonic() - self.since
            time.sleep(0.05)
        if self.released is None and len(self.exited) == len(self.pids):
            self.released = max(self.exited.values())

    def seconds(self) -> dict[str, float | None]:
        """``{"<name> (<pid>)": seconds until it exited}``; None: still alive when the watch gave up."""
        return {
            f"{name} ({pid})": round(self.exited[pid], 2) if pid in self.exited else None
            for pid, name in self.pids.items()
        }


#: What the ServerApp logs when a resume finds its run folder held and waits (``fedrapp_app.recording.runlock``).
LOCK_WAIT_LINE = "waiting up to"


def run_scenario(
    scenario: str,
    folder: Path,
    model: Path,
    *,
    strategy: str = "fedrapp",
    executor: str = "warm",
    nodes: int = 2,
    batches: int = 5,
    at_round: int = 2,
    victim: int = 1,
    round_timeout: float = 900.0,
    baseline: str = "inprocess",
    timeout: float = 900.0,
) -> dict[str, Any]:
    """Run one scenario in ``folder``; the report (``summarize``) with the raw timeline."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    if not 1 <= at_round < batches:
        raise ValueError(f"--at-round must be in 1..{batches - 1} (the victim must have batches left after it)")
    folder.mkdir(parents=True, exist_ok=True)
    config = chaos_config(model, folder / "out", strategy, round_timeout, nodes, batches)
    run_dir = folder / "out" / "run"
    node_env = {"OMP_NUM_THREADS": "1", "FEDRAPP_PARTITION_CACHE": str(folder / "partitions")}
    loads = [load_average()]
    with Loopback(folder / "fed", nodes, executor, node_env=node_env, database=folder / "state.db") as fed:  # type: ignore[arg-type]
        if baseline == "loopback":
            output, status, _ = fed.run(ROOT, {**config, "run-name": "baseline"}, timeout=timeout)
            if status["status"] != "finished:completed":
                raise RuntimeError(f"the uninterrupted run failed: {output[-2000:]}")
            base = read_rows(folder / "out" / "baseline" / "rounds.jsonl")
        watch = Watch(run_dir)
        run = fed.submit(ROOT, config, folder / "run.log")
        watch.event("run submitted")
        watch.until(lambda: watch.snapshot(victim, at_round), timeout, f"client {victim}'s snapshot, round {at_round}")
        t_cut = watch.event(f"client {victim} saved its snapshot of position {at_round}: strike")
        runs = [run]
        orphans = strike(scenario, fed, watch, victim, at_round, config, folder, runs, timeout)
        watch.until(lambda: runs[-1].poll() is not None, timeout, "the run to end")
        watch.event(f"flwr run exited ({runs[-1].returncode})")
        logs = [folder / name for name in ("run.log", "run-resumed.log") if (folder / name).is_file()]
        run_ids = [run_id_of(log.read_text()) for log in logs]
        statuses = [fed.status(run_id).get("status") if run_id else "not submitted" for run_id in run_ids]
        node_ids = {c: fed.node_ids(c) for c in range(nodes)}
        if orphans is not None:
            orphans.join(timeout=max(0.0, orphans.timeout - (time.monotonic() - orphans.since)))
        leftovers = fed.stop()
    loads.append(load_average())
    if baseline != "loopback":
        base = baseline_rows(config, nodes)
    summary = json.loads((run_dir / "summary.json").read_text())
    report = summarize(scenario, watch.rows, base, summary, at_round, victim, t_cut, watch.round_seen)
    report.update(
        strategy=strategy,
        executor=executor,
        round_timeout=round_timeout,
        run_statuses=statuses,
        node_ids={c: len(ids) for c, ids in node_ids.items()},
        leftover_processes=leftovers,
        load=loads,
        events=watch.events,
    )
    if orphans is not None:
        resumed = (folder / "run-resumed.log").read_text() if (folder / "run-resumed.log").is_file() else ""
        report["orphan_exit_seconds"] = orphans.seconds()
        report["orphan_released_lock_seconds"] = None if orphans.released is None else round(orphans.released, 2)
        report["resume_waited_for_lock"] = [line.strip() for line in resumed.splitlines() if LOCK_WAIT_LINE in line]
    return report


def strike(
    scenario: str,
    fed: Loopback,
    watch: Watch,
    victim: int,
    at_round: int,
    config: dict,
    folder: Path,
    runs: list,
    timeout: float,
) -> Orphans | None:
    """Do what ``scenario`` says to the federation (the run in ``runs[-1]`` is in round ``at_round``); for
    ``superlink-crash``, the watch on the processes the kill left running."""
    if scenario in ("kill-fast", "kill-late"):
        fed.stop_node(victim, signal.SIGKILL)
        watch.event(f"kill -9 node {victim} (SuperNode, executor, ClientApp)")
        if scenario == "kill-late":

            def declared_unavailable() -> bool:
                return any(r["client"] == victim and "Node Unavailable" in r.get("reason", "") for r in watch.rows)

            watch.until(declared_unavailable, timeout, "the SuperLink to declare the node unavailable")
            watch.event("the SuperLink declared it unavailable")
        fed.start_node(victim)
        watch.event(f"node {victim} started again")
    elif scenario == "sigterm":
        fed.stop_node(victim, signal.SIGTERM, executor=False)
        watch.event(f"SIGTERM node {victim} (SuperNode exited)")
        fed.start_node(victim)
        watch.event(f"node {victim} started again")
    elif scenario == "restart-all":
        for client in range(fed.nodes):
            fed.stop_node(client, signal.SIGTERM, executor=False)
        watch.event("SIGTERM every SuperNode (all exited)")
        for client in range(fed.nodes):
            fed.start_node(client)
        watch.event("every node started again")
    elif scenario in ("superlink", "superlink-term"):
        if scenario == "superlink":
            fed.stop_superlink(signal.SIGKILL)
            watch.event("kill -9 the SuperLink (with its SuperExec and ServerApp)")
        else:
            fed.stop_superlink(signal.SIGTERM, timeout=120.0)
            watch.event("SIGTERM the SuperLink's process group: it has exited")
        runs[-1].wait(timeout=60)
        fed.start_superlink()
        watch.event("SuperLink started again on the same database and port")
        runs.append(fed.submit(ROOT, {**config, "resume": True}, folder / "run-resumed.log"))
        watch.event("resumed run submitted (resume = true, same run-name)")
    elif scenario == "superlink-crash":
        killed = time.monotonic()
        left = fed.crash_superlink()
        orphans = Orphans(left, killed, Path(config["output-dir"]) / config["run-name"] / ".lock")
        watch.event(f"kill -9 the SuperLink's PID only; left running: {left}")
        fed.start_superlink()
        watch.event("SuperLink started again on the same database and port")
        runs.append(fed.submit(ROOT, {**config, "resume": True}, folder / "run-resumed.log"))
        watch.event("resumed run submitted at once (resume = true, same run-name)")
        return orphans
    return None


def positions(rows: list[dict]) -> dict[int, list[int]]:
    """Per client, the stream positions of its scored rows, in row order."""
    out: dict[int, list[int]] = {}
    for r in rows:
        if r["status"] == "ok":
            out.setdefault(r["client"], []).append(int(r["client_metrics"]["stream-position"]))
    return out


def by_position(rows: list[dict]) -> dict[tuple[int, int], dict]:
    """Scored rows keyed by (client, stream position), the round number left out."""
    keyed = {}
    for row in comparable_rows([r for r in rows if r["status"] == "ok"]):
        key = (row["client"], row["client_metrics"]["stream-position"])
        keyed[key] = {k: v for k, v in row.items() if k != "round"}
    return keyed


def client_side(rows: list[dict]) -> list[dict]:
    """``comparable_rows`` without the server rule's diagnostics: what the client scored and reported."""
    return [{k: v for k, v in r.items() if k not in RULE_FIELDS} for r in comparable_rows(rows)]


def summarize(
    scenario: str,
    rows: list[dict],
    base: list[dict],
    summary: dict,
    at_round: int,
    victim: int,
    t_cut: float,
    round_seen: dict[int, float],
) -> dict[str, Any]:
    """The scenario's numbers: stall, statuses, accounting, identity with the uninterrupted run."""
    cut_rows = [r for r in rows if r["round"] == at_round]
    normal = [r["round_seconds"] for r in rows if r["round"] not in (1, at_round) and r["status"] == "ok"]
    want = {c: list(range(len(p))) for c, p in positions(base).items()}
    got = positions(rows)
    chaos_keyed, base_keyed = by_position(rows), by_position(base)
    same_positions = sum(chaos_keyed.get(k) == v for k, v in base_keyed.items())
    before = [r for r in rows if r["round"] < at_round]

    def survivors(of: list[dict]) -> list[dict]:
        return [r for r in of if r["round"] == at_round and r["client"] != victim]

    victim_rows = [r for r in rows if r["client"] == victim]
    back = next((r for r in victim_rows if r["round"] > at_round and r["status"] == "ok"), None)
    return {
        "scenario": scenario,
        "stall_seconds": None if scenario.startswith("superlink") else round(round_seen[at_round] - t_cut, 1),
        "cut_round_seconds": round(max((r["round_seconds"] for r in cut_rows), default=float("nan")), 1),
        "normal_round_seconds": round(statistics.median(normal), 1) if normal else None,
        "cut_round_victim": next((_outcome(r) for r in cut_rows if r["client"] == victim), None),
        "victim_back": None if back is None else _back(back),
        "rounds": max((r["round"] for r in rows), default=0),
        "baseline_rounds": max((r["round"] for r in base), default=0),
        "rows": len(rows),
        "statuses": dict(Counter(r["status"] for r in rows)),
        "samples": summary.get("samples"),
        "baseline_samples": sum(r["num_examples"] for r in base if r["status"] == "ok"),
        "complete": summary.get("complete"),
        "unscored": summary.get("unscored"),
        "stopped": summary.get("stopped"),
        "resumed_after_round": summary.get("resumed_after_round"),
        "exactly_once": got == want,
        "identical": comparable_rows(rows) == comparable_rows(base),
        "prefix_identical": comparable_rows(before) == comparable_rows([r for r in base if r["round"] < at_round]),
        "positions_identical": f"{same_positions}/{len(base_keyed)}",
        "cut_round_survivors_scored_alike": client_side(survivors(rows)) == client_side(survivors(base)),
        "expected": EXPECTED[scenario],
    }


def _back(row: dict) -> dict[str, Any]:
    """Where the victim came back: the round, its stream position, whether its method state was rebuilt."""
    metrics = row["client_metrics"]
    return {"round": row["round"], "position": metrics["stream-position"], "rebuilt": metrics.get("state-rebuilt")}


def _outcome(row: dict) -> str:
    return f"{row['status']} {row.get('reason', '')}".strip()


COLUMNS = (
    ("scenario", "scenario"),
    ("strategy", "strategy"),
    ("stall s", "stall_seconds"),
    ("cut round s", "cut_round_seconds"),
    ("normal round s", "normal_round_seconds"),
    ("rounds (uninterrupted)", None),
    ("statuses", None),
    ("scored / uninterrupted", None),
    ("complete", "complete"),
    ("exactly once", "exactly_once"),
    ("identical rows", "identical"),
    ("prefix", "prefix_identical"),
    ("per position", "positions_identical"),
)


def table(reports: list[dict[str, Any]]) -> str:
    """One markdown row per scenario."""
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in reports:
        cells = []
        for name, key in COLUMNS:
            if name.startswith("rounds"):
                cells.append(f"{r['rounds']} ({r['baseline_rounds']})")
            elif name == "statuses":
                cells.append(", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items())))
            elif name.startswith("scored"):
                cells.append(f"{r['samples']} / {r['baseline_samples']}")
            else:
                cells.append("-" if r[key] is None else str(r[key]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def contained_folder(folder: str | None) -> Path:
    """The work folder; Flower's and Ray's files go under it (short paths: Ray's socket names are limited)."""
    base = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="fr-"))
    base.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FLWR_HOME", str(base / "flwr-home"))
    os.environ.setdefault("RAY_TMPDIR", str(base / "ray"))
    os.environ.setdefault("UV_CACHE_DIR", str(base / "uv"))
    os.environ.update(FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", FLWR_TELEMETRY_ENABLED="0")
    return base


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="all", choices=(*SCENARIOS, "all"))
    parser.add_argument("--strategy", default="fedrapp", help="server rule of the run (fedrapp, none-fed, ...)")
    parser.add_argument("--executor", default="warm", choices=("warm", "stock"))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--batches", type=int, default=5, help="batches of 16 per client")
    parser.add_argument("--at-round", type=int, default=2, help="the round the chaos strikes in")
    parser.add_argument("--victim", type=int, default=1, help="the client whose node is killed")
    parser.add_argument("--round-timeout", type=float, default=900.0)
    parser.add_argument("--baseline", default="inprocess", choices=("inprocess", "loopback"))
    parser.add_argument("--folder", help="work folder (default: a new temporary one)")
    parser.add_argument("--json", help="write the reports (with their timelines) here")
    args = parser.parse_args(argv)
    base = contained_folder(args.folder)
    model = make_tiny_clip(base / "tiny-clip", world.CLASSNAMES)
    reports = []
    for scenario in SCENARIOS if args.scenario == "all" else (args.scenario,):
        print(f"== {scenario} ({args.strategy}, {args.executor} executor, round-timeout {args.round_timeout:g})")
        started = time.monotonic()
        report = run_scenario(
            scenario,
            base / scenario,
            model,
            strategy=args.strategy,
            executor=args.executor,
            nodes=args.nodes,
            batches=args.batches,
            at_round=args.at_round,
            victim=args.victim,
            round_timeout=args.round_timeout,
            baseline=args.baseline,
        )
        report["wall_seconds"] = round(time.monotonic() - started, 1)
        reports.append(report)
        keys = ("cut_round_victim", "victim_back", "stopped", "unscored", "run_statuses", "node_ids", "expected")
        extra = ("orphan_exit_seconds", "orphan_released_lock_seconds", "resume_waited_for_lock")
        keys += tuple(k for k in extra if k in report)
        print("  " + json.dumps({k: report[k] for k in keys}, default=str))
    print(table(reports))
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
