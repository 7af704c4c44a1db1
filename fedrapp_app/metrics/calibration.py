"""Expected calibration error (Guo et al. 2017), from per-batch bin counts that add up over a run.

A client bins its batch's predictions by confidence into ``BINS`` equal-width bins ((m-1)/M, m/M]; per bin it
reports how many predictions fell in, how many were right and the sum of their confidences. Sums of those over
any set of batches give that set's ECE exactly::

    ECE = sum_m |correct_m - confidence_m| / N

(the per-bin gap between accuracy and mean confidence, weighted by the bin's share of the N predictions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: Number of confidence bins (the usual 15).
BINS = 15


@dataclass(frozen=True)
class Bins:
    """Calibration bins: ``n`` int [M] predictions per bin, ``correct`` int [M] right ones, ``confidence``
    float [M] the sum of their confidences."""

    n: np.ndarray
    correct: np.ndarray
    confidence: np.ndarray

    def __add__(self, other: Bins) -> Bins:
        return Bins(self.n + other.n, self.correct + other.correct, self.confidence + other.confidence)

    @property
    def ece(self) -> float | None:
        """The expected calibration error of the binned predictions (None for no prediction)."""
        total = int(self.n.sum())
        return float(np.abs(self.correct - self.confidence).sum() / total) if total else None

    def as_lists(self) -> dict[str, list]:
        return {"n": self.n.tolist(), "correct": self.correct.tolist(), "confidence": self.confidence.tolist()}


def empty_bins(bins: int = BINS) -> Bins:
    return Bins(np.zeros(bins, np.int64), np.zeros(bins, np.int64), np.zeros(bins, np.float64))


def calibration_bins(confidence: np.ndarray, correct: np.ndarray, bins: int = BINS) -> Bins:
    """Bin B predictions: ``confidence`` float [B] in [0, 1] (the predicted class's probability), ``correct``
    bool [B]. Bin m (0-based) holds confidences in (m/M, (m+1)/M]; a confidence of 0 goes to bin 0."""
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    if confidence.shape != correct.shape or confidence.ndim != 1:
        raise ValueError(f"confidence {confidence.shape} and correct {correct.shape} must be two [B] arrays")
    if not np.all((confidence >= 0) & (confidence <= 1)):
        raise ValueError("confidences must lie in [0, 1]")
    index = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    return Bins(
        np.bincount(index, minlength=bins).astype(np.int64),
        np.bincount(index, weights=correct, minlength=bins).round().astype(np.int64),
        np.bincount(index, weights=confidence, minlength=bins),
    )


def bins_from_metrics(values: Mapping[str, Sequence], num_examples: int) -> Bins:
    """Bins as a client reports them (``{"n", "correct", "confidence"}``), checked: equal lengths, counts
    >= 0, ``correct <= n``, ``0 <= confidence <= n`` per bin and ``num_examples`` predictions in all.
    Raises ``ValueError`` naming what is wrong."""
    try:
        n, correct = (np.asarray(values[k], dtype=np.float64) for k in ("n", "correct"))
        confidence = np.asarray(values["confidence"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"calibration bins need lists 'n', 'correct', 'confidence' ({err})") from None
    if not (n.ndim == correct.ndim == confidence.ndim == 1 and len(n) == len(correct) == len(confidence) > 0):
        raise ValueError("calibration bins must be three lists of one length")
    if not (np.isfinite(confidence).all() and np.isfinite(n).all() and np.isfinite(correct).all()):
        raise ValueError("calibration bins hold a non-finite value")
    if np.any(n != np.round(n)) or np.any(correct != np.round(correct)) or np.any(correct < 0) or np.any(correct > n):
        raise ValueError("calibration bins need integer counts with 0 <= correct <= n")
    if np.any(confidence < 0) or np.any(confidence > n + 1e-6) or int(n.sum()) != num_examples:
        raise ValueError(f"calibration bins must hold {num_examples} predictions with confidences in [0, 1]")
    return Bins(n.astype(np.int64), correct.astype(np.int64), confidence)
