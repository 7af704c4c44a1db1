"""The GPU table of docs/results/performance.md (section 5) in one command: images/s per local method, the
image tower's TFLOP/s, peak memory.

    python benchmarks/gpu_step.py                          # NVIDIA GPU: ViT-B/16, 100 classes, batch 64, bf16
    python benchmarks/gpu_step.py --json gpu.json          # also write the numbers
    python benchmarks/gpu_step.py --tiny --device cpu      # a tiny CLIP on the CPU: checks the script in seconds

No download: a random-weight CLIP with the ViT-B/16 sizes (speed does not depend on the weights) and
random 240 x 320 images. Every local method takes one step on a batch of 64 (TPT with 63 augmented views +
the original per image, i.e. 4096 tower passes per step) under bf16 autocast (``precision = "bf16"``, the
run config's GPU setting; ``--precision fp32`` is IEEE float32, TF32 off, as in the app); each method is timed
over ``--repeats`` steps after a warm-up (median, with ``torch.cuda.synchronize``). Reported:

* images/s per method (batch / median step time);
* the image tower's achieved TFLOP/s on a batch of ``--tower-batch`` images: the analytic FLOPs of a
  ViT forward (matmuls, convolution, attention; 35.1 GFLOP per 224 px image for ViT-B/16), cross-checked
  with ``torch.utils.flop_counter``, divided by the forward's time;
* peak GPU memory per client: ``torch.cuda.max_memory_allocated`` during the step, the frozen model's
  weights included (what one client process holds; several clients can share a card when these fit).

Budget: about a minute on an H100/H200 class GPU (model set-up included), well under 5 minutes.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from fedrapp_app.engine import PromptedCLIP
from fedrapp_app.engine.devices import describe_device, disable_tf32, set_deterministic
from fedrapp_app.methods import Adaptation, make_method

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import CALTECH101, vit_b16  # noqa: E402

METHODS = ("zeroshot", "adaprompt", "tpt-online", "tpt")


def vision_flops_analytic(config) -> dict[str, float]:
    """Forward FLOPs of one image through a CLIP vision tower + projection (2 FLOPs per multiply-add).

    ``dense``: patch embedding, the q/k/v/out projections and the MLP of every layer, the final projection;
    ``attention``: the two attention matmuls (Q K^T and A V); ``total``: both. Norms, softmax and GELU are
    not counted (as in torch.utils.flop_counter).
    """
    v = config.vision_config
    patches = (v.image_size // v.patch_size) ** 2
    tokens, width = patches + 1, v.hidden_size
    patch_embed = 2 * patches * (3 * v.patch_size**2) * width
    dense_layer = 2 * tokens * 4 * width**2 + 2 * tokens * 2 * width * v.intermediate_size
    dense = patch_embed + v.num_hidden_layers * dense_layer + 2 * width * config.projection_dim
    attention = v.num_hidden_layers * 2 * 2 * tokens**2 * width
    return {"dense": float(dense), "attention": float(attention), "total": float(dense + attention)}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call."""
    fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def tower_throughput(pclip: PromptedCLIP, batch: int, repeats: int) -> dict[str, float]:
    """FLOPs per image, seconds per batch and achieved TFLOP/s of the image tower.

    The rate uses the analytic count; torch.utils.flop_counter's count is reported next to it as a check
    (it must equal the dense part, plus the attention part where the device's attention kernel is
    registered with the counter: the CUDA kernels are, the CPU flash kernel is not).
    """
    size = pclip.clip.model.config.vision_config.image_size
    pixels = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0)).to(pclip.device)
    counter = FlopCounterMode(display=False)
    with counter:
        pclip.image_features(pixels[:1])
    analytic = vision_flops_analytic(pclip.clip.model.config)
    seconds = timed(lambda: pclip.image_features(pixels, chunk_size=batch), pclip.device, repeats)
    return {
        "flops_per_image": analytic["total"],
        "flops_dense": analytic["dense"],
        "flops_attention": analytic["attention"],
        "flops_counted": float(counter.get_total_flops()),
        "batch": batch,
        "seconds": seconds,
        "images_per_s": batch / seconds,
        "tflops": analytic["total"] * batch / seconds / 1e12,
    }


