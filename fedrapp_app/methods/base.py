"""The local-method interface (SPEC §3) and the small pieces every method shares.

A method gets the round's received prompt (K blocks, float32) and a preprocessed unlabeled batch, and
returns an :class:`Adaptation`. Its persistent client state (buffers, optimizer moments, counters) goes
to and from a dict of plain numpy arrays (scalars as 0-d arrays), which is what a Flower ``ArrayRecord``
holds, so the client process may change between rounds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from fedrapp_app.engine.devices import to_device_once, to_host_once
from fedrapp_app.engine.prompts import PromptedCLIP


@dataclass
class Adaptation:
    """What one local step returns (B = batch size)."""

    prompt: list[Tensor]  # tuned blocks P~ (detached, float32, cpu)
    predictions: Tensor  # [B] long: the online prediction, after adaptation
    predictions_before: Tensor  # [B] long: with the received prompt, before adaptation
    h_pre: float  # mean prediction entropy on the batch, received prompt
    h_post: float  # the same after adaptation
    stats: dict[str, float] = field(default_factory=dict)  # method diagnostics


class LocalMethod(ABC):
    """A test-time method: initial prompt, one adaptation step per batch, persistent state as arrays."""

    name: ClassVar[str]

    @abstractmethod
    def initial_prompt(self, pclip: PromptedCLIP) -> list[Tensor]:
        """P0: K blocks Tensor[n_k, D] (or [C, n_k, D] with class-specific context) float32 on cpu, identical
        on all clients."""

    @abstractmethod
    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        """Adapt on one unlabeled batch Tensor[B, 3, H, W] starting from the received ``prompt``."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """Persistent client state as plain numpy arrays (empty for stateless methods)."""
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` produced; stateless methods accept only an empty dict."""
        if state:
            raise ValueError(f"method {self.name!r} keeps no client state but got keys {sorted(state)}")


# ----- shared math ----------------------------------------------------------------------------------
def entropy(logits: Tensor) -> Tensor:
    """Prediction entropy of softmax(logits) along the last axis: Tensor[..., C] -> Tensor[...]."""
    log_probs = logits.float().log_softmax(-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def mean_entropy(logits: Tensor) -> float:
    """Mean prediction entropy over a batch of logits Tensor[B, C]."""
    return float(entropy(logits.detach()).mean())


def initial_context(pclip: PromptedCLIP, text: str, class_specific: bool) -> Tensor:
    """The context of an init text: Tensor[n, D], or Tensor[C, n, D] with one copy per class (CoOp's
    class-specific context, CSC). Every class starts from the same words, so P0 is the same on all clients
    and its class features equal the shared context's."""
    context = pclip.context_from_text(text)
    return context.expand(len(pclip.classnames), *context.shape).clone() if class_specific else context


def check_prompt(prompt: Sequence[Tensor], reference: Sequence[Tensor], method: str) -> list[Tensor]:
    """The received prompt, validated against the method's block shapes, as float32 cpu copies."""
    shapes = [tuple(block.shape) for block in prompt]
    expected = [tuple(block.shape) for block in reference]
    if shapes != expected:
        raise ValueError(f"{method}: the received prompt has blocks {shapes}, expected {expected}")
    blocks = [torch.as_tensor(block).detach().to("cpu", torch.float32).clone() for block in prompt]
    if not all(torch.isfinite(block).all() for block in blocks):
        raise ValueError(f"{method}: the received prompt has non-finite values")
    return blocks


def detached(blocks: Sequence[Tensor]) -> list[Tensor]:
    """Blocks as detached float32 cpu copies (the form an Adaptation carries), read from the device at once."""
    return to_host_once(blocks)


# ----- AdamW state <-> arrays -----------------------------------------------------------------------
_MOMENTS = ("exp_avg", "exp_avg_sq")


def adamw_state_arrays(optimizer: torch.optim.AdamW, params: Sequence[Tensor], prefix: str) -> dict[str, np.ndarray]:
    """The AdamW step counters and moments of ``params`` as arrays ``{prefix}{step|exp_avg|exp_avg_sq}.{k}``."""
    arrays: dict[str, np.ndarray] = {}
    moments: dict[str, Tensor] = {}
    for k, param in enumerate(params):
        state = optimizer.state.get(param)
        if not state:
            continue
        arrays[f"{prefix}step.{k}"] = np.asarray(torch.as_tensor(state["step"]).detach().cpu().numpy())
        moments.update({f"{prefix}{moment}.{k}": state[moment] for moment in _MOMENTS})
    # every moment in one device-to-host copy (float32, as AdamW keeps them for float32 prompts)
    arrays.update(
        {key: value.numpy() for key, value in zip(moments, to_host_once(list(moments.values())), strict=True)}
    )
    return arrays


def load_adamw_state(
    optimizer: torch.optim.AdamW, params: Sequence[Tensor], arrays: dict[str, np.ndarray], prefix: str
) -> None:
    """Put moments saved by :func:`adamw_state_arrays` into a fresh ``optimizer`` over ``params``."""
    saved = [(k, param) for k, param in enumerate(params) if f"{prefix}step.{k}" in arrays]
    host: list[Tensor] = []
    for k, param in saved:
        for moment in _MOMENTS:
            value = torch.from_numpy(np.array(arrays[f"{prefix}{moment}.{k}"], dtype=np.float32))
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(
                    f"saved optimizer moment {prefix}{moment}.{k} has shape {tuple(value.shape)}, "
                    f"the prompt block has {tuple(param.shape)}"
                )
            host.append(value)
    if not saved:
        return
    moved = iter(to_device_once(host, params[0].device))  # one host-to-device copy for all moments
    for k, param in saved:
        state = {"step": torch.tensor(float(arrays[f"{prefix}step.{k}"]), dtype=torch.float32)}
        state.update({moment: next(moved) for moment in _MOMENTS})
        optimizer.state[param] = state


def check_state_keys(state: dict[str, np.ndarray], allowed_prefixes: Sequence[str], method: str) -> None:
    """Reject state keys a method does not know (a state from another method or version)."""
    unknown = sorted(key for key in state if not key.startswith(tuple(allowed_prefixes)))
    if unknown:
        raise ValueError(f"{method}: unknown client-state keys {unknown}")
