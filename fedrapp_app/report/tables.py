"""The numbers of a run report, as pure functions of the run files (``runs.Run``): no figures, no text.

- per client: online accuracy (each sample counted once, in the round it arrived, after the local step),
  the received prompt's accuracy on the same samples, samples scored, rounds taken, counts of every row
  status and of skipped (undecodable) samples;
- the peer-weight matrix averaged over rounds (who learns from whom) and its same-domain share;
- FedRAPP's r, mu, gamma per client; the run's wall time split; the config keys that differ from the defaults;
- for several runs, the keys their configs differ in and the per-client paired differences.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedrapp_app.bench.personalization import uniform_share
from fedrapp_app.bench.rows import curves_from_rounds
from fedrapp_app.bench.schema import RUNNER_KEYS, SPEED_KEYS, irrelevant_keys
from fedrapp_app.bench.stats import Stat, mean_std
from fedrapp_app.config import DEFAULTS, RULE_KEYS
from fedrapp_app.recording.results import SITTING_OUT
from fedrapp_app.report.runs import STATUSES, Run

#: Rules whose rows carry a FedAMP-style mixing matrix ξ (peer_weights = its off-diagonal renormalised,
#: gamma = 1 − ξ_ii; see fedrapp_app.aggregation.common.split_mixing).
XI_RULES = ("fedamp", "fedamp-cos", "fedavg", "domain-oracle")


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


# --------------------------------------------------------------------------------------------- accuracy
@dataclass(frozen=True)
class ClientStats:
    """What happened to one client over a run."""

    client: int
    domain: str | None
    samples: int
    correct: int
    correct_before: int
    statuses: dict[str, int]  # row status -> rows (every status of STATUSES present, 0 when never seen)
    skipped_samples: int  # undecodable samples dropped from its batches (row field ``skipped``)

    @property
    def accuracy(self) -> float:
        """Online accuracy over its scored samples (NaN when none)."""
        return _ratio(self.correct, self.samples)

    @property
    def accuracy_received(self) -> float:
        """Accuracy of the prompts it received, before adapting, on the same samples."""
        return _ratio(self.correct_before, self.samples)

    @property
    def rounds_scored(self) -> int:
        return self.statuses.get("ok", 0)


def skipped_samples(row: Mapping[str, Any]) -> int:
    """Undecodable samples dropped from a row's batch (a row field, or one of its client metrics)."""
    value = row.get("skipped", (row.get("client_metrics") or {}).get("skipped", 0))
    return int(value or 0)


def statuses_of(run: Run) -> list[str]:
    """The statuses shown as columns: those of a client that was sent a batch, those of a client without one
    (dropped, late, ...) where the run has them, then any other status found in the rows."""
    found = {str(r["status"]) for r in run.rows}
    sent = [s for s in STATUSES if s not in SITTING_OUT]
    return [*sent, *(s for s in SITTING_OUT if s in found), *sorted(found - set(STATUSES))]


def client_stats(run: Run) -> list[ClientStats]:
    """One entry per client id 0..N−1 (N = ``num-clients``), also for clients that never scored."""
    columns = statuses_of(run)
    counts = {c: Counter() for c in range(run.num_clients)}
    totals = {c: [0, 0, 0, 0] for c in range(run.num_clients)}  # samples, correct, correct_before, skipped
    for row in run.rows:
        c = int(row["client"])
        counts[c][str(row["status"])] += 1
        totals[c][3] += skipped_samples(row)
        if row["status"] == "ok":
            totals[c][0] += row["num_examples"]
            totals[c][1] += row["correct"]
            totals[c][2] += row["correct_before"]
    return [
        ClientStats(
            client=c,
            domain=run.domains[c] if c < len(run.domains) else None,
            samples=totals[c][0],
            correct=totals[c][1],
            correct_before=totals[c][2],
            statuses={s: counts[c][s] for s in columns},
            skipped_samples=totals[c][3],
        )
        for c in range(run.num_clients)
    ]


@dataclass(frozen=True)
class Totals:
    """Run-level accuracy from the rows: micro over samples, macro over clients that scored a sample."""

    micro: float
    macro: float
    micro_received: float
    macro_received: float
    samples: int
    rounds: int  # last round with a row
    clients_scored: int


