"""What an upload reveals: an honest-but-curious server's attacks on the uploads, without and with client-level
differential privacy, scored against the offline testbed's truth.

For each local method and privacy budget ε it runs the federation (FedRAPP, the default setting: 8 clients in 4
shift domains, Dirichlet 0.1 label skew) on the target seeds and on shadow seeds, keeps every update the server
receives, and scores the attacks of ``fedrapp_app/privacy/leakage.py``: which clients share a domain (pair AUC,
chance 0.5), each client's domain from a classifier trained on the shadow runs (accuracy, chance 1/4), and, with a
class-specific context, a client's three most frequent classes (precision, chance 3/30). A fourth attack reads only
the clear fields of the server's rows (no update): a domain name where a row carries one, else a nearest-centroid
classifier on every number a row carries beside the upload (accuracies, counts, entropies, timings), trained on the
shadow runs (domain accuracy, chance 1/4).

    python benchmarks/upload_leakage.py                         # seeds 0-2, shadow 100-102, eps 1 2 4 8 inf
    python benchmarks/upload_leakage.py --epsilons inf 8 --methods im+csc --out /tmp/leak.json
    python benchmarks/upload_leakage.py --epsilons inf 8 --methods adaprompt --num-rounds 4   # the clear fields

The noise is seeded (FEDRAPP_DP_SEED) so that the numbers can be reproduced; prints a markdown table and writes the
raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

BASE = {
    "model": "testbed",
    "dataset": "testbed",
    "num-clients": 8,
    "testbed-samples": 5120,
    "partition": "dirichlet",
    "dirichlet-alpha": 0.1,
    "testbed-domains": "gaussian_noise:1,blur:2,contrast:2,color_cast:2",
    "strategy": "fedrapp",
}
METHODS = {"adaprompt": {"local-method": "adaprompt"}, "im+csc": {"local-method": "im", "csc": True}}


def run_and_capture(overrides: dict, out: Path) -> dict:
    """Run one federation in this process; every client's updates [T_i, d] as the server received them, the shapes
    of the prompt's blocks, each client's domain and its samples per class."""
    from fedrapp_app.config import RunConfig
    from fedrapp_app.data import cached_source, client_domains, client_partitions
    from fedrapp_app.engine import reuse
    from fedrapp_app.federation.client import app as client_app
    from fedrapp_app.federation.inprocess import InProcessGrid
    from fedrapp_app.federation.server import run_server

    config = {**overrides, "output-dir": str(out), "run-name": f"run-{time.time_ns()}"}
    validated = RunConfig.from_run_config(config)
    updates: dict[int, list[np.ndarray]] = {}
    previous: dict[str, np.ndarray] = {}

    def capture(round_number: int, strategy) -> None:
        sent = previous.get("sent", np.tile(strategy.p0.astype(np.float32), (strategy.num_clients, 1)))
        for row in strategy.last_report.rows:
            if row.upload is not None:
                updates.setdefault(row.client_id, []).append(row.upload.prompt - sent[row.client_id])
        previous["sent"] = strategy.state.sent.copy()
        previous["shapes"] = strategy.shapes

    with reuse.on(1024):
        summary = run_server(InProcessGrid(client_app, validated.num_clients, config), config, on_round=capture)
    rounds = Path(summary["run_dir"]) / "rounds.jsonl"  # the server's own view (under dp: no client outcome)
    server_rows = [json.loads(line) for line in rounds.read_text().splitlines() if line.strip()]
    spec = validated.data_spec()
    labels = cached_source(spec).labels()
    classes = int(labels.max()) + 1
    counts = [np.bincount(labels[part], minlength=classes) for part in client_partitions(spec)]
    domains = client_domains(spec)
    index = {d: i for i, d in enumerate(dict.fromkeys(domains))}
    clients = sorted(updates)
    return {
        "updates": [np.stack(updates[c]) for c in clients],
        "clear": [[r for r in server_rows if r["client"] == c and r["status"] == "ok"] for c in clients],
        "index": index,
        "groups": [index[domains[c]] for c in clients],
        "counts": [counts[c] for c in clients],
        "shapes": previous["shapes"],
    }


#: Row fields that are the protocol's own (who, when, what status), not something a client reported.
PROTOCOL_FIELDS = {"client", "node", "round", "status", "dp_epsilon"}


def clear_numbers(rows: list[dict]) -> dict[str, float]:
    """Every number a client's rows carry beside its upload, averaged over its rounds: ``{field: mean}``."""
    values: dict[str, list[float]] = {}
    for row in rows:
        flat = {**{k: v for k, v in row.items() if k not in PROTOCOL_FIELDS},
                **{f"m.{k}": v for k, v in row.get("client_metrics", {}).items()}}  # fmt: skip
        for key, value in flat.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                values.setdefault(key, []).append(float(value))
    return {k: float(np.mean(v)) for k, v in values.items()}


