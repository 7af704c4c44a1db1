"""Byzantine-robust global baselines, with Flower's own aggregation math: FedMedian, FedTrimmedAvg, Krum.

Like FedAvg they compute one prompt from the round's uploads and send it to every client. They are here for
the robustness comparison (uploads from adversarial clients), not as personalized rules. The statistics are
Flower's (``np.median`` as in ``flwr.serverapp.strategy.FedMedian``, ``trim_mean`` of
``flwr.serverapp.strategy.fedtrimmedavg``, ``aggregate_krum`` of ``flwr.server.strategy.aggregate``),
applied to the flattened prompt vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.server.strategy.aggregate import aggregate_krum
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from numpy.typing import ArrayLike, NDArray

from fedrapp_app.aggregation.baselines import _baseline_diagnostics
from fedrapp_app.aggregation.common import (
    NON_NEGATIVE,
    Interval,
    RoundInputs,
    RoundOutput,
    RuleParams,
    keep_rows,
    param,
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


def _global(x: RoundInputs, global_prompt: NDArray[np.float64]) -> RoundOutput:
    n = x.replied.shape[0]
    everyone = np.broadcast_to(global_prompt, x.tuned.shape)
    keep_none = np.zeros(n, dtype=bool)
    return RoundOutput(
        memory=keep_rows(everyone, x.memory32, keep_none),
        personalized=keep_rows(everyone, x.sent32, keep_none),
        diagnostics=_baseline_diagnostics(x, np.zeros(n), None),
    )


def fedmedian_round(
    tuned: ArrayLike, sent: ArrayLike, memory: ArrayLike, h_pre: ArrayLike, h_post: ArrayLike,
    replied: ArrayLike, num_examples: ArrayLike, params: FedMedianParams | None = None,
) -> RoundOutput:
    """fedmedian: P_g = coordinate-wise median of the replies, sent to every client."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    if not x.replied.any():
        return unchanged_round(x)
    return _global(x, np.median(x.tuned[x.replied], axis=0))


def fedtrimmedavg_round(
    tuned: ArrayLike, sent: ArrayLike, memory: ArrayLike, h_pre: ArrayLike, h_post: ArrayLike,
    replied: ArrayLike, num_examples: ArrayLike, params: FedTrimmedAvgParams | None = None,
) -> RoundOutput:
    """fedtrimmedavg: P_g = coordinate-wise trimmed mean of the replies (cut ``beta`` at each end)."""
    params = params or FedTrimmedAvgParams()
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    if not x.replied.any():
        return unchanged_round(x)
    return _global(x, trim_mean(x.tuned[x.replied], params.beta))


def krum_round(
    tuned: ArrayLike, sent: ArrayLike, memory: ArrayLike, h_pre: ArrayLike, h_post: ArrayLike,
    replied: ArrayLike, num_examples: ArrayLike, params: KrumParams | None = None,
) -> RoundOutput:
    """krum: P_g = the reply with the smallest summed distance to its n - f - 2 nearest replies."""
    params = params or KrumParams()
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    if not x.replied.any():
        return unchanged_round(x)
    uploads = [([row], 1) for row in x.tuned[x.replied]]
    chosen = aggregate_krum(uploads, num_malicious=int(params.num_malicious), to_keep=0)[0]
    return _global(x, np.asarray(chosen, dtype=np.float64))
