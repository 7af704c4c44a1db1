"""Local methods that break the contract in one way each (tests/test_conformance.py: the kit must say which),
named as ``plugin_methods:NAME`` (tests/ is on the path)."""

from __future__ import annotations

import itertools
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
