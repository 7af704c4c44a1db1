"""The own last tuned prompt (ours, issue 15): every method keeps it in its client state when asked and scores it on
the next batch (H_own), and the wire format carries H_own as an optional metric the rule may read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict

from fedrapp_app.config import RunConfig
from fedrapp_app.federation.records import METRICS, PROMPT, RejectedReply, parse_train_reply, prompt_to_record
from fedrapp_app.methods import BUILT_IN as METHODS
from fedrapp_app.methods import find_method, make_method
from fedrapp_app.methods.base import OwnPrompt, batch_marginal_entropy, mean_entropy, neighbour_votes
from fedrapp_app.methods.trainingfree import TrainingFree
from fedrapp_app.methods.zeroshot import ZeroShot

#: Small settings that make every method update from its first batch on the tiny CLIP.
PARAMS = {
    "adaprompt": {"threshold": 0.0, "buffer_size": 4},
    "im": {},
    "tpt": {"n_views": 3},
    "tpt-online": {"n_views": 3},
    "zeroshot": {},
    "zero": {"n_views": 4},
}
#: The methods that tune no prompt (zero-shot and the training-free ones): their own prompt is the received one.
TRAINING_FREE = sorted(n for n in METHODS if issubclass(find_method(n).target.load(), (ZeroShot, TrainingFree)))
TUNED = sorted(set(METHODS) - set(TRAINING_FREE))


def rounds(method, pclip, batches, nudge: float = 0.01):
    """Run batches in order; each round receives the last tuned prompt nudged (a server sent something else)."""
    prompt, results = method.initial_prompt(pclip), []
    for k, pixels in enumerate(batches):
        results.append(method.adapt(pclip, prompt, pixels, torch.Generator().manual_seed(k)))
        prompt = [block + nudge * (k + 1) for block in results[-1].prompt]
    return results


@pytest.mark.parametrize("name", TUNED)
def test_h_own_is_the_entropy_of_the_last_tuned_prompt_on_the_new_batch(tiny_pclip, make_pixels, name):
    batches = [make_pixels(6, seed=s) for s in range(3)]
    results = rounds(make_method(name, PARAMS.get(name, {}), own_prompt=True), tiny_pclip, batches)
    assert results[0].h_own is None and results[0].predictions_own is None  # no own prompt before round 1
    for previous, result, pixels in zip(results, results[1:], batches[1:], strict=False):
        with torch.no_grad():
            features = tiny_pclip.image_features(pixels)  # TPT scores the original views: the same features
            logits = tiny_pclip.logits(features, tiny_pclip.text_features(previous.prompt))
        assert result.h_own == pytest.approx(mean_entropy(logits), rel=1e-5, abs=1e-6)
        assert torch.equal(result.predictions_own, logits.argmax(-1))
        assert 0.0 <= result.stats["own_agreement"] <= 1.0 and result.stats["own_marginal_entropy"] >= 0.0
        votes = neighbour_votes(features, result.predictions_before, result.predictions_own)
        assert (result.v_pre, result.v_own) == pytest.approx(votes)  # the neighbours of the same images


@pytest.mark.parametrize("name", sorted(METHODS))
def test_keeping_the_own_prompt_changes_no_prompt_and_no_prediction(tiny_pclip, make_pixels, name):
    batches = [make_pixels(5, seed=s) for s in range(3)]
    plain = rounds(make_method(name, PARAMS.get(name, {})), tiny_pclip, batches)
    tracked = rounds(make_method(name, PARAMS.get(name, {}), own_prompt=True), tiny_pclip, batches)
    for a, b in zip(plain, tracked, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.prompt, b.prompt, strict=True))
        assert torch.equal(a.predictions, b.predictions) and torch.equal(a.predictions_before, b.predictions_before)
        assert (a.h_pre, a.h_post) == (b.h_pre, b.h_post) and a.h_own is None


@pytest.mark.parametrize("name", TUNED)
def test_the_own_prompt_survives_a_new_client_process(tiny_pclip, make_pixels, name):
    batches = [make_pixels(6, seed=s) for s in range(3)]
    straight = rounds(make_method(name, PARAMS.get(name, {}), own_prompt=True), tiny_pclip, batches)
    first = make_method(name, PARAMS.get(name, {}), own_prompt=True)
    done = rounds(first, tiny_pclip, batches[:2])
    state = first.state_dict()
    assert any(key.startswith(OwnPrompt.PREFIX) for key in state)
    resumed = make_method(name, PARAMS.get(name, {}), own_prompt=True)
    resumed.load_state_dict({k: v.copy() for k, v in state.items()})
    prompt = [block + 0.02 for block in done[-1].prompt]
    again = resumed.adapt(tiny_pclip, prompt, batches[2], torch.Generator().manual_seed(2))
    assert again.h_own == straight[2].h_own  # the kept prompt came back bit for bit
    plain = make_method(name, PARAMS.get(name, {}))  # off: nothing is kept
    rounds(plain, tiny_pclip, batches[:2])
    assert not any(key.startswith(OwnPrompt.PREFIX) for key in plain.state_dict())


@pytest.mark.parametrize("name", TRAINING_FREE)
def test_a_training_free_method_reports_its_entropy_before_as_h_own(tiny_pclip, make_pixels, name):
    method = make_method(name, PARAMS.get(name, {}), own_prompt=True)
    result = method.adapt(tiny_pclip, method.initial_prompt(tiny_pclip), make_pixels(4), torch.Generator())
    assert result.h_own == result.h_pre and torch.equal(result.predictions_own, result.predictions_before)


def test_a_kept_prompt_of_another_shape_or_bad_keys_are_refused(tiny_pclip, make_pixels):
    method = make_method("im", own_prompt=True)
    with pytest.raises(ValueError, match="own-prompt state keys"):
        method.load_state_dict({"own.block-1": np.zeros((4, 32), np.float32)})
    method.load_state_dict({"own.block-0": np.zeros((3, 32), np.float32)})
    with pytest.raises(ValueError, match="another method or setting"):
        method.adapt(tiny_pclip, method.initial_prompt(tiny_pclip), make_pixels(2), torch.Generator())


def test_the_run_config_turns_the_own_prompt_on_where_it_is_read():
    def own(**overrides) -> bool:
        return RunConfig.from_run_config(overrides).method_params()[1].get("own_prompt", False)

    assert not own() and not own(**{"strategy": "fedavg"})
    assert own(**{"report-own-prompt": True}) and own(**{"trust": True})


# ----- the wire -------------------------------------------------------------------------------------------
SHAPES = [(4, 8)]


def _reply(**metrics) -> RecordDict:
    values = {"client-id": 1, "h-pre": 2.0, "h-post": 1.5, "num-examples": 16, **metrics}
    blocks = [np.ones(SHAPES[0], np.float32)]
    return RecordDict({METRICS: MetricRecord(values), PROMPT: prompt_to_record(blocks)})


def test_h_own_is_an_optional_rule_metric():
    assert parse_train_reply(_reply(), 1, SHAPES, max_norm=1e3).h_own is None  # the paper's reply stays valid
    upload = parse_train_reply(_reply(**{"h-own": 1.25, "correct-own": 3}), 1, SHAPES, max_norm=1e3)
    assert upload.h_own == 1.25 and "h-own" not in upload.report and upload.report["correct-own"] == 3
    for bad in (-0.5, float("nan")):
        with pytest.raises(RejectedReply, match="h-own"):
            parse_train_reply(_reply(**{"h-own": bad}), 1, SHAPES, max_norm=1e3)


def test_the_neighbour_votes_travel_as_optional_rule_metrics_within_0_and_1():
    upload = parse_train_reply(_reply(**{"v-pre": 0.25, "v-own": 0.0}), 1, SHAPES, max_norm=1e3)
    assert (upload.v_pre, upload.v_own) == (0.25, 0.0) and "v-pre" not in upload.report
    for bad in (-0.1, 1.5, float("inf")):
        with pytest.raises(RejectedReply, match="v-own"):
            parse_train_reply(_reply(**{"v-pre": 0.25, "v-own": bad}), 1, SHAPES, max_norm=1e3)


def _two_clusters() -> torch.Tensor:
    """Eight unit image features: images 0-3 near e0, images 4-7 near e1 (Tensor[8, 3])."""
    base = torch.tensor([[1.0, 0.0, 0.0]] * 4 + [[0.0, 1.0, 0.0]] * 4)
    wobble = 0.05 * torch.arange(8, dtype=torch.float32)[:, None] * torch.tensor([[0.0, 0.0, 1.0]])
    return torch.nn.functional.normalize(base + wobble, dim=1)


def test_neighbour_votes_side_with_the_prompt_that_labels_an_image_like_its_neighbours():
    features = _two_clusters()
    a = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])  # labels each cluster alike
    b = torch.tensor([0, 0, 0, 2, 1, 1, 1, 3])  # breaks image 3 (cluster 0) and image 7 (cluster 1)
    score_a, score_b = neighbour_votes(features, a, b, k=2)
    # two disagreements; each one's 2 nearest agreeing images share a's label: a gets 2 × 1 / 8
    assert score_a == pytest.approx(2 / 8) and score_b == 0.0
    assert neighbour_votes(features, b, a, k=2) == (score_b, score_a)  # symmetric in the two prompts


def test_neighbour_votes_are_zero_without_disagreement_or_without_referees():
    features = _two_clusters()
    a = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert neighbour_votes(features, a, a.clone()) == (0.0, 0.0)
    assert neighbour_votes(features, a, a + 5) == (0.0, 0.0)  # they differ everywhere: nobody referees


def test_neighbour_votes_do_not_reward_a_collapse():
    """A prompt that puts every image in one class is not right by agreeing with itself: the referees are the
    images both prompts label alike, so where the collapsed prompt disagrees it loses to the spread one."""
    features = _two_clusters()
    spread = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    collapsed = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])  # cluster 1 half pulled into class 0
    score_spread, score_collapsed = neighbour_votes(features, spread, collapsed, k=2)
    assert score_spread > score_collapsed


# ------------------------------------------------------------------ the probe (ours: FedRAPP's trust probe)
@pytest.mark.parametrize("name", TUNED)
def test_a_probe_is_scored_against_the_own_prompt_and_a_probe_equal_to_the_received_prompt_scores_like_it(
    tiny_pclip, make_pixels, name
):
    """The probe's entropy and marginal are the formulas on its own logits; sent the received prompt as the probe, a
    client reports for it exactly what it reports for the received prompt; no prompt or prediction moves."""
    batches = [make_pixels(6, seed=s) for s in range(3)]
    plain = rounds(make_method(name, PARAMS.get(name, {}), own_prompt=True), tiny_pclip, batches)
    method, prompt = make_method(name, PARAMS.get(name, {}), own_prompt=True), None
    for k, pixels in enumerate(batches):
        prompt = method.initial_prompt(tiny_pclip) if k == 0 else [b + 0.01 * k for b in plain[k - 1].prompt]
        probe = [np.asarray(b, dtype=np.float32) * (1.0 + 0.05 * k) + 0.02 for b in prompt]
        method.set_probe(probe)
        result = method.adapt(tiny_pclip, prompt, pixels, torch.Generator().manual_seed(k))
        assert all(torch.equal(a, b) for a, b in zip(result.prompt, plain[k].prompt, strict=True))
        assert torch.equal(result.predictions, plain[k].predictions) and result.h_pre == plain[k].h_pre
        if k == 0:
            assert result.probe is None  # no own prompt yet: nothing to score the probe against
            continue
        with torch.no_grad():
            features = tiny_pclip.image_features(pixels)
            logits = tiny_pclip.logits(features, tiny_pclip.text_features([torch.from_numpy(b) for b in probe]))
        assert result.probe.h_probe == pytest.approx(mean_entropy(logits), rel=1e-5, abs=1e-6)
        assert result.probe.hm_probe == pytest.approx(batch_marginal_entropy(logits), rel=1e-5, abs=1e-6)
        assert torch.equal(result.probe.predictions, logits.argmax(-1))
    same = make_method(name, PARAMS.get(name, {}), own_prompt=True)
    for k, pixels in enumerate(batches):
        prompt = same.initial_prompt(tiny_pclip) if k == 0 else [b + 0.01 * k for b in plain[k - 1].prompt]
        same.set_probe([np.asarray(b, dtype=np.float32) for b in prompt])
        result = same.adapt(tiny_pclip, prompt, pixels, torch.Generator().manual_seed(k))
    assert result.probe.h_probe == pytest.approx(result.h_pre, rel=1e-5)
    assert result.probe.hm_probe == pytest.approx(result.hm_pre, rel=1e-5)
    assert torch.equal(result.probe.predictions, result.predictions_before)


def test_a_probe_of_another_shape_is_refused_and_zero_shot_ignores_it(tiny_pclip, make_pixels):
    method = make_method("im", PARAMS["im"], own_prompt=True)
    first = method.adapt(tiny_pclip, method.initial_prompt(tiny_pclip), make_pixels(4, seed=0), torch.Generator())
    method.set_probe([np.zeros((1, 2), np.float32)])
    with pytest.raises(ValueError, match="the probe has blocks"):
        method.adapt(tiny_pclip, first.prompt, make_pixels(4, seed=1), torch.Generator())
    zeroshot = make_method("zeroshot", {}, own_prompt=True)
    zeroshot.set_probe([np.zeros((1, 2), np.float32)])
    assert (
        zeroshot.adapt(tiny_pclip, zeroshot.initial_prompt(tiny_pclip), make_pixels(4), torch.Generator()).probe is None
    )


def test_the_probes_reports_travel_as_optional_rule_metrics_within_their_ranges():
    probe = {"h-probe": 0.4, "hm-probe": 2.0}
    upload = parse_train_reply(_reply(**probe), 1, SHAPES, 1e6)
    assert (upload.h_probe, upload.hm_probe) == (0.4, 2.0)
    assert not set(probe) & set(upload.report)  # rule inputs, not reporting
    for bad in ({"hm-probe": float("nan")}, {"h-probe": -1.0}):
        with pytest.raises(RejectedReply, match=next(iter(bad))):
            parse_train_reply(_reply(**{**probe, **bad}), 1, SHAPES, 1e6)
