"""``fedrapp-link``: checks around a SuperLink on its own host, each answering in one line.

``fedrapp-link check-tls``, before ``flower-superlink`` starts (the guide runs it, the SuperLink's systemd unit
has it as ``ExecStartPre``): can this certificate serve every address it will be used on? Those are the addresses
the SuperNodes and ``flwr`` connect to (``--address``) **and the SuperLink's own**: Flower 1.42's SuperLink
starts its ServerApp executor (``flower-superexec``) against ``--host``, with ``0.0.0.0`` replaced by
``127.0.0.1`` (``flwr/superlink/cli/flower_superlink.py: _start_superexec_if_needed``, ``resolve_bind_address``),
verifying the certificate with ``--ssl-ca-certfile``. A certificate without that address fails only there: the
executor dies, every run stays ``pending`` and the SuperLink looks healthy. The check does, in memory, the TLS
handshake each client will do (OpenSSL's own verification: chain, dates, key, name) and names what fails, and what
that failure does to whoever connects there::

    fedrapp-link check-tls --host 0.0.0.0 --port 8000 --ssl-ca-certfile ca.crt --ssl-certfile server.pem \\
        --ssl-keyfile server.key --address superlink.example.org:8000 --address 10.0.0.1:8000

A SuperLink on a wildcard ``--host`` (``0.0.0.0``, ``::``) listens for other hosts, so the check refuses to pass
without an ``--address``: it would have checked loopback only, and passed a certificate no SuperNode can use.

``fedrapp-link wait CONNECTION``: wait until the SuperLink behind a ``flwr`` connection (``$FLWR_HOME/config.toml``)
answers, bounded, saying so in one line: a SuperLink restarted after a crash takes seconds before it listens, and a
``flwr run`` submitted meanwhile fails (``Connection to the SuperLink is unavailable``, exit 1). A certificate the
connection's CA does not accept for that address fails at once, naming the address::

    fedrapp-link wait fedrapp --timeout 120 && flwr run . fedrapp --stream -c resume.toml

Exit status: 0 fine; 1 the check failed or the wait ran out (the line says why and what to do); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import ipaddress
import ssl
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

PROG = "fedrapp-link"
#: Where the guide makes the certificate (the fix a failed check points to).
RECIPE = "docs/deployment.md#4a-certificates"


class LinkError(Exception):
    """A check failed; the message is one line naming the problem and the fix."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); ``LinkError`` for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise LinkError(f"{address!r} is not HOST:PORT (e.g. superlink.example.org:8000 or 10.0.0.1:8000)")
    return host.strip("[]"), int(port)


#: The wildcard bind addresses and the loopback address Flower's ``resolve_bind_address`` puts in their place.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def own_address(host: str) -> str:
    """The host the SuperLink's own ServerApp executor connects to when the SuperLink binds ``host`` (Flower's
    ``resolve_bind_address``: the wildcard addresses become loopback)."""
    return WILDCARDS.get(host.strip("[]"), host.strip("[]"))


def subject_alt_names(certfile: Path) -> list[str]:
    """The certificate's subjectAltName entries as OpenSSL writes them (``DNS:name``, ``IP:10.0.0.1``)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [f"DNS:{n}" for n in san.get_values_for_type(x509.DNSName)] + [
        f"IP:{ip}" for ip in san.get_values_for_type(x509.IPAddress)
    ]


def not_after(certfile: Path) -> datetime:
    from cryptography import x509

    return x509.load_pem_x509_certificate(certfile.read_bytes()).not_valid_after_utc


def handshake(server: ssl.SSLContext, cafile: Path, name: str) -> str | None:
    """The TLS handshake a client that trusts ``cafile`` does with ``server`` for host ``name``, in memory; None
    when it succeeds, else OpenSSL's reason (``IP address mismatch, certificate is not valid for '127.0.0.1'.``)."""
    client = ssl.create_default_context(cafile=str(cafile))
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_client = client.wrap_bio(c_in, c_out, server_hostname=name)
    tls_server = server.wrap_bio(s_in, s_out, server_side=True)
    client_done = server_done = False
    for _ in range(20):
        try:
            if not client_done:
                tls_client.do_handshake()
                client_done = True
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLCertVerificationError as err:
            return err.verify_message or str(err)
        except ssl.SSLError as err:
            return err.reason or str(err)
        s_in.write(c_out.read())
        try:
            if not server_done:
                tls_server.do_handshake()
                server_done = True
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as err:
            return err.reason or str(err)
        c_in.write(s_out.read())
        if client_done and server_done:
            return None
    return "the handshake did not complete"


