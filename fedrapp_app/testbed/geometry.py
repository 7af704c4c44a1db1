"""How wide the testbed CLIP's prompt space is: the prompt-geometry benchmark.

    python -m fedrapp_app.testbed.geometry --seed 0 --json runs/geometry.json    # a few minutes, one core
    python -m fedrapp_app.testbed.geometry --model runs/candidate --seed 100     # a candidate, validation seed

A testbed stands in for a real CLIP only if a prompt moves it the way it moves a real one. Measured through the
product's engine (``load_clip`` / ``PromptedCLIP`` / ``make_method``), at the context "a photo of a" (n = 4 tokens):

1. **The context Jacobian.** J = d(class features [C, E]) / d(context [n, D]). Its class-common part (the mean over
   classes) moves every class feature alike, which no argmax sees; its class-differential part (J minus that mean)
   is the lever. Reported: the class-common share of ||J||^2 and the effective rank of the differential part.
2. **The token embeddings' rank** within the text width D: the directions pretraining ever fed the text tower.
3. **Random and noisy contexts**: accuracy with the context replaced by random vectors of a word's mean norm, and
   under isotropic Gaussian noise on every context coordinate (sigma 0.03, 0.23 = client-level dp at epsilon 8
   over 16 uploads for a shared context, 1.25 = the same for a class-specific one; docs/privacy.md).
4. **Supervised CoOp** (Zhou et al., IJCV 2022) with 16 labelled shots per class in each domain, shared and
   class-specific context: the gain in its own domain, the domain x domain transfer matrix, and the mean of the
   shifted domains' prompts (what FedAvg of one client per domain makes) on every domain. Labels tune the prompt
   here on purpose: this measures how far a prompt *can* move accuracy; no product path reads labels.
5. **Test-time tuning** on the shifted domains against the hand prompt: AdaPrompt online, episodic TPT (the
   paper's method) and online TPT, through the product's methods.

Effective rank: the participation ratio of the squared singular values, (sum sigma^2)^2 / sum sigma^4; it equals r
for r equal singular values and counts how many directions carry the matrix's energy. Every accuracy is top-1 on
fresh renders below the pretraining seed range; seed s draws every set, so choose on one seed and report on another.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.testbed.corruptions import CORRUPTIONS, DEFAULT_DOMAINS, corrupt
from fedrapp_app.testbed.measure import CLEAN, make_stream, online_accuracy, pixel_values
from fedrapp_app.testbed.pretrain import PRETRAIN_SEED_OFFSET
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE, render

#: The context every measurement starts from: the hand prompt's words before the class name.
INIT_TEXT = "a photo of a"
#: Isotropic context noise: a small one, client-level dp's for a shared and for a class-specific context.
NOISE_SIGMAS: tuple[float, ...] = (0.03, 0.23, 1.25)
#: Domains: clean renders and the default run's eight shift domains, as (name, severity).
DOMAINS: tuple[tuple[str, int], ...] = ((CLEAN, 0), *DEFAULT_DOMAINS)


# ----- the math (pure functions) ---------------------------------------------------------------------
def effective_rank(matrix: Tensor) -> float:
    """Participation ratio (sum sigma_i^2)^2 / sum sigma_i^4 of a 2-D ``matrix``'s singular values; 0 if zero."""
    energy = torch.linalg.svdvals(matrix.double()).pow(2)
    fourth = float(energy.pow(2).sum())
    return float(energy.sum()) ** 2 / fourth if fourth else 0.0


def context_jacobian(pclip: PromptedCLIP, context: Tensor) -> Tensor:
    """d(L2-normalised class features) / d(shared context): Tensor[n, D] -> Tensor[C, E, n * D].

    The context is given to every class as its own copy (a class-specific block of equal rows): the features
    are those of the shared context, and class c's feature depends only on copy c, so one backward pass per
    embedding coordinate e gives row e of every class's Jacobian at once (E passes instead of C x E).
    """
    num_classes = len(pclip.classnames)
    block = context.detach().float().expand(num_classes, *context.shape).clone().requires_grad_(True)
    features = pclip.text_features([block])[0]  # [C, E]
    rows = [
        torch.autograd.grad(features[:, e].sum(), block, retain_graph=e + 1 < features.shape[1])[0]
        for e in range(features.shape[1])
    ]  # E x [C, n, D]
    return torch.stack(rows, 1).flatten(2).cpu()  # [C, E, n*D]


