"""Where a ``fedrapp-sim`` run's wall time goes: consecutive named phases from the launcher's start to its exit.

The launcher marks the end of each of its own phases (:class:`Clock`); the server's phases come from the run's
``summary.json`` (its ``started`` epoch, ``setup_seconds``, ``discovery_seconds`` and ``seconds``).
:func:`launch_phases` puts both on one time line; the phases are consecutive, so they add up to the wall time the
user waited (the launcher's start to the last mark). ``launch.json`` in the run folder keeps them and the run
report shows them (``report/page.py``). Both clocks are this host's ``time.time()``: the simulation's ServerApp runs
on the launcher's host.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The file in the run folder that holds the launch's phases.
LAUNCH_FILE = "launch.json"

#: What each phase covers, in the order they happen (the names the launcher and the report use).
PHASES: dict[str, str] = {
    "checks": "Python start, imports, the config, the run folder, the model and the data checked",
    "superlink": "the local SuperLink started and answering",
    "submit": "flwr run: the app packed (FAB) and the run submitted",
    "simulation start": "Flower starts the simulation process, installs the app, starts the ServerApp",
    "server setup": "ServerApp: config, run folder, provenance, counting the SuperNodes",
    "registration": "SuperNodes register: Ray and its workers start, ClientApps import and load model and data",
    "rounds": "the rounds, and the results written after the last",
    "teardown": "Flower ends the run: workers and Ray stopped, the log stream closed",
    "status": "the run's final status read from the SuperLink",
    "stop": "every process the run started stopped",
    "report": "the run report written",
}
#: Seconds two clocks of one host may disagree by before the server's phases are left out (never seen above 0).
CLOCK_SLACK = 0.5


def process_start() -> float:
    """Epoch seconds when this process started (Linux: ``/proc/self/stat``, 10 ms ticks); elsewhere now."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 (starttime) counted after the command's closing parenthesis
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class Clock:
    """The launcher's marks: ``mark(name)`` ends phase ``name`` now (epoch seconds)."""

    def __init__(self, start: float | None = None) -> None:
        self.start = process_start() if start is None else start
        self.marks: list[tuple[str, float]] = []

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks.append((name, time.time() if at is None else at))


def server_marks(summary: Mapping[str, Any] | None) -> list[tuple[str, float]]:
    """The server's phase ends from a run's summary (empty when it lacks the fields, e.g. the run failed early)."""
    if not summary:
        return []
    try:
        started = float(summary["started"])
        setup, discovery = float(summary["setup_seconds"]), float(summary["discovery_seconds"])
        total = float(summary["seconds"])
    except (KeyError, TypeError, ValueError):
        return []
    return [
        ("simulation start", started),
        ("server setup", started + setup - discovery),
        ("registration", started + setup),
        ("rounds", started + total),
    ]


def launch_phases(
    start: float, launcher: Sequence[tuple[str, float]], server: Sequence[tuple[str, float]]
) -> list[dict[str, Any]]:
    """Consecutive phases ``{"phase", "seconds", "what"}`` from ``start`` to the last mark.

    ``launcher``: the launcher's marks in order, where the server's phases fit between ``submit`` and ``teardown``;
    ``server``: :func:`server_marks`. Server marks outside the launcher's (another host's clock, a summary of an
    earlier session) are left out: the phase after them then covers their time.
    """
    merged: list[tuple[str, float]] = []
    for name, at in launcher:
        merged.append((name, at))
        if name == "submit":
            low = at - CLOCK_SLACK
            high = next((t for n, t in launcher if n == "teardown"), float("inf")) + CLOCK_SLACK
            if server and all(low <= t <= high for _, t in server):
                merged += [(n, min(max(t, at), high)) for n, t in server]
    phases, previous = [], start
    for name, at in merged:
        at = max(at, previous)
        phases.append({"phase": name, "seconds": round(at - previous, 3), "what": PHASES.get(name, name)})
        previous = at
    return phases


def phase_line(phases: Sequence[Mapping[str, Any]]) -> str:
    """``47.1 s wall: checks 0.9, superlink 1.0, ...`` (the launcher's last line)."""
    total = sum(float(p["seconds"]) for p in phases)
    parts = ", ".join(f"{p['phase']} {float(p['seconds']):.1f}" for p in phases)
    return f"{total:.1f} s wall: {parts}"


def write_launch(run_dir: Path, start: float, phases: Sequence[Mapping[str, Any]], extra: Mapping[str, Any]) -> None:
    """``launch.json``: the phases, their total and when the launcher started (epoch seconds)."""
    body = {
        "started": start,
        "seconds": round(sum(float(p["seconds"]) for p in phases), 3),
        "phases": list(phases),
        **extra,
    }
    path = Path(run_dir) / LAUNCH_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(path)


def read_launch(run_dir: Path) -> dict[str, Any] | None:
    """The run folder's ``launch.json``, or None (a run not started by fedrapp-sim, or an unreadable file)."""
    try:
        body = json.loads((Path(run_dir) / LAUNCH_FILE).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and isinstance(body.get("phases"), list) else None
