"""What every server rule shares: validated round inputs, the round output, parameter checks, z-scores.

Every rule has the signature of :class:`RoundRule` and is registered as a :class:`Rule` (the function, its
parameters, what it needs): the built-ins and plugins alike, through the entry-point group ``fedrapp.rules``
(docs/extending.md). The inputs are stacked over the N clients the server
knows; rows of clients that did not reply are ignored wherever SPEC says so, and may hold anything, even
NaN: :func:`validate_round` replaces them by neutral values before any arithmetic, so they cannot leak.
The rules compute in float64 and return float32 prompts (the wire format); rows a rule leaves untouched
are copied from the float32 inputs, so they come back bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

# Ranges and documented fields live in the registry (rules and methods share them); re-exported here.
from fedrapp_app.registry.parameters import NON_NEGATIVE, POSITIVE, UNIT, Interval, param  # noqa: F401

#: A statistic counts as having zero spread when its population std is at most this fraction of its
#: largest magnitude. Identical float32 uploads can give a float64 mean that is off by an ulp, and dividing
#: that rounding noise by an equally tiny std would turn "all equal" into z-scores of ±1. Distinct float32
#: values differ by at least ~6e-8 relative, far above this threshold.
SPREAD_RTOL = 1e-9


# ----------------------------------------------------------------------------------------------- outputs
@dataclass(frozen=True)
class Diagnostics:
    """Per-round quantities for logging; every array is indexed by the server's client rows.

    Attributes
    ----------
    informative : bool [N]
        U_t: replied with ``‖Δ_i‖ > min_update_norm``.
    update_norm : float64 [N]
        ``‖Δ_i‖ = ‖P̃_i − sent_i‖``; 0 for clients that did not reply.
    r : float64 [N]
        Reliability (FedRAPP); 0 for the baselines and outside U_t.
    mu : float64 [N]
        Weight of the old memory in the new memory: FedRAPP's μ_i; 1 where the memory row is untouched;
        0 where a baseline overwrites it.
    peer_weights : float64 [N, N]
        Row i: weight of each peer j in the peer part of client i's next prompt (FedRAPP's w_ij; for the
        baselines the off-diagonal of ``xi`` renormalised). Rows sum to 1 or are all zero (no peers).
    gamma : float64 [N]
        Share of the peers in client i's next prompt: ``next_i = (1 − γ_i)·own_i + γ_i·Σ_j w_ij·X_j``,
        where own/X are memories (FedRAPP) or uploads (baselines).
    xi : float64 [N, N] or None
        For rules that mix uploads directly (fedavg, fedamp, fedamp-cos): ``xi[i, j]`` is the weight of
        upload P̃_j in client i's next prompt (FedAMP's ξ). None for fedrapp and none-fed.
    trust_memory, trust_peers : float64 [N] or None
        FedRAPP's trust option (ours): each client's trusts after the round, the factors on its μ and on its γ.
        None when the option is off and for the other rules.
    """

    informative: NDArray[np.bool_]
    update_norm: NDArray[np.float64]
    r: NDArray[np.float64]
    mu: NDArray[np.float64]
    peer_weights: NDArray[np.float64]
    gamma: NDArray[np.float64]
    xi: NDArray[np.float64] | None = None
    trust_memory: NDArray[np.float64] | None = None
    trust_peers: NDArray[np.float64] | None = None


#: What a rule may send a client it has never seen (``Rule.newcomer``).
NEWCOMER_PROMPTS = ("sent", "memory-mean")

#: The ``RoundOutput.state`` entries the strategy sends each client as prompts to score beside its own (FedRAPP's
#: probes): the paper's prompt, which the trust option's peer trust reads.
PROBE = "probe"
PROBES = (PROBE,)
#: ``RoundOutput.state`` entries named ``payload.NAME`` [N, ...] float32 are sent too: row i to client i, as array
#: ``NAME`` of the train message's ``"payload"`` ArrayRecord, which its method receives (``LocalMethod.receive``)
#: before it adapts. What a rule sends a client besides a prompt (Latte: the prototypes of its most similar peers).
PAYLOAD_PREFIX = "payload."


@dataclass(frozen=True)
class RoundOutput:
    """Result of one server round.

    Attributes
    ----------
    memory : float32 [N, d]
        The server's per-client memories after the round.
    personalized : float32 [N, d]
        What each client is sent next (the strategy stores it as the new ``sent``).
    diagnostics : Diagnostics
    state : dict of per-client arrays [N, ...]
        What a rule carries to its next round besides the memories (FedRAPP's trust option: its trusts); the
        strategy stores it, checkpoints it and hands it back as the rule's ``state``. Empty for stateless rules.
        An entry of :data:`PROBES` [N, d] float32 (FedRAPP's probes) is also sent: row i to client i, beside its
        prompt, for it to score on its next batch.
    own_weight : float64 [N] or None
        For a rule whose next prompts are linear in the uploads: the weight of client i's upload of this round in
        the prompt it is sent next (none-fed 1, FedAvg n_i / Σn, FedRAPP (1 − γ_i)(1 − μ_i), ...; read for the
        replying clients). Under ``dp = true`` client i puts its exact prompt back in that share of what it is
        sent (the server only had it noised). None: the rule does not say, and nothing is put back.
    """

    memory: NDArray[np.float32]
    personalized: NDArray[np.float32]
    diagnostics: Diagnostics
    state: dict[str, NDArray[np.float64]] = field(default_factory=dict)
    own_weight: NDArray[np.float64] | None = None


class RoundRule(Protocol):
    """The signature every server rule has (see ``docs/ARCHITECTURE.md``, "Server rules")."""

    def __call__(
        self,
        tuned: ArrayLike,
        sent: ArrayLike,
        memory: ArrayLike,
        h_pre: ArrayLike,
        h_post: ArrayLike,
        replied: ArrayLike,
        num_examples: ArrayLike,
        params: Any = None,
    ) -> RoundOutput: ...


@dataclass(frozen=True)
class NoParams:
    """The parameters of a rule that has none."""


@dataclass(frozen=True)
class Rule:
    """A server rule as the registry knows it: the round function and what it needs.

    Attributes
    ----------
    round : the function (:class:`RoundRule`'s signature; a stateful rule also takes ``state=`` and the clients'
        own-prompt reports as keyword arguments).
    params : the class of its parameters, a frozen dataclass whose fields all have defaults (a
        :class:`RuleParams` gets range checks); :class:`NoParams` for none.
    stateful : it carries per-client arrays from round to round (``RoundOutput.state``, checkpointed and given
        back as ``state=``) and reads the clients' own-prompt reports (``trust.OwnPromptReports``'s fields).
    reads_own_prompt : the clients must score their own last tuned prompt on every batch (the run config turns
        that on for the local method).
    reference : it uses information a real deployment does not have (the testbed's client -> domain map, given
        as its ``groups`` parameter); tables mark it as a reference.
    selected_by : where the run config selects it otherwise than by ``strategy`` (refused there).
    summary : one line for ``fedrapp-list``.
    reads_payload : it reads the arrays the clients' method uploads beside its prompt (``payload=``, a dict of
        [N, ...] float32 arrays by name, rows of clients that did not reply NaN); the run config then needs a
        method that uploads them (``MethodSpec.payload``).
    payload_example : for a rule that reads a payload, ``fn(rng, N) -> {name: [N, ...] float32}``: plausible
        payloads of N clients, which the conformance kit feeds it.
    newcomer : what a client the federation has never seen (a late joiner, a held-out client; ``population.py``)
        is sent first: ``"sent"``, the rule's row for it (what an absent client is sent: P0 for a personalising
        rule, the global prompt for a global one), or ``"memory-mean"``, the mean of the participants'
        memories (a personalising rule's knowledge, not a prompt that ignores the federation).
    """

    round: Callable[..., RoundOutput]
    params: type = NoParams
    stateful: bool = False
    reads_own_prompt: bool = False
    reference: bool = False
    selected_by: str = ""
    summary: str = ""
    newcomer: str = "sent"
    reads_payload: bool = False
    payload_example: Callable[[np.random.Generator, int], dict[str, NDArray[np.float32]]] | None = None

    def __post_init__(self) -> None:
        if self.newcomer not in NEWCOMER_PROMPTS:
            raise ValueError(f"Rule.newcomer={self.newcomer!r}: expected one of {', '.join(NEWCOMER_PROMPTS)}")

    def __call__(self, *args: Any, **kwargs: Any) -> RoundOutput:
        """The round function itself (a decorated function stays callable)."""
        return self.round(*args, **kwargs)


def rule(
    params: type | None = None,
    *,
    stateful: bool = False,
    reads_own_prompt: bool = False,
    summary: str = "",
    newcomer: str = "sent",
    reads_payload: bool = False,
    payload_example: Callable[[np.random.Generator, int], dict[str, NDArray[np.float32]]] | None = None,
) -> Callable[[Callable[..., RoundOutput]], Rule]:
    """Decorator: ``@rule(params=MyParams)`` above a round function makes it a :class:`Rule` (the form a plugin's
    entry point or a ``module:function`` reference names); ``newcomer``, ``reads_payload``, ``payload_example``:
    see :class:`Rule`."""

    def wrap(function: Callable[..., RoundOutput]) -> Rule:
        doc = (function.__doc__ or "").strip().splitlines()
        first = doc[0] if doc else ""
        summary_line = summary or first
        return Rule(
            function, params or NoParams, stateful, reads_own_prompt, summary=summary_line, newcomer=newcomer,
            reads_payload=reads_payload, payload_example=payload_example,
        )  # fmt: skip

    return wrap


# -------------------------------------------------------------------------------------------- parameters
class RuleParams:
    """Base of the frozen hyperparameter dataclasses: coerces every field to float and checks its range."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            where = f"{type(self).__name__}.{f.name}"
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"{where} must be a real number, got {value!r} ({type(value).__name__})")
            value = float(value)
            allowed: Interval = f.metadata["allowed"]
            if value not in allowed:
                raise ValueError(f"{where} = {value!r} is outside its allowed range {allowed}")
            object.__setattr__(self, f.name, value)


