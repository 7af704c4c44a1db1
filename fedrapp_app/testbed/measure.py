"""Measure the testbed through the product's own engine and local methods, and print the tables.

    python -m fedrapp_app.testbed.measure                  # the README's numbers (seeds 0 1 2)
    python -m fedrapp_app.testbed.measure --seeds 100 101 102 --set adaprompt.lr=0.01   # tuning seeds

1. Zero-shot accuracy of the hand prompt "a photo of a {}." on clean renders.
2. The same under every corruption family and severity.
3. Online accuracy on shifted streams (one stream per domain and seed, batch 64, labels uniform or
   Dirichlet-skewed): zero-shot, the frozen initial prompts of each method (no update), and each
   test-time method adapting along the stream. Every sample is predicted once, after the method's step
   on its batch (SPEC section 7).

Everything goes through ``load_clip`` / ``PromptedCLIP`` / ``make_method``: the numbers are the
product's, not a side implementation's. Labels only score predictions.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.methods import make_method
from fedrapp_app.testbed.corruptions import CORRUPTIONS, DEFAULT_DOMAINS, MAX_SEVERITY, corrupt
from fedrapp_app.testbed.pretrain import PRETRAIN_SEED_OFFSET
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE, render

CLEAN = "clean"


@dataclass(frozen=True)
class Stream:
    """One labelled test stream: uint8 images [N, S, S, 3] and int64 labels [N], in stream order."""

    domain: str
    severity: int
    labels: np.ndarray
    images: np.ndarray


def make_stream(domain: str, severity: int, seed: int, size: int, label_skew: float = 0.0) -> Stream:
    """A seeded stream of ``size`` renders of one domain (``"clean"`` or a corruption at ``severity``).

    ``label_skew`` > 0 draws the class mix from Dirichlet(label_skew) (smaller = more skewed); 0 means
    uniform labels. Image seeds stay below the pretraining range, so no stream image was trained on.
    """
    if size < 1:
        raise ValueError(f"stream size must be >= 1, got {size}")
    if domain != CLEAN and domain not in CORRUPTIONS:
        raise ValueError(f"unknown domain {domain!r}; use {CLEAN!r} or one of {', '.join(CORRUPTIONS)}")
    code = 0 if domain == CLEAN else 1 + CORRUPTIONS.index(domain)
    rng = np.random.default_rng([seed, code, severity, round(label_skew * 1000)])
    num_classes = len(CLASSNAMES)
    if label_skew > 0:
        labels = rng.choice(num_classes, size, p=rng.dirichlet(np.full(num_classes, label_skew)))
    else:
        labels = rng.integers(0, num_classes, size)
    image_seeds = rng.integers(0, PRETRAIN_SEED_OFFSET // 2, size)
    images = render(labels, image_seeds)
    if domain != CLEAN:
        images = corrupt(images, domain, severity, image_seeds)
    return Stream(domain, severity, labels.astype(np.int64), images)


def pixel_values(pclip: PromptedCLIP, images: np.ndarray) -> torch.Tensor:
    """uint8 [N, S, S, 3] -> Tensor[N, 3, H, W] through the checkpoint's processor (the product path)."""
    return pclip.preprocess([Image.fromarray(image) for image in images])


def zero_shot_accuracy(pclip: PromptedCLIP, pixels: torch.Tensor, labels: np.ndarray) -> float:
    """Top-1 accuracy of the hand prompt ``pclip.template``."""
    logits = pclip.logits(pclip.image_features(pixels), pclip.hard_prompt_features().unsqueeze(0))
    return float((logits.argmax(-1).cpu().numpy() == labels).mean())  # .cpu(): the model may be on a GPU


def frozen_init_accuracy(pclip: PromptedCLIP, method_name: str, params: dict, pixels, labels) -> float:
    """Accuracy of a method's initial prompt(s) without any update (its own zero-shot reference)."""
    method = make_method(method_name, params)
    with torch.no_grad():
        text = pclip.text_features(method.initial_prompt(pclip))
    logits = pclip.logits(pclip.image_features(pixels), text)
    return float((logits.argmax(-1).cpu().numpy() == labels).mean())


def online_accuracy(
    pclip: PromptedCLIP,
    method_name: str,
    params: dict,
    pixels: torch.Tensor,
    labels: np.ndarray,
    batch_size: int,
    seed: int,
) -> float:
    """Online top-1 accuracy of ``method_name`` along one stream (predict after each batch's step)."""
    method = make_method(method_name, params)
    prompt = method.initial_prompt(pclip)
    generator = torch.Generator().manual_seed(seed)
    predictions = []
    for start in range(0, pixels.shape[0], batch_size):
        adaptation = method.adapt(pclip, prompt, pixels[start : start + batch_size], generator)
        prompt = adaptation.prompt
        predictions.append(adaptation.predictions)
    return float((torch.cat(predictions).numpy() == labels).mean())


def _mean_std(values: Sequence[float]) -> str:
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}"


