"""One local-method step per method on the ViT-B/16 architecture (random weights, CPU fp32): ours vs naive.

Ours: the methods as shipped (text pass cut after the batch's last EOS; every image or view through the
image tower once per step; episodic TPT as one stacked step). Naive: the reference codes' way of doing
the same step: full 77-token text passes, one image at a time for TPT, and image features recomputed
wherever they are used (pseudo-labels, predictions, buffered samples). Both produce the same outputs.

Speed does not depend on the weights, so a randomly initialised CLIP with the ViT-B/16 sizes (text 512
wide, 12 layers, 77 positions; vision 768 wide, 12 layers, patch 16, 224 px) and a word-level tokenizer
stand in for the real checkpoint. AdaPrompt runs with a buffer of ``--images`` samples and threshold 0,
so the timed step includes its update. TPT costs per image, so it gets a smaller batch (``--tpt-images``)
and 3 augmented views per image instead of 63 to keep the run short.

Run: ``python benchmarks/client_step.py`` (under 5 minutes on 2 CPU cores, most of it the naive path).
The last line is the overall speed-up (naive seconds / our seconds, all methods together).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from transformers import CLIPConfig, CLIPModel
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from fedrapp_app.engine import FrozenCLIP, PromptedCLIP
from fedrapp_app.engine.images import tpt_views
from fedrapp_app.methods import LocalMethod, make_method
from fedrapp_app.methods.tpt import tpt_loss
from fedrapp_app.testbed.tiny import DEFAULT_TEXTS
from fedrapp_app.testbed.tokenizer import build_word_tokenizer, words_of

CLASSNAMES = (
    "apple", "bicycle", "golden retriever", "tabby cat", "red fox", "sports car", "tulip", "oak tree",
    "fire truck", "sea turtle", "hot air balloon", "wooden chair", "snow leopard", "coffee mug",
    "mountain bike", "pine cone", "space shuttle", "garden snail", "violin", "lighthouse",
)


def vit_b16(classnames: tuple[str, ...]) -> FrozenCLIP:
    """A random-weight CLIP with the ViT-B/16 sizes, frozen, on the CPU."""
    tokenizer = build_word_tokenizer(words_of([*(t.replace("{}", "") for t in DEFAULT_TEXTS), *classnames]), 77)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id),
        vision_config=dict(patch_size=16, image_size=224),
        projection_dim=512,
    )
    torch.manual_seed(0)
    model = CLIPModel(config).requires_grad_(False).eval()
    return FrozenCLIP(model, tokenizer, CLIPImageProcessorPil(), torch.device("cpu"), "fp32", "random ViT-B/16")


def naive_pclip(clip: FrozenCLIP, classnames: tuple[str, ...]) -> PromptedCLIP:
    """Same prompts, every text sequence padded to the full 77 positions, hard prompts recomputed."""

    class Naive(PromptedCLIP):
        full_length_text = True

        def hard_prompt_features(self) -> Tensor:
            tokens = self.clip.tokenizer([self.template.format(n) for n in self.classnames], padding="max_length",
                                         max_length=self.clip.max_text_length, return_tensors="pt")
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
        loss, _ = tpt_loss(pclip.logit_scale * pclip.image_features(views) @ pclip.text_features([ctx])[0].T,
                           p.views_kept)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16, help="images in the batch")
    parser.add_argument("--classes", type=int, default=20, help=f"number of classes (at most {len(CLASSNAMES)})")
    parser.add_argument("--tpt-images", type=int, default=4, help="images in the TPT batch (its cost is per image)")
    parser.add_argument("--tpt-views", type=int, default=3, help="augmented views per image for TPT")
    args = parser.parse_args()
    classnames = CLASSNAMES[: args.classes]
    clip = vit_b16(classnames)
    ours_pclip, slow_pclip = PromptedCLIP(clip, classnames), naive_pclip(clip, classnames)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)) for _ in range(args.images)]
    pixels = ours_pclip.preprocess(images)
    runs = [
        (make_method("zeroshot"), naive_zeroshot, pixels),
        (make_method("tpt", n_views=args.tpt_views), naive_tpt, pixels[: args.tpt_images]),
        (make_method("tpt-online", n_views=args.tpt_views), naive_tpt, pixels[: args.tpt_images]),
        (make_method("adaprompt", threshold=0.0, buffer_size=args.images), naive_adaprompt, pixels),
    ]
    print(f"ViT-B/16 random weights, CPU fp32, {torch.get_num_threads()} threads: {len(classnames)} classes, "
          f"{args.images} images ({args.tpt_images} for TPT, 1 + {args.tpt_views} views each)")
    total_ours = total_naive = 0.0
    total_images = 0
    for method, naive_step, batch in runs:
        prompt = method.initial_prompt(ours_pclip)
        start = time.perf_counter()
        result = method.adapt(ours_pclip, prompt, batch, torch.Generator().manual_seed(0))
        ours = time.perf_counter() - start
        start = time.perf_counter()
        naive_predictions = naive_step(slow_pclip, method, prompt, batch, torch.Generator().manual_seed(0))
        naive = time.perf_counter() - start
        agree = float((naive_predictions == result.predictions).float().mean())
        total_ours, total_naive, total_images = total_ours + ours, total_naive + naive, total_images + len(batch)
        print(f"{method.name:10s}  {len(batch):2d} images   ours {ours:7.2f} s {len(batch) / ours:6.2f} images/s   "
              f"naive {naive:7.2f} s {len(batch) / naive:6.2f} images/s   speed-up {naive / ours:5.2f}x   "
              f"same predictions {agree:.0%}", flush=True)
    print(f"all methods: ours {total_ours:.1f} s ({total_images / total_ours:.2f} images/s), "
          f"naive {total_naive:.1f} s ({total_images / total_naive:.2f} images/s), "
          f"speed-up {total_naive / total_ours:.2f}x")


if __name__ == "__main__":
    main()
