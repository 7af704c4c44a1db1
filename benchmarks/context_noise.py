"""How much isotropic noise in the context vectors the testbed's CLIP tolerates (issue 38's caveat): the accuracy
of AdaPrompt's initial prompt (shared context, and class-specific for IM+CSC) with N(0, sigma^2) added to every
context coordinate, on clean renders and on the default run's shift domains, beside the context's own scale.

    python benchmarks/context_noise.py            # the testbed; ~1 min on 2 CPU cores

Client-level differential privacy adds noise of this kind to every uploaded prompt (docs/privacy.md: 0.23 per
coordinate for the testbed's shared context, 1.25 for a class-specific one, at epsilon 8 over 16 uploads, before a
rule averages the clients); a model that ignores it pays
little accuracy for privacy. Prints a markdown table and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.methods import make_method
from fedrapp_app.testbed.measure import make_stream, pixel_values
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE

DOMAINS = (("clean", 0), ("gaussian_noise", 1), ("blur", 2), ("contrast", 2), ("color_cast", 2))
SIGMAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def accuracy(
    pclip: PromptedCLIP, blocks: list[torch.Tensor], image_features: torch.Tensor, labels: np.ndarray
) -> float:
    """Top-1 accuracy [0, 1] of ``blocks`` on precomputed image features [N, E]."""
    with torch.no_grad():
        logits = pclip.logits(image_features, pclip.text_features(blocks))
    return float((logits.argmax(-1).cpu().numpy() == labels).mean())


def dp_noise(dim: int, epsilon: float = 8.0, uploads: int = 16, scalars: int = 2) -> dict[str, float]:
    """The noise dp adds to one release (docs/privacy.md) at the default clip: per prompt coordinate and per scalar
    of range 1, for a prompt of ``dim`` numbers and ``scalars`` released scalars."""
    from fedrapp_app.config import DEFAULTS
    from fedrapp_app.privacy.accountant import noise_for_budget
    from fedrapp_app.privacy.mechanism import calibrate

    z = noise_for_budget(epsilon, DEFAULTS["dp-delta"], uploads)
    calibration = calibrate(z, DEFAULTS["dp-clip"], dim, {f"s{i}": (0.0, 1.0) for i in range(scalars)})
    return {
        "noise_multiplier": z,
        "prompt_sigma": calibration.prompt_sigma,
        "scalar_sigma": calibration.scalar_sigma["s0"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="testbed")
    parser.add_argument("--samples", type=int, default=512, help="renders per domain")
    parser.add_argument("--draws", type=int, default=3, help="noise draws per sigma")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/context_noise.json"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    pclip = PromptedCLIP(load_clip(args.model, device="cpu"), CLASSNAMES, template=HAND_TEMPLATE)
    features = {}
    for domain, severity in DOMAINS:
        stream = make_stream(domain, severity, args.seed, args.samples)
        with torch.no_grad():
            features[domain] = (pclip.image_features(pixel_values(pclip, stream.images)), stream.labels)
    results = []
    for name, params in (("shared context", {}), ("class-specific context", {"csc": True})):
        blocks = make_method("adaprompt", params).initial_prompt(pclip)
        scale = float(torch.cat([b.flatten() for b in blocks]).pow(2).mean().sqrt())
        dim = sum(b.numel() for b in blocks)
        for epsilon in (8.0, 1.0):
            noise = dp_noise(dim, epsilon)
            print(f"{name} ({dim} numbers), dp at epsilon {epsilon:g} over 16 uploads: noise multiplier "
                  f"{noise['noise_multiplier']:.2f}, {noise['prompt_sigma']:.3f} per coordinate, "
                  f"{noise['scalar_sigma']:.1f} per scalar of range 1 (two scalars)")  # fmt: skip
        generator = torch.Generator().manual_seed(args.seed)
        for sigma in SIGMAS:
            row = {"context": name, "context_rms": scale, "sigma": sigma}
            for domain, (image_features, labels) in features.items():
                draws = [
                    accuracy(pclip, [b + sigma * torch.randn(b.shape, generator=generator) for b in blocks],
                             image_features, labels)
                    for _ in range(args.draws if sigma > 0 else 1)
                ]  # fmt: skip
                row[domain] = float(np.mean(draws))
            results.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "samples": args.samples, "results": results}, indent=1))
    domains = [d for d, _ in DOMAINS]
    print(
        f"model {args.model}: context RMS "
        + ", ".join(f"{r['context']} {r['context_rms']:.3f}" for r in results[:: len(SIGMAS)])
    )  # noqa: E501
    print("| context | sigma | " + " | ".join(domains) + " |")
    print("|---|---|" + "---|" * len(domains))
    for row in results:
        print(f"| {row['context']} | {row['sigma']:g} | " + " | ".join(f"{100 * row[d]:.1f}" for d in domains) + " |")


if __name__ == "__main__":
    main()
