"""What the training-free methods (ZERO, TDA) share: a text classifier, the augmented views, no tuned prompt.

A training-free method tunes no prompt. Alone it predicts with a text classifier -- the received prompt
(``classifier = "prompt"``), the dataset's template or its prompt ensemble -- and uploads the prompt it received,
unchanged: H_pre = H_post (the classifier's mean entropy on the original views), no drift. Under any rule a
federation of such clients keeps P0 (every upload is P0), so its rows do not depend on the strategy.

Stacked on a prompt-tuning method (``"adaprompt+tda"``, :mod:`fedrapp_app.methods.stacked`) its
:meth:`TrainingFree.predict` predicts the batch with the tuned prompt's class features instead.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedrapp_app.engine.prompts import PromptedCLIP
from fedrapp_app.methods.base import (
    Adaptation,
    LocalMethod,
    batch_marginal_entropy,
    check_prompt,
    mean_entropy,
    predicted,
)
from fedrapp_app.methods.views import view_features


def classifier_features(pclip: PromptedCLIP, classifier: str, received: Sequence[Tensor]) -> Tensor:
    """The class features a training-free method predicts with -> Tensor[K, C, E]: the received prompt's
    (K blocks), or the dataset's template or prompt ensemble (K = 1); constant, cached by the PromptedCLIP."""
    if classifier == "prompt":
        return pclip.constant_text_features(received)
    if classifier == "template":
        return pclip.hard_prompt_features().unsqueeze(0)
    if classifier == "ensemble":
        return pclip.ensemble_features().unsqueeze(0)
    raise ValueError(f"unknown classifier {classifier!r}: expected 'prompt', 'template' or 'ensemble'")


class TrainingFree(LocalMethod):
    """A training-free method: ``predict`` scores a batch's views against class features; nothing is tuned."""

    params: Any  # ZeroParams or TDAParams: init_text, classifier, n_views, keep_ratio, augmix, image_chunk

    def initial_prompt(self, pclip: PromptedCLIP) -> list[Tensor]:
        return [pclip.context_from_text(self.params.init_text)]

    @property
    def read_off_prompts(self) -> frozenset[str]:  # type: ignore[override]
        """The entropies and the predictions before come from the classifier, which is the prompt's only with
        ``classifier = "prompt"`` (the prompt is returned unchanged, so h_post is h_pre); the predictions are the
        method's own."""
        return frozenset({"h_pre", "h_post", "predictions_before"} if self.params.classifier == "prompt" else ())

    def views(
        self, pclip: PromptedCLIP, pixel_values: Tensor, generator: torch.Generator, originals: Tensor | None = None
    ) -> Tensor:
        """Each image's original (row 0) and augmented views through the tower -> Tensor[B, 1 + n_views, E]
        (``originals`` Tensor[B, E]: the original views' features, when known)."""
        p = self.params
        return view_features(
            pclip, pixel_values, generator, p.n_views, augmix=p.augmix, severity=p.augmix_severity,
            image_chunk=p.image_chunk, originals=originals,
        )  # fmt: skip

    @abstractmethod
    def predict(self, pclip: PromptedCLIP, text: Tensor, views: Tensor) -> tuple[Tensor, Tensor, dict[str, float]]:
        """Predict a batch: class features Tensor[K, C, E], view features Tensor[B, V, E] (row 0 the
        original) -> (predictions Tensor[B] long, their confidences Tensor[B] float in [0, 1], both on the cpu;
        diagnostics). May update the method's state."""

    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        received = check_prompt(prompt, self.initial_prompt(pclip), self.name)
        text = classifier_features(pclip, self.params.classifier, received)  # [K, C, E]
        views = self.views(pclip, pixel_values, generator)  # [B, V, E]
        before = pclip.logits(views[:, 0], text)  # [B, C]: the classifier alone on the original views
        predictions, confidence, stats = self.predict(pclip, text, views)
        predictions_before, confidence_before = predicted(before)
        h = mean_entropy(before)
        adaptation = Adaptation(
            prompt=received,
            predictions=predictions,
            predictions_before=predictions_before,
            confidence=confidence,
            confidence_before=confidence_before,
            h_pre=h,
            h_post=h,
            stats={"updated": 0.0, **stats},
            features=views[:, 0],
            text_features=text,
        )
        if getattr(self.params, "own_prompt", False):  # no prompt is tuned: the own prompt is the received one
            adaptation.h_own, adaptation.predictions_own = h, adaptation.predictions_before.clone()
            adaptation.hm_pre = adaptation.hm_own = batch_marginal_entropy(before)
        return adaptation
