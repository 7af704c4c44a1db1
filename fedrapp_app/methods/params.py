"""The local methods' parameters and their registry entries, without torch (the pre-start checks read them).

A :class:`MethodSpec` is what the entry-point group ``fedrapp.methods`` names for a built-in method: the class
that implements it (imported only where a client builds the method) and its parameters, a frozen dataclass whose
fields all have defaults. A plugin may name its :class:`~fedrapp_app.methods.base.LocalMethod` subclass directly
instead (its ``Params`` attribute gives the parameters); docs/extending.md.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

#: IM's diversity terms (see im.py).
MARGINALS = ("batch", "ema")


@dataclass(frozen=True)
class MethodSpec:
    """A local method as the registry knows it: ``implementation`` ("module:Class", a LocalMethod subclass built
    as ``Class(params)``), ``params`` (its parameters' dataclass) and a one-line ``summary``."""

    implementation: str
    params: type
    summary: str = ""

    def load(self) -> Any:
        """The implementing class (imports it, and with it torch)."""
        module, _, name = self.implementation.partition(":")
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ZeroShotParams:
    """init_text: the context whose embeddings form the (unused) travelling prompt; own_prompt: see base.OwnPrompt."""

    init_text: str = "a photo of a"
    own_prompt: bool = False  # ours: report H_own; the prompt plays no part here, so H_own = H_pre


@dataclass(frozen=True)
class TPTParams:
    """Hyperparameters of tpt / tpt-online (defaults: the reference code's)."""

    init_text: str = "a photo of a"
    n_views: int = 63  # augmented views per image, besides the original
    keep_ratio: float = 0.1  # fraction of the 1 + n_views views kept (lowest entropy)
    lr: float = 5e-3
    weight_decay: float = 0.01  # torch.optim.AdamW's default, used by the reference
    augmix: bool = False  # AugMix on top of crop + flip (the reference: fine-grained sets, not ImageNet-*)
    augmix_severity: float = 1.0
    csc: bool = False  # class-specific context: one [n, D] context per class (CoOp's CSC), block [C, n, D]
    image_chunk: int = 256  # views per image-tower call (memory bound)
    text_chunk: int = 2048  # text sequences per pass in episodic mode (memory bound)
    own_prompt: bool = False  # ours: keep P~ and score it on the next batch's original views (base.OwnPrompt)

    def __post_init__(self) -> None:
        if self.n_views < 0:
            raise ValueError(f"n_views must be >= 0, got {self.n_views}")
        if not 0 < self.keep_ratio <= 1:
            raise ValueError(f"keep_ratio must be in (0, 1], got {self.keep_ratio}")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"lr must be > 0 and weight_decay >= 0, got {self.lr}, {self.weight_decay}")
        if self.image_chunk < 1 or self.text_chunk < 1:
            raise ValueError("image_chunk and text_chunk must be >= 1")

    @property
    def views_kept(self) -> int:
        """Views kept for the loss: int(keep_ratio * (1 + n_views)), at least one (6 of 64)."""
        return max(1, int((1 + self.n_views) * self.keep_ratio))


@dataclass(frozen=True)
class AdaPromptParams:
    """Hyperparameters of AdaPrompt (defaults: the reference configuration ``configs/methods/ours.yaml``)."""

    init_texts: tuple[str, ...] = ("an image of a", "a colorful image of a", "a noisy picture of a")
    threshold: float = 0.7  # pseudo-label confidence needed to enter the buffer (strictly greater)
    buffer_size: int = 64
    lr: float = 5e-3
    weight_decay: float = 0.01  # torch.optim.AdamW's default, used by the reference
    double_softmax: bool = True  # the reference's softmax before CrossEntropyLoss
    csc: bool = False  # class-specific context (ours for AdaPrompt): each block is [C, n_k, D]
    own_prompt: bool = False  # ours: keep P~ and score it on the next batch (H_own, base.OwnPrompt)

    def __post_init__(self) -> None:
        object.__setattr__(self, "init_texts", tuple(self.init_texts))
        if not self.init_texts:
            raise ValueError("init_texts must hold at least one text")
        if not 0 <= self.threshold < 1:
            raise ValueError(f"threshold must be in [0, 1), got {self.threshold}")
        if self.buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {self.buffer_size}")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"lr must be > 0 and weight_decay >= 0, got {self.lr}, {self.weight_decay}")


@dataclass(frozen=True)
class IMParams:
    """Hyperparameters of im (ours; lr as measured in TESTBED.md)."""

    init_text: str = "a photo of a"
    lr: float = 5e-3
    weight_decay: float = 0.01  # torch.optim.AdamW's default, as the other methods
    diversity_weight: float = 1.0  # lambda; 0 = plain entropy minimisation (the collapsing ablation)
    marginal: str = "batch"  # "batch" (SHOT) or "ema" (running marginal, ours)
    ema_momentum: float = 0.5  # weight of the past in the running marginal (window of about 1 / (1 - momentum))
    csc: bool = False  # class-specific context: one [n, D] context per class (CoOp's CSC), block [C, n, D]
    own_prompt: bool = False  # ours: keep P~ and score it on the next batch (H_own, base.OwnPrompt)

    def __post_init__(self) -> None:
        if self.marginal not in MARGINALS:
            raise ValueError(f"marginal must be one of {MARGINALS}, got {self.marginal!r}")
        if not 0 <= self.ema_momentum < 1:
            raise ValueError(f"ema_momentum must be in [0, 1), got {self.ema_momentum}")
        if self.diversity_weight < 0:
            raise ValueError(f"diversity_weight must be >= 0, got {self.diversity_weight}")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"lr must be > 0 and weight_decay >= 0, got {self.lr}, {self.weight_decay}")


ZEROSHOT = MethodSpec(
    "fedrapp_app.methods.zeroshot:ZeroShot", ZeroShotParams, "zero-shot CLIP with the dataset's template, no adaptation"
)
TPT = MethodSpec(
    "fedrapp_app.methods.tpt:TPT", TPTParams, "TPT (Shu et al. 2022): per image, entropy of its confident views"
)
TPT_ONLINE = MethodSpec("fedrapp_app.methods.tpt:TPTOnline", TPTParams, "TPT without the per-image reset")
ADAPROMPT = MethodSpec(
    "fedrapp_app.methods.adaprompt:AdaPrompt",
    AdaPromptParams,
    "AdaPrompt (Zhang et al. 2024): a confident class-balanced buffer, one step per batch",
)
IM = MethodSpec(
    "fedrapp_app.methods.im:InformationMaximisation",
    IMParams,
    "information maximisation (ours, SHOT-style): confident and diverse predictions",
)