# ------------------------------------------------------------------------------------------------ inputs
@dataclass(frozen=True)
class RoundInputs:
    """Validated inputs of one round, in float64 (float32 kept where rows must come back untouched).

    Rows of clients that did not reply are neutralised: ``tuned`` holds their ``sent`` row (so Δ = 0),
    ``h_pre``, ``h_post`` and ``num_examples`` hold 0. Nothing a non-replying client uploaded survives here.
    """

    tuned: NDArray[np.float64]  # [N, d]
    sent: NDArray[np.float64]  # [N, d]
    memory: NDArray[np.float64]  # [N, d]
    h_pre: NDArray[np.float64]  # [N]
    h_post: NDArray[np.float64]  # [N]
    replied: NDArray[np.bool_]  # [N]
    num_examples: NDArray[np.float64]  # [N]
    sent32: NDArray[np.float32]  # [N, d], the rows an untouched client is sent again
    memory32: NDArray[np.float32]  # [N, d]


def _real_array(name: str, value: ArrayLike, shape: tuple[int, ...]) -> NDArray[Any]:
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}, expected {shape} (N clients, d prompt entries)")
    return array


def _require_finite(name: str, array: NDArray[Any], rows: NDArray[np.bool_]) -> None:
    finite = np.isfinite(array) if array.ndim == 1 else np.isfinite(array).all(axis=1)
    bad = np.flatnonzero(rows & ~finite)
    if bad.size:
        raise ValueError(
            f"{name} is not finite in row(s) {bad[:10].tolist()}: the strategy must reject such uploads "
            "(mark the client as not replied) before calling a server rule"
        )


