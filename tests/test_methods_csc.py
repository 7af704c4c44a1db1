"""Class-specific context (CoOp's CSC, ours for these methods) in tpt, tpt-online, adaprompt and im: P0 is the
shared context repeated per class (same features, golden equivalence kept), blocks are [C, n, D], and such
prompts go through the server rules and a whole in-process federation unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_CLASSNAMES
from test_methods import run_rounds

from fedrapp_app.aggregation import make_rule
from fedrapp_app.config import METHOD_KEYS, RunConfig
from fedrapp_app.federation.records import flatten, prompt_to_record, record_to_prompt, unflatten
from fedrapp_app.methods import make_method
from fedrapp_app.methods.im import im_loss
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import read_rows, run_federation, small_run

#: The prompt-tuning methods with small settings for the tiny model (few views, a buffer that fills at once).
TUNED = {
    "tpt": {"n-views": 7},
    "tpt-online": {"n-views": 7},
    "adaprompt": {"threshold": 0.0, "buffer-size": 6},
    "im": {},
}


@pytest.mark.parametrize("name", sorted(TUNED))
def test_csc_p0_repeats_the_init_context_and_keeps_its_features(tiny_pclip, name):
    shared = make_method(name, TUNED[name]).initial_prompt(tiny_pclip)
    specific = make_method(name, {**TUNED[name], "csc": True}).initial_prompt(tiny_pclip)
    num_classes = len(TINY_CLASSNAMES)
    assert [tuple(b.shape) for b in specific] == [(num_classes, *b.shape) for b in shared]
    for block, context in zip(specific, shared, strict=True):
        assert all(torch.equal(row, context) for row in block)  # every class starts from the same words
        assert block.is_contiguous() and block.data_ptr() != context.data_ptr()  # its own storage, per class
    with torch.no_grad():
        assert (tiny_pclip.text_features(specific) - tiny_pclip.text_features(shared)).abs().max() <= 1e-6
        if name != "adaprompt":  # "a photo of a": round 0 equals the zero-shot hard prompt, CSC or not
            hard = tiny_pclip.hard_prompt_features()
            assert (tiny_pclip.text_features(specific)[0] - hard).abs().max() <= 1e-5


def test_every_prompt_tuning_method_takes_the_csc_key():
    for name in TUNED:
        assert METHOD_KEYS[name]["csc"] == "csc"
        method = make_method(*RunConfig.from_run_config({"local-method": name, "csc": True}).method_params())
        assert method.params.csc is True
    assert "csc" not in METHOD_KEYS["zeroshot"]  # zeroshot tunes nothing


def test_a_csc_gradient_is_the_shared_gradient_split_over_classes(tiny_pclip, make_pixels):
    """d loss / d shared context = sum over classes of d loss / d class context (at the same point)."""
    features = tiny_pclip.image_features(make_pixels(8))
    context = tiny_pclip.context_from_text("a photo of a")
    shared = context.clone().requires_grad_(True)
    specific = context.expand(len(TINY_CLASSNAMES), *context.shape).clone().requires_grad_(True)
    for block in (shared, specific):
        im_loss(tiny_pclip.logits(features, tiny_pclip.text_features([block])))[0].backward()
    assert torch.allclose(specific.grad.sum(0), shared.grad, atol=1e-6)
    assert (specific.grad[0] - specific.grad[1]).abs().max() > 1e-6  # the classes get different gradients


@pytest.mark.parametrize("name", sorted(TUNED))
def test_csc_adaptation_moves_each_class_context_on_its_own(tiny_clip, tiny_pclip, make_pixels, name):
    method = make_method(name, {**TUNED[name], "csc": True})
    prompt = method.initial_prompt(tiny_pclip)
    result = method.adapt(tiny_pclip, prompt, make_pixels(6), torch.Generator().manual_seed(0))
    assert [b.shape for b in result.prompt] == [b.shape for b in prompt]
    moved = result.prompt[0] - prompt[0]  # [C, n, D]
    assert moved.abs().max() > 1e-4
    assert (moved[0] - moved[1]).abs().max() > 1e-6  # not one shared move copied to every class
    assert all(p.grad is None for p in tiny_clip.model.parameters())  # gradients reached the context only
    with pytest.raises(ValueError, match="expected"):  # a shared prompt is not a CSC method's prompt
        method.adapt(
            tiny_pclip, make_method(name, TUNED[name]).initial_prompt(tiny_pclip), make_pixels(2), torch.Generator()
        )


@pytest.mark.parametrize("name", ["tpt-online", "adaprompt"])
@pytest.mark.kernels
def test_csc_save_restore_continue_is_bit_identical(tiny_pclip, make_pixels, name):
    params = {**TUNED[name], "csc": True}
    batches = [make_pixels(6, seed=s) for s in range(4)]
    straight = make_method(name, params)
    expected, _ = run_rounds(straight, tiny_pclip, batches, straight.initial_prompt(tiny_pclip))
    first = make_method(name, params)
    _, prompt = run_rounds(first, tiny_pclip, batches[:2], first.initial_prompt(tiny_pclip))
    resumed = make_method(name, params)
    resumed.load_state_dict({k: v.copy() for k, v in first.state_dict().items()})
    tail, _ = run_rounds(resumed, tiny_pclip, batches[2:], prompt, first_round=2)
    for got, want in zip(tail, expected[2:], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got.prompt, want.prompt, strict=True))
        assert torch.equal(got.predictions, want.predictions)


def test_csc_prompts_round_trip_through_the_fedrapp_rule(tiny_pclip, make_pixels):
    """Three clients adapt CSC prompts; the wire record, the flattened server vectors and FedRAPP's personalized
    prompts come back as [C, n, D] blocks that the method takes as its next received prompt."""
    method = make_method("im", csc=True)
    p0 = method.initial_prompt(tiny_pclip)
    shapes = [tuple(b.shape) for b in p0]
    tuned = []
    for client in range(3):
        result = make_method("im", csc=True).adapt(tiny_pclip, p0, make_pixels(8, seed=client), torch.Generator())
        wire = record_to_prompt(prompt_to_record(result.prompt))
        assert all(np.array_equal(w, b.numpy()) for w, b in zip(wire, result.prompt, strict=True))  # bit-exact
        tuned.append(flatten(wire))
    tuned = np.stack(tuned)
    start = np.stack([flatten([b.numpy() for b in p0])] * 3)
    assert tuned.shape == (3, len(TINY_CLASSNAMES) * 4 * tiny_pclip.clip.text_width)
    out = make_rule("fedrapp")(
        tuned, start, start, np.array([1.2, 1.1, 1.3]), np.array([0.9, 1.0, 0.7]), np.ones(3, bool), np.full(3, 8)
    )
    assert out.personalized.shape == tuned.shape and np.isfinite(out.personalized).all()
    lo, hi = np.minimum(tuned.min(0), start.min(0)), np.maximum(tuned.max(0), start.max(0))
    assert ((out.personalized >= lo - 1e-6) & (out.personalized <= hi + 1e-6)).all()  # convex combinations
    assert not np.allclose(out.personalized[0], tuned[0])  # memory and peers did mix
    for client in range(3):
        received = [torch.from_numpy(b) for b in unflatten(out.personalized[client], shapes)]
        assert [tuple(b.shape) for b in received] == shapes
        again = make_method("im", csc=True).adapt(tiny_pclip, received, make_pixels(4, seed=9), torch.Generator())
        assert np.isfinite(again.h_post)


@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random CLIP whose vocabulary covers the testbed world's class names."""
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed_csc"), world.CLASSNAMES)


@pytest.mark.parametrize("method", ["im", "adaprompt"])
def test_csc_federation_runs_in_process(testbed_tiny, tmp_path, method):
    summary, grid, states = run_federation(small_run(testbed_tiny, tmp_path, **{"local-method": method, "csc": True}))
    rows = read_rows(summary["run_dir"])
    assert len(rows) == 9 and {r["status"] for r in rows} == {"ok"}
    num_classes, width = len(world.CLASSNAMES), 32  # the tiny text width
    shapes = [(num_classes, n, width) for n in ((4,) if method == "im" else (4, 5, 5))]
    p0 = grid.sent[(1, 1000)]
    assert p0.shape == (sum(np.prod(s) for s in shapes),)
    assert all(np.array_equal(grid.sent[(1, n)], p0) for n in (1001, 1002))  # everyone starts from P0
    for block in unflatten(p0, shapes):
        assert (block == block[0]).all()  # P0: the same context for every class
    last = grid.sent[(3, 1000)]
    assert not np.array_equal(last, p0)  # adaptation and aggregation moved it
    for block in unflatten(last, shapes):
        assert not np.allclose(block[0], block[1])  # and the classes apart
    assert states[3][0].shape == (3, p0.size)  # the server's memory holds flattened CSC prompts
