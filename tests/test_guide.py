"""docs/deployment.md, run as written (issue 36): the guide can no longer drift from what works.

Each command block of the guide is preceded by a comment that says where it runs (``<!-- guide: link -->``,
``nodes`` for node0 and node1, ``you``), whether it keeps running (``background``: a server in its terminal),
what its output must hold (``expect="..."``), the file a TOML block goes into (``file=.flwr/config.toml``), or
why it is not run (``skip (...)``); two comments are actions of the test itself: ``stop-all`` (Ctrl-C on every
server) and ``kill-superlink after-round=N run=NAME`` (a kill -9 of the SuperLink's PID once that run's round N
is recorded).

The slow test executes every block in order, each host a folder with its own home (``HOME``, ``FLWR_HOME``), a
copy of the app as its "clone" ``~/fedrapp`` (the guide's run file cut to 3 rounds, ``FEDRAPP_GUIDE_FULL=1`` keeps
its 5), and what only two machines have rewritten for loopback: ``superlink.example.org`` -> ``localhost``,
``10.0.0.1`` -> ``127.0.0.2``, ports 8000 and 9094 -> free ports (one per node host), ``scp FILE host:DIR`` ->
a copy into that host's home, ``/home/you/`` -> you's home, and for node1 the guide's ``client0`` /
``client-id=0`` -> ``client1`` / ``client-id=1``. The SuperLink binds ``0.0.0.0`` as the guide says, so its own
executor connects over ``127.0.0.1`` as on a real host. The insecure path, then TLS with node authentication, the
same run name refused, a SuperLink killed mid-run, restarted, and the resume submitted right after the restart
(it waits with ``fedrapp-link wait``); then the resumed run's rows are compared with the uninterrupted TLS run's,
and no node may hold more than one warm worker (``--max-workers 1``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedrapp_app.deploy.loopback import RUN_ID_LINE, alive, descendants, group_members, process_name
from fedrapp_app.recording.results import read_rows
from fedrapp_app.running.launch import free_port
from fedrapp_app.running.processes import LAUNCH_ID_ENV, stop_marked

from federation import comparable_rows

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "deployment.md"
HOSTS = ("link", "node0", "node1", "you")
DIRECTIVE = re.compile(r"^<!--\s*guide:(.*?)-->", re.S | re.M)  # at the start of a line
FENCE = re.compile(r"```(\w*)\n(.*?)^```", re.S | re.M)
SCP = re.compile(r"scp (\S+) (link|node0|node1|you):(\S*)")
#: A run id the guide shows (Flower's are 64-bit numbers): replaced by the one the test's last run got.
SHOWN_RUN_ID = re.compile(r"\b\d{17,20}\b")
#: The app files a clone needs to submit a run (what the FAB takes, and the run files).
APP_FILES = ("pyproject.toml", "client_app.py", "server_app.py", "README.md", "LICENSE", "pyproject-run.toml")


@dataclass
class Step:
    """One directive of the guide and the block it applies to."""

    action: str  # run, background, file, skip, stop-all, kill-superlink
    hosts: tuple[str, ...] = ()
    body: str = ""
    lang: str = ""
    expect: tuple[str, ...] = ()
    options: dict[str, str] = field(default_factory=dict)
    line: int = 0


def guide_steps(text: str) -> list[Step]:
    """The guide's directives in order, each with the fenced block right after it (if any)."""
    steps = []
    for match in DIRECTIVE.finditer(text):
        content = match.group(1).strip()
        words = ["skip"] if content.startswith("skip") else shlex.split(content)  # a skip's reason is prose
        line = text.count("\n", 0, match.start()) + 1
        after = text[match.end() :].lstrip("\n")
        fence = FENCE.match(after) if after.startswith("```") else None
        hosts: list[str] = []
        flags, options, expect = set(), {}, []
        for word in words:
            key, sep, value = word.partition("=")
            if word == "nodes":
                hosts += ["node0", "node1"]
            elif word in HOSTS:
                hosts.append(word)
            elif key == "expect":
                expect.append(value)
            elif sep:
                options[key] = value
            else:
                flags.add(word)
        if "skip" in flags:
            action = "skip"
        elif "stop-all" in flags:
            action = "stop-all"
        elif "kill-superlink" in flags:
            action = "kill-superlink"
        elif "file" in options:
            action = "file"
        else:
            action = "background" if "background" in flags else "run"
        if action in ("run", "background", "file") and (fence is None or not hosts):
            raise ValueError(f"docs/deployment.md:{line}: a '{action}' directive needs hosts and a block after it")
        steps.append(
            Step(
                action,
                tuple(hosts),
                fence.group(2) if fence else "",
                fence.group(1) if fence else "",
                tuple(expect),
                options,
                line,
            )
        )
    return steps


