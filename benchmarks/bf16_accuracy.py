"""Accuracy impact of ``precision = "bf16"`` (bf16 autocast) on the CPU, with the shipped testbed model.

    python benchmarks/bf16_accuracy.py                       # clean + the default shift domains, 512 images each
    python benchmarks/bf16_accuracy.py --size 256 --methods zeroshot adaprompt

The only trained CLIP here is the testbed's (random weights say nothing about accuracy): for each domain,
one seeded stream is predicted in fp32 and under bf16 autocast through the product path (``load_clip``,
``PromptedCLIP``, the local methods). Reported: zero-shot accuracy in both precisions, the share of
predictions that agree, and the online accuracy of each adapting method along the stream (batch 64).
bf16 rounds activations to 8 mantissa bits, so this is the check that a faster CPU run does not change the
results that matter; a larger model may be more (or less) sensitive, so the README keeps fp32 the default.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.testbed.corruptions import DEFAULT_DOMAINS
from fedrapp_app.testbed.measure import CLEAN, make_stream, online_accuracy, pixel_values
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import load_average  # noqa: E402

METHOD_PARAMS = {"adaprompt": {}, "tpt-online": {"n_views": 15}, "tpt": {"n_views": 15}}


def domains() -> list[tuple[str, int]]:
    """Clean renders, then the testbed's default shift domains (name, severity)."""
    return [(CLEAN, 0), *((str(name), int(severity)) for name, severity in DEFAULT_DOMAINS)]


def zero_shot_predictions(pclip: PromptedCLIP, pixels: torch.Tensor) -> np.ndarray:
    """Hand-prompt predictions of Tensor[N, 3, H, W] as an int64 array [N] (read back from the model's device)."""
    logits = pclip.logits(pclip.image_features(pixels), pclip.hard_prompt_features().unsqueeze(0))
    return logits.argmax(-1).cpu().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="testbed")
    parser.add_argument("--size", type=int, default=512, help="images per domain stream")
    parser.add_argument("--methods", nargs="+", default=["zeroshot", "adaprompt"], choices=["zeroshot", *METHOD_PARAMS])
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clips = {
        precision: PromptedCLIP(load_clip(args.model, device="cpu", precision=precision), CLASSNAMES, HAND_TEMPLATE)
        for precision in ("fp32", "bf16")
    }
    print(f"model {args.model}, CPU, {args.size} images per domain, seed {args.seed}; load {load_average():.2f}")
    rows = []
    for domain, severity in domains():
        stream = make_stream(domain, severity, args.seed, args.size)
        row: dict = {"domain": f"{domain}:{severity}" if severity else domain}
        predictions = {}
        for precision, pclip in clips.items():
            pixels = pixel_values(pclip, stream.images)
            predictions[precision] = zero_shot_predictions(pclip, pixels)
            row[f"zeroshot_{precision}"] = float((predictions[precision] == stream.labels).mean())
            for method in args.methods:
                if method != "zeroshot":
                    row[f"{method}_{precision}"] = online_accuracy(
                        pclip, method, METHOD_PARAMS[method], pixels, stream.labels, 64, args.seed
                    )
        row["zeroshot_agreement"] = float((predictions["fp32"] == predictions["bf16"]).mean())
        rows.append(row)
        cells = "  ".join(f"{m} {100 * row[f'{m}_fp32']:.1f} / {100 * row[f'{m}_bf16']:.1f}" for m in args.methods)
        agreement = 100 * row["zeroshot_agreement"]
        print(f"{row['domain']:18s} (fp32 / bf16 %)  {cells}  zero-shot agreement {agreement:.1f}%", flush=True)
    for method in args.methods:
        fp32 = np.mean([r[f"{method}_fp32"] for r in rows])
        bf16 = np.mean([r[f"{method}_bf16"] for r in rows])
        print(
            f"mean over domains  {method}: fp32 {100 * fp32:.2f}%  bf16 {100 * bf16:.2f}%  "
            f"difference {100 * (bf16 - fp32):+.2f} points"
        )
    print(f"load after: {load_average():.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
