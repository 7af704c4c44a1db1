"""The local methods' parameters and their registry entries, without torch (the pre-start checks read them).

A :class:`MethodSpec` is what the entry-point group ``fedrapp.methods`` names for a built-in method: the class
that implements it (imported only where a client builds the method) and its parameters, a frozen dataclass whose
fields all have defaults. A plugin may name its :class:`~fedrapp_app.methods.base.LocalMethod` subclass directly
instead (its ``Params`` attribute gives the parameters); docs/extending.md.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from typing import Any

from fedrapp_app.registry.parameters import NON_NEGATIVE, POSITIVE, Interval, param

#: (0, 1]: a share of something that cannot be empty; [0, 1): a confidence threshold or a momentum.
SHARE = Interval(0.0, 1.0, low_open=True)
BELOW_ONE = Interval(0.0, 1.0, high_open=True)
AT_LEAST_ONE = Interval(1.0, float("inf"), high_open=True)

#: IM's diversity terms (see im.py).
MARGINALS = ("batch", "ema")
#: The text classifiers of the training-free methods: the received soft prompt, the dataset's template, or its
#: prompt ensemble (``PromptedCLIP.ensemble_features``).
CLASSIFIERS = ("prompt", "template", "ensemble")


@dataclass(frozen=True)
class MethodSpec:
    """A local method as the registry knows it: ``implementation`` ("module:Class", a LocalMethod subclass built
    as ``Class(params)``), ``params`` (its parameters' dataclass) and a one-line ``summary``."""

    implementation: str
    params: type
    summary: str = ""
    head: bool = False  # a training-free prediction step that can sit on a prompt-tuning method ("adaprompt+tda")
    uploads_payload: bool = False  # it uploads arrays beside its prompt (LocalMethod.payload_template; Latte's)

    def load(self) -> Any:
        """The implementing class (imports it, and with it torch)."""
        module, _, name = self.implementation.partition(":")
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ZeroShotParams:
    """init_text: the context whose embeddings form the (unused) travelling prompt; classifier: the dataset's
    template (CoOp's) or its prompt ensemble; own_prompt: see base.OwnPrompt."""

    init_text: str = "a photo of a"
    own_prompt: bool = False  # ours: report H_own; the prompt plays no part here, so H_own = H_pre
    classifier: str = "template"

    def __post_init__(self) -> None:
        if self.classifier not in ("template", "ensemble"):
            raise ValueError(f"classifier must be 'template' or 'ensemble', got {self.classifier!r}")


@dataclass(frozen=True)
class EnsembleParams(ZeroShotParams):
    """zeroshot with the dataset's prompt ensemble."""

    classifier: str = "ensemble"


@dataclass(frozen=True)
class TPTParams:
    """Hyperparameters of tpt / tpt-online (defaults: the reference code's)."""

    init_text: str = "a photo of a"
    n_views: int = param(63, NON_NEGATIVE, "augmented views per image, besides the original")
    keep_ratio: float = param(0.1, SHARE, "fraction of the 1 + n_views views kept (lowest entropy)")
    lr: float = param(5e-3, POSITIVE, "AdamW's learning rate")
    weight_decay: float = param(0.01, NON_NEGATIVE, "AdamW's weight decay (torch's default, the reference's)")
    augmix: bool = False  # AugMix on top of crop + flip (the reference: fine-grained sets, not ImageNet-*)
    augmix_severity: float = 1.0
    csc: bool = False  # class-specific context: one [n, D] context per class (CoOp's CSC), block [C, n, D]
    image_chunk: int = param(256, AT_LEAST_ONE, "views per image-tower call (memory bound)")
    text_chunk: int = param(2048, AT_LEAST_ONE, "text sequences per pass in episodic mode (memory bound)")
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
    threshold: float = param(0.7, BELOW_ONE, "pseudo-label confidence needed to enter the buffer (strictly greater)")
    buffer_size: int = param(64, AT_LEAST_ONE, "the class-balanced buffer's size")
    lr: float = param(5e-3, POSITIVE, "AdamW's learning rate")
    weight_decay: float = param(0.01, NON_NEGATIVE, "AdamW's weight decay (torch's default, the reference's)")
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
    lr: float = param(5e-3, POSITIVE, "AdamW's learning rate")
    weight_decay: float = param(0.01, NON_NEGATIVE, "AdamW's weight decay (torch's default, as the other methods)")
    diversity_weight: float = param(1.0, NON_NEGATIVE, "lambda; 0 = plain entropy minimisation (it collapses)")
    marginal: str = "batch"  # "batch" (SHOT) or "ema" (running marginal, ours)
    ema_momentum: float = param(0.5, BELOW_ONE, "weight of the past in the running marginal ('ema')")
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


def _check_views(n_views: int, keep_ratio: float, image_chunk: int, classifier: str) -> None:
    if n_views < 0:
        raise ValueError(f"n_views must be >= 0, got {n_views}")
    if not 0 < keep_ratio <= 1:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    if image_chunk < 1:
        raise ValueError(f"image_chunk must be >= 1, got {image_chunk}")
    if classifier not in CLASSIFIERS:
        raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {classifier!r}")


@dataclass(frozen=True)
class ZeroParams:
    """Hyperparameters of ZERO (Farina et al. 2024; defaults: the authors' code, FarinaMatteo/zero ``ttas/zero.py``)."""

    init_text: str = "a photo of a"
    classifier: str = "prompt"  # the received prompt (P0 = init_text: ZERO's "a photo of a {}.")
    n_views: int = param(63, NON_NEGATIVE, "augmented views per image besides the original (crop + flip, TPT's)")
    keep_ratio: float = param(0.3, SHARE, "gamma: the share of the views that vote (the code's since Oct 2024)")
    augmix: bool = False  # ZERO uses none
    augmix_severity: float = 1.0
    image_chunk: int = 256  # views per image-tower call (memory bound)
    own_prompt: bool = False  # ours: report H_own (= H_pre: no prompt is tuned)

    def __post_init__(self) -> None:
        _check_views(self.n_views, self.keep_ratio, self.image_chunk, self.classifier)

    @property
    def views_kept(self) -> int:
        """Views that vote: int(keep_ratio * (1 + n_views)), at least one (6 of 64)."""
        return max(1, int((1 + self.n_views) * self.keep_ratio))


@dataclass(frozen=True)
class TDAParams:
    """Hyperparameters of TDA (Karmanov et al. 2024; defaults: the authors' ``configs/imagenet.yaml``, kdiAAA/TDA;
    their fine-grained configs change pos_alpha / pos_beta only)."""

    init_text: str = "a photo of a"
    classifier: str = "ensemble"  # TDA's text classifier: CLIP's prompt ensemble of the dataset
    n_views: int = 0  # ImageNet and the fine-grained sets: the original view only; ImageNet-A/V/R/S: 63 AugMix views
    keep_ratio: float = 0.1  # with views: the confident share whose mean feature and logits stand for the image
    augmix: bool = False  # (true with n_views = 63 for the authors' ImageNet-A/V/R/S setting)
    augmix_severity: float = 1.0
    image_chunk: int = 256
    pos_capacity: int = param(3, NON_NEGATIVE, "positive cache: shots per class (0: off)")
    pos_alpha: float = param(2.0, NON_NEGATIVE, "weight of the positive cache's logits")
    pos_beta: float = param(5.0, NON_NEGATIVE, "sharpness of the positive cache's affinities")
    neg_capacity: int = param(2, NON_NEGATIVE, "negative cache: shots per class (0: off)")
    neg_alpha: float = param(0.117, NON_NEGATIVE, "weight of the negative cache's logits")
    neg_beta: float = param(1.0, NON_NEGATIVE, "sharpness of the negative cache's affinities")
    neg_entropy_low: float = 0.2  # a sample enters the negative cache when its normalised entropy is inside
    neg_entropy_high: float = 0.5
    neg_mask_low: float = 0.03  # classes whose probability is inside these bounds are its negative labels
    neg_mask_high: float = 1.0
    own_prompt: bool = False  # ours: report H_own (= H_pre: no prompt is tuned)

    def __post_init__(self) -> None:
        _check_views(self.n_views, self.keep_ratio, self.image_chunk, self.classifier)
        if self.pos_capacity < 0 or self.neg_capacity < 0:
            raise ValueError("pos_capacity and neg_capacity must be >= 0 (0 turns that cache off)")
        if min(self.pos_beta, self.neg_beta) < 0 or min(self.pos_alpha, self.neg_alpha) < 0:
            raise ValueError("the caches' alpha and beta must be >= 0")
        if not 0 <= self.neg_entropy_low < self.neg_entropy_high:
            raise ValueError(
                f"need 0 <= neg_entropy_low < neg_entropy_high, got {self.neg_entropy_low}, {self.neg_entropy_high}"
            )
        if not 0 <= self.neg_mask_low < self.neg_mask_high:
            raise ValueError(f"need 0 <= neg_mask_low < neg_mask_high, got {self.neg_mask_low}, {self.neg_mask_high}")

    @property
    def views_kept(self) -> int:
        return max(1, int((1 + self.n_views) * self.keep_ratio))


#: How a Latte client makes the class prototypes it uploads (the authors' ``upload_cache``).
PROTOTYPES = ("exp_weighted", "mean", "min_ent")


@dataclass(frozen=True)
class LatteParams:
    """Hyperparameters of Latte's client (Bao et al., ICCV 2025; defaults: the authors' ``configs/CIFAR10CFull/
    latte.yaml``, baowenxuan/Latte: the corruption benchmark nearest the testbed's 32-pixel shifted renders)."""

    init_text: str = "a photo of a"
    classifier: str = "ensemble"  # the authors' text classifier: the mean of the templates' features (--use_tip)
    n_views: int = param(0, NON_NEGATIVE, "augmented views per image besides the original (the authors: none)")
    keep_ratio: float = param(0.1, SHARE, "with views: the confident share whose mean feature stands for the image")
    augmix: bool = False
    augmix_severity: float = 1.0
    image_chunk: int = param(256, AT_LEAST_ONE, "views per image-tower call (memory bound)")
    local_capacity: int = param(12, AT_LEAST_ONE, "local memory: shots per class (lowest entropy first)")
    alpha: float = param(1.0, NON_NEGATIVE, "weight of the memory's logits beside CLIP's")
    beta: float = param(60.0, NON_NEGATIVE, "sharpness of the affinities exp(beta (f.k - 1))")
    gamma: float = param(1.5, NON_NEGATIVE, "entropy weighting exp(-gamma H) of the memory's entries")
    prototype: str = "exp_weighted"  # the uploaded class prototype: exp_weighted (the paper's), mean or min_ent
    prototype_gamma: float = param(1.5, NON_NEGATIVE, "entropy weighting of the entries in an uploaded prototype")
    use_local: bool = True  # predict with the local memory (the authors' local.enabled)
    use_external: bool = True  # ... and with the prototypes the server sent (global.enabled)
    own_prompt: bool = False  # ours: report H_own (= H_pre: no prompt is tuned)

    def __post_init__(self) -> None:
        _check_views(self.n_views, self.keep_ratio, self.image_chunk, self.classifier)
        if self.prototype not in PROTOTYPES:
            raise ValueError(f"prototype must be one of {PROTOTYPES}, got {self.prototype!r}")

    @property
    def views_kept(self) -> int:
        return max(1, int((1 + self.n_views) * self.keep_ratio))


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
ZEROSHOT_ENSEMBLE = MethodSpec(
    "fedrapp_app.methods.zeroshot:ZeroShotEnsemble",
    EnsembleParams,
    "zero-shot CLIP with the dataset's prompt ensemble (Radford et al. 2021), no adaptation",
)
ZERO = MethodSpec(
    "fedrapp_app.methods.zero:Zero",
    ZeroParams,
    "ZERO (Farina et al. 2024): a zero-temperature vote of the confident augmented views, training-free",
    head=True,
)
TDA = MethodSpec(
    "fedrapp_app.methods.tda:TDA",
    TDAParams,
    "TDA (Karmanov et al. 2024): positive and negative caches of test features, training-free",
    head=True,
)

LATTE = MethodSpec(
    "fedrapp_app.methods.latte:Latte",
    LatteParams,
    "Latte (Bao et al. 2025): a memory of confident test embeddings and the prototypes of similar clients, "
    "training-free; pair with strategy = 'latte'",
    uploads_payload=True,
)


#: The head's parameters a stacked method does not take: the head predicts with the base's tuned prompt, and the
#: own prompt is the base's.
_HEAD_SHARED = ("init_text", "classifier", "own_prompt")


@functools.cache
def stacked_spec(base_name: str, base: MethodSpec, head_name: str, head: MethodSpec) -> MethodSpec:
    """The method ``base+head``: ``base``'s parameters as they are, the head's prefixed with its name
    (``tda_pos_alpha``, in a run config ``tda-pos-alpha``), checked by both parameter classes."""
    prefix = head_name.replace("-", "_") + "_"
    base_fields = [
        (f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
        for f in dataclasses.fields(base.params)
    ]
    head_fields = [
        (prefix + f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
        for f in dataclasses.fields(head.params)
        if f.name not in _HEAD_SHARED
    ]

    def check(self: Any) -> None:  # each part's own range checks
        stacked_parts(self)

    params = dataclasses.make_dataclass(
        f"{base.params.__name__}Plus{head.params.__name__}",
        base_fields + head_fields,
        frozen=True,
        namespace={"__post_init__": check, "__doc__": f"{base_name}'s parameters and {head_name}'s, prefixed"},
    )
    params.stacking = (base_name, base.params, head_name, head.params, prefix)  # type: ignore[attr-defined]
    summary = f"{base_name} tunes and uploads the prompt; {head_name} predicts with the tuned prompt"
    return MethodSpec("fedrapp_app.methods.stacked:Stacked", params, summary)


def stacked_parts(params: Any) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """A stacked method's parameters split: (base name, head name, base values, head values); each part's
    parameter class is built once to check its ranges (``ValueError``)."""
    base_name, base_cls, head_name, head_cls, prefix = type(params).stacking
    values = dataclasses.asdict(params)
    base_values = {f.name: values[f.name] for f in dataclasses.fields(base_cls)}
    head_values = {name[len(prefix) :]: value for name, value in values.items() if name.startswith(prefix)}
    base_cls(**base_values)
    head_cls(**{"classifier": "prompt", **head_values})
    return base_name, head_name, base_values, head_values