def clear_field_guess(target: dict, shadows: list[dict]) -> np.ndarray:
    """Each target client's domain from its rows' clear fields alone: the domain a row names, else the nearest
    centroid of the shadow clients' standardised clear numbers."""
    from fedrapp_app.privacy.leakage import nearest_centroid

    keys = sorted({k for run in (target, *shadows) for rows in run["clear"] for k in clear_numbers(rows)})

    def features(run: dict) -> np.ndarray:
        return np.array([[clear_numbers(rows).get(k, 0.0) for k in keys] for rows in run["clear"]]).reshape(
            len(run["clear"]), len(keys)
        )

    train = np.concatenate([features(s) for s in shadows])
    mean, std = train.mean(axis=0), train.std(axis=0) + 1e-12
    groups = np.concatenate([s["groups"] for s in shadows])
    guessed = nearest_centroid((train - mean) / std, groups, (features(target) - mean) / std)
    for i, rows in enumerate(target["clear"]):
        named = {r["domain"] for r in rows if r.get("domain") in target["index"]}
        if len(named) == 1:
            guessed[i] = target["index"][named.pop()]
    return guessed


def attacks(target: dict, shadows: list[dict], csc: bool) -> dict:
    """The three attacks' scores on one target run, the classifier trained on the shadow runs."""
    from fedrapp_app.privacy.leakage import directions, dominant_class_precision, nearest_centroid, pair_auc

    own = directions(target["updates"])
    train = np.concatenate([directions(s["updates"]) for s in shadows])
    train_groups = np.concatenate([s["groups"] for s in shadows])
    guessed = nearest_centroid(train, train_groups, own)
    out = {
        "pair_auc": pair_auc(own, target["groups"]),
        "domain_accuracy": float(np.mean(guessed == np.asarray(target["groups"]))),
        "clear_domain_accuracy": float(np.mean(clear_field_guess(target, shadows) == np.asarray(target["groups"]))),
    }
    if csc:
        (shape,) = target["shapes"]  # one class-specific context [C, n, D]
        per_class = [u.reshape(len(u), shape[0], -1) for u in target["updates"]]
        out["class_precision"] = dominant_class_precision(per_class, target["counts"], k=3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--shadow-seeds", type=int, nargs="+", default=[100, 101, 102])
    parser.add_argument("--epsilons", nargs="+", default=["inf", "8", "4", "2", "1"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--out", type=Path, default=Path("outputs/upload_leakage.json"))
    parser.add_argument(
        "--num-rounds", type=int, default=0, help="rounds per run (default 0: until the streams end, 16 here)"
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("FEDRAPP_DP_SEED", "upload-leakage")  # reproducible noise: an experiment, not a deployment
    work = args.out.parent / "upload_leakage_runs"
    results = []
    for method in args.methods:
        for eps_text in args.epsilons:
            epsilon = math.inf if eps_text == "inf" else float(eps_text)
            privacy = {} if math.isinf(epsilon) else {"dp": True, "dp-epsilon": epsilon}
            privacy["num-rounds"] = args.num_rounds
            runs = {}
            for seed in [*args.seeds, *args.shadow_seeds]:
                runs[seed] = run_and_capture({**BASE, **METHODS[method], **privacy, "seed": seed}, work)
                print(f"  {method} eps={eps_text} seed {seed}: captured", file=sys.stderr, flush=True)
            shadows = [runs[s] for s in args.shadow_seeds]
            for seed in args.seeds:
                scores = attacks(runs[seed], shadows, csc=method.endswith("+csc"))
                results.append({"method": method, "epsilon": eps_text, "seed": seed, **scores})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(
        "| method | epsilon | pair AUC (0.5) | domain accuracy (0.25) | top-3 class precision (0.1) "
        "| clear fields: domain accuracy (0.25) |"
    )
    print("|---|---|---|---|---|---|")
    for method in args.methods:
        for eps_text in args.epsilons:
            cell = [r for r in results if r["method"] == method and r["epsilon"] == eps_text]

            def mean(key: str, cell: list = cell) -> str:
                values = [r[key] for r in cell if key in r]
                return (
                    f"{np.mean(values):.2f} ± {np.std(values, ddof=1) if len(values) > 1 else 0:.2f}" if values else "–"
                )

            keys = ("pair_auc", "domain_accuracy", "class_precision", "clear_domain_accuracy")
            scores = " | ".join(mean(key) for key in keys)
            print(f"| {method} | {eps_text} | {scores} |")


if __name__ == "__main__":
    main()
