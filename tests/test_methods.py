"""Local methods: zeroshot, tpt, tpt-online, adaprompt (and its buffer), registry and persistent state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_CLASSNAMES

from fedrapp_app.methods import BUILT_IN as METHODS
from fedrapp_app.methods import AdaPromptParams, ConfidenceBuffer, TPTParams, make_method
from fedrapp_app.methods.tpt import confident_views, marginal_entropy, tpt_loss


def run_rounds(method, pclip, pixel_batches, prompt, first_round=0):
    """Feed batches in order, seeding each round's generator by its index (as a client does). Each round
    receives the last tuned prompt nudged, as a server would send something else than the upload."""
    results = []
    for round_index, pixels in enumerate(pixel_batches, start=first_round):
        result = method.adapt(pclip, prompt, pixels, torch.Generator().manual_seed(1000 + round_index))
        results.append(result)
        prompt = [block + 0.001 * (round_index + 1) for block in result.prompt]
    return results, prompt


# ----- registry -------------------------------------------------------------------------------------------
def test_make_method_builds_every_registered_method_and_names_bad_input():
    for name in METHODS:
        assert make_method(name).name == name
    with pytest.raises(ValueError, match="unknown local method 'tent'; installed: adaprompt, "):
        make_method("tent")
    with pytest.raises(ValueError, match="allowed: init-text, n-views"):
        make_method("tpt", {"n-view": 3})
    method = make_method("tpt", {"n-views": 7}, lr=1e-3)
    assert method.params == TPTParams(n_views=7, lr=1e-3)
    assert make_method("adaprompt", {"init-texts": ["a photo of a"], "lr": 1}).params.init_texts == ("a photo of a",)
    with pytest.raises(ValueError, match="expects a float"):
        make_method("adaprompt", threshold="high")
    with pytest.raises(ValueError, match="given twice"):
        make_method("tpt", {"n-views": 3}, n_views=4)
    with pytest.raises(ValueError, match="threshold must be in"):
        make_method("adaprompt", threshold=1.5)


def test_received_prompt_is_validated(tiny_pclip, make_pixels):
    method = make_method("adaprompt")
    with pytest.raises(ValueError, match="expected"):
        method.adapt(tiny_pclip, [torch.zeros(4, 32)], make_pixels(1), torch.Generator())
    bad = method.initial_prompt(tiny_pclip)
    bad[0][0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        method.adapt(tiny_pclip, bad, make_pixels(1), torch.Generator())


# ----- zeroshot -------------------------------------------------------------------------------------------
def test_zeroshot_keeps_the_prompt_and_uses_the_hard_prompt(tiny_pclip, make_pixels):
    method = make_method("zeroshot")
    prompt = method.initial_prompt(tiny_pclip)
    assert torch.equal(prompt[0], tiny_pclip.context_from_text("a photo of a"))
    received = [prompt[0] + 0.3]  # a prompt the server changed: must not affect predictions
    pixels = make_pixels(6)
    result = method.adapt(tiny_pclip, received, pixels, torch.Generator())
    assert torch.equal(result.prompt[0], received[0]) and result.h_pre == result.h_post
    expected = (tiny_pclip.image_features(pixels) @ tiny_pclip.hard_prompt_features().T).argmax(-1)
    assert torch.equal(result.predictions, expected) and torch.equal(result.predictions_before, expected)


# ----- tpt ------------------------------------------------------------------------------------------------
def test_tpt_keeps_six_lowest_entropy_views_and_minimises_their_marginal_entropy():
    assert TPTParams().views_kept == 6  # int(0.1 * 64)
    logits = 3 * torch.randn(2, 64, 5, generator=torch.Generator().manual_seed(0))
    loss, kept = tpt_loss(logits, 6)
    for b in range(2):
        probs = logits[b].double().softmax(-1)
        view_entropy = -(probs * probs.log()).sum(-1)
        assert set(kept[b].tolist()) == set(view_entropy.argsort()[:6].tolist())
        mean_prob = probs[kept[b]].mean(0)
        assert abs(float(loss[b]) - float(-(mean_prob * mean_prob.log()).sum())) < 1e-5
    assert torch.equal(confident_views(logits, 64).sort(-1).values, torch.arange(64).expand(2, 64))
    assert abs(float(marginal_entropy(torch.zeros(3, 4))) - np.log(4)) < 1e-6


def per_image_tpt(pclip, context, view_features, params):
    """Reference loop: a fresh prompt copy and a fresh AdamW per image (what the reference code does)."""
    tuned, predictions, losses = [], [], []
    for features in view_features:
        ctx = context.clone().requires_grad_(True)
        optimizer = torch.optim.AdamW([ctx], lr=params.lr, weight_decay=params.weight_decay)
        loss, kept = tpt_loss(pclip.logit_scale * features @ pclip.text_features([ctx])[0].T, params.views_kept)
        assert kept.shape == (params.views_kept,)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            predictions.append(int((features[0] @ pclip.text_features([ctx])[0].T).argmax()))
        tuned.append(ctx.detach())
        losses.append(float(loss.detach()))
    return torch.stack(tuned), torch.tensor(predictions), float(np.mean(losses))


@pytest.mark.parametrize("text_chunk", [2048, 5, 10])  # one stacked pass; one image per pass; two per pass
@pytest.mark.kernels
def test_episodic_tpt_stacked_step_equals_the_per_image_loop(tiny_pclip, make_pixels, text_chunk):
    method = make_method("tpt", text_chunk=text_chunk)
    prompt = method.initial_prompt(tiny_pclip)
    pixels = make_pixels(3)
    result = method.adapt(tiny_pclip, prompt, pixels, torch.Generator().manual_seed(5))
    features = method.view_features(tiny_pclip, pixels, torch.Generator().manual_seed(5))
    assert features.shape[:2] == (3, 64)
    tuned, predictions, loss = per_image_tpt(tiny_pclip, prompt[0], features, method.params)
    assert torch.allclose(result.prompt[0], tuned.mean(0), atol=1e-6)  # upload = mean of per-image prompts
    assert not torch.allclose(tuned[0], tuned[1]) and not torch.equal(result.prompt[0], prompt[0])
    assert torch.equal(result.predictions, predictions)
    assert result.stats["views_kept"] == 6 and abs(result.stats["loss"] - loss) < 1e-5
    before = tiny_pclip.logits(features[:, 0], tiny_pclip.text_features(prompt))
    assert torch.equal(result.predictions_before, before.argmax(-1))
    assert abs(result.h_pre - float(-(before.softmax(-1) * before.log_softmax(-1)).sum(-1).mean())) < 1e-5


def test_tpt_online_moves_one_prompt_along_the_stream(tiny_pclip, make_pixels):
    method = make_method("tpt-online", n_views=15)
    prompt = method.initial_prompt(tiny_pclip)
    pixels = make_pixels(3)
    result = method.adapt(tiny_pclip, prompt, pixels, torch.Generator().manual_seed(2))
    features = make_method("tpt", n_views=15).view_features(tiny_pclip, pixels, torch.Generator().manual_seed(2))
    ctx = prompt[0].clone().requires_grad_(True)
    optimizer = torch.optim.AdamW([ctx], lr=5e-3, weight_decay=0.01)
    predictions = []
    for view_features in features:
        loss, _ = tpt_loss(tiny_pclip.logit_scale * view_features @ tiny_pclip.text_features([ctx])[0].T, 1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            predictions.append(int((view_features[0] @ tiny_pclip.text_features([ctx])[0].T).argmax()))
    assert torch.allclose(result.prompt[0], ctx.detach(), atol=1e-6)
    assert torch.equal(result.predictions, torch.tensor(predictions))
    state = method.state_dict()
    assert float(state["optimizer.step.0"]) == 3 and state["optimizer.step.0"].shape == ()


# ----- adaprompt buffer -----------------------------------------------------------------------------------
def offer(buffer, label, confidence, tag):
    buffer.add(torch.full((1, 2), float(tag)), torch.tensor([label]), torch.tensor([confidence]))


def rows(buffer):
    return sorted(zip(buffer.labels.tolist(), [round(float(c), 3) for c in buffer.confidences], strict=True))


def test_buffer_eviction_rules():
    buffer = ConfidenceBuffer(4)
    for tag, (label, confidence) in enumerate([(0, 0.9), (0, 0.8), (0, 0.95), (1, 0.9)]):
        offer(buffer, label, confidence, tag)
    assert buffer.full and rows(buffer) == [(0, 0.8), (0, 0.9), (0, 0.95), (1, 0.9)]
    offer(buffer, 2, 0.75, 10)  # class 2 is not largest: evicts the least confident sample of class 0
    assert rows(buffer) == [(0, 0.9), (0, 0.95), (1, 0.9), (2, 0.75)]
    offer(buffer, 0, 0.85, 11)  # largest class, less confident than its weakest: dropped
    assert rows(buffer) == [(0, 0.9), (0, 0.95), (1, 0.9), (2, 0.75)]
    offer(buffer, 0, 0.9, 12)  # a tie is not "more confident" (SPEC): dropped
    assert 12.0 not in buffer.features[:, 0].tolist()
    offer(buffer, 0, 0.99, 13)  # largest class, more confident: replaces its own weakest (0.9)
    assert rows(buffer) == [(0, 0.95), (0, 0.99), (1, 0.9), (2, 0.75)]
    assert sorted(buffer.features[:, 0].tolist()) == [2.0, 3.0, 10.0, 13.0]  # features move with their rows


def test_buffer_evicts_the_weakest_among_tied_largest_classes():
    buffer = ConfidenceBuffer(4)
    for tag, (label, confidence) in enumerate([(0, 0.9), (0, 0.8), (1, 0.85), (1, 0.72)]):
        offer(buffer, label, confidence, tag)
    offer(buffer, 2, 0.71, 9)
    assert rows(buffer) == [(0, 0.8), (0, 0.9), (1, 0.85), (2, 0.71)]
    restored = ConfidenceBuffer(4)
    restored.load_arrays(buffer.state_arrays("b."), "b.")
    assert torch.equal(restored.features, buffer.features) and rows(restored) == rows(buffer)
    with pytest.raises(ValueError, match="capacity"):
        ConfidenceBuffer(2).load_arrays(buffer.state_arrays("b."), "b.")


# ----- adaprompt ------------------------------------------------------------------------------------------
def test_adaprompt_waits_for_a_full_buffer_of_64(tiny_pclip, make_pixels):
    assert AdaPromptParams().buffer_size == 64 and AdaPromptParams().threshold == 0.7
    method = make_method("adaprompt", threshold=0.0)  # the tiny model is never 70% confident
    prompt = method.initial_prompt(tiny_pclip)
    assert [block.shape[0] for block in prompt] == [4, 5, 5]
    for round_index in range(4):
        result = method.adapt(tiny_pclip, prompt, make_pixels(16, seed=round_index), torch.Generator())
        assert result.stats["buffer_fill"] == 16 * (round_index + 1)
        if round_index < 3:
            assert result.stats["updated"] == 0 and result.h_pre == result.h_post
            assert all(torch.equal(a, b) for a, b in zip(result.prompt, prompt, strict=True))
            assert "optimizer.step.0" not in method.state_dict()
    assert result.stats["updated"] == 1 and not torch.equal(result.prompt[0], prompt[0])
    assert float(method.state_dict()["optimizer.step.0"]) == 1


def test_adaprompt_labeller_runs_once_per_process_and_changes_nothing(tiny_clip, make_pixels):
    """Each round builds a new method object (client.py); the frozen labeller's text pass is still done once."""
    from fedrapp_app.engine import PromptedCLIP

    cached, uncached = PromptedCLIP(tiny_clip, TINY_CLASSNAMES), PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    uncached.constant_cache_size = 0  # recomputes every time: the reference behaviour
    passes, results = {}, {}
    for pclip, key in ((cached, "cached"), (uncached, "uncached")):
        passes[key], results[key] = [], []
        text_features = pclip.text_features
        pclip.text_features = lambda blocks, f=text_features, log=passes[key]: log.append(len(blocks)) or f(blocks)
        state, prompt = {}, None
        for round_index in range(3):
            method = make_method("adaprompt", threshold=0.0, buffer_size=8)  # a new object every round
            method.load_state_dict(state)
            prompt = prompt or method.initial_prompt(pclip)
            result = method.adapt(pclip, prompt, make_pixels(8, seed=round_index), torch.Generator())
            state, prompt = method.state_dict(), result.prompt
            results[key].append(result)
    # per round: the tuned pass and the after pass; the labeller's pass in round 1 only (else every round)
    assert len(passes["cached"]) == 1 + 2 * 3 and len(passes["uncached"]) == 3 * 3
    assert all(r.stats["updated"] == 1 for r in results["cached"])
    for got, want in zip(results["cached"], results["uncached"], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got.prompt, want.prompt, strict=True))
        assert torch.equal(got.predictions, want.predictions) and got.h_pre == want.h_pre


