"""Flower strategy: one personalized prompt per client per round, aggregated by a pure server rule.

Client contract (what the ClientApp must honour):
- ``query`` message ``{"config": {seed, num-clients}}``: reply ``{"info": ConfigRecord(client-id, num-batches,
  position, num-samples), "prompt": P0}``;
- ``train`` message ``{"prompt": P, "config": {server-round, client-id, num-clients, stream-position, ...}}``:
  adapt from P on the next batch of the stream and reply ``{"prompt": P~, "metrics": {client-id, h-pre, h-post,
  num-examples, remaining-batches, stream-position, skipped, ...reporting}}``; ``{"metrics": {client-id,
  skipped-batch: 1, ...}}`` when no sample of the batch could be decoded; ``{"metrics": {client-id,
  exhausted: 1}}`` when the stream ended. A failure is an error reply
  (``fedrapp_app.federation.errors.describe``). A train message may also hold ``"probe"``, a second prompt the
  rule asks the client to score (FedRAPP's trust probe), and ``"payload"``, arrays the rule sends beside the prompt;
  a method that uploads a payload adds ``"payload"`` to its query and train replies (``records.py``).

``num-clients = 0`` means one client per SuperNode: the ServerApp counts the connected nodes first
(``count_nodes``); the strategy sends that number with every message.

Server memory is keyed on the client id a client reports (its data partition), never on Flower's node id,
which changes whenever a SuperNode restarts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedrapp_app.aggregation import check_output, make_rule
from fedrapp_app.aggregation.common import PAYLOAD_PREFIX, PROBES, RoundOutput
from fedrapp_app.config.deployment import expected_nodes
from fedrapp_app.federation.errors import clean_reason, describe
from fedrapp_app.federation.exchange import send_and_collect
from fedrapp_app.federation.population import Population, newcomer_prompt
from fedrapp_app.federation.records import (
    CONFIG,
    INFO,
    METRICS,
    NOTES,
    OWN_PROMPT_FIELDS,
    PAYLOAD,
    PROMPT,
    Outcome,
    RejectedReply,
    Upload,
    arrays_to_record,
    flatten,
    outside_private_reply,
    parse_outcome,
    parse_train_reply,
    payload_shapes,
    prompt_to_record,
    record_to_arrays,
    record_to_prompt,
    unflatten,
)
from fedrapp_app.privacy.ledger import PrivacyLedger
from fedrapp_app.recording.checkpoint import ServerCheckpoint

log = logging.getLogger("flwr.fedrapp.strategy")

#: With num-clients = 0, the node count must stay the same this long before it is taken as the federation size
#: (simulated nodes register within milliseconds; a SuperNode polls every 3 s).
NODE_SETTLE_SECONDS = 3.0


class RuleFailed(RuntimeError):
    """The server rule raised, or returned what the server cannot store (wrong shapes, non-finite values)."""


class ClientTaken(RejectedReply):
    """A node claims a client that another connected node serves: a SuperNode restarted inside the SuperLink's
    heartbeat window (its old node id stays listed until two heartbeats are missed, about 60 s), or two
    SuperNodes given the same client id."""

    def __init__(self, client: int, node: int) -> None:
        super().__init__(
            f"client-id {client} is already served by node {node} (asked again once that node has left: a "
            "restarted SuperNode's old node id stays connected until the SuperLink misses two heartbeats)"
        )
        self.client = client


@dataclass
class ServerState:
    """Everything the server carries from one round to the next (what a checkpoint saves).

    ``memory`` and ``sent`` are [N, d] float32 (N = num-clients, d = flattened prompt size); ``sent[i]`` is
    exactly the prompt client i starts its next round from.
    """

    memory: np.ndarray
    sent: np.ndarray
    exhausted: np.ndarray  # [N] bool: the client's stream has ended
    positions: np.ndarray  # [N] int: the client's next stream position (-1 = not known yet)
    round: int = 0
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    rule_state: dict[str, np.ndarray] = field(default_factory=dict)  # what the rule carries (RoundOutput.state)

    @classmethod
    def initial(cls, p0: np.ndarray, num_clients: int, seed: int) -> ServerState:
        """Every client starts from the same initial prompt P0 [d]."""
        tiled = np.tile(p0.astype(np.float32), (num_clients, 1))
        return cls(
            tiled.copy(),
            tiled.copy(),
            np.zeros(num_clients, bool),
            np.full(num_clients, -1),
            0,
            np.random.default_rng(seed),
        )


@dataclass
class ClientRow:
    """One client's outcome in one round, as the results recorder writes it."""

    client_id: int
    node_id: int
    status: str  # "ok" | "failed" | "rejected" | "exhausted" | "missing" | "skipped" | SITTING_OUT
    reason: str = ""
    upload: Upload | None = None
    skipped: list[str] = field(default_factory=list)  # undecodable samples of its batch ("name: reason")
    where: dict[str, str] = field(default_factory=dict)  # where the client ran: host, ray-node, device
    outcome: Outcome | None = None  # calibration bins and per-domain counts, for the results only
    held_out: bool = False  # a held-out client: scored, its upload never read by the rule (population.py)
    dp_epsilon: float | None = None  # under dp: the client's privacy loss after this round's release
    download_bytes: int | None = None  # what the server sent it this round for the rule: prompt, probes, payload


