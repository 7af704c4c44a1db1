"""Two real hosts without surprises (issue 36), the fast part: a run folder with results is never overwritten
silently (in-process ServerApp body and fedrapp-sim; the deployment's refusal is in the guide's test,
``tests/test_guide.py``), the certificate check before a SuperLink starts, the bounded wait for a restarted
SuperLink, and the systemd units the guide ships."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
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
    assert "nothing was written" in message and "another run-name" in message
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
    # bound to the host's own address, the executor connects there: that certificate serves it
    assert "10.0.0.1:8000 (the SuperLink's own" in _check(old, "10.0.0.1", "superlink.example.org:8000")

    new = make_certificates(tmp_path / "new", ["DNS:superlink.example.org", "IP:10.0.0.1", "IP:127.0.0.1"])
    verdict = _check(new, "0.0.0.0", "superlink.example.org:8000", "10.0.0.1:8000")
    assert "127.0.0.1:8000 (the SuperLink's own ServerApp executor, as --host 0.0.0.0 makes it)" in verdict
    assert "superlink.example.org:8000 (the SuperNodes and flwr)" in verdict and "valid for 29 more days" in verdict
    with pytest.raises(link.LinkError, match=r"cannot serve link\.other\.org:8000 \(the SuperNodes and flwr\): Host"):
        _check(new, "0.0.0.0", "link.other.org:8000")


def test_a_wrong_key_ca_or_date_is_named_in_one_line(tmp_path, capsys):
    good = make_certificates(tmp_path / "a", ["IP:127.0.0.1"])
    other = make_certificates(tmp_path / "b", ["IP:127.0.0.1"], ca_name="other-ca")
    expired = make_certificates(tmp_path / "c", ["IP:127.0.0.1"], days=-1)
    with pytest.raises(link.LinkError, match="do not go together"):
        _check({**good, "key": other["key"]}, "127.0.0.1")
    with pytest.raises(link.LinkError, match="unable to get local issuer certificate"):
        _check({**good, "ca": other["ca"]}, "127.0.0.1")
    with pytest.raises(link.LinkError, match="certificate has expired"):
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
        "flower-supernode": lambda argv: _parse_args_run_supernode().parse_args(argv),
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
    node = unit_commands(UNITS / "fedrapp-supernode@.service", "3")["ExecStart"]
    assert node[node.index("--node-config") + 1] == "client-id=3 state-dir='/var/lib/fedrapp/state' "
    assert node[node.index("--auth-supernode-private-key") + 1] == "/etc/fedrapp/keys/client3"


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
