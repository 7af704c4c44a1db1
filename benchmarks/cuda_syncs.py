"""Host-device waits per client step, counted on the CPU under the CUDA placement emulation (no GPU needed).

    python benchmarks/cuda_syncs.py                       # every method, the shipped testbed model, batch 64
    python benchmarks/cuda_syncs.py --methods tpt --json syncs.json

Each method runs two steps on one batch of testbed images (the first builds the per-process caches, such as
the class-name buffers, and fills AdaPrompt's buffer), under
:class:`fedrapp_app.testing.cuda_emulation.CudaPlacement` with the model marked as living on ``cuda:0``.
Reported for the second step (the steady state): device-to-host reads (``.item()``, ``float()``, ``.cpu()``,
``nonzero``, ...) and blocking host-to-device copies, each of which makes the host wait for the GPU's queue
to drain; their sum per step and per image; and the ops CUDA would refuse (must be 0). The counts depend on
the code path, not on the model's size (no per-layer sync), so the small testbed model gives the counts of a
ViT-B/16 run with the same method parameters.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.methods import make_method
from fedrapp_app.testbed.measure import make_stream, pixel_values
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE
from fedrapp_app.testing.cuda_emulation import CudaPlacement

#: (label, method, parameters): every local method, the TPT variants and class-specific contexts.
VARIANTS = (
    ("zeroshot", "zeroshot", {}),
    ("adaprompt", "adaprompt", {"threshold": 0.0}),
    ("adaprompt+csc", "adaprompt", {"threshold": 0.0, "csc": True}),
    ("im", "im", {}),
    ("im+csc", "im", {"csc": True}),
    ("tpt", "tpt", {}),
    ("tpt+augmix", "tpt", {"augmix": True}),
    ("tpt+csc", "tpt", {"csc": True}),
    ("tpt-online", "tpt-online", {}),
    ("tpt-online+augmix", "tpt-online", {"augmix": True}),
)


def count_step(
    clip, label: str, name: str, params: dict, pixels: torch.Tensor, precision: str, top: int = 6
) -> dict[str, object]:
    """Waits and violations of a method's second step on ``pixels``, in one process-like session: the first
    step builds the per-process caches (class-name buffers, constant text features) and fills buffers."""
    method = make_method(name, params)
    tracker = CudaPlacement()
    with tracker:
        pclip = PromptedCLIP(tracker.clip(clip, precision), CLASSNAMES, HAND_TEMPLATE)
        adaptation = method.adapt(pclip, method.initial_prompt(pclip), pixels, torch.Generator().manual_seed(0))
        first = tracker.counts()
        del tracker.syncs[:], tracker.uploads[:]
        started = time.perf_counter()
        method.adapt(pclip, adaptation.prompt, pixels, torch.Generator().manual_seed(1))
        seconds = time.perf_counter() - started
    counts = tracker.counts()
    return {
        "variant": label,
        "images": len(pixels),
        "syncs": counts["syncs"],
        "uploads": counts["uploads"],
        "waits": counts["waits"],
        "waits_per_image": counts["waits"] / len(pixels),
        "violations": counts["violations"],
        "first_step_waits": first["waits"],
        "sites": tracker.by_site().most_common(top),
        "emulated_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    parser.add_argument("--methods", nargs="+", default=[v[0] for v in VARIANTS], choices=[v[0] for v in VARIANTS])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clip = load_clip("testbed", device="cpu")
    stream = make_stream("clean", 0, 0, args.batch)
    pixels = pixel_values(PromptedCLIP(clip, CLASSNAMES, HAND_TEMPLATE), stream.images)
    print(
        f"testbed model, {len(CLASSNAMES)} classes, batch {args.batch}, emulated cuda:0 with CUDA {args.precision} "
        f"autocast lists, torch {torch.__version__}; counts of the second step",
        flush=True,
    )
    print(f"{'variant':18s} {'syncs':>6s} {'uploads':>8s} {'waits':>6s} {'per image':>9s} {'violations':>10s}")
    rows = []
    for label, name, params in VARIANTS:
        if label not in args.methods:
            continue
        row = count_step(clip, label, name, params, pixels, args.precision)
        rows.append(row)
        print(
            f"{label:18s} {row['syncs']:6d} {row['uploads']:8d} {row['waits']:6d} {row['waits_per_image']:9.2f} "
            f"{row['violations']:10d}",
            flush=True,
        )
        for site, count in row["sites"]:
            print(f"{'':20s}{count:6d}  {site}")
    print(f"violations in all: {int(np.sum([r['violations'] for r in rows]))}")
    if args.json:
        args.json.write_text(json.dumps({"batch": args.batch, "precision": args.precision, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
