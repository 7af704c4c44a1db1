"""Profile one local-method step with the torch profiler: where the time goes (image tower, text pass, rest).

    python benchmarks/profile_step.py --method adaprompt                   # ViT-B/16, 100 classes, batch 64
    python benchmarks/profile_step.py --method tpt-online --images 2       # TPT: 2 images x 64 views
    python benchmarks/profile_step.py --method adaprompt --no-shared-prefix --rows 20

The engine labels its two heavy regions (``fedrapp.image_tower``, ``fedrapp.text_pass``; the backward of
a text pass shows up as autograd ops outside them). The script prints the share of each region in the
step's wall time and the top ops by self CPU time. One warm-up step runs first (as a client's round 2+).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.profiler import ProfilerActivity, profile

from fedrapp_app.engine import PromptedCLIP
from fedrapp_app.methods import make_method

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import CALTECH101, load_average, vit_b16  # noqa: E402

REGIONS = ("fedrapp.image_tower", "fedrapp.text_pass")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="adaprompt", choices=["zeroshot", "adaprompt", "tpt", "tpt-online"])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--tpt-views", type=int, default=63)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--no-shared-prefix", action="store_true")
    parser.add_argument("--rows", type=int, default=12, help="top ops to print")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trace", type=Path, default=None, help="also write a Chrome trace here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    classnames = CALTECH101[: args.classes]
    pclip = PromptedCLIP(vit_b16(classnames, precision=args.precision), classnames)
    pclip.shared_prefix = not args.no_shared_prefix
    params = (
        {"n_views": args.tpt_views}
        if args.method.startswith("tpt")
        else ({"threshold": 0.0, "buffer_size": args.images} if args.method == "adaprompt" else {})
    )
    rng = np.random.default_rng(0)
    pixels = pclip.preprocess(
        [Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)) for _ in range(args.images)]
    )

    def step() -> None:
        method = make_method(args.method, **params)
        method.adapt(pclip, method.initial_prompt(pclip), pixels, torch.Generator().manual_seed(0))

    step()  # warm-up
    load = load_average()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    print(
        f"{args.method}: {args.images} images, {args.classes} classes, {args.precision}, "
        f"shared prefix {not args.no_shared_prefix}, {torch.get_num_threads()} threads; step {wall:.2f} s "
        f"under the profiler; load {load:.2f} -> {load_average():.2f}"
    )
    for region in REGIONS:
        total = sum(e.cpu_time_total for e in events if e.key == region) / 1e6
        count = sum(e.count for e in events if e.key == region)
        print(f"  {region:22s} {total:7.2f} s  {100 * total / wall:5.1f}% of the step  ({count} calls)")
    # the backward pass runs outside the labelled regions, one engine call per autograd node
    backward = sum(e.cpu_time_total for e in events if e.key.startswith("autograd::engine::evaluate_function"))
    print(f"  {'backward (autograd)':22s} {backward / 1e6:7.2f} s  {100 * backward / 1e6 / wall:5.1f}% of the step")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if args.trace:
        prof.export_chrome_trace(str(args.trace))


if __name__ == "__main__":
    main()
