"""Where the default run's wall time goes: each phase of ``fedrapp-sim``, beside plain ``flwr run .``.

    python benchmarks/run_phases.py                      # 3 repetitions of each, the default run
    python benchmarks/run_phases.py --repeats 5 --json docs/results/raw/run_phases.json

Each repetition is a whole process, timed from outside (the wall time a user waits):

- ``fedrapp-sim`` (the default run, results in a scratch folder): its phases from the run folder's
  ``launch.json`` (launcher start, SuperLink start, flwr run's submit, the simulation's start, the ServerApp's
  setup, SuperNode registration with Ray's start and the ClientApps' imports and loads, rounds, Flower's teardown,
  the status, the stop, the report);
- plain ``flwr run . --stream`` with Flower's defaults (its local SuperLink, started by the first repetition and
  reused by the later ones, as a user who runs twice sees it), the federation of the default run
  (``num-supernodes=8 client-resources-num-cpus=1``); its phases from outside and the run's ``summary.json``
  (flwr run to the ServerApp's start, server setup, registration, rounds, the rest to flwr run's exit).

Then min / median / max of every phase, and whether every repetition of both wrote the same rows (timings,
process and node ids left out: ``recording.results.comparable_rows``). Flower's files go to a scratch
``FLWR_HOME``; every process started is stopped by its mark (``FEDRAPP_LAUNCH_ID``) at the end. Run it on quiet
cores: it prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fedrapp_app.recording.phases import read_launch, server_marks  # noqa: E402
from fedrapp_app.recording.results import comparable_rows, git_state, read_rows  # noqa: E402
from fedrapp_app.running.processes import LAUNCH_ID_ENV, stop_marked  # noqa: E402


def environment(home: Path, mark: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(home / "flwr-home"),
        RAY_TMPDIR=str(home / "ray"),
        UV_CACHE_DIR=str(home / "uv-cache"),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env[LAUNCH_ID_ENV] = mark
    return env


def timed(command: list[str], app: Path, env: dict[str, str], log: Path) -> tuple[float, float, int]:
    """Run ``command`` in the app folder; (its start as epoch seconds, its wall seconds, its exit status)."""
    start = time.time()
    with log.open("w") as out:
        code = subprocess.run(command, cwd=app, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return start, time.time() - start, code


def only_run(out_dir: Path) -> Path:
    runs = [p for p in out_dir.iterdir() if (p / "summary.json").is_file()]
    if len(runs) != 1:
        raise SystemExit(f"expected one run folder in {out_dir}, found {len(runs)}: see the logs there")
    return runs[0]


def sim_repetition(home: Path, app: Path, env: dict[str, str], i: int) -> dict:
    out_dir = home / f"sim-{i}"
    start, wall, code = timed(["fedrapp-sim", "-c", f"output-dir='{out_dir}'"], app, env, home / f"sim-{i}.log")
    if code != 0:
        raise SystemExit(f"fedrapp-sim exited {code}: see {home / f'sim-{i}.log'}")
    run = only_run(out_dir)
    launch = read_launch(run)
    if launch is None:
        raise SystemExit(f"{run} holds no launch.json")
    phases = {p["phase"]: p["seconds"] for p in launch["phases"]}
    phases["after the launcher's last mark"] = round(max(0.0, start + wall - launch["started"] - launch["seconds"]), 3)
    phases["before this script's clock"] = round(start - launch["started"], 3)  # negative: Python started later
    return {"wall": round(wall, 3), "phases": phases, "run_dir": str(run)}


def flwr_repetition(home: Path, app: Path, env: dict[str, str], i: int) -> dict:
    out_dir = home / f"flwr-{i}"
    command = ["flwr", "run", ".", "--stream", "--federation-config", "num-supernodes=8 client-resources-num-cpus=1"]
    command += ["-c", f"output-dir='{out_dir}'"]
    start, wall, code = timed(command, app, env, home / f"flwr-{i}.log")
    if code != 0:
        raise SystemExit(f"flwr run exited {code}: see {home / f'flwr-{i}.log'}")
    run = only_run(out_dir)
    summary = json.loads((run / "summary.json").read_text())
    marks = server_marks(summary)
    phases, previous = {}, start
    names = {"simulation start": "flwr run to the ServerApp's start (SuperLink, FAB, simulation)"}
    for name, at in marks:
        phases[names.get(name, name)] = round(at - previous, 3)
        previous = at
    phases["rest, to flwr run's exit (teardown, log stream)"] = round(start + wall - previous, 3)
    return {"wall": round(wall, 3), "phases": phases, "run_dir": str(run)}


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": round(statistics.median(values), 3), "max": max(values)}


def summarise(repetitions: list[dict]) -> dict:
    names: list[str] = []
    for r in repetitions:
        names += [n for n in r["phases"] if n not in names]
    return {
        "wall": spread([r["wall"] for r in repetitions]),
        "phases": {n: spread([r["phases"].get(n, 0.0) for r in repetitions]) for n in names},
    }


def table(title: str, summary: dict) -> str:
    lines = [f"{title}", f"  {'phase':<58} {'min':>6} {'median':>7} {'max':>6}"]
    for name, s in [*summary["phases"].items(), ("WALL (outside)", summary["wall"])]:
        lines.append(f"  {name:<58} {s['min']:>6.2f} {s['median']:>7.2f} {s['max']:>6.2f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, run folders)")
    parser.add_argument(
        "--app",
        type=Path,
        default=None,
        help="the app folder both commands run in (default: a fresh clone of this checkout's HEAD, as a new user "
        "has it; a folder holding many results makes flwr run's packing slower, which fedrapp-sim avoids)",
    )
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="fedrapp-phases-"))
    app = args.app.resolve() if args.app else home / "app"
    if args.app is None:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(app)], check=True)
    mark = uuid.uuid4().hex
    env = environment(home, mark)
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {"fedrapp-sim": [], "flwr run": []}
    try:
        for i in range(args.repeats):  # interleaved: a drift in the machine's load hits both alike
            results["fedrapp-sim"].append(sim_repetition(home, app, env, i))
            print(f"fedrapp-sim {i + 1}/{args.repeats}: {results['fedrapp-sim'][-1]['wall']:.1f} s", flush=True)
            results["flwr run"].append(flwr_repetition(home, app, env, i))
            print(f"flwr run    {i + 1}/{args.repeats}: {results['flwr run'][-1]['wall']:.1f} s", flush=True)
    finally:
        stop_marked(mark)  # plain flwr run's local SuperLink stays up after the run: stop it
    reference = comparable_rows(read_rows(Path(results["fedrapp-sim"][0]["run_dir"]) / "rounds.jsonl"))
    same = all(
        comparable_rows(read_rows(Path(r["run_dir"]) / "rounds.jsonl")) == reference
        for rs in results.values()
        for r in rs
    )
    report = {
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "git": git_state(ROOT),
        "app": "a fresh clone of HEAD" if args.app is None else str(app),
        "rows_identical": same,
        "summary": {name: summarise(rs) for name, rs in results.items()},
        "repetitions": results,
    }
    print(f"\napp folder: {report['app']}; {os.cpu_count()} CPUs", end="; ")
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    for name, s in report["summary"].items():
        print(table(name, s))
    print(f"rows identical across all {2 * args.repeats} runs (timings, pids, node ids left out): {same}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"written to {args.json}")
    if not args.keep:
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    else:
        print(f"logs and runs kept in {home}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
