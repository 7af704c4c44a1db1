"""AdaPrompt (Zhang, Zhou, Li, AAAI 2024, "Robust Test-Time Adaptation for Zero-Shot Prompt Tuning").

Follows the authors' code (``methods/ours.py`` and ``methods/note_utils.py`` of zhangdingchu/Adaprompt):

1. The frozen initial prompts (K = 3: "an image of a", "a colorful image of a", "a noisy picture of a")
   pseudo-label the batch: softmax of the mean over K of the logits; confidence = max probability.
2. Samples with confidence > 0.7 enter a class-balanced buffer of 64 (:class:`ConfidenceBuffer`).
3. While the buffer is not full nothing is updated. Once full, every batch takes one AdamW step
   (lr 5e-3, torch's default weight decay 0.01) of cross-entropy between the buffer's predictions
   (mean over K of the logits with the current prompts) and its pseudo-labels. The reference applies
   softmax before ``nn.CrossEntropyLoss`` (a double softmax); ``double_softmax=True`` reproduces it.
4. The batch is predicted with the updated prompts.

The buffer keeps image *features* instead of images. This is exact here: the image tower is frozen and
in eval mode and the update uses no augmentation, so re-encoding a stored image (what the reference
does) gives the same features it had when it entered the buffer.

Where SPEC and the reference differ we follow SPEC: a new sample of a largest class replaces its class's
least confident sample only if strictly more confident (reference: also on ties); when several classes
tie as largest, the reference picks one at random and we evict the least confident sample among all of
them (deterministic, no random state to carry). Like the reference (its GradScaler), ``precision = "fp16"``
scales the loss (:mod:`fedrapp_app.methods.scaling`): float32 prompts do not make it unnecessary, because the
text tower's backward runs in float16, where most intermediate gradients would underflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedrapp_app.engine.prompts import PromptedCLIP
from fedrapp_app.methods.base import (
    Adaptation,
    LocalMethod,
    OwnPrompt,
    adamw_state_arrays,
    check_prompt,
    check_state_keys,
    detached,
    initial_context,
    load_adamw_state,
    mean_entropy,
    scored,
    with_own_score,
)
from fedrapp_app.methods.params import AdaPromptParams
from fedrapp_app.methods.scaling import scaler_for


class ConfidenceBuffer:
    """Class-balanced buffer of (feature Tensor[E], pseudo-label, confidence) rows, at most ``capacity``.

    Rules when full (the reference's PBRS, 'Threshold' criterion): a sample of a class that is not among
    the largest classes evicts the least confident sample of the largest classes; a sample of a largest
    class replaces its own class's least confident sample only if it is more confident, else it is
    dropped. Ties between equally unconfident samples go to the one stored first.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.clear()

    def clear(self) -> None:
        """Empty the buffer. Rows live on the CPU (64 x E floats: moved to the device per update)."""
        self.features = torch.zeros(0, 0)  # [M, E]
        self.labels = torch.zeros(0, dtype=torch.long)  # [M]
        self.confidences = torch.zeros(0)  # [M] float32

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def full(self) -> bool:
        return len(self) >= self.capacity

    def add(self, features: Tensor, labels: Tensor, confidences: Tensor) -> int:
        """Offer samples one by one in order (Tensor[N, E], [N], [N]); returns how many were stored."""
        stored = 0
        rows = zip(features.detach().float().cpu(), labels.tolist(), confidences.float().cpu(), strict=True)
        for feature, label, confidence in rows:
            stored += self._add_one(feature, int(label), confidence)
        return stored

    def _add_one(self, feature: Tensor, label: int, confidence: Tensor) -> bool:
        if len(self) == 0:
            self.features = feature.new_zeros(0, feature.shape[0])
        if self.full:
            counts = torch.bincount(self.labels, minlength=label + 1)
            largest = counts == counts.max()
            same = self.labels == label
            candidates = same if largest[label] else largest[self.labels]
            victim = int(torch.where(candidates, self.confidences, torch.inf).argmin())
            if largest[label] and not confidence > self.confidences[victim]:
                return False
            self._remove(victim)
        self.features = torch.cat([self.features, feature.unsqueeze(0)])
        self.labels = torch.cat([self.labels, torch.tensor([label])])
        self.confidences = torch.cat([self.confidences, confidence.view(1)])
        return True

    def _remove(self, row: int) -> None:
        keep = torch.arange(len(self)) != row
        self.features, self.labels, self.confidences = self.features[keep], self.labels[keep], self.confidences[keep]

    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Rows as arrays ``{prefix}features`` [M, E] float32, ``labels`` [M] int64, ``confidences`` [M]."""
        if len(self) == 0:
            return {}
        return {
            f"{prefix}features": self.features.detach().cpu().numpy().astype(np.float32),
            f"{prefix}labels": self.labels.numpy().astype(np.int64),
            f"{prefix}confidences": self.confidences.numpy().astype(np.float32),
        }

    def load_arrays(self, arrays: dict[str, np.ndarray], prefix: str) -> None:
        """Restore rows saved by :meth:`state_arrays` (an empty dict empties the buffer)."""
        if f"{prefix}labels" not in arrays:
            self.clear()
            return
        features = torch.from_numpy(np.array(arrays[f"{prefix}features"], dtype=np.float32))
        labels = torch.from_numpy(np.array(arrays[f"{prefix}labels"], dtype=np.int64))
        confidences = torch.from_numpy(np.array(arrays[f"{prefix}confidences"], dtype=np.float32))
        if not (features.dim() == 2 and features.shape[0] == labels.shape[0] == confidences.shape[0]):
            raise ValueError(
                "saved buffer arrays have inconsistent shapes: "
                f"{tuple(features.shape)}, {tuple(labels.shape)}, {tuple(confidences.shape)}"
            )
        if labels.shape[0] > self.capacity:
            raise ValueError(f"saved buffer holds {labels.shape[0]} rows, more than its capacity {self.capacity}")
        self.features, self.labels, self.confidences = features, labels, confidences


class AdaPrompt(LocalMethod):
    """AdaPrompt with a persistent buffer and AdamW moments (both survive rounds via state_dict)."""

    name: ClassVar[str] = "adaprompt"
    Params: ClassVar[type] = AdaPromptParams
    _BUFFER, _OPTIMIZER, _SCALER = "buffer.", "optimizer.", "scaler."

    def __init__(self, params: AdaPromptParams | None = None) -> None:
        self.params = params or AdaPromptParams()
        self.buffer = ConfidenceBuffer(self.params.buffer_size)
        self._optimizer_state: dict[str, np.ndarray] = {}
        self._scaler_state: dict[str, np.ndarray] = {}  # fp16 loss scale (empty otherwise)
        self.own = OwnPrompt(self.params.own_prompt)

    def initial_prompt(self, pclip: PromptedCLIP) -> list[Tensor]:
        return [initial_context(pclip, text, self.params.csc) for text in self.params.init_texts]

    def pseudo_labels(self, pclip: PromptedCLIP, features: Tensor) -> tuple[Tensor, Tensor]:
        """Pseudo-labels and confidences from the frozen initial prompts: Tensor[B, E] -> ([B] long, [B])."""
        # The labeller's text features are constant: cached per PromptedCLIP, i.e. once per client process
        # (a method object lives one round, the PromptedCLIP as long as the process).
        labeller = pclip.constant_text_features(self.initial_prompt(pclip))
        probabilities = pclip.logits(features, labeller).softmax(-1)
        confidences, labels = probabilities.max(-1)
        return labels.cpu(), confidences.cpu()

    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        p = self.params
        received = check_prompt(prompt, self.initial_prompt(pclip), self.name)
        features = pclip.image_features(pixel_values)  # [B, E]: the only tower pass of the round
        labels, confidences = self.pseudo_labels(pclip, features)
        confident = confidences > p.threshold
        stored = self.buffer.add(features[confident.to(features.device)], labels[confident], confidences[confident])
        update = self.buffer.full
        params = [block.to(pclip.device).requires_grad_(update) for block in received]
        # [K, C, E] of the received prompt: with a graph when it is tuned; else a constant, cached (round 1
        # receives P0, whose features the labeller just computed)
        text = pclip.text_features(params) if update else pclip.constant_text_features(params)
        before = pclip.logits(features, text.detach())
        own = self.own.score(pclip, received, features, before)
        after, loss, text_after = before, 0.0, text.detach()
        scaler = scaler_for(pclip.clip.precision, self._scaler_state, self._SCALER)
        if update:
            optimizer = torch.optim.AdamW(params, lr=p.lr, weight_decay=p.weight_decay)
            load_adamw_state(optimizer, params, self._optimizer_state, self._OPTIMIZER)
            buffer_logits = pclip.logits(self.buffer.features.to(pclip.device), text)
            scores = buffer_logits.softmax(-1) if p.double_softmax else buffer_logits
            objective = F.cross_entropy(scores, self.buffer.labels.to(pclip.device))
            optimizer.zero_grad()
            scaler.backward(objective, params)
            optimizer.step()
            self._optimizer_state = adamw_state_arrays(optimizer, params, self._OPTIMIZER)
            self._scaler_state = scaler.state_arrays(self._SCALER)
            with torch.no_grad():
                text_after = pclip.text_features(params)
                after = pclip.logits(features, text_after)
            loss = float(objective.detach())
        adaptation = Adaptation(
            prompt=detached(params),
            **scored(after, before),
            h_pre=mean_entropy(before),
            h_post=mean_entropy(after),
            stats={
                "loss": loss,
                "updated": float(update),
                "buffer_fill": float(len(self.buffer)),
                "confident": float(confident.sum()),
                "stored": float(stored),
                **scaler.stats(),
            },
            features=features,
            text_features=text_after,
        )
        self.own.keep(adaptation.prompt)
        return with_own_score(adaptation, own)

    def state_dict(self) -> dict[str, np.ndarray]:
        state = self.buffer.state_arrays(self._BUFFER)
        state.update({key: value.copy() for key, value in {**self._optimizer_state, **self._scaler_state}.items()})
        state.update(self.own.state_arrays())
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        state = self.own.load(state)
        check_state_keys(state, [self._BUFFER, self._OPTIMIZER, self._SCALER], self.name)
        self.buffer.load_arrays(state, self._BUFFER)
        self._optimizer_state = {k: np.array(v) for k, v in state.items() if k.startswith(self._OPTIMIZER)}
        self._scaler_state = {k: np.array(v) for k, v in state.items() if k.startswith(self._SCALER)}
