"""fp16 autocast against fp32: the prompt's gradient and update, with and without loss scaling, on the CPU.

    python benchmarks/fp16_gradients.py                          # testbed model and random ViT-B/16, every method
    python benchmarks/fp16_gradients.py --models testbed --json fp16.json

Under ``precision = "fp16"`` the text tower's matmuls run in float16 on a GPU, and so does their backward
pass. This script runs each local method's real step (``method.adapt``) under an emulation of CUDA's autocast
op lists (:class:`~fedrapp_app.testing.cuda_emulation.CudaAutocast`; CPU autocast has other lists), once in
fp32 and once in fp16 per loss scale S (S = 1: no scaling, what the methods did before; 2^12; 2^16: the
default of :class:`~fedrapp_app.methods.scaling.LossScaler`), from the same prompt on the same batch. Reported:

* ``below normal``: in the fp32 run, the share of the nonzero gradient entries at the outputs of the ops that
  fp16 autocast runs in float16 (linear, einsum, attention, ...) whose magnitude, times S, is below float16's
  smallest normal number 2^-14 (they lose precision in fp16), and ``flushed``: below 2^-25, where they round
  to 0;
* ``zero``: the share of the prompt gradient's entries that are exactly 0 in fp16 but not in fp32;
* ``grad cos`` / ``grad ratio``: cosine and norm ratio of the fp16 prompt gradient (of the first AdamW step)
  against fp32's;
* ``update cos`` / ``update ratio``: the same for the step's change of the prompt (tuned - received);
* ``retries``: backward passes redone at half the scale after an overflow (S > 1).

Models: the shipped testbed CLIP (trained weights) and a random-weight CLIP with ViT-B/16's sizes and 100
classes (``benchmarks/vitb16.py``; gradient sizes depend on the weights, so both are shown). fp16 matmuls are
slow on a CPU: the ViT-B/16 rows take several minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from torch import Tensor

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.methods import make_method
from fedrapp_app.methods.scaling import LossScaler
from fedrapp_app.testbed.measure import make_stream, pixel_values
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE
from fedrapp_app.testing.cuda_emulation import emulated_clip

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import CALTECH101, vit_b16  # noqa: E402

FP16_MIN_NORMAL = 2.0**-14
FP16_FLUSH = 2.0**-25  # half the smallest subnormal 2^-24: smaller magnitudes round to 0
SCALES = (1.0, 2.0**12, 2.0**16)
METHOD_MODULES = ("fedrapp_app.methods.tpt", "fedrapp_app.methods.adaprompt", "fedrapp_app.methods.im")


def variants(batch: int, views: int) -> dict[str, tuple[str, dict]]:
    """label -> (method, parameters); AdaPrompt's buffer is the batch, so its first step updates."""
    return {
        "tpt": ("tpt", {"n_views": views}),
        "tpt+csc": ("tpt", {"n_views": views, "csc": True}),
        "tpt-online": ("tpt-online", {"n_views": views}),
        "adaprompt": ("adaprompt", {"threshold": 0.0, "buffer_size": batch}),
        "im": ("im", {}),
    }


@contextlib.contextmanager
def first_step_gradients(store: list[Tensor]) -> Iterator[None]:
    """Record the parameters' gradients at the first AdamW step taken inside (float32 copies)."""
    original = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        if not store:
            store.extend(p.grad.detach().float().clone() for g in self.param_groups for p in g["params"])
        return original(self, *args, **kwargs)

    with mock.patch.object(torch.optim.AdamW, "step", step):
        yield


@contextlib.contextmanager
def loss_scale(scale: float | None) -> Iterator[None]:
    """Inside, the methods scale fp16 losses by ``scale`` (None: their default; 1: no scaling at all)."""
    if scale is None:
        yield
        return

    def scaler_for(precision, saved=None, prefix="scaler."):
        return LossScaler(enabled=precision == "fp16" and scale > 1, init_scale=scale)

    with contextlib.ExitStack() as stack:
        for module in METHOD_MODULES:
            stack.enter_context(mock.patch(f"{module}.scaler_for", scaler_for))
        yield


class GradientProbe:
    """Counts, over every gradient reaching a lower-precision op's output, entries below thresholds."""

    def __init__(self, scales: tuple[float, ...]) -> None:
        self.scales = scales
        self.nonzero = 0
        self.below_normal = dict.fromkeys(scales, 0)
        self.flushed = dict.fromkeys(scales, 0)

    def __call__(self, output: Tensor) -> None:
        if output.requires_grad:
            output.register_hook(self._count)

    def _count(self, grad: Tensor) -> None:
        magnitude = grad.detach().abs().double()
        magnitude = magnitude[magnitude > 0]
        self.nonzero += magnitude.numel()
        for scale in self.scales:
            self.below_normal[scale] += int((magnitude * scale < FP16_MIN_NORMAL).sum())
            self.flushed[scale] += int((magnitude * scale < FP16_FLUSH).sum())