@dataclass(frozen=True)
class Target:
    """An address the certificate must serve, who connects there, and what a certificate that fails there does."""

    host: str
    who: str
    until_then: str


def remote_target(address: str) -> Target:
    """An address the SuperNodes and ``flwr`` use (``--address``). What they do with a certificate that fails there
    is measured with flwr 1.42: the SuperNode exits at its start, a connected one gives up, and ``flwr`` never
    names the certificate."""
    host, port = split_address(address)
    return Target(
        host,
        "the SuperNodes and flwr",
        f"SuperNodes given {host}:{port} exit at their start (Flower's exit code 305, 'certificate verify failed'), "
        "connected ones give up reconnecting (fedrapp-supernode then exits for its service to restart it), and "
        f"flwr with that address says only 'Connection to the SuperLink is unavailable'",
    )


def own_target(host: str) -> Target:
    """The address the SuperLink's own ServerApp executor connects to, for ``--host host``."""
    own = own_address(host)
    why = f"as --host {host} makes it" if own != host.strip("[]") else "at --host"
    return Target(
        own,
        f"the SuperLink's own ServerApp executor, {why}",
        "every run stays pending while the SuperLink looks healthy (its executor dies at its first connection)",
    )


def check_tls(certfile: Path, keyfile: Path, cafile: Path, host: str, port: int, addresses: list[str]) -> str:
    """The one-line verdict on ``certfile`` for a SuperLink started with ``--host host --port port`` and reached
    at ``addresses``; ``LinkError`` (one line: what cannot be served, why, and the fix) when it cannot serve one."""
    if host.strip("[]") in WILDCARDS and not addresses:
        raise LinkError(
            f"--host {host} listens for SuperNodes on other hosts, but no --address says where they connect, so only "
            f"{own_address(host)}:{port} (the SuperLink's own executor) would be checked: add every address the "
            "SuperNodes and flwr use, e.g. --address superlink.example.org:8000 --address 10.0.0.1:8000 (each must "
            f"be in the certificate's subjectAltName, recipe: {RECIPE})"
        )
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile), ("--ssl-ca-certfile", cafile)):
        if not path.is_file():
            raise LinkError(f"{flag} {path}: no such file")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        server.load_cert_chain(str(certfile), str(keyfile))
    except ssl.SSLError as err:
        raise LinkError(
            f"{certfile} and {keyfile} do not go together ({err.reason or err}): give the key the certificate was "
            f"made with (recipe: {RECIPE})"
        ) from None
    try:
        sans = subject_alt_names(certfile)
    except ValueError as err:
        raise LinkError(f"{certfile} is not a PEM certificate ({err})") from None
    targets = [*(remote_target(a) for a in addresses), own_target(host)]
    verdicts = {t.host: handshake(server, cafile, t.host) for t in targets}
    failed = [t for t in targets if verdicts[t.host]]
    if failed:
        what = "; ".join(f"{t.host}:{port} ({t.who}): {verdicts[t.host].rstrip('.')}" for t in failed)
        missing = [t.host for t in failed if "mismatch" in str(verdicts[t.host])]  # OpenSSL's name check
        add = ",".join(dict.fromkeys(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in missing))
        fix = f"with {add} added to subjectAltName, signed" if missing else "valid today, signed"
        until = "; ".join(dict.fromkeys(t.until_then for t in failed))
        raise LinkError(
            f"{certfile} cannot serve {what}. Its subjectAltName holds {', '.join(sans) or 'nothing'}: make it again "
            f"{fix} by {cafile} (recipe: {RECIPE}). Until then {until}"
        )
    left = (not_after(certfile) - datetime.now(UTC)).days
    served = ", ".join(f"{t.host}:{port} ({t.who})" for t in targets)
    return f"{certfile} serves {served}; signed by {cafile}, valid for {left} more days"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Connection:
    """Where ``flwr`` reaches a SuperLink: an entry of ``$FLWR_HOME/config.toml``."""

    name: str
    address: str
    insecure: bool
    root_certificates: Path | None


def read_connection(name: str) -> Connection:
    """The connection ``name`` of ``$FLWR_HOME/config.toml``, read by Flower's own code."""
    import click
    from flwr.cli.flower_config import read_superlink_connection

    try:
        found = read_superlink_connection(name)
    except click.ClickException as err:
        raise LinkError(" ".join(err.format_message().split())) from None
    if not found.address:
        raise LinkError(f"the connection {name!r} has no address (a simulation connection?): give a deployed one")
    certs = Path(found.root_certificates).expanduser() if found.root_certificates else None
    return Connection(name, found.address, bool(found.insecure), certs)


