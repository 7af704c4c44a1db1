"""The shipped testbed checkpoint and the pretraining script that makes it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

from fedrapp_app.testbed import pretrain
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE, METHOD_TEXTS, render

SHIPPED = pretrain.SHIPPED_MODEL
STANDARD_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
)


def test_shipped_folder_is_a_small_standard_checkpoint() -> None:
    for name in STANDARD_FILES:
        assert (SHIPPED / name).is_file(), name
    size_mb = sum(p.stat().st_size for p in SHIPPED.iterdir()) / 2**20
    assert size_mb < 8, f"shipped model is {size_mb:.1f} MB; keep it to a few MB"


@pytest.fixture(scope="module")
def shipped():
    model = CLIPModel.from_pretrained(str(SHIPPED), local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(SHIPPED), local_files_only=True)
    processor = AutoImageProcessor.from_pretrained(str(SHIPPED), local_files_only=True)
    return model, tokenizer, processor


def test_special_token_ids_match_the_config(shipped) -> None:
    model, tokenizer, _ = shipped
    text = model.config.text_config
    assert text.eos_token_id == tokenizer.eos_token_id == len(tokenizer) - 1  # EOS highest (pitfall)
    assert (text.bos_token_id, text.pad_token_id) == (tokenizer.bos_token_id, tokenizer.pad_token_id)
    assert text.vocab_size == len(tokenizer)
    for t in (*METHOD_TEXTS, *CLASSNAMES):
        assert tokenizer.unk_token_id not in tokenizer(t.replace("{}", "red circle"))["input_ids"], t


def test_the_shipped_tokenizer_knows_every_word_a_caption_can_use(shipped) -> None:
    """The shipped model was pretrained on captions.py's captions: none of their words is unknown to it."""
    from fedrapp_app.testbed.captions import VOCABULARY
    from fedrapp_app.testbed.tokenizer import words_of

    _, tokenizer, _ = shipped
    words = sorted(set(words_of(t.replace("{}", "") for t in VOCABULARY)))
    unknown = [w for w in words if tokenizer.unk_token_id in tokenizer(w)["input_ids"]]
    assert not unknown and len(words) == len(tokenizer) - 4  # every word, and nothing but them and the specials


def test_shipped_model_zero_shot_on_clean_renders(shipped) -> None:
    """A real floor on the shipped weights, through the standard HF calls only."""
    model, tokenizer, processor = shipped
    labels = np.arange(300) % len(CLASSNAMES)
    images = render(labels, 10_000_000 + np.arange(300))  # seeds far from any pretraining seed
    with torch.no_grad():
        text = tokenizer([HAND_TEMPLATE.format(c) for c in CLASSNAMES], padding=True, return_tensors="pt")
        t = F.normalize(model.get_text_features(**text).pooler_output, dim=-1)
        pixels = processor(images=list(images), return_tensors="pt")["pixel_values"]
        v = F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)
    accuracy = float(((v @ t.T).argmax(1).numpy() == labels).mean())
    assert accuracy >= 0.8, accuracy


def test_training_pixels_equal_the_processor_output(shipped) -> None:
    _, _, processor = shipped
    images = render(np.arange(4), np.arange(4))
    expected = processor(images=list(images), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(pretrain.to_pixel_values(images, processor), expected, atol=1e-5, rtol=0)


def test_caption_loss_rewards_alignment_pools_positives_and_counts_negatives() -> None:
    g = torch.Generator().manual_seed(0)
    feats = F.normalize(torch.randn(6, 8, generator=g), dim=-1)
    keys = torch.tensor([0, 0, 1, 2, 3, 4])
    scale = torch.tensor(3.0)
    aligned = pretrain.caption_loss(feats, feats, keys, scale)
    shuffled = pretrain.caption_loss(feats, feats[torch.tensor([3, 4, 5, 0, 1, 2])], keys, scale)
    assert aligned < shuffled
    # Rows 0 and 1 share a caption: swapping their texts changes nothing.
    swapped = pretrain.caption_loss(feats, feats[torch.tensor([1, 0, 2, 3, 4, 5])], keys, scale)
    torch.testing.assert_close(aligned, swapped)
    # A negative close to an image's own caption costs more than a far one.
    near = F.normalize(feats[:1] + 0.05 * torch.randn(1, 8, generator=g), dim=-1)
    hard, easy = (pretrain.caption_loss(feats, feats, keys, scale, n) for n in (near, -near))
    assert hard > easy


def test_warm_start_keeps_shared_words_across_a_new_vocabulary(tmp_path: Path) -> None:
    old = pretrain.PRESETS["tiny"]
    from fedrapp_app.testbed.tokenizer import save_word_tokenizer

    tokenizer = save_word_tokenizer(["a", "photo", "of", "red", "circle"], old.max_length, tmp_path / "old")
    source = CLIPModel(pretrain.clip_config(old, tokenizer))
    source.save_pretrained(str(tmp_path / "old"))
    longer = pretrain.Architecture(**{**pretrain.asdict(old), "max_length": old.max_length + 8})
    wider = save_word_tokenizer(["a", "photo", "of", "red", "circle", "blurry", "tiny"], longer.max_length, tmp_path)
    model = CLIPModel(pretrain.clip_config(longer, wider))
    new_words = pretrain.warm_start(model, wider, tmp_path / "old")
    assert sorted(new_words) == ["blurry", "tiny"]
    embed = lambda m, tok, w: m.text_model.embeddings.token_embedding.weight[tok.convert_tokens_to_ids(w)]  # noqa: E731
    for word in ("photo", "circle", tokenizer.eos_token):
        torch.testing.assert_close(embed(model, wider, word), embed(source, tokenizer, word))
    torch.testing.assert_close(model.visual_projection.weight, source.visual_projection.weight)
    small = pretrain.PRESETS["small"]
    with pytest.raises(ValueError, match="towers differ"):
        pretrain.warm_start(CLIPModel(pretrain.clip_config(small, wider)), wider, tmp_path / "old")


def test_pretraining_a_tiny_model_lowers_its_loss_and_saves_a_loadable_folder(tmp_path: Path) -> None:
    lines: list[str] = []
    metrics = pretrain.pretrain(
        tmp_path,
        preset="tiny",
        steps=30,
        batch_size=32,
        lr=3e-3,
        pool_size=300,
        eval_every=15,
        eval_size=60,
        bf16=False,
        threads=1,  # a tiny model gains nothing from a second thread, and a busy CI core stalls it
        log=lines.append,
    )
    assert metrics["final_loss_ema"] < metrics["first_loss"] - 0.2, metrics
    assert any("ETA" in line and "loss" in line for line in lines)
    for name in STANDARD_FILES:
        assert (tmp_path / name).is_file(), name
    model = CLIPModel.from_pretrained(str(tmp_path), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert model.config.text_config.eos_token_id == tokenizer.eos_token_id == len(tokenizer) - 1
    assert json.loads((tmp_path / "pretraining.json").read_text())["args"]["steps"] == 30


def test_pretraining_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="preset"):
        pretrain.pretrain(tmp_path, preset="huge")
    with pytest.raises(ValueError, match="steps"):
        pretrain.pretrain(tmp_path, preset="tiny", steps=0)
