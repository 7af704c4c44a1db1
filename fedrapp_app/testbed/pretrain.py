"""Pretrain the testbed's small CLIP contrastively on the world's renders and save a standard HF folder.

    # the shipped model: the previous one (two stages at commit b61f899, on its short captions: README.md)
    # warm-started 150 steps on today's scene captions; bit for bit on one thread
    mkdir -p /tmp/previous && git archive b61f899 fedrapp_app/testbed/model | tar -x -C /tmp/previous
    python -m fedrapp_app.testbed.pretrain --output fedrapp_app/testbed/model \
        --init-from /tmp/previous/fedrapp_app/testbed/model --steps 150 --batch-size 64 --lr 3e-4 --seed 2 \
        --pool-size 3000 --threads 1 --eval-every 50 --hard-negatives 1 --precision fp32
    python -m fedrapp_app.testbed.pretrain --preset tiny --steps 20 --output /tmp/tiny   # smoke test

The folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
preprocessor_config.json) loads with ``CLIPModel/AutoTokenizer/AutoImageProcessor.from_pretrained``
exactly like a Hub checkpoint.

Data: a pool of clean renders with seeds >= ``PRETRAIN_SEED_OFFSET`` (streams and tests use smaller
seeds, so no test image is a training image). A share of each batch is corrupted (levels up to
``max_level`` severity units) and most of those renders' captions name the defect and its strength.
Captions (captions.py) say the render's scene in words, with synonyms and varied order ("a slightly
blurry photo of a small red circle on a dark striped background, lit from the left."), so many
context words carry meaning. The contrastive positives of a render are the renders captioned with
the same text; ``hard_negatives`` false captions per caption (one stated fact changed, every other
word the same) are extra columns of the image-to-text softmax, which teaches the text tower what the
words around the class name mean. ``--init-from`` starts from an earlier checkpoint of the same
towers, copying embeddings word by word when the vocabulary or caption length changed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import CLIPConfig, CLIPModel, PreTrainedTokenizerFast
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from fedrapp_app.testbed.captions import DOMAIN_ADJECTIVES, VOCABULARY, caption, facts_of, hard_negative
from fedrapp_app.testbed.corruptions import corrupt_level
from fedrapp_app.testbed.tokenizer import save_word_tokenizer, words_of
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE, IMAGE_SIZE, render

#: Pretraining renders use seeds from here up; keep stream and test seeds below it.
PRETRAIN_SEED_OFFSET = 2**40
#: Held-out clean renders scored during pretraining (seeds just below the training range).
_VALIDATION_SEED_OFFSET = PRETRAIN_SEED_OFFSET - 2**20
#: The shipped checkpoint folder, inside the package.
SHIPPED_MODEL = Path(__file__).resolve().parent / "model"
#: Corruption families seen in pretraining, the ones captions have words for. hue_shift stays unseen: a
#: strong colour rotation changes which colour word is right, so no caption could describe it honestly.
PRETRAIN_CORRUPTIONS: tuple[str, ...] = tuple(DOMAIN_ADJECTIVES)


@dataclass(frozen=True)
class Architecture:
    """Sizes of the two towers (one preset per use: the shipped model, unit tests)."""

    vision_hidden: int
    vision_layers: int
    patch_size: int
    text_hidden: int
    text_layers: int
    heads: int
    projection_dim: int
    max_length: int


PRESETS: dict[str, Architecture] = {
    "small": Architecture(128, 4, 4, 128, 3, 4, 64, 48),
    "tiny": Architecture(32, 1, 8, 32, 1, 2, 16, 48),
}


def clip_config(arch: Architecture, tokenizer: PreTrainedTokenizerFast) -> CLIPConfig:
    """HF CLIP config; bos/eos/pad ids come from the tokenizer (EOS = highest id, see tokenizer.py)."""
    return CLIPConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=arch.text_hidden,
            intermediate_size=4 * arch.text_hidden,
            num_hidden_layers=arch.text_layers,
            num_attention_heads=arch.heads,
            max_position_embeddings=arch.max_length,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(
            hidden_size=arch.vision_hidden,
            intermediate_size=4 * arch.vision_hidden,
            num_hidden_layers=arch.vision_layers,
            num_attention_heads=arch.heads,
            image_size=IMAGE_SIZE,
            patch_size=arch.patch_size,
        ),
        projection_dim=arch.projection_dim,
    )


def image_processor() -> CLIPImageProcessorPil:
    """The checkpoint's image processor: resize/crop to IMAGE_SIZE, CLIP's mean/std normalisation."""
    return CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )


def to_pixel_values(images: np.ndarray, processor: CLIPImageProcessorPil) -> torch.Tensor:
    """uint8 [B, S, S, 3] renders -> normalised float [B, 3, S, S], equal to ``processor(images)``.

    The renders already have the processor's size, so resize and crop are the identity; doing the
    rescale and normalisation on the tensor skips PIL in the training loop (a test checks equality).
    """
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    mean = torch.tensor(processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_std).view(1, 3, 1, 1)
    return (x - mean) / std


def caption_loss(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    keys: torch.Tensor,
    logit_scale: torch.Tensor,
    negative_features: torch.Tensor | None = None,
) -> torch.Tensor:
    """Symmetric InfoNCE whose positives are the pairs with the same caption, plus hard negative captions.

    image_features, text_features: [B, E] L2-normalised, row b of each from sample b; keys: [B] long, equal for
    equal caption texts (so two renders captioned alike are each other's positives); negative_features: [M, E]
    L2-normalised captions that describe no render of the batch, extra columns of the image-to-text softmax only.
    Loss per row: -log of the softmax mass on its positives.
    """
    positive = keys[:, None] == keys[None, :]
    texts = text_features if negative_features is None else torch.cat([text_features, negative_features])
    logits = logit_scale.exp() * image_features @ texts.T  # [B, B + M]
    extra = logits.new_zeros(positive.shape[0], texts.shape[0] - positive.shape[1], dtype=torch.bool)
    image_positive = torch.cat([positive, extra], 1)
    loss_i = -(torch.logsumexp(logits.masked_fill(~image_positive, -torch.inf), 1) - torch.logsumexp(logits, 1))
    square = logits[:, : positive.shape[1]].T  # [B texts, B images]
    loss_t = -(torch.logsumexp(square.masked_fill(~positive, -torch.inf), 1) - torch.logsumexp(square, 1))
    return 0.5 * (loss_i.mean() + loss_t.mean())


@dataclass(frozen=True)
class Batch:
    pixel_values: torch.Tensor  # [B, 3, S, S]
    captions: list[str]  # [B], caption b describes render b
    keys: torch.Tensor  # [B] long, equal for equal captions
    negatives: list[str]  # hard negatives: captions of the batch with one fact made false


def make_batch(
    pool_images: np.ndarray,
    pool_labels: np.ndarray,
    pool_seeds: np.ndarray,
    rng: np.random.Generator,
    batch_size: int,
    *,
    domain_share: float,
    domain_caption_share: float,
    max_level: float,
    hard_negatives: int,
    processor: CLIPImageProcessorPil,
) -> Batch:
    """Sample a training batch from the clean pool; corrupt a share of it, caption everything, add negatives."""
    index = rng.integers(0, pool_labels.size, batch_size)
    images = pool_images[index].copy()
    labels, seeds = pool_labels[index], pool_seeds[index]
    captions, negatives = [], []
    for b in range(batch_size):
        domain, level = None, 1.0
        if rng.random() < domain_share:
            family = PRETRAIN_CORRUPTIONS[int(rng.integers(len(PRETRAIN_CORRUPTIONS)))]
            level = float(rng.uniform(0.25, max_level))
            noise_seed = int(rng.integers(0, 2**62))
            images[b] = corrupt_level(images[b : b + 1], family, level, np.array([noise_seed]))[0]
            if rng.random() < domain_caption_share:  # else a caption that does not name the defect
                domain = family
        facts = facts_of(int(labels[b]), int(seeds[b]), domain, level)
        text_seed = int(rng.integers(0, 2**62))
        captions.append(caption(facts, text_seed))
        negatives += [n for k in range(hard_negatives) if (n := hard_negative(facts, text_seed, k)) is not None]
    ids: dict[str, int] = {}
    keys = torch.tensor([ids.setdefault(text, len(ids)) for text in captions])
    negatives = [text for text in dict.fromkeys(negatives) if text not in ids]  # a true caption is no negative
    return Batch(to_pixel_values(np.ascontiguousarray(images), processor), captions, keys, negatives)


def text_tower(model: CLIPModel, tokenizer: PreTrainedTokenizerFast, texts: Sequence[str], groups: int = 4):
    """Text features [T, E] of ``texts``, in ``groups`` passes of similar lengths (less padding than one pass).

    Each text's feature is the same whatever its neighbours' lengths: the tower is causal and pools at EOS.
    """
    lengths = [len(ids) for ids in tokenizer(list(texts))["input_ids"]]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    features = []
    for chunk in np.array_split(np.array(order), min(groups, len(order))):
        tokens = tokenizer([texts[i] for i in chunk], padding=True, return_tensors="pt")
        features.append(model.get_text_features(**tokens).pooler_output)
    return torch.cat(features)[torch.from_numpy(np.argsort(order))]


@torch.no_grad()
def warm_start(model: CLIPModel, tokenizer: PreTrainedTokenizerFast, folder: Path) -> list[str]:
    """Load checkpoint ``folder`` into ``model`` (same towers) across a change of vocabulary or caption length.

    Every weight of equal shape is copied; a token's embedding row is copied by word, so a word both vocabularies
    share keeps what it learned and a new word keeps ``model``'s fresh initialisation; the first positions'
    embeddings are copied when the new captions are longer. Returns the new words. Raises if the towers differ.
    """
    old = CLIPModel.from_pretrained(str(folder), local_files_only=True)
    old_vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    state, target = old.state_dict(), model.state_dict()
    token_key = "text_model.embeddings.token_embedding.weight"
    position_key = "text_model.embeddings.position_embedding.weight"
    mismatched = [k for k in target if k not in state or (state[k].shape != target[k].shape and k != token_key)]
    mismatched = [k for k in mismatched if k != position_key and "position_ids" not in k]
    if mismatched:
        raise ValueError(
            f"--init-from {folder}: its towers differ from the preset's ({mismatched[0]}); pick its preset"
        )
    for key, value in state.items():
        if key in target and value.shape == target[key].shape:
            target[key].copy_(value)
    positions = min(state[position_key].shape[0], target[position_key].shape[0])
    target[position_key][:positions] = state[position_key][:positions]
    new_words = []
    for word, index in tokenizer.get_vocab().items():
        if word in old_vocab:
            target[token_key][index] = state[token_key][old_vocab[word]]
        else:
            new_words.append(word)
    model.load_state_dict(target)
    return new_words


@torch.no_grad()
def zero_shot_accuracy(
    model: CLIPModel,
    tokenizer: PreTrainedTokenizerFast,
    pixel_values: torch.Tensor,
    labels: np.ndarray,
    template: str = HAND_TEMPLATE,
) -> float:
    """Top-1 accuracy of ``template`` prompts over CLASSNAMES on ``pixel_values`` [B, 3, S, S]."""
    model.eval()
    text = tokenizer([template.format(c) for c in CLASSNAMES], padding=True, return_tensors="pt")
    text_features = F.normalize(model.get_text_features(**text).pooler_output, dim=-1)
    image_features = F.normalize(model.get_image_features(pixel_values=pixel_values).pooler_output, dim=-1)
    predictions = (image_features @ text_features.T).argmax(1).numpy()
    model.train()
    return float((predictions == labels).mean())


def _say(message: str) -> None:
    print(message, flush=True)


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    """Run with ``threads`` torch threads, then restore the caller's setting (tests share a process)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _format_eta(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def pretrain(
    output: str | Path,
    *,
    preset: str = "small",
    steps: int = 1800,
    batch_size: int = 128,
    lr: float = 1e-3,
    seed: int = 0,
    pool_size: int = 60_000,
    domain_share: float = 0.4,
    domain_caption_share: float = 0.8,
    max_level: float = 1.0,
    hard_negatives: int = 1,
    eval_every: int = 100,
    eval_size: int = 600,
    threads: int = 2,
    bf16: bool = True,
    init_from: str | Path | None = None,
    log: Callable[[str], None] = _say,
) -> dict[str, float]:
    """Train a CLIP of ``preset`` size and save it to ``output``; return final metrics.

    Prints step, loss, ETA and held-out zero-shot accuracy. Seeded: same arguments, same weights
    (on the same torch build and thread count). ``bf16`` runs the towers under bfloat16 autocast
    (weights and the loss stay float32): about twice as fast on CPUs with AVX512-BF16.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if steps < 1 or batch_size < 2 or pool_size < batch_size:
        raise ValueError(
            f"need steps >= 1, batch_size >= 2, pool_size >= batch_size; got {steps}, {batch_size}, {pool_size}"
        )
    if not 0.0 <= domain_share <= 1.0 or not 0.0 <= domain_caption_share <= 1.0:
        raise ValueError("domain_share and domain_caption_share are probabilities in [0, 1]")
    if hard_negatives < 0 or not 0.25 <= max_level <= 3.0:
        raise ValueError(f"need hard_negatives >= 0 and max_level in [0.25, 3]; got {hard_negatives}, {max_level}")
    with _torch_threads(threads):
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        arch = PRESETS[preset]
        output = Path(output)
        output.mkdir(parents=True, exist_ok=True)
        words = words_of(t.replace("{}", "") for t in VOCABULARY)
        tokenizer = save_word_tokenizer(words, arch.max_length, output)
        processor = image_processor()
        model = CLIPModel(clip_config(arch, tokenizer))
        if init_from is not None:  # continue a previous run (a second stage, or older captions' checkpoint)
            warm_start(model, tokenizer, Path(init_from))
        model.train()

        started = time.perf_counter()
        pool_labels = rng.integers(0, len(CLASSNAMES), pool_size)
        pool_seeds = PRETRAIN_SEED_OFFSET + seed * 2**32 + np.arange(pool_size)
        pool_images = render(pool_labels, pool_seeds)
        val_labels = np.arange(eval_size) % len(CLASSNAMES)
        val_pixels = to_pixel_values(render(val_labels, _VALIDATION_SEED_OFFSET + np.arange(eval_size)), processor)
        log(f"rendered {pool_size} training and {eval_size} held-out images in {time.perf_counter() - started:.1f}s")

        decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
        no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
        )
        warmup = max(1, steps // 20)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        train_start, loss_ema, first_loss = time.perf_counter(), None, None
        for step in range(steps):
            batch = make_batch(
                pool_images,
                pool_labels,
                pool_seeds,
                rng,
                batch_size,
                domain_share=domain_share,
                domain_caption_share=domain_caption_share,
                max_level=max_level,
                hard_negatives=hard_negatives,
                processor=processor,
            )
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                image_out = model.get_image_features(pixel_values=batch.pixel_values).pooler_output
                text_out = text_tower(model, tokenizer, [*batch.captions, *batch.negatives])
            image_features = F.normalize(image_out.float(), dim=-1)
            text_features = F.normalize(text_out.float(), dim=-1)
            count = len(batch.captions)
            loss = caption_loss(
                image_features, text_features[:count], batch.keys, model.logit_scale, text_features[count:]
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0.0, math.log(100.0))
            value = float(loss.detach())
            first_loss = value if first_loss is None else first_loss
            loss_ema = value if loss_ema is None else 0.9 * loss_ema + 0.1 * value
            done = step + 1
            if done % max(1, eval_every // 5) == 0 or done == steps:
                elapsed = time.perf_counter() - train_start
                line = (
                    f"step {done}/{steps}  loss {value:.4f} (ema {loss_ema:.4f})  "
                    f"scale {model.logit_scale.exp().item():.1f}  "
                    f"elapsed {_format_eta(elapsed)}  ETA {_format_eta(elapsed / done * (steps - done))}"
                )
                if done % eval_every == 0 or done == steps:
                    accuracy = zero_shot_accuracy(model, tokenizer, val_pixels, val_labels)
                    line += f"  zero-shot(clean, held-out) {accuracy:.3f}"
                log(line)

        model.eval()
        model.save_pretrained(str(output))
        processor.save_pretrained(str(output))
        metrics = {
            "first_loss": first_loss,
            "final_loss_ema": loss_ema,
            "zero_shot_clean_heldout": zero_shot_accuracy(model, tokenizer, val_pixels, val_labels),
            "train_seconds": time.perf_counter() - train_start,
            "total_seconds": time.perf_counter() - started,
        }
        record = {
            "architecture": asdict(arch),
            "args": dict(
                preset=preset,
                steps=steps,
                batch_size=batch_size,
                lr=lr,
                seed=seed,
                pool_size=pool_size,
                domain_share=domain_share,
                domain_caption_share=domain_caption_share,
                max_level=max_level,
                hard_negatives=hard_negatives,
                bf16=bf16,
                init_from=None if init_from is None else str(init_from),
            ),
            "metrics": metrics,
            "torch": torch.__version__,
        }
        (output / "pretraining.json").write_text(json.dumps(record, indent=2) + "\n")
        log(f"saved to {output}: {json.dumps(metrics)}")
        return metrics


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=SHIPPED_MODEL, help="checkpoint folder to write")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model size (tiny: tests)")
    parser.add_argument("--steps", type=int, default=1800)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool-size", type=int, default=60_000, help="clean renders sampled from")
    parser.add_argument("--domain-share", type=float, default=0.4, help="share of renders corrupted")
    parser.add_argument(
        "--domain-caption-share",
        type=float,
        default=0.8,
        help="share of corrupted renders with a domain word",
    )
    parser.add_argument("--max-level", type=float, default=1.0, help="strongest corruption level (severity units)")
    parser.add_argument("--hard-negatives", type=int, default=1, help="false captions per caption (one fact changed)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--precision",
        choices=("bf16", "fp32"),
        default="bf16",
        help="autocast of the towers (weights stay fp32)",
    )
    parser.add_argument("--init-from", type=Path, help="start from this checkpoint folder (a second stage)")
    args = parser.parse_args(argv)
    pretrain(
        args.output,
        preset=args.preset,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        pool_size=args.pool_size,
        domain_share=args.domain_share,
        domain_caption_share=args.domain_caption_share,
        max_level=args.max_level,
        hard_negatives=args.hard_negatives,
        eval_every=args.eval_every,
        threads=args.threads,
        bf16=args.precision == "bf16",
        init_from=args.init_from,
    )


if __name__ == "__main__":
    main()
