"""Engine: loading, soft-prompt text features (golden equivalence, exact cut, gradients), images."""

from __future__ import annotations

import huggingface_hub.constants
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import LONG_CLASSNAME, TINY_CLASSNAMES, random_images
from PIL import Image, ImageOps
from transformers import GPT2Config

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.engine import loading as loading_module
from fedrapp_app.engine.images import (
    _equalize,
    _posterize,
    _solarize,
    augmix,
    crop_flip_thetas,
    to_rgb,
    tpt_views,
    warp,
)


def hf_features(clip, texts, **padding) -> torch.Tensor:
    tokens = clip.tokenizer(texts, return_tensors="pt", **(padding or {"padding": True}))
    with torch.no_grad():
        return F.normalize(clip.model.get_text_features(**tokens).pooler_output, dim=-1)


# ----- soft prompts -------------------------------------------------------------------------------------
@pytest.mark.kernels
def test_golden_context_equals_hard_prompt(tiny_clip, tiny_pclip):
    context = tiny_pclip.context_from_text("a photo of a")
    assert context.shape == (4, tiny_clip.text_width)
    with torch.no_grad():
        ours = tiny_pclip.text_features([context])[0]
    reference = hf_features(tiny_clip, [f"a photo of a {name}." for name in TINY_CLASSNAMES])
    assert (ours - reference).abs().max() <= 1e-5
    # also against a pass over all positions (padding to the full context length)
    full = hf_features(
        tiny_clip,
        [f"a photo of a {name}." for name in TINY_CLASSNAMES],
        padding="max_length",
        max_length=tiny_clip.max_text_length,
    )
    assert (ours - full).abs().max() <= 1e-5