def jacobian_geometry(jacobian: Tensor) -> dict[str, float]:
    """Split J [C, E, P] into its class-common part (mean over classes) and the class-differential rest.

    ||J||^2 = C ||mean||^2 + ||J - mean||^2, so the class-common share is C ||mean||^2 / ||J||^2. Effective
    ranks are of the [C * E, P] stack (differential, full) and of the [E, P] mean (common).
    """
    num_classes = jacobian.shape[0]
    common = jacobian.mean(0)  # [E, P]
    differential = jacobian - common
    total = float(jacobian.double().pow(2).sum())
    return {
        "class_common_share": num_classes * float(common.double().pow(2).sum()) / total if total else 0.0,
        "effective_rank_differential": effective_rank(differential.flatten(0, 1)),
        "effective_rank_full": effective_rank(jacobian.flatten(0, 1)),
        "effective_rank_common": effective_rank(common),
        "input_dim": int(jacobian.shape[2]),
    }


def embedding_geometry(token_embeddings: Tensor) -> dict[str, float]:
    """Rank of the token embeddings [V, D] around their mean: how much of the text width pretraining fed."""
    centred = token_embeddings.detach().double() - token_embeddings.detach().double().mean(0)
    sigma = torch.linalg.svdvals(centred)
    return {
        "vocabulary": int(token_embeddings.shape[0]),
        "text_width": int(token_embeddings.shape[1]),
        "rank": int((sigma > 1e-3 * sigma[0]).sum()),
        "effective_rank": effective_rank(centred),
        "mean_norm": float(token_embeddings.detach().norm(dim=1).mean()),
    }


def accuracy(pclip: PromptedCLIP, blocks: Sequence[Tensor], features: Tensor, labels: np.ndarray) -> float:
    """Top-1 accuracy in [0, 1] of context ``blocks`` on image features [N, E] (no gradient)."""
    with torch.no_grad():
        logits = pclip.logits(features, pclip.text_features(list(blocks)))
    return float((logits.argmax(-1).cpu().numpy() == labels).mean())


