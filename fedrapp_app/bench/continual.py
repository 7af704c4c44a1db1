"""``python -m fedrapp_app.bench.continual <bench-dir>``: the rules on moving streams and changing populations.

Reads ``<bench-dir>/cells.jsonl`` of ``conf/bench/continual.yaml`` (labels ``stream``, ``rule``, ``method``) and
each cell's run folder (``summary.json``: switches, held-out accuracy, per-client accuracy; ``rounds.jsonl``:
FedRAPP's μ and peer weights), and writes ``continual.md``:

- per method, the online micro accuracy of every (stream, rule), mean ± std over seeds, with the paired gain over
  none-fed on the same streams; a gain below -0.2 points is marked (the goal the trust option is held to);
- the expected calibration error after adaptation, and before it under none-fed (what adaptation does to it);
- at the switches of the moving streams: post-switch accuracy, recovery (batches), unrecovered switches and
  forgetting;
- the late joiners' and the held-out clients' accuracy (the prompt a client never seen is sent, at work);
- FedRAPP's memory at a switch: its μ and the share of its peer weight on clients in the same domain that round,
  by batches since the client's last switch (continual streams), beside the fixed streams' values.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedrapp_app.bench.rows import report_input, report_main, write_text_atomic
from fedrapp_app.bench.stats import Stat, mean_std
from fedrapp_app.recording.results import run_rows

#: What a gain below counts as a miss against none-fed (points of accuracy, as a share).
GOAL = -0.002
Key = tuple[str, str, str]  # (method, stream, rule)


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def collect(rows: Sequence[Mapping[str, Any]]) -> dict[Key, dict[int, dict[str, Any]]]:
    """(method, stream, rule) -> seed -> the cell's numbers: ``acc``, ``ece``, ``ece_before`` and, from its run
    folder, ``summary`` (``summary.json``) and ``run_dir``."""
    out: dict[Key, dict[int, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        if row.get("status") != "ok":
            continue
        for member in row["grids"].values():
            labels = member["labels"]
            key = (str(labels["method"]), str(labels["stream"]), str(labels["rule"]))
            run_dir = Path(row["run_dir"]) if row.get("run_dir") else None
            out[key][int(row["config"]["seed"])] = {
                "acc": float(row["summary"]["micro_accuracy"]),
                "ece": row["summary"].get("ece"),
                "ece_before": row["summary"].get("ece_before"),
                "summary": (_json(run_dir / "summary.json") if run_dir else None) or {},
                "run_dir": run_dir,
            }
    return dict(out)


def _stat(values: Iterable[float | None]) -> Stat:
    return mean_std(v for v in values if v is not None and np.isfinite(v))


def gain(cells: Mapping[int, Mapping[str, Any]], reference: Mapping[int, Mapping[str, Any]] | None) -> Stat:
    """Mean ± std over the shared seeds of the accuracy minus the reference's (paired by seed)."""
    if not reference:
        return Stat(float("nan"), float("nan"), 0)
    return mean_std(cells[s]["acc"] - reference[s]["acc"] for s in sorted(set(cells) & set(reference)))


def none_fed(
    collected: Mapping[Key, Mapping[int, Mapping[str, Any]]], method: str, stream: str
) -> Mapping[int, Mapping[str, Any]] | None:
    """The none-fed cells of (method, stream): by their config's strategy (or, for summaries without a config,
    the rule label ``none-fed``)."""
    for (m, s, rule), by_seed in collected.items():
        if m == method and s == stream:
            strategy = _config(next(iter(by_seed.values()))).get("strategy")
            if strategy == "none-fed" or (strategy is None and rule == "none-fed"):
                return by_seed
    return None


def accuracy_table(collected: Mapping[Key, Mapping[int, Mapping[str, Any]]], method: str) -> str:
    """Rows: rules; columns: streams; a cell: accuracy (gain over none-fed, ✗ below the goal)."""
    streams = list(dict.fromkeys(s for m, s, _ in collected if m == method))
    rules = list(dict.fromkeys(r for m, _, r in collected if m == method))
    lines = ["| rule | " + " | ".join(streams) + " |", "|---|" + "---|" * len(streams)]
    for rule in rules:
        cells = []
        for stream in streams:
            by_seed = collected.get((method, stream, rule))
            if not by_seed:
                cells.append("–")
                continue
            text = _stat(v["acc"] for v in by_seed.values()).format()
            reference = none_fed(collected, method, stream)
            if reference is not None and reference is not by_seed:
                g = gain(by_seed, reference)
                miss = " ✗" if g.n and g.mean < GOAL else ""
                text += f" ({g.format(signed=True)}{miss})" if g.n else ""
            cells.append(text)
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibration_table(collected: Mapping[Key, Mapping[int, Mapping[str, Any]]], method: str) -> str:
    """ECE (%) after adaptation per (rule, stream), and before it under none-fed."""
    streams = list(dict.fromkeys(s for m, s, _ in collected if m == method))
    rules = list(dict.fromkeys(r for m, _, r in collected if m == method))
    lines = ["| ECE (%) | " + " | ".join(streams) + " |", "|---|" + "---|" * len(streams)]
    before = [_stat(v["ece_before"] for v in (none_fed(collected, method, s) or {}).values()) for s in streams]
    lines.append("| none-fed, before adaptation | " + " | ".join(b.format() for b in before) + " |")
    for rule in rules:
        values = [_stat(v["ece"] for v in collected.get((method, s, rule), {}).values()) for s in streams]
        lines.append(f"| {rule} | " + " | ".join(v.format() for v in values) + " |")
    return "\n".join(lines)


