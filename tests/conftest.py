"""Shared fixtures: a tiny random CLIP checkpoint built once per session (no download), and image helpers."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings
from PIL import Image

from fedrapp_app.testbed.tiny import make_tiny_clip

# Property tests draw the same examples on every run, so CI is reproducible; HYPOTHESIS_PROFILE=explore
# draws fresh random examples (and keeps failures in .hypothesis/) to hunt for new counterexamples.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Class names of the tiny checkpoint: one- to four-word names, so sequences have different lengths.
TINY_CLASSNAMES = ("cat", "golden retriever", "red sports car", "big blue spotted whale", "tulip")
#: A name whose words the vocabulary knows but that is longer than the tiny text encoder's 24 positions.
LONG_CLASSNAME = " ".join(["very"] * 30) + " long name"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--extended", action="store_true",
        help="also run the tests marked extended (whole guides end to end on real network namespaces; minutes each)",
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``extended`` are skipped, with the reason, unless ``--extended`` asks for them."""
    if config.getoption("--extended"):
        return
    skip = pytest.mark.skip(reason="extended test: run it with `python -m pytest --extended`")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with a tiny random CLIPModel + word tokenizer + image processor (32 px, text width 32)."""
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_clip"), TINY_CLASSNAMES, extra_texts=[LONG_CLASSNAME])


@pytest.fixture(scope="session")
def tiny_clip(tiny_clip_dir: Path):
    """The tiny checkpoint loaded through fedrapp_app.engine.load_clip (CPU, fp32)."""
    from fedrapp_app.engine import load_clip

    return load_clip(tiny_clip_dir, device="cpu")


@pytest.fixture(scope="session")
def tiny_pclip(tiny_clip):
    """PromptedCLIP over TINY_CLASSNAMES with the template "a photo of a {}."."""
    from fedrapp_app.engine import PromptedCLIP

    return PromptedCLIP(tiny_clip, TINY_CLASSNAMES, "a photo of a {}.")


def random_images(count: int, seed: int = 0, size: tuple[int, int] = (40, 48), mode: str = "RGB") -> list[Image.Image]:
    """``count`` seeded random-noise PIL images of ``size`` (width, height) converted to ``mode``."""
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode) for _ in range(count)
    ]


@pytest.fixture
def make_pixels(tiny_pclip) -> Callable[..., torch.Tensor]:
    """Function (count, seed=0) -> preprocessed Tensor[count, 3, 32, 32] of random images."""

    def make(count: int, seed: int = 0) -> torch.Tensor:
        return tiny_pclip.preprocess(random_images(count, seed))

    return make
