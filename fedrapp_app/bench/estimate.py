"""Estimate time and GPU memory per cell of ``conf/bench/paper.yaml`` from costs measured on this machine.

What is measured (on the CPU, with a random-weight CLIP of the ViT-B/16 sizes; cost does not depend on
the weights): the floating-point operations of one AdaPrompt step and one zero-shot step (64 images, C
classes, class names padded to ``--name-tokens`` words; ``torch.utils.flop_counter``), the bytes autograd
saves for the backward pass under bf16 autocast (``saved_tensors_hooks``), both at two class counts and
fitted as ``a + b * C``, and the CPU time to decode and preprocess one 500x375 JPEG.

What is assumed: the GPU sustains ``--utilization`` of its published dense bf16 peak ``--peak-tflops`` (989
for an H100/H200 SXM) on these matmuls, plus ``--step-overhead`` seconds of Python, kernel launches and
in-process Flower messaging per client step; JPEG decoding runs on ``decode-workers`` threads beside
the GPU. Both are assumptions, so the result is an estimate, not a measurement.

Run: ``python -m fedrapp_app.bench.estimate`` (about a minute on 2 cores); prints a markdown table.
"""

from __future__ import annotations

import argparse
import io
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode
from transformers import CLIPConfig, CLIPModel
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from fedrapp_app.engine import FrozenCLIP, PromptedCLIP
from fedrapp_app.methods import make_method
from fedrapp_app.testbed.tiny import DEFAULT_TEXTS
from fedrapp_app.testbed.tokenizer import build_word_tokenizer, words_of

#: (classes, test images) of CoOp's test splits (Zhou et al., IJCV 2022, Table 7; TPT's ImageNet variants).
PAPER_SIZES: dict[str, tuple[int, int]] = {
    "flowers102": (102, 2463),
    "dtd": (47, 1692),
    "caltech101": (100, 2465),
    "oxford-pets": (37, 3669),
    "food101": (101, 30300),
    "ucf101": (101, 3783),
    "sun397": (397, 19850),
    "fgvc-aircraft": (100, 3333),
    "stanford-cars": (196, 8041),
    "imagenet": (1000, 50000),
    "imagenet-a": (200, 7500),
    "imagenet-v2": (1000, 10000),
    "imagenet-r": (200, 30000),
    "imagenet-sketch": (1000, 50889),
}
BATCH = 64
CELLS_PER_DATASET = {"zeroshot": 3, "adaprompt": 12}  # 3 seeds; 4 strategies x 3 seeds


@dataclass(frozen=True)
class StepCost:
    """Measured cost of one client step: ``flops`` and saved ``bytes`` as a + b * C, CPU seconds at C1."""

    flops: tuple[float, float]
    saved_bytes: tuple[float, float]
    cpu_seconds: float

    def at(self, classes: int) -> tuple[float, float]:
        """(FLOPs, saved bytes) of one step with ``classes`` classes."""
        return self.flops[0] + self.flops[1] * classes, self.saved_bytes[0] + self.saved_bytes[1] * classes


def vit_b16_random(classnames: list[str]) -> FrozenCLIP:
    """A frozen random-weight CLIP with the ViT-B/16 sizes (text 512 x 12 layers, vision 768 x 12, patch 16)."""
    tokenizer = build_word_tokenizer(words_of([*(t.replace("{}", "") for t in DEFAULT_TEXTS), *classnames]), 77)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(patch_size=16, image_size=224),
        projection_dim=512,
    )
    torch.manual_seed(0)
    model = CLIPModel(config).requires_grad_(False).eval()
    return FrozenCLIP(model, tokenizer, CLIPImageProcessorPil(), torch.device("cpu"), "bf16", "random ViT-B/16")


def synthetic_names(classes: int, words: int) -> list[str]:
    """``classes`` distinct class names of ``words`` words each (the text length is what costs)."""
    return [" ".join(f"w{(c * words + k) % 997}x{c}" for k in range(words)) for c in range(classes)]


