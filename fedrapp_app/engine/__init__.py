"""Frozen CLIP with soft prompts: loading, prompted text features, images (no Flower here).

The names below load lazily, so that ``fedrapp_app.engine.devices`` (the launcher's device rules) can be
imported without importing transformers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedrapp_app.engine.loading import DEFAULT_CHECKPOINT, FrozenCLIP, load_clip
    from fedrapp_app.engine.prompts import PromptedCLIP

_WHERE = {
    "DEFAULT_CHECKPOINT": "fedrapp_app.engine.loading",
    "FrozenCLIP": "fedrapp_app.engine.loading",
    "load_clip": "fedrapp_app.engine.loading",
    "PromptedCLIP": "fedrapp_app.engine.prompts",
}
__all__ = ["DEFAULT_CHECKPOINT", "FrozenCLIP", "PromptedCLIP", "load_clip"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fedrapp_app.engine' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
