"""The training-free methods (ZERO, TDA, the prompt ensemble) and a prediction head stacked on AdaPrompt."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrapp_app.engine import PromptedCLIP
from fedrapp_app.federation.client import METHOD_STATE
from fedrapp_app.federation.records import record_to_arrays
from fedrapp_app.methods import PluginError, find_method, make_method, method_params
from fedrapp_app.methods.tda import TDA, ClassCache, cache_logits
from fedrapp_app.methods.zero import zero_prediction
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import permute_labels, read_rows, run_federation, small_run


# ----- ZERO's vote ---------------------------------------------------------------------------------------
def test_zero_votes_with_the_confident_views_only():
    # 5 views, 3 classes; entropies: views 0, 1, 3 are sharp, 2 and 4 flat. keep = 3.
    logits = torch.tensor(
        [[9.0, 0.0, 0.0], [0.0, 8.0, 0.0], [0.1, 0.0, 0.2], [7.0, 0.0, 0.0], [0.0, 0.3, 0.1]]
    )  # fmt: skip
    assert zero_prediction(logits, keep=3) == (0, 2)  # views 0 and 3 vote 0, view 1 votes 1
    # the flat views would outvote class 0 if they were kept
    assert zero_prediction(logits, keep=5) == (0, 2)


def test_zero_breaks_a_tie_with_the_first_discarded_view_that_names_a_tied_class():
    # kept (keep=2): view 0 -> class 0, view 1 -> class 1: a tie. Discarded by entropy: view 3 (class 2, not
    # tied), then view 2 (class 1, tied): class 1 wins.
    logits = torch.tensor([[9.0, 0.0, 0.0], [0.0, 9.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 3.0]])
    assert zero_prediction(logits, keep=2) == (1, 1)
    # no discarded view names a tied class: the first discarded view's logits over the tied classes decide
    logits = torch.tensor([[9.0, 0.0, 0.0], [0.0, 9.0, 0.0], [0.0, 1.0, 5.0]])
    assert zero_prediction(logits, keep=2) == (1, 1)


# ----- TDA's caches ---------------------------------------------------------------------------------------
def test_a_class_cache_keeps_the_lowest_losses_sorted():
    cache = ClassCache(capacity=2)
    f = torch.eye(3)
    cache.update(0, f[0], 0.5)
    cache.update(0, f[1], 0.2)
    cache.update(0, f[2], 0.9)  # worse than the worst kept: dropped
    assert [loss for _, loss, _ in cache.entries[0]] == [0.2, 0.5]
    cache.update(0, f[2], 0.3)  # replaces the 0.5 entry
    assert [loss for _, loss, _ in cache.entries[0]] == [0.2, 0.3]
    assert torch.equal(cache.entries[0][1][0], f[2])
    cache.update(1, f[0], 0.7)
    keys, labels, maps = cache.keys_and_labels()
    assert labels.tolist() == [0, 0, 1] and maps is None and torch.equal(keys[2], f[0])


class _ToyCLIP:
    """What TDA.predict reads of a PromptedCLIP: logits = 100 * cos, averaged over the K blocks."""

    logit_scale = torch.tensor(100.0)

    def logits(self, features, text):
        return PromptedCLIP.logits(self, features, text)


@pytest.mark.kernels
def test_tda_on_a_two_class_toy_equals_the_hand_computed_logits():
    """Two images in 2-d; the caches take each image before its logits are read (as the authors' code)."""
    params = method_params("tda", {"pos-alpha": 2.0, "pos-beta": 5.0, "neg-alpha": 0.5, "neg-beta": 1.0,
                                   "neg-entropy-low": 0.0, "neg-entropy-high": 1.0, "neg-mask-low": 0.03})  # fmt: skip
    tda = TDA(params)
    text = F.normalize(torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]), dim=-1)  # [K=1, C=2, E=2]
    f1 = F.normalize(torch.tensor([1.0, 0.2]), dim=0)
    f2 = F.normalize(torch.tensor([0.6, 1.0]), dim=0)
    predictions, _, stats = tda.predict(_ToyCLIP(), text, torch.stack([f1, f2])[:, None])  # views [B=2, V=1, E]

    def entropy(logits):
        p = logits.softmax(-1)
        return float(-(p * p.log()).sum())

    clip1, clip2 = 100 * text[0] @ f1, 100 * text[0] @ f2
    h1, h2 = entropy(clip1), entropy(clip2)
    in_neg = [0 < h / math.log2(2) < 1 for h in (h1, h2)]
    assert in_neg == [True, True]
    # image 1: class 0; the caches hold image 1 only
    pos1 = 2.0 * math.exp(-5.0 * (1 - float(f1 @ f1))) * torch.tensor([1.0, 0.0])
    mask1 = ((clip1.softmax(-1) > 0.03) & (clip1.softmax(-1) < 1.0)).float()
    logits1 = clip1 + pos1 - 0.5 * math.exp(-1.0 * (1 - float(f1 @ f1))) * mask1
    # image 2: class 1; the caches hold both
    mask2 = ((clip2.softmax(-1) > 0.03) & (clip2.softmax(-1) < 1.0)).float()
    pos2 = 2.0 * (math.exp(-5 * (1 - float(f2 @ f1))) * torch.tensor([1.0, 0]) + torch.tensor([0, 1.0]))
    neg2 = 0.5 * (math.exp(-(1 - float(f2 @ f1))) * mask1 + mask2)
    logits2 = clip2 + pos2 - neg2
    assert predictions.tolist() == [int(logits1.argmax()), int(logits2.argmax())]
    assert stats["positive_cache"] == 2 and stats["negative_cache"] == 2
    # the cache logits themselves, for image 2
    keys, labels, _ = tda.positive.keys_and_labels()
    got = cache_logits(f2, keys, F.one_hot(labels, 2).float(), 2.0, 5.0)
    torch.testing.assert_close(got, pos2, rtol=1e-6, atol=1e-6)


