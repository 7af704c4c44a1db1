"""Latte (Bao et al., ICCV 2025) as a built-in peer: the client and the server against the authors' code
(baowenxuan/Latte ``src/methods/Latte.py``, transcribed below for one sample at a time), its payload on the wire
(validated like a prompt, refused when malformed), the run config's pairing checks, and a federation of Latte
clients resumed and with permuted labels."""

from __future__ import annotations

import math
from bisect import bisect_left
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedrapp_app.aggregation.latte import LatteRuleParams, latte_round
from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.federation.records import (
    MAX_PAYLOAD_VALUES,
    PAYLOAD,
    RejectedReply,
    parse_train_reply,
    prompt_to_record,
)
from fedrapp_app.methods import make_method
from fedrapp_app.methods.latte import ENTROPIES, PROTOTYPES
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import interrupt_after, permute_labels, read_rows, run_federation, small_run

SCALE = 100.0


# ----------------------------------------------------------------------- the authors' client, one sample at a time
class AuthorsClient:
    """LatteClient.update_cache / compute_cache_logits / predict / upload_cache, transcribed (float32, cpu)."""

    def __init__(self, clip_weights, local_shots, external_shots, alpha, beta, gamma, prototype_gamma):
        self.clip_weights = clip_weights
        self.num_class, self.feat_dim = clip_weights.shape
        self.shots, self.alpha, self.beta, self.gamma, self.pgamma = local_shots, alpha, beta, gamma, prototype_gamma
        self.local_ent = [[] for _ in range(self.num_class)]
        self.local_cache = torch.zeros(self.num_class, local_shots, self.feat_dim)
        self.local_cache_ent = torch.ones(self.num_class, local_shots)
        self.external_cache = torch.zeros(self.num_class, external_shots, self.feat_dim)
        self.external_cache_ent = torch.ones(self.num_class, external_shots)
        self.max_ent = math.log(self.num_class)

    def update_cache(self, pred, feature, new_ent):
        cache, cache_ent, ent_lists = self.local_cache, self.local_cache_ent, self.local_ent
        if len(ent_lists[pred]) >= self.shots:
            old_ent, old_idx = ent_lists[pred][-1]
            if new_ent < old_ent:
                cache[pred][old_idx] = feature
                cache_ent[pred][old_idx] = new_ent / self.max_ent
                ent_lists[pred].pop()
                new_item = (new_ent, old_idx)
                ent_lists[pred].insert(bisect_left(ent_lists[pred], new_item), new_item)
        else:
            idx = len(ent_lists[pred])
            cache[pred][idx] = feature
            cache_ent[pred][idx] = new_ent / self.max_ent
            new_item = (new_ent, idx)
            ent_lists[pred].insert(bisect_left(ent_lists[pred], new_item), new_item)

    def compute_cache_logits(self, image_feature, cache, cache_ent):
        affinity = cache @ image_feature.T
        attn = (self.beta * (affinity - 1)).exp()
        attn.mul_((-self.gamma * cache_ent.unsqueeze(2)).exp())
        w = (cache.unsqueeze(3) * attn.unsqueeze(2)).sum(dim=1).permute(2, 0, 1)
        is_empty = w.norm(dim=2) <= 1e-3
        w = F.normalize(w, dim=2)
        w[is_empty] = 0.0
        return self.alpha * SCALE * (image_feature.unsqueeze(1) * w).sum(dim=2)

    def predict(self, image_feature):  # [1, E]
        clip_logits = SCALE * image_feature @ self.clip_weights.T
        pred = clip_logits.argmax(dim=1).item()
        ent = float(-(clip_logits.softmax(1) * clip_logits.log_softmax(1)).sum(1).item())
        self.update_cache(pred, image_feature[0], ent)
        cache = torch.cat([self.local_cache, self.external_cache], dim=1)
        cache_ent = torch.cat([self.local_cache_ent, self.external_cache_ent], dim=1)
        selected = cache_ent.argsort(dim=1, stable=True)[:, : self.shots]
        cache = torch.gather(cache, 1, selected.unsqueeze(-1).expand(-1, -1, self.feat_dim))
        cache_ent = torch.gather(cache_ent, 1, selected)
        return (clip_logits + self.compute_cache_logits(image_feature, cache, cache_ent)).argmax(dim=1).item()

    def upload_cache(self):
        weights = (-self.pgamma * self.local_cache_ent).exp().unsqueeze(2)
        prototypes = F.normalize((self.local_cache * weights).mean(dim=1), dim=1)
        logits = SCALE * prototypes @ self.clip_weights.T
        return prototypes, -(logits.softmax(1) * logits.log_softmax(1)).sum(1) / self.max_ent