def run_step(clip, classnames, template, method_name, params, pixels, precision, scale=None, probe=None):
    """One ``adapt`` of a fresh method under emulated CUDA autocast -> (first-step gradients, update, stats)."""
    pclip = PromptedCLIP(emulated_clip(clip, precision, probe=probe), classnames, template)
    method = make_method(method_name, params)
    received = method.initial_prompt(pclip)
    grads: list[Tensor] = []
    with first_step_gradients(grads), loss_scale(scale):
        adaptation = method.adapt(pclip, received, pixels, torch.Generator().manual_seed(0))
    update = torch.cat([(a - r).flatten() for a, r in zip(adaptation.prompt, received, strict=True)])
    return torch.cat([g.flatten() for g in grads]), update, adaptation.stats


def compare(test: Tensor, reference: Tensor) -> tuple[float, float]:
    """(cosine, norm ratio) of ``test`` against ``reference``."""
    cosine = torch.nn.functional.cosine_similarity(test.double(), reference.double(), dim=0)
    return float(cosine), float(test.double().norm() / reference.double().norm())


def measure(clip, classnames, template, label, method_name, params, pixels) -> list[dict]:
    """Rows of one method: S = 1, 2^12, 2^16 against the fp32 reference."""
    probe = GradientProbe(SCALES)
    ref_grad, ref_update, _ = run_step(clip, classnames, template, method_name, params, pixels, "fp32", probe=probe)
    rows = []
    for scale in SCALES:
        grad, update, stats = run_step(clip, classnames, template, method_name, params, pixels, "fp16", scale)
        grad_cos, grad_ratio = compare(grad, ref_grad)
        update_cos, update_ratio = compare(update, ref_update)
        rows.append(
            {
                "variant": label,
                "scale": scale,
                "below_normal": probe.below_normal[scale] / max(probe.nonzero, 1),
                "flushed": probe.flushed[scale] / max(probe.nonzero, 1),
                "zero": float(((grad == 0) & (ref_grad != 0)).double().mean()),
                "grad_cos": grad_cos,
                "grad_ratio": grad_ratio,
                "update_cos": update_cos,
                "update_ratio": update_ratio,
                "retries": stats.get("loss_scale_retries", 0.0),  # overflows retried at half the scale
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["testbed", "vitb16"], choices=["testbed", "vitb16"])
    parser.add_argument("--methods", nargs="+", default=list(variants(1, 1)), choices=list(variants(1, 1)))
    parser.add_argument("--classes", type=int, default=100, help="ViT-B/16: class names (of Caltech-101)")
    parser.add_argument("--batch", type=int, default=8, help="images per step (TPT: --tpt-images)")
    parser.add_argument("--tpt-images", type=int, default=2)
    parser.add_argument("--views", type=int, default=7, help="TPT augmented views per image")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(
        f"torch {torch.__version__}, CUDA autocast lists emulated on the CPU; batch {args.batch} "
        f"(TPT {args.tpt_images} images, 1 + {args.views} views); first AdamW step's gradient",
        flush=True,
    )
    header = (
        f"{'model':8s} {'variant':11s} {'S':>6s} {'below normal':>12s} {'flushed':>8s} {'zero':>6s} "
        f"{'grad cos':>8s} {'ratio':>6s} {'update cos':>10s} {'ratio':>6s} {'retries':>7s}"
    )
    print(header)
    rows = []
    for model in args.models:
        if model == "testbed":
            clip, classnames, template = load_clip("testbed", device="cpu"), CLASSNAMES, HAND_TEMPLATE
            stream = make_stream("clean", 0, 0, args.batch)
            pixels = pixel_values(PromptedCLIP(clip, classnames, template), stream.images)
        else:
            classnames, template = CALTECH101[: args.classes], "a photo of a {}."
            clip = vit_b16(classnames)
            size = clip.model.config.vision_config.image_size
            pixels = torch.randn(args.batch, 3, size, size, generator=torch.Generator().manual_seed(0))
        for label in args.methods:
            method_name, params = variants(args.batch, args.views)[label]
            batch = pixels[: args.tpt_images] if method_name.startswith("tpt") else pixels
            for row in measure(clip, classnames, template, label, method_name, params, batch):
                row["model"] = model
                rows.append(row)
                print(
                    f"{model:8s} {label:11s} 2^{int(np.log2(row['scale'])):<4d} {100 * row['below_normal']:11.1f}% "
                    f"{100 * row['flushed']:7.1f}% {100 * row['zero']:5.1f}% {row['grad_cos']:8.3f} "
                    f"{row['grad_ratio']:6.3f} {row['update_cos']:10.3f} {row['update_ratio']:6.3f} "
                    f"{int(row['retries']):7d}",
                    flush=True,
                )
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
