"""Latte's client (Bao, Deng, Qiu, Wei, Tong, He, ICCV 2025, "Latte: Collaborative Test-Time Adaptation of
Vision-Language Models in Federated Learning"): a local memory of confident test embeddings per pseudo-label and an
external memory of the prototypes of the most similar clients, read like TDA's positive cache; training-free.

Follows the authors' ``LatteClient`` (baowenxuan/Latte ``src/methods/Latte.py``), image by image in stream order:

1. CLIP logits of the image's feature f against the text classifier (the prompt ensemble), its pseudo-label ŷ and
   its entropy H (with views: the ``keep_ratio`` lowest-entropy views' mean feature, normalised).
2. The local memory keeps, per class, the ``local_capacity`` embeddings of lowest entropy among the images
   pseudo-labelled with it: an image joins while its class has room, else replaces the class's highest-entropy
   entry (the last of its list sorted by (H, slot)) when its entropy is lower. Entries keep H / log C.
3. The memory it predicts with: per class, the ``local_capacity`` entries of lowest normalised entropy among the
   local entries and the external ones the server sent (empty slots: a zero vector at entropy 1).
4. Logits = CLIP logits + alpha * s * f·w_c, w_c the normalised Σ_k k·exp(beta (f·k − 1))·exp(−gamma H_k) over
   class c's entries (zero where its norm is at most 1e-3), s the checkpoint's logit scale. The image is in the
   local memory before its logits are read, as the authors do.

After its batch a client uploads, per class, a prototype of its local memory (``prototype = "exp_weighted"``, the
paper's: the normalised mean of the entries weighted by exp(−prototype_gamma H); ``"mean"``; ``"min_ent"``) and its
normalised entropy under the classifier -- the payload [C, E] and [C]: pseudo-labels index it, never a label. The
server's rule (``aggregation/latte.py``) sends back the prototypes of the most similar clients, class by class;
:meth:`Latte.receive` keeps them as the external memory. Both memories are client state.

Differences from the authors' code (docs/methods.md): a round is a batch of images, not one image (the server
syncs once per batch); the logit scale is the checkpoint's (theirs: 100, OpenAI CLIP's); ties in step 3 go to the
lower slot (a stable sort).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedrapp_app.engine.prompts import PromptedCLIP
from fedrapp_app.methods.base import check_state_keys
from fedrapp_app.methods.params import LatteParams
from fedrapp_app.methods.trainingfree import TrainingFree, classifier_features

#: Below this norm a class's aggregated memory vector counts as empty (the authors' ``is_empty``).
EMPTY_NORM = 1e-3
#: The payload a Latte client uploads, and what the server sends back.
PROTOTYPES, ENTROPIES = "prototypes", "entropies"


def softmax_entropy(logits: Tensor) -> Tensor:
    """The authors' ``softmax_entropy``: −Σ softmax · log_softmax over the last axis (their float32 arithmetic)."""
    return -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)


def class_logits(scale: float, features: Tensor, text: Tensor) -> Tensor:
    """features [B, E] x classifier [K, C, E] -> [B, C]: ``PromptedCLIP.logits`` on the cpu, at ``scale``."""
    return scale * torch.einsum("be,kce->bc", features, text.float().cpu()) / text.shape[0]