def _config(cell: Mapping[str, Any]) -> Mapping[str, Any]:
    """A cell's run config as its ``summary.json`` records it (empty for a summary without one)."""
    return cell["summary"].get("config") or {}


def _switched(by_seed: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether the cell's streams switched domains (its summaries say so, whatever its grid calls it)."""
    return any((v["summary"].get("switches") or {}).get("switches", 0) > 0 for v in by_seed.values())


def switch_table(collected: Mapping[Key, Mapping[int, Mapping[str, Any]]], method: str) -> str:
    """Post-switch accuracy, recovery, unrecovered switches and forgetting, per (stream, rule) of the streams whose
    clients switched domains (by their summaries, not by the streams' names), mean over seeds (unrecovered:
    summed)."""
    lines = [
        "| stream | rule | switches | post-switch acc. (%) | recovery (batches) | unrecovered | forgetting (points) |",
        "|---|---|---|---|---|---|---|",
    ]
    moving = [(k, v) for k, v in collected.items() if k[0] == method and _switched(v)]
    if not moving:
        return "No cell of this method has a client that switched domains (no moving stream in the grid)."
    for (_, stream, rule), by_seed in moving:
        switches = [v["summary"].get("switches") or {} for v in by_seed.values()]
        count = sum(s.get("switches", 0) for s in switches)
        post = _stat(s.get("post_switch_accuracy") for s in switches)
        recovery = _stat(s.get("recovery_batches") for s in switches)
        forgetting = _stat(s.get("forgetting") for s in switches)
        unrecovered = sum(s.get("unrecovered", 0) for s in switches)
        lines.append(
            f"| {stream} | {rule} | {count} | {post.format()} | {recovery.format(scale=1.0)} | {unrecovered} | "
            f"{forgetting.format(signed=True)} |"
        )
    return "\n".join(lines)


def _client_accuracy(summary: Mapping[str, Any], clients: Sequence[int]) -> float | None:
    """Micro accuracy of ``clients`` from a summary's per-client accuracy and samples."""
    acc, samples = summary.get("per_client_accuracy", {}), summary.get("per_client_samples", {})
    n = sum(samples.get(str(c), 0) for c in clients)
    return sum(acc.get(str(c), 0.0) * samples.get(str(c), 0) for c in clients) / n if n else None


def population_table(collected: Mapping[Key, Mapping[int, Mapping[str, Any]]], method: str) -> str:
    """The late joiners' accuracy (the ids just below the held-out ones) and the held-out clients', per rule, over
    the cells whose config has late or held-out clients (whatever their grid calls them)."""
    lines = ["| rule | late joiners' accuracy (%) | held-out clients' accuracy (%) |", "|---|---|---|"]
    rules = list(dict.fromkeys(r for m, _, r in collected if m == method))
    found = False
    for rule in rules:
        cells = [c for (m, _, r), by in collected.items() if m == method and r == rule for c in by.values()]
        late_acc, held_acc = [], []
        for cell in cells:
            config = _config(cell)
            n, count = int(config.get("num-clients", 0)), int(config.get("late-clients", 0))
            held = int(config.get("held-out-clients", 0))
            if count:
                late_acc.append(_client_accuracy(cell["summary"], range(n - held - count, n - held)))
            if cell["summary"].get("held_out_accuracy") is not None:
                held_acc.append(cell["summary"]["held_out_accuracy"])
        found = found or bool(late_acc or held_acc)
        lines.append(f"| {rule} | {_stat(late_acc).format()} | {_stat(held_acc).format()} |")
    if not found:
        return "No cell of this method has late or held-out clients (late-clients, held-out-clients in its config)."
    return "\n".join(lines)


def memory_at_switches(run_dirs: Iterable[Path], horizon: int = 3) -> dict[int, tuple[Stat, Stat]]:
    """Batches since a client's last switch (0 = its first batch in a new domain; ``horizon`` = that many or
    more, or no switch yet) -> (μ, the share of its peer weight on clients in the same domain that round), over
    the rows of the given FedRAPP runs; a client's first batch is left out (its memory is P0's)."""
    mus: dict[int, list[float]] = defaultdict(list)
    shares: dict[int, list[float]] = defaultdict(list)
    for run_dir in run_dirs:
        rows = [r for r in run_rows(run_dir) if r.get("status") == "ok" and "domain" in r]
        domain_at = {(r["round"], r["client"]): r["domain"] for r in rows}
        since: dict[int, int] = {}
        last: dict[int, str] = {}
        for row in sorted(rows, key=lambda r: (r["round"], r["client"])):
            c = row["client"]
            first = c not in last
            since[c] = since.get(c, horizon) + 1 if first or last[c] == row["domain"] else 0
            last[c] = row["domain"]
            if first:
                continue
            k = min(since[c], horizon)
            if row.get("mu") is not None:
                mus[k].append(float(row["mu"]))
            peers = {int(j): w for j, w in (row.get("peer_weights") or {}).items()}
            total = sum(peers.values())
            if total > 0:
                same = sum(w for j, w in peers.items() if domain_at.get((row["round"], j)) == row["domain"])
                shares[k].append(same / total)
    return {k: (mean_std(mus[k]), mean_std(shares.get(k, []))) for k in sorted(mus)}


def memory_table(collected: Mapping[Key, Mapping[int, Mapping[str, Any]]], method: str) -> str:
    """FedRAPP's μ and same-domain peer share by batches since a switch, continual vs fixed streams."""
    lines = [
        "| rule | stream | batches since the switch | μ | same-domain peer share (%) |",
        "|---|---|---|---|---|",
    ]
    fedrapp = [
        (rule, stream, by)
        for (m, stream, rule), by in collected.items()
        if m == method and any(_config(c).get("strategy") == "fedrapp" for c in by.values())
    ]
    for rule, stream, cells in fedrapp:
        config = _config(next(iter(cells.values())))
        changes = ("late-clients", "held-out-clients", "drop-rate")
        plain = config.get("shift", "fixed") == "fixed" and config.get("stream-order", "random") == "random"
        plain = plain and not any(config.get(k) for k in changes) and not _switched(cells)
        if not (plain or config.get("shift") == "continual"):
            continue
        horizon = 0 if plain else 3  # fixed streams never switch: one row
        table = memory_at_switches((c["run_dir"] for c in cells.values() if c["run_dir"]), horizon)
        for k, (mu, share) in table.items():
            since = "no switch" if plain else (f"{k}+" if k == horizon else str(k))
            lines.append(f"| {rule} | {stream} | {since} | {mu.format(scale=1.0, digits=3)} | {share.format()} |")
    if len(lines) == 2:
        return "No FedRAPP cell of this method on fixed or continual streams (strategy, shift in its config)."
    return "\n".join(lines)


def write_report(bench_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write ``continual.md`` (module docstring) and return its path."""
    rows, out = report_input(bench_dir, out_dir, "continual")
    collected = collect(rows)
    if not collected:
        raise ValueError(f"{bench_dir}: no finished cell has 'method', 'stream' and 'rule' labels")
    seeds = sorted({s for by in collected.values() for s in by})
    parts = [
        "# Moving streams and changing populations (generated)",
        "",
        f"Written by `python -m fedrapp_app.bench.continual {bench_dir}`. Online micro accuracy (%), mean ± std "
        f"over seeds {seeds}; in brackets the gain over none-fed on the same streams, paired by seed; ✗ marks a "
        "gain below -0.2 points.",
        "",
    ]
    for method in dict.fromkeys(m for m, _, _ in collected):
        parts += [
            f"## {method}",
            "",
            "### Online accuracy",
            "",
            accuracy_table(collected, method),
            "",
            "### Calibration",
            "",
            calibration_table(collected, method),
            "",
            "### At the switches",
            "",
            switch_table(collected, method),
            "",
            "### Late joiners and held-out clients",
            "",
            population_table(collected, method),
            "",
            "### FedRAPP's memory at a switch",
            "",
            memory_table(collected, method),
            "",
        ]
    path = out / "continual.md"
    write_text_atomic(path, "\n".join(parts))
    return path


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, "python -m fedrapp_app.bench.continual", __doc__, write_report, "continual")


if __name__ == "__main__":
    raise SystemExit(main())