def test_tda_caches_survive_a_state_round_trip(tiny_pclip, make_pixels):
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    one = make_method("tda", {"neg-entropy-low": 0.0, "neg-entropy-high": 2.0})
    p0 = one.initial_prompt(tiny_pclip)
    one.adapt(tiny_pclip, p0, make_pixels(8, seed=1), gen())
    state = one.state_dict()
    assert {"pos.features", "pos.labels", "pos.losses", "neg.probabilities"} <= set(state)
    two = make_method("tda", {"neg-entropy-low": 0.0, "neg-entropy-high": 2.0})
    two.load_state_dict(state)
    a = one.adapt(tiny_pclip, p0, make_pixels(8, seed=2), gen())
    b = two.adapt(tiny_pclip, p0, make_pixels(8, seed=2), gen())
    assert torch.equal(a.predictions, b.predictions)
    after_a, after_b = one.state_dict(), two.state_dict()
    assert after_a.keys() == after_b.keys()
    assert all(np.array_equal(after_a[k], after_b[k]) for k in after_a)
    with pytest.raises(ValueError, match="unknown client-state keys"):
        two.load_state_dict({"buffer.labels": np.zeros(1)})


# ----- the methods leave the prompt alone ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["zero", "tda", "zeroshot-ensemble"])
@pytest.mark.kernels
def test_a_training_free_method_uploads_the_received_prompt_bit_for_bit(tiny_pclip, make_pixels, name):
    method = make_method(name, {"n-views": 7} if name == "zero" else {})
    received = [block + 0.01 * torch.randn(block.shape, generator=torch.Generator().manual_seed(3))
                for block in method.initial_prompt(tiny_pclip)]  # fmt: skip
    out = method.adapt(tiny_pclip, received, make_pixels(6), torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(out.prompt, received, strict=True))
    assert out.h_pre == out.h_post and out.predictions.shape == (6,)


def test_the_prompt_ensemble_is_the_normalised_mean_of_its_templates(tiny_clip):
    names = ("cat", "tulip")
    templates = ("a photo of a {}.", "a {}.")
    ensemble = PromptedCLIP(tiny_clip, names, templates=templates).ensemble_features()
    singles = [PromptedCLIP(tiny_clip, names, template).hard_prompt_features() for template in templates]
    torch.testing.assert_close(ensemble, F.normalize((singles[0] + singles[1]) / 2, dim=-1))
    with pytest.raises(ValueError, match="exactly one"):
        PromptedCLIP(tiny_clip, names, templates=("no slot",))


