"""A tiny random CLIP checkpoint written to a folder: the stand-in model of unit tests.

It is a real ``CLIPModel`` + word-level tokenizer + ``CLIPImageProcessor`` saved in the standard
Hugging Face layout, so tests exercise exactly the ``from_pretrained(path)`` path of a Hub checkpoint.
Its weights are random: use it for shapes, exactness and plumbing, never for accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import CLIPConfig, CLIPModel
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from fedrapp_app.testbed.tokenizer import save_word_tokenizer, words_of

#: Texts whose words every test vocabulary holds: the default init texts of the local methods.
DEFAULT_TEXTS = (
    "a photo of a",
    "an image of a",
    "a colorful image of a",
    "a noisy picture of a",
    "a photo of a {}.",
)


def make_tiny_clip(
    folder: str | Path,
    classnames: Sequence[str],
    *,
    extra_texts: Sequence[str] = (),
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    image_size: int = 32,
    patch_size: int = 8,
    projection_dim: int = 16,
    max_length: int = 24,
) -> Path:
    """Write a randomly initialised CLIP checkpoint whose vocabulary covers ``classnames`` to ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    texts = [*DEFAULT_TEXTS, *classnames, *extra_texts]
    tokenizer = save_word_tokenizer(words_of(t.replace("{}", "") for t in texts), max_length, folder)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=2,
            max_position_embeddings=max_length,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=2,
            image_size=image_size,
            patch_size=patch_size,
        ),
        projection_dim=projection_dim,
    )
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(str(folder))
    CLIPImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    ).save_pretrained(str(folder))
    return folder