def totals(stats: Sequence[ClientStats], run: Run) -> Totals:
    """Totals over ``client_stats(run)``."""
    scored = [s for s in stats if s.samples]
    samples = sum(s.samples for s in stats)
    return Totals(
        micro=_ratio(sum(s.correct for s in stats), samples),
        macro=float(np.mean([s.accuracy for s in scored])) if scored else float("nan"),
        micro_received=_ratio(sum(s.correct_before for s in stats), samples),
        macro_received=float(np.mean([s.accuracy_received for s in scored])) if scored else float("nan"),
        samples=samples,
        rounds=max(int(r["round"]) for r in run.rows),
        clients_scored=len(scored),
    )


def summary_mismatches(run: Run, t: Totals) -> list[str]:
    """Where ``summary.json`` disagrees with the numbers recomputed from the rows (empty when it agrees)."""
    if run.summary is None:
        return []
    checks = (
        ("micro_accuracy", t.micro),
        ("macro_accuracy", t.macro),
        ("micro_accuracy_received_prompt", t.micro_received),
        ("samples", t.samples),
    )
    out = []
    for key, mine in checks:
        theirs = run.summary.get(key)
        same = isinstance(theirs, int | float) and math.isclose(float(theirs), float(mine), rel_tol=1e-9, abs_tol=1e-12)
        if isinstance(theirs, int | float) and not same:
            out.append(f"{key}: summary.json {theirs}, rounds.jsonl {mine}")
    return out


def round_curves(run: Run) -> dict[str, Any]:
    """Per-round totals and per-client traces of the scored rows (``fedrapp_app.bench.rows.curves_from_rounds``)."""
    return curves_from_rounds(run.rows, run.domains)


