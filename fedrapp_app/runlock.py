"""One writer per run folder: an advisory lock (``flock``) on ``<run_dir>/.lock`` held while a run writes there.

The kernel drops the lock when its holder dies (killed, crashed, Ctrl-C), so a dead run never blocks the next
one; a live one makes a second run or a resume on the same folder fail at once, naming the holder's PID.
The lock file keeps the holder's PID, host, start time and, under ``fedrapp-sim``, the launcher's PID.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedrapp_app.config import ConfigError

LOCK_FILE = ".lock"
#: Set by ``fedrapp-sim`` for the processes it starts, so that the lock names the command a user can stop.
LAUNCHER_PID_ENV = "FEDRAPP_LAUNCHER_PID"


class RunFolderBusy(RuntimeError):
    """Another live process writes this run folder."""


class RunFolderUnwritable(ConfigError):
    """The run folder cannot be created or written: the fix is another ``output-dir``."""


def _unwritable_reason(err: OSError, run_dir: Path) -> str:
    """Why ``err`` (raised creating ``run_dir``, or a file in it) happened, in words a user can act on."""
    where = Path(err.filename) if err.filename else run_dir
    existing = next((p for p in (where, *where.parents) if os.path.lexists(p)), None)
    if existing is not None and not existing.is_dir():
        return f"{existing} is a file, not a folder"
    made = "a file in it" if where.name.startswith(_PROBE) else str(where)
    if err.errno == errno.ENOENT and existing is not None:  # /proc: the folder is there, nothing can be made in it
        return f"nothing can be created in {existing} (No such file or directory: {made})"
    if err.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
        return f"{err.strerror} creating {made} ({where.parent} is read-only, immutable or not yours)"
    return f"{err.strerror or err} creating {made}"


_PROBE = ".write-probe-"


def check_writable(run_dir: Path, output_dir: str = "") -> None:
    """Raise ``RunFolderUnwritable`` unless ``run_dir`` can be created (with its parents) and a file written in it.

    Leaves nothing behind: the folders it had to create and its probe file are removed again. The message names
    the folder, the reason and the ``-c "output-dir=..."`` fix.
    """
    run_dir = Path(run_dir)
    created: list[Path] = []
    try:
        missing = []
        for folder in (run_dir, *run_dir.parents):
            if os.path.lexists(folder):
                break
            missing.append(folder)
        for folder in reversed(missing):
            folder.mkdir()
            created.append(folder)
        if not run_dir.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(run_dir))
        handle, probe = tempfile.mkstemp(dir=run_dir, prefix=_PROBE)
        try:
            os.write(handle, b"probe")
        finally:
            os.close(handle)
            os.unlink(probe)
    except OSError as err:
        given = f"output-dir = {output_dir!r}: " if output_dir else ""
        raise RunFolderUnwritable(
            f"{given}cannot create and write the run folder {run_dir}: {_unwritable_reason(err, run_dir)}. "
            f"Choose a folder you can write (fix: -c \"output-dir='/path/to/writable/folder'\")"
        ) from None
    finally:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _describe(run_dir: Path, holder: dict[str, Any]) -> str:
    who = f"PID {holder.get('pid', '?')} on {holder.get('host', '?')}"
    if holder.get("launcher_pid"):
        who += f" (started by fedrapp-sim PID {holder['launcher_pid']})"
    since = holder.get("started")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, float) else ""
    stop = holder.get("launcher_pid") or holder.get("pid", "<pid>")
    return (
        f"run folder {run_dir} is being written by {who}{when}: a run folder has one writer. Wait for that run "
        f"to end, or stop it (kill -INT {stop}) and resume it; or choose another run-name"
    )


def holder(run_dir: Path) -> dict[str, Any] | None:
    """Who holds the lock of ``run_dir`` now (its lock file's content), or None when nobody does."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return None
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            try:
                return json.loads(f.read() or "{}")
            except json.JSONDecodeError:
                return {}
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def check_free(run_dir: Path) -> None:
    """Raise ``RunFolderBusy`` when a live process holds ``run_dir``'s lock."""
    found = holder(run_dir)
    if found is not None:
        raise RunFolderBusy(_describe(Path(run_dir), found))


@contextlib.contextmanager
def run_lock(run_dir: Path, wait: float = 0.0) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the ``with`` block (creating the folder); ``RunFolderBusy`` if it is held
    (still held after ``wait`` seconds: a holder that is being stopped may need a moment to exit)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a+") as f:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                f.seek(0)
                try:
                    found = json.loads(f.read() or "{}")
                except json.JSONDecodeError:
                    found = {}
                raise RunFolderBusy(_describe(run_dir, found)) from None
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        if os.environ.get(LAUNCHER_PID_ENV):
            me["launcher_pid"] = int(os.environ[LAUNCHER_PID_ENV])
        f.seek(0)
        f.truncate()
        f.write(json.dumps(me))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
