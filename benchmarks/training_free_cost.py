"""Client step cost of the training-free methods beside the prompt-tuning ones, on ViT-B/16 (random weights).

One ``adapt`` per method on the ViT-B/16 architecture with Caltech-101's 100 class names (the prompt ensemble:
its seven templates, as TDA's): zero-shot (one template), zero-shot with the ensemble, TDA (no views, its
ImageNet setting), ZERO (1 + 63 views), AdaPrompt (full buffer: the timed step includes its update),
AdaPrompt+TDA and AdaPrompt+ZERO. Each time is the median of ``--repeats`` steps after one untimed step (it
fills caches and buffers). A step's cost is linear in its images (each image costs its views' tower pass), so
the methods with views are timed on ``--view-images`` images and the rest on ``--images``; the table gives
seconds per image and per batch of 64 (per-image x 64) and the ratio to zero-shot.

    python benchmarks/training_free_cost.py                  # ViT-B/16, CPU (~6 min on 2 idle cores)
    python benchmarks/training_free_cost.py --device cuda    # on a GPU host
    python benchmarks/training_free_cost.py --tiny           # the scripts' smoke size (seconds)

Writes ``--out`` (JSON, default docs/results/raw/training_free_cost.json) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from fedrapp_app.data.presets import IMAGENET_ENSEMBLE
from fedrapp_app.engine import PromptedCLIP
from fedrapp_app.methods import make_method

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import CALTECH101, load_average, measure, vit_b16  # noqa: E402

#: (method, its parameters, whether it looks at augmented views)
METHODS = (
    ("zeroshot", {}, False),
    ("zeroshot-ensemble", {}, False),
    ("tda", {}, False),
    ("zero", {}, True),
    ("adaprompt", {"threshold": 0.0, "buffer-size": 0}, False),
    ("adaprompt+tda", {"threshold": 0.0, "buffer-size": 0}, False),
    ("adaprompt+zero", {"threshold": 0.0, "buffer-size": 0}, True),
)


def step_cost(pclip: PromptedCLIP, name: str, params: dict, images: int, repeats: int) -> dict:
    """Median seconds of one ``adapt`` of ``name`` on ``images`` random images (after one untimed step)."""
    size = pclip.clip.image_processor.crop_size["height"]
    pixels = torch.randn(images, 3, size, size, generator=torch.Generator().manual_seed(0)).to(pclip.device)
    if "buffer-size" in params:  # a buffer the size of the step: full after the warm step, so the timed one tunes
        params = {**params, "buffer-size": images}
    method = make_method(name, params)
    prompt = method.initial_prompt(pclip)
    method.adapt(pclip, prompt, pixels, torch.Generator().manual_seed(0))  # warm: buffers, caches, text features

    def step() -> None:
        method.adapt(pclip, prompt, pixels, torch.Generator().manual_seed(1))
        if pclip.device.type == "cuda":
            torch.cuda.synchronize()

    timed = measure(step, repeats)
    return {"images": images, "wall": timed["wall"], "per_image": timed["wall"] / images, "load": load_average()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, default=16, help="images per timed step (methods without views)")
    parser.add_argument("--view-images", type=int, default=2, help="images per timed step (methods with views)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="2-layer 64-wide model, 32 px (a smoke test)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/raw/training_free_cost.json"))
    args = parser.parse_args(argv)

    clip = vit_b16(CALTECH101, tiny=args.tiny, device=args.device)
    pclip = PromptedCLIP(clip, CALTECH101, "a photo of a {}.", IMAGENET_ENSEMBLE)
    results = {}
    for name, params, views in METHODS:
        results[name] = step_cost(pclip, name, params, args.view_images if views else args.images, args.repeats)
        print(f"{name}: {results[name]['per_image'] * 1000:.1f} ms per image", file=sys.stderr)
    reference = results["zeroshot"]["per_image"]
    lines = [
        f"ViT-B/16{' (tiny)' if args.tiny else ''}, {len(CALTECH101)} classes, {args.device}, "
        f"torch threads {torch.get_num_threads()}, {platform.node()}",
        "",
        "| method | s per image | s per batch of 64 | × zero-shot | timed on |",
        "|---|---|---|---|---|",
    ]
    for name, cost in results.items():
        lines.append(
            f"| {name} | {cost['per_image']:.3f} | {64 * cost['per_image']:.1f} | "
            f"{cost['per_image'] / reference:.1f} | {cost['images']} images (load {cost['load']:.1f}) |"
        )
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": args.device, "tiny": args.tiny, "threads": torch.get_num_threads(), "host": platform.node()}
    args.out.write_text(json.dumps({"meta": meta, "results": results, "table": lines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
