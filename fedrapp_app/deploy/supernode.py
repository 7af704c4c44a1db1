"""``fedrapp-supernode``: Flower's ``flower-supernode``, same options, that exits when it gave up on its SuperLink.

Flower 1.42's SuperNode stops reconnecting at the first TLS handshake error (a SuperLink restarted on a
certificate that does not verify: "SSL/TLS handshake error detected.", then "Giving up reconnection ...") and at
an HTTP error it does not retry. Its connection loop then ends, but its Runtime API server thread keeps the
process alive: the node stays offline for good, and a service manager's ``Restart=on-failure`` never fires
(measured on two hosts: 80+ s offline after the good certificate was back, until restarted by hand).

This runs Flower's own entry point in this process. It returns only after such a give-up: a stop by signal and a
refused start leave through Flower's ``flwr_exit`` (exit status 0 and 1). After the return, the node leaves the
same way, with exit status 1 and a line saying why, so that systemd (``conf/systemd/fedrapp-supernode@.service``)
or a shell loop starts it again; once the SuperLink serves a good certificate, the new start connects::

    fedrapp-supernode --superlink superlink.example.org:8000 --root-certificates ca.crt ...
"""

from __future__ import annotations

import sys
import time

from fedrapp_app.deploy.version import UnsupportedFlowerError, check_flower_version

PROG = "fedrapp-supernode"


def main(argv: list[str] | None = None) -> int:
    """Run Flower's SuperNode with ``argv`` (default: this command's arguments); exit status 1 once it gave up."""
    try:
        check_flower_version(program=PROG)
    except UnsupportedFlowerError as err:
        print(err, file=sys.stderr)
        return 2
    from flwr.supercore.exit import ExitCode, flwr_exit
    from flwr.supernode import cli as flower_cli

    if argv is not None:
        sys.argv = [PROG, *argv]  # Flower's parser reads sys.argv
    started = time.monotonic()
    flower_cli.flower_supernode()
    # Flower stops its Runtime API server and exits with status 1 here; its own help line for code 305 follows.
    flwr_exit(
        ExitCode.SUPERNODE_CONNECTION_ERROR,
        f"{PROG}: the SuperNode, up for {time.monotonic() - started:.1f} s, gave up reconnecting to the SuperLink "
        "(its reason is the error above: a certificate that does not verify, or an HTTP error Flower does not "
        "retry) and would stay offline; it exits so that its service manager starts it again (systemd: "
        "Restart=on-failure), which connects once the SuperLink is right",
    )


if __name__ == "__main__":
    sys.exit(main())
