"""Server rules that tests name as ``plugin_rules:NAME`` (the module:attribute form; tests/ is on the path):
a hand-written twin of the example plugin, rules that fail in the ways a plugin may, a stateful rule, and the
mistakes real plugins made that only real runs showed (the conformance kit's regression cases)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from fedrapp_app.aggregation import (
    UNIT,
    RoundOutput,
    RuleParams,
    fedavg_round,
    none_fed_round,
    param,
    rule,
    validate_round,
)
from fedrapp_app.aggregation.common import keep_rows, mixing_diagnostics, unchanged_round


@dataclass(frozen=True)
class MixParams(RuleParams):
    weight: float = param(0.5, UNIT, "share of the mean of all uploads")


@rule(params=MixParams)
def mean_mix_by_hand(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=MixParams()):
    """examples/rule-mean-mix written out: (1 - w)·P̃_i + w·mean_j P̃_j for the replying clients, the others
    untouched."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    replying = np.flatnonzero(x.replied)
    k = replying.size
    if k == 0:
        return unchanged_round(x)
    mixing = (1.0 - params.weight) * np.eye(k) + params.weight / k if k > 1 else np.ones((1, 1))  # [k, k]
    mixed = x.tuned.copy()
    mixed[replying] = mixing @ x.tuned[replying]  # the same products as the example's, so the same bits
    xi = np.zeros((x.replied.shape[0],) * 2)
    xi[np.ix_(replying, replying)] = mixing
    absent = ~x.replied
    return RoundOutput(
        keep_rows(mixed, x.memory32, absent),
        keep_rows(mixed, x.sent32, absent),
        mixing_diagnostics(x, absent.astype(np.float64), xi),
    )


