"""A training-free prediction step on top of a prompt-tuning method: ``local-method = "adaprompt+tda"``.

The base method (AdaPrompt, IM, TPT, or a plugin) tunes the prompt the server personalizes and uploads it with
its entropies, exactly as alone; then the head (ZERO or TDA) predicts the batch with the *tuned* prompt's class
features in place of a template: TDA's caches or ZERO's vote read the prompt that FedRAPP shares. The head
changes the online predictions only, never the upload or the entropies the server reads.

Nothing runs twice: the base hands over the batch's image features and the tuned prompt's class features
(``Adaptation.features`` / ``text_features``; computed here for a base that does not), and the head's views
reuse them for their original rows. The head's state (TDA's caches) is kept beside the base's, its keys
prefixed with the head's name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from fedrapp_app.engine.prompts import PromptedCLIP
from fedrapp_app.methods import make_method
from fedrapp_app.methods.base import Adaptation, LocalMethod
from fedrapp_app.methods.params import stacked_parts
from fedrapp_app.methods.trainingfree import TrainingFree


class Stacked(LocalMethod):
    """``base`` tunes and uploads, ``head`` (a :class:`TrainingFree` method) predicts with the tuned prompt."""

    def __init__(self, params: object) -> None:
        base_name, head_name, base_values, head_values = stacked_parts(params)
        self.params = params
        self.name = f"{base_name}+{head_name}"
        self.base: LocalMethod = make_method(base_name, base_values)
        self.head: TrainingFree = make_method(head_name, {**head_values, "classifier": "prompt"})
        self.own = self.base.own
        self._prefix = f"{head_name}."

    def initial_prompt(self, pclip: PromptedCLIP) -> list[Tensor]:
        return self.base.initial_prompt(pclip)

    @property
    def read_off_prompts(self) -> frozenset[str]:  # type: ignore[override]
        """The base's, but the predictions: the head makes them."""
        return frozenset(self.base.read_off_prompts) - {"predictions"}

    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        adaptation = self.base.adapt(pclip, prompt, pixel_values, generator)
        text = adaptation.text_features
        if text is None:
            text = pclip.constant_text_features(adaptation.prompt)
        features = adaptation.features
        views = self.head.views(pclip, pixel_values, generator, originals=features)  # [B, V, E]
        predictions, confidence, stats = self.head.predict(pclip, text.detach().to(pclip.device), views)
        changed = float((predictions != adaptation.predictions).float().mean())
        head = self._prefix[:-1]
        adaptation.stats.update({f"{head}_{key}": value for key, value in stats.items()})
        adaptation.stats[f"{head}_changed"] = changed  # share of the batch whose prediction the head changed
        return dataclasses.replace(adaptation, predictions=predictions, confidence=confidence)

    def state_dict(self) -> dict[str, np.ndarray]:
        head = {self._prefix + key: value for key, value in self.head.state_dict().items()}
        return self.base.state_dict() | head

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.head.load_state_dict({k[len(self._prefix) :]: v for k, v in state.items() if k.startswith(self._prefix)})
        self.base.load_state_dict({k: v for k, v in state.items() if not k.startswith(self._prefix)})