def probe(connection: Connection, timeout: float = 3.0) -> str | None:
    """None when the SuperLink behind ``connection`` answers its health check; else why not (a transient reason:
    refused, reset, timed out). ``LinkError`` for what waiting cannot fix: a certificate the CA does not accept."""
    host, port = split_address(connection.address)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    context = None
    if not connection.insecure:
        if connection.root_certificates is not None and not connection.root_certificates.is_file():
            raise LinkError(
                f"root-certificates {connection.root_certificates}: no such file (connection {connection.name!r})"
            )
        context = ssl.create_default_context(
            cafile=str(connection.root_certificates) if connection.root_certificates else None
        )
    url = f"{'http' if connection.insecure else 'https'}://{netloc}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:  # noqa: S310 - http(s) only
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise LinkError(
                f"the SuperLink at {connection.address} answers, but its certificate is refused: "
                f"{str(reason.verify_message or reason).rstrip('.')}. The certificate's subjectAltName must hold "
                f"{host}, signed by "
                f"the CA in root-certificates (recipe: {RECIPE}; on the SuperLink host: fedrapp-link check-tls)"
            ) from None
        if isinstance(reason, ssl.SSLError):
            raise LinkError(
                f"TLS with the SuperLink at {connection.address} failed ({reason.reason or reason}): is it started "
                "with TLS, and the connection without insecure = true?"
            ) from None
        return str(getattr(reason, "strerror", None) or reason)
    except (OSError, TimeoutError) as err:  # a reset or a timeout while the server starts
        return str(getattr(err, "strerror", None) or err) or type(err).__name__


def wait(connection: Connection, timeout: float, interval: float = 0.5, say=print) -> float:
    """Wait until the SuperLink behind ``connection`` answers; the seconds it took. Says once that it waits
    (and, when it did, after how long it answered); ``LinkError`` after ``timeout`` seconds."""
    started = time.monotonic()
    why = probe(connection)
    if why is None:
        return 0.0
    say(
        f"{PROG}: the SuperLink {connection.name} ({connection.address}) does not answer yet ({why}); waiting up to "
        f"{timeout:g} s for it to listen"
    )
    while time.monotonic() - started < timeout:
        time.sleep(interval)
        why = probe(connection)
        if why is None:
            seconds = time.monotonic() - started
            say(f"{PROG}: the SuperLink {connection.name} answers after {seconds:.1f} s")
            return seconds
    raise LinkError(
        f"the SuperLink {connection.name} ({connection.address}) did not answer within {timeout:g} s (last: {why}). "
        f"Is it running on that host (systemctl status fedrapp-superlink; its log), on that port, and does the "
        f"firewall let this host in?"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    tls = sub.add_parser(
        "check-tls",
        help="check, before flower-superlink starts, that its certificate serves every address it will be used on",
        description="Take the same --host, --port and --ssl-* options as flower-superlink, plus the addresses the "
        "SuperNodes and flwr use (--address, repeatable). Other flower-superlink options are ignored, so the "
        "SuperLink's own command line can be passed as it is.",
    )
    tls.add_argument("--ssl-certfile", type=Path, required=True)
    tls.add_argument("--ssl-keyfile", type=Path, required=True)
    tls.add_argument("--ssl-ca-certfile", type=Path, required=True)
    tls.add_argument("--host", default="127.0.0.1", help="as flower-superlink's (default 127.0.0.1)")
    tls.add_argument("--port", type=int, default=8000, help="as flower-superlink's (default 8000)")
    tls.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="an address the SuperNodes and flwr connect to (repeatable), e.g. superlink.example.org:8000",
    )
    waiting = sub.add_parser(
        "wait",
        help="wait (bounded) until the SuperLink behind a flwr connection answers",
        description="Read the connection from $FLWR_HOME/config.toml (as flwr does) and wait until the SuperLink "
        "answers its health check over it, TLS included.",
    )
    waiting.add_argument("connection", help="the connection's name in $FLWR_HOME/config.toml")
    waiting.add_argument("--timeout", type=float, default=120.0, help="seconds to wait at most (default 120)")
    return p


def main(argv: list[str] | None = None) -> int:
    args, unknown = parser().parse_known_args(argv)
    if unknown and args.command != "check-tls":
        parser().error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if args.command == "check-tls":
            print(f"{PROG}: " + check_tls(
                args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certfile, args.host, args.port, args.address
            ))  # fmt: skip
        else:
            wait(read_connection(args.connection), args.timeout)
    except LinkError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


__all__ = ["LinkError", "check_tls", "main", "own_address", "probe", "read_connection", "wait"]

if __name__ == "__main__":
    sys.exit(main())
