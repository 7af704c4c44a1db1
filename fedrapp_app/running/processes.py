"""Stop every process a run started: the SuperLink, its SuperExec, the simulation, and Ray's whole cluster.

Killing the SuperLink's process group is not enough: Flower starts the simulation and Ray starts its GCS
server, raylet, dashboard agents and workers in sessions of their own, and some of them outlive their parent
(or ignore SIGTERM). So ``fedrapp-sim`` marks its environment with a launch id (``FEDRAPP_LAUNCH_ID``), which
every process started below it inherits, and ``stop_marked`` finds them all by that mark in
``/proc/<pid>/environ``: SIGTERM, a grace period, then SIGKILL for what is left.

The environment is not always readable: Ray's dashboard and runtime-env agents were seen, in some runs, with
``/proc/<pid>/environ`` all zero bytes from the moment they set their process title, and such agents outlived a
Ctrl-C (and a SIGTERM). So a run also starts its processes in a scratch folder of its own, which they inherit as
their working directory (``/proc/<pid>/cwd``, readable whatever a process does to its memory, and still
``<folder> (deleted)`` once the folder is gone), and the stop finds a process by either mark.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Collection
from pathlib import Path

LAUNCH_ID_ENV = "FEDRAPP_LAUNCH_ID"


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the process name, 0-based: state, ppid, pgrp, ..., utime (11),
    stime (12); None once the process is gone. Read as bytes and cut at the last ')': a process name may hold any
    byte, ')' included, and a name cut at 15 bytes can split a UTF-8 character (one such process anywhere on
    the host must not stop a scan)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat.rpartition(b")")[2].decode("ascii", errors="replace").split()


def _has_mark(entry: Path, needle: bytes) -> bool:
    try:
        return needle in b"\0" + (entry / "environ").read_bytes() + b"\0"
    except OSError:  # gone, or not ours to read
        return False


def _works_in(entry: Path, folder: str) -> bool:
    """Whether the process's working directory is ``folder`` or below it (also once the folder was deleted)."""
    try:
        cwd = os.readlink(entry / "cwd")
    except OSError:  # gone, or not ours to read
        return False
    cwd = cwd.removesuffix(" (deleted)")
    return cwd == folder or cwd.startswith(folder + "/")


def descendants(pid: int) -> set[int]:
    """``pid`` and every live process below it (children, their children, ...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(entry.name)
            if fields is not None and len(fields) > 1 and fields[1].isdigit():
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def marked_pids(
    launch_id: str, variable: str = LAUNCH_ID_ENV, cwd: str | Path | None = None, spare: Collection[int] = ()
) -> list[int]:
    """PIDs of the live processes (other than this one) whose environment holds ``variable=launch_id`` or, given
    ``cwd`` (a run's own scratch folder), whose working directory is in it: zombies and processes gone
    since they were read are left out; a stat line without a state counts as live (signalling a gone PID is
    harmless; missing a live one is not)."""
    needle = b"\0" + f"{variable}={launch_id}".encode() + b"\0"
    folder = None if cwd is None else os.path.realpath(cwd)  # /proc/<pid>/cwd names the real path
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or int(entry.name) in spare:
            continue
        if not (_has_mark(entry, needle) or (folder is not None and _works_in(entry, folder))):
            continue
        fields = stat_fields(entry.name)
        if fields is not None and fields[:1] != ["Z"]:
            found.append(int(entry.name))
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_marked(
    launch_id: str,
    grace: float = 5.0,
    variable: str = LAUNCH_ID_ENV,
    settle: float = 2.0,
    cwd: str | Path | None = None,
    spare: Collection[int] = (),
) -> list[int]:
    """Stop every process marked with ``variable=launch_id`` or working in ``cwd`` (:func:`marked_pids`):
    SIGTERM, up to ``grace`` seconds, then SIGKILL for what is left, scanning again until none has been seen for
    ``settle`` seconds: a process started meanwhile is killed when it shows up (Ray's dashboard and runtime-env
    agents were seen to outlive a stop without this, presumably restarted by the raylet while it stopped).

    ``spare``: PIDs left alone (stopped later, in an order of the caller's).

    Returns the PIDs that had to be killed with SIGKILL. Zombies (exited, not yet reaped by their parent)
    count as stopped.
    """
    pids = marked_pids(launch_id, variable, cwd, spare)
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.2)
        pids = marked_pids(launch_id, variable, cwd, spare)
    killed: list[int] = []
    deadline = time.monotonic() + grace + settle
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        if pids:
            killed += [pid for pid in pids if pid not in killed]
            _signal_all(pids, signal.SIGKILL)
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= settle:
            break
        time.sleep(0.2)
        pids = marked_pids(launch_id, variable, cwd, spare)
    return killed


def describe_process(pid: int) -> str:
    """One line on a process for a message: its PID, command, state, parent and pending signals ('gone' once it
    has exited). A process with SIGKILL pending (bit 9 of ``SigPnd``/``ShdPnd``) is dying but stuck in the kernel."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        lines = Path(f"/proc/{pid}/status").read_bytes().decode(errors="replace").splitlines()
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
    except OSError:
        return f"{pid} (gone)"
    status = {key: fields.get(key, "?").strip() for key in ("State", "PPid", "SigPnd", "ShdPnd")}
    details = ", ".join(f"{key} {value}" for key, value in status.items())
    return f"{pid} {command.strip()[:80]!r} ({details})"
