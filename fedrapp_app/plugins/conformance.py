"""The conformance kit: the contract a server rule or a local method must meet, as checks a plugin's author runs
with pytest before a full run (as scikit-learn's ``parametrize_with_checks`` does for estimators).

    from fedrapp_app.plugins import parametrize_with_checks

    @parametrize_with_checks(rules=["mean-mix"], methods=["confident-half"])
    def test_conformance(check):
        check()

A rule or a method is named as ``fedrapp-list`` names it (a registered name or ``module:attribute``), or given as
the object (a ``Rule`` or a round function; a ``LocalMethod`` class or a ``MethodSpec``), alone or with
parameters as a ``(target, {"key": value})`` pair. This project runs the kit on every rule and method its entry
points register, and on the two examples (tests/test_conformance.py), so the built-ins and the contract cannot
drift apart.

The rule checks are numpy only (milliseconds; the cost check a second or two): parameters, outputs (shapes, dtypes,
finite values, peer weights), the degenerate rounds real runs meet (uploads that did not move, one reply, equal
entropies), client-order invariance, isolation (no write into the inputs or into earlier outputs; a raise inside
the strategy's own rule application fails the round with the server state untouched), a newcomer, state round trip
and resume (stateful rules), determinism (global RNGs included) and the cost of a round at 6 and 48 clients
(``cost_budget``). The method checks run the method on a tiny random CLIP (seconds): parameters, the initial
prompt, what ``adapt`` returns (shapes, finite values, predictions among the classes, confidences in [0, 1]; the
received prompt left as it came), the entropies and predictions it reports recomputed from the prompts, state round
trip, determinism under a seed, and (``slow``) a two-client federation run with the labels of every stream
permuted: no upload, payload or client state may change (a difference is blamed on the labels only when an
unpermuted rerun repeats the first run exactly).

Every check runs inside a guard (``guard.py``): process-wide state it leaves changed -- torch's grad mode, thread
count and default dtype, the global RNGs, the kit's frozen CLIP -- fails it, named, and is restored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedrapp_app.aggregation import BoundRule, find_rule
from fedrapp_app.aggregation.common import NEWCOMER_PROMPTS, RoundOutput, Rule, check_output, synthetic_round
from fedrapp_app.methods import find_method
from fedrapp_app.methods.params import MethodSpec
from fedrapp_app.plugins.guard import global_rngs_seeded, guarded
from fedrapp_app.registry.parameters import allowed_range, build_params


@dataclass(frozen=True)
class Check:
    """One check of one rule or method: call it (no arguments); it raises ``AssertionError`` saying what is
    wrong. ``slow``: it runs a small federation (seconds), which a test suite may mark."""

    id: str
    function: Callable[[], None]
    slow: bool = False

    def __call__(self) -> None:
        self.function()

    def __repr__(self) -> str:
        return self.id


Target = Any  # a name, a Rule / round function / LocalMethod class / MethodSpec, or (one of those, params)


def _split(target: Target) -> tuple[Any, Mapping[str, Any]]:
    if isinstance(target, tuple) and len(target) == 2 and isinstance(target[1], Mapping):
        return target[0], target[1]
    return target, {}


# ------------------------------------------------------------------------------------------------- parameters
def _check_params(cls: type, values: Mapping[str, Any], owner: str) -> None:
    """The parameters' contract: a frozen dataclass whose fields all have defaults; declared ranges refused when
    crossed; an unknown key and a value of the wrong type refused, each with a ValueError naming it."""
    assert dataclasses.is_dataclass(cls), f"{owner}: its parameters ({cls!r}) must be a dataclass"
    built = build_params(cls, values, owner)  # every field has a default (TypeError otherwise)
    assert cls.__dataclass_params__.frozen, (
        f"{owner}: its parameters' dataclass must be frozen (@dataclass(frozen=True))"
    )
    hash(built)  # frozen and hashable: a run config's parameters are values
    try:
        build_params(cls, {**values, "no-such-parameter": 1}, owner)
    except ValueError as err:
        assert "no-such-parameter" in str(err), f"{owner}: the refusal of an unknown key does not name it: {err}"
    else:
        raise AssertionError(f"{owner}: an unknown parameter was accepted")
    for f in dataclasses.fields(cls):
        default = getattr(built, f.name)
        key = f.name.replace("_", "-")
        if isinstance(default, bool) or not isinstance(default, int | float):
            continue
        try:
            build_params(cls, {**values, key: "not a number"}, owner)
        except (ValueError, TypeError) as err:
            assert key in str(err) or f.name in str(err), (
                f"{owner}: the refusal of {key}='not a number' does not name it"
            )
        else:
            raise AssertionError(f"{owner}: {key} = 'not a number' was accepted")
        allowed = allowed_range(f)
        if allowed is None:
            continue
        outside = [allowed.low - 1.0 if not allowed.low_open else allowed.low]
        if math.isfinite(allowed.high):
            outside.append(allowed.high + 1.0 if not allowed.high_open else allowed.high)
        for value in outside:
            if not math.isfinite(value) or value in allowed:
                continue
            value = int(value) if isinstance(default, int) and float(value).is_integer() else value
            try:
                build_params(cls, {**values, key: value}, owner)
            except ValueError:
                continue
            raise AssertionError(f"{owner}: {key} = {value!r} is outside its declared range {allowed} but was accepted")


# ----------------------------------------------------------------------------------------------------- rules
def _resolve_rule(target: Any) -> tuple[str, Rule]:
    if isinstance(target, str):
        return target, find_rule(target).target
    if isinstance(target, Rule):
        return getattr(target.round, "__name__", "rule"), target
    if callable(target):
        return getattr(target, "__name__", "rule"), Rule(target)
    raise TypeError(f"not a rule: {target!r} (a name, a Rule or a round function)")


def _own_reports(n: int, replied: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """What the clients report about their own prompt (``trust.OwnPromptReports``'s fields), as the strategy
    passes them: plausible values for the replying clients, NaN elsewhere and for what was not reported."""
    from fedrapp_app.federation.records import OWN_PROMPT_FIELDS, VOTE_METRICS

    votes = {key.replace("-", "_") for key in VOTE_METRICS}
    own = {}
    for name in OWN_PROMPT_FIELDS:
        if name.startswith("dp_"):
            own[name] = np.full(n, np.nan)
            continue
        values = rng.uniform(0.0, 0.5, n) if name in votes else rng.uniform(1.0, 3.0, n)
        own[name] = np.where(replied, values, np.nan)
    return own


class _RuleRun:
    """Rounds of one bound rule on synthetic uploads, its memory, sent prompts and state carried as the strategy
    carries them."""

    def __init__(self, bound: BoundRule, n: int, d: int, seed: int) -> None:
        self.bound, self.n, self.d = bound, n, d
        self.rng = np.random.default_rng(seed)
        first = synthetic_round(self.rng, n, d)
        self.p0 = first["sent"][0].copy()
        self.memory = np.tile(self.p0, (n, 1))
        self.sent = self.memory.copy()
        self.state: dict[str, np.ndarray] = {}

    def inputs(self, absent: Sequence[int] = (), *, others_reply: bool = False,
               only: Sequence[int] | None = None) -> dict[str, Any]:  # fmt: skip
        """The next round's inputs: uploads near each client's sent prompt; ``absent`` clients do not reply, nor
        (unless ``others_reply``) a random share of the others; ``only``: exactly these clients reply."""
        x = synthetic_round(self.rng, self.n, self.d, reply_prob=1.0 if others_reply else 0.7)
        replied = x["replied"].copy()
        replied[list(absent)] = False
        if only is not None:
            replied[:] = False
            replied[list(only)] = True
        if not replied.any():
            replied[[i for i in range(self.n) if i not in absent][0]] = True
        step = x["tuned"] - x["sent"]
        tuned = (self.sent + np.nan_to_num(step)).astype(np.float32)
        tuned[~replied] = np.nan
        h_pre, h_post = x["h_pre"].copy(), x["h_post"].copy()
        h_pre[~replied] = np.nan
        h_post[~replied] = np.nan
        h_pre[replied] = np.nan_to_num(h_pre[replied], nan=2.0)
        h_post[replied] = np.nan_to_num(h_post[replied], nan=1.5)
        payload = {}
        example = self.bound.rule.payload_example
        if self.bound.rule.reads_payload and example is not None:  # what the clients' method uploads beside
            payload = {k: np.array(v, dtype=np.float32) for k, v in example(self.rng, self.n).items()}
            for value in payload.values():
                value[~replied] = np.nan
        return {
            "tuned": tuned,
            "sent": self.sent.copy(),
            "memory": self.memory.copy(),
            "h_pre": h_pre,
            "h_post": h_post,
            "replied": replied,
            "num_examples": x["num_examples"],
            "own": _own_reports(self.n, replied, self.rng),
            "payload": payload,
        }

    def step(self, inputs: Mapping[str, Any]) -> RoundOutput:
        out = call_rule(self.bound, inputs, self.state)
        check_output(out, self.n, self.d)
        self.keep(out)
        return out

    def keep(self, out: RoundOutput) -> None:
        """Store a round's output as the server does, for the next round."""
        self.memory = np.asarray(out.memory, dtype=np.float32).copy()
        self.sent = np.asarray(out.personalized, dtype=np.float32).copy()
        self.state = {k: np.array(v) for k, v in out.state.items()}

    def checked(self, inputs: Mapping[str, Any], where: str) -> tuple[RoundOutput, float]:
        """One round as the server would take it, and the seconds the rule took: a raise, or an output the server
        refuses, is an AssertionError saying ``where``; the output is kept."""
        start = time.perf_counter()
        try:
            out = call_rule(self.bound, inputs, self.state)
        except Exception as err:
            raise AssertionError(f"{where}: the rule raised {type(err).__name__}: {err} (the round fails)") from err
        seconds = time.perf_counter() - start
        try:
            check_output(out, self.n, self.d)
        except ValueError as err:
            raise AssertionError(f"{where}: {err} (the server refuses it: the round fails)") from err
        _check_diagnostics(out, self.n, where)
        self.keep(out)
        return out, seconds


def _check_diagnostics(out: RoundOutput, n: int, where: str) -> None:
    """What the report reads of a round: float32 prompts, finite diagnostics, peer weights >= 0 whose rows sum
    to 1 or 0, an own weight per client."""
    for field in ("memory", "personalized"):
        array = np.asarray(getattr(out, field))
        assert array.dtype == np.float32, f"{where}: {field} is {array.dtype}, expected float32 (the wire's)"
    d = out.diagnostics
    weights = np.asarray(d.peer_weights, dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(weights) & (weights >= 0)).all(axis=1)).tolist()
    assert not bad, f"{where}: the peer weights of rows {bad} are negative or not finite, expected finite and >= 0"
    sums = weights.sum(axis=1)
    assert np.all(np.isclose(sums, 1.0, atol=1e-6) | np.isclose(sums, 0.0, atol=1e-12)), (
        f"{where}: each row of the peer weights must sum to 1 or be all zero, got {sums}"
    )
    for field in ("update_norm", "r", "mu", "gamma"):
        values = np.asarray(getattr(d, field), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values)).tolist()
        assert not bad, f"{where}: diagnostics.{field} is not finite for clients {bad} ({values[bad].tolist()})"
    if out.own_weight is not None:
        weight = np.asarray(out.own_weight, dtype=np.float64)
        assert weight.shape == (n,), f"{where}: own_weight has shape {weight.shape}, expected ({n},)"