class FixedCLIP:
    """What Latte reads of a PromptedCLIP: the logit scale, logits, and the classifier (via classifier_features)."""

    def __init__(self, clip_weights):
        self.clip_weights = clip_weights
        self.classnames = [str(c) for c in range(clip_weights.shape[0])]
        self.logit_scale = torch.tensor(SCALE)

    def logits(self, image_features, text_features):
        return self.logit_scale * torch.einsum("be,kce->bc", image_features, text_features) / text_features.shape[0]


def test_the_client_predicts_and_uploads_as_the_authors_code_does():
    """A stream of 200 clustered embeddings over 6 classes, an external memory from a 'server' in between: the
    same predictions image by image, the same local memory, the same prototypes and entropies."""
    gen = torch.Generator().manual_seed(0)
    classes, dim = 6, 16
    clip_weights = F.normalize(torch.randn(classes, dim, generator=gen), dim=1)
    centres = F.normalize(clip_weights + 0.6 * torch.randn(classes, dim, generator=gen), dim=1)
    labels = torch.randint(0, classes, (200,), generator=gen)
    features = F.normalize(centres[labels] + 0.35 * torch.randn(200, dim, generator=gen), dim=1)
    params = {"local-capacity": 4, "alpha": 1.0, "beta": 8.0, "gamma": 1.5, "prototype-gamma": 1.5}
    theirs = AuthorsClient(clip_weights, 4, 3, 1.0, 8.0, 1.5, 1.5)
    ours = make_method("latte", params)
    pclip, text = FixedCLIP(clip_weights), clip_weights.unsqueeze(0)
    external = F.normalize(torch.randn(classes, 3, dim, generator=gen), dim=-1)
    external_h = torch.rand(classes, 3, generator=gen)
    changed = 0
    for start in range(0, 200, 50):
        if start == 100:  # the server's sync: both get the same external memory
            theirs.external_cache, theirs.external_cache_ent = external.clone(), external_h.clone()
            ours.receive({PROTOTYPES: external.numpy(), ENTROPIES: external_h.numpy()})
        expected = [theirs.predict(features[i : i + 1]) for i in range(start, start + 50)]
        got, confidence, _ = ours.predict(pclip, text, features[start : start + 50].unsqueeze(1))
        assert got.tolist() == expected and bool(((confidence >= 0) & (confidence <= 1)).all())
        changed += int((got != (features[start : start + 50] @ clip_weights.T).argmax(1)).sum())
    assert changed > 10  # the memories did change predictions (the comparison is not CLIP's alone)
    assert torch.equal(ours.local, theirs.local_cache)
    assert torch.allclose(ours._local_normalised(classes), theirs.local_cache_ent)
    prototypes, entropies = theirs.upload_cache()
    upload = ours.prototypes(pclip)
    assert np.allclose(upload[PROTOTYPES], prototypes.numpy(), atol=1e-6)
    assert np.allclose(upload[ENTROPIES], entropies.numpy(), atol=1e-5)