def step_function(name: str, pclip: PromptedCLIP, pixels: torch.Tensor, views: int) -> Callable[[], Adaptation]:
    """One local step of method ``name`` on ``pixels`` from its initial prompt, as a function (a fresh method
    each call; AdaPrompt with a full buffer from the first batch, so the step updates)."""
    params = (
        {"n_views": views}
        if name.startswith("tpt")
        else ({"threshold": 0.0, "buffer_size": len(pixels)} if name == "adaprompt" else {})
    )
    prompt = make_method(name, **params).initial_prompt(pclip)

    def step() -> Adaptation:
        return make_method(name, **params).adapt(pclip, prompt, pixels, torch.Generator().manual_seed(0))

    return step


def method_step(name: str, pclip: PromptedCLIP, pixels: torch.Tensor, views: int, repeats: int) -> dict[str, float]:
    """Median step time, images/s and peak memory of one local method on ``pixels``."""
    step = step_function(name, pclip, pixels, views)
    device = pclip.device
    if device.type == "cuda":
        step()  # warm-up outside the peak window: cuBLAS workspaces and caches are not per-step memory
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    seconds = timed(step, device, repeats)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    reserved = torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else float("nan")
    return {
        "method": name,
        "batch": len(pixels),
        "seconds": seconds,
        "images_per_s": len(pixels) / seconds,
        "peak_allocated_gib": peak,
        "peak_reserved_gib": reserved,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu only with --tiny)")
    parser.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--tiny", action="store_true", help="tiny CLIP, batch 4, 3 views: checks the script")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--views", type=int, default=63, help="TPT augmented views per image")
    parser.add_argument("--tower-batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--deterministic", action="store_true", help="deterministic kernels (the run config's deterministic switch)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.tiny:
        args.batch, args.views, args.tower_batch, args.repeats = 4, 3, 8, 1
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here; this is the GPU benchmark (use --tiny --device cpu to check the script)")
    if device.type == "cpu" and not args.tiny:
        parser.error("the full-size benchmark is for a GPU; on the CPU use benchmarks/client_step.py (or --tiny)")
    if device.type == "cpu" and args.precision == "fp16":
        parser.error("fp16 autocast needs a GPU; use bf16 or fp32 on the CPU")
    disable_tf32()  # the app's policy (load_clip does the same): fp32 is IEEE float32, bf16 is the fast setting
    set_deterministic(args.deterministic)
    started = time.perf_counter()
    classnames = CALTECH101[: args.classes]
    clip = vit_b16(classnames, tiny=args.tiny, device=str(device), precision=args.precision)
    pclip = PromptedCLIP(clip, classnames)
    weights_gib = sum(p.numel() * p.element_size() for p in clip.model.parameters()) / 2**30
    rng = np.random.default_rng(0)
    pixels = pclip.preprocess(
        [Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)) for _ in range(args.batch)]
    ).to(device)
    name = describe_device(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}, {args.precision} autocast"
        f"{', deterministic kernels' if args.deterministic else ''}, "
        f"{'tiny CLIP' if args.tiny else 'ViT-B/16 (random weights)'}, {len(classnames)} classes, "
        f"batch {args.batch}, TPT 1 + {args.views} views; model weights {weights_gib:.2f} GiB (fp32)",
        flush=True,
    )
    tower = tower_throughput(pclip, args.tower_batch, args.repeats)
    print(
        f"image tower: {tower['flops_per_image'] / 1e9:.2f} GFLOP/image "
        f"(flop_counter: {tower['flops_counted'] / 1e9:.2f}), batch {tower['batch']}: "
        f"{tower['images_per_s']:.0f} images/s, {tower['tflops']:.1f} TFLOP/s",
        flush=True,
    )
    rows = []
    for method in args.methods:
        row = method_step(method, pclip, pixels, args.views, args.repeats)
        rows.append(row)
        print(
            f"{method:10s} {row['seconds']:8.3f} s/step  {row['images_per_s']:9.1f} images/s  "
            f"peak {row['peak_allocated_gib']:.2f} GiB allocated ({row['peak_reserved_gib']:.2f} reserved)",
            flush=True,
        )
    total = time.perf_counter() - started
    print(f"total {total:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": name,
                    "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                    "precision": args.precision,
                    "deterministic": args.deterministic,
                    "tiny": args.tiny,
                    "classes": len(classnames),
                    "batch": args.batch,
                    "views": args.views,
                    "weights_gib": weights_gib,
                    "tower": tower,
                    "methods": rows,
                    "total_s": total,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
