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

Run: ``python -m fedrapp_app.bench.estimate`` (about a minute on idle 2 cores, 3 on busy ones); prints a markdown
table. ``python -m fedrapp_app.bench <bench.yaml> --dry-run --gpu-type h200 --gpus 8`` estimates a grid's cells from
the costs this command printed (:data:`MEASURED`, :func:`grid_estimate`) on a class of GPU (:data:`GPU_CLASSES`) or
on a CPU (``--gpu-type cpu``, the default on a host without a GPU: the measured CPU seconds). Another CLIP's cost is
ViT-B/16's scaled by its towers' sizes (:func:`scaled_cost`; its config.json, or a known Hub id); the testbed's
comes from its measured step (:data:`TESTBED_STEP_SECONDS`).
"""

from __future__ import annotations

import argparse
import heapq
import io
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the measurement loads torch and transformers; the dry run's estimate does not
    from fedrapp_app.engine import FrozenCLIP

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
    import torch
    from transformers import CLIPConfig, CLIPModel
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from fedrapp_app.engine import FrozenCLIP
    from fedrapp_app.testbed.tiny import DEFAULT_TEXTS
    from fedrapp_app.testbed.tokenizer import build_word_tokenizer, words_of

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
    import torch

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
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fedrapp_app.engine import PromptedCLIP
    from fedrapp_app.methods import make_method

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
    import numpy as np
    from PIL import Image
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

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
    from transformers import CLIPConfig, CLIPModel

    model = CLIPModel(CLIPConfig(vision_config=dict(patch_size=16, image_size=224), projection_dim=512))
    return float(sum(p.numel() * p.element_size() for p in model.parameters()))


def client_steps(images: int, clients: int) -> int:
    """Client steps of a cell: a batch of ``BATCH`` per step, Dirichlet partitions ending in partial batches."""
    return math.ceil(images / BATCH) + clients // 2


def cell_minutes(
    cost: StepCost,
    classes: int,
    images: int,
    steps: int,
    decode: tuple[float, float],
    *,
    sustained: float,
    step_overhead: float,
    decode_workers: int,
) -> float:
    """Estimated minutes of one cell: ``steps`` client steps at ``sustained`` FLOP/s plus the per-step overhead
    and the in-line preprocessing of ``images`` images, or the JPEG decoding on ``decode_workers`` threads beside
    the GPU when that takes longer."""
    flops, _ = cost.at(classes)
    background = images * decode[0] / decode_workers  # prefetched on decode threads during compute
    compute = steps * (flops / sustained + step_overhead) + images * decode[1]  # preprocess: in line
    return max(compute, background) / 60


def cell_memory_gb(cost: StepCost, classes: int, weights: float) -> float:
    """Estimated peak GPU memory of one cell (GiB): the weights, the saved activations +50% for transients, and
    1 GiB of CUDA context and allocator."""
    _, saved = cost.at(classes)
    return (weights + 1.5 * saved) / 2**30 + 1.0


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
        steps = client_steps(images, clients)
        minutes = {}
        for label, cost in (("adaprompt", adaprompt), ("zeroshot", zeroshot)):
            minutes[label] = cell_minutes(
                cost,
                classes,
                images,
                steps,
                decode,
                sustained=sustained,
                step_overhead=step_overhead,
                decode_workers=decode_workers,
            )
            total += CELLS_PER_DATASET[label] * minutes[label]
        flops, _ = adaprompt.at(classes)
        memory = cell_memory_gb(adaprompt, classes, weights)
        lines.append(
            f"| {name} | {classes} | {images} | {steps} | {steps * flops / 1e12:.0f} | "
            f"{minutes['adaprompt']:.1f} | {minutes['zeroshot']:.1f} | {memory:.1f} |"
        )
    lines.append(f"\nWhole grid (14 datasets x (3 zero-shot + 12 AdaPrompt cells)): about {total / 60:.1f} GPU hours.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- a grid's estimate
#: What ``python -m fedrapp_app.bench.estimate`` printed at commit 86e303a on a 2-core CPU: the FLOPs and the saved
#: bytes are properties of ViT-B/16 and the method (the same on any machine); the JPEG times are that CPU's.
MEASURED: dict[str, StepCost] = {
    "adaprompt": StepCost(flops=(2.161e12, 9.60e9), saved_bytes=(79 * 2**20, 13.22 * 2**20), cpu_seconds=38.1),
    "zeroshot": StepCost(flops=(2.157e12, 0.0), saved_bytes=(0.0, 0.0), cpu_seconds=16.4),
}
MEASURED_DECODE = (1.5e-3, 4.9e-3)  # seconds per 500x375 JPEG: decode, preprocess
MEASURED_WEIGHTS = 571 * 2**20  # fp32 bytes of ViT-B/16 CLIP
#: The assumptions of the command's defaults.
UTILIZATION, STEP_OVERHEAD, DECODE_WORKERS = 0.3, 0.03, 4


@dataclass(frozen=True)
class GpuClass:
    """A class of GPU: its name, published dense bf16 tensor-core peak (TFLOP/s) and memory (GB)."""

    name: str
    peak_tflops: float
    memory_gb: float


GPU_CLASSES: dict[str, GpuClass] = {
    "h200": GpuClass("NVIDIA H200 SXM", 989.0, 141.0),
    "h100": GpuClass("NVIDIA H100 SXM", 989.0, 80.0),
    "h100-pcie": GpuClass("NVIDIA H100 PCIe", 756.0, 80.0),
    "a100": GpuClass("NVIDIA A100 80GB", 312.0, 80.0),
    "l40s": GpuClass("NVIDIA L40S", 362.0, 48.0),
    "a10": GpuClass("NVIDIA A10", 125.0, 24.0),
    "l4": GpuClass("NVIDIA L4", 121.0, 24.0),
}


def gpu_class_of(model_name: str) -> str | None:
    """The :data:`GPU_CLASSES` key of a GPU model name as the driver reports it (``NVIDIA H100 PCIe`` ->
    ``h100-pcie``), None for a GPU the table does not know."""
    words = model_name.lower().replace("-", " ").split()
    if "h200" in words:
        return "h200"
    if "h100" in words:
        return "h100-pcie" if "pcie" in words else "h100"
    for key in ("a100", "l40s", "a10", "l4"):
        if key in words:
            return key
    return None


def host_gpu_class(driver: Path = Path("/proc/driver/nvidia/gpus")) -> str | None:
    """The class of this host's first GPU (the NVIDIA driver's ``Model:`` line), None without one or when unknown."""
    for information in sorted(driver.glob("*/information")) if driver.is_dir() else []:
        for line in information.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return gpu_class_of(line.partition(":")[2].strip())
    return None


#: Seconds of one testbed client step (a batch of 64 renders through the tiny CLIP, AdaPrompt or IM) on one CPU
#: thread: the median cell of docs/results/raw/continual_cells.json took 33.9 s for 8 clients x 5120 renders (84
#: client steps), each cell on one thread, two at once on 2 cores. A GPU host runs it alike: the step is CPU-bound.
TESTBED_STEP_SECONDS = 0.40
#: The testbed's methods that step costs: AdaPrompt and IM measured, zero-shot cheaper (an upper bound).
TESTBED_METHODS = ("adaprompt", "im", "zeroshot")
#: "cpu" in ``--gpu-type``: the 2-core CPU :data:`MEASURED` was measured on (its ``cpu_seconds``, 2 threads).
CPU = "cpu"


@dataclass(frozen=True)
class Architecture:
    """A CLIP's towers: layers and width of each, and the image tower's tokens ((image / patch)² + 1)."""

    vision_layers: int
    vision_width: int
    vision_tokens: int
    text_layers: int
    text_width: int

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> Architecture:
        """From a checkpoint's ``config.json`` (``transformers``' CLIP defaults where a key is absent)."""
        vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
        tokens = (int(vision.get("image_size", 224)) // int(vision.get("patch_size", 32))) ** 2 + 1
        return cls(
            int(vision.get("num_hidden_layers", 12)),
            int(vision.get("hidden_size", 768)),
            tokens,
            int(text.get("num_hidden_layers", 12)),
            int(text.get("hidden_size", 512)),
        )

    def ratios(self, other: Architecture) -> tuple[float, float, float]:
        """(image tower, text tower, weights) of this architecture over ``other``'s: compute per step as
        ``12·t·w² + 2·t²·w`` per layer (projections, MLP, attention; the text on :data:`TEXT_TOKENS` tokens), weights
        as ``12·w²`` per layer."""

        def tower(layers: int, width: int, tokens: int) -> float:
            return layers * (12 * tokens * width**2 + 2 * tokens**2 * width)

        vision = tower(self.vision_layers, self.vision_width, self.vision_tokens) / tower(
            other.vision_layers, other.vision_width, other.vision_tokens
        )
        text = tower(self.text_layers, self.text_width, TEXT_TOKENS) / tower(
            other.text_layers, other.text_width, TEXT_TOKENS
        )
        weights = (self.vision_layers * self.vision_width**2 + self.text_layers * self.text_width**2) / (
            other.vision_layers * other.vision_width**2 + other.text_layers * other.text_width**2
        )
        return vision, text, weights


#: Text tokens of one class's prompt in the measured step (SOS, 4 context vectors, a 12-token name, '.', EOS).
TEXT_TOKENS = 19
VIT_B16 = Architecture(12, 768, 197, 12, 512)
#: OpenAI's CLIPs on the Hub (their config.json), for an estimate before the checkpoint is downloaded.
KNOWN_ARCHITECTURES: dict[str, Architecture] = {
    "openai/clip-vit-base-patch32": Architecture(12, 768, 50, 12, 512),
    "openai/clip-vit-base-patch16": VIT_B16,
    "openai/clip-vit-large-patch14": Architecture(24, 1024, 257, 12, 768),
    "openai/clip-vit-large-patch14-336": Architecture(24, 1024, 577, 12, 768),
}


def architecture_of(model: str) -> Architecture | None:
    """A model's :class:`Architecture`: its local folder's ``config.json``, the Hub cache's, or a known Hub id's;
    None when none of them says."""
    import json

    folder = Path(model).expanduser()
    candidates = [folder / "config.json"] if folder.is_dir() else []
    if not candidates and model.count("/") == 1:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
        candidates = [Path(cached)] if isinstance(cached, str) else []
    for path in candidates:
        try:
            return Architecture.of_config(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    return KNOWN_ARCHITECTURES.get(model)


def scaled_cost(cost: StepCost, arch: Architecture) -> StepCost:
    """A ViT-B/16 step's measured cost scaled to ``arch``: the part that does not grow with the classes (the image
    tower) by the image towers' ratio, the per-class part (the text tower and its saved activations) by the text
    towers'; the CPU seconds by the FLOPs at the measured 16 classes."""
    vision, text, _ = arch.ratios(VIT_B16)
    flops = (cost.flops[0] * vision, cost.flops[1] * text)
    at16 = (flops[0] + 16 * flops[1]) / (cost.flops[0] + 16 * cost.flops[1])
    return StepCost(flops, (cost.saved_bytes[0] * text, cost.saved_bytes[1] * text), cost.cpu_seconds * at16)


