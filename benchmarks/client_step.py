"""One local-method step per method on the ViT-B/16 architecture (random weights, CPU): ours vs naive.

Ours: the methods as shipped (text pass cut after the batch's last EOS, each shared context's ``[SOS] ctx``
prefix computed once for all classes, AdaPrompt's frozen labeller cached per process, every image or view
through the image tower once per step, episodic TPT as one stacked step). Naive: the reference codes' way
of doing the same step: every text sequence padded to the full 77 positions, fp32, one image at a time
for TPT, and image features recomputed wherever they are used (pseudo-labels, predictions, buffered
samples), the labeller's and the hard prompt's text features recomputed every step. Both give the same
predictions (the column "same predictions" checks it).

Realistic size (the default): 100 classes (Caltech-101's names), a batch of 64, TPT with 63 augmented
views + the original per image. TPT's cost is per image (64 views of ViT-B/16 are ~15 s on 2 cores), so
TPT and TPT-online are timed on ``--tpt-images`` images and the per-image time is extrapolated to the
batch (linear in images: each image costs one tower pass of its views and its own text pass; printed as
"extrapolated"). AdaPrompt runs with a full buffer (threshold 0, buffer = batch) so the timed step
includes its update.

    python benchmarks/client_step.py                       # realistic size (~20 min on 2 idle cores)
    python benchmarks/client_step.py --quick               # 20 classes, 16 images, 3 views (~3 min)
    python benchmarks/client_step.py --methods adaprompt --precision bf16   # ours with bf16 autocast
    python benchmarks/client_step.py --precision bf16 --naive-from fp32.json   # reuse an earlier naive run

Each time is the median of ``--repeats`` runs; the load average before each method goes next to it.
The last line is the overall speed-up on the batch (naive seconds / our seconds, all methods together).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from fedrapp_app.engine import FrozenCLIP, PromptedCLIP
from fedrapp_app.engine.images import tpt_views
from fedrapp_app.methods import LocalMethod, make_method
from fedrapp_app.methods.tpt import tpt_loss

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vitb16 import CALTECH101, load_average, measure, vit_b16, wait_for_quiet  # noqa: E402


def naive_pclip(clip: FrozenCLIP, classnames: tuple[str, ...]) -> PromptedCLIP:
    """Same prompts, every text sequence padded to the full 77 positions, hard prompts recomputed."""

    class Naive(PromptedCLIP):
        full_length_text = True

        def hard_prompt_features(self) -> Tensor:
            tokens = self.clip.tokenizer(
                [self.template.format(n) for n in self.classnames],
                padding="max_length",
                max_length=self.clip.max_text_length,
                return_tensors="pt",
            )
            with torch.no_grad():
                return F.normalize(self.clip.model.get_text_features(**tokens).pooler_output, dim=-1)

    return Naive(clip, classnames)


# ----- the naive steps (each returns the after-adaptation predictions, Tensor[B]) ------------------------
def naive_zeroshot(pclip: PromptedCLIP, method: LocalMethod, prompt, pixels, generator) -> Tensor:
    return pclip.logits(pclip.image_features(pixels), pclip.hard_prompt_features().unsqueeze(0)).argmax(-1)


def naive_tpt(pclip: PromptedCLIP, method: LocalMethod, prompt, pixels, generator) -> Tensor:
    """Reference TPT loop: per image, encode its views, one step, then re-encode the image to predict."""
    p, episodic = method.params, method.name == "tpt"
    seeds = torch.randint(0, 2**62, (pixels.shape[0],), generator=generator).tolist()
    with torch.no_grad():  # predictions with the received prompt (the interface reports them)
        pclip.logits(pclip.image_features(pixels), pclip.text_features(prompt))
    ctx = prompt[0].clone().requires_grad_(True)
    optimizer = torch.optim.AdamW([ctx], lr=p.lr, weight_decay=p.weight_decay)
    predictions = []
    for i, seed in enumerate(seeds):
        if episodic:
            ctx = prompt[0].clone().requires_grad_(True)
            optimizer = torch.optim.AdamW([ctx], lr=p.lr, weight_decay=p.weight_decay)
        views = tpt_views(pixels[i], p.n_views, torch.Generator().manual_seed(seed))
        loss, _ = tpt_loss(
            pclip.logit_scale * pclip.image_features(views) @ pclip.text_features([ctx])[0].T, p.views_kept
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            image = pclip.image_features(pixels[i : i + 1])
            predictions.append(pclip.logits(image, pclip.text_features([ctx])).argmax(-1))
    return torch.cat(predictions)


def naive_adaprompt(pclip: PromptedCLIP, method: LocalMethod, prompt, pixels, generator) -> Tensor:
    """Reference AdaPrompt step: the buffer holds images, re-encoded for every use."""
    p = method.params
    with torch.no_grad():
        initial = pclip.text_features(method.initial_prompt(pclip))
        confidences, labels = pclip.logits(pclip.image_features(pixels), initial).softmax(-1).max(-1)
        pclip.logits(pclip.image_features(pixels), pclip.text_features(prompt))  # before adaptation
    keep = confidences > p.threshold
    params = [block.clone().requires_grad_(True) for block in prompt]
    optimizer = torch.optim.AdamW(params, lr=p.lr, weight_decay=p.weight_decay)
    logits = pclip.logits(pclip.image_features(pixels[keep]), pclip.text_features(params))
    loss = F.cross_entropy(logits.softmax(-1), labels[keep])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        return pclip.logits(pclip.image_features(pixels), pclip.text_features(params)).argmax(-1)


NAIVE: dict[str, Callable] = {
    "zeroshot": naive_zeroshot,
    "tpt": naive_tpt,
    "tpt-online": naive_tpt,
    "adaprompt": naive_adaprompt,
}


# the settings a naive timing depends on (the naive path is always fp32 with the full text pass)
NAIVE_SIZES = ("images", "classes", "tpt_images", "tpt_views", "threads")


def reused_naive(path: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Rows by method of an earlier ``--json`` run, refused unless it ran the naive step at the same sizes."""
    earlier = json.loads(path.read_text())
    if "args" not in earlier or "rows" not in earlier:
        raise ValueError(f"{path} is not a client_step.py --json file (it needs 'args' and 'rows')")
    differ = {
        k: (earlier["args"].get(k), str(getattr(args, k)))
        for k in NAIVE_SIZES
        if earlier["args"].get(k) != str(getattr(args, k))
    }
    if differ:
        listed = ", ".join(f"{k}: {was} there, {now} here" for k, (was, now) in differ.items())
        raise ValueError(
            f"--naive-from {path} timed the naive step at other sizes ({listed}); "
            "rerun without --naive-from or with the same sizes"
        )
    return {row["method"]: row for row in earlier["rows"]}