def cumulative_accuracy(curves: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Online accuracy over every sample scored up to each round: (rounds [T], accuracy [T])."""
    r = curves["rounds"]
    n = np.cumsum(np.asarray(r["n"], dtype=float))
    return np.asarray(r["round"], dtype=int), np.cumsum(np.asarray(r["correct"], dtype=float)) / np.maximum(n, 1)


#: Cells of the status grid that are not a row status: the client had no row in that round.
NOT_SAMPLED = "not sampled"
#: A client whose stream has ended: its ``exhausted`` row, and every round after it (it is sampled no more).
STREAM_ENDED = "stream ended"


def _no_batch_left(row: Mapping[str, Any]) -> bool:
    """The row says the client's stream has no batch left (``remaining-batches`` 0 in its metrics)."""
    for source in (row, row.get("client_metrics") or {}):
        for key in ("remaining-batches", "remaining_batches"):
            value = source.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
                return True
    return False


def stream_ends(run: Run) -> dict[int, int]:
    """client -> the first round in which its stream had ended, for clients whose stream is known to have ended:
    the round of its ``exhausted`` row; the round after a row that left no batch (``remaining-batches`` 0, the
    server samples it no more); or, in a run that stopped because every stream ended, the round after its last
    row."""
    ends: dict[int, int] = {}
    last: dict[int, int] = {}
    for row in sorted(run.rows, key=lambda r: int(r["round"])):
        c, t = int(row["client"]), int(row["round"])
        last[c] = max(last.get(c, 0), t)
        if c in ends:
            continue
        if row["status"] == "exhausted":
            ends[c] = t
        elif _no_batch_left(row):
            ends[c] = t + 1
    if (run.summary or {}).get("stopped") == "streams ended":
        for c, t in last.items():
            ends.setdefault(c, t + 1)
    return ends


@dataclass(frozen=True)
class StatusGrid:
    """What happened to each client in each round.

    Attributes
    ----------
    cells : int [N, T]  index into ``labels`` of client ``order[k]`` (row k) in round t + 1 (column t)
    labels : the categories: ``NOT_SAMPLED``, ``STREAM_ENDED``, then the row statuses (``exhausted`` is
        ``STREAM_ENDED``)
    order : client ids of the rows, grouped by shift domain
    """

    cells: np.ndarray
    labels: list[str]
    order: list[int]

    def of(self, client: int, round_number: int) -> str:
        """The category of ``client`` in ``round_number``."""
        return self.labels[int(self.cells[self.order.index(client), round_number - 1])]


def status_grid(run: Run) -> StatusGrid:
    """The client × round grid of statuses: a row's status, ``stream ended`` from a client's ``exhausted`` row
    (or the round after its last batch) on, ``not sampled`` where a client had no row in a round it could have
    been sampled in."""
    labels = [NOT_SAMPLED, STREAM_ENDED, *(s for s in statuses_of(run) if s not in ("exhausted", "not-sampled"))]
    last = max(int(r["round"]) for r in run.rows)
    order = domain_order(run.domains) if len(run.domains) == run.num_clients else list(range(run.num_clients))
    position = {c: k for k, c in enumerate(order)}
    cells = np.zeros((len(order), last), dtype=int)
    for c, t in stream_ends(run).items():
        cells[position[c], t - 1 :] = 1
    for row in run.rows:
        status = {"exhausted": STREAM_ENDED, "not-sampled": NOT_SAMPLED}.get(str(row["status"]), str(row["status"]))
        cells[position[int(row["client"])], int(row["round"]) - 1] = labels.index(status)
    return StatusGrid(cells, labels, order)


def events(run: Run) -> list[dict[str, Any]]:
    """Rows that are neither scored nor a normal end of stream (failed, rejected, missing, skipped, unknown)."""
    return [r for r in run.rows if r["status"] not in ("ok", "exhausted")]


# --------------------------------------------------------------------------------------------- peers
def domain_order(domains: Sequence[str | None]) -> list[int]:
    """Client ids grouped by shift domain (domains in the order they were configured), ids in order within."""
    rank = {d: k for k, d in enumerate(dict.fromkeys(domains))}
    return sorted(range(len(domains)), key=lambda c: (rank[domains[c]], c))


@dataclass(frozen=True)
class PeerMatrix:
    """Who learns from whom, averaged over rounds (client ids index rows and columns).

    Attributes
    ----------
    weights : float64 [N, N]
        ``weights[i, j]``: mean over the rounds in which client i had peers of w_ij, the weight of peer j in
        the peer part of i's next prompt (a peer absent in a round counts 0 there); rows sum to 1, or 0 for
        a client that never had peers.
    mixing : float64 [N, N]
        ``mixing[i, j]``: mean over i's scored rounds of the weight of j in i's next prompt, γ_i·w_ij for
        j ≠ i and 1 − γ_i on the diagonal (FedAMP's ξ; for FedRAPP the weight of memory j); rows sum to 1.
    rounds_with_peers, rounds_scored : int [N]
    """

    weights: np.ndarray
    mixing: np.ndarray
    rounds_with_peers: np.ndarray
    rounds_scored: np.ndarray


def peer_matrix(run: Run) -> PeerMatrix | None:
    """The averaged peer weights of a run; None when no row records a peer (none-fed, global rules)."""
    n = run.num_clients
    weights, mixing = np.zeros((n, n)), np.zeros((n, n))
    with_peers, scored = np.zeros(n, dtype=int), np.zeros(n, dtype=int)
    for row in run.rows:
        if row["status"] != "ok" or "peer_weights" not in row:
            continue
        i = int(row["client"])
        w = np.zeros(n)
        for j, value in (row["peer_weights"] or {}).items():
            w[int(j)] = float(value)
        gamma = float(row.get("gamma") or 0.0)
        scored[i] += 1
        mixing[i] += gamma * w
        mixing[i, i] += 1.0 - gamma
        if w.sum() > 0:
            with_peers[i] += 1
            weights[i] += w
    if not with_peers.any():
        return None
    return PeerMatrix(
        weights=weights / np.maximum(with_peers, 1)[:, None],
        mixing=mixing / np.maximum(scored, 1)[:, None],
        rounds_with_peers=with_peers,
        rounds_scored=scored,
    )


def same_domain_share(matrix: PeerMatrix, domains: Sequence[str | None]) -> dict[int, tuple[float, float]]:
    """Per client with peers and a domain: (share of its mean peer weight on same-domain clients, the share
    equal weights on every other client would give). Empty without domains."""
    if any(d is None for d in domains):
        return {}
    by_client = dict(enumerate(domains))
    out = {}
    for i, d in by_client.items():
        if matrix.rounds_with_peers[i] == 0:
            continue
        share = float(sum(matrix.weights[i, j] for j, dj in by_client.items() if dj == d and j != i))
        reference = uniform_share(by_client, i)
        out[i] = (share, float("nan") if reference is None else reference)
    return out


def mean_share(shares: Mapping[int, tuple[float, float]]) -> tuple[float, float] | None:
    """Mean over clients of :func:`same_domain_share`'s (share, equal-weights share); None without clients."""
    if not shares:
        return None
    mine = [s for s, _ in shares.values()]
    uniform = [u for _, u in shares.values() if math.isfinite(u)]
    return float(np.mean(mine)), float(np.mean(uniform)) if uniform else float("nan")


@dataclass(frozen=True)
class Signals:
    """FedRAPP's per-round server signals of one client: mean ± std over its scored rounds."""

    r: Stat
    mu: Stat
    gamma: Stat
    informative: int  # rounds in which its update counted (‖Δ‖ > 1e-8)


def fedrapp_signals(run: Run) -> dict[int, Signals]:
    """r, mu, gamma per client (clients without a scored row are left out)."""
    rows: dict[int, list[dict[str, Any]]] = {}
    for row in run.rows:
        if row["status"] == "ok" and "r" in row:
            rows.setdefault(int(row["client"]), []).append(row)
    return {
        c: Signals(
            r=mean_std(x.get("r") for x in rs),
            mu=mean_std(x.get("mu") for x in rs),
            gamma=mean_std(x.get("gamma") for x in rs),
            informative=sum(bool(x.get("informative")) for x in rs),
        )
        for c, rs in sorted(rows.items())
    }


# --------------------------------------------------------------------------------------------- time
#: Seconds two clocks of a run may disagree by (time.time against time.monotonic, a lock taken a few ms after the
#: start): a remainder this small and negative is 0.
CLOCK_SLACK = 0.05


@dataclass(frozen=True)
class WallTime:
    """The run's wall time split into parts that do not overlap: setup + rounds + rest = total (seconds; None
    where the run files do not say).

    Since commit 5d1fa28 ``summary.json``'s ``seconds`` count from the server's start, as its ``setup_seconds``
    do, and the summary says when that was (``started``): the total is ``seconds``. Before, ``seconds`` counted
    from when the run opened its files (``config.json``'s ``started``), later: the run lock, counting the
    SuperNodes (``num-clients = 0``) and the provenance came in between (``before_files``). For such runs the
    total is the server's start to the summary, ``seconds + before_files``, with the start read from the run
    folder's ``.lock``; where that is unknown (no ``.lock``, a resumed run) the total is ``seconds`` and the setup
    overlaps it, so the rest is unknown (``other`` None, ``overlap`` how much at least).
    """

    total: float | None  # the server's start to the summary; for an unfinished run, to the last row written
    total_is_partial: bool
    setup: float | None  # the server's start to its first round (summary ``setup_seconds``)
    rounds: float | None  # Σ round_seconds of this session's rounds (after a resume: the rounds since)
    server: float | None  # Σ aggregate_seconds (the server rule)
    client_sum: float | None  # Σ t-total over all client rounds (client-seconds)
    client_slowest: float | None  # Σ over rounds of the slowest client's t-total (the floor in parallel)
    before_files: float | None = None  # the server's start to opening the run's files (part of setup)
    from_files: bool = False  # total counts from opening the files only (the start is unknown): setup overlaps it
    rounds_before_resume: float | None = None  # Σ round_seconds of the rounds of earlier sessions (not in total)

    @property
    def remainder(self) -> float | None:
        """Total minus setup and rounds, as the files give it (may be negative where ``from_files``)."""
        if self.total is None or self.setup is None or self.rounds is None or self.total_is_partial:
            return None
        return self.total - self.setup - self.rounds

    @property
    def other(self) -> float | None:
        """The rest, total − setup − rounds: between the rounds (sampling, checkpoints) and after the last
        (results, shutdown); never negative. None when a part is unknown or the parts overlap."""
        rest = self.remainder
        if rest is None or self.from_files:
            return None
        return None if rest < -CLOCK_SLACK else max(0.0, rest)

    @property
    def overlap(self) -> float | None:
        """Where ``from_files``: seconds by which setup + rounds exceed the total at least (None when they do not)."""
        rest = self.remainder
        return -rest if self.from_files and rest is not None and rest < -CLOCK_SLACK else None


def _per_round(rows: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    """round -> a per-round value repeated on each row of the round (rounds whose rows lack it left out)."""
    per_round: dict[int, float] = {}
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            per_round[int(row["round"])] = max(per_round.get(int(row["round"]), 0.0), float(value))
    return per_round


def _per_round_sum(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """Σ over rounds of a per-round value repeated on each row of the round (None if no row has it)."""
    per_round = _per_round(rows, key)
    return sum(per_round.values()) if per_round else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def wall_time(run: Run, last_write: float | None = None) -> WallTime:
    """Split of the wall time; ``last_write``: epoch seconds of the last row (for an unfinished run)."""
    summary = run.summary or {}
    files_opened = _number(run.provenance.get("started"))
    setup = _number(summary.get("setup_seconds"))
    resumed_after = summary.get("resumed_after_round")
    resumed_after = int(resumed_after) if isinstance(resumed_after, int) and resumed_after > 0 else None
    # The server's start: the lock it took a few ms after starting, when that lock is this session's and
    # config.json was written in it (a resumed run keeps the first session's config.json).
    before_files = None
    if isinstance(summary.get("started"), int | float):  # seconds count from the server's start (since 5d1fa28)
        before_files = 0.0
    elif run.locked is not None and files_opened is not None and resumed_after is None:
        gap = files_opened - run.locked
        if gap >= -CLOCK_SLACK and (setup is None or gap <= setup + CLOCK_SLACK):
            before_files = max(0.0, gap)
    total, partial, from_files = _number(summary.get("seconds")), False, False
    if total is not None:
        if before_files is not None:
            total += before_files
        else:
            from_files = True
    elif last_write is not None:
        start = run.locked if run.locked is not None and resumed_after is None else files_opened
        if start is not None:
            total, partial = max(0.0, last_write - start), True
    rounds = _per_round(run.rows, "round_seconds")
    earlier = {t: v for t, v in rounds.items() if resumed_after is not None and t <= resumed_after}
    session = [row for row in run.rows if int(row["round"]) not in earlier]  # the rounds the total covers
    client: dict[int, list[float]] = {}
    for row in session:
        t = (row.get("client_metrics") or {}).get("t-total")
        if isinstance(t, int | float):
            client.setdefault(int(row["round"]), []).append(float(t))
    return WallTime(
        total=total,
        total_is_partial=partial,
        setup=setup,
        rounds=sum(v for t, v in rounds.items() if t not in earlier) if rounds else None,
        server=_per_round_sum(session, "aggregate_seconds"),
        client_sum=sum(sum(v) for v in client.values()) if client else None,
        client_slowest=sum(max(v) for v in client.values()) if client else None,
        before_files=before_files,
        from_files=from_files,
        rounds_before_resume=sum(earlier.values()) if earlier else None,
    )


# --------------------------------------------------------------------------------------------- configs
def _same_value(a: Any, b: Any) -> bool:
    """Equal as config values: 0 and 0.0 are, True and 1 are not."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def config_changes(config: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, value, default) for every key that differs from ``DEFAULTS``; default is None for a key this
    version does not know, value is None for a key of this version the run's config lacks (an older run)."""
    out = []
    for key in [*DEFAULTS, *sorted(set(config) - set(DEFAULTS))]:
        if key not in config:
            out.append((key, None, DEFAULTS[key]))
        elif key not in DEFAULTS or not _same_value(config[key], DEFAULTS[key]):
            out.append((key, config[key], DEFAULTS.get(key)))
    return out


def differing_keys(runs: Sequence[Run]) -> list[str]:
    """Config keys the runs differ in beyond their server rule and its own hyperparameters (sorted).

    Output folder, run name, resume and speed-only keys are left out, and so are keys that cannot matter
    to any of the runs (another local method's hyperparameters, say). Empty: the runs saw the same streams
    with the same local method, so their per-client results pair up.
    """
    allowed = {"strategy", *RUNNER_KEYS, *SPEED_KEYS}
    for run in runs:
        allowed |= set(RULE_KEYS.get(run.strategy, {}))
    irrelevant = set.intersection(*(irrelevant_keys(run.strategy, run.method) for run in runs))
    keys = set().union(*(run.config for run in runs)) - allowed - irrelevant
    missing = object()
    return sorted(k for k in keys if len({repr(run.config.get(k, DEFAULTS.get(k, missing))) for run in runs}) > 1)


#: Keys never used to tell runs apart: where a run writes, not what it computes.
_NOT_A_LABEL = frozenset(RUNNER_KEYS)


def _config_text(value: Any) -> str:
    """A config value as one writes it in ``-c``: strings bare, booleans lower case, absent as ``(absent)``."""
    if value is None:
        return "(absent)"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def label_keys(runs: Sequence[Run]) -> list[str]:
    """The config keys whose values tell the runs apart, in ``DEFAULTS`` order (``strategy`` first).

    Output folder, run name and resume never count. Keys that cannot matter to any of the runs (another rule's
    or local method's hyperparameters) and speed-only keys count only when nothing else differs; a key a run's
    config lacks takes its default. Empty when the configs agree on everything but where they were written.
    """
    missing = object()
    differ = [
        k
        for k in [*DEFAULTS, *sorted(set().union(*(run.config for run in runs)) - set(DEFAULTS))]
        if k not in _NOT_A_LABEL and len({repr(run.config.get(k, DEFAULTS.get(k, missing))) for run in runs}) > 1
    ]
    minor = set(SPEED_KEYS) | set.intersection(*(irrelevant_keys(run.strategy, run.method) for run in runs))
    major = [k for k in differ if k not in minor]
    return sorted(major or differ, key=lambda k: (k != "strategy", k != "local-method"))


def _name_tokens(names: Sequence[str]) -> list[str]:
    """Each name without the ``-``-separated words every name shares at its start and end ("" when none is left)."""
    parts = [name.split("-") for name in names]
    head = 0
    while all(len(p) > head for p in parts) and len({p[head] for p in parts}) == 1:
        head += 1
    tail = 0
    while all(len(p) > head + tail for p in parts) and len({p[len(p) - 1 - tail] for p in parts}) == 1:
        tail += 1
    return ["-".join(p[head : len(p) - tail]) for p in parts]


def run_labels(runs: Sequence[Run], names: Sequence[str] | None = None) -> list[str]:
    """Short labels that tell the runs apart by what differs between their configs (:func:`label_keys`), e.g.
    ``["strategy=fedrapp", "strategy=fedavg"]``; the full folder names go in a key beside them.

    Runs whose configs agree (the same experiment twice) are told apart by the words of their ``names``
    (default: folder names) that differ, else by their position (``run 1``, ``run 2``...).
    """
    names = [run.name for run in runs] if names is None else list(names)
    keys = label_keys(runs)
    labels = [", ".join(f"{k}={_config_text(run.config.get(k, DEFAULTS.get(k)))}" for k in keys) for run in runs]
    if len(set(labels)) < len(labels):
        tokens = _name_tokens(names)
        extra = (
            tokens if all(tokens) and len(set(tokens)) == len(tokens) else [f"run {k + 1}" for k in range(len(runs))]
        )
        labels = [f"{label}, {e}" if label else e for label, e in zip(labels, extra, strict=True)]
    return labels


@dataclass(frozen=True)
class Comparison:
    """Several runs side by side; the first is the reference of every difference.

    Attributes
    ----------
    accuracy : float [R, N]  online accuracy of client j in run k (NaN where it scored nothing)
    received : float [R, N]  the received prompt's accuracy on the same samples
    samples : int [R, N]
    """

    runs: list[Run]
    totals: list[Totals]
    accuracy: np.ndarray
    received: np.ndarray
    samples: np.ndarray
    differing: list[str]
    same_streams: bool = False  # every run's clients saw the same streams (stream_fingerprint)

    def delta(self, k: int) -> np.ndarray:
        """Per-client online accuracy of run k minus the reference's [N] (NaN where either scored nothing)."""
        return self.accuracy[k] - self.accuracy[0]

    def paired(self, k: int) -> Stat:
        """Mean ± std over clients of :meth:`delta` (paired by client)."""
        return mean_std(self.delta(k).tolist())

    def same_samples(self, k: int) -> bool:
        """Every client scored as many samples in run k as in the reference."""
        return bool(np.array_equal(self.samples[k], self.samples[0]))


def stream_fingerprint(run: Run) -> str:
    """What fixes every client's stream (the dataset, its partition, order, shift and batches: the data keys, the
    clients, the seed), as a digest: two runs with the same fingerprint fed each client the same images in the same
    order, whatever else (the rule, the local method) differs."""
    import hashlib
    import json

    from fedrapp_app.config import DATA_KEYS

    values = {k: run.config.get(k, DEFAULTS.get(k)) for k in sorted(DATA_KEYS)}
    values["num-clients"] = run.num_clients
    return hashlib.sha1(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:12]


def compare(runs: Sequence[Run]) -> Comparison:
    """Per-client accuracy of every run over the union of their clients."""
    n = max(run.num_clients for run in runs)
    stats = [client_stats(run) for run in runs]
    acc, received = np.full((len(runs), n), np.nan), np.full((len(runs), n), np.nan)
    samples = np.zeros((len(runs), n), dtype=int)
    for k, per_client in enumerate(stats):
        for s in per_client:
            acc[k, s.client], received[k, s.client], samples[k, s.client] = (
                s.accuracy,
                s.accuracy_received,
                s.samples,
            )
    return Comparison(
        runs=list(runs),
        totals=[totals(s, run) for s, run in zip(stats, runs, strict=True)],
        accuracy=acc,
        received=received,
        samples=samples,
        differing=differing_keys(runs),
        same_streams=len({stream_fingerprint(run) for run in runs}) == 1,
    )
