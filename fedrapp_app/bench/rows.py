"""The benchmark's results file: one JSON row per finished cell in ``<bench-dir>/cells.jsonl``.

A row holds everything the reports need, so they never reopen a run folder: the cell's overrides and
identity key, its labels in every grid, the run's summary numbers, per-round curves over all clients and
per-client curves (accuracy, reliability r, memory rate mu, peer share gamma, the share of the peer weight
that falls on clients of the same shift domain; with report-own-prompt also the own prompt's entropy and
accuracy, and FedRAPP's trusts), where the cell ran (``host``, ``ray_node``, ``cuda_visible_devices``), where its
rule and method came from (``components``: distribution and version, or a module's file and hash) and how many
rounds its rule failed in (``summary.rule_failures``). The
file is rewritten through a rename after each cell, so an interrupted grid leaves only whole rows behind.

A cell that failed has a row too, with ``"status": "failed"``, the reason in one line (``error``) and, where known,
the traceback (``details``), so the grid's file says what is missing and why; :func:`read_rows` leaves these
rows out unless asked (the reports never see them), and the runner runs those cells again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROWS_FILE = "cells.jsonl"
#: Per-client curves that only runs with report-own-prompt have: the own last tuned prompt's entropy and
#: accuracy on each batch, the neighbour votes for the received and the own prompt, and FedRAPP's memory and peer
#: trusts (its trust option); with its probe, the probe's entropies and accuracy.
OWN_PROMPT_KEYS = (
    "h_own",
    "acc_own",
    "v_pre",
    "v_own",
    "trust_memory",
    "trust_peers",
    "h_probe",
    "hm_probe",
    "acc_probe",
)
#: The same runs' method statistics kept as curves: curve name -> client metric (base.OwnPrompt's stats).
OWN_PROMPT_STATS = {
    "marginal_own": "stat-own_marginal_entropy",
    "marginal_received": "stat-received_marginal_entropy",
    "agreement_own": "stat-own_agreement",
}


def rows_path(bench_dir: str | Path) -> Path:
    """Where a bench directory keeps its rows."""
    return Path(bench_dir) / ROWS_FILE


def read_rows(bench_dir: str | Path, failed: bool = False) -> list[dict[str, Any]]:
    """The rows of the finished cells of ``bench_dir`` (empty when nothing finished yet); ``failed``: also the
    rows of failed cells (``"status": "failed"``)."""
    path = rows_path(bench_dir)
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number} is not a JSON row ({err}); delete that line to rerun its cell") from err
        if failed or row.get("status", "ok") != "failed":
            rows.append(row)
    return rows


def read_pooled_rows(bench_dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The rows of several bench directories together, e.g. the same grids run on other seeds, so that a report
    pools them per setting; a cell (its key) found in two directories is refused, as it would count twice."""
    rows: list[dict[str, Any]] = []
    seen: dict[str, Path] = {}
    for bench_dir in bench_dirs:
        for row in read_rows(bench_dir):
            key = str(row.get("key"))
            if key in seen:
                raise ValueError(
                    f"cell {row.get('id', key)} is in both {seen[key]} and {bench_dir}: pool directories of "
                    "different cells (e.g. other seeds), not copies of one"
                )
            seen[key] = Path(bench_dir)
            rows.append(row)
    return rows


def bench_dirs(bench_dir: str | Path | Sequence[str | Path]) -> list[Path]:
    """One bench directory or several, as a list."""
    return [Path(bench_dir)] if isinstance(bench_dir, str | Path) else [Path(d) for d in bench_dir]


def report_input(
    bench_dir: str | Path | Sequence[str | Path], out_dir: str | Path | None, default_out: str
) -> tuple[list[dict], Path]:
    """What a report module starts from: the finished rows of ``bench_dir`` (several directories: their rows
    pooled, :func:`read_pooled_rows`; ``FileNotFoundError`` when there are none) and its output folder, created
    (``out_dir``, or ``<first bench-dir>/<default_out>``)."""
    dirs = bench_dirs(bench_dir)
    rows = read_pooled_rows(dirs)
    if not rows:
        raise FileNotFoundError(f"no finished cells in {', '.join(str(rows_path(d)) for d in dirs)}")
    out = Path(out_dir) if out_dir else dirs[0] / default_out
    out.mkdir(parents=True, exist_ok=True)
    return rows, out