def build_method(name: str, args: argparse.Namespace) -> LocalMethod:
    if name.startswith("tpt"):
        return make_method(name, n_views=args.tpt_views)
    if name == "adaprompt":
        return make_method(name, threshold=0.0, buffer_size=args.images)
    return make_method(name)


def time_method(name: str, ours: PromptedCLIP, naive: PromptedCLIP, pixels: Tensor, args: argparse.Namespace) -> dict:
    """Median wall and CPU seconds of our step and of the naive step on ``pixels``; prediction agreement."""
    method = build_method(name, args)
    prompt = method.initial_prompt(ours)
    load = wait_for_quiet(args.max_load, args.patience)
    outputs: dict[str, Tensor] = {}

    def our_step(batch: Tensor = pixels) -> None:
        fresh = build_method(name, args)  # a client builds its method object every round
        outputs["ours"] = fresh.adapt(ours, prompt, batch, torch.Generator().manual_seed(0)).predictions

    def naive_step() -> None:
        outputs["naive"] = NAIVE[name](naive, method, prompt, pixels, torch.Generator().manual_seed(0))

    # warm-up on 2 images: kernels, and the per-process caches a client has from round 2 on (the labeller)
    our_step(pixels[:2])
    ours_t = measure(our_step, args.repeats)
    if name in args.reused_naive:  # the naive step's numbers of an earlier run with the same sizes
        previous = args.reused_naive[name]
        naive_t = {"wall": previous["naive_s"], "cpu": previous["naive_cpu_s"], "walls": previous["naive_runs"]}
        agree = None  # not compared: the naive predictions were not computed in this run
    else:
        naive_t = measure(naive_step, args.naive_repeats)
        agree = float((outputs["naive"] == outputs["ours"]).float().mean())
    return {
        "method": name,
        "images": len(pixels),
        "ours_s": ours_t["wall"],
        "naive_s": naive_t["wall"],
        "ours_cpu_s": ours_t["cpu"],
        "naive_cpu_s": naive_t["cpu"],
        "ours_runs": ours_t["walls"],
        "naive_runs": naive_t["walls"],
        "same_predictions": agree,
        "load_before": load,
        "load_after": load_average(),
    }


