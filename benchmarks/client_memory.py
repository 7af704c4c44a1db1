"""Peak resident memory (RSS) of a client process on CPU, per local method: ViT-B/16, 100 classes, batch 64.

Each method runs in a fresh Python process (as a deployed ClientApp does), which builds the frozen model,
the class-name buffers and a batch, then takes one step; the process reports its peak RSS (``VmHWM``)
after the model is ready and after the step (the peak is reset in between through ``/proc/self/clear_refs``,
so the step's own peak is seen). Linux only.

TPT runs with 3 augmented views instead of 63 but keeps the real run's chunk shapes: the image tower gets
256 views per call either way (64 images x 4 views instead of 4 images x 64 views) and the episodic text
pass 20 images x 100 classes = 2000 sequences per pass; only the [B, views, E] feature tensor is smaller
(64 x 60 x 512 floats = 7.5 MiB less than the real run).

    python benchmarks/client_memory.py                         # all methods, model built in memory
    python benchmarks/client_memory.py --model /tmp/vitb16     # loaded through load_clip (a saved folder)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def current_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def child(args: argparse.Namespace) -> None:
    """Build the client's model and batch, take one step, print a JSON line with the peaks."""
    import numpy as np
    import torch
    from PIL import Image

    from fedrapp_app.engine import PromptedCLIP, load_clip
    from fedrapp_app.methods import make_method

    sys.path.insert(0, str(HERE))
    from vitb16 import CALTECH101, vit_b16

    torch.set_num_threads(args.threads)
    classnames = CALTECH101[: args.classes]
    clip = load_clip(args.model, device="cpu") if args.model else vit_b16(classnames, tiny=args.tiny)
    pclip = PromptedCLIP(clip, classnames)
    rng = np.random.default_rng(0)
    pixels = pclip.preprocess(
        [Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)) for _ in range(args.images)]
    )
    params = (
        {"n_views": 3}
        if args.method.startswith("tpt")
        else ({"threshold": 0.0, "buffer_size": args.images} if args.method == "adaprompt" else {})
    )
    method = make_method(args.method, **params)
    prompt = method.initial_prompt(pclip)
    ready_peak, ready_rss = peak_rss_mib(), current_rss_mib()
    reset_peak()
    method.adapt(pclip, prompt, pixels, torch.Generator().manual_seed(0))
    print(
        json.dumps(
            {
                "method": args.method,
                "ready_peak_mib": ready_peak,
                "ready_rss_mib": ready_rss,
                "step_peak_mib": peak_rss_mib(),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["zeroshot", "adaprompt", "tpt-online", "tpt"])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--model", default="", help="a saved checkpoint folder (default: random ViT-B/16 in memory)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random CLIP (tests of this script)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.method = args.child
        child(args)
        return
    rows = []
    print(
        f"peak RSS per client process (MiB), CPU fp32, {args.classes} classes, batch {args.images}, "
        f"{'model ' + args.model if args.model else ('tiny CLIP' if args.tiny else 'random ViT-B/16')}"
    )
    print(f"{'method':12s}{'model ready':>14s}{'peak in step':>14s}{'step - ready':>14s}")
    for method in args.methods:
        command = [
            sys.executable,
            __file__,
            "--child",
            method,
            "--images",
            str(args.images),
            "--classes",
            str(args.classes),
            "--threads",
            str(args.threads),
        ]
        command += ["--model", args.model] if args.model else []
        command += ["--tiny"] if args.tiny else []
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"{method:12s}{row['ready_peak_mib']:14.0f}{row['step_peak_mib']:14.0f}"
            f"{row['step_peak_mib'] - row['ready_rss_mib']:14.0f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
