"""Local methods that break the contract in one way each (tests/test_conformance.py: the kit must say which),
named as ``plugin_methods:NAME`` (tests/ is on the path); the later ones are mistakes real plugins made that
only real runs showed (the conformance kit's regression cases)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from fedrapp_confident_half.method import ConfidentHalf

from fedrapp_app.plugins import Adaptation


@dataclass
class MutableParams:
    """Parameters that are not frozen (a run's parameters must be values)."""

    share: float = 0.5
    lr: float = 5e-3
    init_text: str = "a photo of a"


class Mutable(ConfidentHalf):
    name: ClassVar[str] = "mutable"
    Params: ClassVar[type] = MutableParams


_COUNTER = itertools.count()


class Unseeded(ConfidentHalf):
    """Predicts with noise from a global counter, not from the generator it is given."""

    name: ClassVar[str] = "unseeded"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        shift = next(_COUNTER) % len(pclip.classnames)
        out.predictions = (out.predictions + shift) % len(pclip.classnames)
        return out


class Forgetful(ConfidentHalf):
    """Loads its state but ignores it: a restarted client would start again."""

    name: ClassVar[str] = "forgetful"

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._optimizer_state = {}


class Overconfident(ConfidentHalf):
    """Reports confidences above 1."""

    name: ClassVar[str] = "overconfident"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return Adaptation(**{**out.__dict__, "confidence": torch.full((len(out.predictions),), 1.5)})


class Peeking(ConfidentHalf):
    """Finds the client's batch up the call stack and nudges its prompt by the first label: a leak the method's
    interface does not offer, which only a run with permuted labels shows."""

    name: ClassVar[str] = "peeking"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        frame = sys._getframe(1)
        while frame is not None and not hasattr(frame.f_locals.get("batch"), "labels"):
            frame = frame.f_back
        if frame is not None:
            nudge = float(np.asarray(frame.f_locals["batch"].labels)[0]) * 1e-3
            out.prompt = [block + nudge for block in out.prompt]
        return out


class RandomStart(ConfidentHalf):
    """A P0 drawn at random per instance: the clients would not start from the same prompt."""

    name: ClassVar[str] = "random-start"

    def initial_prompt(self, pclip):
        (context,) = super().initial_prompt(pclip)
        return [context + 0.01 * torch.randn_like(context)]


# ----- the mistakes real plugins made, one each
class Swapped(ConfidentHalf):
    """Reports H_post as h_pre and H_pre as h_post (inverts FedRAPP's reliability score)."""

    name: ClassVar[str] = "swapped"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return dataclasses.replace(out, h_pre=out.h_post, h_post=out.h_pre)


class InBits(ConfidentHalf):
    """Reports its entropies in bits (log base 2)."""

    name: ClassVar[str] = "in-bits"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return dataclasses.replace(out, h_pre=out.h_pre / math.log(2), h_post=out.h_post / math.log(2))


class WrongPredictions(ConfidentHalf):
    """Predicts with the received prompt's logits instead of the tuned prompt's."""

    name: ClassVar[str] = "wrong-predictions"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return dataclasses.replace(out, predictions=(out.predictions_before + 1) % len(pclip.classnames))


class GradLeftOff(ConfidentHalf):
    """Switches autograd off for its last pass and leaves it off."""

    name: ClassVar[str] = "grad-left-off"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        torch.set_grad_enabled(False)
        return out


class OneThread(ConfidentHalf):
    """Sets torch's thread count to 1 (for its own speed) and leaves it so."""

    name: ClassVar[str] = "one-thread"

    def adapt(self, pclip, prompt, pixel_values, generator):
        torch.set_num_threads(1)
        return super().adapt(pclip, prompt, pixel_values, generator)


class DoubleDefault(ConfidentHalf):
    """Sets torch's default dtype to float64 and leaves it so."""

    name: ClassVar[str] = "double-default"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        torch.set_default_dtype(torch.float64)
        return out


class TorchGlobalNoise(ConfidentHalf):
    """Perturbs its tuned prompt with noise from torch's global RNG, not from the generator it is given."""

    name: ClassVar[str] = "torch-global-noise"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return dataclasses.replace(out, prompt=[b + 1e-4 * torch.randn(b.shape) for b in out.prompt])


class TunesLayerNorms(ConfidentHalf):
    """Also tunes the text encoder's final LayerNorm (the frozen CLIP's weights) with its AdamW step."""

    name: ClassVar[str] = "tunes-layernorms"

    def adapt(self, pclip, prompt, pixel_values, generator):
        norm = pclip.clip.model.text_model.final_layer_norm
        norm.requires_grad_(True)
        out = super().adapt(pclip, prompt, pixel_values, generator)
        with torch.no_grad():
            for weight in norm.parameters():
                weight -= 1e-2 * torch.sign(weight.grad if weight.grad is not None else weight)
        return out


class TunesInPlace(ConfidentHalf):
    """Tunes the received tensor itself (no copy): the server's prompt changes under the client."""

    name: ClassVar[str] = "tunes-in-place"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        with torch.no_grad():
            prompt[0].copy_(out.prompt[0])
        return out


class ShortPredictions(ConfidentHalf):
    """Returns predictions for the kept (most confident) half of the batch only."""

    name: ClassVar[str] = "short-predictions"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return dataclasses.replace(out, predictions=out.predictions[: len(out.predictions) // 2])


class ExtraBlock(ConfidentHalf):
    """Returns its tuned context twice (a second block P0 does not have)."""

    name: ClassVar[str] = "extra-block"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return dataclasses.replace(out, prompt=[*out.prompt, out.prompt[0].clone()])


class NegativeEntropy(ConfidentHalf):
    """Reports h_post as a log-probability sum with the wrong sign (a negative 'entropy')."""

    name: ClassVar[str] = "negative-entropy"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return dataclasses.replace(out, h_post=-out.h_post)


_CALLS = itertools.count()


class Drifting(ConfidentHalf):
    """Nudges its tuned prompt by a process-wide count of its calls (a cache, a step counter kept outside the
    client state): its uploads differ from run to run, labels or not."""

    name: ClassVar[str] = "drifting"

    def adapt(self, pclip, prompt, pixel_values, generator):
        out = super().adapt(pclip, prompt, pixel_values, generator)
        return dataclasses.replace(out, prompt=[b + 1e-4 * next(_CALLS) for b in out.prompt])
