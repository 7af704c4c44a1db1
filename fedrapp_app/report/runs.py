"""Reading a run folder: ``config.json``, ``rounds.jsonl`` and (once the run ended) ``summary.json``.

Every problem is a :class:`RunError` that names the file, the line where there is one, what is wrong and
how to fix it. An interrupted run has no ``summary.json`` yet: it is read as it stands and marked
incomplete; a last line of ``rounds.jsonl`` cut off mid-write (a kill while the round was being written)
is left out and noted. Nothing here reads a model or data: the clients' shift domains come from the config.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedrapp_app.config import DATA_KEYS, DEFAULTS
from fedrapp_app.recording.outcomes import merge_outcomes, private_run, read_outcomes
from fedrapp_app.recording.phases import read_launch
from fedrapp_app.recording.results import SITTING_OUT
from fedrapp_app.recording.runlock import LOCK_FILE

CONFIG_FILE = "config.json"
ROUNDS_FILE = "rounds.jsonl"
SUMMARY_FILE = "summary.json"

#: Row statuses in the order the tables show them (a status this version does not know gets its own column).
STATUSES = ("ok", "failed", "rejected", "missing", "exhausted", "skipped", *SITTING_OUT)

#: Keys every row has, and the extra keys (with their types) a scored row has.
_ROW_KEYS: dict[str, tuple[type, ...]] = {"round": (int,), "client": (int,), "status": (str,)}
_SCORED_KEYS: dict[str, tuple[type, ...]] = {
    "num_examples": (int,),
    "correct": (int,),
    "correct_before": (int,),
}


class RunError(ValueError):
    """A folder is not a readable run folder: the message names the file (and line) and the fix."""


@dataclass
class Run:
    """One run folder as read from disk.

    Attributes
    ----------
    path : the run folder (resolved).
    config : the run's full config (kebab-case keys), from ``config.json`` (``summary.json`` as a fallback).
    provenance : versions, python, platform, git {commit, dirty}, ``started`` (epoch seconds), ``components``
        (where the rule and the method come from) and ``resolved`` (keys the run set itself: ``num-clients`` from 0),
        where known.
    rows : the rows of ``rounds.jsonl`` in file order (one per sampled client per round).
    summary : ``summary.json`` or None while the run has not ended (interrupted, or still running).
    domains : each client's shift domain (testbed with ``testbed-domains``), None where it has none.
    notes : what was read around (a cut-off last line, domains that could not be derived).
    locked : when the run's last session took the folder's lock (``.lock``'s ``started``, epoch seconds): the
        server's start, a few milliseconds after it; None without a readable ``.lock``.
    launch : ``launch.json``, the phases of the fedrapp-sim command that ran it (``recording.phases``); None for a
        run started otherwise.
    """

    path: Path
    config: dict[str, Any]
    provenance: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None
    domains: list[str | None]
    notes: list[str] = field(default_factory=list)
    locked: float | None = None
    launch: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def strategy(self) -> str:
        return str(self.config.get("strategy", DEFAULTS["strategy"]))

    @property
    def method(self) -> str:
        return str(self.config.get("local-method", DEFAULTS["local-method"]))

    @property
    def num_clients(self) -> int:
        """Clients of the run: ``num-clients`` (0 in the config means one per SuperNode: the summary's count),
        or more if a row names a higher id."""
        seen = max((int(r["client"]) for r in self.rows), default=-1) + 1
        counted = int((self.summary or {}).get("num_clients") or 0)
        return max(int(self.config.get("num-clients") or 0), counted, seen)

    @property
    def complete(self) -> bool:
        """The run ended and wrote its summary (and, where the summary says so, finished)."""
        if self.summary is None:
            return False
        return bool(self.summary.get("complete", True)) and self.summary.get("status", "finished") == "finished"

    @property
    def status(self) -> str:
        """One line: how the run ended, or that it has not."""
        last = max((int(r["round"]) for r in self.rows), default=0)
        if self.summary is None:
            return (
                f"incomplete: no {SUMMARY_FILE} (interrupted, failed before its end, or still running); "
                f"rounds 1-{last} so far"
            )
        status = str(self.summary.get("status", "finished"))
        text = status + (f" ({self.summary['stopped']})" if self.summary.get("stopped") else "")
        if self.summary.get("error"):
            text += f": {self.summary['error']}"
        if self.summary.get("complete") is False and status == "finished":
            text += "; incomplete: not every sample was scored"
        return text

    @property
    def setting(self) -> str:
        """``"fedrapp + adaprompt, testbed"`` (``"fedrapp (trust option) + ..."``): the title without the seed."""
        rule = self.strategy + (" (trust option)" if self.config.get("trust") else "")
        return f"{rule} + {self.method}, {self.config.get('dataset', DEFAULTS['dataset'])}"

    @property
    def title(self) -> str:
        """``"fedrapp + adaprompt, testbed, seed 0"``."""
        return f"{self.setting}, seed {self.config.get('seed', DEFAULTS['seed'])}"


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RunError(
            f"{path}:{err.lineno}: not valid JSON ({err.msg}); {what} is written by the run itself: restore it or rerun"
        ) from err
    if not isinstance(payload, dict):
        raise RunError(f"{path}: expected a JSON object, found {type(payload).__name__}; restore it or rerun")
    return payload


def _lock_started(path: Path) -> float | None:
    """``started`` of the run folder's lock file (``fedrapp_app.recording.runlock``), None when it is absent or
    unreadable (a copied folder may lack it: it is only used to split the wall time)."""
    try:
        started = json.loads((path / LOCK_FILE).read_text() or "{}").get("started")
    except (OSError, ValueError, AttributeError):
        return None
    return float(started) if isinstance(started, int | float) and not isinstance(started, bool) else None


def _check_row(row: Any, where: str) -> None:
    if not isinstance(row, dict):
        raise RunError(f"{where}: a row must be a JSON object, found {type(row).__name__}")
    needed = dict(_ROW_KEYS)
    if row.get("status") == "ok":
        needed.update(_SCORED_KEYS)
    for key, kinds in needed.items():
        if key not in row:
            raise RunError(f"{where}: the row has no {key!r} (a {row.get('status', '?')} row needs {sorted(needed)})")
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise RunError(f"{where}: {key!r} must be {' or '.join(k.__name__ for k in kinds)}, got {value!r}")
    if row["round"] < 1 or row["client"] < 0:
        raise RunError(f"{where}: round must be >= 1 and client >= 0, got round {row['round']}, client {row['client']}")
    if row["status"] == "ok":
        n = row["num_examples"]
        if n < 1 or not 0 <= row["correct"] <= n or not 0 <= row["correct_before"] <= n:
            raise RunError(
                f"{where}: a scored row needs num_examples >= 1 and 0 <= correct, correct_before <= num_examples, "
                f"got {n}, {row['correct']}, {row['correct_before']}"
            )
    peers = row.get("peer_weights")
    if peers is not None and (
        not isinstance(peers, dict) or not all(isinstance(w, int | float) and math.isfinite(w) for w in peers.values())
    ):
        raise RunError(f"{where}: 'peer_weights' must map peer ids to finite numbers, got {peers!r}")


def read_rounds(
    path: Path, allow_cut_tail: bool = False, outcomes: Mapping[tuple[int, int], Mapping[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of ``rounds.jsonl`` and notes; ``RunError`` naming the line of the first bad row.

    ``allow_cut_tail``: a last line without its newline that is not valid JSON (the writer was killed
    mid-line) is left out with a note instead of failing. ``outcomes`` (a dp run's, ``recording/outcomes.py``):
    merged into their rows; a scored row without one (its client kept it on another host) is left out with a note.
    """
    text = path.read_text()
    lines = text.splitlines()
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    unscored = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if allow_cut_tail and number == len(lines) and not text.endswith("\n"):
                notes.append(f"line {number} of {ROUNDS_FILE} was cut off mid-write and is left out")
                continue
            raise RunError(
                f"{where}: not a JSON row ({err.msg} at column {err.colno}); each line must be one JSON object "
                "as the run writes it: restore the file, or delete that line to report the rest"
            ) from err
        if outcomes is not None and isinstance(row, dict):
            merge_outcomes([row], outcomes)
            if row.get("status") == "ok" and "correct" not in row:
                unscored += 1
                continue
        _check_row(row, where)
        rows.append(row)
    if unscored and not rows:
        raise RunError(
            f"{path}: every scored row of this dp run has its outcome on the clients' hosts (none in the run "
            "folder's client-state/): copy their state folders here and pass each with --outcomes DIR"
        )
    if unscored:
        notes.append(
            f"{unscored} scored row(s) of this dp run have no outcome here: their clients keep them in their own "
            "state folders (another host's); copy those folders here and pass them with --outcomes DIR"
        )
    if not rows:
        raise RunError(
            f"{path}: no rows: the run has not finished a single round (it failed at start or was stopped "
            "before round 1); see its log, fix the cause and rerun"
        )
    return rows, notes


def client_domains_of(config: Mapping[str, Any], num_clients: int) -> tuple[list[str | None], str | None]:
    """Each client's shift domain from the config alone (no data is read), and a note when it cannot be had."""
    from fedrapp_app.data import DataSpec, client_domains

    values = {field: config[key] for key, field in DATA_KEYS.items() if key in config}
    try:
        domains = client_domains(DataSpec(**{**values, "num_clients": num_clients}))
    except (TypeError, ValueError) as err:
        return [None] * num_clients, f"shift domains unknown (the data config does not validate here: {err})"
    return domains, None


def _suggest_runs(folder: Path) -> str:
    """A hint listing run folders inside ``folder`` (someone passed the output-dir)."""
    inside = sorted(p.name for p in folder.iterdir() if p.is_dir() and (p / ROUNDS_FILE).is_file())
    if not inside:
        return "pass the folder of one run (output-dir/run-name, the one holding rounds.jsonl)"
    shown = ", ".join(inside[:5]) + (f" and {len(inside) - 5} more" if len(inside) > 5 else "")
    return f"it holds run folders ({shown}): pass one or more of them"


def load_run(folder: str | Path, outcomes: Sequence[str | Path] = ()) -> Run:
    """Read and check one run folder; ``RunError`` if it is not one or a file is malformed. Under dp the clients'
    outcome files are merged into the rows: those in the run folder and in the ``outcomes`` folders (clients' state
    folders copied from other hosts)."""
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise RunError(f"{path}: no such folder; pass the folder of a run (output-dir/run-name)")
    rounds_path = path / ROUNDS_FILE
    config_path, summary_path = path / CONFIG_FILE, path / SUMMARY_FILE
    if not rounds_path.is_file():
        raise RunError(f"{path} is not a run folder: it has no {ROUNDS_FILE}; {_suggest_runs(path)}")
    summary = _read_json(summary_path, SUMMARY_FILE) if summary_path.is_file() else None
    if config_path.is_file():
        stored = _read_json(config_path, CONFIG_FILE)
    elif summary is not None:
        stored = summary
    else:
        raise RunError(f"{path} is not a run folder: it has {ROUNDS_FILE} but no {CONFIG_FILE} nor {SUMMARY_FILE}")
    config = stored.get("config")
    if not isinstance(config, dict):
        source = config_path if config_path.is_file() else summary_path
        raise RunError(f"{source}: no 'config' object; the file is not one a run wrote (restore it or rerun)")
    provenance = {
        k: stored[k]
        for k in ("versions", "python", "platform", "git", "started", "components", "resolved")
        if k in stored
    }
    if summary is not None:
        known = {k: summary[k] for k in ("versions", "python", "platform", "git", "components") if k in summary}
        provenance = {**known, **provenance}
    kept = read_outcomes((path, *(Path(f) for f in outcomes))) if private_run(config) else None
    rows, notes = read_rounds(rounds_path, allow_cut_tail=summary is None, outcomes=kept)
    run = Run(path, dict(config), provenance, rows, summary, domains=[], notes=notes, locked=_lock_started(path))
    run.launch = read_launch(path)
    run.domains, note = client_domains_of(config, run.num_clients)
    if note:
        run.notes.append(note)
    return run


#: At most this many folders beside a run are looked at for its reference (an output-dir may hold thousands).
MAX_SIBLINGS = 2000


def reference_beside(run: Run, strategy: str = "none-fed") -> Path | None:
    """The folder of a finished run beside ``run`` (in the same folder) with the same setting under ``strategy``:
    the same streams, local method and seed, only the server rule differs (``bench.schema.reference_key``); None
    when there is none, or when ``run`` is that rule itself."""
    from fedrapp_app.bench.schema import reference_key

    if run.strategy == strategy:
        return None
    wanted = reference_key(run.config, strategy)
    for count, folder in enumerate(sorted(run.path.parent.iterdir())):
        if count >= MAX_SIBLINGS:
            break
        if folder == run.path or not (folder / SUMMARY_FILE).is_file() or not (folder / CONFIG_FILE).is_file():
            continue
        try:
            config = json.loads((folder / CONFIG_FILE).read_text()).get("config")
        except (OSError, ValueError):
            continue
        if not isinstance(config, dict) or config.get("strategy") != strategy:
            continue
        if reference_key(config, strategy) == wanted:
            return folder
    return None