@rule()
def raises(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """A rule that writes into the server's arrays it was given, then raises."""
    np.asarray(memory)[:] = 0.0
    np.asarray(sent)[:] = 0.0
    raise ZeroDivisionError("the plugin divided by zero")


@rule()
def wrong_shape(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """A rule that returns one column too few."""
    out = fedavg_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return RoundOutput(out.memory[:, 1:], out.personalized[:, 1:], out.diagnostics)


@rule()
def not_finite(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """A rule that sends NaN."""
    out = fedavg_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    personalized = out.personalized.copy()
    personalized[0, 0] = np.nan
    return RoundOutput(out.memory, personalized, out.diagnostics)


@dataclass(frozen=True)
class CountingParams(RuleParams):
    shrink: float = param(0.5, UNIT, "how much of its own upload a client gets back, halved by each round it replied")


@rule(params=CountingParams, stateful=True)
def counting(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=CountingParams(), *, state=None, **_):
    """A stateful rule: it counts the rounds each client replied in (its state) and sends client i
    P̃_i·shrink^count_i + mean·(1 − shrink^count_i), so every row depends on the whole history of the state."""
    out = none_fed_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    count = np.zeros(x.replied.shape[0]) if not state else np.asarray(state["count"], dtype=np.float64)
    count = count + x.replied
    own = params.shrink ** count[:, None]
    mean = x.tuned[x.replied].mean(axis=0) if x.replied.any() else np.zeros(x.tuned.shape[1])
    mixed = own * x.tuned + (1.0 - own) * mean
    return RoundOutput(out.memory, keep_rows(mixed, x.sent32, ~x.replied), out.diagnostics, {"count": count})


# ----- rules that break the contract in one way each (tests/test_conformance.py: the kit must say which)
@rule()
def order_dependent(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """Every client gets the first replying client's upload: the row order of the clients matters."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    first = x.tuned[np.flatnonzero(x.replied)[0]]
    mixed = np.broadcast_to(first, x.tuned.shape)
    return RoundOutput(keep_rows(mixed, x.memory32, ~x.replied), keep_rows(mixed, x.sent32, ~x.replied),
                       mixing_diagnostics(x, np.zeros(x.replied.shape[0]), None))  # fmt: skip


@rule()
def writes_its_inputs(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """FedAvg that scribbles on the server's memory it was given."""
    out = fedavg_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    np.asarray(memory)[:] = 0.0
    return out


_KEPT: list[np.ndarray] = []


@rule()
def changes_what_it_returned(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """none-fed that keeps its returned memory and zeroes it at its next call (the server stores that array)."""
    for earlier in _KEPT:
        earlier[:] = 0.0
    out = none_fed_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    _KEPT.append(out.memory)
    return out


_CALLS = [0]


@rule(params=CountingParams, stateful=True)
def counts_outside_its_state(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=CountingParams(), *,
                             state=None, **_):  # fmt: skip
    """``counting`` that keeps its count in a global, not in its state: a resumed run cannot get it back."""
    _CALLS[0] += 1
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    out = none_fed_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    shrink = params.shrink ** _CALLS[0]
    mean = x.tuned[x.replied].mean(axis=0)
    mixed = shrink * x.tuned + (1.0 - shrink) * mean
    return RoundOutput(out.memory, keep_rows(mixed, x.sent32, ~x.replied), out.diagnostics, {"seen": x.replied * 1.0})


@dataclass(frozen=True)
class UncheckedParams:
    weight: float = param(0.5, UNIT, "declared in [0, 1]")


@rule(params=UncheckedParams)
def bad_weights(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=UncheckedParams()):
    """Peer weights that do not sum to one."""
    out = fedavg_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return RoundOutput(out.memory, out.personalized, dataclasses.replace(out.diagnostics,
                       peer_weights=out.diagnostics.peer_weights * 0.5))  # fmt: skip


_ROUNDS = [0]


@rule()
def fails_in_round_two(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """FedAvg, except that its second call raises (reset ``_ROUNDS`` before a run)."""
    _ROUNDS[0] += 1
    if _ROUNDS[0] == 2:
        raise RuntimeError("a bad day")
    return fedavg_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)


# ----- the mistakes real runs met, one each (tests/test_conformance.py: the kit must name each cause)
def _update_cosines(x):
    """Each replying client's cosine to the mean update (the plausible part the broken rules below share)."""
    updates = x.tuned - x.sent
    mean = updates[x.replied].mean(axis=0)
    return updates @ mean / (np.linalg.norm(updates, axis=1) * np.linalg.norm(mean))  # 0/0 for an unmoved upload


def _weighted_mix(x, weights):
    """Each replying client is sent the mean of the uploads weighted by ``weights`` [N] (>= 0)."""
    replying = np.flatnonzero(x.replied)
    w = np.zeros(x.replied.shape[0])
    w[replying] = weights[replying]
    mixed = np.tile(w @ np.nan_to_num(x.tuned) / w.sum(), (x.replied.shape[0], 1))
    absent = ~x.replied
    xi = np.zeros((x.replied.shape[0],) * 2)
    xi[np.ix_(replying, replying)] = w[replying] / w.sum()
    return RoundOutput(keep_rows(mixed, x.memory32, absent), keep_rows(mixed, x.sent32, absent),
                       mixing_diagnostics(x, absent.astype(np.float64), xi))  # fmt: skip


@rule()
def nan_when_unmoved(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """Weights each upload by 1 + its cosine to the mean update: NaN for an upload that did not move."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return _weighted_mix(x, 1.0 + _update_cosines(x))


@rule()
def zscore_ddof1(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """Weights each upload by exp(z-score of its entropy drop), the z-score with ddof = 1: NaN for one reply."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    drop = np.where(x.replied, x.h_pre - x.h_post, 0.0)
    z = (drop - drop[x.replied].mean()) / drop[x.replied].std(ddof=1)
    return _weighted_mix(x, np.exp(z))


@rule()
def zscore_unguarded(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """The z-score with ddof = 0 (and a single reply handled) but no floor under the spread: NaN when every
    client reports the same drop."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    drop = np.where(x.replied, x.h_pre - x.h_post, 0.0)
    if x.replied.sum() < 2:  # one reply: nothing to compare it with
        return _weighted_mix(x, np.ones(x.replied.shape[0]))
    z = (drop - drop[x.replied].mean()) / drop[x.replied].std()
    return _weighted_mix(x, np.exp(np.clip(z, -5, 5)))


@rule()
def reseeds_numpy(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """FedAvg that calls np.random.seed(0) (to make a tie-break repeatable): every later draw of the process
    repeats."""
    np.random.seed(0)
    return fedavg_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)


@rule()
def draws_from_numpy(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """Weights the uploads by random numbers from numpy's global RNG (a random tie-break)."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return _weighted_mix(x, np.random.uniform(0.5, 1.0, size=x.replied.shape[0]))


@rule()
def sleeps(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """FedAvg that waits half a second a round (a retry loop, a lock, a remote call)."""
    time.sleep(0.5)
    return fedavg_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)


@rule()
def quadratic(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=None):
    """FedAvg weighted by each client's summed distance and cosine to the others (of the uploads and of the
    updates), computed pair by pair and entry by entry in Python: cheap at 6 clients, seconds a round at 48."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    replying = np.flatnonzero(x.replied)
    uploads = {i: x.tuned[i].tolist() for i in replying}
    updates = {i: (x.tuned[i] - x.sent[i]).tolist() for i in replying}
    spread = np.zeros(x.replied.shape[0])
    for i in replying:
        for j in replying:
            for rows in (uploads, updates):
                dot = sum(a * b for a, b in zip(rows[i], rows[j], strict=True))
                distance = sum((a - b) ** 2 for a, b in zip(rows[i], rows[j], strict=True))
                spread[i] += distance - dot
    return _weighted_mix(x, 1.0 / (1.0 + np.abs(spread)))
