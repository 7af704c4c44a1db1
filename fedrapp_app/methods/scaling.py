"""Dynamic loss scaling for ``precision = "fp16"``: the text tower's backward pass runs in float16.

Under fp16 autocast the matmuls of the text tower produce float16 activations, so their gradients are float16
too, even though the context vectors are float32: float16's smallest normal number is 2^-14 (6.1e-5) and its
smallest subnormal 2^-24 (6.0e-8), and most of these intermediate gradients lie below 2^-14, so they lose
precision or become exactly 0 before they reach the prompt (``benchmarks/fp16_gradients.py`` measures it).
Multiplying the loss by a scale S shifts every gradient by S; the prompt's gradient is divided by S again
before the optimizer sees it, so AdamW gets the float32-like gradient.

Like ``torch.amp.GradScaler`` (same defaults: S = 2^16, halved on overflow, doubled after 2000 clean
steps), with one difference that matters for test-time adaptation: GradScaler *skips* an optimizer step whose
gradient overflowed, and a method that takes one step per batch would then not adapt on that batch at all.
:meth:`LossScaler.backward` instead halves S and recomputes the backward pass at once (the graph is kept
for that), so every batch gets its step. The scale and the count of clean steps are client state
(:meth:`state_arrays`), so a resumed client continues with the same scale.

bf16 has float32's exponent range and fp32 needs nothing: for them the scaler is off and ``backward`` is
``loss.backward()``, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000
#: Below this the loss itself is not finite (a scale of 1 is unscaled fp16): the step is skipped.
MIN_SCALE = 1.0


class LossScaler:
    """Loss scaling for one method's backward passes; off unless ``enabled`` (fp16)."""

    def __init__(self, enabled: bool, init_scale: float = INIT_SCALE, growth_interval: int = GROWTH_INTERVAL) -> None:
        if not (math.isfinite(init_scale) and init_scale >= MIN_SCALE) or growth_interval < 1:
            raise ValueError(f"loss scale must be finite and >= 1 and growth_interval >= 1, got {init_scale}")
        self.enabled = enabled
        self.scale = float(init_scale)
        self.growth_interval = growth_interval
        self.clean_steps = 0  # consecutive finite backward passes at the current scale
        self.retries = 0  # backward passes redone after an overflow (a scaler serves one step)
        self.skipped = 0  # steps without a finite gradient at any scale

    def backward(self, loss: Tensor, params: Sequence[Tensor]) -> bool:
        """Put d(loss)/d(param) into every ``param.grad``; False when it is not finite at any scale.

        Enabled: back-propagates ``loss * scale``, checks the gradients (one host sync), and on overflow
        halves the scale and tries again; the gradients it leaves are unscaled. A False return leaves every
        ``param.grad`` None, so an optimizer step changes nothing.
        """
        if not self.enabled:
            loss.backward()
            return True
        while self.scale >= MIN_SCALE:
            for param in params:
                param.grad = None
            (loss * self.scale).backward(retain_graph=True)
            grads = [param.grad for param in params if param.grad is not None]
            finite = torch.stack([torch.isfinite(grad).all() for grad in grads]).all() if grads else True
            if bool(finite):
                for grad in grads:
                    grad.div_(self.scale)  # a power of two: exact
                self.clean_steps += 1
                if self.clean_steps >= self.growth_interval:
                    self.scale, self.clean_steps = self.scale * 2.0, 0
                return True
            self.scale, self.clean_steps = self.scale / 2.0, 0
            self.retries += 1
        self.scale = MIN_SCALE
        self.skipped += 1
        for param in params:
            param.grad = None
        return False

    def stats(self) -> dict[str, float]:
        """Diagnostics for an Adaptation's stats (empty when off, so fp32/bf16 stats do not change)."""
        if not self.enabled:
            return {}
        return {
            "loss_scale": self.scale,
            "loss_scale_retries": float(self.retries),
            "steps_skipped": float(self.skipped),
        }

    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """``{prefix}scale`` and ``{prefix}clean_steps`` (empty when off: fp32/bf16 client state is unchanged)."""
        if not self.enabled:
            return {}
        return {
            f"{prefix}scale": np.asarray(self.scale, dtype=np.float64),
            f"{prefix}clean_steps": np.asarray(self.clean_steps, dtype=np.int64),
        }

    def load_arrays(self, arrays: dict[str, np.ndarray], prefix: str) -> None:
        """Restore what :meth:`state_arrays` saved (missing keys: a fresh scale)."""
        if f"{prefix}scale" not in arrays:
            return
        scale, clean = float(arrays[f"{prefix}scale"]), int(arrays.get(f"{prefix}clean_steps", 0))
        if not (math.isfinite(scale) and scale >= MIN_SCALE) or clean < 0:
            raise ValueError(f"saved loss scale {scale} / clean steps {clean} are invalid (scale >= 1, steps >= 0)")
        self.scale, self.clean_steps = scale, clean


def scaler_for(precision: str, saved: dict[str, np.ndarray] | None = None, prefix: str = "scaler.") -> LossScaler:
    """The loss scaler for a clip's ``precision`` (on for fp16 only), restored from ``saved`` arrays."""
    scaler = LossScaler(enabled=precision == "fp16")
    if saved:
        scaler.load_arrays(saved, prefix)
    return scaler