def test_adaprompt_round_one_reuses_the_labellers_features_for_the_received_p0(tiny_clip, make_pixels):
    from fedrapp_app.engine import PromptedCLIP

    pclip = PromptedCLIP(tiny_clip, TINY_CLASSNAMES)
    passes = []
    text_features = pclip.text_features
    pclip.text_features = lambda blocks: passes.append(len(blocks)) or text_features(blocks)
    method = make_method("adaprompt", threshold=0.0)  # buffer of 64: no update on a batch of 8
    result = method.adapt(pclip, method.initial_prompt(pclip), make_pixels(8), torch.Generator())
    assert result.stats["updated"] == 0 and passes == [3]  # one pass serves the labeller and "before"


def test_adaprompt_honours_the_threshold(tiny_pclip, make_pixels):
    pixels = make_pixels(24)
    features = tiny_pclip.image_features(pixels)
    probabilities = tiny_pclip.logits(
        features, tiny_pclip.text_features(make_method("adaprompt").initial_prompt(tiny_pclip))
    ).softmax(-1)
    confidences = probabilities.max(-1).values
    threshold = float(confidences.median())
    method = make_method("adaprompt", threshold=threshold)
    result = method.adapt(tiny_pclip, method.initial_prompt(tiny_pclip), pixels, torch.Generator())
    expected = int((confidences > threshold).sum())
    assert 0 < expected < 24 and result.stats["buffer_fill"] == expected
    assert (method.buffer.confidences > threshold).all()


