"""``latte``: Latte's server (Bao et al., ICCV 2025): each client is sent, class by class, the prototypes of the
clients whose prototype of that class is most similar to its own -- not a prompt.

Follows the authors' ``LatteServer`` (baowenxuan/Latte ``src/methods/Latte.py``). The server keeps a global memory:
each client's last uploaded prototype of each class and its entropy (a client that has not uploaded yet: a zero
vector at entropy 1). In a round, the replying clients' uploads replace their rows; then each replying client i
gets, for every class c, the ``shots`` = min(``shots``, N − 1) peers j ≠ i whose prototype of c has the largest dot
product with i's, and their prototypes and entropies (``subset_selection``). That is the payload sent next round
(``RoundOutput.state`` entries ``payload.prototypes`` [N, C, shots, E] and ``payload.entropies`` [N, C, shots]);
the client's method (``methods/latte.py``) keeps it as its external memory.

Latte tunes no prompt: every client is sent its own upload (none-fed's rows: the prompt it received). The peer
weights in the diagnostics are the authors' collaboration matrix: the share of the C × shots prototypes client i
got from each peer j. Ours: uploads are read defensively (a prototype row is normalised, an entropy clipped to
[0, 1]: the server validated shapes and finiteness, not meaning), and the peers of a class are ranked by a stable
sort that leaves the client itself out by index (the authors drop the first of a descending sort, itself but for
ties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedrapp_app.aggregation.baselines import none_fed_round
from fedrapp_app.aggregation.common import PAYLOAD_PREFIX, RoundOutput, rule, validate_round
from fedrapp_app.registry.parameters import Interval, param

#: The payload a Latte client uploads (``methods/latte.py``) and the state that holds the global memory.
PROTOTYPES, ENTROPIES = "prototypes", "entropies"
MEMORY, MEMORY_ENTROPY = "latte.prototypes", "latte.entropies"


@dataclass(frozen=True)
class LatteRuleParams:
    """The server's side of Latte (default: the authors' ``configs/CIFAR10CFull/latte.yaml``, global shot_capacity)."""

    shots: int = param(9, Interval(1, math.inf, high_open=True), "peers' prototypes per class sent to each client")


def _example_payload(rng: np.random.Generator, n: int) -> dict[str, NDArray[np.float32]]:
    """Plausible Latte uploads of n clients (5 classes, 8-d features), for the conformance kit."""
    prototypes = rng.normal(size=(n, 5, 8))
    prototypes /= np.linalg.norm(prototypes, axis=-1, keepdims=True)
    return {PROTOTYPES: prototypes.astype(np.float32), ENTROPIES: rng.uniform(0.2, 1.0, (n, 5)).astype(np.float32)}


@rule(
    params=LatteRuleParams,
    stateful=True,
    reads_payload=True,
    payload_example=_example_payload,
    summary="Latte (Bao et al. 2025): each client gets, per class, the prototypes of its most similar peers; "
    "pair with local-method = 'latte'",
)
def latte_round(
    tuned: ArrayLike,
    sent: ArrayLike,
    memory: ArrayLike,
    h_pre: ArrayLike,
    h_post: ArrayLike,
    replied: ArrayLike,
    num_examples: ArrayLike,
    params: LatteRuleParams = LatteRuleParams(),  # noqa: B008 - frozen
    *,
    payload: dict[str, ArrayLike] | None = None,
    state: dict[str, ArrayLike] | None = None,
    **_: Any,
) -> RoundOutput:
    """Latte's synchronisation: the global memory updated with the replies, each replying client's peers' prototypes
    chosen class by class (``payload`` [N, C, E] prototypes and [N, C] entropies by name). Without a payload (called
    as a plain rule) nothing is uploaded: the prompts are none-fed's and the state stays as it was."""
    out = none_fed_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)
    if not payload:
        return replace(out, state={k: np.array(v) for k, v in (state or {}).items()})
    if PROTOTYPES not in payload or ENTROPIES not in payload:
        raise ValueError(f"latte reads the payload {PROTOTYPES!r} and {ENTROPIES!r}; got {sorted(payload)}")
    uploads = np.asarray(payload[PROTOTYPES], dtype=np.float64)  # [N, C, E]
    n, classes, dim = uploads.shape
    state = state or {}
    cache = np.array(state[MEMORY], dtype=np.float64) if MEMORY in state else np.zeros((n, classes, dim))
    cache_h = np.array(state[MEMORY_ENTROPY], dtype=np.float64) if MEMORY_ENTROPY in state else np.ones((n, classes))
    if cache.shape != (n, classes, dim) or cache_h.shape != (n, classes):
        raise ValueError(f"latte: the global memory is {cache.shape}, the uploads {uploads.shape}")
    who = np.flatnonzero(x.replied)
    norms = np.linalg.norm(uploads[who], axis=-1, keepdims=True)
    cache[who] = np.divide(uploads[who], norms, out=np.zeros_like(uploads[who]), where=norms > 0)
    cache_h[who] = np.clip(np.asarray(payload[ENTROPIES], dtype=np.float64)[who], 0.0, 1.0)

    shots = min(int(params.shots), n - 1)
    new_state = {MEMORY: cache.astype(np.float32), MEMORY_ENTROPY: cache_h.astype(np.float32)}
    weights = np.zeros((n, n))
    if shots > 0:
        sent_prototypes = np.array(state.get(PAYLOAD_PREFIX + PROTOTYPES, np.zeros((n, classes, shots, dim))))
        sent_h = np.array(state.get(PAYLOAD_PREFIX + ENTROPIES, np.ones((n, classes, shots))))
        if sent_prototypes.shape != (n, classes, shots, dim):  # another shots or model: start again
            sent_prototypes, sent_h = np.zeros((n, classes, shots, dim)), np.ones((n, classes, shots))
        columns = np.arange(classes)[:, None]
        for i in who:
            similarity = np.einsum("jce,ce->cj", cache, cache[i])  # [C, N]
            similarity[:, i] = -np.inf
            peers = np.argsort(-similarity, axis=1, kind="stable")[:, :shots]  # [C, shots]
            sent_prototypes[i] = cache[peers, columns]
            sent_h[i] = cache_h[peers, columns]
            weights[i] = np.bincount(peers.ravel(), minlength=n) / peers.size
        new_state[PAYLOAD_PREFIX + PROTOTYPES] = sent_prototypes.astype(np.float32)
        new_state[PAYLOAD_PREFIX + ENTROPIES] = sent_h.astype(np.float32)
    diagnostics = replace(out.diagnostics, peer_weights=weights)
    return replace(out, diagnostics=diagnostics, state=new_state)


LATTE = latte_round
