"""A FedRAPP local method as a plugin: entropy minimisation on the most confident half of each batch.

This module holds what the registry reads before a run starts, without torch: the parameters and the
``MethodSpec`` the entry point names. The method itself (``method.py``) imports torch and loads only where a
client builds it.
"""

from dataclasses import dataclass

from fedrapp_app.plugins import POSITIVE, Interval, MethodSpec, param


@dataclass(frozen=True)
class ConfidentHalfParams:
    """Every field has a default; a field made with param() has its range checked before the run starts."""

    init_text: str = param("a photo of a", help="the words the context starts from (identical on every client)")
    share: float = param(0.5, Interval(0.0, 1.0, low_open=True), "share of the batch (its most confident images)")
    lr: float = param(5e-3, POSITIVE, "AdamW's learning rate")


CONFIDENT_HALF = MethodSpec(
    "fedrapp_confident_half.method:ConfidentHalf",
    ConfidentHalfParams,
    "one AdamW step on the mean entropy of the batch's most confident images",
)