def test_adaprompt_pseudo_labels_come_from_the_initial_prompts(tiny_pclip, make_pixels):
    method = make_method("adaprompt", threshold=0.0, buffer_size=8, lr=0.5)
    initial = method.initial_prompt(tiny_pclip)
    results, _ = run_rounds(method, tiny_pclip, [make_pixels(8, seed=s) for s in range(6)], initial)
    assert sum(r.stats["updated"] for r in results) == 6
    tuned = results[-1].prompt
    pixels = make_pixels(8, seed=99)
    features = tiny_pclip.image_features(pixels)
    with torch.no_grad():
        initial_probs = tiny_pclip.logits(features, tiny_pclip.text_features(initial)).softmax(-1)
        tuned_probs = tiny_pclip.logits(features, tiny_pclip.text_features(tuned)).softmax(-1)
    # the prompts did move, so a labeller using them would store other confidences: the test can tell
    assert (initial_probs.max(-1).values - tuned_probs.max(-1).values).abs().min() > 1e-4
    # The same client state in a larger buffer, so that every new sample is stored and can be checked.
    roomy = make_method("adaprompt", threshold=0.0, buffer_size=64, lr=0.5)
    roomy.load_state_dict(method.state_dict())
    roomy.adapt(tiny_pclip, tuned, pixels, torch.Generator())
    matched = 0
    for row, feature in enumerate(roomy.buffer.features):
        hits = (features == feature).all(-1).nonzero()
        if len(hits):
            sample = int(hits[0, 0])
            assert int(roomy.buffer.labels[row]) == int(initial_probs[sample].argmax())
            assert abs(float(roomy.buffer.confidences[row]) - float(initial_probs[sample].max())) < 1e-6
            matched += 1
    assert matched == 8