def _steps(config: Mapping[str, Any], images: int) -> tuple[int, int]:
    """(images, client steps) of a cell: its clients' batches, cut at num-rounds' sampled clients."""
    clients = int(config["num-clients"])
    per_client = int(config["max-samples-per-client"])
    if per_client and clients:
        images = min(images, clients * per_client)
    batch = int(config["batch-size"])
    steps = math.ceil(images / batch) + clients // 2  # Dirichlet partitions end in partial batches
    rounds = int(config["num-rounds"])
    if rounds:  # a cell cut at num-rounds scores that many rounds of the sampled clients
        cap = rounds * max(1, math.ceil(max(clients, 1) * float(config["fraction"])))
        if steps > cap:
            images, steps = math.ceil(images * cap / steps), cap
    return images, steps


def cell_estimate(overrides: Mapping[str, Any], gpu: GpuClass | None) -> tuple[float, float | None] | str:
    """(minutes, peak GPU memory GB or None) of one cell (its run-config overrides) on a ``gpu`` (None: on the
    measured 2-core CPU, no GPU memory); or, when the measured costs do not cover the cell, the setting that is not
    covered. The testbed from its measured step; another CLIP from ViT-B/16's, scaled to its architecture
    (:func:`scaled_cost`)."""
    from fedrapp_app.config import DEFAULTS  # light

    config = {**DEFAULTS, **overrides}
    dataset, method, model = str(config["dataset"]), str(config["local-method"]), str(config["model"])
    if model == "testbed":
        if dataset != "testbed" or method not in TESTBED_METHODS:
            return f"model 'testbed' with dataset {dataset!r} and local-method {method!r}"
        _, steps = _steps(config, int(config["testbed-samples"]))
        return steps * TESTBED_STEP_SECONDS * int(config["batch-size"]) / BATCH / 60, None
    if dataset not in PAPER_SIZES:
        return f"dataset {dataset!r}"
    if method not in MEASURED:
        return f"local-method {method!r}"
    arch = architecture_of(model)
    if arch is None:
        return f"model {model!r} (its config.json is neither here nor known)"
    if int(config["batch-size"]) != BATCH or bool(config.get("csc")) or (gpu and str(config["precision"]) != "bf16"):
        return "batch-size, precision or csc other than 64, bf16, false"
    classes, images = PAPER_SIZES[dataset]
    images, steps = _steps(config, images)
    cost = scaled_cost(MEASURED[method], arch)
    if gpu is None:
        per_step = cost.cpu_seconds * cost.at(classes)[0] / cost.at(16)[0]
        return (steps * per_step + images * sum(MEASURED_DECODE)) / 60, None
    minutes = cell_minutes(
        cost,
        classes,
        images,
        steps,
        MEASURED_DECODE,
        sustained=gpu.peak_tflops * 1e12 * UTILIZATION,
        step_overhead=STEP_OVERHEAD,
        decode_workers=DECODE_WORKERS,
    )
    return minutes, cell_memory_gb(cost, classes, MEASURED_WEIGHTS * arch.ratios(VIT_B16)[2])