def test_the_server_picks_the_peers_as_the_authors_subset_selection_does():
    """LatteServer.subset_selection on a global memory, against the rule's payload and its collaboration matrix."""
    rng = np.random.default_rng(1)
    n, classes, dim, shots = 7, 5, 12, 3
    prototypes = rng.normal(size=(n, classes, dim))
    prototypes /= np.linalg.norm(prototypes, axis=-1, keepdims=True)
    entropies = rng.uniform(0.1, 1.0, (n, classes))
    x = {"tuned": np.zeros((n, 4), np.float32), "sent": np.zeros((n, 4), np.float32),
         "memory": np.zeros((n, 4), np.float32), "h_pre": np.ones(n), "h_post": np.ones(n),
         "replied": np.ones(n, bool), "num_examples": np.ones(n)}  # fmt: skip
    out = latte_round(**x, params=LatteRuleParams(shots=shots), payload={
        PROTOTYPES: prototypes.astype(np.float32), ENTROPIES: entropies.astype(np.float32)})  # fmt: skip
    cache = torch.from_numpy(prototypes.astype(np.float32)).permute(1, 0, 2)  # the authors': [C, N, E]
    cache_h = torch.from_numpy(entropies.astype(np.float32)).T
    for query in range(n):
        similarity = (cache * cache[:, query, :].unsqueeze(1)).sum(dim=2)
        selected = torch.sort(similarity, dim=1, descending=True).indices[:, 1 : shots + 1]
        expected = cache.gather(1, selected.unsqueeze(-1).expand(-1, -1, dim))
        assert np.allclose(out.state["payload.prototypes"][query], expected.numpy(), atol=1e-6)
        assert np.allclose(out.state["payload.entropies"][query], cache_h.gather(1, selected).numpy())
        counts = np.bincount(selected.numpy().ravel(), minlength=n) / selected.numel()
        assert np.allclose(out.diagnostics.peer_weights[query], counts)
    assert np.array_equal(out.personalized, x["tuned"])  # no prompt is mixed


# ------------------------------------------------------------------------------------------------- the wire
def _reply(payload: dict | None) -> RecordDict:
    records = {
        "prompt": prompt_to_record([np.zeros((2, 3), np.float32)]),
        "metrics": MetricRecord({"client-id": 0, "h-pre": 1.0, "h-post": 1.0, "num-examples": 4}),
    }
    if payload is not None:
        records[PAYLOAD] = ArrayRecord({k: Array(np.asarray(v)) for k, v in payload.items()})
    return RecordDict(records)


SHAPES = {PROTOTYPES: (5, 8), ENTROPIES: (5,)}
GOOD = {PROTOTYPES: np.zeros((5, 8), np.float32), ENTROPIES: np.ones(5, np.float32)}


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (None, "no ArrayRecord 'payload'"),
        ({PROTOTYPES: GOOD[PROTOTYPES]}, "payload arrays ['prototypes'], expected ['entropies', 'prototypes']"),
        ({**GOOD, "labels": np.zeros(5, np.float32)}, "payload arrays"),
        ({**GOOD, ENTROPIES: np.ones(5, np.float64)}, "payload entropies is float64[5], expected float32[5]"),
        ({**GOOD, PROTOTYPES: np.zeros((5, 9), np.float32)}, "expected float32[5, 8]"),
        ({**GOOD, ENTROPIES: np.array([1, 1, np.nan, 1, 1], np.float32)}, "payload entropies holds NaN or Inf"),
    ],
)
def test_an_upload_whose_payload_is_not_the_templates_is_rejected(payload, why):
    with pytest.raises(RejectedReply, match=__import__("re").escape(why)):
        parse_train_reply(_reply(payload), 0, [(2, 3)], 100.0, SHAPES)
    upload = parse_train_reply(_reply(GOOD), 0, [(2, 3)], 100.0, SHAPES)
    assert upload.payload.keys() == GOOD.keys() and upload.upload_bytes == 4 * (6 + 40 + 5)


def test_a_payload_is_refused_where_the_method_has_none_and_beyond_the_size_bound():
    with pytest.raises(RejectedReply, match="unexpected records \\['payload'\\]"):
        parse_train_reply(_reply(GOOD), 0, [(2, 3)], 100.0)
    from fedrapp_app.federation.records import payload_shapes

    with pytest.raises(ValueError, match="more than"):
        payload_shapes(
            {"huge": np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (MAX_PAYLOAD_VALUES + 1,), (0,))}
        )


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"strategy": "latte"}, "uploads no payload, which strategy = 'latte' reads"),
        ({"strategy": "none-fed", "local-method": "latte", "dp": True}, "which dp = true does not protect"),
    ],
)
def test_the_run_config_pairs_latte_with_a_method_that_uploads_prototypes(overrides, why):
    with pytest.raises(ConfigError, match=why):
        RunConfig.from_run_config(overrides)
    RunConfig.from_run_config({"strategy": "latte", "local-method": "latte"})
    RunConfig.from_run_config({"strategy": "none-fed", "local-method": "latte"})  # its local memory alone