def unmarked_command_blocks(text: str) -> list[int]:
    """Lines of ``bash`` blocks that no directive right above says anything about."""
    lines = []
    for fence in FENCE.finditer(text):
        before = text[: fence.start()].rstrip()
        above = [m for m in DIRECTIVE.finditer(before) if m.end() == len(before)]
        if fence.group(1) == "bash" and not above:
            lines.append(text.count("\n", 0, fence.start()) + 1)
    return lines


# ------------------------------------------------------------------------------------ fast: the markings
def test_every_command_block_of_the_guide_is_run_or_skipped_on_purpose():
    text = GUIDE.read_text()
    assert unmarked_command_blocks(text) == [], (
        "mark each block: <!-- guide: HOSTS ... --> or <!-- guide: skip (why) -->"
    )
    steps = guide_steps(text)
    skipped = [s for s in steps if s.action == "skip"]
    assert all(s.body for s in skipped)  # a skip comment sits right above its block
    ran = [s for s in steps if s.action in ("run", "background")]
    # both paths, each host, the crash and the resume: the guide's whole route
    assert {h for s in ran for h in s.hosts} == set(HOSTS)
    assert [s.action for s in steps].count("kill-superlink") == 1 and "stop-all" in [s.action for s in steps]
    assert any("--insecure" in s.body and "flower-superlink" in s.body for s in ran)
    assert sum("--enable-supernode-auth" in s.body for s in ran) == 2  # started, and started again after the kill
    assert any("resume = true" in s.body and "fedrapp-link wait" in s.body for s in ran)


def test_the_rewrites_leave_nothing_that_needs_two_machines(tmp_path):
    guide = Guide(tmp_path, full=False)
    for step in guide_steps(GUIDE.read_text()):
        for host in step.hosts if step.action in ("run", "background", "file") else ():
            script = guide.rewrite(step.body, host)
            for left in ("superlink.example.org", "10.0.0.", ":8000", " 8000", "9094", "scp ", "/home/you"):
                assert left not in script, (step.line, host, left, script)


# ----------------------------------------------------------------------------------------- the runner
@dataclass
class Started:
    step: Step
    host: str
    process: subprocess.Popen
    log: Path


