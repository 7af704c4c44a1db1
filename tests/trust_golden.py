"""The golden record of FedRAPP's trust option that ``tests/test_trust_switch.py`` compares against.

The record was made on commit 9c3f0c6 (the last commit with the option's sixteen ``trust-*`` knobs), running the
cells of :data:`CELLS` with the knobs of the chosen variant spelled out (:data:`CHOSEN_KNOBS`):

    git worktree add /tmp/fedrapp-9c3f0c6 9c3f0c6
    rm -r /tmp/fedrapp-9c3f0c6/fedrapp_app/testbed/model    # today's testbed model in its place
    cp -r fedrapp_app/testbed/model /tmp/fedrapp-9c3f0c6/fedrapp_app/testbed/model
    PYTHONPATH=/tmp/fedrapp-9c3f0c6 python tests/trust_golden.py old tests/data/trust_golden.json

The record was last made when the testbed model changed to the scene-caption one; the im+csc cell moved from
seed 0 to seed 2 then, because on seed 0 its memory trusts no longer moved within its 5 rounds.

``new`` instead of ``old`` runs the same cells with ``trust = true`` on the checked-out code (what the test does).
A record holds, per cell, the rows of ``rounds.jsonl`` (:func:`read_record` drops what differs between two runs
of one config: timings, hosts, process ids, which 9c3f0c6's code still writes into the record) and a SHA-256 of
each array the run's last checkpoint holds (the memories, the prompts last sent, the trusts, the probes), with
its sums for a machine whose float rounding differs. The cells run on one torch thread.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def _module(path: str, at_record: str) -> Any:
    """The module at ``path`` in today's package, else at ``at_record``, its path on 9c3f0c6 (before the package
    was layered into folders), where the record is made."""
    import importlib

    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        return importlib.import_module(at_record)


#: The record ``tests/test_trust_switch.py`` and ``benchmarks/kernel_spread.py`` compare against.
GOLDEN = Path(__file__).parent / "data" / "trust_golden.json"

#: The trust option as the last commit with its knobs spells the chosen variant (issue 15's "ZKP").
CHOSEN_KNOBS: dict[str, Any] = {
    "trust-rate": 1.0,
    "trust-memory-init": 0.0,
    "trust-memory-target": 0.275,
    "trust-memory-ramp": 0.15,
    "trust-memory-votes": 1.0,
    "trust-vote-tie": -1.0,
    "trust-peer-target": 0.15,
    "trust-memory-keep": True,
    "trust-peer-probe": True,
}

#: Small cells of the personalization setting S1 (2 shift domains, 4 clients, Dirichlet 0.5) on the shipped testbed
#: model: the +csc methods, whose trusts move within a few rounds; one with a fraction, so that absent clients keep
#: their trusts and probes.
_S1 = {
    "model": "testbed",
    "num-clients": 4,
    "testbed-samples": 1024,
    "testbed-domains": "blur:2,contrast:2",
    "dirichlet-alpha": 0.5,
    "decode-workers": 0,
}
CELLS: dict[str, dict[str, Any]] = {
    "im+csc": {**_S1, "local-method": "im", "csc": True, "num-rounds": 5, "seed": 2},
    "adaprompt+csc, fraction 0.75": {
        **_S1,
        "local-method": "adaprompt",
        "csc": True,
        "num-rounds": 6,
        "fraction": 0.75,
        "seed": 1,
    },
}


def stable_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/rounds.jsonl``; today's package also drops timings, hosts and process ids
    (``comparable_rows``, which 9c3f0c6 lacks: the test applies it to the record's rows too)."""
    results = _module("fedrapp_app.recording.results", "fedrapp_app.results")
    rows = results.read_rows(run_dir / "rounds.jsonl")
    return results.comparable_rows(rows) if hasattr(results, "comparable_rows") else rows


def read_record(path: Path = GOLDEN) -> dict[str, Any]:
    """A record as the comparisons read it: its rows without timings, hosts and process ids."""
    from fedrapp_app.recording.results import comparable_rows

    record = json.loads(Path(path).read_text())
    for cell in record["cells"].values():
        cell["rows"] = comparable_rows(cell["rows"])
    return record


def checkpoint_digests(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Every array of the run's checkpoint but its metadata (which holds a start time and a token): its SHA-256,
    and its sum and sum of magnitudes in float64 (to compare on a machine whose float rounding differs)."""
    out = {}
    with np.load(run_dir / "checkpoint.npz") as saved:
        for k in saved.files:
            if k == "meta":
                continue
            array = np.ascontiguousarray(saved[k])
            values = array.astype(np.float64)
            out[k] = {
                "sha256": hashlib.sha256(array.tobytes()).hexdigest(),
                "sum": float(values.sum()),
                "abs_sum": float(np.abs(values).sum()),
            }
    return out


def run_cell(config: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Run one cell in-process (the real ServerApp body, strategy and ClientApp); its rows and digests."""
    client_app = _module("fedrapp_app.federation.client", "fedrapp_app.client").app
    grid = _module("fedrapp_app.federation.inprocess", "fedrapp_app.inprocess").InProcessGrid
    run_server = _module("fedrapp_app.federation.server", "fedrapp_app.server").run_server

    config = {**config, "output-dir": str(out_dir), "run-name": "cell"}
    summary = run_server(grid(client_app, int(config["num-clients"]), config), config)
    run_dir = Path(summary["run_dir"])
    return {"rows": stable_rows(run_dir), "checkpoint": checkpoint_digests(run_dir)}


def record(option: dict[str, Any]) -> dict[str, Any]:
    """Every cell of :data:`CELLS` with ``option`` on top, on one torch thread (float sums over threads are
    grouped differently with more: the same code gives other last bits)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for k, (name, cell) in enumerate(CELLS.items()):
                out[name] = run_cell({**cell, "strategy": "fedrapp", **option}, Path(tmp) / str(k))
    finally:
        torch.set_num_threads(threads)
    return out


if __name__ == "__main__":
    which, path = sys.argv[1:3]
    option = CHOSEN_KNOBS if which == "old" else {"trust": True}
    Path(path).write_text(json.dumps({"commit": "9c3f0c6", "cells": record(option)}, indent=1, sort_keys=True) + "\n")