def validate_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
) -> RoundInputs:
    """Check shapes, dtypes and finiteness; neutralise the rows of clients that did not reply."""
    sent_array = np.asarray(sent)
    if sent_array.ndim != 2 or sent_array.shape[0] < 1 or sent_array.shape[1] < 1:
        raise ValueError(f"sent must be a non-empty [N, d] array, got shape {sent_array.shape}")
    n, d = sent_array.shape
    replied_array = np.asarray(replied)
    if replied_array.dtype != np.bool_ or replied_array.shape != (n,):
        raise TypeError(
            f"replied must be a bool array of shape ({n},), got dtype {replied_array.dtype} and shape "
            f"{replied_array.shape}; convert a 0/1 vector with .astype(bool)"
        )
    everyone = np.ones(n, dtype=bool)
    sent_array = _real_array("sent", sent_array, (n, d))
    memory_array = _real_array("memory", memory, (n, d))
    _require_finite("sent", sent_array, everyone)
    _require_finite("memory", memory_array, everyone)
    uploads = {"tuned": _real_array("tuned", tuned, (n, d))}
    for name, value in (("h_pre", h_pre), ("h_post", h_post), ("num_examples", num_examples)):
        uploads[name] = _real_array(name, value, (n,))
    for name in ("tuned", "h_pre", "h_post"):
        _require_finite(name, uploads[name], replied_array)

    sent64 = sent_array.astype(np.float64)
    # np.where selects without arithmetic: NaN in an ignored row raises no warning and reaches nothing.
    return RoundInputs(
        tuned=np.where(replied_array[:, None], uploads["tuned"], sent64).astype(np.float64, copy=False),
        sent=sent64,
        memory=memory_array.astype(np.float64, copy=False),
        h_pre=np.where(replied_array, uploads["h_pre"], 0.0).astype(np.float64, copy=False),
        h_post=np.where(replied_array, uploads["h_post"], 0.0).astype(np.float64, copy=False),
        replied=replied_array.copy(),
        num_examples=np.where(replied_array, uploads["num_examples"], 0.0).astype(np.float64, copy=False),
        sent32=sent_array.astype(np.float32, copy=False),
        memory32=memory_array.astype(np.float32, copy=False),
    )