class Guide:
    """Runs the guide's steps on loopback, one folder per host."""

    def __init__(self, root: Path, full: bool) -> None:
        self.root = root
        self.full = full
        self.launch_id = "guide-" + uuid.uuid4().hex
        #: what only two machines have, rewritten for one: the guide's names and addresses, its ports
        self.addresses = {"superlink.example.org": "localhost", "10.0.0.1": "127.0.0.2"}
        self.port = free_port()
        self.runtime_ports = {"node0": free_port(), "node1": free_port()}
        self.started: list[Started] = []
        self.run_ids: list[int] = []
        self.outputs: list[tuple[Step, str, str, float]] = []  # (step, host, output, seconds)
        self.events: dict[str, float] = {}
        self.reaped: dict[str, float] = {}  # node host -> seconds from the SuperLink's kill to its first reaping

    def home(self, host: str) -> Path:
        return self.root / host

    def env(self, host: str) -> dict[str, str]:
        home = self.home(host)
        env = dict(os.environ)
        env.update(
            HOME=str(home),
            FLWR_HOME=str(home / ".flwr"),
            XDG_CACHE_HOME=str(home / ".cache"),
            FEDRAPP_PARTITION_CACHE=str(home / ".cache" / "partitions"),
            UV_CACHE_DIR=str(self.root / "uv"),
            RAY_TMPDIR=str(self.root / "ray"),
            OMP_NUM_THREADS="1",
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1",
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
            HF_HUB_OFFLINE="1",
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        )
        env[LAUNCH_ID_ENV] = self.launch_id
        return env

    def setup(self) -> None:
        for host in HOSTS:
            clone = self.home(host) / "fedrapp"
            clone.mkdir(parents=True)
            for name in APP_FILES:
                shutil.copy2(ROOT / name, clone / name)
            shutil.copytree(ROOT / "conf", clone / "conf")
            run_file = clone / "conf" / "deploy" / "testbed-two-hosts.toml"
            if not self.full:  # 3 rounds of 64 per client instead of 5: the same route, a minute less
                run_file.write_text(run_file.read_text().replace("testbed-samples = 640", "testbed-samples = 384"))

    def rewrite(self, text: str, host: str) -> str:
        for written, here in self.addresses.items():
            text = text.replace(written, here)
        text = re.sub(r"\b8000\b", str(self.port), text)
        if host in self.runtime_ports:
            text = re.sub(r"\b9094\b", str(self.runtime_ports[host]), text)
        text = text.replace("/home/you/", f"{self.home('you')}/")
        if host == "node1":
            text = text.replace("client0", "client1").replace("client-id=0", "client-id=1")

        def copy(match: re.Match) -> str:
            dest = self.home(match.group(2)) / match.group(3)
            folder = dest if match.group(3).endswith("/") or not match.group(3) else dest.parent
            return f"mkdir -p {shlex.quote(str(folder))} && cp {match.group(1)} {shlex.quote(str(dest))}"

        text = SCP.sub(copy, text)
        if self.run_ids:
            text = SHOWN_RUN_ID.sub(str(self.run_ids[-1]), text)
        return text

    def command(self, host: str, script: str) -> list[str]:
        """The command line that runs ``script`` as ``host``."""
        return ["bash", "-e", "-c", script]

    # -- steps
    def do(self, step: Step) -> None:
        if step.action == "skip":
            return
        if step.action == "stop-all":
            self.stop_all()
            return
        if step.action == "kill-superlink":
            self.kill_superlink(int(step.options["after-round"]), step.options["run"])
            return
        for host in step.hosts:
            if step.action == "file":
                path = self.home(host) / step.options["file"]
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as out:
                    out.write(self.rewrite(step.body, host) + "\n")
            elif step.action == "background":
                self.background(step, host)
            else:
                self.run(step, host)

    def run(self, step: Step, host: str) -> None:
        script = self.rewrite(step.body, host)
        started = time.monotonic()
        done = subprocess.run(
            self.command(host, script),
            cwd=self.home(host),
            env=self.env(host),
            capture_output=True,
            text=True,
            timeout=600,
        )
        seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        self.outputs.append((step, host, output, seconds))
        (self.root / f"step-{step.line}-{host}.out").write_text(f"$ {script}\n{output}")
        self.run_ids += [int(m) for m in RUN_ID_LINE.findall(output)]
        missing = [e for e in step.expect if e not in output]
        if done.returncode != 0 or missing:
            raise AssertionError(
                f"docs/deployment.md:{step.line} on {host}: exit {done.returncode}, missing {missing}\n"
                f"--- script\n{script}\n--- output (end)\n{output[-6000:]}\n{self.logs()}"
            )

    def background(self, step: Step, host: str) -> None:
        name = step.options.get("id") or f"{host}-{step.line}"
        log = self.root / f"{name}-{host}.log"
        with log.open("a") as out:
            process = subprocess.Popen(
                self.command(host, self.rewrite(step.body, host)),
                cwd=self.home(host),
                env=self.env(host),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(Started(step, host, process, log))
        self.events[f"started {name}"] = time.monotonic()

    def stop_all(self) -> None:
        for started in reversed(self.started):
            if started.process.poll() is None or group_members(started.process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(started.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for started in self.started:
            while (started.process.poll() is None or group_members(started.process.pid)) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started.process.pid, signal.SIGKILL)
            started.process.wait()

    def kill_superlink(self, after_round: int, run: str) -> None:
        """kill -9 the running SuperLink's own PID once ``run`` has recorded round ``after_round`` (both clients)."""
        rounds = self.home("link") / "fedrapp-link" / "outputs" / run / "rounds.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            rows = read_rows(rounds) if rounds.is_file() else []
            if sum(r["round"] == after_round for r in rows) >= 2:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"{run} never recorded round {after_round}\n{self.logs()}")
        # mid-task: both nodes have taken the next round's message
        nodes = [s for s in self.started if s.host.startswith("node") and s.process.poll() is None]
        submitted = next(s for s in reversed(self.started) if s.host == "you")
        run_id = RUN_ID_LINE.search(submitted.log.read_text(errors="replace"))
        mark = f"[RUN {run_id.group(1) if run_id else '?'}, ROUND {after_round + 1}]"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(mark in s.log.read_text(errors="replace") for s in nodes):
            time.sleep(0.02)
        link = next(s for s in reversed(self.started) if s.host == "link" and s.process.poll() is None)
        tree = [link.process.pid, *descendants(link.process.pid)]  # bash may have become the SuperLink (exec)
        pids = [p for p in tree if process_name(p) == "flower-superlink"]
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        self.events["superlink killed"] = time.monotonic()
        if pids[0] == link.process.pid:  # its parent is this test: reap it at once, as a shell or systemd does
            link.process.wait(timeout=30)  # (a zombie keeps its PID, and its ServerApp would go on: section 5)
        threading.Thread(target=self._watch_reaping, args=(nodes,), daemon=True).start()

    def _watch_reaping(self, nodes: list[Started]) -> None:
        """When each node's executor reaped a task of the killed run (seconds after the kill), for the report."""
        killed = self.events["superlink killed"]
        while time.monotonic() - killed < 300 and len(self.reaped) < len(nodes):
            for started in nodes:
                if started.host not in self.reaped and " reaped: " in started.log.read_text(errors="replace"):
                    self.reaped[started.host] = round(time.monotonic() - killed, 1)
            time.sleep(0.1)

    # -- what is left
    def workers(self, host: str) -> list[int]:
        """The warm workers alive under ``host``'s running executor (children of its forkserver)."""
        found = []
        for started in self.started:
            if started.host != host or started.process.poll() is not None:
                continue
            for pid in descendants(started.process.pid):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if alive(pid) else b""
                if b"multiprocessing.forkserver" in cmdline and b"fedrapp_app.deploy" in cmdline:
                    found += [child for child in descendants(pid) if alive(child)]
        return found

    def logs(self) -> str:
        parts = []
        for started in self.started[-6:]:
            text = started.log.read_text(errors="replace") if started.log.is_file() else ""
            parts.append(f"--- {started.log.name} (end)\n{text[-2500:]}")
        return "\n".join(parts)

    def close(self) -> list[int]:
        self.stop_all()
        return stop_marked(self.launch_id)


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("ssh-keygen")), reason="the guide makes keys with openssl, ssh-keygen"
)
def test_the_deployment_guide_runs_as_written(tmp_path):
    """About 4 minutes on 2 cores (2 SuperNodes, 3 runs and a refused one, a crash and its resume)."""
    run_the_guide(Guide(tmp_path, full=os.environ.get("FEDRAPP_GUIDE_FULL") == "1"))


