"""docs/deployment.md run across two network namespaces: two hosts as the guide has them, on one machine.

The loopback run of the guide (``tests/test_guide.py``) rewrites the guide's addresses to ``localhost`` and
``127.0.0.2``, so it cannot see a step that works only on loopback. Here nothing of the guide's network is
rewritten: the SuperLink runs in a namespace of its own at ``10.0.0.1`` (``superlink.example.org`` resolves there),
on port 8000 as written, and the SuperNodes, their executors and ``flwr`` run in a second namespace (``10.0.0.2``,
``10.0.0.3``, ``10.0.0.9``), which reaches the first only through a veth pair: it has no route to the SuperLink's
loopback. The two SuperNodes share the second namespace, so node1's Runtime API port is 9095 (section 4 of the
guide: two SuperNodes on one host). Every other rewrite (the hosts' folders, ``scp``, node1's key and client id)
and every check after the run are the loopback test's.

Needs root and ``ip netns`` (skipped with the reason otherwise). The namespaces, their veth pair and the hosts
file ``ip netns exec`` reads (``/etc/netns/NAME/hosts``) are made for the test and removed after it; traffic stays
between them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_guide import Guide, run_the_guide

#: The guide's hosts and their addresses (its table); node0, node1 and you share one namespace.
LINK_ADDRESS = "10.0.0.1"
NODE_ADDRESSES = {"node0": "10.0.0.2", "node1": "10.0.0.3", "you": "10.0.0.9"}
NETNS_ETC = Path("/etc/netns")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


class TwoHosts:
    """Two network namespaces joined by a veth pair: ``link`` (the SuperLink host) and ``nodes`` (the node hosts
    and you), each with its loopback up, ``superlink.example.org`` resolving to the link's address in both."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.link, self.nodes = f"fedrapp-link-{tag}", f"fedrapp-nodes-{tag}"
        self._veth = (f"frl{tag}", f"frn{tag}")  # interface names: at most 15 characters
        self._made: list[str] = []
        self._etc_made = False

    def make(self) -> None:
        for name in (self.link, self.nodes):
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("link", "add", self._veth[0], "netns", self.link, "type", "veth", "peer", "name", self._veth[1],
            "netns", self.nodes)  # fmt: skip
        _ip("-n", self.link, "addr", "add", f"{LINK_ADDRESS}/24", "dev", self._veth[0])
        for address in NODE_ADDRESSES.values():
            _ip("-n", self.nodes, "addr", "add", f"{address}/24", "dev", self._veth[1])
        for name, veth in zip((self.link, self.nodes), self._veth, strict=True):
            _ip("-n", name, "link", "set", veth, "up")
        self._etc_made = not NETNS_ETC.exists()
        for name in (self.link, self.nodes):
            (NETNS_ETC / name).mkdir(parents=True)
            (NETNS_ETC / name / "hosts").write_text(
                f"127.0.0.1 localhost\n::1 localhost\n{LINK_ADDRESS} superlink.example.org\n"
            )

    def remove(self) -> None:
        """Delete what ``make`` made (the veth pair goes with its namespaces); safe after a partial ``make``."""
        for name in self._made:
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        if self._etc_made and NETNS_ETC.is_dir() and not any(NETNS_ETC.iterdir()):
            NETNS_ETC.rmdir()

    def namespace(self, host: str) -> str:
        return self.link if host == "link" else self.nodes


@pytest.fixture
def two_hosts() -> Iterator[TwoHosts]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("no ip command (iproute2) here")
    hosts = TwoHosts()
    try:
        try:
            hosts.make()
        except OSError as err:
            pytest.skip(f"cannot make network namespaces here ({err})")
        yield hosts
    finally:
        hosts.remove()


class NamespacedGuide(Guide):
    """The guide's steps with its own names, addresses and ports, each host's commands in its namespace."""

    def __init__(self, root: Path, full: bool, hosts: TwoHosts) -> None:
        super().__init__(root, full)
        self.hosts = hosts
        self.addresses = {}  # the guide's own, as written
        self.port = 8000
        self.runtime_ports = {"node0": 9094, "node1": 9095}  # one namespace for both: two ports

        self.reach: dict[str, str] = {}  # from the nodes' side, while the SuperLink runs: address -> outcome

    def command(self, host: str, script: str) -> list[str]:
        return ["ip", "netns", "exec", self.hosts.namespace(host), *super().command(host, script)]

    def kill_superlink(self, after_round: int, run: str) -> None:
        """Before the kill (the SuperLink listens, a run is under way): what the nodes' side reaches on port 8000."""
        for address in (LINK_ADDRESS, "127.0.0.1"):
            try_it = f"import socket; socket.create_connection(({address!r}, {self.port}), 2).close()"
            done = subprocess.run(self.command("node0", f"{sys.executable} -c {shlex.quote(try_it)}"),
                                  capture_output=True, text=True, timeout=30)  # fmt: skip
            self.reach[address] = "connects" if done.returncode == 0 else done.stderr.strip().splitlines()[-1]
        super().kill_superlink(after_round, run)


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("ssh-keygen")), reason="the guide makes keys with openssl, ssh-keygen"
)
def test_the_deployment_guide_runs_across_two_network_namespaces(tmp_path, two_hosts):
    """About 5 minutes on 2 busy cores, as the loopback run. The SuperLink is reached from the nodes only at
    10.0.0.1: a certificate, a connection or a command that works on loopback only fails here."""
    guide = NamespacedGuide(tmp_path, full=os.environ.get("FEDRAPP_GUIDE_FULL") == "1", hosts=two_hosts)
    run_the_guide(guide)  # every step, then the loopback test's checks (rows, the refusal, workers, leftovers)
    # the nodes' side reached the SuperLink at 10.0.0.1 only: nothing of it listens on their loopback
    assert guide.reach[LINK_ADDRESS] == "connects", guide.reach
    assert "ConnectionRefusedError" in guide.reach["127.0.0.1"], guide.reach