def _unmoved(inputs: dict[str, Any], rows: Sequence[int]) -> dict[str, Any]:
    """``inputs`` where the replying clients among ``rows`` uploaded exactly what they were sent."""
    rows = [i for i in rows if inputs["replied"][i]]
    inputs["tuned"][rows] = inputs["sent"][rows]
    return inputs


def _equal_entropies(inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` where every replying client reported the same H_pre and the same H_post."""
    inputs["h_pre"][inputs["replied"]] = 2.0
    inputs["h_post"][inputs["replied"]] = 1.5
    return inputs


#: The degenerate rounds real runs meet, as (what the failure calls it, the round's inputs from a run). AdaPrompt
#: leaves most client-rounds unmoved until its buffer fills (0/0 in a cosine or a normalised update); a round may
#: hear from one client only (a z-score with ddof=1, a std of one value); clients may agree to the last digit.
DEGENERATE_ROUNDS: tuple[tuple[str, Callable[[_RuleRun], dict[str, Any]]], ...] = (
    ("clients 1 and 3 did not move (tuned = sent)", lambda run: _unmoved(run.inputs(others_reply=True), [1, 3])),
    ("no client moved (tuned = sent for every upload)", lambda run: _unmoved(run.inputs(), range(run.n))),
    ("exactly one client replied", lambda run: run.inputs(only=[2 % run.n])),
    ("one client replied and did not move", lambda run: _unmoved(run.inputs(only=[1]), [1])),
    ("every client reported the same entropies", lambda run: _equal_entropies(run.inputs(others_reply=True))),
)

#: The cost check: a round of COST_CLIENTS clients (a testbed-sized federation and a larger one) on prompts of
#: COST_DIM entries (4 context tokens x 512, a ViT-B/16 prompt), every client replying, the best of up to
#: COST_TRIES, within cost_budget(N) = COST_SLACK_S + COST_PER_PAIR_S x N^2 seconds: it grows as the built-ins'
#: costliest term does (pairwise distances, cosines), an absolute budget (a time relative to FedRAPP's round,
#: measured alongside, swung with the machine's load more than the rules' own times did). The budget holds every
#: built-in with room to spare on a 2-core machine under a load average above 10 (benchmarks/rule_cost.py,
#: docs/results/raw/rule_cost.txt) and fails a rule that sleeps or loops over pairs of clients in Python.
COST_CLIENTS = (6, 48)
COST_DIM = 2048
COST_SLACK_S = 0.1
COST_PER_PAIR_S = 5e-4
COST_TRIES = 5


def cost_budget(n: int) -> float:
    """The seconds a round of ``n`` clients may take (see COST_PER_PAIR_S)."""
    return COST_SLACK_S + COST_PER_PAIR_S * n * n


def round_costs(bound: BoundRule, reference: BoundRule, n: int, *, dim: int = COST_DIM, seed: int = 0,
                tries: int = COST_TRIES, budget: float | None = None) -> tuple[float, float]:  # fmt: skip
    """(the best of up to ``tries`` rounds of ``bound``, the best of three rounds of ``reference`` before them),
    in seconds, for ``n`` clients that all reply. ``budget``: stop once ``bound``'s best is within it or over
    twice it after two rounds (one round on a loaded machine may be preempted; None: run all ``tries``)."""
    plugin, ref = _RuleRun(bound, n, dim, seed), _RuleRun(reference, n, dim, seed)
    ref_best = min(ref.checked(ref.inputs(others_reply=True), "the reference")[1] for _ in range(3))
    best = math.inf
    for attempt in range(tries):
        where = f"server rule {bound.name!r}, {n} clients, round {attempt + 1}"
        best = min(best, plugin.checked(plugin.inputs(others_reply=True), where)[1])
        if budget is not None and (best <= budget or (attempt >= 1 and best > 2 * budget)):
            break
    return best, ref_best


def call_rule(bound: BoundRule, inputs: Mapping[str, Any], state: Mapping[str, np.ndarray] | None) -> RoundOutput:
    """The bound rule on one round's ``inputs`` (as ``_RuleRun.inputs`` makes them), given copies."""
    arrays = [np.array(inputs[k]) for k in ("tuned", "sent", "memory", "h_pre", "h_post", "replied", "num_examples")]
    own = {k: np.array(v) for k, v in inputs["own"].items()}
    payload = {k: np.array(v) for k, v in inputs.get("payload", {}).items()}
    state = {k: np.array(v) for k, v in (state or {}).items()} or None
    return bound(*arrays, own=own, state=state, payload=payload)


def _raise_isolated(run: _RuleRun, name: str, found_rule: Rule, owner: str) -> None:
    """Through the strategy's own rule application: the rule runs on a round, then raises; the round must fail
    as a rule failure (``RuleFailed``) with the server's memories, prompts and rule state as they were."""
    from fedrapp_app.federation.records import Upload
    from fedrapp_app.federation.strategy import PersonalizedPromptStrategy, RuleFailed, ServerState

    def then_raise(*args: Any, **kwargs: Any) -> RoundOutput:
        found_rule.round(*args, **kwargs)
        raise RuntimeError("raised after the rule ran")

    strategy = PersonalizedPromptStrategy("none-fed", {}, num_clients=run.n)
    strategy.rule = BoundRule(name, dataclasses.replace(found_rule, round=then_raise), run.bound.params)
    strategy.state = ServerState.initial(run.p0, run.n, 0)
    strategy.state.memory, strategy.state.sent = run.memory.copy(), run.sent.copy()
    strategy.state.rule_state = {k: np.array(v) for k, v in run.state.items()}
    inputs = run.inputs(absent=[0])
    strategy.payload = {k: tuple(v.shape[1:]) for k, v in inputs["payload"].items()}
    uploads = [
        Upload(int(i), inputs["tuned"][i], float(inputs["h_pre"][i]), float(inputs["h_post"][i]),
               int(inputs["num_examples"][i]), {}, payload={k: v[i] for k, v in inputs["payload"].items()} or None)
        for i in np.flatnonzero(inputs["replied"])
    ]  # fmt: skip
    before = (strategy.state.memory.copy(), strategy.state.sent.copy(), dict(strategy.state.rule_state))
    try:
        strategy._apply_rule(uploads)
    except RuleFailed:
        pass
    else:
        raise AssertionError(f"{owner}: a rule that raised did not fail its round")
    _same(strategy.state.memory, before[0], f"{owner}: a failed round changed the server's memories")
    _same(strategy.state.sent, before[1], f"{owner}: a failed round changed the prompts the server sends")
    assert sorted(strategy.state.rule_state) == sorted(before[2]), f"{owner}: a failed round changed the rule state"
    for key, value in before[2].items():
        _same(strategy.state.rule_state[key], value, f"{owner}: a failed round changed state[{key!r}]")


def _same(a: Any, b: Any, where: str) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f"{where}: values differ"


def _same_output(a: RoundOutput, b: RoundOutput, where: str) -> None:
    _same(a.memory, b.memory, f"{where}: memory")
    _same(a.personalized, b.personalized, f"{where}: personalized")
    assert sorted(a.state) == sorted(b.state), f"{where}: state keys {sorted(a.state)} vs {sorted(b.state)}"
    for key in a.state:
        _same(a.state[key], b.state[key], f"{where}: state[{key!r}]")


#: Why a rule's outputs change with the global RNGs' states, and the fix.
GLOBAL_RNG_CAUSE = (
    "it draws from numpy's, Python's or torch's global RNG; derive any randomness from its inputs or parameters "
    "(np.random.default_rng(seed))"
)


def draws_from_global_rngs(bound: BoundRule, inputs: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> bool:
    """Whether ``bound``'s output on ``inputs`` changes with the global RNGs' states (two seeds)."""
    outputs = []
    for seed in (0, 1):
        with global_rngs_seeded(seed):
            outputs.append(call_rule(bound, inputs, state))
    try:
        _same_output(*outputs, "")
    except AssertionError:
        return True
    return False


def _params_for_rows(params: Any, rows: np.ndarray, clients: int) -> Any:
    """The parameters for the checked clients ``rows`` (a permutation of the ``clients``, or ``arange(N) %
    clients`` for N clients): a per-client ``groups`` map (the domain oracle's) follows."""
    groups = getattr(params, "groups", None)
    if isinstance(groups, tuple) and len(groups) == clients:
        return dataclasses.replace(params, groups=tuple(groups[i] for i in rows))
    return params


def rule_checks(target: Target, params: Mapping[str, Any] | None = None, *, clients: int = 6, dim: int = 24,
                seed: int = 0) -> list[Check]:  # fmt: skip
    """The checks of a server rule: ``target`` is a registered name or ``module:attribute``, a :class:`Rule` or a
    round function (or a ``(target, params)`` pair); ``params`` its parameters (kebab- or snake-case keys), checked
    on ``clients`` clients and prompts of ``dim`` entries."""
    target, paired = _split(target)
    values = {**paired, **(params or {})}
    name, found_rule = _resolve_rule(target)
    owner = f"server rule {name!r}"

    def bound() -> BoundRule:
        return BoundRule(name, found_rule, build_params(found_rule.params, values, owner))

    def check_params() -> None:
        _check_params(found_rule.params, values, owner)
        assert found_rule.newcomer in NEWCOMER_PROMPTS, f"{owner}: newcomer {found_rule.newcomer!r}"
        assert not found_rule.reads_payload or found_rule.payload_example is not None, (
            f"{owner} reads a payload but gives no payload_example(rng, N) for the checks to feed it"
        )

    def check_outputs() -> None:
        run = _RuleRun(bound(), clients, dim, seed)
        for rnd in range(3):
            run.checked(run.inputs(absent=[rnd % clients]), f"{owner}, round {rnd + 1}")

    def check_degenerate_rounds() -> None:
        for case, make_inputs in DEGENERATE_ROUNDS:
            run = _RuleRun(bound(), clients, dim, seed)
            run.checked(run.inputs(absent=[0]), f"{owner}, round 1")  # a history
            run.checked(make_inputs(run), f"{owner}, a round where {case}")
            run.checked(run.inputs(), f"{owner}, the round after one where {case}")

    def check_cost() -> None:
        from fedrapp_app.aggregation.fedrapp import FEDRAPP

        reference = BoundRule("fedrapp", FEDRAPP, FEDRAPP.params())
        for warm in (reference, BoundRule(name, found_rule, _params_for_rows(bound().params, np.arange(6) % clients,
                                                                              clients))):  # fmt: skip
            run = _RuleRun(warm, 6, COST_DIM, seed)  # first calls (imports, caches) are not a round's cost
            run.checked(run.inputs(others_reply=True), f"{owner}, a round of 6 clients")
        seen = []
        for n in COST_CLIENTS:
            params = _params_for_rows(bound().params, np.arange(n) % clients, clients)
            budget = cost_budget(n)
            best, ref = round_costs(BoundRule(name, found_rule, params), reference, n, seed=seed, budget=budget)
            seen.append(f"{n} clients: {best:.3g} s (FedRAPP's round here: {ref:.3g} s)")
            assert best <= budget, (
                f"{owner}: a round of {n} clients on prompts of {COST_DIM} entries takes {best:.3g} s, over its budget "
                f"of {budget:.3g} s ({COST_SLACK_S:g} s + {COST_PER_PAIR_S:g} s x N^2); {'; '.join(seen)}. The rule "
                "runs in the ServerApp every round: work on all clients at once with numpy arrays, not in Python "
                "loops over clients or pairs of clients, and never sleep"
            )

    def check_client_order() -> None:
        run = _RuleRun(bound(), clients, dim, seed)
        run.step(run.inputs(absent=[1]))  # a history (memories, state) that differs per client
        # All but one reply: with few replies a rule that picks one upload faces an exact tie that no order of
        # the clients can break (Krum with f = 1 and at most 4 replies: the closest pair scores the same).
        inputs = run.inputs(absent=[0], others_reply=True)
        assert not draws_from_global_rngs(run.bound, inputs, run.state), (
            f"{owner}: its outputs change with the global RNGs' states, so whether they depend on the order of the "
            f"clients cannot be told: {GLOBAL_RNG_CAUSE}"
        )
        with global_rngs_seeded(seed):
            straight = call_rule(run.bound, inputs, run.state)
        order = np.random.default_rng(seed + 1).permutation(clients)
        shuffled_bound = BoundRule(name, found_rule, _params_for_rows(run.bound.params, order, clients))
        shuffled_inputs = {k: np.asarray(v)[order] for k, v in inputs.items() if k not in ("own", "payload")}
        shuffled_inputs["own"] = {k: v[order] for k, v in inputs["own"].items()}
        shuffled_inputs["payload"] = {k: v[order] for k, v in inputs["payload"].items()}
        with global_rngs_seeded(seed):
            shuffled = call_rule(shuffled_bound, shuffled_inputs, {k: v[order] for k, v in run.state.items()})
        scale = max(float(np.nanmax(np.abs(inputs["sent"]))), 1e-6)
        for field in ("memory", "personalized"):
            a, b = np.asarray(getattr(straight, field))[order], np.asarray(getattr(shuffled, field))
            assert np.allclose(a, b, rtol=1e-5, atol=1e-6 * scale), (
                f"{owner}: {field} depends on the order of the clients (max difference {np.max(np.abs(a - b)):.3g})"
            )
        for key, value in straight.state.items():
            assert np.allclose(np.asarray(value)[order], shuffled.state[key], rtol=1e-5, atol=1e-6 * scale), (
                f"{owner}: state[{key!r}] depends on the order of the clients"
            )
        a, b = np.asarray(straight.diagnostics.peer_weights)[np.ix_(order, order)], shuffled.diagnostics.peer_weights
        assert np.allclose(a, b, rtol=1e-5, atol=1e-9), f"{owner}: the peer weights depend on the order of the clients"

    def check_isolated() -> None:
        run = _RuleRun(bound(), clients, dim, seed)
        inputs = run.inputs(absent=[2])
        kept = {k: np.array(v) for k, v in inputs.items() if k not in ("own", "payload")}
        kept.update({f"payload[{k!r}]": np.array(v) for k, v in inputs["payload"].items()})
        arrays = [inputs[k] for k in ("tuned", "sent", "memory", "h_pre", "h_post", "replied", "num_examples")]
        state_in = {k: np.array(v) for k, v in run.state.items()}
        first = run.bound(*arrays, own=inputs["own"], state=state_in or None, payload=inputs["payload"])
        given = {**inputs, **{f"payload[{k!r}]": v for k, v in inputs["payload"].items()}}
        for key, value in kept.items():
            _same(given[key], value, f"{owner} wrote into its input {key!r} (the server's state)")
        returned = {"memory": np.array(first.memory), "personalized": np.array(first.personalized)}
        returned.update({f"state[{k!r}]": np.array(v) for k, v in first.state.items()})
        check_output(first, clients, dim)
        run.memory, run.sent = np.array(first.memory), np.array(first.personalized)
        run.state = {k: np.array(v) for k, v in first.state.items()}
        run.step(run.inputs(absent=[3]))
        later = {"memory": first.memory, "personalized": first.personalized}
        later.update({f"state[{k!r}]": v for k, v in first.state.items()})
        for key, value in returned.items():
            _same(later[key], value, f"{owner} changed its earlier output {key} in a later round (the server keeps it)")
        _raise_isolated(run, name, found_rule, owner)

    def check_newcomer() -> None:
        run = _RuleRun(bound(), clients, dim, seed)
        for _ in range(2):
            run.step(run.inputs(absent=[0]))  # client 0 never replied: its rows hold NaN uploads
        assert np.isfinite(run.sent[0]).all() and np.isfinite(run.memory[0]).all()
        out = run.step(run.inputs(absent=[1]))  # client 0 joins
        assert np.isfinite(np.asarray(out.personalized)[0]).all(), f"{owner}: a newcomer is sent non-finite values"

    def check_state_and_resume() -> None:
        straight = _RuleRun(bound(), clients, dim, seed)
        first = straight.inputs(absent=[0])
        assert not draws_from_global_rngs(straight.bound, first, straight.state), (
            f"{owner}: its outputs change with the global RNGs' states, so a resumed round cannot repeat the round it "
            f"resumes: {GLOBAL_RNG_CAUSE}"
        )
        outputs = [straight.step(first), *(straight.step(straight.inputs(absent=[r])) for r in (1, 2))]
        if not found_rule.stateful:
            assert all(not o.state for o in outputs), f"{owner}: returns a state but is not declared stateful=True"
        cut = _RuleRun(bound(), clients, dim, seed)
        for r in range(2):
            cut.step(cut.inputs(absent=[r]))
        buffer = io.BytesIO()  # the server's checkpoint holds the state as .npz arrays
        np.savez(buffer, memory=cut.memory, sent=cut.sent, **{f"state.{k}": v for k, v in cut.state.items()})
        buffer.seek(0)
        with np.load(buffer) as saved:
            resumed = _RuleRun(bound(), clients, dim, seed)
            resumed.rng = cut.rng
            resumed.memory, resumed.sent = saved["memory"], saved["sent"]
            resumed.state = {k[len("state.") :]: saved[k] for k in saved.files if k.startswith("state.")}
        _same_output(outputs[2], resumed.step(resumed.inputs(absent=[2])), f"{owner}: a resumed round differs")

    def check_deterministic() -> None:
        run = _RuleRun(bound(), clients, dim, seed)
        run.step(run.inputs())
        inputs = run.inputs(absent=[4 % clients])
        outputs = []
        for rngs in (seed, seed, seed + 1):
            with global_rngs_seeded(rngs):
                outputs.append(call_rule(bound(), inputs, run.state))
        _same_output(
            outputs[0],
            outputs[1],
            f"{owner}: the same inputs twice, under the same global RNG states, "
            "gave other outputs (it keeps something between calls outside its state: a counter, a cache)",
        )
        _same_output(
            outputs[0], outputs[2], f"{owner}: the same inputs under other global RNG states gave other outputs: "
            f"{GLOBAL_RNG_CAUSE}"
        )  # fmt: skip

    checks = [
        ("parameters", check_params),
        ("outputs", check_outputs),
        ("degenerate-rounds", check_degenerate_rounds),
        ("client-order", check_client_order),
        ("isolated", check_isolated),
        ("newcomer", check_newcomer),
        ("state-and-resume", check_state_and_resume),
        ("deterministic", check_deterministic),
        ("cost", check_cost),
    ]
    return [Check(f"rule:{name}:{label}", _guarded(f"{owner}, check {label!r},", f)) for label, f in checks]


def _guarded(where: str, function: Callable[[], None], model: Any = None) -> Callable[[], None]:
    """``function`` run inside the guard (``guard.guarded``)."""

    @functools.wraps(function)
    def run() -> None:
        with guarded(where, model=model):
            function()

    return run


# --------------------------------------------------------------------------------------------------- methods
@functools.cache
def tiny_clip_folder() -> Path:
    """A tiny random CLIP over the testbed's class names, written once per process (seconds; no download)."""
    from fedrapp_app.testbed import world
    from fedrapp_app.testbed.tiny import make_tiny_clip

    folder = Path(tempfile.mkdtemp(prefix="fedrapp-conformance-"))
    return make_tiny_clip(folder / "tiny-clip", world.CLASSNAMES)


@functools.cache
def _tiny_prompted() -> Any:
    from fedrapp_app.data.presets import get_preset
    from fedrapp_app.engine import PromptedCLIP, load_clip
    from fedrapp_app.testbed import world

    preset = get_preset("testbed")
    clip = load_clip(tiny_clip_folder(), device="cpu")
    return PromptedCLIP(clip, list(world.CLASSNAMES), preset.template, preset.ensemble)


def _pixels(count: int, seed: int) -> Any:
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (36, 40, 3), dtype=np.uint8)) for _ in range(count)]
    return _tiny_prompted().preprocess(images)


def _resolve_method(target: Any) -> tuple[str, MethodSpec, str | None]:
    """(name, spec, how a run config names it: a registered name or module:Class; None when it cannot)."""
    if isinstance(target, str):
        return target, find_method(target).target, target
    if isinstance(target, MethodSpec):
        return target.implementation, target, None
    if isinstance(target, type) and hasattr(target, "Params"):
        doc = (target.__doc__ or "").strip().splitlines()
        reference = f"{target.__module__}:{target.__qualname__}"
        return (
            getattr(target, "name", target.__name__),
            MethodSpec(reference, target.Params, doc[0] if doc else ""),
            reference,
        )
    raise TypeError(f"not a local method: {target!r} (a name, a LocalMethod class with Params, or a MethodSpec)")


def _generator(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed)


def _snapshot(adaptation: Any) -> dict[str, np.ndarray]:
    """What of an Adaptation must be reproducible, as arrays."""
    out = {f"prompt.{k}": b.detach().cpu().numpy() for k, b in enumerate(adaptation.prompt)}
    out["predictions"] = adaptation.predictions.cpu().numpy()
    out["predictions_before"] = adaptation.predictions_before.cpu().numpy()
    out["h"] = np.array([adaptation.h_pre, adaptation.h_post])
    for name in ("confidence", "confidence_before"):
        value = getattr(adaptation, name)
        if value is not None:
            out[name] = value.cpu().numpy()
    for key, value in (getattr(adaptation, "payload", None) or {}).items():
        out[f"payload.{key}"] = np.asarray(value)
    return out


def _same_arrays(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], where: str) -> None:
    assert sorted(a) == sorted(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
    for key in a:
        _same(a[key], b[key], f"{where}: {key}")


@contextlib.contextmanager
def permuted_labels(num_classes: int, seed: int) -> Iterator[None]:
    """Every client stream yields its batches with the labels permuted (images, order, positions unchanged)."""
    from fedrapp_app.data.streams import ClientStream

    permutation = np.random.default_rng(seed).permutation(num_classes)
    original = ClientStream.batch

    def batch(self: Any, position: int) -> Any:
        got = original(self, position)
        return dataclasses.replace(got, labels=permutation[got.labels])

    ClientStream.batch = batch  # type: ignore[method-assign]
    try:
        yield
    finally:
        ClientStream.batch = original  # type: ignore[method-assign]


def federation_uploads(local_method: str, method_params: Mapping[str, Any], out_dir: Path, strategy: str = "none-fed",
                       rounds: int = 2, clients: int = 2) -> dict[str, np.ndarray]:  # fmt: skip
    """Run a tiny in-process federation of ``local_method`` on the testbed's streams with the tiny CLIP; return
    every train reply's prompt, payload and rule metrics, and every client's final state, as arrays by name."""
    from fedrapp_app.federation.client import METHOD_STATE
    from fedrapp_app.federation.client import app as client_app
    from fedrapp_app.federation.inprocess import InProcessGrid
    from fedrapp_app.federation.records import PROMPT, RULE_METRICS, record_to_arrays
    from fedrapp_app.federation.server import run_server

    seen: dict[str, np.ndarray] = {}

    def spying_app(message: Any, context: Any) -> Any:
        reply = client_app(message, context)
        if message.metadata.message_type == "train" and reply.has_content():
            where = f"round {message.content['config']['server-round']} node {context.node_id}"
            for record in (PROMPT, "payload"):
                if record in reply.content.array_records:
                    for key, value in record_to_arrays(reply.content.array_records[record]).items():
                        seen[f"{where} {record}.{key}"] = value
            metrics = reply.content.metric_records.get("metrics", {})
            for key in RULE_METRICS:
                if key in metrics:
                    seen[f"{where} {key}"] = np.asarray(metrics[key])
        return reply

    from fedrapp_app.config import method_keys

    own_keys = {param: key for key, param in method_keys(local_method).items()}  # a built-in's keys of its own
    keyed = {own_keys[k.replace("-", "_")]: v for k, v in method_params.items() if k.replace("-", "_") in own_keys}
    rest = {k: v for k, v in method_params.items() if k.replace("-", "_") not in own_keys}
    params = " ".join(f"{key}={_toml(value)}" for key, value in rest.items())
    config = {
        **keyed,
        "model": str(tiny_clip_folder()),
        "num-clients": clients,
        "testbed-samples": 16 * clients * rounds,
        "batch-size": 8,
        "num-rounds": rounds,
        "local-method": local_method,
        "method-params": params,
        "strategy": strategy,
        "output-dir": str(out_dir),
        "run-name": "run",
        "decode-workers": 0,
    }
    grid = InProcessGrid(spying_app, clients, config)
    run_server(grid, config)
    for node, context in grid.contexts.items():
        if METHOD_STATE in context.state:
            for key, value in record_to_arrays(context.state[METHOD_STATE]).items():
                seen[f"node {node} state.{key}"] = value
    return seen


def _toml(value: Any) -> str:
    """A parameter's value as ``method-params`` writes it (a TOML value)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    return str(value)


def method_checks(target: Target, params: Mapping[str, Any] | None = None, *, batch: int = 6, seed: int = 0,
                  strategy: str = "none-fed") -> list[Check]:  # fmt: skip
    """The checks of a local method: ``target`` is a registered name or ``module:Class``, a ``LocalMethod``
    subclass with ``Params`` or a :class:`MethodSpec` (or a ``(target, params)`` pair); ``params`` its parameters.
    Batches of ``batch`` random images through a tiny random CLIP; the label check runs a two-client federation
    under ``strategy`` (a rule the method pairs with: ``latte`` for ``latte``)."""
    target, paired = _split(target)
    values = {**paired, **(params or {})}
    name, spec, reference = _resolve_method(target)
    owner = f"local method {name!r}"

    def make() -> Any:
        return spec.load()(build_params(spec.params, values, owner))

    def adapted(method: Any, prompt: Any, pixel_seed: int, generator_seed: int) -> Any:
        """``method.adapt`` on a copy of ``prompt`` and a batch. AssertionError if it changed what it received, or
        if what it returned has other shapes than the received prompt's and the batch's (which every check that
        goes on with the result needs)."""
        given = [block.clone() for block in prompt]
        out = method.adapt(_tiny_prompted(), given, _pixels(batch, pixel_seed), _generator(generator_seed))
        for k, (sent, kept) in enumerate(zip(prompt, given, strict=True)):
            changed = [what for what, same in (("values", bool((sent == kept.detach()).all())),
                                               ("requires_grad", not kept.requires_grad)) if not same]  # fmt: skip
            assert not changed, (
                f"{owner}: adapt changed the prompt it received (block {k}: its {' and '.join(changed)}); that tensor "
                "is the server's prompt, which the client also scores and keeps: tune a copy (check_prompt returns one)"
            )
        shapes, expected = [tuple(b.shape) for b in out.prompt], [tuple(b.shape) for b in prompt]
        assert shapes == expected, f"{owner}: the returned prompt has blocks {shapes}, expected the received {expected}"
        for field in ("predictions", "predictions_before"):
            value = getattr(out, field)
            assert tuple(value.shape) == (batch,) and str(value.dtype) == "torch.int64", (
                f"{owner}: {field} has shape {tuple(value.shape)} and dtype {value.dtype}, expected ({batch},) "
                "torch.int64 (one class index per image of the batch)"
            )
        return out

    def check_params() -> None:
        _check_params(spec.params, values, owner)

    def check_initial_prompt() -> None:
        import torch

        pclip = _tiny_prompted()
        a, b = make().initial_prompt(pclip), make().initial_prompt(pclip)
        assert isinstance(a, list) and a, f"{owner}: initial_prompt must return a non-empty list of blocks"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.device.type == "cpu", (
                f"{owner}: block {k} of P0 must be a float32 cpu tensor, got {type(x).__name__} "
                f"{getattr(x, 'dtype', '')}"
            )
            assert torch.isfinite(x).all(), f"{owner}: P0 block {k} is not finite"
            assert torch.equal(x, y), f"{owner}: P0 differs between two instances (it must be identical on all clients)"

    def check_adapt() -> None:
        import torch

        pclip = _tiny_prompted()
        method = make()
        p0 = method.initial_prompt(pclip)
        classes = len(pclip.classnames)
        for step in range(2):
            out = adapted(method, p0, seed + step, seed + step)
            where = f"{owner}, batch {step + 1}"
            for k, block in enumerate(out.prompt):
                assert block.dtype == torch.float32 and block.device.type == "cpu", (
                    f"{where}: returned prompt block {k} is {block.dtype} on {block.device}, expected float32, cpu"
                )
                assert torch.isfinite(block).all(), f"{where}: returned prompt block {k} is not finite"
                assert not block.requires_grad, f"{where}: returned prompt block {k} is not detached"
            for field in ("predictions", "predictions_before"):
                value = getattr(out, field)
                outside = value[(value < 0) | (value >= classes)].tolist()
                assert not outside, f"{where}: {field} holds {outside[:5]}, outside the classes 0..{classes - 1}"
            for field in ("h_pre", "h_post"):
                value = float(getattr(out, field))
                assert math.isfinite(value) and 0 <= value <= math.log(classes) + 1e-4, (
                    f"{where}: {field} = {value:.6g}, expected a mean prediction entropy in nats, in [0, log C = "
                    f"{math.log(classes):.4g}] for C = {classes} classes"
                )
            for field in ("confidence", "confidence_before"):
                value = getattr(out, field)
                if value is not None:
                    assert tuple(value.shape) == (batch,), (
                        f"{where}: {field} has shape {tuple(value.shape)}, expected ({batch},) (one per image)"
                    )
                    assert bool(((value >= 0) & (value <= 1)).all()), (
                        f"{where}: confidence outside [0, 1] ({field}: {value.tolist()[:5]}), expected the predicted "
                        "class's probability"
                    )
            for key, value in out.stats.items():
                assert math.isfinite(float(value)), f"{where}: stats[{key!r}] = {value!r} is not a finite number"
            _check_payload(method, pclip, out, where)

    def check_reports() -> None:
        from fedrapp_app.plugins.method_reports import declared, prompt_logits, report_problems

        pclip = _tiny_prompted()
        method = make()
        names = declared(method)
        prompt = method.initial_prompt(pclip)
        for step in range(2):  # P0, then a prompt the method tuned
            pixels = _pixels(batch, seed + step)
            out = adapted(method, prompt, seed + step, seed + step)
            if names:
                before, after = prompt_logits(pclip, prompt, pixels), prompt_logits(pclip, out.prompt, pixels)
                problems = report_problems(out, before, after, names)
                assert not problems, f"{owner}, batch {step + 1}: " + "; ".join(problems)
            prompt = out.prompt

    def check_state() -> None:
        from fedrapp_app.federation.records import arrays_to_record, record_to_arrays

        pclip = _tiny_prompted()
        first = make()
        p0 = first.initial_prompt(pclip)
        adapted(first, p0, seed, seed)
        state = first.state_dict()
        assert isinstance(state, dict), f"{owner}: state_dict must return a dict of numpy arrays"
        for key, value in state.items():
            assert isinstance(key, str) and isinstance(value, np.ndarray), f"{owner}: state[{key!r}] is not an array"
        wired = record_to_arrays(arrays_to_record(state))  # as context.state and the snapshots keep it
        second = make()
        second.load_state_dict(wired)
        _same_arrays(second.state_dict(), state, f"{owner}: state after load_state_dict(state_dict())")
        received = [b + 0.001 * torch_randn_like(b, seed) for b in p0]  # a prompt the server sent, not P0
        _same_arrays(
            _snapshot(adapted(first, received, seed + 1, seed + 1)),
            _snapshot(adapted(second, received, seed + 1, seed + 1)),
            f"{owner}: the next batch after a state round trip",
        )
        _same_arrays(first.state_dict(), second.state_dict(), f"{owner}: the state after the next batch")

    def check_deterministic() -> None:
        pclip = _tiny_prompted()
        runs = []
        for rngs in (seed, seed, seed + 1):  # the global RNGs as the first run had them, then others
            method = make()
            p0 = method.initial_prompt(pclip)
            with global_rngs_seeded(rngs):
                runs.append([_snapshot(adapted(method, p0, seed + s, seed + s)) for s in range(2)])
        for step, (a, b, c) in enumerate(zip(*runs, strict=True)):
            _same_arrays(a, b, f"{owner}: batch {step + 1} under the same seed")
            _same_arrays(
                a,
                c,
                f"{owner}: batch {step + 1} under the same seed but other global RNG states (it "
                "draws from torch's, numpy's or Python's global RNG: draw from the generator adapt gets)",
            )

    def check_labels() -> None:
        from fedrapp_app.testbed import world

        assert reference is not None, (
            f"{owner}: the label check runs a federation, which needs the method by name: pass its registered name "
            "or module:Class"
        )
        with tempfile.TemporaryDirectory(prefix="fedrapp-labels-") as scratch:
            plain = federation_uploads(reference, values, Path(scratch) / "plain", strategy)
            assert plain, f"{owner}: the federation produced no upload"
            with permuted_labels(len(world.CLASSNAMES), seed + 7):
                permuted = federation_uploads(reference, values, Path(scratch) / "permuted", strategy)
            differ = _differing(plain, permuted)
            if not differ:
                return
            # A difference is the labels' only if the run repeats itself: rerun it unpermuted (a method that passes
            # costs no third run; one that fails is blamed on its nondeterminism where the rerun differs too).
            again = _differing(plain, federation_uploads(reference, values, Path(scratch) / "again", strategy))
        assert not again, (
            f"{owner} is nondeterministic: the same federation run twice, labels unpermuted, gave other values in "
            f"{_few(again)}; the label check needs runs that repeat exactly (randomness from the generator adapt "
            "gets, nothing kept between instances outside the client state)"
        )
        raise AssertionError(
            f"{owner}: permuting every stream's labels changed an upload or a client state ({_few(differ)}), while an "
            "unpermuted rerun repeated the first run exactly: labels reach what the method uploads or keeps"
        )

    checks = [
        ("parameters", check_params, False),
        ("initial-prompt", check_initial_prompt, False),
        ("adapt", check_adapt, False),
        ("reports", check_reports, False),
        ("state-round-trip", check_state, False),
        ("deterministic", check_deterministic, False),
        ("labels-never-reach-an-upload", check_labels, True),
    ]
    model = ("the conformance kit's frozen CLIP", lambda: _tiny_prompted().clip.model, _tiny_prompted.cache_clear)
    return [
        Check(f"method:{name}:{label}", _guarded(f"{owner}, check {label!r},", function, model), slow)
        for label, function, slow in checks
    ]


def _differing(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> list[str]:
    """The names whose arrays differ between ``a`` and ``b`` (shape, dtype or a value; NaN equals NaN), or that
    only one holds."""
    out = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = np.asarray(a[key]), np.asarray(b[key])
        if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            out.append(key)
    return out


def _few(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def torch_randn_like(block: Any, seed: int) -> Any:
    """Seeded standard normal noise of ``block``'s shape (float32)."""
    import torch

    return torch.randn(block.shape, generator=_generator(seed), dtype=torch.float32)


def _check_payload(method: Any, pclip: Any, adaptation: Any, where: str) -> None:
    """A payload (arrays a method uploads beside its prompt) comes from a method that says it uploads one, with
    its template's names and shapes, float32 and finite; the server refuses anything else."""
    from fedrapp_app.federation.records import payload_shapes

    payload = getattr(adaptation, "payload", None) or {}
    if not getattr(method, "uploads_payload", False):
        assert not payload, f"{where}: a payload from a method whose uploads_payload is False (the server drops it)"
        return
    template = payload_shapes(method.payload_template(pclip))
    assert template, f"{where}: uploads_payload is True but payload_template is empty"
    assert sorted(payload) == sorted(template), f"{where}: payload {sorted(payload)}, template {sorted(template)}"
    for key, value in payload.items():
        array = np.asarray(value)
        assert array.dtype == np.float32, f"{where}: payload[{key!r}] is {array.dtype}, expected float32"
        assert tuple(array.shape) == template[key], f"{where}: payload[{key!r}] {array.shape}, template {template[key]}"
        assert np.isfinite(array).all(), f"{where}: payload[{key!r}] is not finite"


def check_rule(target: Target, params: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
    """Run every rule check now (outside pytest); the first failure raises."""
    for check in rule_checks(target, params, **kwargs):
        check()


def check_method(target: Target, params: Mapping[str, Any] | None = None, *, slow: bool = True, **kwargs: Any) -> None:
    """Run every method check now (``slow=False``: without the federation); the first failure raises."""
    for check in method_checks(target, params, **kwargs):
        if slow or not check.slow:
            check()


def parametrize_with_checks(rules: Sequence[Target] = (), methods: Sequence[Target] = (), *,
                            method_strategy: Mapping[str, str] | None = None) -> Callable:  # fmt: skip
    """A pytest decorator: one test per check of each rule and method (ids ``rule:NAME:CHECK``), the checks that
    run a federation marked ``slow``. The decorated test takes ``check`` and calls it::

        @parametrize_with_checks(rules=["mean-mix"], methods=["confident-half"])
        def test_conformance(check):
            check()

    ``method_strategy``: the rule a method's label check runs under, by method name (default none-fed).
    """
    import pytest

    checks: list[Check] = []
    for target in rules:
        checks += rule_checks(target)
    for target in methods:
        name = _split(target)[0]
        strategy = (method_strategy or {}).get(name if isinstance(name, str) else "", "none-fed")
        checks += method_checks(target, strategy=strategy)
    params = [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in checks]
    return pytest.mark.parametrize("check", params)
