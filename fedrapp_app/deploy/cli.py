"""``fedrapp-superexec``: serve a SuperNode's ClientApp tasks in warm worker processes.

Start it next to ``flower-supernode --isolation process``, in place of Flower's ``flower-superexec``, with
the same connection flags::

    flower-supernode --isolation process --port 9094 ... &
    fedrapp-superexec --runtime-api-address 127.0.0.1:9094 --insecure

The Flower version is checked first (``version``), before any of Flower's internals is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path
from types import FrameType

from fedrapp_app.deploy.version import UnsupportedFlowerError, check_flower_version

PROG = "fedrapp-superexec"
DEFAULT_PRELOAD = "fedrapp_app.deploy.preload"


class CliError(ValueError):
    """A start option that cannot work; the message says which and how to fix it."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Serve a Flower SuperNode's ClientApp tasks in long-lived worker processes (one per run), "
        "so the model is loaded once per node per run. Use it instead of flower-superexec next to "
        "flower-supernode --isolation process.",
    )
    p.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API, host:port (its --port)")
    p.add_argument("--insecure", action="store_true", help="connect to the Runtime API without TLS")
    p.add_argument("--root-certificates", metavar="ROOT_CERT", help="CA certificate (PEM) of the Runtime API's TLS")
    p.add_argument("--superexec-auth-secret-file", help="file holding the SuperNode's SuperExec shared secret")
    p.add_argument("--parent-pid", type=int, help="exit when this process exits")
    p.add_argument("--health-server-address", help="serve gRPC health checks on this address")
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.2,
        help="seconds between task polls while idle (default 0.2; Flower's flower-superexec: 1)",
    )
    p.add_argument(
        "--max-workers",
        type=int,
        default=1,
        help="warm workers kept at once, one per run (default 1; raise it for a node that serves runs "
        "concurrently: each worker holds its run's model)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=1800.0,
        help="seconds after which an idle worker is stopped and its model freed (default 1800)",
    )
    p.add_argument(
        "--orphan-timeout",
        type=float,
        default=300.0,
        help="seconds a task may wait for its message's content before its worker is stopped and the task ended "
        "(a message the SuperNode gave up on, e.g. after a SuperLink crash; default 300). Such a task is reaped "
        "at once when the SuperNode hands out the next task",
    )
    p.add_argument(
        "--preload",
        default=DEFAULT_PRELOAD,
        help=f"comma-separated modules the worker server imports once (default {DEFAULT_PRELOAD}: torch, "
        "transformers' CLIP, Flower's ClientApp); '' for none. Never list a module the app bundle ships",
    )
    p.add_argument("--stats", type=Path, help="append one JSON line per task (phases, CPU, RSS) to this file")
    p.add_argument(
        "--allow-runtime-dependency-installation",
        action="store_true",
        help=argparse.SUPPRESS,  # accepted only to refuse it with a clear message
    )
    return p


def options_from(args: argparse.Namespace):  # -> ExecutorOptions
    """Validated executor options (``CliError`` names a bad one and the fix)."""
    from fedrapp_app.deploy.executor import ExecutorOptions

    if args.allow_runtime_dependency_installation:
        raise CliError(
            "--allow-runtime-dependency-installation is not supported: warm workers run in this environment; "
            "pre-install the app's dependencies on the node and drop the flag"
        )
    if not 0.01 <= args.poll_interval <= 60:
        raise CliError(f"--poll-interval must be between 0.01 and 60 seconds, got {args.poll_interval}")
    if args.max_workers < 1:
        raise CliError(f"--max-workers must be at least 1, got {args.max_workers}")
    if args.idle_timeout <= 0:
        raise CliError(f"--idle-timeout must be a positive number of seconds, got {args.idle_timeout}")
    if args.orphan_timeout <= 0:
        raise CliError(f"--orphan-timeout must be a positive number of seconds, got {args.orphan_timeout}")
    if args.insecure and args.root_certificates:
        raise CliError("--insecure and --root-certificates contradict each other: give one of them")
    if args.root_certificates and not Path(args.root_certificates).is_file():
        raise CliError(f"--root-certificates {args.root_certificates}: no such file")
    secret = None
    if args.superexec_auth_secret_file:
        try:
            secret = Path(args.superexec_auth_secret_file).expanduser().read_bytes()
        except OSError as err:
            raise CliError(f"--superexec-auth-secret-file: cannot read it ({err})") from err
    preload = tuple(name.strip() for name in args.preload.split(",") if name.strip())
    return ExecutorOptions(
        runtime_api_address=args.runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        auth_secret=secret,
        parent_pid=args.parent_pid,
        health_server_address=args.health_server_address,
        poll_interval=args.poll_interval,
        max_workers=args.max_workers,
        idle_timeout=args.idle_timeout,
        orphan_timeout=args.orphan_timeout,
        preload=preload,
        stats_path=args.stats,
    )


def _exit_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """Run ``fedrapp-superexec``; returns the exit status (2: refused before starting)."""
    args = parser().parse_args(argv)
    try:
        check_flower_version()
        options = options_from(args)
    except UnsupportedFlowerError as err:
        print(err, file=sys.stderr)  # the message names fedrapp-superexec itself
        return 2
    except CliError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    from fedrapp_app.deploy.executor import serve
    from fedrapp_app.deploy.runtime import take_sigint

    take_sigint()  # Flower's parent monitor stops us with SIGINT, even when we were started with it ignored
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C, or the parent process ended
        serve(options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