def _saved_bytes(step) -> tuple[float, object]:
    """Bytes of the distinct storages autograd saves while ``step()`` runs, and its result."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = step()
    return float(sum(storages.values())), result


def measure_step(method_name: str, classes: int, name_words: int) -> tuple[float, float, float]:
    """(FLOPs, saved bytes, CPU seconds) of one steady-state step of ``method_name`` (64 images, C classes)."""
    names = synthetic_names(classes, name_words)
    pclip = PromptedCLIP(vit_b16_random(names), names)
    params = {"threshold": 0.0, "buffer_size": BATCH} if method_name == "adaprompt" else {}
    method = make_method(method_name, params)
    pixels = torch.randn(BATCH, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    prompt = method.initial_prompt(pclip)
    first = method.adapt(pclip, prompt, pixels, torch.Generator().manual_seed(0))  # fills buffer and caches
    counter = FlopCounterMode(display=False)
    start = time.perf_counter()
    with counter:
        saved, _ = _saved_bytes(lambda: method.adapt(pclip, first.prompt, pixels, torch.Generator().manual_seed(1)))
    return float(counter.get_total_flops()), saved, time.perf_counter() - start


def fit(method_name: str, name_words: int, low: int = 16, high: int = 48) -> StepCost:
    """Measure at two class counts and fit ``a + b * C`` (text cost is linear in C, image cost constant)."""
    f1, s1, t1 = measure_step(method_name, low, name_words)
    f2, s2, _ = measure_step(method_name, high, name_words)
    bf, bs = (f2 - f1) / (high - low), (s2 - s1) / (high - low)
    return StepCost((f1 - bf * low, bf), (s1 - bs * low, bs), t1)


def decode_seconds(images: int = 40) -> tuple[float, float]:
    """CPU seconds per 500x375 JPEG: (decode to RGB with PIL, preprocess with the CLIP image processor)."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    picture = (np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1) + rng.integers(0, 40, (375, 500, 3))) % 256
    buffer = io.BytesIO()
    Image.fromarray(picture.astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    data = buffer.getvalue()
    processor = CLIPImageProcessorPil()
    start = time.perf_counter()
    decoded = [Image.open(io.BytesIO(data)).convert("RGB") for _ in range(images)]
    middle = time.perf_counter()
    for image in decoded:
        processor(images=[image], return_tensors="pt")
    return (middle - start) / images, (time.perf_counter() - middle) / images


def weights_bytes() -> float:
    """fp32 bytes of the full ViT-B/16 CLIP (what the GPU holds; autocast casts per op)."""
    model = CLIPModel(CLIPConfig(vision_config=dict(patch_size=16, image_size=224), projection_dim=512))
    return float(sum(p.numel() * p.element_size() for p in model.parameters()))


def estimate_table(
    adaprompt: StepCost,
    zeroshot: StepCost,
    decode: tuple[float, float],
    weights: float,
    *,
    peak_tflops: float,
    utilization: float,
    step_overhead: float,
    decode_workers: int,
    clients: int,
) -> str:
    """Markdown table: per dataset, client steps, TFLOP, estimated minutes and GB per cell."""
    sustained = peak_tflops * 1e12 * utilization
    lines = [
        "| dataset | classes | test images | client steps | TFLOP / cell (AdaPrompt) | min / cell AdaPrompt "
        "| min / cell zero-shot | peak GPU memory (GB, AdaPrompt) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    total = 0.0
    for name, (classes, images) in PAPER_SIZES.items():
        steps = math.ceil(images / BATCH) + clients // 2  # Dirichlet partitions end in partial batches
        background = images * decode[0] / decode_workers  # prefetched on decode threads during compute
        minutes = {}
        for label, cost in (("adaprompt", adaprompt), ("zeroshot", zeroshot)):
            flops, _ = cost.at(classes)
            compute = steps * (flops / sustained + step_overhead) + images * decode[1]  # preprocess: in line
            minutes[label] = max(compute, background) / 60
            total += CELLS_PER_DATASET[label] * minutes[label]
        flops, saved = adaprompt.at(classes)
        memory = (weights + 1.5 * saved) / 2**30 + 1.0  # +50% for transients, +1 GiB CUDA context/allocator
        lines.append(
            f"| {name} | {classes} | {images} | {steps} | {steps * flops / 1e12:.0f} | "
            f"{minutes['adaprompt']:.1f} | {minutes['zeroshot']:.1f} | {memory:.1f} |"
        )
    lines.append(f"\nWhole grid (14 datasets x (3 zero-shot + 12 AdaPrompt cells)): about {total / 60:.1f} GPU hours.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="published dense bf16 peak (H100/H200)")
    parser.add_argument("--utilization", type=float, default=0.3, help="assumed share of the peak sustained")
    parser.add_argument("--step-overhead", type=float, default=0.03, help="assumed seconds of overhead per step")
    parser.add_argument("--decode-workers", type=int, default=4)
    parser.add_argument("--name-tokens", type=int, default=12, help="tokens per class name (12: long BPE names)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    adaprompt = fit("adaprompt", args.name_tokens)
    zeroshot = fit("zeroshot", args.name_tokens)
    decode = decode_seconds()
    weights = weights_bytes()
    print(f"measured on this CPU ({args.threads} threads, bf16 autocast), per step of {BATCH} images:")
    for label, cost in (("adaprompt", adaprompt), ("zeroshot", zeroshot)):
        print(
            f"  {label}: {cost.flops[0] / 1e12:.3f} + {cost.flops[1] / 1e9:.2f}e-3 * C TFLOP, saved "
            f"{cost.saved_bytes[0] / 2**20:.0f} + {cost.saved_bytes[1] / 2**20:.2f} * C MiB, "
            f"{cost.cpu_seconds:.1f} s on the CPU at C = 16"
        )
    print(
        f"  JPEG decode {1000 * decode[0]:.1f} ms + preprocess {1000 * decode[1]:.1f} ms per image; "
        f"weights {weights / 2**20:.0f} MiB fp32"
    )
    print(
        f"assumed: {args.utilization:.0%} of {args.peak_tflops:g} TFLOP/s sustained, {args.step_overhead * 1000:.0f}"
        f" ms overhead per step, {args.decode_workers} decode threads\n"
    )
    print(
        estimate_table(
            adaprompt,
            zeroshot,
            decode,
            weights,
            peak_tflops=args.peak_tflops,
            utilization=args.utilization,
            step_overhead=args.step_overhead,
            decode_workers=args.decode_workers,
            clients=args.clients,
        )
    )


if __name__ == "__main__":
    main()
