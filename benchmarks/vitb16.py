"""Shared by the benchmarks: a random-weight CLIP with the ViT-B/16 sizes, 100 class names, load-aware timing.

Speed does not depend on the weights, so a randomly initialised ``CLIPModel`` with the sizes of
``openai/clip-vit-base-patch16`` (text 512 wide, 12 layers, 77 positions; vision 768 wide, 12 layers,
patch 16, 224 px; projection 512) stands in for the real checkpoint. Its tokenizer is word-level (no
download): class names get fewer tokens than with CLIP's BPE, but the text pass is cut after the batch's
longest name, and the list below holds multi-word names ("snoopy (cartoon beagle)", 7 tokens with "."
and EOS), so the cut length is a realistic 13 positions for AdaPrompt's longest init text.

Scripts import this module as a sibling (``python benchmarks/<script>.py`` puts ``benchmarks/`` on the path).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import CLIPConfig, CLIPModel
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from fedrapp_app.engine import FrozenCLIP
from fedrapp_app.testbed.tiny import DEFAULT_TEXTS
from fedrapp_app.testbed.tokenizer import build_word_tokenizer, save_word_tokenizer, words_of

#: Caltech-101's 100 object classes as CoOp names them: a realistic 100-class list of 1- to 4-word names.
CALTECH101 = (
    "face",
    "leopard",
    "motorbike",
    "accordion",
    "airplane",
    "anchor",
    "ant",
    "barrel",
    "bass",
    "beaver",
    "binocular",
    "bonsai",
    "brain",
    "brontosaurus",
    "buddha",
    "butterfly",
    "camera",
    "cannon",
    "car side",
    "ceiling fan",
    "cellphone",
    "chair",
    "chandelier",
    "cougar body",
    "cougar face",
    "crab",
    "crayfish",
    "crocodile",
    "crocodile head",
    "cup",
    "dalmatian",
    "dollar bill",
    "dolphin",
    "dragonfly",
    "electric guitar",
    "elephant",
    "emu",
    "euphonium",
    "ewer",
    "ferry",
    "flamingo",
    "flamingo head",
    "garfield",
    "gerenuk",
    "gramophone",
    "grand piano",
    "hawksbill",
    "headphone",
    "hedgehog",
    "helicopter",
    "ibis",
    "inline skate",
    "joshua tree",
    "kangaroo",
    "ketch",
    "lamp",
    "laptop",
    "llama",
    "lobster",
    "lotus",
    "mandolin",
    "mayfly",
    "menorah",
    "metronome",
    "minaret",
    "nautilus",
    "octopus",
    "okapi",
    "pagoda",
    "panda",
    "pigeon",
    "pizza",
    "platypus",
    "pyramid",
    "revolver",
    "rhino",
    "rooster",
    "saxophone",
    "schooner",
    "scissors",
    "scorpion",
    "sea horse",
    "snoopy (cartoon beagle)",
    "soccer ball",
    "stapler",
    "starfish",
    "stegosaurus",
    "stop sign",
    "strawberry",
    "sunflower",
    "tick",
    "trilobite",
    "umbrella",
    "watch",
    "water lilly",
    "wheelchair",
    "wild cat",
    "windsor chair",
    "wrench",
    "yin yang",
)
assert len(CALTECH101) == 100


def vit_b16_config(
    vocab_size: int, bos: int, eos: int, pad: int, *, image_size: int = 224, tiny: bool = False
) -> CLIPConfig:
    """The ViT-B/16 CLIP sizes (``tiny``: 2 layers, 64 wide, 32 px, for tests of the scripts)."""
    text = dict(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    vision = dict(patch_size=16, image_size=image_size)
    if tiny:
        text.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
        vision.update(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        )
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=64 if tiny else 512)


def _vocabulary(classnames: Sequence[str]) -> list[str]:
    # "<name>." as well: the pre-tokenizer keeps punctuation runs such as ")." together
    return words_of([*(t.replace("{}", "") for t in DEFAULT_TEXTS), *classnames, *(f"{n}." for n in classnames)])


def vit_b16(
    classnames: Sequence[str] = CALTECH101,
    *,
    tiny: bool = False,
    device: str = "cpu",
    precision: str = "fp32",
    seed: int = 0,
) -> FrozenCLIP:
    """A random-weight CLIP with the ViT-B/16 sizes, frozen, in memory (no files)."""
    tokenizer = build_word_tokenizer(_vocabulary(classnames), 77)
    config = vit_b16_config(
        len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tiny=tiny
    )
    torch.manual_seed(seed)
    model = CLIPModel(config).requires_grad_(False).eval().to(device)
    size = config.vision_config.image_size
    processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    name = "random tiny CLIP" if tiny else "random ViT-B/16"
    return FrozenCLIP(model, tokenizer, processor, torch.device(device), precision, name)


def save_vit_b16(folder: str | Path, classnames: Sequence[str] = CALTECH101, *, tiny: bool = False) -> Path:
    """Write the random ViT-B/16 (weights, tokenizer, processor) as a Hugging Face folder ``load_clip`` reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = save_word_tokenizer(_vocabulary(classnames), 77, folder)
    config = vit_b16_config(
        len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tiny=tiny
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(str(folder))
    size = config.vision_config.image_size
    CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size}).save_pretrained(
        str(folder)
    )
    return folder


# ----- measuring on a shared machine -------------------------------------------------------------------
def load_average() -> float:
    """The 1-minute load average (nan where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def wait_for_quiet(threshold: float = 1.5, patience: float = 0.0, poll: float = 15.0) -> float:
    """Wait up to ``patience`` seconds for the 1-minute load average to fall below ``threshold``; return it.

    Other processes on the machine slow every timing; the load average goes next to every number.
    """
    deadline = time.monotonic() + patience
    while load_average() >= threshold and time.monotonic() < deadline:
        time.sleep(poll)
    return load_average()


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 0) -> tuple[float, list[float]]:
    """Median wall time of ``repeats`` calls of ``fn`` (after ``warmup`` untimed calls), and all of them."""
    timing = measure(fn, repeats, warmup)
    return timing["wall"], timing["walls"]


def measure(fn: Callable[[], object], repeats: int, warmup: int = 0) -> dict:
    """Median wall and process-CPU seconds of ``repeats`` calls of ``fn`` (after ``warmup`` untimed calls).

    With one torch thread the CPU time is the work itself, little affected by other processes on the machine
    (they delay it, which only the wall time sees); with several threads it also counts OpenMP spin-waits.
    """
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - start_cpu)
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus), "walls": walls, "cpus": cpus}
