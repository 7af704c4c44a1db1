"""Frozen CLIP with soft prompts: loading, prompted text features, images (no Flower here)."""

from fedrapp_app.engine.loading import DEFAULT_CHECKPOINT, FrozenCLIP, load_clip
from fedrapp_app.engine.prompts import PromptedCLIP

__all__ = ["DEFAULT_CHECKPOINT", "FrozenCLIP", "PromptedCLIP", "load_clip"]
