"""Zero-shot CLIP: no adaptation, the reference row of every table (SPEC §3).

Predictions use the hard prompt ``template.format(name)`` (the dataset's zero-shot template) or, with
``classifier = "ensemble"`` (the method ``zeroshot-ensemble``), CLIP's prompt ensemble of the dataset's
templates (``PromptedCLIP.ensemble_features``), and ignore the received prompt, which is returned unchanged
(H_pre == H_post). Its initial prompt is the context of "a photo of a" so that it travels through the
federation like the other methods' prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

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
from fedrapp_app.methods.params import EnsembleParams, ZeroShotParams


class ZeroShot(LocalMethod):
    """Hard-prompt zero-shot prediction; stateless."""

    name: ClassVar[str] = "zeroshot"
    Params: ClassVar[type] = ZeroShotParams
    read_off_prompts = frozenset()  # it predicts and scores with the dataset's template, never the prompt

    def __init__(self, params: ZeroShotParams | None = None) -> None:
        self.params = params or ZeroShotParams()

    def initial_prompt(self, pclip: PromptedCLIP) -> list[Tensor]:
        return [pclip.context_from_text(self.params.init_text)]

    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        received = check_prompt(prompt, self.initial_prompt(pclip), self.name)
        features = pclip.image_features(pixel_values)  # [B, E]
        classifier = pclip.ensemble_features() if self.params.classifier == "ensemble" else pclip.hard_prompt_features()
        logits = pclip.logits(features, classifier.unsqueeze(0))  # [B, C]
        predictions, confidence = predicted(logits)
        h = mean_entropy(logits)
        adaptation = Adaptation(received, predictions, predictions.clone(), h, h, {"updated": 0.0})
        adaptation.confidence, adaptation.confidence_before = confidence, confidence.clone()
        if self.params.own_prompt:  # whichever prompt the client kept, zero-shot predicts the same
            adaptation.h_own, adaptation.predictions_own = h, predictions.clone()
            adaptation.hm_pre = adaptation.hm_own = batch_marginal_entropy(logits)
        return adaptation


class ZeroShotEnsemble(ZeroShot):
    """Zero-shot with the dataset's prompt ensemble (``classifier = "ensemble"`` by default)."""

    name: ClassVar[str] = "zeroshot-ensemble"
    Params: ClassVar[type] = EnsembleParams
