"""TPT (Shu et al., NeurIPS 2022): test-time prompt tuning by confident-view entropy minimisation.

Per test image: the original view plus ``n_views`` augmented views (random resized crop + flip, AugMix
as an option), keep the ``int(fraction * (1 + n_views))`` views with the lowest prediction entropy
(6 of 64 by default; at least one), minimise the entropy of their mean probability with one AdamW step
(lr 5e-3, torch's default weight decay 0.01 as in the reference), then predict the original view.

* ``tpt`` (episodic): prompt and optimizer reset to the round's received prompt before each image.
  AdamW is elementwise and each image's loss depends only on its own prompt copy, so B independent
  per-image steps are done exactly as one step on a stacked [B, n, D] copy (one text pass of B*C
  sequences, in groups of at most ``text_chunk`` sequences). The uploaded tuned prompt is the mean of
  the B per-image tuned prompts (ours: TPT itself never uploads anything).
* ``tpt-online``: the same without the per-image reset: images are processed in stream order, the
  prompt and the AdamW moments keep moving, and the moments persist across rounds (the received
  prompt replaces the parameters each round).

Each view goes through the image tower once per round; its features serve view selection, the loss and the
predictions before and after the step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch
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
from fedrapp_app.methods.params import TPTParams
from fedrapp_app.methods.scaling import LossScaler, scaler_for
from fedrapp_app.methods.views import view_features


# ----- the loss (pure functions) ---------------------------------------------------------------------
def confident_views(logits: Tensor, keep: int) -> Tensor:
    """Indices of the ``keep`` lowest-entropy views: Tensor[..., V, C] -> Tensor[..., keep] long."""
    log_probs = logits.log_softmax(-1)
    view_entropy = -(log_probs.exp() * log_probs).sum(-1)  # [..., V]
    return view_entropy.argsort(dim=-1)[..., :keep]


def marginal_entropy(logits: Tensor) -> Tensor:
    """Entropy of the mean probability over views: Tensor[..., k, C] -> Tensor[...]."""
    log_probs = logits.log_softmax(-1)
    mean_log = log_probs.logsumexp(dim=-2) - math.log(logits.shape[-2])  # log of the mean probability
    mean_log = mean_log.clamp(min=torch.finfo(mean_log.dtype).min)
    return -(mean_log.exp() * mean_log).sum(-1)


def tpt_loss(logits: Tensor, keep: int) -> tuple[Tensor, Tensor]:
    """TPT's loss per image: Tensor[..., V, C] -> (loss Tensor[...], kept view indices Tensor[..., keep])."""
    kept = confident_views(logits.detach(), keep)
    chosen = logits.gather(-2, kept.unsqueeze(-1).expand(*kept.shape, logits.shape[-1]))
    return marginal_entropy(chosen), kept


