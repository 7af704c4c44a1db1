"""Two real hosts without surprises (issue 36), the fast part: a run folder with results is never overwritten
silently (in-process ServerApp body and fedrapp-sim; the deployment's refusal is in the guide's test,
``tests/test_guide.py``), the certificate check before a SuperLink starts, the bounded wait for a restarted
SuperLink, the systemd units and the firewall recipe the guide ships, and (slow) a SuperNode that comes back on its
own after a certificate mistake on the SuperLink."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fedrapp_app.deploy import link
from fedrapp_app.recording.results import RUN_FILES, clear_results, held_results
from fedrapp_app.recording.runlock import RunFolderTaken
from fedrapp_app.running import launch as launcher
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import interrupt_after, run_federation, small_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny"), world.CLASSNAMES)


def fingerprint(run_dir: Path) -> dict[str, str]:
    """Every file of a run folder (the lock aside) with a hash of its bytes."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


# ------------------------------------------------------------------------------ 2. no silent overwrite
def test_a_new_run_in_a_finished_runs_folder_is_refused_in_one_line_and_loses_nothing(tiny_model, tmp_path):
    """Before: the same run-name submitted again (the guide's first-check) replaced the finished results without a
    word."""
    config = small_run(tiny_model, tmp_path, **{"num-rounds": 1, "num-clients": 2, "testbed-samples": 64})
    first, _, _ = run_federation(config)
    run_dir = tmp_path / "run"
    before = fingerprint(run_dir)
    with pytest.raises(RunFolderTaken) as err:
        run_federation({**config, "strategy": "none-fed"})
    message = str(err.value)
    assert "\n" not in message and str(run_dir) in message and "finished run (1 rounds" in message
    assert "left as it was" in message and "another run-name" in message
    assert "fedrapp-sim --overwrite" in message and f"mv {run_dir} {run_dir}.old" in message
    assert socket.gethostname() in message  # the host whose folder it is (deployment: the SuperLink's)
    assert fingerprint(run_dir) == before  # not one byte changed


def test_a_forgotten_resume_after_a_crash_is_refused_and_the_resume_still_works(tiny_model, tmp_path):
    config = small_run(tiny_model, tmp_path, **{"num-rounds": 2, "num-clients": 2, "testbed-samples": 64})
    interrupt_after(config, 1)
    run_dir = tmp_path / "run"
    before = fingerprint(run_dir)
    with pytest.raises(RunFolderTaken, match="stopped after round 1 .*resume it with resume = true"):
        run_federation(config)
    assert fingerprint(run_dir) == before
    summary, _, _ = run_federation({**config, "resume": True})
    assert summary["status"] == "finished" and summary["resumed_after_round"] == 1 and summary["rounds"] == 2


def test_what_a_folder_holds_and_what_an_explicit_overwrite_removes(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    (run_dir / "summary.json").write_text('{"status": "failed", "rounds": 0}')
    assert held_results(run_dir) is None  # failed before its first round: nothing worth keeping
    (run_dir / "rounds.jsonl").write_text('{"round": 1, "client": 0}\n')
    assert held_results(run_dir) == "the rows of a run (1 rows, no checkpoint)"
    (run_dir / "summary.json").write_text('{"status": "finished", "rounds": 1, "samples": 8, "complete": false}')
    assert held_results(run_dir).startswith("the results of a finished run (1 rounds, 8 samples scored, incomplete")
    (run_dir / "client-state" / "token").mkdir(parents=True)
    (run_dir / "report").mkdir()
    (run_dir / "notes.txt").write_text("mine")
    (run_dir / ".lock").write_text("{}")
    assert sorted(clear_results(run_dir)) == sorted(["rounds.jsonl", "summary.json", "config.json", "client-state",
                                                     "report"])  # fmt: skip
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "notes.txt"]  # only the run's own files went
    assert held_results(run_dir) is None and set(RUN_FILES) >= {"checkpoint.npz", "rounds.jsonl"}