# ----------------------------------------------------------------------------------------------- helpers
def keep_rows(new: NDArray[np.floating], old32: NDArray[np.float32], keep: NDArray[np.bool_]) -> NDArray[np.float32]:
    """float32 ``new`` with the rows in ``keep`` taken verbatim from ``old32``; never aliases an input."""
    return np.where(keep[:, None], old32, new.astype(np.float32))


def update_norms(inputs: RoundInputs) -> NDArray[np.float64]:
    """``‖P̃_i − sent_i‖`` per client [N]; 0 for clients that did not reply."""
    return np.linalg.norm(inputs.tuned - inputs.sent, axis=1)


def masked_zscore(values: NDArray[np.float64], mask: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Population z-scores of ``values`` over ``mask`` [N]; 0 outside the mask.

    All zero when fewer than two entries are masked in or the masked values have zero spread (up to
    :data:`SPREAD_RTOL`), since a z-score is then undefined rather than large.
    """
    z = np.zeros(values.shape, dtype=np.float64)
    if np.count_nonzero(mask) < 2:
        return z
    selected = values[mask]
    centered = selected - selected.mean()
    std = math.sqrt(float(np.mean(centered * centered)))
    if std <= SPREAD_RTOL * float(np.max(np.abs(selected))):
        return z
    z[mask] = centered / std
    return z


def split_mixing(xi: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Split a mixing matrix [N, N] into ``gamma`` [N] (mass on others) and row-normalised peer weights."""
    peers = xi - np.diag(np.diag(xi))
    gamma = peers.sum(axis=1)
    weights = np.divide(peers, gamma[:, None], out=np.zeros_like(peers), where=gamma[:, None] > 0)
    return gamma, weights


def unchanged_round(inputs: RoundInputs) -> RoundOutput:
    """The output of a round in which nothing moves (e.g. nobody replied)."""
    n = inputs.replied.shape[0]
    return RoundOutput(
        memory=inputs.memory32.copy(),
        personalized=inputs.sent32.copy(),
        diagnostics=Diagnostics(
            informative=np.zeros(n, dtype=bool),
            update_norm=np.zeros(n),
            r=np.zeros(n),
            mu=np.ones(n),
            peer_weights=np.zeros((n, n)),
            gamma=np.zeros(n),
        ),
    )


#: ``Diagnostics.informative`` of the rules without a reliability uses FedRAPP's default threshold, for comparable logs.
MIN_UPDATE_NORM = 1e-8


def mixing_diagnostics(x: RoundInputs, mu: NDArray[np.float64], xi: NDArray[np.float64] | None) -> Diagnostics:
    """Diagnostics of a rule without reliability scores: ``mu`` [N] as given, the peers from its mixing matrix
    ``xi`` [N, N] (None: no mixing)."""
    n = x.replied.shape[0]
    norms = update_norms(x)
    if xi is None:
        gamma, weights = np.zeros(n), np.zeros((n, n))
    else:
        gamma, weights = split_mixing(xi)
    return Diagnostics(
        informative=x.replied & (norms > MIN_UPDATE_NORM),
        update_norm=norms,
        r=np.zeros(n),
        mu=mu,
        peer_weights=weights,
        gamma=gamma,
        xi=xi,
    )


def peer_mixing_round(x: RoundInputs, mixing: Callable[[NDArray[np.float64]], NDArray[np.float64]]) -> RoundOutput:
    """Send each replying client u_i = Σ_j ξ_ij·P̃_j over the replying clients, ξ = ``mixing(uploads [k, d])``
    [k, k] (rows summing to 1); u_i is also its memory. Absent clients are untouched; a client alone keeps its
    upload. The building block of FedAMP and of rules that mix uploads (docs/extending.md)."""
    uploads = x.tuned[x.replied]
    if uploads.shape[0] == 0:
        return unchanged_round(x)
    xi_replied = np.ones((1, 1)) if uploads.shape[0] == 1 else np.asarray(mixing(uploads), dtype=np.float64)
    n, k = x.replied.shape[0], uploads.shape[0]
    if xi_replied.shape != (k, k):
        raise ValueError(f"the mixing matrix has shape {xi_replied.shape}, expected ({k}, {k}) for {k} uploads")
    replying = np.flatnonzero(x.replied)
    messages = x.tuned.copy()
    messages[replying] = xi_replied @ uploads
    xi = np.zeros((n, n))
    xi[np.ix_(replying, replying)] = xi_replied
    absent = ~x.replied
    return RoundOutput(
        memory=keep_rows(messages, x.memory32, absent),
        personalized=keep_rows(messages, x.sent32, absent),
        diagnostics=mixing_diagnostics(x, absent.astype(np.float64), xi),
        own_weight=np.diag(xi).copy(),
    )


def send_to_everyone(
    x: RoundInputs, global_prompt: NDArray[np.float64], xi: NDArray[np.float64] | None = None
) -> RoundOutput:
    """A global rule's output: ``global_prompt`` [d] becomes every client's memory and next prompt."""
    n = x.replied.shape[0]
    everyone = np.broadcast_to(global_prompt, x.tuned.shape)
    keep_none = np.zeros(n, dtype=bool)
    return RoundOutput(
        memory=keep_rows(everyone, x.memory32, keep_none),
        personalized=keep_rows(everyone, x.sent32, keep_none),
        diagnostics=mixing_diagnostics(x, np.zeros(n), xi),
        own_weight=None if xi is None else np.diag(xi).copy(),  # a global prompt of unknown form: nothing put back
    )


def memory_own_weight(x: RoundInputs, mu: NDArray[np.float64], gamma: NDArray[np.float64]) -> NDArray[np.float64]:
    """The weight [N] of each replying client's upload in a prompt mixed from memories as FedRAPP's are:
    (1 − γ_i)(1 − μ_i) (the upload enters the memory at 1 − μ_i, the memory the prompt at 1 − γ_i); 0 elsewhere."""
    return np.where(x.replied, (1.0 - gamma) * (1.0 - mu), 0.0)


def check_output(output: Any, n: int, d: int) -> None:
    """Refuse what a rule returned unless it is a :class:`RoundOutput` the server can store: ``memory`` and
    ``personalized`` finite [N, d] arrays, diagnostics of N clients, ``state`` per-client finite arrays [N, ...].
    Raises ``ValueError`` saying what is wrong (the strategy then leaves its state untouched)."""
    if not isinstance(output, RoundOutput):
        raise ValueError(f"returned {type(output).__name__}, not a RoundOutput")
    for name in ("memory", "personalized"):
        array = np.asarray(getattr(output, name))
        if array.shape != (n, d):
            raise ValueError(f"{name} has shape {array.shape}, expected ({n}, {d})")
        if not np.issubdtype(array.dtype, np.floating) or not np.isfinite(array).all():
            rows = np.flatnonzero(~np.isfinite(array).all(axis=1))[:10].tolist() if array.dtype.kind == "f" else []
            raise ValueError(f"{name} is not finite (rows {rows}) or not floating point ({array.dtype})")
    diag = output.diagnostics
    for name in ("informative", "update_norm", "r", "mu", "gamma"):
        if np.shape(getattr(diag, name)) != (n,):
            raise ValueError(f"diagnostics.{name} has shape {np.shape(getattr(diag, name))}, expected ({n},)")
    if np.shape(diag.peer_weights) != (n, n):
        raise ValueError(f"diagnostics.peer_weights has shape {np.shape(diag.peer_weights)}, expected ({n}, {n})")
    if not isinstance(output.state, dict):
        raise ValueError(f"state is a {type(output.state).__name__}, not a dict of per-client arrays")
    for key, value in output.state.items():
        array = np.asarray(value)
        if array.ndim < 1 or array.shape[0] != n or not np.issubdtype(array.dtype, np.number):
            raise ValueError(f"state[{key!r}] must be a numeric array with one row per client (N = {n})")
        if not np.isfinite(array).all():
            raise ValueError(f"state[{key!r}] is not finite")


def synthetic_round(
    rng: np.random.Generator,
    n_clients: int,
    dim: int,
    *,
    reply_prob: float = 0.7,
    step: float = 0.01,
) -> dict[str, NDArray[Any]]:
    """Random but plausible keyword inputs of one round, for tests and benchmarks.

    Memories and last-sent prompts scatter around a common P⁰ (token-embedding scale ~0.02); each upload
    is the last-sent prompt plus a step of scale ``step`` (a shared direction plus per-client noise, so
    most cosines are positive); entropies lie in [1, log 100] with a drop in [0, 1].
    Rows of clients that did not reply hold NaN, as a reminder that they must be ignored.
    """
    p0 = rng.normal(0.0, 0.02, size=dim)
    memory = p0 + rng.normal(0.0, 0.005, size=(n_clients, dim))
    sent = p0 + rng.normal(0.0, 0.005, size=(n_clients, dim))
    # Steps share a common direction (all clients adapt the same P⁰ to the same kind of task) plus noise.
    direction = rng.normal(0.0, 1.0, size=dim) + rng.normal(0.0, 1.0, size=(n_clients, dim))
    tuned = sent + step * direction * rng.uniform(0.2, 2.0, size=(n_clients, 1))
    h_pre = rng.uniform(1.0, math.log(100), size=n_clients)
    h_post = h_pre - rng.uniform(0.0, 1.0, size=n_clients)
    replied = rng.random(n_clients) < reply_prob
    replied[rng.integers(n_clients)] = True
    absent = ~replied
    tuned[absent] = np.nan
    h_pre[absent] = np.nan
    h_post[absent] = np.nan
    return {
        "tuned": tuned.astype(np.float32),
        "sent": sent.astype(np.float32),
        "memory": memory.astype(np.float32),
        "h_pre": h_pre,
        "h_post": h_post,
        "replied": replied,
        "num_examples": rng.integers(1, 65, size=n_clients).astype(np.float64),
    }