# ----- the methods -----------------------------------------------------------------------------------
class TPT(LocalMethod):
    """Episodic TPT; stateless across images and rounds."""

    name: ClassVar[str] = "tpt"
    Params: ClassVar[type] = TPTParams
    #: Each image is predicted with its own tuned copy (tpt) or with the prompt as it stood at that image
    #: (tpt-online), and h_post averages those: only the received prompt's reports come from one prompt.
    read_off_prompts = frozenset({"h_pre", "predictions_before"})
    _SCALER = "scaler."

    def __init__(self, params: TPTParams | None = None) -> None:
        self.params = params or TPTParams()
        self._scaler_state: dict[str, np.ndarray] = {}  # fp16 loss scale (empty otherwise)
        self.own = OwnPrompt(self.params.own_prompt)

    def initial_prompt(self, pclip: PromptedCLIP) -> list[Tensor]:
        return [initial_context(pclip, self.params.init_text, self.params.csc)]

    def view_features(self, pclip: PromptedCLIP, pixel_values: Tensor, generator: torch.Generator) -> Tensor:
        """Features of each image's original view (row 0) and augmented views -> Tensor[B, 1 + n_views, E]."""
        p = self.params
        return view_features(
            pclip, pixel_values, generator, p.n_views, augmix=p.augmix, severity=p.augmix_severity,
            image_chunk=p.image_chunk,
        )  # fmt: skip

    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        (received,) = check_prompt(prompt, self.initial_prompt(pclip), self.name)
        features = self.view_features(pclip, pixel_values, generator)
        scaler = scaler_for(pclip.clip.precision, self._scaler_state, self._SCALER)
        tuned, before, after, loss = self._episodic_steps(pclip, received, features, scaler)
        self._scaler_state = scaler.state_arrays(self._SCALER)
        own = self.own.score(pclip, [received], features[:, 0], before)
        adaptation = Adaptation(
            prompt=detached([tuned.mean(0)]),
            **scored(after, before),
            h_pre=mean_entropy(before),
            h_post=mean_entropy(after),
            stats={
                "loss": float(loss.mean()),
                "views_kept": float(self.params.views_kept),
                "updated": 1.0,
                **scaler.stats(),
            },
        )
        self.own.keep(adaptation.prompt)
        return with_own_score(adaptation, own)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {key: value.copy() for key, value in self._scaler_state.items()} | self.own.state_arrays()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        state = self.own.load(state)
        unknown = sorted(key for key in state if not key.startswith(self._SCALER))
        if unknown:  # episodic: nothing persists but fp16's loss scale
            raise ValueError(f"method {self.name!r} keeps no client state but fp16's loss scale, got keys {unknown}")
        self._scaler_state = {key: np.array(value) for key, value in state.items()}

    def _episodic_steps(
        self, pclip: PromptedCLIP, context: Tensor, features: Tensor, scaler: LossScaler
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One AdamW step per image from ``context``, all images at once.

        features: Tensor[B, V, E] -> (tuned contexts Tensor[B, *context.shape], logits before Tensor[B, C],
        logits after Tensor[B, C], loss Tensor[B]).
        """
        p = self.params
        group = max(1, p.text_chunk // len(pclip.classnames))
        tuned, before, after, losses = [], [], [], []
        for chunk in features.split(group):
            stacked = context.to(pclip.device).expand(chunk.shape[0], *context.shape).clone().requires_grad_(True)
            optimizer = torch.optim.AdamW([stacked], lr=p.lr, weight_decay=p.weight_decay)
            logits = pclip.logit_scale * torch.einsum("bve,bce->bvc", chunk, pclip.text_features_stacked(stacked))
            loss, _ = tpt_loss(logits, p.views_kept)
            # Image b's loss depends only on copy b, so the sum gives every copy exactly its own gradient.
            scaler.backward(loss.sum(), [stacked])
            optimizer.step()
            with torch.no_grad():
                text_after = pclip.text_features_stacked(stacked)
            tuned.append(stacked.detach())
            before.append(logits[:, 0].detach())
            after.append(pclip.logit_scale * torch.einsum("be,bce->bc", chunk[:, 0], text_after))
            losses.append(loss.detach())
        return torch.cat(tuned), torch.cat(before), torch.cat(after), torch.cat(losses)


class TPTOnline(TPT):
    """Online TPT: one prompt moves along the stream; AdamW moments persist across rounds."""

    name: ClassVar[str] = "tpt-online"
    _PREFIX = "optimizer."

    def __init__(self, params: TPTParams | None = None) -> None:
        super().__init__(params)
        self._optimizer_state: dict[str, np.ndarray] = {}

    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        p = self.params
        (received,) = check_prompt(prompt, self.initial_prompt(pclip), self.name)
        features = self.view_features(pclip, pixel_values, generator)  # [B, V, E]
        scaler = scaler_for(pclip.clip.precision, self._scaler_state, self._SCALER)
        context = received.to(pclip.device).requires_grad_(True)
        optimizer = torch.optim.AdamW([context], lr=p.lr, weight_decay=p.weight_decay)
        load_adamw_state(optimizer, [context], self._optimizer_state, self._PREFIX)
        text = pclip.text_features([context])[0]  # [C, E], received prompt
        before = pclip.logit_scale * features[:, 0] @ text.detach().T
        own = self.own.score(pclip, [received], features[:, 0], before)
        after, losses = [], []
        for b in range(features.shape[0]):
            loss, _ = tpt_loss(pclip.logit_scale * features[b] @ text.T, p.views_kept)
            optimizer.zero_grad()
            scaler.backward(loss, [context])
            optimizer.step()
            # The updated prompt predicts image b and gives image b+1's loss: one text pass serves both.
            with torch.set_grad_enabled(b + 1 < features.shape[0]):
                text = pclip.text_features([context])[0]
            after.append(pclip.logit_scale * features[b, 0] @ text.detach().T)
            losses.append(loss.detach())  # read once at the end: a read per image would stall a GPU each time
        self._optimizer_state = adamw_state_arrays(optimizer, [context], self._PREFIX)
        self._scaler_state = scaler.state_arrays(self._SCALER)
        after_logits = torch.stack(after)
        adaptation = Adaptation(
            prompt=detached([context]),
            **scored(after_logits, before),
            h_pre=mean_entropy(before),
            h_post=mean_entropy(after_logits),
            stats={
                "loss": float(np.mean(torch.stack(losses).tolist())),
                "views_kept": float(p.views_kept),
                "updated": 1.0,
                **scaler.stats(),
            },
        )
        self.own.keep(adaptation.prompt)
        return with_own_score(adaptation, own)

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {key: value.copy() for key, value in {**self._optimizer_state, **self._scaler_state}.items()}
        return state | self.own.state_arrays()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        state = self.own.load(state)
        check_state_keys(state, [self._PREFIX, self._SCALER], self.name)
        self._optimizer_state = {k: np.array(v) for k, v in state.items() if k.startswith(self._PREFIX)}
        self._scaler_state = {k: np.array(v) for k, v in state.items() if k.startswith(self._SCALER)}
