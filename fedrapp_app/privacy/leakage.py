"""What an honest-but-curious server learns from the uploads alone (ours): three attacks, scored against
the testbed's truth by ``benchmarks/upload_leakage.py``.

The server sees, per client i and round t, the update Δ_i(t) = P̃_i(t) − sent_i(t) (d numbers). The attacks use
each client's *direction*: the normalised sum of its updates, a_i = Σ_t Δ_i(t) / ‖Σ_t Δ_i(t)‖ (under dp each Δ is
noised, and the noise adds up as √T while a consistent direction adds up as T).

- **Which clients share a shift domain** (no training): the AUC of cos(a_i, a_j) for same-domain pairs against
  different-domain pairs (0.5: the server learns nothing; FedRAPP's peer weights use exactly this similarity).
- **Each client's domain** (a shadow attack): the server trains a nearest-centroid classifier on the directions
  of clients whose domains it knows (runs of its own on other seeds, the same world) and applies it to the target
  run's clients; accuracy against chance 1/D.
- **A client's dominant classes** (class-specific context only): the classes whose context moved most, ‖Σ_t Δ_i,c‖,
  ranked; the share of the client's k most frequent classes among the top k (chance k / C).

Labels and domains score the attacks here; nothing of this module runs in a federation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray


def directions(updates: Sequence[NDArray[np.floating]]) -> NDArray[np.float64]:
    """Each client's normalised summed update: ``updates`` is one [T_i, d] array per client -> [N, d]."""
    out = []
    for u in updates:
        total = np.asarray(u, dtype=np.float64).sum(axis=0)
        norm = np.linalg.norm(total)
        out.append(total / norm if norm > 0 else total)
    return np.stack(out)


def pair_auc(directions_: NDArray[np.float64], groups: Sequence[int]) -> float:
    """AUC of the cosine between clients' directions for same-group pairs against different-group pairs (the
    probability that a random same pair is more similar than a random different pair; ties count half)."""
    groups = np.asarray(groups)
    cos = directions_ @ directions_.T
    iu = np.triu_indices(len(groups), k=1)
    same = groups[iu[0]] == groups[iu[1]]
    pos, neg = cos[iu][same], cos[iu][~same]
    if not len(pos) or not len(neg):
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def nearest_centroid(
    train: NDArray[np.float64], train_groups: Sequence[int], test: NDArray[np.float64]
) -> NDArray[np.int64]:
    """The group of each ``test`` row [M, d] by the cosine to the groups' normalised mean ``train`` rows [N, d]."""
    train_groups = np.asarray(train_groups)
    labels = np.unique(train_groups)
    centroids = np.stack([train[train_groups == g].mean(axis=0) for g in labels])
    centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    return labels[np.argmax(test @ centroids.T, axis=1)]


def dominant_class_precision(
    class_updates: Sequence[NDArray[np.floating]], class_counts: Sequence[NDArray[np.integer]], k: int = 3
) -> float:
    """Mean over clients of |top-k classes by ‖Σ_t Δ_c‖ ∩ top-k classes by count| / k. ``class_updates``: per
    client [T_i, C, m] (its updates with the class axis of a class-specific context); ``class_counts``: per client
    [C], its samples per class."""
    scores = []
    for updates, counts in zip(class_updates, class_counts, strict=True):
        moved = np.linalg.norm(np.asarray(updates, dtype=np.float64).sum(axis=0).reshape(len(counts), -1), axis=1)
        guessed = set(np.argsort(-moved, kind="stable")[:k].tolist())
        truth = set(np.argsort(-np.asarray(counts), kind="stable")[:k].tolist())
        scores.append(len(guessed & truth) / k)
    return float(np.mean(scores))
