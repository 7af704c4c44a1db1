"""Flower's share of a round: per-round wall time minus the clients' own compute, in simulation and deployment.

    python benchmarks/framework_overhead.py simulation            # fedrapp-sim (flwr run, Ray), 2 clients
    python benchmarks/framework_overhead.py deployment            # SuperLink + 2 SuperNodes on loopback
    python benchmarks/framework_overhead.py deployment --exec-poll 0.1   # SuperExec polls every 0.1 s
    python benchmarks/framework_overhead.py imports               # cost of a fresh ClientApp process

Every run: the shipped testbed model (``model=testbed``; a tiny random CLIP when it is absent), 2 clients
with one CPU each (they compute concurrently), batch 64, AdaPrompt, FedRAPP, ``--rounds`` rounds. The
round's wall time is the server's (configure -> replies -> aggregate, from its progress line); a client's
compute is its reply's ``t-total`` (set-up incl. model load, data, adaptation). Overhead of a round =
wall - max over clients of ``t-total``. The reply metrics also say whether the process loaded the model
(``model-loaded``) and which process served it (``pid``): in simulation a Ray actor keeps the model from
round 1 on; in deployment each message gets a new ClientApp process, which imports torch/transformers and
loads the model again (``t-setup``), and Flower's polling adds waits (SuperNode: 3 s when idle, SuperExec:
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, 1 s by default; the ServerApp's grid: 3 s between pulls).

Starts Flower processes (a SuperLink, SuperNodes) and stops them by process group when done.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import load_average  # noqa: E402

ROUND_LINE = re.compile(r"round (\d+) \|.*\| ([\d.]+)s\s*$")


def run_config(model: str, out_dir: Path, rounds: int, clients: int) -> dict:
    return {
        "model": model,
        "num-clients": clients,
        "num-rounds": rounds,
        "batch-size": 64,
        "testbed-samples": 64 * clients * (rounds + 1),
        "partition": "iid",
        "output-dir": str(out_dir),
        "run-name": "run",
        "node-wait-timeout": 120.0,
    }


def model_source(tmp: Path) -> str:
    """The shipped testbed model, else a tiny random CLIP written to ``tmp`` (the testbed's class names)."""
    from fedrapp_app.engine.loading import _TESTBED_FOLDER

    if (_TESTBED_FOLDER / "model.safetensors").is_file():
        return "testbed"
    from fedrapp_app.testbed import world
    from fedrapp_app.testbed.tiny import make_tiny_clip

    return str(make_tiny_clip(tmp / "tiny", world.CLASSNAMES))


def round_table(stdout: str, run_dir: Path) -> list[dict]:
    """Per round: server wall time (progress line) and the clients' timings (rounds.jsonl)."""
    walls = {int(m.group(1)): float(m.group(2)) for m in map(ROUND_LINE.search, stdout.splitlines()) if m}
    rows = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    table = []
    for number in sorted(walls):
        clients = [r["client_metrics"] for r in rows if r["round"] == number and r["status"] == "ok"]
        compute = max(c["t-total"] for c in clients)
        table.append(
            {
                "round": number,
                "wall": walls[number],
                "client_max_t_total": compute,
                "overhead": walls[number] - compute,
                "t_setup": [round(c["t-setup"], 3) for c in clients],
                "t_adapt": [round(c["t-adapt"], 3) for c in clients],
                "model_loaded": [int(c["model-loaded"]) for c in clients],
                "pids": [int(c["pid"]) for c in clients],
            }
        )
    return table


def simulation(args: argparse.Namespace, tmp: Path) -> tuple[list[dict], str]:
    from fedrapp_app.running.launch import toml_value

    config = run_config(model_source(tmp), tmp / "out", args.rounds, args.clients)
    overrides = " ".join(f"{k}={toml_value(v)}" for k, v in config.items())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedrapp_app.running.launch",
            str(ROOT),
            "--flwr-home",
            str(tmp / "home"),
            "-c",
            overrides,
            "--cpus-per-client",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"fedrapp-sim failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return round_table(done.stdout + done.stderr, tmp / "out" / "run"), "simulation (Ray, 1 CPU per client)"


def deployment(args: argparse.Namespace, tmp: Path) -> tuple[list[dict], str]:
    from fedrapp_app.running.launch import (
        contained_env,
        free_port,
        run_status,
        stop_process_group,
        toml_value,
        wait_healthy,
        write_connection,
    )

    env = contained_env(tmp / "home")
    node_env = dict(env, OMP_NUM_THREADS="1")  # one core per client, as in the simulation
    if args.exec_poll is not None:
        node_env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(args.exec_poll)
    neutral = tmp / "cwd"
    neutral.mkdir()
    processes: list[subprocess.Popen] = []

    def start(command: list[str], environment: dict) -> subprocess.Popen:
        log = open(tmp / f"proc{len(processes)}.log", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            command, cwd=neutral, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        processes.append(process)
        return process

    config = run_config(model_source(tmp), tmp / "out", args.rounds, args.clients)
    port = free_port()
    try:
        link = start(
            [
                "flower-superlink",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env,
        )
        wait_healthy(port, link)
        for client in range(args.clients):
            start(
                [
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"client-id={client}",
                ],
                node_env,
            )
        write_connection(env, "loopback", f"127.0.0.1:{port}")
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in config.items())
        done = subprocess.run(
            ["flwr", "run", str(ROOT), "loopback", "--stream", "-c", overrides],
            cwd=neutral,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        status = run_status(env, neutral, "loopback")
        if status.get("status") != "finished:completed":
            raise RuntimeError(f"the run ended as {status}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    finally:
        for process in reversed(processes):
            stop_process_group(process)
    poll = f"SuperExec poll {args.exec_poll} s" if args.exec_poll is not None else "default polling"
    return round_table(done.stdout + done.stderr, tmp / "out" / "run"), f"deployment on loopback ({poll})"


def imports(args: argparse.Namespace) -> None:
    """Median wall time of a fresh interpreter importing what a ClientApp process imports."""
    statements = {
        "python (bare interpreter)": "pass",
        "flwr.clientapp": "import flwr.clientapp",
        "torch": "import torch",
        "torch + transformers CLIPModel": "import torch; from transformers import CLIPModel",
        "fedrapp_app.federation.client (the ClientApp)": "import fedrapp_app.federation.client",
    }
    print(f"fresh-process import cost, median of {args.repeats}; load {load_average():.2f}")
    for label, statement in statements.items():
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", statement], check=True)
            times.append(time.perf_counter() - start)
        print(f"  {label:38s} {statistics.median(times):6.2f} s")
    print(f"load after: {load_average():.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["simulation", "deployment", "imports"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument(
        "--exec-poll",
        type=float,
        default=None,
        help="deployment: FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the SuperNodes (seconds)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="imports: fresh processes per statement")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.mode == "imports":
        imports(args)
        return
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="fedrapp-overhead-") as folder:
        table, label = (simulation if args.mode == "simulation" else deployment)(args, Path(folder))
    print(f"{label}: {args.clients} clients, batch 64, AdaPrompt + FedRAPP; load {load:.2f} -> {load_average():.2f}")
    print(
        f"{'round':>5} {'wall s':>8} {'client max t-total':>19} {'overhead s':>11}  t-setup per client   "
        f"model-loaded  pids"
    )
    for row in table:
        print(
            f"{row['round']:>5} {row['wall']:>8.2f} {row['client_max_t_total']:>19.2f} {row['overhead']:>11.2f}  "
            f"{str(row['t_setup']):20s} {str(row['model_loaded']):13s} {row['pids']}"
        )
    later = [row["overhead"] for row in table[1:]]
    if later:
        print(
            f"rounds 2+: median overhead {statistics.median(later):.2f} s, median wall "
            f"{statistics.median(row['wall'] for row in table[1:]):.2f} s"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"mode": args.mode, "label": label, "load_before": load, "load_after": load_average(), "rounds": table},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