def coop_fit(
    pclip: PromptedCLIP,
    init: Tensor,
    features: Tensor,
    labels: np.ndarray,
    *,
    steps: int,
    lr: float,
) -> Tensor:
    """Supervised CoOp on precomputed image features: cross-entropy of the class logits, full batch, Adam.

    init: Tensor[n, D] (shared) or [C, n, D] (class-specific); features: [N, E]; labels: [N]. Returns the tuned
    block (same shape, detached). The image tower is frozen and no augmentation is used, so each image's
    features are computed once; a cosine schedule ends the steps at lr 0.
    """
    context = init.detach().clone().to(pclip.device).requires_grad_(True)
    optimizer = torch.optim.Adam([context], lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    target = torch.as_tensor(labels, device=pclip.device)
    for _ in range(steps):
        loss = F.cross_entropy(pclip.logits(features, pclip.text_features([context])), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    return context.detach().cpu()


# ----- data ------------------------------------------------------------------------------------------
def labelled_set(domain: str, severity: int, seed: int, per_class: int, purpose: int) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` renders of every class in one domain: (uint8 images [C * per_class, S, S, 3], labels).

    ``purpose`` separates sets drawn with the same seed (shots 1, test 2): their image seeds never coincide
    in practice (drawn from 2^39 values). Seeds stay below the pretraining range.
    """
    code = 0 if domain == CLEAN else 1 + CORRUPTIONS.index(domain)
    rng = np.random.default_rng([seed, code, severity, purpose, 48])
    labels = np.repeat(np.arange(len(CLASSNAMES)), per_class)
    image_seeds = rng.integers(0, PRETRAIN_SEED_OFFSET // 2, labels.size)
    images = render(labels, image_seeds)
    if domain != CLEAN:
        images = corrupt(images, domain, severity, image_seeds)
    return images, labels


def domain_name(domain: str, severity: int) -> str:
    return domain if domain == CLEAN else f"{domain}:{severity}"


# ----- the benchmark ---------------------------------------------------------------------------------
def measure_geometry(
    pclip: PromptedCLIP,
    *,
    seed: int,
    shots: int = 16,
    test_per_class: int = 20,
    coop_steps: int = 200,
    coop_lr: float = 3e-3,
    random_draws: int = 5,
    adaprompt_stream: int = 640,
    tpt_stream: int = 64,
    tpt_views: int = 31,
    tta_methods: Sequence[str] = ("adaprompt", "tpt", "tpt-online"),
    log: Callable[[str], None] = print,
) -> dict:
    """Every measurement of the module docstring on one seed; a JSON-ready dict (accuracies in [0, 1])."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    init = pclip.context_from_text(INIT_TEXT)  # [n, D]
    num_classes = len(pclip.classnames)
    result: dict = {"seed": seed, "init_text": INIT_TEXT, "source": str(pclip.clip.source)}

    result["jacobian"] = jacobian_geometry(context_jacobian(pclip, init))
    embedding = pclip.clip.model.text_model.embeddings.token_embedding.weight
    result["token_embeddings"] = embedding_geometry(embedding)
    log(f"jacobian and embeddings: {time.perf_counter() - started:.0f} s")

    names = [domain_name(d, s) for d, s in DOMAINS]
    test, shots_of = {}, {}
    for (domain, severity), name in zip(DOMAINS, names, strict=True):
        images, labels = labelled_set(domain, severity, seed, test_per_class, purpose=2)
        test[name] = (pclip.image_features(pixel_values(pclip, images)), labels)
        images, labels = labelled_set(domain, severity, seed, shots, purpose=1)
        shots_of[name] = (pclip.image_features(pixel_values(pclip, images)), labels)
    zero_shot = {name: accuracy(pclip, [init], *test[name]) for name in names}
    result["zero_shot"] = zero_shot

    mean_norm = result["token_embeddings"]["mean_norm"]
    draws = []
    for _ in range(random_draws):
        direction = F.normalize(torch.randn(init.shape, generator=generator), dim=-1)
        draws.append({name: accuracy(pclip, [mean_norm * direction], *test[name]) for name in names})
    result["random_context"] = {name: float(np.mean([d[name] for d in draws])) for name in names}
    result["noise"] = {}
    for sigma in NOISE_SIGMAS:
        noisy = [init + sigma * torch.randn(init.shape, generator=generator) for _ in range(random_draws)]
        result["noise"][str(sigma)] = {
            name: float(np.mean([accuracy(pclip, [block], *test[name]) for block in noisy])) for name in names
        }
    log(f"zero-shot, random and noisy contexts: {time.perf_counter() - started:.0f} s")

    result["coop"] = {}
    for variant, start in (("shared", init), ("class-specific", init.expand(num_classes, *init.shape).clone())):
        tuned = {
            name: coop_fit(pclip, start, *shots_of[name], steps=coop_steps, lr=coop_lr)
            for name in names  # clean too: the analogue of CoOp's ImageNet prompt on ImageNet's variants
        }
        mean_prompt = torch.stack([tuned[name] for name in names if name != CLEAN]).mean(0)
        result["coop"][variant] = {
            "matrix": {a: {b: accuracy(pclip, [tuned[a]], *test[b]) for b in names} for a in names},
            "mean_of_shifted_prompts": {b: accuracy(pclip, [mean_prompt], *test[b]) for b in names},
        }
        log(f"coop {variant}: {time.perf_counter() - started:.0f} s")

    result["tta"] = {}
    for method in tta_methods:
        params = {"n_views": tpt_views} if method.startswith("tpt") else {}
        size = tpt_stream if method.startswith("tpt") else adaprompt_stream
        rows = {}
        for domain, severity in DEFAULT_DOMAINS:
            stream = make_stream(domain, severity, seed, size)
            pixels = pixel_values(pclip, stream.images)
            rows[domain_name(domain, severity)] = {
                "zero_shot": accuracy(pclip, [init], pclip.image_features(pixels), stream.labels),
                "online": online_accuracy(pclip, method, params, pixels, stream.labels, 64, seed),
            }
        result["tta"][method] = {"stream": size, "params": params, "domains": rows}
        log(f"{method}: {time.perf_counter() - started:.0f} s")
    result["summary"] = summarize(result)
    result["settings"] = dict(
        shots=shots, test_per_class=test_per_class, coop_steps=coop_steps, coop_lr=coop_lr,
        random_draws=random_draws, adaprompt_stream=adaprompt_stream, tpt_stream=tpt_stream, tpt_views=tpt_views,
    )  # fmt: skip
    result["seconds"] = time.perf_counter() - started
    return result


def summarize(result: dict) -> dict[str, float]:
    """The headline numbers (points, i.e. accuracy x 100, differences against the hand prompt)."""
    zs = result["zero_shot"]
    shifted = [name for name in zs if name != CLEAN]
    pts = lambda value: 100.0 * float(value)  # noqa: E731
    summary: dict[str, float] = {
        "clean_zero_shot": pts(zs[CLEAN]),
        "shifted_zero_shot": pts(np.mean([zs[d] for d in shifted])),
        "class_common_share": result["jacobian"]["class_common_share"],
        "effective_rank_differential": result["jacobian"]["effective_rank_differential"],
        "token_embedding_rank": result["token_embeddings"]["rank"],
        "random_context_shifted": pts(np.mean([result["random_context"][d] - zs[d] for d in shifted])),
    }
    for sigma, row in result["noise"].items():
        summary[f"noise_{sigma}_shifted"] = pts(np.mean([row[d] - zs[d] for d in shifted]))
    for variant, coop in result["coop"].items():
        m = coop["matrix"]
        key = "coop" if variant == "shared" else "coop_csc"
        summary[f"{key}_own_gain"] = pts(np.mean([m[d][d] - zs[d] for d in shifted]))
        summary[f"{key}_transfer"] = pts(np.mean([m[a][b] - zs[b] for a in shifted for b in shifted if a != b]))
        summary[f"{key}_clean_prompt_on_shifted"] = pts(np.mean([m[CLEAN][b] - zs[b] for b in shifted]))
        summary[f"{key}_mean_prompt_shifted"] = pts(
            np.mean([coop["mean_of_shifted_prompts"][b] - zs[b] for b in shifted])
        )
        summary[f"{key}_mean_prompt_clean"] = pts(coop["mean_of_shifted_prompts"][CLEAN] - zs[CLEAN])
    for method, tta in result["tta"].items():
        rows = tta["domains"].values()
        summary[f"{method}_vs_zero_shot"] = pts(np.mean([r["online"] - r["zero_shot"] for r in rows]))
    return summary


def report(result: dict) -> str:
    """A markdown report of one :func:`measure_geometry` result."""
    zs, names = result["zero_shot"], list(result["zero_shot"])
    s = result["summary"]
    j, t = result["jacobian"], result["token_embeddings"]
    lines = [
        f"# Prompt geometry of {result['source']} (seed {result['seed']}, context {result['init_text']!r})",
        "",
        "## Headline",
        "",
        "| measure | value |",
        "|---|---|",
        f"| shared CoOp prompt tuned on one shifted domain, mean gain on the other shifted domains | "
        f"{s['coop_transfer']:+.1f} |",
        f"| shared CoOp prompt tuned on clean renders, mean gain on the shifted domains | "
        f"{s['coop_clean_prompt_on_shifted']:+.1f} |",
        *(
            f"| {method} online vs zero-shot, mean over the shifted domains | {s[f'{method}_vs_zero_shot']:+.1f} |"
            for method in result["tta"]
        ),
        f"| CoOp 16-shot gain in its own domain (shared / class-specific), mean over shifted domains | "
        f"{s['coop_own_gain']:+.1f} / {s['coop_csc_own_gain']:+.1f} |",
        f"| effective rank of the class-differential context Jacobian (of {j['input_dim']}) | "
        f"{j['effective_rank_differential']:.1f} |",
        f"| class-common share of the Jacobian | {j['class_common_share']:.2f} |",
        f"| random context of a word's norm, shifted domains vs zero-shot | {s['random_context_shifted']:+.1f} |",
        *(
            f"| isotropic context noise sigma = {sigma}, shifted domains vs zero-shot | "
            f"{s[f'noise_{sigma}_shifted']:+.1f} |"
            for sigma in result["noise"]
        ),
        f"| mean of the shifted domains' CoOp prompts vs zero-shot: shifted / clean | "
        f"{s['coop_mean_prompt_shifted']:+.1f} / {s['coop_mean_prompt_clean']:+.1f} |",
        f"| clean zero-shot; shifted zero-shot (mean) | {s['clean_zero_shot']:.1f}; {s['shifted_zero_shot']:.1f} |",
        "",
        f"Token embeddings: {t['vocabulary']} tokens in a text width of {t['text_width']}: rank {t['rank']}, "
        f"effective rank {t['effective_rank']:.1f}, mean norm {t['mean_norm']:.3f}. Jacobian effective ranks: "
        f"full {j['effective_rank_full']:.1f}, class-common part {j['effective_rank_common']:.1f}.",
        "",
        "## Accuracy per domain (%)",
        "",
        "| context | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| hand prompt (zero-shot) | " + " | ".join(f"{100 * zs[n]:.1f}" for n in names) + " |",
        "| random, a word's norm | " + " | ".join(f"{100 * result['random_context'][n]:.1f}" for n in names) + " |",
        *(
            f"| + noise sigma {sigma} | " + " | ".join(f"{100 * row[n]:.1f}" for n in names) + " |"
            for sigma, row in result["noise"].items()
        ),
    ]
    for variant, coop in result["coop"].items():
        lines += [
            "",
            f"## CoOp, {variant} context: tuned on the row's domain, accuracy on the column's, minus zero-shot",
            "",
            "| tuned on | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
            *(
                f"| {a} | " + " | ".join(f"{100 * (coop['matrix'][a][b] - zs[b]):+.1f}" for b in names) + " |"
                for a in names
            ),
            "| mean of the shifted domains' prompts | "
            + " | ".join(f"{100 * (coop['mean_of_shifted_prompts'][b] - zs[b]):+.1f}" for b in names)
            + " |",
        ]
    for method, tta in result["tta"].items():
        rows = tta["domains"]
        lines += [
            "",
            f"## {method} online ({tta['stream']} images per domain, {tta['params'] or 'defaults'}), minus zero-shot",
            "",
            "| " + " | ".join(rows) + " |",
            "|" + "---|" * len(rows),
            "| " + " | ".join(f"{100 * (r['online'] - r['zero_shot']):+.1f}" for r in rows.values()) + " |",
        ]
    lines += ["", f"({result['seconds']:.0f} s)"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="testbed", help="'testbed' (shipped) or a checkpoint folder")
    parser.add_argument("--seed", type=int, default=0, help="report on 0-99; choose on >= 100")
    parser.add_argument("--shots", type=int, default=16, help="labelled images per class for CoOp")
    parser.add_argument("--test-per-class", type=int, default=20, help="test images per class and domain")
    parser.add_argument("--coop-steps", type=int, default=200)
    parser.add_argument("--coop-lr", type=float, default=3e-3)
    parser.add_argument("--tpt-stream", type=int, default=64, help="images per domain for TPT (slow)")
    parser.add_argument("--tpt-views", type=int, default=31)
    parser.add_argument("--methods", nargs="*", default=["adaprompt", "tpt", "tpt-online"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--markdown", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    pclip = PromptedCLIP(load_clip(args.model, device="cpu"), CLASSNAMES, HAND_TEMPLATE)
    result = measure_geometry(
        pclip, seed=args.seed, shots=args.shots, test_per_class=args.test_per_class, coop_steps=args.coop_steps,
        coop_lr=args.coop_lr, tpt_stream=args.tpt_stream, tpt_views=args.tpt_views, tta_methods=args.methods,
        log=lambda line: print(line, flush=True),
    )  # fmt: skip
    text = report(result)
    print(text)
    for path, content in ((args.json, json.dumps(result, indent=1) + "\n"), (args.markdown, text)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)


if __name__ == "__main__":
    main()
