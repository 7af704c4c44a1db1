"""What a private client keeps to itself: its outcome file, and the merge that gives the experimenter whole rows.

Under ``dp = true`` a client's reply carries only what the server may see (``federation/records.py``,
``PRIVATE_REPLY_METRICS``); everything it scored against its labels (right predictions, calibration bins, per-domain
counts and the domain's name), the method's statistics, its skipped samples and its timings stay on its host, one
JSON line per round in ``<state dir>/<run token>/client-<id>-outcomes.jsonl`` beside its snapshots: the run folder's
``client-state/`` in a simulation, the node's own state folder on another host. Labels exist only in experiments,
and an experiment still needs its accuracy: ``summary.json``, the report and the bench merge these lines into the
server's rows (:func:`merge_outcomes`), by round and client; another host's folders are merged where the
experimenter copies them (``fedrapp-report --outcomes DIR``). Without dp nothing is written here.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedrapp_app.recording.checkpoint import CLIENT_STATE_DIR

log = logging.getLogger("fedrapp.results")

#: A client's outcome file in its state folder's run-token folder.
OUTCOME_FILE = "client-{client}-outcomes.jsonl"


def outcome_path(state_dir: Path, token: str, client: int) -> Path:
    return Path(state_dir) / token / OUTCOME_FILE.format(client=client)


def append_outcome(state_dir: Path, token: str, client: int, record: Mapping[str, Any]) -> None:
    """Append one round's outcome (``round``, ``client``, ``position`` and the row fields it scored) and flush it
    to disk before the reply leaves (a crash after the reply keeps it)."""
    path = outcome_path(state_dir, token, client)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def outcome_files(folders: Iterable[Path]) -> list[Path]:
    """Every outcome file under ``folders``: a run folder (its ``client-state/``), a state folder (its run-token
    folders) or a run-token folder itself."""
    found: list[Path] = []
    pattern = OUTCOME_FILE.format(client="*")
    for folder in folders:
        folder = Path(folder)
        for base in (folder, folder / CLIENT_STATE_DIR):
            found += sorted(base.glob(pattern)) + sorted(base.glob(f"*/{pattern}"))
    return sorted(set(found))


def read_outcomes(folders: Iterable[Path]) -> dict[tuple[int, int], dict[str, Any]]:
    """``{(round, client): outcome}`` from every outcome file under ``folders``; a later line of the same round and
    client wins (a round run again after a resume), a last line cut short by a kill is dropped."""
    outcomes: dict[tuple[int, int], dict[str, Any]] = {}
    for path in outcome_files(folders):
        lines = path.read_text().split("\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                if number == len(lines):
                    log.warning("%s: dropped an incomplete last line", path)
                    break
                raise ValueError(f"{path}, line {number}: not a JSON outcome ({err})") from err
            outcomes[(int(record["round"]), int(record["client"]))] = record
    return outcomes


def merge_outcomes(rows: list[dict[str, Any]], outcomes: Mapping[tuple[int, int], Mapping[str, Any]]) -> int:
    """Put each outcome into its row (same round and client; the row's ``client_metrics`` take the outcome's),
    in place; returns how many rows got one."""
    merged = 0
    for row in rows:
        outcome = outcomes.get((int(row["round"]), int(row["client"])))
        if outcome is None:
            continue
        fields = {k: v for k, v in outcome.items() if k not in ("round", "client", "position", "client_metrics")}
        row.update(fields)
        if "client_metrics" in outcome:
            row["client_metrics"] = {**row.get("client_metrics", {}), **outcome["client_metrics"]}
        merged += 1
    return merged


def private_run(config: Mapping[str, Any]) -> bool:
    """Whether a run's config (``config.json``'s ``config``) ran under dp: its rows then lack the outcomes."""
    return bool(config.get("dp", False))
