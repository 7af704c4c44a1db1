"""A FedRAPP server rule as a plugin: each client is sent the mix of its own upload and the mean of all uploads.

next_i = (1 - weight) * P~_i + weight * mean_j P~_j     over the clients that replied this round
"""

from dataclasses import dataclass

import numpy as np

from fedrapp_app.plugins import UNIT, RuleParams, param, peer_mixing_round, rule, validate_round


@dataclass(frozen=True)
class MeanMixParams(RuleParams):
    weight: float = param(0.5, UNIT, "share of the mean of all uploads in what each client is sent")


@rule(params=MeanMixParams)
def mean_mix(tuned, sent, memory, h_pre, h_post, replied, num_examples, params=MeanMixParams()):
    """mean-mix: each client gets (1 - weight) x its own upload + weight x the mean of all uploads."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)  # checks shapes, drops absent rows

    def mixing(uploads):  # [k, d] uploads of the k clients that replied -> xi [k, k], rows summing to 1
        k = uploads.shape[0]
        return (1.0 - params.weight) * np.eye(k) + params.weight / k

    return peer_mixing_round(x, mixing)  # absent clients untouched; diagnostics with the peer weights