def _sim(capsys, *args: str) -> tuple[int, str]:
    code = launcher.main([str(ROOT), *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_fedrapp_sim_refuses_a_taken_folder_before_it_starts_and_overwrites_only_when_told(
    tiny_model, tmp_path, capsys, monkeypatch
):
    config = small_run(tiny_model, tmp_path, **{"num-rounds": 1, "num-clients": 2, "testbed-samples": 64})
    run_federation(config)
    run_dir = tmp_path / "run"
    before = fingerprint(run_dir)
    overrides = f"model='{tiny_model}' num-clients=2 testbed-samples=64 output-dir='{tmp_path}' run-name='run'"
    started: list[dict] = []
    monkeypatch.setattr(
        launcher, "launch", lambda args, app, values, cfg, folder, clock: started.append(fingerprint(folder))
    )

    code, text = _sim(capsys, "-c", overrides)
    assert code == 2 and not started and "already holds the results of a finished run" in text
    assert "fedrapp-sim --overwrite" in text and len(text.strip().splitlines()) == 1
    code, text = _sim(capsys, "--overwrite", "--check", "-c", overrides)
    assert code == 0 and "replacing the results of a finished run" in text and fingerprint(run_dir) == before
    code, text = _sim(capsys, "--overwrite", "-c", overrides + " resume=true")
    assert code == 2 and "contradict" in text and fingerprint(run_dir) == before
    code, text = _sim(capsys, "--overwrite", "-c", overrides)
    assert started == [{}] and "--overwrite: removed the results of a finished run" in text  # gone before the start


# ------------------------------------------------------------------- 1. a certificate for two real hosts
def make_certificates(folder: Path, sans: list[str], *, days: int = 30, ca_name: str = "ca") -> dict[str, Path]:
    """A CA and a server certificate signed by it whose subjectAltName holds ``sans`` (``DNS:x`` / ``IP:y``), as
    the guide's openssl recipe makes them (EC keys here: fast)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder().subject_name(name(ca_name)).issuer_name(name(ca_name))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    entries = [
        x509.IPAddress(ipaddress.ip_address(v[3:])) if v.startswith("IP:") else x509.DNSName(v[4:]) for v in sans
    ]
    cert = (
        x509.CertificateBuilder().subject_name(name("superlink")).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(entries), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = {"ca": folder / f"{ca_name}.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def _check(paths: dict[str, Path], host: str, *addresses: str) -> str:
    return link.check_tls(paths["cert"], paths["key"], paths["ca"], host, 8000, list(addresses))


def test_the_guides_old_certificate_is_refused_before_the_start_naming_the_superlinks_own_address(tmp_path):
    """Before: DNS:superlink.example.org,IP:10.0.0.1 with --host 0.0.0.0 started fine; the SuperLink's own executor
    then failed to verify it on 127.0.0.1 and died, and every run stayed pending while the SuperLink looked
    healthy (only its log said why)."""
    old = make_certificates(tmp_path / "old", ["DNS:superlink.example.org", "IP:10.0.0.1"])
    with pytest.raises(link.LinkError) as err:
        _check(old, "0.0.0.0", "superlink.example.org:8000", "10.0.0.1:8000")
    message = str(err.value)
    assert "\n" not in message and "cannot serve 127.0.0.1:8000 (the SuperLink's own ServerApp executor" in message
    assert "IP address mismatch" in message and "10.0.0.1:8000 (" not in message  # the others are served
    assert "make it again with IP:127.0.0.1 added" in message and "4a-certificates" in message
    assert "DNS:superlink.example.org, IP:10.0.0.1" in message  # what it holds
    assert message.endswith("Until then every run stays pending while the SuperLink looks healthy (its executor dies "
                            "at its first connection)")  # fmt: skip
    # bound to the host's own address, the executor connects there: that certificate serves it
    assert "10.0.0.1:8000 (the SuperLink's own" in _check(old, "10.0.0.1", "superlink.example.org:8000")

    new = make_certificates(tmp_path / "new", ["DNS:superlink.example.org", "IP:10.0.0.1", "IP:127.0.0.1"])
    verdict = _check(new, "0.0.0.0", "superlink.example.org:8000", "10.0.0.1:8000")
    assert "127.0.0.1:8000 (the SuperLink's own ServerApp executor, as --host 0.0.0.0 makes it)" in verdict
    assert "superlink.example.org:8000 (the SuperNodes and flwr)" in verdict and "valid for 29 more days" in verdict
    with pytest.raises(link.LinkError, match=r"cannot serve link\.other\.org:8000 \(the SuperNodes and flwr\): Host"):
        _check(new, "0.0.0.0", "link.other.org:8000")


def test_a_wildcard_superlink_without_the_nodes_address_is_not_passed(tmp_path, capsys):
    """Before: without --address the check tried 127.0.0.1 only and passed a certificate no remote host could use
    (here one that holds 127.0.0.1 alone)."""
    local = make_certificates(tmp_path / "local", ["IP:127.0.0.1"])
    for host in ("0.0.0.0", "::", "[::]"):
        with pytest.raises(link.LinkError) as err:
            _check(local, host)
        message = str(err.value)
        assert "\n" not in message and f"--host {host} listens for SuperNodes on other hosts" in message
        assert "no --address" in message and "--address 10.0.0.1:8000" in message
    # bound to one address, the executor and the nodes use that one: nothing is left unchecked
    assert "127.0.0.1:8000 (the SuperLink's own ServerApp executor, at --host)" in _check(local, "127.0.0.1")
    command = ["check-tls", "--ssl-certfile", str(local["cert"]), "--ssl-keyfile", str(local["key"])]
    command += ["--ssl-ca-certfile", str(local["ca"]), "--host", "0.0.0.0"]
    assert link.main(command) == 1
    assert "no --address says where they connect" in capsys.readouterr().err
    # what a remote node would meet is named, with what it does to the nodes and to flwr
    with pytest.raises(link.LinkError) as err:
        _check(local, "0.0.0.0", "10.0.0.1:8000")
    message = str(err.value)
    assert "cannot serve 10.0.0.1:8000 (the SuperNodes and flwr): IP address mismatch" in message
    assert "make it again with IP:10.0.0.1 added" in message and "stays pending" not in message
    assert "SuperNodes given 10.0.0.1:8000 exit at their start (Flower's exit code 305" in message
    assert "'Connection to the SuperLink is unavailable'" in message and ".." not in message


def test_a_wrong_key_ca_or_date_is_named_in_one_line(tmp_path, capsys):
    good = make_certificates(tmp_path / "a", ["IP:127.0.0.1"])
    other = make_certificates(tmp_path / "b", ["IP:127.0.0.1"], ca_name="other-ca")
    expired = make_certificates(tmp_path / "c", ["IP:127.0.0.1"], days=-1)
    with pytest.raises(link.LinkError, match="do not go together"):
        _check({**good, "key": other["key"]}, "127.0.0.1")
    with pytest.raises(link.LinkError, match="unable to get local issuer certificate"):
        _check({**good, "ca": other["ca"]}, "127.0.0.1")
    with pytest.raises(link.LinkError, match="certificate has expired.*make it again valid today, signed by"):
        _check(expired, "127.0.0.1")
    command = ["check-tls", "--ssl-certfile", str(good["cert"]), "--ssl-keyfile", str(good["key"])]
    command += ["--ssl-ca-certfile", str(other["ca"]), "--host", "0.0.0.0", "--database", "state.db"]
    assert link.main(command) == 1  # flower-superlink's other options are passed over
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1 and out.err.startswith("fedrapp-link: ")


# ------------------------------------------------------------------ 4. the wait for a restarted SuperLink
class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def superlink_health(port: int, paths: dict[str, Path], after: float) -> Iterator[None]:
    """A stand-in for a SuperLink that starts listening (TLS, ``/health``) ``after`` seconds from now."""
    servers: list[http.server.HTTPServer] = []

    def serve() -> None:
        time.sleep(after)
        server = http.server.HTTPServer(("127.0.0.1", port), _Health)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(paths["cert"], paths["key"])
        server.socket = context.wrap_socket(server.socket, server_side=True)
        servers.append(server)
        server.serve_forever(poll_interval=0.05)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        deadline = time.monotonic() + after + 5
        while not servers and time.monotonic() < deadline:
            time.sleep(0.05)
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def connection(tmp_path, monkeypatch) -> Callable[..., None]:
    """Writes the connection ``fedrapp`` (to ``127.0.0.1:<port>`` with a CA) into a fresh ``$FLWR_HOME``."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    (tmp_path / "flwr-home").mkdir()

    def write(port: int, ca: Path) -> None:
        (tmp_path / "flwr-home" / "config.toml").write_text(
            f'[superlink]\ndefault = "fedrapp"\n\n[superlink.fedrapp]\naddress = "127.0.0.1:{port}"\n'
            f'root-certificates = "{ca}"\n'
        )

    return write


def test_the_wait_for_a_restarted_superlink_says_so_once_and_goes_on_as_soon_as_it_listens(
    tmp_path, connection, capsys
):
    """Before: a resume submitted at once after the restart failed, 'Connection to the SuperLink is unavailable'
    (exit 1), for the ~7.5 s the restarted SuperLink took to listen."""
    paths = make_certificates(tmp_path / "tls", ["DNS:superlink.example.org", "IP:127.0.0.1"])
    port = launcher.free_port()
    connection(port, paths["ca"])
    started = time.monotonic()
    with superlink_health(port, paths, after=1.0):
        assert link.main(["wait", "fedrapp", "--timeout", "30"]) == 0
    assert 1.0 <= time.monotonic() - started < 15
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and f"(127.0.0.1:{port}) does not answer yet" in lines[0]
    assert "waiting up to 30 s for it to listen" in lines[0] and "answers after" in lines[1]
    with superlink_health(port, paths, after=0.0):  # listening already: nothing to say
        time.sleep(0.5)
        assert link.main(["wait", "fedrapp"]) == 0
    assert capsys.readouterr().out == ""


def test_the_wait_fails_at_once_on_a_certificate_the_connection_refuses_and_after_its_bound_on_silence(
    tmp_path, connection, capsys
):
    paths = make_certificates(tmp_path / "tls", ["DNS:superlink.example.org", "IP:10.0.0.1"])
    port = launcher.free_port()
    connection(port, paths["ca"])
    with superlink_health(port, paths, after=0.0):
        time.sleep(0.5)
        started = time.monotonic()
        assert link.main(["wait", "fedrapp", "--timeout", "30"]) == 1
        assert time.monotonic() - started < 5  # waiting cannot fix a certificate
    err = capsys.readouterr().err
    assert "certificate is refused: IP address mismatch" in err and "fedrapp-link check-tls" in err
    assert ".." not in err  # OpenSSL's reason ends with a period of its own
    started = time.monotonic()
    assert link.main(["wait", "fedrapp", "--timeout", "1"]) == 1  # nothing listens
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert "did not answer within 1 s (last: Connection refused)" in err and len(err.strip().splitlines()) == 1
    assert link.main(["wait", "nowhere"]) == 1 and "'nowhere' not found" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- 6. the units
UNITS = ROOT / "conf" / "systemd"


def unit_commands(unit: Path, instance: str = "0") -> dict[str, list[str]]:
    """A unit's ``Exec*`` lines (continuations joined), ``%i`` and the ``${VAR}`` of the example env file
    substituted, split into words as systemd splits them."""
    env = {}
    for line in (UNITS / "supernode-0.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value.strip('"')
    text = unit.read_text().replace("\\\n", " ").replace("%i", instance)
    commands = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("Exec"):
            for name, val in env.items():
                value = value.replace("${" + name + "}", val)
            commands[key] = shlex.split(value)
    return commands


def test_the_units_start_the_guides_programs_with_options_they_accept():
    """Every option in the shipped units parses with the program's own parser (a misspelt flag would make the unit
    fail at its first start)."""
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    from fedrapp_app.deploy import cli as executor_cli

    parsers = {
        "flower-superlink": lambda argv: _parse_args_run_superlink().parse_args(argv),
        "fedrapp-supernode": lambda argv: _parse_args_run_supernode().parse_args(argv),  # flower-supernode's
        "fedrapp-superexec": lambda argv: executor_cli.options_from(executor_cli.parser().parse_args(argv)),
        "fedrapp-link": lambda argv: link.parser().parse_args(argv),
    }
    seen = set()
    for unit in sorted(UNITS.glob("*.service")):
        for key, words in unit_commands(unit).items():
            program = Path(words[0]).name
            assert words[0] == f"/opt/fedrapp/.venv/bin/{program}", (unit.name, key, words[0])
            parsers[program](words[1:])
            seen.add(program)
    assert seen == set(parsers)
    assert unit_commands(UNITS / "fedrapp-superlink.service")["ExecStart"][0].endswith("/flower-superlink")
    node = unit_commands(UNITS / "fedrapp-supernode@.service", "3")["ExecStart"]
    assert node[node.index("--node-config") + 1] == "client-id=3 state-dir='/var/lib/fedrapp/state' "
    assert node[node.index("--auth-supernode-private-key") + 1] == "/etc/fedrapp/keys/client3"


def test_the_superlink_units_check_covers_every_address_the_guide_puts_in_the_certificate():
    """Before: ExecStartPre checked the DNS name only, not the IP the guide's certificate (and its manual check)
    holds, so a certificate without it passed the unit's check and every node given that IP failed."""
    guide = (ROOT / "docs" / "deployment.md").read_text()
    recipe = re.search(r'printf "subjectAltName=([^"]+)" > san.ext', guide)
    assert recipe is not None
    in_certificate = {entry.split(":", 1)[1] for entry in recipe.group(1).split(",")}
    check = link.parser().parse_known_args(unit_commands(UNITS / "fedrapp-superlink.service")["ExecStartPre"][1:])[0]
    checked = {link.split_address(a)[0] for a in check.address} | {link.own_address(check.host)}
    assert checked == in_certificate == {"superlink.example.org", "10.0.0.1", "127.0.0.1"}
    start = unit_commands(UNITS / "fedrapp-superlink.service")["ExecStart"]
    assert start[start.index("--host") + 1] == check.host and start[start.index("--port") + 1] == str(check.port)
    # and the guide's own checks (4a, 4b, 5) name the same addresses
    commands = re.findall(r"fedrapp-link check-tls (.*?)\n(?:flower|```)", guide.replace("\\\n", " "), re.S)
    assert len(commands) == 3
    for command in commands:
        args = link.parser().parse_known_args(["check-tls", *shlex.split(command)])[0]
        assert {link.split_address(a)[0] for a in args.address} | {link.own_address(args.host)} == in_certificate


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_units_pass_systemd_analyze_verify(tmp_path):
    """As installed, with the code's folder where this interpreter's environment is (systemd checks that every
    command exists and is executable)."""
    bindir = str(Path(sys.executable).parent) + "/"
    for unit in UNITS.glob("*.service"):
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/fedrapp/.venv/bin/", bindir))
    names = ["fedrapp-superlink.service", "fedrapp-supernode@0.service", "fedrapp-superexec@0.service"]
    done = subprocess.run(
        ["systemd-analyze", "verify", *(f"./{name}" for name in names)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and not output.strip(), output


def test_the_guides_iptables_recipe_accepts_loopback_before_it_drops():
    """Before: ACCEPT from the node subnet, then DROP port 8000, dropped 127.0.0.1 -> :8000 too (loopback goes
    through INPUT), the SuperLink's own executor with it: every run stayed pending. iptables takes the first rule
    that matches, in the order appended."""
    guide = (ROOT / "docs" / "deployment.md").read_text()
    rules = [shlex.split(line)[4:] for line in guide.splitlines() if line.startswith("sudo iptables -A INPUT")]
    drops = [i for i, rule in enumerate(rules) if rule[-2:] == ["-j", "DROP"]]
    assert drops and "--dport" in rules[drops[0]]
    loopback = [i for i, rule in enumerate(rules) if rule == ["-i", "lo", "-j", "ACCEPT"]]
    assert loopback and loopback[0] < drops[0], rules


# -------------------------------------------------------------- 3. a SuperNode after a certificate mistake
class Supervised:
    """What systemd's ``Restart=on-failure`` does for a unit, with ``RestartSec=restart_after``: start ``command``
    again whenever it exits with a status other than 0; each exit is recorded as (seconds, status)."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, restart_after: float = 1.0) -> None:
        self.command, self.env, self.log, self.restart_after = command, env, log, restart_after
        self.exits: list[tuple[float, int]] = []
        self.current: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            with self.log.open("a") as out:
                self.current = subprocess.Popen(
                    self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            status = self.current.wait()
            self.exits.append((time.monotonic(), status))
            if status == 0 or self.stopping.wait(self.restart_after):
                return

    def stop(self) -> None:
        self.stopping.set()
        if self.current is not None:
            launcher.stop_process_group(self.current)
        self.thread.join(timeout=30)


def _until(done: Callable[[], bool], timeout: float, what: str, logs: Callable[[], str]) -> float:
    """Wait until ``done()``, up to ``timeout`` seconds; the seconds it took."""
    started = time.monotonic()
    while not done():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:g} s\n{logs()}")
        time.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.slow
def test_a_supernode_that_gave_up_on_a_bad_certificate_comes_back_on_its_own_once_the_superlink_is_right(tmp_path):
    """About a minute. The SuperLink is restarted on a certificate its CA did not sign (the mistake), then on the
    good one again. Before: the SuperNodes gave up reconnecting at the first TLS error and stayed up, offline for
    good (Flower's own SuperNode, beside ours here, still does). fedrapp-supernode exits (status 1) once it gave up,
    its supervisor starts it again (refused while the certificate is wrong), and it is back with the good one."""
    from fedrapp_app.running.processes import LAUNCH_ID_ENV, stop_marked

    good = make_certificates(tmp_path / "good", ["IP:127.0.0.1"])
    bad = make_certificates(tmp_path / "bad", ["IP:127.0.0.1"], ca_name="other-ca")
    port = launcher.free_port()
    launch_id = f"recovery-{port}"
    env = {**launcher.contained_env(tmp_path / "flwr-home"), LAUNCH_ID_ENV: launch_id}
    env["FLWR_HOME"] = str(tmp_path / "flwr-home")  # its own connection, whatever the caller's FLWR_HOME
    (tmp_path / "flwr-home").mkdir()
    (tmp_path / "flwr-home" / "config.toml").write_text(
        f'[superlink.fedrapp]\naddress = "127.0.0.1:{port}"\nroot-certificates = "{good["ca"]}"\n'
    )
    connection = link.Connection("fedrapp", f"127.0.0.1:{port}", False, good["ca"])
    links: list[subprocess.Popen] = []

    def start_link(paths: dict[str, Path]) -> float:
        command = ["flower-superlink", "--host", "127.0.0.1", "--port", str(port), "--database", "state.db"]
        command += ["--ssl-ca-certfile", str(paths["ca"]), "--ssl-certfile", str(paths["cert"])]
        command += ["--ssl-keyfile", str(paths["key"]), "--disable-runtime-dependency-installation"]
        with (tmp_path / "superlink.log").open("a") as out:
            links.append(subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip

        def listening() -> bool:
            try:
                return link.probe(connection, timeout=1.0) is None
            except link.LinkError:  # the nodes' CA refuses its certificate: it listens
                return paths is not good

        _until(listening, 60, "the SuperLink listens", logs)
        return time.monotonic()

    def node_command(program: str, log: str) -> list[str]:
        return [program, "--superlink", f"127.0.0.1:{port}", "--root-certificates", str(good["ca"]),
                "--port", str(launcher.free_port()), "--node-config", f"client-id={log[-1]}"]  # fmt: skip

    def logs() -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(tmp_path.glob("*.log"))
        )

    def connected(log: Path) -> int:
        return log.read_text(errors="replace").count("SuperNode ID:") if log.is_file() else 0

    ours_log, flowers_log = tmp_path / "node0.log", tmp_path / "node1.log"
    start_link(good)
    ours = Supervised(node_command("fedrapp-supernode", "node0"), env, ours_log)
    flowers = subprocess.Popen(node_command("flower-supernode", "node1"), env=env, stdout=flowers_log.open("w"),
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    report: dict[str, float] = {}
    try:
        _until(lambda: connected(ours_log) == 1 and connected(flowers_log) == 1, 60, "both nodes connect", logs)
        launcher.stop_process_group(links[-1])
        bad_at = start_link(bad)
        report["gave_up_and_exited_s"] = _until(lambda: len(ours.exits) >= 1, 60, "fedrapp-supernode exits", logs)
        assert ours.exits[0][1] == 1
        text = ours_log.read_text(errors="replace")
        assert "SSL/TLS handshake error detected." in text and "fedrapp-supernode: the SuperNode, up for" in text
        assert "gave up reconnecting to the SuperLink" in text and "Restart=on-failure" in text
        # started again while the certificate is still wrong: refused at its start, and started again
        _until(lambda: len(ours.exits) >= 2, 60, "a start refused on the bad certificate", logs)
        assert ours.exits[1][1] == 1 and "Exit Code: 305" in ours_log.read_text(errors="replace")
        launcher.stop_process_group(links[-1])
        good_at = start_link(good)
        report["back_after_the_good_superlink_s"] = _until(lambda: connected(ours_log) == 2, 90, "node back", logs)
        report["bad_certificate_served_s"] = round(good_at - bad_at, 1)
        listed = subprocess.run(["flwr", "supernode", "ls", "fedrapp", "--format", "json"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert '"success": true' in listed.stdout, listed.stdout + listed.stderr
        nodes = {str(n["node-id"]): n for n in json.loads(listed.stdout)["nodes"]}
        ours_id = re.findall(r"SuperNode ID: (\d+)", ours_log.read_text())[-1]
        flowers_id = re.findall(r"SuperNode ID: (\d+)", flowers_log.read_text())[-1]
        assert nodes[ours_id]["status"] == "online", listed.stdout  # registered since the good restart
        assert nodes[ours_id]["online-elapsed"] < time.monotonic() - good_at, listed.stdout
        # Flower's own SuperNode gave up too, but it still runs, offline: a supervisor sees nothing to restart.
        # (The SuperLink lists its old id as online until it misses two heartbeats, up to 60 s.)
        assert flowers.poll() is None and connected(flowers_log) == 1 and flowers_id != ours_id
        assert "SSL/TLS handshake error detected." in flowers_log.read_text(errors="replace")
    finally:
        ours.stop()
        launcher.stop_process_group(flowers)
        for process in links:
            launcher.stop_process_group(process)
        left = stop_marked(launch_id)
    assert left == []
    print(json.dumps({k: round(v, 1) for k, v in report.items()}))