def test_text_pass_stops_at_last_eos(tiny_clip):
    unshared = PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    unshared.shared_prefix = False  # the general path (class-specific contexts) runs the encoder module
    lengths = []
    hook = tiny_clip.model.text_model.encoder.register_forward_hook(
        lambda module, args, kwargs, out: lengths.append(kwargs["inputs_embeds"].shape[1]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            unshared.text_features([unshared.context_from_text("a photo of a")])
    finally:
        hook.remove()
    longest_hard = max(len(tiny_clip.tokenizer(f"a photo of a {n}.")["input_ids"]) for n in TINY_CLASSNAMES)
    assert lengths == [longest_hard] and longest_hard < tiny_clip.max_text_length


@pytest.mark.kernels
def test_cut_text_pass_equals_the_full_length_pass(tiny_clip):
    full = PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    full.full_length_text = True
    cut = PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    blocks = [cut.context_from_text("an image of a"), cut.random_context(3, torch.Generator().manual_seed(0))]
    with torch.no_grad():
        assert (cut.text_features(blocks) - full.text_features(blocks)).abs().max() <= 1e-5


@pytest.mark.kernels
def test_shared_prefix_pass_equals_the_full_pass_with_gradients(tiny_clip):
    shared = PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    full = PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    full.full_length_text = True
    generator = torch.Generator().manual_seed(0)
    blocks = [
        shared.context_from_text("an image of a"),
        shared.random_context(1, generator),
        shared.random_context(6, generator),
    ]  # prefixes of 5, 2 and 7 rows: padding is exercised
    weights = torch.randn(3, len(TINY_CLASSNAMES), tiny_clip.model.config.projection_dim, generator=generator)
    grads = []
    for pclip in (shared, full):
        params = [block.clone().requires_grad_(True) for block in blocks]
        features = pclip.text_features(params)
        (features * weights).sum().backward()
        grads.append((features.detach(), [p.grad for p in params]))
    (ours, ours_grads), (reference, reference_grads) = grads
    assert (ours - reference).abs().max() <= 1e-5
    for got, want in zip(ours_grads, reference_grads, strict=True):
        assert (got - want).abs().max() <= 1e-5 * max(1.0, float(want.abs().max()))
    with torch.no_grad():  # G stacked copies, and a bf16 autocast pass, take the same path
        stacked = shared.text_features_stacked(torch.stack([blocks[0], blocks[0] + 0.1]))
        assert (stacked[0] - reference[0]).abs().max() <= 1e-5
        low = PromptedCLIP(load_clip(tiny_clip.source, device="cpu", precision="bf16"), TINY_CLASSNAMES)
        assert (low.text_features(blocks) - reference).abs().max() < 0.1


def test_shared_prefix_pass_runs_each_prefix_once_and_no_padding(tiny_clip):
    pclip = PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    rows = []
    hook = tiny_clip.model.text_model.encoder.layers[0].mlp.register_forward_hook(
        lambda module, args, out: rows.append(args[0].shape[:-1])
    )
    try:
        with torch.no_grad():
            pclip.text_features([pclip.context_from_text("a photo of a"), pclip.context_from_text("an image of a")])
    finally:
        hook.remove()
    suffix_tokens = sum(
        len(tiny_clip.tokenizer(f"{n}.", add_special_tokens=False)["input_ids"]) + 1 for n in TINY_CLASSNAMES
    )
    assert rows == [(2 * 5 + 2 * suffix_tokens,)]  # 2 prefixes of [SOS] + 4 words, then every class token once


def test_constant_text_features_are_cached_by_content(tiny_clip):
    pclip = PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    pclip.constant_cache_size = 2
    a, b, c = (pclip.context_from_text(t) for t in ("a photo of a", "an image of a", "a noisy picture of a"))
    first = pclip.constant_text_features([a, b])
    with torch.no_grad():
        assert torch.equal(first, pclip.text_features([a, b]))  # bit-identical to recomputing
    assert pclip.constant_text_features([a.clone(), b.clone()]) is first  # same content, other tensors: a hit
    assert not first.requires_grad
    other = pclip.constant_text_features([a, c])
    assert other is not first and not torch.equal(other, first)
    assert pclip.constant_text_features([a + 1e-3, b]) is not first  # any change in the values is a miss
    assert pclip.constant_text_features([a, c]) is other  # still kept: the 2 most recently used entries
    assert pclip.constant_text_features([a, b]) is not first  # the oldest entry was evicted


def test_blocks_shared_class_specific_and_stacked_agree(tiny_pclip):
    blocks = [tiny_pclip.context_from_text(t) for t in ("an image of a", "a colorful image of a")]
    with torch.no_grad():
        together = tiny_pclip.text_features(blocks)  # [K, C, E], one pass with different n_k
        assert together.shape[:2] == (2, len(TINY_CLASSNAMES))
        for k, block in enumerate(blocks):
            alone = tiny_pclip.text_features([block])[0]
            assert torch.allclose(together[k], alone, atol=1e-6)
            specific = tiny_pclip.text_features([block.expand(len(TINY_CLASSNAMES), -1, -1).clone()])[0]
            assert torch.allclose(specific, alone, atol=1e-6)
        other = blocks[0] + 0.05 * torch.randn(blocks[0].shape, generator=torch.Generator().manual_seed(0))
        stacked = tiny_pclip.text_features_stacked(torch.stack([blocks[0], other]))
        assert torch.allclose(stacked[0], tiny_pclip.text_features([blocks[0]])[0], atol=1e-6)
        assert torch.allclose(stacked[1], tiny_pclip.text_features([other])[0], atol=1e-6)
        assert not torch.allclose(stacked[0], stacked[1], atol=1e-4)


def test_gradients_flow_only_into_the_context(tiny_clip, tiny_pclip):
    context = tiny_pclip.context_from_text("a photo of a").requires_grad_(True)
    class_specific = tiny_pclip.random_context(3, torch.Generator().manual_seed(1), len(TINY_CLASSNAMES))
    class_specific.requires_grad_(True)
    features = tiny_pclip.text_features([context, class_specific])
    (features[:, :, 0].sum() + features[1, 2].pow(2).sum()).backward()
    assert context.grad is not None and context.grad.abs().sum() > 0
    assert class_specific.grad is not None and class_specific.grad.abs().sum() > 0
    assert all(not p.requires_grad and p.grad is None for p in tiny_clip.model.parameters())
    assert not tiny_pclip.suffix_embeds.requires_grad and not tiny_pclip.sos_embed.requires_grad


def test_hard_prompt_features_use_the_template_and_are_cached(tiny_clip, tiny_pclip):
    first = tiny_pclip.hard_prompt_features()
    reference = hf_features(tiny_clip, [f"a photo of a {name}." for name in TINY_CLASSNAMES])
    assert torch.allclose(first, reference, atol=1e-6)
    assert tiny_pclip.hard_prompt_features() is first


def test_logits_are_the_mean_over_blocks_of_scaled_cosines(tiny_pclip, make_pixels):
    image = tiny_pclip.image_features(make_pixels(3))
    text = tiny_pclip.text_features([tiny_pclip.context_from_text(t) for t in ("an image of a", "a photo of a")])
    expected = sum(tiny_pclip.logit_scale * image @ text[k].T for k in range(2)) / 2
    assert torch.allclose(tiny_pclip.logits(image, text), expected, atol=1e-5)


def test_random_context_is_seeded_with_std_002(tiny_pclip):
    a = tiny_pclip.random_context(4, torch.Generator().manual_seed(3))
    b = tiny_pclip.random_context(4, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (4, tiny_pclip.clip.text_width)
    big = tiny_pclip.random_context(2000, torch.Generator().manual_seed(4))
    assert abs(float(big.std()) - 0.02) < 0.001


@pytest.mark.parametrize(
    ("classnames", "template", "message"),
    [
        ([], "a photo of a {}.", "class list is empty"),
        ([LONG_CLASSNAME], "a photo of a {}.", "does not fit"),
        (["cat", "zebraffe"], "a photo of a {}.", "outside the tokenizer's vocabulary"),
        (["cat"], "a photo of a cat.", "exactly one"),
    ],
)
def test_bad_class_lists_are_named(tiny_clip, classnames, template, message):
    with pytest.raises(ValueError, match=message):
        PromptedCLIP(tiny_clip, classnames, template)


def test_one_string_is_not_a_class_list(tiny_clip):
    with pytest.raises(TypeError, match="not one string"):
        PromptedCLIP(tiny_clip, "cat")


def test_context_plus_name_past_the_context_length_is_named(tiny_pclip):
    with pytest.raises(ValueError, match="exceed the text encoder's context"):
        tiny_pclip.text_features([tiny_pclip.random_context(20, torch.Generator().manual_seed(0))])
    with pytest.raises(ValueError, match=r"\[n, 32\] or \[5, n, 32\]"):
        tiny_pclip.text_features([torch.zeros(4, 7)])


# ----- loading -------------------------------------------------------------------------------------------
def test_loaded_model_is_frozen_and_quiet(tiny_clip_dir, capfd):
    clip = load_clip(tiny_clip_dir, device="auto")
    assert not clip.model.training and all(not p.requires_grad for p in clip.model.parameters())
    assert clip.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert "Loading weights" not in capfd.readouterr().err


def test_non_clip_and_missing_checkpoints_are_named(tmp_path):
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="not a CLIP checkpoint"):
        load_clip(tmp_path / "gpt2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_clip(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_clip(tmp_path / "nowhere")


def test_unreachable_hub_id_tells_how_to_go_offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network attempt in CI
    with pytest.raises(OSError, match="local checkpoint folder") as info:
        load_clip("fedrapp-tests/no-such-clip")
    assert "model=" in str(info.value) and "HF_HUB_OFFLINE" in str(info.value)


def test_cached_hub_id_loads_without_touching_the_network(tmp_path, monkeypatch, tiny_clip_dir):
    """A deployed ClientApp loads the model every round: a cached Hub id must cost no network request."""
    import shutil

    import huggingface_hub.file_download as file_download

    snapshot = tmp_path / "hub" / "models--fedrapp-tests--cached-clip" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_clip_dir, snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    requests = []

    def no_network(*args, **kwargs):
        requests.append(args)
        raise OSError("the test forbids network access")

    monkeypatch.setattr(file_download, "get_hf_file_metadata", no_network)
    clip = load_clip("fedrapp-tests/cached-clip", device="cpu")
    assert requests == [] and clip.source == "fedrapp-tests/cached-clip"
    # a Hub id that is not cached still goes to the Hub (and fails here with the fix in the message)
    with pytest.raises(OSError, match="local checkpoint folder"):
        load_clip("fedrapp-tests/not-cached-clip", device="cpu")
    assert requests  # it did try the network


def test_testbed_name_resolves_to_the_package_folder(monkeypatch, tmp_path, tiny_clip_dir):
    monkeypatch.setattr(loading_module, "_TESTBED_FOLDER", tmp_path / "model")
    with pytest.raises(FileNotFoundError, match="testbed model folder"):
        load_clip("testbed")
    monkeypatch.setattr(loading_module, "_TESTBED_FOLDER", tiny_clip_dir)
    assert load_clip("testbed", device="cpu").source == str(tiny_clip_dir)


def test_precision_rules(tiny_clip_dir, tiny_pclip):
    with pytest.raises(ValueError, match="needs a GPU"):
        load_clip(tiny_clip_dir, device="cpu", precision="fp16")
    with pytest.raises(ValueError, match="not one of"):
        load_clip(tiny_clip_dir, device="cpu", precision="int8")
    bf16 = PromptedCLIP(load_clip(tiny_clip_dir, device="cpu", precision="bf16"), TINY_CLASSNAMES)
    context = bf16.context_from_text("a photo of a")
    with torch.no_grad():
        low = bf16.text_features([context])
        high = tiny_pclip.text_features([context])
    assert low.dtype == torch.float32 and (low - high).abs().max() < 0.1


# ----- images --------------------------------------------------------------------------------------------
def test_any_mode_and_size_preprocesses(tiny_pclip):
    images = [
        *random_images(1, mode="L"),
        *random_images(1, mode="RGBA"),
        *random_images(1, mode="P"),
        *random_images(1, mode="CMYK"),
        *random_images(1, size=(1, 1)),
        *random_images(1, size=(3000, 5)),
        Image.fromarray(np.full((9, 13), 60000, dtype=np.uint16)),
        Image.new("1", (17, 3)),
    ]
    pixels = tiny_pclip.preprocess(images)
    assert pixels.shape == (len(images), 3, 32, 32) and torch.isfinite(pixels).all()
    assert tiny_pclip.preprocess(random_images(1)).shape == (1, 3, 32, 32)  # a batch of one
    assert to_rgb(Image.fromarray(np.full((2, 2), 65535, dtype=np.uint16))).getpixel((0, 0)) == (255, 255, 255)


def test_bad_images_are_named(tiny_pclip):
    with pytest.raises(ValueError, match="batch is empty"):
        tiny_pclip.preprocess([])
    with pytest.raises(TypeError, match="PIL"):
        tiny_pclip.preprocess([np.zeros((4, 4, 3))])
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        tiny_pclip.image_features(torch.zeros(2, 32, 32))


def test_image_features_are_chunk_invariant_and_normalised(tiny_pclip, make_pixels):
    pixels = make_pixels(5)
    whole = tiny_pclip.image_features(pixels)
    assert torch.allclose(whole, tiny_pclip.image_features(pixels, chunk_size=2), atol=1e-6)
    assert torch.allclose(whole.norm(dim=-1), torch.ones(5), atol=1e-5) and not whole.requires_grad


def test_views_are_seeded_and_keep_the_original_first(make_pixels):
    image = make_pixels(1)[0]
    views = tpt_views(image, 7, torch.Generator().manual_seed(0))
    assert views.shape == (8, 3, 32, 32) and torch.equal(views[0], image)
    assert torch.equal(views, tpt_views(image, 7, torch.Generator().manual_seed(0)))
    assert not torch.equal(views, tpt_views(image, 7, torch.Generator().manual_seed(1)))
    identity = torch.tensor([[[1.0, 0, 0], [0, 1, 0]]])
    assert torch.allclose(warp(image.unsqueeze(0), identity)[0], image, atol=1e-5)


def test_crops_follow_random_resized_crop_ranges():
    theta = crop_flip_thetas(4000, torch.Generator().manual_seed(0))
    area = theta[:, 0, 0].abs() * theta[:, 1, 1]
    assert area.min() >= 0.08 - 1e-6 and area.max() <= 1 + 1e-6
    assert 0.45 < float((theta[:, 0, 0] < 0).float().mean()) < 0.55  # flips
    # crops stay inside the frame
    assert (theta[:, 0, 2].abs() + theta[:, 0, 0].abs() <= 1 + 1e-5).all()


def test_augmix_views_stay_in_range_and_differ(make_pixels, tiny_clip):
    from fedrapp_app.engine.images import normalisation

    mean, std = normalisation(tiny_clip.image_processor)
    image = make_pixels(1)[0]
    views = tpt_views(image, 6, torch.Generator().manual_seed(0), use_augmix=True, mean=mean, std=std)
    plain = tpt_views(image, 6, torch.Generator().manual_seed(0))
    assert views.shape == plain.shape and torch.isfinite(views).all()
    assert not torch.allclose(views[1:], plain[1:])
    raw = torch.rand(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    mixed = augmix(raw, torch.Generator().manual_seed(1))
    assert mixed.shape == raw.shape and mixed.min() >= 0 and mixed.max() <= 1


def test_augmix_point_ops_match_pil():
    pixels = (np.random.default_rng(0).beta(2, 5, (3, 20, 24, 3)) * 255).astype(np.uint8)
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255
    level = torch.full((3,), 0.5)  # severity-1 level: posterize to 4 bits, solarize above 244

    def as_levels(t):
        return (t.permute(0, 2, 3, 1) * 255).round().numpy()

    for ours, pil in [
        (_equalize(x, level), ImageOps.equalize),
        (_posterize(x, level), lambda im: ImageOps.posterize(im, 4)),
        (_solarize(x, level), lambda im: ImageOps.solarize(im, 244)),
    ]:
        assert np.array_equal(as_levels(ours), np.stack([np.asarray(pil(Image.fromarray(p))) for p in pixels]))