def write_rows(bench_dir: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Replace the rows file atomically (temporary file + rename)."""
    path = rows_path(bench_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(row, sort_keys=False) + "\n" for row in rows))
    tmp.replace(path)


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file through a rename (the reports are regenerated in place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def report_main(
    argv: list[str] | None,
    prog: str,
    doc: str,
    write: Callable[[Any, Path | None], Path],
    default_out: str,
    pool: bool = False,
) -> int:
    """The command line of a report module: ``<bench-dir> [--out DIR]``; prints the written path, 2 on bad input.
    With ``pool``, several bench directories may be given, and ``write`` gets their list."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    if pool:
        parser.add_argument(
            "bench_dir", type=Path, nargs="+", help="bench directories (hold cells.jsonl); several pool their rows"
        )
    else:
        parser.add_argument("bench_dir", type=Path, help="a bench directory (holds cells.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help=f"where to write (default: <bench-dir>/{default_out})")
    args = parser.parse_args(argv)
    try:
        print(write(args.bench_dir, args.out))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _same_domain_share(peers: Mapping[str, float], client: int, domains: Sequence[str | None]) -> float | None:
    """Share of a client's peer weight on clients of its own shift domain (None without peers or domains)."""
    total = sum(peers.values())
    if not peers or total <= 0 or domains[client] is None:
        return None
    return sum(w for j, w in peers.items() if domains[int(j)] == domains[client]) / total


def curves_from_rounds(rounds: Sequence[Mapping[str, Any]], domains: Sequence[str | None]) -> dict[str, Any]:
    """Per-round and per-client curves from a run's ``rounds.jsonl`` rows (only clients with status ok).

    Returns ``{"rounds": {round, n, correct, correct_before, clients}, "clients": {id: {...}}}``; every list
    in a block has one entry per round that block took part in.
    """
    by_round: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # n, correct, correct_before, clients
    clients: dict[int, dict[str, list]] = {}
    for row in rounds:
        if row.get("status") != "ok":
            continue
        t, c = int(row["round"]), int(row["client"])
        agg = by_round[t]
        agg[0] += row["num_examples"]
        agg[1] += row["correct"]
        agg[2] += row["correct_before"]
        agg[3] += 1
        block = clients.setdefault(
            c,
            {
                "domain": domains[c] if c < len(domains) else None,
                **{
                    k: []
                    for k in (
                        "round",
                        "n",
                        "acc",
                        "acc_before",
                        "h_pre",
                        "h_post",
                        "update_norm",
                        "r",
                        "mu",
                        "gamma",
                        "same_domain_share",
                    )
                },
            },
        )
        block["round"].append(t)
        block["n"].append(row["num_examples"])
        for key in ("acc", "acc_before", "h_pre", "h_post"):
            block[key].append(round(float(row[key]), 6))
        for key in ("update_norm", "r", "mu", "gamma"):
            value = row.get(key)
            block[key].append(None if value is None else round(float(value), 6))
        metrics = row.get("client_metrics") or {}
        extra = {key: row.get(key) for key in OWN_PROMPT_KEYS}
        extra.update({key: metrics.get(metric) for key, metric in OWN_PROMPT_STATS.items()})
        for key, value in extra.items():  # only in runs with report-own-prompt (or FedRAPP's trust option)
            if value is not None or key in block:
                block.setdefault(key, [None] * (len(block["round"]) - 1)).append(
                    None if value is None else round(float(value), 6)
                )
        share = _same_domain_share(row.get("peer_weights") or {}, c, domains)
        block["same_domain_share"].append(None if share is None else round(share, 6))
    order = sorted(by_round)
    return {
        "rounds": {
            "round": order,
            "n": [by_round[t][0] for t in order],
            "correct": [by_round[t][1] for t in order],
            "correct_before": [by_round[t][2] for t in order],
            "clients": [by_round[t][3] for t in order],
        },
        "clients": {str(c): clients[c] for c in sorted(clients)},
    }


def make_row(
    key: str,
    cell_id: str,
    overrides: Mapping[str, Any],
    grids: Mapping[str, Any],
    summary: Mapping[str, Any],
    rounds: Sequence[Mapping[str, Any]],
    domains: Sequence[str | None],
    seconds: float,
) -> dict[str, Any]:
    """The results row of one finished cell (see the module docstring)."""
    curves = curves_from_rounds(rounds, domains)
    per_client_before = [
        sum(a * n for a, n in zip(b["acc_before"], b["n"], strict=True)) / sum(b["n"])
        for b in curves["clients"].values()
        if sum(b["n"])
    ]
    return {
        "key": key,
        "id": cell_id,
        "status": "ok",
        "config": dict(overrides),
        "grids": dict(grids),
        "summary": {
            "micro_accuracy": summary["micro_accuracy"],
            "macro_accuracy": summary["macro_accuracy"],
            "micro_accuracy_received_prompt": summary["micro_accuracy_received_prompt"],
            "macro_accuracy_received_prompt": float(np.mean(per_client_before)) if per_client_before else None,
            "samples": summary["samples"],
            "rounds": summary["rounds"],
            "stopped": summary.get("stopped"),
            "ece": summary.get("ece"),
            "ece_before": summary.get("ece_before"),
            "per_domain_accuracy": summary.get("per_domain_accuracy"),
            "rule_failures": (summary.get("rule_failures") or {}).get("count", 0),
        },
        "components": summary.get("components"),
        "seconds": round(seconds, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "run_dir": summary.get("run_dir"),
        "full_config": summary.get("config"),
        "versions": summary.get("versions"),
        "git": summary.get("git"),
        **curves,
    }


def make_failed_row(
    key: str,
    cell_id: str,
    overrides: Mapping[str, Any],
    grids: Mapping[str, Any],
    error: str,
    details: str | None = None,
) -> dict[str, Any]:
    """The row of a cell that failed: its reason in one line (``error``) and its traceback (``details``)."""
    return {
        "key": key,
        "id": cell_id,
        "status": "failed",
        "config": dict(overrides),
        "grids": dict(grids),
        "error": error,
        "details": details,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
