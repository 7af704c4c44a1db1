"""One writer per run folder: an advisory lock (``flock``) on ``<run_dir>/.lock`` held while a run writes there.

The kernel drops the lock when its holder dies (killed, crashed, Ctrl-C), so a dead run never blocks the next
one; a live one makes a second run on the same folder fail at once, naming the holder's PID. A resume waits for
a live holder up to ``RESUME_WAIT_SECONDS`` first (saying so once): the holder is usually the ServerApp of the
very run being resumed, still stopping after its SuperLink died. The lock file keeps the holder's PID, host,
start time and, under ``fedrapp-sim``, the launcher's PID.

``release_on_signal`` makes a run give its folder up the moment its process is told to stop (SIGINT, SIGTERM:
what Flower's ServerApp process gets when its SuperLink or SuperExec dies), before the process's own exit
handlers run.

``check_not_taken`` keeps a new run from overwriting a folder that holds results (a finished run, or a stopped one
waiting for its resume): the run is refused in one line that offers the choices.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import select
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from fedrapp_app.config import ConfigError
from fedrapp_app.recording.results import held_results

log = logging.getLogger("flwr.fedrapp")

LOCK_FILE = ".lock"
#: Set by ``fedrapp-sim`` for the processes it starts, so that the lock names the command a user can stop.
LAUNCHER_PID_ENV = "FEDRAPP_LAUNCHER_PID"
#: How long a resume waits for a live holder of its run folder. The usual holder is the ServerApp of the run
#: being resumed whose SuperLink was killed: Flower stops it through its SuperExec, and it gives the folder up
#: 1.9-3.2 s after the kill (``release_on_signal``; 6.0-8.5 s before it; measured on loopback: docs/results/chaos.md).
RESUME_WAIT_SECONDS = 30.0


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


class RunFolderTaken(ConfigError):
    """The run folder holds the results of another run, which a new run would overwrite: the fix is a resume, another
    ``run-name``, or an explicit overwrite."""


def check_not_taken(run_dir: Path) -> None:
    """Raise ``RunFolderTaken`` when ``run_dir`` holds results a new run (``resume = false``) would overwrite.

    One line, naming what is there and the three ways on: resume it, another run-name, or an explicit overwrite
    (``fedrapp-sim --overwrite``; with ``flwr run``, moving the folder away on the host that writes it).
    """
    run_dir = Path(run_dir)
    what = held_results(run_dir)
    if what is None:
        return
    finished = what.startswith("the results of a finished run")
    resume = (
        "resume = true runs more rounds only with a higher num-rounds"
        if finished
        else "resume it with resume = true and this run-name"
    )
    raise RunFolderTaken(
        f"run folder {run_dir} already holds {what}, left as it was. A new run does not replace it: "
        f"{resume}; or choose another run-name; or overwrite it explicitly (fedrapp-sim --overwrite; with flwr run, "
        f"move it away first on {socket.gethostname()}: mv {run_dir} {run_dir}.old)"
    )


def _who(holder: dict[str, Any]) -> str:
    who = f"PID {holder.get('pid', '?')} on {holder.get('host', '?')}"
    if holder.get("launcher_pid"):
        who += f" (started by fedrapp-sim PID {holder['launcher_pid']})"
    return who


def _describe(run_dir: Path, holder: dict[str, Any], waited: float = 0.0) -> str:
    if waited > 0:
        pid = holder.get("pid", "<pid>")
        return (
            f"run folder {run_dir} is still being written by {_who(holder)} after waiting {waited:g} s: a run "
            f"folder has one writer. A ServerApp whose SuperLink was stopped or died gives it up within seconds; "
            f"if this one is still stopping, wait until PID {pid} has exited (ps -p {pid}, on that host) and "
            f"submit again; if it is a run that goes on, let it finish, or stop it (kill -INT {pid}) and resume it"
        )
    who = _who(holder)
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


def _read_holder(f: Any) -> dict[str, Any]:
    f.seek(0)
    try:
        return json.loads(f.read() or "{}")
    except json.JSONDecodeError:
        return {}


@contextlib.contextmanager
def run_lock(run_dir: Path, wait: float = 0.0) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the ``with`` block (creating the folder); ``RunFolderBusy`` if it is held
    (still held after ``wait`` seconds: a holder that is being stopped may need a moment to exit). A wait is
    logged once, naming the holder; the error after it says how long it waited and what to do."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a+") as f:
        started = time.monotonic()
        said = False
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < started + wait:
                    if not said:
                        said = True
                        log.warning(
                            "run folder %s is held by %s; waiting up to %g s for it to be released (the ServerApp "
                            "of a run whose SuperLink was stopped gives it up within seconds)",
                            run_dir,
                            _who(_read_holder(f)),
                            wait,
                        )
                    time.sleep(0.2)
                    continue
                raise RunFolderBusy(_describe(run_dir, _read_holder(f), wait)) from None
        if said:
            log.info("run folder %s released after %.1f s; going on", run_dir, time.monotonic() - started)
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


class RunStopped(BaseException):
    """The run's process was told to stop (SIGINT, SIGTERM) while it ran (raised by ``release_on_signal``). Not an
    ``Exception``: like ``KeyboardInterrupt``, nothing on the way may swallow it, and the run counts it as
    interrupted."""


class _WakeMain(threading.Thread):
    """Makes a signal that another thread received stop the main thread's wait at once.

    Python runs signal handlers in the main thread only, and only between bytecodes. Flower's parent monitor
    raises its SIGINT in its own thread, so the main thread, asleep in Flower's 3 s reply poll or in a backoff
    wait of up to 20 s while its calls to a dead SuperLink fail, got to the handler only when that wait ended
    (the run folder was released 2.4-5.0 s after a kill -9 of the SuperLink, measured). This thread reads the
    signal numbers Python's C-level handler writes to a wakeup fd and, for ``signals``, sends the main thread a
    SIGUSR1 with a no-op handler: its wait is interrupted (EINTR) and the pending handler runs. No signal is
    added: the one that was raised is handled once, as before, only sooner.
    """

    def __init__(self, signals: tuple[int, ...]) -> None:
        super().__init__(name="fedrapp-wake-main", daemon=True)
        self.signals = set(signals)
        self.main = threading.main_thread().ident
        self.read_end, self.write_end = os.pipe()
        for fd in (self.read_end, self.write_end):
            os.set_blocking(fd, False)
        self.done = threading.Event()
        self.previous_wakeup = -1
        self.previous_usr1: Any = None

    def __enter__(self) -> _WakeMain:
        self.previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
        self.previous_wakeup = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
        self.start()
        return self

    def run(self) -> None:
        while not self.done.is_set():
            ready, _, _ = select.select([self.read_end], [], [], 0.2)
            if not ready or self.done.is_set():
                continue
            try:
                got = os.read(self.read_end, 512)
            except BlockingIOError:
                continue
            if self.signals & set(got) and self.main is not None:
                signal.pthread_kill(self.main, signal.SIGUSR1)

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()
        signal.set_wakeup_fd(self.previous_wakeup)
        signal.signal(signal.SIGUSR1, self.previous_usr1)
        os.close(self.read_end)
        os.close(self.write_end)


@contextlib.contextmanager
def release_on_signal(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Run the ``with`` block (a whole run, its ``run_lock`` inside) so that SIGINT or SIGTERM stops it at once.

    The signal raises ``RunStopped`` wherever the block is; the run unwinds (its ``summary.json`` says
    interrupted, its lock is released) and only then does the handler that was installed before get the signal:
    in a ServerApp process, Flower's graceful exit, which pushes the task's status to the SuperLink and can take
    several seconds (with the SuperLink gone, up to its 5 s force-exit timer), or Python's ``KeyboardInterrupt``.
    A second signal goes to that handler directly. Flower's ServerApp process gets a SIGINT when its SuperExec
    dies, which the SuperExec does about 2 s after its SuperLink died (both watch their parent's PID); without
    this, the run held its folder through Flower's exit handlers, 6.0-8.5 s after a kill -9 of the SuperLink.

    A signal raised in another thread (Flower's monitor does that) wakes the main thread at once (``_WakeMain``).
    Outside the main thread (a simulation's ServerApp thread), where Python cannot install handlers, the block
    runs as it is. A signal that was ignored (``SIG_IGN``) stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Callable[[int, FrameType | None], Any] | int] = {}
    received: list[tuple[int, FrameType | None]] = []

    def restore() -> None:
        for number, handler in previous.items():
            signal.signal(number, handler)

    def stop(signum: int, frame: FrameType | None) -> None:
        received.append((signum, frame))
        restore()
        raise RunStopped(
            f"the ServerApp process got {signal.Signals(signum).name} (its SuperLink or SuperExec is gone, "
            "or it was stopped)"
        )

    for number in signals:
        handler = signal.getsignal(number)
        if handler is None or handler == signal.SIG_IGN:
            continue
        previous[number] = handler
        signal.signal(number, stop)
    try:
        with _WakeMain(tuple(previous)):
            yield
    except RunStopped:
        if not received:
            raise
    finally:
        restore()
    if received:
        signum, frame = received[0]
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)  # Flower's graceful exit ends in sys.exit; Python's raises KeyboardInterrupt
        else:  # SIG_DFL, restored above: the process ends by the signal, as it would have without us
            signal.raise_signal(signum)
        raise RunStopped(f"stopped by {signal.Signals(signum).name}")