def agreement(share: float | None) -> str:
    """The share of equal predictions as a percentage; "n/a" where the naive step was reused, not run."""
    return "n/a (naive reused)" if share is None else f"{share:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 classes, 16 images, 3 TPT views, 2 TPT images")
    parser.add_argument("--images", type=int, default=64, help="images in the batch")
    parser.add_argument("--classes", type=int, default=100, help="number of classes (at most 100)")
    parser.add_argument("--tpt-images", type=int, default=2, help="images timed for TPT (extrapolated to --images)")
    parser.add_argument("--tpt-views", type=int, default=63, help="augmented views per image for TPT")
    parser.add_argument("--methods", nargs="+", default=["zeroshot", "adaprompt", "tpt-online", "tpt"])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="our path's precision")
    parser.add_argument("--no-shared-prefix", action="store_true", help="ours without the shared-prefix text pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of our step (median)")
    parser.add_argument("--naive-repeats", type=int, default=1, help="timed runs of the naive step (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--max-load", type=float, default=1.5, help="wait for a 1-minute load below this")
    parser.add_argument("--patience", type=float, default=0.0, help="seconds to wait for that load")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--naive-from",
        type=Path,
        default=None,
        help="reuse the naive timings of an earlier --json run with the same sizes (naive is fp32)",
    )
    args = parser.parse_args()
    if args.quick:
        args.images, args.classes, args.tpt_views, args.tpt_images = 16, 20, 3, 2
    if args.naive_repeats < 1 or args.repeats < 1:
        parser.error("--repeats and --naive-repeats must be >= 1")
    try:
        args.reused_naive = reused_naive(args.naive_from, args) if args.naive_from else {}
    except (OSError, ValueError) as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    classnames = CALTECH101[: args.classes]
    clip = vit_b16(classnames, precision=args.precision)
    ours = PromptedCLIP(clip, classnames)
    ours.shared_prefix = not args.no_shared_prefix
    naive = naive_pclip(vit_b16(classnames), classnames)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)) for _ in range(args.images)]
    pixels = ours.preprocess(images)
    print(
        f"ViT-B/16 random weights, CPU, ours {args.precision}{' (no shared prefix)' * args.no_shared_prefix}, "
        f"naive fp32, {torch.get_num_threads()} threads: {len(classnames)} classes, batch {args.images} "
        f"(TPT: {args.tpt_images} images timed, 1 + {args.tpt_views} views each); "
        f"median of {args.repeats} (ours) / {args.naive_repeats} (naive) runs"
    )
    rows, total_ours, total_naive = [], 0.0, 0.0
    for name in args.methods:
        batch = pixels[: args.tpt_images] if name.startswith("tpt") else pixels
        row = time_method(name, ours, naive, batch, args)
        scale = args.images / row["images"]  # TPT: per-image cost times the batch
        row.update(
            batch=args.images,
            extrapolated=scale != 1,
            speedup=row["naive_s"] / row["ours_s"],
            speedup_cpu=row["naive_cpu_s"] / row["ours_cpu_s"],
            **{f"{k}_batch": row[k] * scale for k in ("ours_s", "naive_s", "ours_cpu_s", "naive_cpu_s")},
        )
        rows.append(row)
        total_ours, total_naive = total_ours + row["ours_s_batch"], total_naive + row["naive_s_batch"]
        note = f" (timed on {row['images']}, extrapolated)" if row["extrapolated"] else ""
        print(
            f"{name:10s} batch {args.images}{note}: ours {row['ours_s_batch']:7.1f} s wall "
            f"{row['ours_cpu_s_batch']:7.1f} s CPU ({args.images / row['ours_s_batch']:5.2f} img/s)   "
            f"naive {row['naive_s_batch']:7.1f} s wall {row['naive_cpu_s_batch']:7.1f} s CPU   "
            f"speed-up {row['speedup']:5.2f}x wall {row['speedup_cpu']:5.2f}x CPU   "
            f"same predictions {agreement(row['same_predictions'])}   load {row['load_before']:.2f} -> "
            f"{row['load_after']:.2f}",
            flush=True,
        )
    print(f"all methods: ours {total_ours:.1f} s, naive {total_naive:.1f} s, speed-up {total_naive / total_ours:.2f}x")
    if args.json:
        settings = {k: str(v) for k, v in vars(args).items() if k != "reused_naive"}
        args.json.write_text(json.dumps({"args": settings, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