@dataclass
class RoundReport:
    """What happened in a round: the sampled clients' rows and the rule's diagnostics."""

    round: int
    rows: list[ClientRow]
    output: RoundOutput | None
    seconds: float
    aggregate_seconds: float
    rule_error: str = ""  # the server rule raised or returned what the server cannot store: the state is unchanged


def count_nodes(grid: Grid, min_nodes: int, timeout: float, settle: float = NODE_SETTLE_SECONDS) -> int:
    """The federation size for ``num-clients = 0``: the SuperNodes connected once at least ``max(min_nodes, 1)``
    are there and their number has not changed for ``settle`` seconds (bounded by ``timeout``).

    In simulation that is the simulation's ``num-supernodes``; in deployment, the nodes started before the run.
    Under fedrapp-sim the count is final as soon as it reaches the SuperNodes the launcher started
    (:func:`expected_nodes`).
    """
    deadline = time.monotonic() + timeout
    needed = max(min_nodes, 1)
    known = expected_nodes()
    count, since = -1, time.monotonic()
    while True:
        now = len(list(grid.get_node_ids()))
        if now != count:
            count, since = now, time.monotonic()
        if count >= needed and (time.monotonic() - since >= settle or (known and count >= known)):
            break
        if time.monotonic() > deadline:
            if count >= 1:
                break
            raise RuntimeError(
                f"num-clients = 0 (one client per SuperNode), but no SuperNode connected within "
                f"node-wait-timeout={timeout:g}s: start the SuperNodes, or check that they reach the SuperLink"
            )
        time.sleep(0.25)
    log.info("num-clients = 0: one client per SuperNode, %d SuperNode(s) connected", count)
    return count


def no_client_started(failed: dict[int, str]) -> str:
    """One message for a federation whose every node failed discovery: each distinct reason once."""
    reasons: dict[str, list[int]] = {}
    for node, reason in failed.items():
        reasons.setdefault(reason, []).append(node)
    if len(reasons) == 1:
        return f"no ClientApp could start; all {len(failed)} node(s) reported: {next(iter(reasons))}"
    lines = [f"  {len(nodes)} node(s): {reason}" for reason, nodes in reasons.items()]
    return "no ClientApp could start; the nodes reported:\n" + "\n".join(lines)


def _notes(content: RecordDict) -> tuple[list[str], dict[str, str], list[str]]:
    """What a reply's notes say, for the results only (never read by the rule): the undecodable samples of
    the batch, where the client ran (``host``, ``ray-node``, ``device``) and the batch's shift domains."""
    notes = content.config_records.get(NOTES)
    if notes is None:
        return [], {}, []
    skipped, domains = notes.get("skipped-samples"), notes.get("domains")
    where = {k: str(notes[k]) for k in ("host", "ray-node", "device") if isinstance(notes.get(k), str)}
    return _texts(skipped), where, _texts(domains)


