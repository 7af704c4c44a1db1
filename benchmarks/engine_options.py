"""The measured effect of each engine option on the ViT-B/16 architecture (random weights, CPU).

    python benchmarks/engine_options.py                 # 100 classes, 16 images, 2 threads, median of 3
    python benchmarks/engine_options.py --threads 1 --images 8

Text side (AdaPrompt's K = 3 shared contexts x 100 classes; forward, and forward + backward into the
contexts): every sequence padded to 77 positions (the reference codes) -> cut after the batch's last EOS
-> the shared-prefix pass (each ``[SOS] ctx`` once, class tokens packed), in fp32 and under bf16 autocast;
plus a hit of the constant-feature cache (AdaPrompt's labeller from round 2 on in a process).
Image side: the frozen tower under ``no_grad`` (ours), ``inference_mode``, bf16 autocast
(``precision = "bf16"``), and bf16 weights; with the cosine between the bf16 and fp32 features.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from fedrapp_app.engine import PromptedCLIP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import CALTECH101, load_average, measure, vit_b16  # noqa: E402

INIT_TEXTS = ("an image of a", "a colorful image of a", "a noisy picture of a")


def text_rows(classnames: tuple[str, ...], repeats: int) -> list[dict]:
    rows = []
    variants = [
        ("77 positions (naive)", dict(full_length_text=True, shared_prefix=False)),
        ("cut after last EOS", dict(full_length_text=False, shared_prefix=False)),
        ("cut + shared prefix (ours)", dict(full_length_text=False, shared_prefix=True)),
    ]
    for precision in ("fp32", "bf16"):
        clip = vit_b16(classnames, precision=precision)
        for label, flags in variants:
            pclip = PromptedCLIP(clip, classnames)
            pclip.full_length_text, pclip.shared_prefix = flags["full_length_text"], flags["shared_prefix"]
            blocks = [pclip.context_from_text(t) for t in INIT_TEXTS]

            def forward(pclip: PromptedCLIP = pclip, blocks: list = blocks) -> None:
                with torch.no_grad():
                    pclip.text_features(blocks)

            def backward(pclip: PromptedCLIP = pclip, blocks: list = blocks) -> None:
                params = [block.clone().requires_grad_(True) for block in blocks]
                pclip.text_features(params).sum().backward()

            rows.append(
                {
                    "side": "text",
                    "precision": precision,
                    "variant": label,
                    "forward": measure(forward, repeats, 1),
                    "forward_backward": measure(backward, repeats, 1),
                    "load": load_average(),
                }
            )
            print(_text_line(rows[-1]), flush=True)
        cached = PromptedCLIP(clip, classnames)
        blocks = [cached.context_from_text(t) for t in INIT_TEXTS]
        cached.constant_text_features(blocks)
        rows.append(
            {
                "side": "text",
                "precision": precision,
                "variant": "constant cache hit (labeller)",
                "forward": measure(lambda c=cached, b=blocks: c.constant_text_features(b), repeats),
                "load": load_average(),
            }
        )
        print(_text_line(rows[-1]), flush=True)
    return rows


def _text_line(row: dict) -> str:
    line = (
        f"text  {row['precision']}  {row['variant']:32s} forward {row['forward']['wall']:7.3f} s "
        f"({row['forward']['cpu']:6.3f} CPU)"
    )
    if "forward_backward" in row:
        both = row["forward_backward"]
        line += f"   forward+backward {both['wall']:7.3f} s ({both['cpu']:6.3f} CPU)"
    return line + f"   load {row['load']:.2f}"


def image_rows(images: int, repeats: int) -> list[dict]:
    clip = vit_b16(CALTECH101[:2])
    vision, projection = clip.model.vision_model, clip.model.visual_projection
    pixels = torch.randn(images, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    low_vision, low_projection = copy.deepcopy(vision).to(torch.bfloat16), copy.deepcopy(projection).to(torch.bfloat16)

    def tower(x: torch.Tensor) -> torch.Tensor:
        return F.normalize(projection(vision(pixel_values=x).pooler_output).float(), dim=-1)

    def low_tower(x: torch.Tensor) -> torch.Tensor:
        return F.normalize(low_projection(low_vision(pixel_values=x.bfloat16()).pooler_output).float(), dim=-1)

    def autocast_tower(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return tower(x)

    with torch.no_grad():
        reference = tower(pixels)
    variants = [
        ("fp32 no_grad (ours)", torch.no_grad, tower),
        ("fp32 inference_mode", torch.inference_mode, tower),
        ("bf16 autocast (precision=bf16)", torch.no_grad, autocast_tower),
        ("bf16 weights", torch.no_grad, low_tower),
    ]
    rows = []
    for label, mode, fn in variants:
        with mode():
            timing = measure(lambda fn=fn: fn(pixels), repeats, 1)
            cosine = float(F.cosine_similarity(fn(pixels), reference).min())
        rows.append(
            {
                "side": "image",
                "variant": label,
                "images": images,
                "forward": timing,
                "min_cosine": cosine,
                "load": load_average(),
            }
        )
        print(
            f"image {label:32s} {images} images {timing['wall']:7.2f} s ({timing['cpu']:6.2f} CPU)  "
            f"{timing['wall'] / images:.3f} s/image   min cosine to fp32 {cosine:.6f}   load {load_average():.2f}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"ViT-B/16 random weights, CPU, {torch.get_num_threads()} threads, median of {args.repeats}; "
        f"load {load_average():.2f}"
    )
    rows = text_rows(CALTECH101[: args.classes], args.repeats) + image_rows(args.images, args.repeats)
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
