"""Byzantine-robust global baselines, with Flower's own aggregation math: FedMedian, FedTrimmedAvg, Krum.

Like FedAvg they compute one prompt from the round's uploads and send it to every client. They are here for
the robustness comparison (uploads from adversarial clients), not as personalized rules. The statistics are
Flower's (``np.median`` as in ``flwr.serverapp.strategy.FedMedian``, ``trim_mean`` of
``flwr.serverapp.strategy.fedtrimmedavg``, ``aggregate_krum`` of ``flwr.server.strategy.aggregate``),
applied to the flattened prompt vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.server.strategy.aggregate import aggregate_krum
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from numpy.typing import ArrayLike, NDArray

from fedrapp_app.aggregation.common import (
    NON_NEGATIVE,
    Interval,
    RoundInputs,
    RoundOutput,
    Rule,
    RuleParams,
    param,
    send_to_everyone,
    unchanged_round,
    validate_round,
)


@dataclass(frozen=True)
class FedMedianParams(RuleParams):
    """Coordinate-wise median: no hyperparameter."""


@dataclass(frozen=True)
class FedTrimmedAvgParams(RuleParams):
    """Coordinate-wise mean after cutting the ``beta`` share of the lowest and of the highest values."""

    beta: float = param(0.2, Interval(0.0, 0.5, high_open=True), "share cut at each end")


@dataclass(frozen=True)
class KrumParams(RuleParams):
    """Krum (Blanchard et al., 2017): the upload closest to its n - f - 2 nearest uploads."""

    num_malicious: float = param(1.0, NON_NEGATIVE, "f, the number of adversarial clients tolerated")


def _global_statistic(x: RoundInputs, statistic: Callable[[NDArray[np.float64]], NDArray]) -> RoundOutput:
    """Send ``statistic(replies [A, d]) -> [d]`` to every client (nothing moves if nobody replied)."""
    if not x.replied.any():
        return unchanged_round(x)
    return send_to_everyone(x, np.asarray(statistic(x.tuned[x.replied]), dtype=np.float64))


def fedmedian_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: FedMedianParams | None = None,
) -> RoundOutput:
    """fedmedian: P_g = coordinate-wise median of the replies, sent to every client."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return _global_statistic(x, lambda replies: np.median(replies, axis=0))


def fedtrimmedavg_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: FedTrimmedAvgParams | None = None,
) -> RoundOutput:
    """fedtrimmedavg: P_g = coordinate-wise trimmed mean of the replies (cut ``beta`` at each end)."""
    beta = (params or FedTrimmedAvgParams()).beta
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return _global_statistic(x, lambda replies: trim_mean(replies, beta))


def krum_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: KrumParams | None = None,
) -> RoundOutput:
    """krum: P_g = the reply with the smallest summed distance to its n - f - 2 nearest replies."""
    f = int((params or KrumParams()).num_malicious)
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    return _global_statistic(
        x, lambda replies: aggregate_krum([([row], 1) for row in replies], num_malicious=f, to_keep=0)[0]
    )


FEDMEDIAN = Rule(fedmedian_round, FedMedianParams, summary="FedMedian: the coordinate-wise median, sent to everyone")
FEDTRIMMEDAVG = Rule(
    fedtrimmedavg_round, FedTrimmedAvgParams, summary="FedTrimmedAvg: the trimmed mean, sent to everyone"
)
KRUM = Rule(krum_round, KrumParams, summary="Krum: the upload closest to its neighbours, sent to everyone")