def _texts(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


class PersonalizedPromptStrategy(Strategy):
    """Personalized prompt exchange around one server rule (fedrapp, none-fed, fedavg, fedamp, fedamp-cos).

    Parameters
    ----------
    rule, rule_params : name and hyperparameters of the server rule (``fedrapp_app.aggregation``).
    num_clients : clients of the federation; client ids are 0 .. num_clients - 1.
    fraction : share of the available (discovered, not exhausted) clients sampled each round.
    min_nodes : nodes to wait for before the first round (0 = num_clients).
    node_wait_timeout : seconds to wait for them; the run goes on with the nodes that came.
    seed : seeds the client sampling.
    max_norm_ratio : an upload whose norm exceeds this multiple of ||P0|| is rejected.
    client_config : extra values for every train message's config (the run token and snapshot folder).
    population : late joiners, held-out clients and the drop rate (``population.py``); None = everyone, every
        round it is sampled for.
    privacy : under ``dp = true``, the ledger of each client's privacy loss (``privacy/ledger.py``); None = off.
    """

    def __init__(
        self,
        rule: str,
        rule_params: dict,
        num_clients: int,
        fraction: float = 1.0,
        min_nodes: int = 0,
        node_wait_timeout: float = 300.0,
        seed: int = 0,
        max_norm_ratio: float = 100.0,
        client_config: dict | None = None,
        population: Population | None = None,
        privacy: PrivacyLedger | None = None,
    ) -> None:
        self.rule_name = rule
        self.privacy = privacy
        self.rule = make_rule(rule, rule_params)
        self.num_clients = num_clients
        self.fraction = fraction
        self.min_nodes = min_nodes or num_clients
        self.node_wait_timeout = node_wait_timeout
        self.seed = seed
        self.max_norm_ratio = max_norm_ratio
        self.client_config = dict(client_config or {})
        self.population = population or Population(num_clients)
        #: what a query (discovery) message tells a client besides seed and num-clients: where its method comes from
        self.query_config = {k: v for k, v in self.client_config.items() if k == "method-origin"}
        self.node_of: dict[int, int] = {}  # client id -> node id
        self.shapes: list[tuple[int, ...]] | None = None
        self.payload: dict[str, tuple[int, ...]] = {}  # the names and shapes of the method's payload (none: {})
        self._download: dict[int, int] = {}  # client -> bytes of the arrays sent to it this round
        self.p0: np.ndarray | None = None
        self.state: ServerState | None = None
        self.last_report: RoundReport | None = None
        self._failed: dict[int, str] = {}  # node id -> why its discovery failed
        self._taken: dict[int, int] = {}  # node id -> the client it claimed while another connected node served it
        self.num_samples: dict[int, int] = {}  # client id -> samples in its stream (from discovery)
        self.sampled: list[int] = []  # the clients sampled for the current round
        self.sitting_out: dict[int, tuple[str, str]] = {}  # the other live clients: (status, why), per round
        self._absent: list[int] = []  # sampled clients whose node was not connected (sent nothing)
        self._outage_since: float | None = None  # when no sampled client's node was connected any more
        self._round_start = 0.0

    # ---------------------------------------------------------------- discovery
    @property
    def finished(self) -> bool:
        """True once every known client's stream has ended."""
        return self.state is not None and len(self.node_of) > 0 and bool(self.state.exhausted[list(self.node_of)].all())

    def connect(self, grid: Grid) -> None:
        """Wait (bounded) until ``min_nodes`` clients answered discovery; fail fast if every node fails."""
        deadline = time.monotonic() + self.node_wait_timeout
        while True:
            self.discover(grid, timeout=max(deadline - time.monotonic(), 1.0))
            if len(self.node_of) >= self.min_nodes:
                break
            if self._failed and not self.node_of:
                raise RuntimeError(no_client_started(self._failed))
            if time.monotonic() > deadline:
                break
            log.info("waiting for clients: %d/%d answered", len(self.node_of), self.min_nodes)
            time.sleep(1.0)
        if self.state is None:
            raise RuntimeError(
                f"no client answered within node-wait-timeout={self.node_wait_timeout:g}s "
                f"({len(list(grid.get_node_ids()))} node(s) connected): check that the SuperNodes run and "
                "that their ClientApp starts (see their logs)"
            )
        if len(self.node_of) < self.min_nodes:
            log.warning("starting with %d of %d expected clients", len(self.node_of), self.min_nodes)

    def discover(self, grid: Grid, timeout: float | None = None) -> set[int]:
        """Ask nodes never seen before for their client id, stream size and initial prompt (a ``query``).

        A node whose ClientApp fails to answer is not asked again (a restarted SuperNode comes back with a
        new node id and is asked then). A node refused because another connected node served its client is
        asked again once that node has left (``ClientTaken``). Returns the connected nodes.
        """
        connected = sorted(grid.get_node_ids())
        for node, client in list(self._taken.items()):
            if node not in connected or self.node_of.get(client) not in connected:
                del self._taken[node]
                if node in connected:
                    self._failed.pop(node, None)
        seen = set(self.node_of.values()) | set(self._failed)
        unknown = [n for n in connected if n not in seen]
        if not unknown:
            return set(connected)
        queries = [
            Message(
                RecordDict(
                    {CONFIG: ConfigRecord({"seed": self.seed, "num-clients": self.num_clients, **self.query_config})}
                ),
                dst_node_id=n,
                message_type=MessageType.QUERY,
            )
            for n in unknown
        ]
        log.info(
            "asking %d SuperNode(s) for their client; their ClientApps start now (the first time: imports, the "
            "model and the data, seconds) ...",
            len(queries),
        )
        asked = time.monotonic()
        replies = send_and_collect(grid, queries, timeout or self.node_wait_timeout)
        log.info("%d of %d SuperNode(s) answered in %.1f s", len(replies), len(queries), time.monotonic() - asked)
        node_of_query = {q.metadata.message_id: q.metadata.dst_node_id for q in queries}  # ids set by the push
        answered: dict[int, str | None] = {}  # node -> failure reason (None = registered)
        for reply in replies:
            # Error replies can come from the SuperLink itself: map them back through the query they answer.
            node = node_of_query.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if reply.has_error():
                answered[node] = clean_reason(reply.error.reason)
                continue
            try:
                self._register(node, reply.content, connected)
                answered[node] = None
            except ClientTaken as err:
                answered[node] = str(err)
                self._taken[node] = err.client
            except RejectedReply as err:
                answered[node] = str(err)
            except (KeyError, TypeError, ValueError) as err:  # a malformed answer: the node stays unknown
                answered[node] = f"malformed discovery reply ({type(err).__name__}: {err})"
        for node in unknown:
            reason = answered.get(node, "no answer to the discovery query before the timeout")
            if reason is not None:
                self._failed[node] = reason
                log.warning("node %s failed discovery: %s", node, reason)
        return set(connected)

    def _wait_for_nodes(self, grid: Grid, sampled: list[int]) -> set[int]:
        """None of the sampled clients' nodes is connected (their SuperNodes stopped or restart): wait for one
        to come back (a restarted SuperNode registers within seconds), up to ``node_wait_timeout`` per outage.
        Returns the connected nodes."""
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            log.warning(
                "none of the nodes of clients %s is connected; waiting up to node-wait-timeout=%gs for them",
                sampled,
                self.node_wait_timeout,
            )
        connected = set(grid.get_node_ids())
        while time.monotonic() < self._outage_since + self.node_wait_timeout:
            time.sleep(1.0)
            connected = self.discover(grid)
            if any(self.node_of[c] in connected for c in sampled):
                break
        return connected

    def _register(self, node: int, content: RecordDict, connected: list[int]) -> None:
        info = content.config_records.get(INFO)
        if info is None or PROMPT not in content.array_records:
            raise RejectedReply("discovery reply lacks 'info' or 'prompt'")
        # Every field is read before any state changes: a malformed answer leaves the state as it was.
        client, position, num_batches = int(info["client-id"]), int(info["position"]), int(info["num-batches"])
        num_samples = int(info["num-samples"])
        if not 0 <= client < self.num_clients:
            raise RejectedReply(f"client-id {client} outside 0..{self.num_clients - 1} (num-clients)")
        previous = self.node_of.get(client)
        if previous is not None and previous != node:
            if previous in connected:
                raise ClientTaken(client, previous)
            log.info("client %d moved from node %s to node %s (SuperNode restart)", client, previous, node)
        blocks = record_to_prompt(content.array_records[PROMPT])
        p0 = flatten(blocks)
        template = content.array_records.get(PAYLOAD)
        payload = payload_shapes(record_to_arrays(template)) if template is not None else {}
        if self.state is None:
            self.shapes = [tuple(b.shape) for b in blocks]
            self.p0 = p0
            self.payload = payload
            self.state = ServerState.initial(p0, self.num_clients, self.seed)
        elif [tuple(b.shape) for b in blocks] != self.shapes or not np.array_equal(p0, self.p0):
            raise RejectedReply("its initial prompt differs from the other clients' (same model and method?)")
        elif payload != self.payload:
            raise RejectedReply(f"its payload template {payload} differs from the other clients' {self.payload}")
        self.node_of[client] = node
        self.num_samples[client] = num_samples
        if self.state.positions[client] < 0:
            self.state.positions[client] = position
        if position >= num_batches:
            self.state.exhausted[client] = True
        # Where the client goes on is the server's position (a restarted node reports its own fresh one, 0).
        resumes = int(self.state.positions[client])
        at = f"at {resumes}" if resumes == position else f"resumes at {resumes}; its node reported {position}"
        log.info("node %s serves client %d (%d batches, %s)", node, client, num_batches, at)

    # ---------------------------------------------------------------- checkpoints
    def checkpoint(self, token: str, config: dict) -> ServerCheckpoint:
        """The whole server state after the last round (see ``fedrapp_app.recording.checkpoint``)."""
        st = self.state
        return ServerCheckpoint(
            st.round,
            st.memory,
            st.sent,
            st.exhausted,
            st.positions,
            self.p0,
            self.shapes,
            st.rng.bit_generator.state,
            token,
            config,
            st.rule_state,
            self.privacy.arrays() if self.privacy is not None else {},
            dict(self.num_samples),
        )

    def restore(self, checkpoint: ServerCheckpoint) -> None:
        """Continue from ``checkpoint`` (after ``connect``: the clients' initial prompt must match)."""
        if checkpoint.shapes != self.shapes or not np.array_equal(checkpoint.p0, self.p0):
            raise RuntimeError("the checkpoint's initial prompt differs from the clients': same model and method?")
        st = self.state
        st.memory, st.sent = checkpoint.memory.copy(), checkpoint.sent.copy()
        st.exhausted, st.positions = checkpoint.exhausted.copy(), checkpoint.positions.copy()
        st.round = checkpoint.round
        st.rng.bit_generator.state = checkpoint.rng_state
        st.rule_state = {k: v.copy() for k, v in checkpoint.rule_state.items()}
        if self.privacy is not None:
            self.privacy.restore(checkpoint.privacy)
        shown = ", ".join(f"{c}: {int(p)}" for c, p in enumerate(st.positions[:16]))
        more = f", ... ({len(st.positions)} clients)" if len(st.positions) > 16 else ""
        log.info("resumed after round %d; the clients go on at stream positions {%s%s}", st.round, shown, more)

    # ---------------------------------------------------------------- rounds
    def sample(self, server_round: int) -> list[int]:
        """Seeded sample of the available clients (discovered, stream not ended, joined; ``fraction`` of them),
        with the held-out clients whose visit is due, less the clients that drop out of the round; sorted."""
        assert self.state is not None
        pop = self.population
        live = [c for c in sorted(self.node_of) if not self.state.exhausted[c]]
        available = [c for c in live if pop.member(c, server_round)]
        picked: list[int] = []
        if available:
            k = max(1, int(round(self.fraction * len(available))))
            picked = list(self.state.rng.choice(available, size=k, replace=False)) if k < len(available) else available
        picked += [c for c in live if pop.visits(c, server_round)]
        dropped = pop.dropped(server_round)
        self.sitting_out = {}  # every other client whose stream goes on: why it has no batch this round
        for c in live:
            if c in picked and dropped[c]:
                self.sitting_out[c] = ("dropped", f"absent from this round (drop-rate {pop.drop_rate:g})")
            elif pop.held_out(c) and c not in picked:
                self.sitting_out[c] = ("not-due", f"held out: visited every {pop.held_out_every} rounds")
            elif pop.late(c) and not pop.member(c, server_round):
                self.sitting_out[c] = ("late", f"joins in round {pop.late_round}")
            elif c not in picked:
                self.sitting_out[c] = ("not-sampled", f"not among the {self.fraction:g} of clients sampled")
        return sorted(int(c) for c in picked if not dropped[c])

    def expects_clients(self) -> bool:
        """A round in which no client was sampled is not the end: with late joiners, held-out clients or a drop
        rate, a known client whose stream goes on takes part in a later round."""
        assert self.state is not None
        live = any(not self.state.exhausted[c] for c in self.node_of)
        return live and not self.population.is_default

    def first_prompt(self, client: int, server_round: int) -> np.ndarray | None:
        """What a client the federation has never seen is sent (a held-out client at every visit, a late joiner
        at its first), per the rule's ``newcomer``; None for every other client (it is sent ``sent[client]``)."""
        assert self.state is not None
        pop, st = self.population, self.state
        new = pop.held_out(client) or (pop.late(client) and st.positions[client] <= 0)
        if not new:
            return None
        if self.rule.rule.newcomer != "memory-mean":
            return st.sent[client]
        members = [c for c in range(self.num_clients) if pop.member(c, server_round) and st.positions[c] > 0]
        return newcomer_prompt(st.memory, members, st.sent[client])

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per sampled client, each with its own prompt (``sent[i]``) in a fresh RecordDict.

        A client whose node is not connected gets no message (it is missing for the round); when no sampled
        client's node is connected, the round first waits for one (``_wait_for_nodes``).
        """
        connected = self.discover(grid)
        assert self.state is not None and self.shapes is not None
        self._round_start = time.monotonic()
        self.sampled = self.sample(server_round)
        if self.sampled and not any(self.node_of[c] in connected for c in self.sampled):
            connected = self._wait_for_nodes(grid, self.sampled)
        if any(self.node_of[c] in connected for c in self.sampled):
            self._outage_since = None
        self._messages = []
        self._absent = [c for c in self.sampled if self.node_of[c] not in connected]
        for client in self.sampled:
            if client in self._absent:
                continue
            first = self.first_prompt(client, server_round)
            if first is not None and not self.population.held_out(client):  # a late joiner starts from it
                self.state.sent[client] = self.state.memory[client] = first
            prompt = self.state.sent[client] if first is None else first
            records = {PROMPT: prompt_to_record(unflatten(prompt, self.shapes))}
            for probe in PROBES if first is None else ():  # prompts the rule asks it to score beside its own
                if probe in self.state.rule_state:
                    records[probe] = prompt_to_record(unflatten(self.state.rule_state[probe][client], self.shapes))
            sent = {k[len(PAYLOAD_PREFIX) :]: v[client] for k, v in self.state.rule_state.items()
                    if k.startswith(PAYLOAD_PREFIX)} if first is None else {}  # fmt: skip
            if sent:  # arrays the rule sends beside the prompt (Latte: its peers' prototypes)
                records[PAYLOAD] = arrays_to_record({k: np.asarray(v, dtype=np.float32) for k, v in sent.items()})
            self._download[client] = sum(  # the arrays' values in bytes (not their wire headers)
                math.prod(a.shape) * np.dtype(a.dtype).itemsize for record in records.values() for a in record.values()
            )
            cfg = ConfigRecord(
                {
                    **dict(config),
                    **self.client_config,
                    "server-round": server_round,
                    "client-id": client,
                    "num-clients": self.num_clients,
                    "stream-position": int(self.state.positions[client]),
                    **({"own-weight": float(self.privacy.own_weight[client])} if self.privacy else {}),
                }
            )
            msg = Message(
                RecordDict({**records, CONFIG: cfg}),
                dst_node_id=self.node_of[client],
                message_type=MessageType.TRAIN,
                group_id=str(server_round),
            )
            self._messages.append((msg, client))
        return [m for m, _ in self._messages]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate every reply, run the rule once on the valid ones, update the state atomically."""
        assert self.state is not None and self.shapes is not None and self.p0 is not None
        sent_to = {m.metadata.message_id: (c, m.metadata.dst_node_id) for m, c in self._messages}
        rows: dict[int, ClientRow] = {}
        max_norm = self.max_norm_ratio * max(float(np.linalg.norm(self.p0)), 1e-6)
        for reply in replies:
            client, node = sent_to.get(reply.metadata.reply_to_message_id, (None, None))
            if client is None:
                log.warning("round %d: dropped a reply to an unknown message", server_round)
                continue
            if client in rows:
                log.warning("round %d: client %d: duplicate reply dropped", server_round, client)
                continue
            rows[client] = self._read_reply(server_round, client, node, reply, max_norm)
        for client in self._absent:
            node = self.node_of[client]
            why = f"its node {node} was not connected (stopped or restarting)"
            rows[client] = ClientRow(client, node, "missing", why)
            log.warning("round %d: client %d: its node %s is not connected", server_round, client, node)
        for _, client in self._messages:
            if client not in rows:
                rows[client] = ClientRow(client, self.node_of[client], "missing", "no reply before round-timeout")
                log.warning("round %d: client %d: no reply before the round timeout", server_round, client)

        for client, (status, why) in self.sitting_out.items():  # a row for every client the round concerned
            rows.setdefault(client, ClientRow(client, self.node_of[client], status, why))
        for row in rows.values():
            row.held_out = self.population.held_out(row.client_id)
            row.download_bytes = self._download.get(row.client_id)
        uploads = [r.upload for r in rows.values() if r.upload is not None and not r.held_out]
        t0 = time.monotonic()
        output, rule_error = None, ""
        try:
            output = self._apply_rule(uploads) if uploads else None
        except RuleFailed as err:
            rule_error = str(err)
            log.error("round %d: %s", server_round, rule_error)
        aggregate_seconds = time.monotonic() - t0
        self.state.round = server_round
        self.last_report = RoundReport(
            server_round,
            [rows[c] for c in sorted(rows)],
            output,
            time.monotonic() - self._round_start,
            aggregate_seconds,
            rule_error,
        )
        metrics = MetricRecord({"replied": len(uploads), "sampled": len(rows)})
        return None, metrics

    def _read_reply(self, rnd: int, client: int, node: int, reply: Message, max_norm: float) -> ClientRow:
        if reply.has_error():
            status = "missing" if reply.error.code == ErrorCode.NODE_UNAVAILABLE else "failed"
            reason = clean_reason(reply.error.reason)
            log.warning("round %d: client %d (node %s) %s: %s", rnd, client, node, status, reason)
            return ClientRow(client, node, status, reason)
        content = reply.content
        metrics = content.metric_records.get(METRICS)
        skipped, where, domains = _notes(content)
        if metrics is not None and PROMPT not in content.array_records:
            if metrics.get("exhausted", 0) == 1:
                self.state.exhausted[client] = True
                return ClientRow(client, node, "exhausted")
            if metrics.get("skipped-batch", 0) == 1 and metrics.get("client-id") == client:
                self._note_position(client, metrics)
                if metrics.get("remaining-batches", 1) == 0:
                    self.state.exhausted[client] = True
                why = f"no sample of the batch could be decoded ({len(skipped)} skipped)"
                return ClientRow(client, node, "skipped", why, skipped=skipped, where=where)
        self._note_position(client, metrics)
        spent = None
        try:
            if self.privacy is not None:  # the release counts whatever becomes of it; its noise widens the norm bound
                spent, max_norm = self._released(client, content, max_norm)
            upload = parse_train_reply(content, client, self.shapes, max_norm, self.payload)
            outcome = parse_outcome(upload.report, domains, upload.num_examples)
        except RejectedReply as err:
            log.warning("round %d: client %d (node %s): reply rejected: %s", rnd, client, node, err)
            return ClientRow(client, node, "rejected", str(err), dp_epsilon=spent)
        if upload.report.get("remaining-batches", 1) == 0:
            self.state.exhausted[client] = True
        row = ClientRow(client, node, "ok", upload=upload, skipped=skipped, where=where, outcome=outcome)
        row.dp_epsilon = spent
        return row

    def _released(self, client: int, content: RecordDict, max_norm: float) -> tuple[float, float]:
        """Under dp: count the reply's release in the ledger (once per stream position: a replayed release of a
        position counted before adds nothing); (the client's ε after it, the norm bound for it). ``RejectedReply``
        after counting where the reply carries more than a private reply may (its fields are named)."""
        metrics = content.metric_records.get(METRICS)
        noise = None if metrics is None else metrics.get("dp-noise")
        if not isinstance(noise, int | float) or isinstance(noise, bool):
            raise RejectedReply("dp = true, but the reply carries no dp-noise (a client without differential privacy)")
        position = int(metrics.get("stream-position", -1))
        try:
            spent = self.privacy.record(client, float(noise), position, replayed=bool(metrics.get("dp-replayed", 0)))
        except ValueError as err:
            raise RejectedReply(str(err)) from None
        if metrics.get("dp-seeded", 0):
            if not self.privacy.seeded:  # once per run; summary.json lists every seeded client
                log.warning(
                    "client %d: its dp noise is seeded (FEDRAPP_DP_SEED in its environment): for experiments only; "
                    "anyone who knows the secret can draw the noise again and remove it",
                    client,
                )
            self.privacy.seeded.add(client)
        extra = outside_private_reply(content)
        if extra:
            raise RejectedReply(
                f"under dp a reply may carry only the allow-listed fields (docs/privacy.md); this one also carries "
                f"{extra} (a client of another version, or a plugin that sends them)"
            )
        sent_norm = float(np.linalg.norm(self.state.sent[client]))
        return spent, self.privacy.upload_bound(max_norm, sent_norm, float(noise), int(self.p0.size))

    def _note_position(self, client: int, metrics: MetricRecord | None) -> None:
        """Remember where the client's stream stands (its batch was consumed even if the upload is bad)."""
        value = None if metrics is None else metrics.get("stream-position")
        if isinstance(value, int | float) and np.isfinite(value) and value == int(value) and value >= 0:
            self.state.positions[client] = int(value) + 1

    def _apply_rule(self, uploads: list[Upload]) -> RoundOutput:
        """Stack the valid uploads over all N clients and apply the rule; absent rows stay as they were."""
        state = self.state
        n = self.num_clients
        replied = np.zeros(n, bool)
        tuned = state.sent.copy()
        h_pre, h_post, num_examples = np.zeros(n), np.zeros(n), np.zeros(n)
        own = {name: np.full(n, np.nan) for name in OWN_PROMPT_FIELDS}  # NaN: not reported (optional metrics)
        payload = {name: np.full((n, *shape), np.nan, np.float32) for name, shape in self.payload.items()}
        for u in uploads:
            replied[u.client_id] = True
            tuned[u.client_id] = u.prompt
            h_pre[u.client_id], h_post[u.client_id] = u.h_pre, u.h_post
            num_examples[u.client_id] = u.num_examples
            for name in OWN_PROMPT_FIELDS:
                value = getattr(u, name)
                own[name][u.client_id] = np.nan if value is None else value
            for name, array in (u.payload or {}).items():
                payload[name][u.client_id] = array
        try:
            # copies: a rule that writes into its inputs and then fails must not have touched the server state
            rule_state = {k: v.copy() for k, v in state.rule_state.items()}
            sent, memory = state.sent.copy(), state.memory.copy()
            output = self.rule(
                tuned, sent, memory, h_pre, h_post, replied, num_examples, own=own, state=rule_state, payload=payload
            )
            check_output(output, n, tuned.shape[1])
        except Exception as err:  # a rule (a plugin's too) may fail in any way: the round goes on without it
            raise RuleFailed(
                f"server rule {self.rule.name!r} ({self.rule.origin or 'no origin'}) failed: {describe(err)}; the "
                "server state is unchanged and every client is sent again what it was sent"
            ) from err
        state.memory = np.asarray(output.memory, dtype=np.float32)
        state.sent = np.asarray(output.personalized, dtype=np.float32)
        state.rule_state = {k: np.array(v) for k, v in output.state.items()}
        if self.privacy is not None:  # the share of each upload in what its client is sent next (0: not said)
            own = np.zeros(n) if output.own_weight is None else np.asarray(output.own_weight, dtype=np.float64)
            self.privacy.own_weight[replied] = np.clip(np.nan_to_num(own[replied]), 0.0, 1.0)
        return output

    # ---------------------------------------------------------------- evaluation: online, in the train replies
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No separate evaluation: accuracy is measured online, on each round's train batch."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (see ``configure_evaluate``)."""
        return None

    def summary(self) -> None:
        """Log the strategy's settings."""
        log.info(
            "PersonalizedPromptStrategy: %s, clients=%d, fraction=%g, min-nodes=%d, seed=%d; rule from %s",
            self.rule.summary(),
            self.num_clients,
            self.fraction,
            self.min_nodes,
            self.seed,
            self.rule.origin,
        )