class Latte(TrainingFree):
    """Latte's client: its local memory and the external prototypes as client state; uploads class prototypes."""

    name: ClassVar[str] = "latte"
    Params: ClassVar[type] = LatteParams
    uploads_payload: ClassVar[bool] = True
    _LOCAL, _EXTERNAL = "local.", "external."

    def __init__(self, params: LatteParams | None = None) -> None:
        self.params = params or LatteParams()
        self.local: Tensor | None = None  # [C, S, E] float32: the local memory (zero rows: empty slots)
        self.local_entropy: np.ndarray | None = None  # [C, S] float64: each entry's entropy H (not normalised)
        self.count: np.ndarray | None = None  # [C] int64: the filled slots of each class
        self.external: Tensor | None = None  # [C, S_g, E] float32: the peers' prototypes the server sent
        self.external_entropy: Tensor | None = None  # [C, S_g] float32: their normalised entropies
        self._text: Tensor | None = None  # [K, C, E] the classifier of the last batch (for the upload)

    # ----- memories -------------------------------------------------------------------------------------
    def _ensure(self, classes: int, dim: int) -> None:
        if self.local is None:
            slots = self.params.local_capacity
            self.local = torch.zeros(classes, slots, dim)
            self.local_entropy = np.full((classes, slots), np.inf)
            self.count = np.zeros(classes, dtype=np.int64)
        elif tuple(self.local.shape[::2]) != (classes, dim):
            raise ValueError(
                f"latte: the memory is {tuple(self.local.shape)}, the model has {classes} classes, {dim}-d"
            )

    def _local_normalised(self, classes: int) -> Tensor:
        """The local entries' entropies / log C [C, S] (empty slots: 1, as the authors initialise them)."""
        values = np.where(np.isfinite(self.local_entropy), self.local_entropy / math.log(classes), 1.0)
        return torch.from_numpy(values.astype(np.float32))

    def update(self, label: int, feature: Tensor, h: float) -> None:
        """Step 2 (the authors' ``update_cache``): the image joins its pseudo-label's entries while there is room,
        else replaces the highest (H, slot) entry when H is lower."""
        filled = int(self.count[label])
        if filled < self.params.local_capacity:
            slot = filled
            self.count[label] += 1
        else:
            worst = max(range(filled), key=lambda k: (self.local_entropy[label, k], k))
            if not h < self.local_entropy[label, worst]:
                return
            slot = worst
        self.local[label, slot] = feature
        self.local_entropy[label, slot] = h

    def memory(self, classes: int) -> tuple[Tensor, Tensor]:
        """Step 3: the entries [C, S, E] and their normalised entropies [C, S] the client predicts with."""
        p = self.params
        local, local_h = self.local, self._local_normalised(classes)
        external, external_h = self.external, self.external_entropy
        if not p.use_external or external is None or external.shape[1] == 0:
            return (local, local_h) if p.use_local else (local[:, :0], local_h[:, :0])
        if not p.use_local:
            return external, external_h
        entries, h = torch.cat([local, external], dim=1), torch.cat([local_h, external_h], dim=1)
        chosen = h.argsort(dim=1, stable=True)[:, : p.local_capacity]  # [C, S]
        return entries.gather(1, chosen.unsqueeze(-1).expand(-1, -1, entries.shape[-1])), h.gather(1, chosen)

    def memory_logits(self, feature: Tensor, entries: Tensor, h: Tensor, scale: float) -> Tensor:
        """Step 4's memory term for one image feature [E] -> [C] (the authors' ``compute_cache_logits``)."""
        p = self.params
        if entries.shape[1] == 0:
            return torch.zeros(entries.shape[0])
        affinity = entries @ feature  # [C, S]
        attention = torch.exp(p.beta * (affinity - 1.0)) * torch.exp(-p.gamma * h)  # [C, S]
        weights = (entries * attention.unsqueeze(-1)).sum(1)  # [C, E]
        empty = weights.norm(dim=1) <= EMPTY_NORM
        weights = F.normalize(weights, dim=1)
        weights[empty] = 0.0
        return p.alpha * scale * (weights @ feature)

    # ----- one batch ------------------------------------------------------------------------------------
    def image_summaries(self, pclip: PromptedCLIP, text: Tensor, views: Tensor) -> tuple[Tensor, Tensor]:
        """Step 1 for a batch: views [B, V, E] -> (features [B, E], CLIP logits [B, C])."""
        features = views[:, 0]
        if views.shape[1] > 1:  # the authors' get_clip_logits with AugMix views: the confident views' mean
            logits = pclip.logits(views.flatten(0, 1), text).unflatten(0, views.shape[:2])  # [B, V, C]
            kept = softmax_entropy(logits).argsort(dim=1)[:, : self.params.views_kept]  # [B, k]
            chosen = views.gather(1, kept.unsqueeze(-1).expand(*kept.shape, views.shape[-1]))
            features = F.normalize(chosen.mean(1), dim=-1)
        return features, pclip.logits(features, text)

    def predict(self, pclip: PromptedCLIP, text: Tensor, views: Tensor) -> tuple[Tensor, Tensor, dict[str, float]]:
        self._text = text
        features, clip_logits = (t.float().cpu() for t in self.image_summaries(pclip, text, views))
        classes = clip_logits.shape[-1]
        self._ensure(classes, features.shape[-1])
        scale = float(pclip.logit_scale)
        predictions, confidence, changed = [], [], 0
        for b in range(features.shape[0]):
            label = int(clip_logits[b].argmax())
            self.update(label, features[b], float(softmax_entropy(clip_logits[b])))
            entries, h = self.memory(classes)
            logits = clip_logits[b] + self.memory_logits(features[b], entries, h, scale)
            predictions.append(logits.argmax())
            confidence.append(logits.softmax(-1).max())
            changed += int(predictions[-1] != label)
        external = 0 if self.external is None else int((self.external.norm(dim=-1) > 0).sum())
        stats = {"local_memory": float(self.count.sum()), "external_memory": float(external),
                 "memory_changed": changed / features.shape[0]}  # fmt: skip
        return torch.stack(predictions), torch.stack(confidence), stats

    def adapt(self, pclip, prompt, pixel_values, generator):
        adaptation = super().adapt(pclip, prompt, pixel_values, generator)
        adaptation.payload = self.prototypes(pclip)
        return adaptation

    # ----- what travels ---------------------------------------------------------------------------------
    def _classifier(self, pclip: PromptedCLIP) -> Tensor:
        if self._text is None:
            self._text = classifier_features(pclip, self.params.classifier, self.initial_prompt(pclip))
        return self._text

    def payload_template(self, pclip: PromptedCLIP) -> dict[str, np.ndarray]:
        text = self._classifier(pclip)
        classes, dim = text.shape[1], text.shape[2]
        return {PROTOTYPES: np.zeros((classes, dim), np.float32), ENTROPIES: np.zeros(classes, np.float32)}

    def prototypes(self, pclip: PromptedCLIP) -> dict[str, np.ndarray]:
        """The upload (the authors' ``upload_cache``): per class a prototype of the local memory [C, E] and its
        normalised entropy under the classifier [C]."""
        text = self._classifier(pclip)
        classes = text.shape[1]
        self._ensure(classes, text.shape[2])
        normalised = self._local_normalised(classes)
        p = self.params
        if p.prototype == "min_ent":
            slots = np.where(self.count > 0, np.argmin(np.where(np.isfinite(self.local_entropy),
                             self.local_entropy, np.inf), axis=1), 0)  # fmt: skip
            rows = torch.arange(classes)
            prototypes = self.local[rows, torch.from_numpy(slots)]
            h = normalised[rows, torch.from_numpy(slots)]
        else:
            gamma = p.prototype_gamma if p.prototype == "exp_weighted" else 0.0
            weights = torch.exp(-gamma * normalised).unsqueeze(-1)  # [C, S, 1]
            prototypes = F.normalize((self.local * weights).mean(1), dim=1)  # an empty class: the zero vector
            h = softmax_entropy(class_logits(float(pclip.logit_scale), prototypes, text)) / math.log(classes)
        return {PROTOTYPES: prototypes.numpy().astype(np.float32), ENTROPIES: h.numpy().astype(np.float32)}

    def receive(self, payload: Mapping[str, np.ndarray]) -> None:
        """The external memory the server sent: its peers' prototypes [C, S_g, E] and entropies [C, S_g]."""
        if PROTOTYPES not in payload or ENTROPIES not in payload:
            return
        prototypes = torch.from_numpy(np.array(payload[PROTOTYPES], dtype=np.float32))
        h = torch.from_numpy(np.array(payload[ENTROPIES], dtype=np.float32))
        if prototypes.dim() != 3 or tuple(h.shape) != tuple(prototypes.shape[:2]):
            raise ValueError(f"latte: received prototypes {tuple(prototypes.shape)} and entropies {tuple(h.shape)}")
        if self.local is not None and tuple(prototypes.shape[::2]) != tuple(self.local.shape[::2]):
            raise ValueError(f"latte: received prototypes {tuple(prototypes.shape)}, memory {tuple(self.local.shape)}")
        self.external, self.external_entropy = prototypes, h

    def state_dict(self) -> dict[str, np.ndarray]:
        state: dict[str, np.ndarray] = {}
        if self.local is not None:
            state.update({f"{self._LOCAL}features": self.local.numpy().copy(),
                          f"{self._LOCAL}entropies": self.local_entropy.copy(),
                          f"{self._LOCAL}counts": self.count.copy()})  # fmt: skip
        if self.external is not None:
            state.update({f"{self._EXTERNAL}features": self.external.numpy().copy(),
                          f"{self._EXTERNAL}entropies": self.external_entropy.numpy().copy()})  # fmt: skip
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        check_state_keys(state, [self._LOCAL, self._EXTERNAL], self.name)
        if f"{self._LOCAL}features" in state:
            self.local = torch.from_numpy(np.array(state[f"{self._LOCAL}features"], dtype=np.float32))
            self.local_entropy = np.array(state[f"{self._LOCAL}entropies"], dtype=np.float64)
            self.count = np.array(state[f"{self._LOCAL}counts"], dtype=np.int64)
            if self.local.shape[1] != self.params.local_capacity:
                raise ValueError(f"latte: the saved memory has {self.local.shape[1]} shots per class, the "
                                 f"parameters {self.params.local_capacity}")  # fmt: skip
        if f"{self._EXTERNAL}features" in state:
            external = state[f"{self._EXTERNAL}features"], state[f"{self._EXTERNAL}entropies"]
            self.receive(dict(zip((PROTOTYPES, ENTROPIES), external, strict=True)))