def run_the_guide(guide: Guide) -> dict:
    """Every step of the guide by ``guide``, then what must hold after it; the report (also in report.json)."""
    tmp_path = guide.root
    guide.setup()
    report: dict = {}
    try:
        for step in guide_steps(GUIDE.read_text()):
            guide.do(step)
        report["workers"] = {host: guide.workers(host) for host in ("node0", "node1")}
        report["reaped"] = [
            line.strip()
            for started in guide.started
            if started.host.startswith("node")
            for line in started.log.read_text(errors="replace").splitlines()
            if " reaped: " in line
        ]
    finally:
        left = guide.close()
    link_out = tmp_path / "link" / "fedrapp-link" / "outputs"
    # The resume (submitted right after the restart, waiting for the SuperLink to listen) ends the run, and its
    # rows are the uninterrupted TLS run's, field by field.
    resumed = json.loads((link_out / "crash-check" / "summary.json").read_text())
    assert resumed["status"] == "finished" and resumed["complete"] and resumed["resumed_after_round"] >= 1
    assert comparable_rows(read_rows(link_out / "crash-check" / "rounds.jsonl")) == comparable_rows(
        read_rows(link_out / "first-check" / "rounds.jsonl")
    )
    # The same name again was refused without touching the insecure check's results.
    insecure = json.loads(
        (tmp_path / "link" / "fedrapp-check" / "outputs" / "first-check" / "summary.json").read_text()
    )
    assert insecure["status"] == "finished" and insecure["complete"]
    # What is left: at most one warm worker per node (--max-workers 1), whatever the crash left open; nothing else.
    assert all(len(pids) <= 1 for pids in report["workers"].values()), report
    assert left == []
    waits = [out for step, host, out, _ in guide.outputs if "resume = true" in step.body]
    listening = re.search(r"answers after ([\d.]+) s", waits[0]) if waits else None
    report["restart_to_listening_seconds"] = float(listening.group(1)) if listening else 0.0
    report["reaped_seconds_after_the_kill"] = guide.reaped
    report["seconds"] = {f"{s.line}:{h}": round(t, 1) for s, h, _, t in guide.outputs}
    print(json.dumps(report, indent=1))
    (tmp_path / "report.json").write_text(json.dumps(report, indent=1))
    return report
