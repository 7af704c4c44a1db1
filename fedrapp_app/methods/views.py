"""Augmented views of a batch through the frozen image tower: what TPT, ZERO and TDA read (Tensor[B, V, E]).

Each image gets ``n_views`` random resized crops + flips (AugMix on top as an option) beside its original; the
random choices come from one seed per image drawn from the round's generator, so the views do not depend on
chunking or device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedrapp_app.engine.images import ViewDraws, normalisation, views_batch
from fedrapp_app.engine.prompts import PromptedCLIP


def view_features(
    pclip: PromptedCLIP,
    pixel_values: Tensor,
    generator: torch.Generator,
    n_views: int,
    *,
    augmix: bool = False,
    severity: float = 1.0,
    image_chunk: int = 256,
    originals: Tensor | None = None,
) -> Tensor:
    """Features of each image's original view (row 0) and augmented views -> Tensor[B, 1 + n_views, E].

    ``pixel_values`` Tensor[B, 3, H, W]. The batch goes to the device in one copy, and the views of
    ``image_chunk // (1 + n_views)`` images are made together (:func:`views_batch`). ``originals``
    Tensor[B, E]: the original views' features when a method already has them (a prediction step stacked on
    a prompt-tuning method); only the augmented views then go through the tower.
    """
    seeds = torch.randint(0, 2**62, (pixel_values.shape[0],), generator=generator).tolist()
    draws = [ViewDraws.draw(n_views, torch.Generator().manual_seed(s), augmix, severity) for s in seeds]
    if originals is not None and n_views == 0:
        return originals.unsqueeze(1)
    mean, std = normalisation(pclip.clip.image_processor)
    pixels = pixel_values.to(pclip.device)
    per_call = max(1, image_chunk // (1 + n_views))
    features = []
    for start in range(0, len(seeds), per_call):
        views = views_batch(pixels[start : start + per_call], draws[start : start + per_call], mean, std)
        if originals is not None:  # drop the original rows: their features are known
            views = views.unflatten(0, (-1, 1 + n_views))[:, 1:].flatten(0, 1)
        features.append(pclip.image_features(views, chunk_size=image_chunk))
    out = torch.cat(features).unflatten(0, (len(seeds), -1 if originals is None else n_views))
    if originals is not None:
        out = torch.cat([originals.to(out.device, out.dtype).unsqueeze(1), out], 1)
    return out
