"""What a local method reports about a batch, recomputed by the conformance kit from the prompts alone.

FedRAPP's reliability reads a client's drop in mean prediction entropy, ``h_pre - h_post``; the online accuracy
reads its ``predictions``. A method computes them on its own path (a graph, a fused pass, per-image copies), so
a swap, a logarithm in another base or an argmax of the wrong logits goes unseen until the numbers are wrong.
The kit recomputes them with its own forward passes and compares:

- ``h_pre``: the received prompt's mean prediction entropy on the batch (nats), ``mean_entropy(logits)``;
- ``h_post``: the same for the returned (tuned) prompt;
- ``predictions``: the returned prompt's argmax on the batch; ``predictions_before``: the received prompt's.

A method declares which of them it reads off the prompts this way (``LocalMethod.read_off_prompts``, all four by
default): a head that predicts otherwise (TDA's caches, ZERO's vote) leaves out ``predictions``, per-image
prompts (TPT) leave out what the uploaded prompt does not give, a fixed text classifier (zero-shot) all four.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedrapp_app.methods.base import READ_OFF_PROMPTS, entropy

#: How far a reported mean entropy may lie from the kit's (nats): float32 sums over the classes on another path.
ENTROPY_TOLERANCE = 1e-4
#: How far below the top logit a reported prediction's logit may lie (float32 rounding on another path; a tie).
LOGIT_TOLERANCE = 1e-4

_PROMPT = {"h_pre": "received", "h_post": "returned", "predictions": "returned", "predictions_before": "received"}


def prompt_logits(pclip: Any, prompt: Sequence[Tensor], pixel_values: Tensor) -> Tensor:
    """The logits Tensor[B, C] of ``prompt``'s blocks on a batch Tensor[B, 3, H, W], without a gradient."""
    with torch.no_grad():
        features = pclip.image_features(pixel_values)  # [B, E]
        return pclip.logits(features, pclip.text_features([torch.as_tensor(b) for b in prompt]))


def declared(method: Any) -> frozenset[str]:
    """What ``method`` reads off the prompts (``read_off_prompts``); AssertionError naming an unknown entry."""
    names = frozenset(getattr(method, "read_off_prompts", READ_OFF_PROMPTS))
    unknown = sorted(names - READ_OFF_PROMPTS)
    assert not unknown, f"read_off_prompts names {unknown}: it may hold only {sorted(READ_OFF_PROMPTS)}"
    return names


def report_problems(adaptation: Any, before: Tensor, after: Tensor, names: frozenset[str]) -> list[str]:
    """What of ``adaptation``'s reports in ``names`` differs from the kit's: ``before`` / ``after`` are the received
    and the returned prompt's logits Tensor[B, C] on the batch. Each problem says what was expected and what came,
    and names the likely cause (a swap, bits) where the numbers show it."""
    expected = {"h_pre": float(entropy(before).mean()), "h_post": float(entropy(after).mean())}
    got = {key: float(getattr(adaptation, key)) for key in expected}
    entropies = [key for key in ("h_pre", "h_post") if key in names]

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= ENTROPY_TOLERANCE * (1.0 + abs(b))

    problems = []
    wrong = [key for key in entropies if not close(got[key], expected[key])]
    if len(entropies) == 2 and wrong and all(close(got[a], expected[b]) for a, b in (("h_pre", "h_post"),
                                                                                   ("h_post", "h_pre"))):  # fmt: skip
        problems.append(
            f"h_pre and h_post are swapped: h_pre = {got['h_pre']:.6g} is the returned prompt's mean entropy on the "
            f"batch ({expected['h_post']:.6g}), h_post = {got['h_post']:.6g} the received prompt's "
            f"({expected['h_pre']:.6g}); FedRAPP's reliability reads the drop h_pre - h_post, which a swap inverts"
        )
        wrong = []
    elif wrong and all(close(got[key] * math.log(2), expected[key]) for key in wrong):
        problems += [
            f"{key} = {got[key]:.6g} is in bits: the {_PROMPT[key]} prompt's mean prediction entropy on the batch is "
            f"{expected[key]:.6g} nats ({expected[key] / math.log(2):.6g} bits); report nats (the natural log, as "
            "entropy() and mean_entropy() do)"
            for key in wrong
        ]
        wrong = []
    problems += [
        f"{key} = {got[key]:.6g}, expected {expected[key]:.6g} (the {_PROMPT[key]} prompt's mean prediction entropy "
        f"on the batch, in nats, within {ENTROPY_TOLERANCE:g} relative)"
        for key in wrong
    ]
    for key, logits in (("predictions", after), ("predictions_before", before)):
        if key in names:
            problems += _prediction_problems(key, getattr(adaptation, key), logits)
    if problems:
        problems.append(
            "(a method that computes one of them otherwise by design -- a head that predicts with its own cache, "
            "per-image prompts -- leaves it out of its read_off_prompts)"
        )
    return problems


def _prediction_problems(key: str, predictions: Tensor, logits: Tensor) -> list[str]:
    """Images whose reported class is not the top of ``logits`` [B, C] (a tie within the tolerance is fine)."""
    predictions = torch.as_tensor(predictions).long().cpu().reshape(-1)
    logits = logits.float().cpu()
    top = logits.max(-1)
    chosen = logits.gather(1, predictions.clamp(0, logits.shape[1] - 1)[:, None])[:, 0]
    bad = ((top.values - chosen) > LOGIT_TOLERANCE * (1.0 + top.values.abs())).nonzero().flatten().tolist()
    if not bad:
        return []
    shown = bad[:5]
    return [
        f"{key} of images {shown} are classes {predictions[shown].tolist()}, expected "
        f"{top.indices[shown].tolist()} (the argmax of the {_PROMPT[key]} prompt's logits on the batch; "
        f"{len(bad)} of {len(predictions)} images differ)"
    ]
