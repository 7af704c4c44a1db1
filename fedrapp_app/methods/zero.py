"""ZERO (Farina, Franchi, Iacca, Mancini, Ricci, NeurIPS 2024, "Frustratingly Easy Test-Time Adaptation of
Vision-Language Models"): TPT's augmented views, its confidence filter, and a zero-temperature vote.

Per test image: the original and ``n_views`` augmented views (random resized crop + flip, TPT's and ZERO's),
their logits against the class features, the ``int(keep_ratio * (1 + n_views))`` views of lowest prediction
entropy (19 of 64 with the authors' gamma 0.3), and the prediction is the class most of them predict: the argmax
of the sum of their one-hot argmaxes (the softmax's temperature taken to zero). Ties as in the authors' code
(:func:`zero_prediction`). One forward pass per view, no backpropagation, no state.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedrapp_app.engine.prompts import PromptedCLIP
from fedrapp_app.methods.params import ZeroParams
from fedrapp_app.methods.tpt import confident_views
from fedrapp_app.methods.trainingfree import TrainingFree


def zero_votes(logits: Tensor, keep: int) -> tuple[Tensor, Tensor]:
    """The confident views' votes of one image: logits Tensor[V, C] -> (votes Tensor[C], how many of the
    ``keep`` lowest-entropy views predict each class; the views' order by entropy Tensor[V] long)."""
    order = confident_views(logits, logits.shape[0])  # every view, by increasing entropy
    return F.one_hot(logits[order[:keep]].argmax(-1), logits.shape[-1]).sum(0), order


def zero_prediction(logits: Tensor, keep: int) -> tuple[int, int]:
    """ZERO's prediction for one image's view logits Tensor[V, C] -> (class, votes for it).

    The most voted class of the confident views; a tie is broken as the authors' ``greedy_break`` does: the
    first discarded view (by increasing entropy) that predicts one of the tied classes decides. If none does,
    the first discarded view's logits restricted to the tied classes decide (the authors' fallback indexes the
    wrong classes); with no discarded view, the lowest tied class index.
    """
    votes, order = zero_votes(logits, keep)
    tied = torch.nonzero(votes == votes.max()).flatten()
    if len(tied) == 1:
        return int(tied[0]), int(votes.max())
    discarded = logits[order[keep:]]
    for prediction in discarded.argmax(-1).tolist():
        if prediction in tied.tolist():
            return prediction, int(votes.max())
    if len(discarded):
        return int(tied[discarded[0, tied].argmax()]), int(votes.max())
    return int(tied[0]), int(votes.max())


class Zero(TrainingFree):
    """ZERO; stateless."""

    name: ClassVar[str] = "zero"
    Params: ClassVar[type] = ZeroParams

    def __init__(self, params: ZeroParams | None = None) -> None:
        self.params = params or ZeroParams()

    def predict(self, pclip: PromptedCLIP, text: Tensor, views: Tensor) -> tuple[Tensor, Tensor, dict[str, float]]:
        """The confidence of a prediction is its share of the confident views' votes (ZERO's zero-temperature
        softmax, averaged over the views it keeps)."""
        keep = self.params.views_kept
        logits = pclip.logits(views.flatten(0, 1), text).unflatten(0, views.shape[:2]).cpu()  # [B, V, C]
        decided = [zero_prediction(image, keep) for image in logits]
        predictions = torch.tensor([label for label, _ in decided], dtype=torch.long)
        confidence = torch.tensor([votes / keep for _, votes in decided], dtype=torch.float32)
        return (
            predictions,
            confidence,
            {"vote_share": float(sum(votes for _, votes in decided)) / (keep * len(decided))},
        )