# -------------------------------------------------------------------------------------------- a federation
@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed"), world.CLASSNAMES)


def _latte(testbed_tiny, out, **extra):
    return small_run(testbed_tiny, out, **{"strategy": "latte", "local-method": "latte", "num-rounds": 3,
                                           "rule-params": "shots=1", **extra})  # fmt: skip


def test_a_latte_federation_sends_prototypes_not_prompts_and_says_how_many_bytes(testbed_tiny, tmp_path):
    from fedrapp_app.federation.client import METHOD_STATE
    from fedrapp_app.federation.records import record_to_arrays

    summary, grid, _ = run_federation(_latte(testbed_tiny, tmp_path))
    rows = read_rows(summary["run_dir"])
    assert all(r["status"] == "ok" for r in rows) and summary["rule_failures"]["count"] == 0
    p0 = grid.sent[(1, 1000)]
    assert all(np.array_equal(v, p0) for v in grid.sent.values())  # the prompt never moves
    prompt_bytes, classes = p0.nbytes, len(world.CLASSNAMES)
    dim = record_to_arrays(grid.contexts[1000].state[METHOD_STATE])["local.features"].shape[-1]
    assert all(r["upload_bytes"] == prompt_bytes + 4 * classes * (dim + 1) for r in rows)
    first, later = [r for r in rows if r["round"] == 1], [r for r in rows if r["round"] > 1]
    assert all(r["download_bytes"] == prompt_bytes for r in first)  # nothing to send yet
    assert all(r["download_bytes"] == prompt_bytes + 4 * classes * 1 * (dim + 1) for r in later)  # shots = 1
    assert all(sum(r["peer_weights"].values()) == pytest.approx(1.0) for r in rows)
    trains = [m for m in grid.messages if m.metadata.message_type == "train"]
    assert not any(PAYLOAD in m.content.array_records for m in trains if m.metadata.group_id == "1")
    assert all(PAYLOAD in m.content.array_records for m in trains if m.metadata.group_id == "2")
    state = record_to_arrays(grid.contexts[1000].state[METHOD_STATE])
    assert state["external.features"].shape == (classes, 1, dim)


@pytest.mark.kernels
def test_a_resumed_latte_run_gives_the_same_rows(testbed_tiny, tmp_path):
    from federation import comparable_rows

    whole, _, _ = run_federation(_latte(testbed_tiny, tmp_path, **{"run-name": "whole"}))
    cut = _latte(testbed_tiny, tmp_path, **{"run-name": "cut"})
    interrupt_after(cut, 2)
    resumed, _, _ = run_federation({**cut, "resume": True})
    assert resumed["resumed_after_round"] == 2
    assert comparable_rows(read_rows(whole["run_dir"])) == comparable_rows(read_rows(resumed["run_dir"]))


@pytest.mark.slow
def test_labels_never_reach_a_latte_payload_or_memory(testbed_tiny, tmp_path, monkeypatch):
    from fedrapp_app.federation.client import METHOD_STATE
    from fedrapp_app.federation.records import record_to_arrays

    def uploads(grid):
        out = {}
        for node, context in grid.contexts.items():
            out.update({f"{node}.{k}": v for k, v in record_to_arrays(context.state[METHOD_STATE]).items()})
        return out

    base, grid_a, _ = run_federation(_latte(testbed_tiny, tmp_path / "a"))
    permute_labels(monkeypatch, len(world.CLASSNAMES), seed=5)
    other, grid_b, _ = run_federation(_latte(testbed_tiny, tmp_path / "b"))
    a, b = uploads(grid_a), uploads(grid_b)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert base["micro_accuracy"] != other["micro_accuracy"]