@pytest.mark.parametrize("double_softmax", [True, False])
def test_adaprompt_loss_is_cross_entropy_on_the_buffer(tiny_pclip, make_pixels, double_softmax):
    method = make_method("adaprompt", threshold=0.0, buffer_size=8, double_softmax=double_softmax)
    prompt = method.initial_prompt(tiny_pclip)
    result = method.adapt(tiny_pclip, prompt, make_pixels(8), torch.Generator())
    with torch.no_grad():
        logits = tiny_pclip.logits(method.buffer.features, tiny_pclip.text_features(prompt))
    scores = logits.softmax(-1) if double_softmax else logits
    assert abs(result.stats["loss"] - float(F.cross_entropy(scores, method.buffer.labels))) < 1e-6


# ----- persistent state -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "params"),
    [("adaprompt", {"threshold": 0.0, "buffer-size": 8}), ("tpt-online", {"n-views": 7})],
)
@pytest.mark.kernels
def test_save_restore_continue_is_bit_identical(tiny_pclip, make_pixels, name, params):
    batches = [make_pixels(6, seed=s) for s in range(5)]
    straight = make_method(name, params)
    prompt0 = straight.initial_prompt(tiny_pclip)
    expected, _ = run_rounds(straight, tiny_pclip, batches, prompt0)

    first = make_method(name, params)
    _, prompt = run_rounds(first, tiny_pclip, batches[:2], prompt0)
    state = first.state_dict()
    assert state and all(isinstance(v, np.ndarray) for v in state.values())
    assert all(v.shape == () for k, v in state.items() if ".step." in k)
    resumed = make_method(name, params)  # a new client process
    resumed.load_state_dict({k: v.copy() for k, v in state.items()})
    tail, _ = run_rounds(resumed, tiny_pclip, batches[2:], prompt, first_round=2)
    for got, want in zip(tail, expected[2:], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got.prompt, want.prompt, strict=True))
        assert torch.equal(got.predictions, want.predictions) and got.h_post == want.h_post

    fresh = make_method(name, params)  # without the restored state the run differs: the state matters
    other, _ = run_rounds(fresh, tiny_pclip, batches[2:3], prompt, first_round=2)
    assert not all(torch.equal(a, b) for a, b in zip(other[0].prompt, expected[2].prompt, strict=True))


def test_state_dicts_reject_foreign_keys():
    with pytest.raises(ValueError, match="unknown client-state keys"):
        make_method("adaprompt").load_state_dict({"momentum": np.zeros(3)})
    with pytest.raises(ValueError, match="keeps no client state"):
        make_method("tpt").load_state_dict({"optimizer.step.0": np.array(1.0)})
    assert make_method("zeroshot").state_dict() == {} and make_method("tpt").state_dict() == {}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_batch_of_one_just_works(tiny_pclip, make_pixels, name):
    method = make_method(
        name,
        {"n-views": 3}
        if name.startswith("tpt")
        else {"threshold": 0.0, "buffer-size": 1}
        if name == "adaprompt"
        else {},
    )
    result = method.adapt(tiny_pclip, method.initial_prompt(tiny_pclip), make_pixels(1), torch.Generator())
    assert result.predictions.shape == (1,) and result.predictions_before.shape == (1,)
    assert np.isfinite(result.h_pre) and np.isfinite(result.h_post)
    assert all(block.dtype == torch.float32 and block.device.type == "cpu" for block in result.prompt)
