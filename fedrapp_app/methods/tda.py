"""TDA (Karmanov, Guan, Lu, El Saddik, Xing, CVPR 2024, "Efficient Test-Time Adaptation of Vision-Language
Models"): two caches of test features keyed by pseudo-labels, read like Tip-Adapter's, no backpropagation.

Follows the authors' ``tda_runner.py`` (kdiAAA/TDA), image by image in stream order:

1. The image's views (original + ``n_views`` augmented, TPT's) against the class features; the
   ``int(keep_ratio * V)`` lowest-entropy views are kept. Their mean feature is the image's feature f, their
   mean logits its CLIP logits, the entropy of their mean probability its loss, their mean probability its
   probability map, and the argmax of the mean logits its pseudo-label ŷ. (Without views: the original's.)
2. The positive cache keeps, per class, the ``pos_capacity`` (f, loss) of lowest loss among the images
   pseudo-labelled with that class: an image joins while its class has room, else replaces the class's
   highest-loss entry when its loss is lower; entries stay sorted by loss.
3. The negative cache does the same with (f, loss, probability map), but only for images whose normalised
   entropy, loss / log2(C) (the authors' normalisation), lies strictly inside (neg_entropy_low, neg_entropy_high).
4. Logits = CLIP logits + pos_alpha * A(f, positive) - neg_alpha * A(f, negative), with
   A(f, cache) = exp(-beta (1 - f·k)) @ values over the cache's keys k: the one-hot pseudo-labels for the
   positive cache; for the negative cache, the mask of the classes whose stored probability lies strictly
   inside (neg_mask_low, neg_mask_high). The image is cached before its logits are read (as the authors do).

The caches are client state: they persist across rounds (the stream goes on) and survive a restart exactly.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedrapp_app.engine.prompts import PromptedCLIP
from fedrapp_app.methods.base import check_state_keys, entropy
from fedrapp_app.methods.params import TDAParams
from fedrapp_app.methods.tpt import confident_views, marginal_entropy
from fedrapp_app.methods.trainingfree import TrainingFree


class ClassCache:
    """Per class, at most ``capacity`` entries (feature Tensor[E], loss, optional probability map Tensor[C]),
    sorted by loss (stable: among equal losses the earlier entry first)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: dict[int, list[tuple[Tensor, float, Tensor | None]]] = {}

    def __len__(self) -> int:
        return sum(len(items) for items in self.entries.values())

    def update(self, label: int, feature: Tensor, loss: float, probabilities: Tensor | None = None) -> None:
        """TDA's ``update_cache``: join while the class has room, else replace its last (highest-loss) entry if
        ``loss`` is lower; then sort the class's entries by loss."""
        if self.capacity == 0:
            return
        items = self.entries.setdefault(label, [])
        item = (feature, float(loss), probabilities)
        if len(items) < self.capacity:
            items.append(item)
        elif loss < items[-1][1]:
            items[-1] = item
        items.sort(key=lambda entry: entry[1])

    def keys_and_labels(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """The entries in class order: keys Tensor[N, E], labels Tensor[N] long, probability maps Tensor[N, C]
        (None for a cache without them)."""
        rows = [(label, item) for label in sorted(self.entries) for item in self.entries[label]]
        keys = torch.stack([item[0] for _, item in rows])
        labels = torch.tensor([label for label, _ in rows], dtype=torch.long)
        maps = [item[2] for _, item in rows]
        return keys, labels, (torch.stack(maps) if maps[0] is not None else None)

    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """``{prefix}features`` [N, E], ``labels`` [N], ``losses`` [N] (+ ``probabilities`` [N, C]); empty when
        the cache is."""
        if len(self) == 0:
            return {}
        rows = [(label, item) for label in sorted(self.entries) for item in self.entries[label]]
        arrays = {
            f"{prefix}features": torch.stack([item[0] for _, item in rows]).cpu().numpy().astype(np.float32),
            f"{prefix}labels": np.array([label for label, _ in rows], dtype=np.int64),
            f"{prefix}losses": np.array([item[1] for _, item in rows], dtype=np.float64),
        }
        if rows[0][1][2] is not None:
            arrays[f"{prefix}probabilities"] = torch.stack([item[2] for _, item in rows]).cpu().numpy()
        return arrays

    def load_arrays(self, arrays: dict[str, np.ndarray], prefix: str) -> None:
        """Restore what :meth:`state_arrays` wrote (no arrays: empty)."""
        self.entries = {}
        if f"{prefix}labels" not in arrays:
            return
        features = torch.from_numpy(np.array(arrays[f"{prefix}features"], dtype=np.float32))
        labels = np.asarray(arrays[f"{prefix}labels"], dtype=np.int64)
        losses = np.asarray(arrays[f"{prefix}losses"], dtype=np.float64)
        maps = arrays.get(f"{prefix}probabilities")
        maps = None if maps is None else torch.from_numpy(np.array(maps, dtype=np.float32))
        if not (features.dim() == 2 and features.shape[0] == labels.shape[0] == losses.shape[0]):
            raise ValueError(f"TDA's saved {prefix[:-1]} cache has inconsistent shapes")
        for row, label in enumerate(labels.tolist()):
            items = self.entries.setdefault(label, [])
            if len(items) >= self.capacity:
                raise ValueError(
                    f"TDA's saved {prefix[:-1]} cache holds more than {self.capacity} entries of class {label}"
                )
            items.append((features[row], float(losses[row]), None if maps is None else maps[row]))


def cache_logits(feature: Tensor, keys: Tensor, values: Tensor, alpha: float, beta: float) -> Tensor:
    """TDA's ``compute_cache_logits``: alpha * exp(-beta (1 - feature @ keys.T)) @ values.

    feature Tensor[E], keys Tensor[N, E], values Tensor[N, C] -> Tensor[C].
    """
    affinity = keys @ feature  # [N]
    return alpha * (torch.exp(-(beta - beta * affinity)) @ values)


class TDA(TrainingFree):
    """TDA with its two caches as client state."""

    name: ClassVar[str] = "tda"
    Params: ClassVar[type] = TDAParams
    _POS, _NEG = "pos.", "neg."

    def __init__(self, params: TDAParams | None = None) -> None:
        self.params = params or TDAParams()
        self.positive = ClassCache(self.params.pos_capacity)
        self.negative = ClassCache(self.params.neg_capacity)

    def image_summaries(self, pclip: PromptedCLIP, text: Tensor, views: Tensor) -> tuple[Tensor, ...]:
        """Step 1 for a batch: views Tensor[B, V, E] -> (features [B, E], CLIP logits [B, C], loss [B],
        probability map [B, C], pseudo-label [B])."""
        logits = pclip.logits(views.flatten(0, 1), text).unflatten(0, views.shape[:2])  # [B, V, C]
        if views.shape[1] > 1:
            kept = confident_views(logits, self.params.views_kept)  # [B, k]
            logits = logits.gather(1, kept.unsqueeze(-1).expand(*kept.shape, logits.shape[-1]))  # [B, k, C]
            views = views.gather(1, kept.unsqueeze(-1).expand(*kept.shape, views.shape[-1]))  # [B, k, E]
            loss = marginal_entropy(logits)
        else:
            loss = entropy(logits[:, 0])
        clip_logits = logits.mean(1)
        return views.mean(1), clip_logits, loss, logits.softmax(-1).mean(1), clip_logits.argmax(-1)

    def predict(self, pclip: PromptedCLIP, text: Tensor, views: Tensor) -> tuple[Tensor, Tensor, dict[str, float]]:
        p = self.params
        features, clip_logits, losses, maps, labels = (
            t.float().cpu() for t in self.image_summaries(pclip, text, views)
        )
        num_classes = clip_logits.shape[-1]
        predictions, confidence, negatives = [], [], 0
        for b in range(features.shape[0]):
            label, loss = int(labels[b]), float(losses[b])
            self.positive.update(label, features[b], loss)
            if p.neg_entropy_low < loss / math.log2(num_classes) < p.neg_entropy_high:
                self.negative.update(label, features[b], loss, maps[b])
                negatives += 1
            logits = clip_logits[b].clone()
            if len(self.positive):
                keys, cached, _ = self.positive.keys_and_labels()
                logits += cache_logits(
                    features[b], keys, F.one_hot(cached, num_classes).float(), p.pos_alpha, p.pos_beta
                )
            if len(self.negative):
                keys, _, stored = self.negative.keys_and_labels()
                mask = ((stored > p.neg_mask_low) & (stored < p.neg_mask_high)).float()
                logits -= cache_logits(features[b], keys, mask, p.neg_alpha, p.neg_beta)
            predictions.append(logits.argmax())
            confidence.append(logits.softmax(-1).max())
        stats = {"positive_cache": float(len(self.positive)), "negative_cache": float(len(self.negative)),
                 "negative_updates": float(negatives)}  # fmt: skip
        return torch.stack(predictions), torch.stack(confidence), stats

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.positive.state_arrays(self._POS) | self.negative.state_arrays(self._NEG)

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        check_state_keys(state, [self._POS, self._NEG], self.name)
        self.positive.load_arrays(state, self._POS)
        self.negative.load_arrays(state, self._NEG)