# ----- stacked on AdaPrompt ------------------------------------------------------------------------------
def test_a_stacked_head_changes_the_predictions_only(tiny_pclip, make_pixels):
    base = make_method("adaprompt", {"buffer-size": 4, "threshold": 0.0})
    stacked = make_method("adaprompt+tda", {"buffer-size": 4, "threshold": 0.0, "tda-pos-alpha": 50.0})
    p0 = base.initial_prompt(tiny_pclip)
    for seed in (1, 2):  # the second batch tunes (the buffer is full)
        a = base.adapt(tiny_pclip, p0, make_pixels(8, seed), torch.Generator().manual_seed(seed))
        b = stacked.adapt(tiny_pclip, p0, make_pixels(8, seed), torch.Generator().manual_seed(seed))
        assert all(torch.equal(x, y) for x, y in zip(a.prompt, b.prompt, strict=True))
        assert (a.h_pre, a.h_post) == (b.h_pre, b.h_post)
        assert torch.equal(a.predictions_before, b.predictions_before)
    assert "tda_changed" in b.stats and b.stats["updated"] == 1.0
    state = stacked.state_dict()
    assert any(k.startswith("buffer.") for k in state) and any(k.startswith("tda.pos.") for k in state)
    again = make_method("adaprompt+tda", {"buffer-size": 4, "threshold": 0.0, "tda-pos-alpha": 50.0})
    again.load_state_dict(state)
    saved = again.state_dict()
    assert saved.keys() == state.keys() and all(np.array_equal(saved[k], state[k]) for k in state)


def test_stacked_parameters_route_to_their_part_and_bad_stacks_are_refused():
    params = method_params("adaprompt+zero", {"lr": 0.01, "zero-n-views": 15})
    assert params.lr == 0.01 and params.zero_n_views == 15 and not hasattr(params, "zero_classifier")
    with pytest.raises(ValueError, match="keep_ratio"):
        method_params("adaprompt+zero", {"zero-keep-ratio": 0})
    with pytest.raises(PluginError, match="not a prediction head"):
        find_method("adaprompt+im")
    with pytest.raises(PluginError, match="tunes no prompt"):
        find_method("zeroshot+tda")
    with pytest.raises(PluginError):
        find_method("adaprompt+nothing")


# ----- in a federation -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


def _states(grid) -> dict:
    return {node: record_to_arrays(c.state[METHOD_STATE]) for node, c in grid.contexts.items()}


def test_labels_never_reach_a_prompt_or_a_cache(testbed_tiny, tmp_path, monkeypatch):
    """Permuting every stream's labels changes the score, not the prompts, TDA's caches or the predictions'
    inputs (AdaPrompt + TDA under FedRAPP)."""
    run = {"local-method": "adaprompt+tda"}
    base, grid_a, _ = run_federation(small_run(testbed_tiny, tmp_path / "a", **run))
    permute_labels(monkeypatch, len(world.CLASSNAMES), seed=7)
    other, grid_b, _ = run_federation(small_run(testbed_tiny, tmp_path / "b", **run))
    assert grid_a.sent.keys() == grid_b.sent.keys()
    assert all(np.array_equal(grid_a.sent[k], grid_b.sent[k]) for k in grid_a.sent)
    states_a, states_b = _states(grid_a), _states(grid_b)
    assert any(k.startswith("tda.pos.") for k in states_a[1000])
    assert all(np.array_equal(states_a[n][k], states_b[n][k]) for n in states_a for k in states_a[n])
    assert base["micro_accuracy"] != other["micro_accuracy"]


def test_a_training_free_federation_does_not_depend_on_the_rule(testbed_tiny, tmp_path):
    """Every client uploads what it received, so FedRAPP, FedAvg and none-fed send P0 and score alike."""
    scores = {}
    for strategy in ("none-fed", "fedrapp", "fedavg"):
        summary, grid, _ = run_federation(
            small_run(testbed_tiny, tmp_path / strategy, strategy=strategy, **{"local-method": "tda"})
        )
        p0 = grid.sent[(1, 1000)]
        assert all(np.array_equal(v, p0) for v in grid.sent.values())
        scores[strategy] = [r["correct"] for r in read_rows(summary["run_dir"])]
    assert scores["fedrapp"] == scores["none-fed"] == scores["fedavg"]


def test_every_stream_carries_its_presets_prompt_ensemble():
    from fedrapp_app.data import DataSpec, build_client_stream
    from fedrapp_app.data.presets import get_preset

    stream = build_client_stream(DataSpec(dataset="testbed", num_clients=2, testbed_samples=64), 0)
    assert stream.templates == get_preset("testbed").ensemble and len(stream.templates) == 4
    assert get_preset("imagenet").templates[0] == "itap of a {}."
    assert get_preset("dtd").templates == ("{} texture.",)  # the template alone, as TDA does


def test_a_bench_cell_of_a_stacked_method_keeps_its_base_keys():
    """csc and adaprompt-lr change an 'adaprompt+tda' cell, so they are part of its identity (resume)."""
    from fedrapp_app.bench.schema import irrelevant_keys

    assert not {"csc", "adaprompt-lr"} & irrelevant_keys("fedrapp", "adaprompt+tda")
    assert "im-lr" in irrelevant_keys("fedrapp", "adaprompt+tda")
