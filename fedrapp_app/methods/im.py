"""Information maximisation (IM): ours, not part of the FedRAPP paper (SHOT-style, Liang et al., ICML 2020).

Per batch, one AdamW step (lr 5e-3, weight decay 0.01 as the other methods) on

    L = mean_i H(p_i) - lambda * D,        p_i = softmax of image i's logits with the current prompt,

then the batch is predicted with the updated prompt (online, like tpt-online and adaprompt). The first term
makes each prediction confident; the diversity term D keeps the predictions spread over the classes, which
is what stops the collapse of plain entropy minimisation (lambda = 0) onto a few classes (TESTBED.md: entropy
minimisation lost 2-5 points on every shift, IM gained 2-7).

* ``marginal="batch"`` (SHOT): D = H(p_bar), the entropy of the batch-mean prediction p_bar.
* ``marginal="ema"`` (ours, for streams where one batch does not show the stream's spread):
  D = -sum_c p_bar_c log m_c, the cross-entropy of the batch marginal against a running marginal m (no
  gradient), an exponential moving average of the batch marginals (this batch included) with Adam-style bias
  correction, m = ema_t / (1 - momentum^t). Its gradient pushes probability away from the classes predicted
  often *along the stream* rather than in this batch; with momentum 0 it equals the batch term in value and
  (up to a constant that the softmax ignores) in gradient. On toy streams through 8 random tiny CLIPs (2
  streams each; not a benchmark) it was 2.8 points better than the batch term on average where batches are
  temporally correlated (each dominated by one class, where the batch term forces a wrong spread), and 5.3
  points worse on i.i.d.-ordered label-skewed streams (our clients' streams): the running marginal lags the
  prompt, and the larger the momentum, the more easily it collapses (hence the default 0.5).

Initial prompt: K = 1 block, the context of "a photo of a" (n = 4), as tpt; ``csc`` gives one copy per class.
The AdamW moments and the running marginal persist on the client across rounds; the received prompt replaces
the parameters each round.
"""

from __future__ import annotations

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
    entropy,
    initial_context,
    load_adamw_state,
    mean_entropy,
    scored,
    with_own_score,
)
from fedrapp_app.methods.params import IMParams
from fedrapp_app.methods.scaling import scaler_for


# ----- the loss (pure functions) ---------------------------------------------------------------------
def batch_marginal(logits: Tensor) -> Tensor:
    """Mean prediction over the batch: Tensor[B, C] -> Tensor[C] (a probability vector)."""
    return logits.float().softmax(-1).mean(0)