def parse_overrides(items: Sequence[str]) -> dict[str, dict]:
    """``["adaprompt.lr=0.01", ...]`` -> ``{"adaprompt": {"lr": 0.01}}`` (values parsed as JSON if they can be)."""
    overrides: dict[str, dict] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        method, dot, param = key.partition(".")
        if not sep or not dot:
            raise ValueError(f"--set expects METHOD.PARAM=VALUE (e.g. adaprompt.lr=0.01), got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        overrides.setdefault(method, {})[param] = value
    return overrides


def parse_domains(items: Sequence[str]) -> list[tuple[str, int]]:
    """``["blur:2", ...]`` -> ``[("blur", 2), ...]``."""
    domains = []
    for item in items:
        name, _, severity = item.partition(":")
        if name not in CORRUPTIONS or not severity.isdigit() or not 1 <= int(severity) <= MAX_SEVERITY:
            raise ValueError(
                f"domain {item!r}: expected NAME:SEVERITY with NAME in {', '.join(CORRUPTIONS)} "
                f"and SEVERITY in 1..{MAX_SEVERITY}"
            )
        domains.append((name, int(severity)))
    return domains


def measure(
    pclip: PromptedCLIP,
    *,
    seeds: Sequence[int],
    domains: Sequence[tuple[str, int]],
    methods: Sequence[str],
    overrides: dict[str, dict],
    stream_size: int,
    batch_size: int,
    label_skew: float,
    clean_size: int,
    shift_size: int,
    log=print,
) -> dict:
    """Run the three measurements and return them as a JSON-ready dict (percent values in [0, 1])."""
    results: dict = {"seeds": list(seeds), "label_skew": label_skew, "stream_size": stream_size}
    clean = []
    for seed in seeds:
        stream = make_stream(CLEAN, 0, seed, clean_size)
        clean.append(zero_shot_accuracy(pclip, pixel_values(pclip, stream.images), stream.labels))
    results["clean_zero_shot"] = clean
    log(f"\n## Zero-shot, hand prompt {pclip.template!r}, clean renders ({clean_size} per seed)\n")
    log(f"clean: {_mean_std(clean)}")

    if shift_size > 0:
        log(f"\n## Zero-shot under shift, hand prompt ({shift_size} images per cell and seed)\n")
        header = " | ".join(f"severity {s}" for s in range(1, MAX_SEVERITY + 1))
        log(f"| corruption | {header} |\n|---|{'---|' * MAX_SEVERITY}")
        table = {}
        for name in CORRUPTIONS:
            cells = []
            for severity in range(1, MAX_SEVERITY + 1):
                accs = []
                for seed in seeds:
                    stream = make_stream(name, severity, seed, shift_size)
                    accs.append(zero_shot_accuracy(pclip, pixel_values(pclip, stream.images), stream.labels))
                table[f"{name}:{severity}"] = accs
                cells.append(_mean_std(accs))
            log(f"| {name} | {' | '.join(cells)} |")
        results["shift_zero_shot"] = table

    skew = "uniform labels" if label_skew <= 0 else f"Dirichlet({label_skew}) label skew"
    log(f"\n## Online accuracy on shifted streams ({stream_size} images, batch {batch_size}, {skew})\n")
    columns = ["zero-shot"] + [f"{m} frozen init" for m in methods] + [f"{m} online" for m in methods]
    log(f"| domain | {' | '.join(columns)} |\n|---|{'---|' * len(columns)}")
    online: dict[str, dict[str, list[float]]] = {}
    for name, severity in domains:
        row = {column: [] for column in columns}
        for seed in seeds:
            stream = make_stream(name, severity, seed, stream_size, label_skew)
            pixels = pixel_values(pclip, stream.images)
            row["zero-shot"].append(zero_shot_accuracy(pclip, pixels, stream.labels))
            for method in methods:
                params = overrides.get(method, {})
                row[f"{method} frozen init"].append(frozen_init_accuracy(pclip, method, params, pixels, stream.labels))
                row[f"{method} online"].append(
                    online_accuracy(pclip, method, params, pixels, stream.labels, batch_size, seed)
                )
        online[f"{name}:{severity}"] = row
        log(f"| {name}@{severity} | {' | '.join(_mean_std(row[c]) for c in columns)} |")
    means = {c: [float(np.mean([online[d][c][i] for d in online])) for i in range(len(seeds))] for c in columns}
    log(f"| **mean** | {' | '.join(_mean_std(means[c]) for c in columns)} |")
    results["online"] = online
    results["online_mean"] = means
    results["overrides"] = overrides
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="testbed", help="'testbed' (shipped), a folder or a Hub id")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="report 0 1 2; tune on >= 100")
    parser.add_argument("--domains", nargs="+", default=[f"{n}:{s}" for n, s in DEFAULT_DOMAINS])
    parser.add_argument(
        "--methods", nargs="+", default=["adaprompt"], help="local methods (tpt-online: 64 views an image, slow)"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="METHOD.PARAM=VALUE")
    parser.add_argument("--stream-size", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--label-skew", type=float, default=0.0, help="Dirichlet alpha; 0 = uniform labels")
    parser.add_argument("--clean-size", type=int, default=1500)
    parser.add_argument("--shift-size", type=int, default=600, help="0 skips the corruption table")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    pclip = PromptedCLIP(load_clip(args.model, device="cpu"), CLASSNAMES, HAND_TEMPLATE)
    results = measure(
        pclip,
        seeds=args.seeds,
        domains=parse_domains(args.domains),
        methods=args.methods,
        overrides=parse_overrides(args.overrides),
        stream_size=args.stream_size,
        batch_size=args.batch_size,
        label_skew=args.label_skew,
        clean_size=args.clean_size,
        shift_size=args.shift_size,
        log=lambda line: print(line, flush=True),
    )
    results["seconds"] = time.perf_counter() - started
    print(f"\n({results['seconds']:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