def wall_minutes(minutes: Sequence[float], gpus: int) -> float:
    """Minutes until ``gpus`` GPUs have run cells of these durations, one cell per GPU at a time, the longest first."""
    loads = [0.0] * max(1, gpus)
    for cell in sorted(minutes, reverse=True):
        heapq.heapreplace(loads, loads[0] + cell)
    return max(loads)


def _duration(minutes: float) -> str:
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"


def grid_estimate(cells: Sequence[Mapping[str, Any]], gpu_type: str, gpus: int = 1) -> str:
    """What ``--dry-run`` prints: the estimated device-hours of these cells (their overrides) on ``gpu_type`` (a
    :data:`GPU_CLASSES` key, or :data:`CPU`), the time they take on 1 device and on ``gpus`` (workers), the longest
    cell and the memory a cell needs, and which cells the measured costs do not cover."""
    gpu = None if gpu_type == CPU else GPU_CLASSES[gpu_type]
    unit = "GPU" if gpu else "worker"
    estimates = [cell_estimate(cell, gpu) for cell in cells]
    covered = [e for e in estimates if isinstance(e, tuple)]
    missing: dict[str, int] = {}
    for e in estimates:
        if isinstance(e, str):
            missing[e] = missing.get(e, 0) + 1
    where = (
        f"{gpu.name} ({gpu.peak_tflops:g} TFLOP/s dense bf16, {gpu.memory_gb:g} GB; {UTILIZATION:.0%} of the peak "
        f"and {STEP_OVERHEAD * 1000:.0f} ms per step assumed)"
        if gpu
        else "a 2-core CPU like the one measured (one worker: a cell on its 2 threads; the testbed: one thread)"
    )
    lines = [
        f"estimate on {where}; fedrapp_app/bench/estimate.py: step costs measured on ViT-B/16 (other CLIPs scaled "
        "by their architecture) and on the testbed:"
    ]
    if covered:
        minutes = [m for m, _ in covered]
        memory = max((gb for _, gb in covered if gb is not None), default=None)
        on = f"on 1 {unit} about {_duration(wall_minutes(minutes, 1))}"
        if gpus > 1:
            on += f", on {gpus} {unit}s about {_duration(wall_minutes(minutes, gpus))}"
        hours = f"{sum(minutes) / 60:.1f} {unit}-hours"
        line = f"  {len(covered)} of {len(cells)} cells: {hours}; {on} (longest cell {max(minutes):.1f} min)"
        if gpu is not None and memory is not None:
            fits = "" if memory <= gpu.memory_gb else f": more than the {gpu.memory_gb:g} GB of a card, it will not fit"
            line += f"; up to {memory:.1f} GB of GPU memory per cell{fits}"
        lines.append(line)
    if missing:
        listing = ", ".join(f"{setting} ({count})" for setting, count in missing.items())
        lines.append(
            f"  no estimate for {sum(missing.values())} cell(s): the measured costs cover CLIPs whose architecture "
            f"is known with {' or '.join(MEASURED)} on the paper's datasets (batch 64, bf16 on a GPU), and the "
            f"testbed with {', '.join(TESTBED_METHODS)}; not {listing}"
        )
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
    import torch

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