def im_loss(
    logits: Tensor, reference: Tensor | None = None, diversity_weight: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """IM objective on logits Tensor[B, C] -> (loss, mean entropy, diversity), scalar tensors.

    ``reference`` None: diversity = H(p_bar) with p_bar the batch marginal (gradient through both factors).
    ``reference`` Tensor[C] (a probability vector, treated as constant): diversity = -sum_c p_bar_c log ref_c.
    """
    log_probs = logits.float().log_softmax(-1)  # [B, C]
    conditional = entropy(logits).mean()
    log_mean = log_probs.logsumexp(0) - np.log(logits.shape[0])  # log p_bar, stable for tiny probabilities
    if reference is None:
        log_reference = log_mean
    else:
        if reference.shape != log_mean.shape:
            raise ValueError(f"reference marginal has shape {tuple(reference.shape)}, expected {tuple(log_mean.shape)}")
        log_reference = reference.detach().float().clamp_min(torch.finfo(torch.float32).tiny).log()
    diversity = -(log_mean.exp() * log_reference).sum()
    return conditional - diversity_weight * diversity, conditional, diversity


def update_running_marginal(ema: Tensor, count: int, marginal: Tensor, momentum: float) -> tuple[Tensor, int, Tensor]:
    """One EMA step: (ema Tensor[C], count, batch marginal Tensor[C]) -> (new ema, count + 1, bias-corrected m).

    ``ema`` starts at zeros with count 0, so m equals the first batch marginal (Adam's bias correction).
    """
    ema = momentum * ema + (1.0 - momentum) * marginal.detach().float()
    count += 1
    return ema, count, ema / (1.0 - momentum**count)


# ----- the method ------------------------------------------------------------------------------------
class InformationMaximisation(LocalMethod):
    """Online IM: one prompt step per batch; AdamW moments and (``ema``) the running marginal persist."""

    name: ClassVar[str] = "im"
    Params: ClassVar[type] = IMParams
    _OPTIMIZER, _MARGINAL, _SCALER = "optimizer.", "marginal.", "scaler."

    def __init__(self, params: IMParams | None = None) -> None:
        self.params = params or IMParams()
        self._optimizer_state: dict[str, np.ndarray] = {}
        self._ema: np.ndarray | None = None  # [C] float32, raw (not bias-corrected) running marginal
        self._count = 0  # batches folded into the running marginal
        self._scaler_state: dict[str, np.ndarray] = {}  # fp16 loss scale (empty otherwise)
        self.own = OwnPrompt(self.params.own_prompt)

    def initial_prompt(self, pclip: PromptedCLIP) -> list[Tensor]:
        return [initial_context(pclip, self.params.init_text, self.params.csc)]

    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        return self.adapt_features(pclip, prompt, pclip.image_features(pixel_values))

    def adapt_features(self, pclip: PromptedCLIP, prompt: Sequence[Tensor], features: Tensor) -> Adaptation:
        """:meth:`adapt` on precomputed normalised image features Tensor[B, E] (the tower is frozen and IM
        uses no augmentation, so this is the whole method after the image pass)."""
        p = self.params
        (received,) = check_prompt(prompt, self.initial_prompt(pclip), self.name)
        features = features.to(pclip.device, torch.float32)
        context = received.to(pclip.device).requires_grad_(True)
        optimizer = torch.optim.AdamW([context], lr=p.lr, weight_decay=p.weight_decay)
        load_adamw_state(optimizer, [context], self._optimizer_state, self._OPTIMIZER)
        before = pclip.logits(features, pclip.text_features([context]))  # [B, C], received prompt
        own = self.own.score(pclip, [received], features, before)
        reference = None
        if p.marginal == "ema":
            reference = self._fold_into_running_marginal(batch_marginal(before.detach()).cpu()).to(pclip.device)
        loss, conditional, diversity = im_loss(before, reference, p.diversity_weight)
        scaler = scaler_for(pclip.clip.precision, self._scaler_state, self._SCALER)
        optimizer.zero_grad()
        scaler.backward(loss, [context])
        optimizer.step()
        self._optimizer_state = adamw_state_arrays(optimizer, [context], self._OPTIMIZER)
        self._scaler_state = scaler.state_arrays(self._SCALER)
        with torch.no_grad():
            text_after = pclip.text_features([context])
            after = pclip.logits(features, text_after)
        marginal = batch_marginal(before.detach()) if reference is None else reference
        adaptation = Adaptation(
            prompt=detached([context]),
            **scored(after, before),
            h_pre=mean_entropy(before),
            h_post=mean_entropy(after),
            stats={
                "loss": float(loss.detach()),
                "entropy": float(conditional.detach()),
                "diversity": float(diversity.detach()),
                "marginal_entropy": float(-(marginal * marginal.clamp_min(1e-30).log()).sum()),
                "updated": 1.0,
                **scaler.stats(),
            },
            features=features,
            text_features=text_after,
        )
        self.own.keep(adaptation.prompt)
        return with_own_score(adaptation, own)

    def _fold_into_running_marginal(self, marginal: Tensor) -> Tensor:
        """Add this batch's marginal Tensor[C] to the running one; return the bias-corrected m Tensor[C]."""
        num_classes = marginal.shape[0]
        if self._ema is not None and self._ema.shape != (num_classes,):
            raise ValueError(
                f"{self.name}: the saved running marginal has {self._ema.shape[0]} classes, "
                f"the model has {num_classes}; this client state belongs to another dataset"
            )
        ema = torch.zeros(num_classes) if self._ema is None else torch.from_numpy(self._ema.copy())
        ema, self._count, corrected = update_running_marginal(ema, self._count, marginal, self.params.ema_momentum)
        self._ema = ema.numpy()
        return corrected

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {key: value.copy() for key, value in {**self._optimizer_state, **self._scaler_state}.items()}
        if self._ema is not None:
            state[f"{self._MARGINAL}ema"] = self._ema.copy()
            state[f"{self._MARGINAL}count"] = np.asarray(self._count, dtype=np.int64)
        state.update(self.own.state_arrays())
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        state = self.own.load(state)
        check_state_keys(state, [self._OPTIMIZER, self._MARGINAL, self._SCALER], self.name)
        self._scaler_state = {k: np.array(v) for k, v in state.items() if k.startswith(self._SCALER)}
        marginal = {key[len(self._MARGINAL) :]: value for key, value in state.items() if key.startswith(self._MARGINAL)}
        if marginal and self.params.marginal != "ema":
            raise ValueError(
                f"{self.name}: the client state holds a running marginal but marginal="
                f"{self.params.marginal!r}; it was saved with marginal='ema'"
            )
        if marginal and set(marginal) != {"ema", "count"}:
            raise ValueError(
                f"{self.name}: the running marginal needs keys marginal.ema and marginal.count, got {sorted(marginal)}"
            )
        self._optimizer_state = {k: np.array(v) for k, v in state.items() if k.startswith(self._OPTIMIZER)}
        if marginal:
            ema = np.array(marginal["ema"], dtype=np.float32)
            if ema.ndim != 1 or int(marginal["count"]) < 1:
                raise ValueError(
                    f"{self.name}: a saved running marginal must be [C] with count >= 1, got shape "
                    f"{ema.shape} and count {int(marginal['count'])}"
                )
            self._ema, self._count = ema, int(marginal["count"])
        else:
            self._ema, self._count = None, 0
