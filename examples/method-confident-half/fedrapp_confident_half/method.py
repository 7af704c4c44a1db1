"""confident-half: entropy minimisation on the most confident half of each batch (the parameters, which the
registry reads without torch, are in ``__init__.py``).

Per batch: score the batch with the received prompt, keep the `share` of its images with the lowest prediction
entropy, take one AdamW step on their mean entropy, then predict the whole batch with the updated prompt. The
AdamW moments are the method's client state (they survive rounds, process restarts and a resume).
"""

from typing import ClassVar

import numpy as np
import torch

from fedrapp_app.plugins import (
    Adaptation,
    LocalMethod,
    adamw_state_arrays,
    check_prompt,
    check_state_keys,
    detached,
    entropy,
    load_adamw_state,
    mean_entropy,
)

from . import ConfidentHalfParams


class ConfidentHalf(LocalMethod):
    """confident-half: one AdamW step on the mean entropy of the batch's most confident images."""

    name: ClassVar[str] = "confident-half"
    Params: ClassVar[type] = ConfidentHalfParams
    _OPTIMIZER = "optimizer."

    def __init__(self, params=None):
        self.params = params or ConfidentHalfParams()
        self._optimizer_state: dict[str, np.ndarray] = {}

    def initial_prompt(self, pclip):
        return [pclip.context_from_text(self.params.init_text)]  # one block [n, D]

    def adapt(self, pclip, prompt, pixel_values, generator):
        (received,) = check_prompt(prompt, self.initial_prompt(pclip), self.name)
        features = pclip.image_features(pixel_values)  # [B, E], frozen tower, no gradient
        context = received.to(pclip.device).requires_grad_(True)
        optimizer = torch.optim.AdamW([context], lr=self.params.lr)
        load_adamw_state(optimizer, [context], self._optimizer_state, self._OPTIMIZER)
        before = pclip.logits(features, pclip.text_features([context]))  # [B, C]
        per_image = entropy(before)  # [B]
        kept = per_image.argsort()[: max(1, round(self.params.share * per_image.shape[0]))]
        loss = per_image[kept].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        self._optimizer_state = adamw_state_arrays(optimizer, [context], self._OPTIMIZER)
        with torch.no_grad():
            after = pclip.logits(features, pclip.text_features([context]))
        return Adaptation(
            prompt=detached([context]),
            predictions=after.argmax(-1).cpu(),
            predictions_before=before.detach().argmax(-1).cpu(),
            h_pre=mean_entropy(before),
            h_post=mean_entropy(after),
            stats={"loss": float(loss.detach())},
        )

    def state_dict(self):
        return {key: value.copy() for key, value in self._optimizer_state.items()}

    def load_state_dict(self, state):
        check_state_keys(state, [self._OPTIMIZER], self.name)
        self._optimizer_state = {key: np.array(value) for key, value in state.items()}
