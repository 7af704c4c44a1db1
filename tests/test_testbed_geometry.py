"""The prompt-geometry benchmark: its math on known matrices, its Jacobian against autograd, one tiny run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.testbed import geometry
from fedrapp_app.testbed.tiny import make_tiny_clip
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE


def test_effective_rank_counts_equal_directions() -> None:
    assert geometry.effective_rank(torch.eye(5)) == pytest.approx(5.0)
    assert geometry.effective_rank(torch.diag(torch.tensor([1.0, 1.0, 0.0, 0.0]))) == pytest.approx(2.0)
    assert geometry.effective_rank(torch.diag(torch.tensor([10.0, 1.0]))) < 1.1
    assert geometry.effective_rank(torch.zeros(3, 3)) == 0.0


def test_jacobian_geometry_splits_common_and_differential_energy() -> None:
    g = torch.Generator().manual_seed(0)
    common = torch.randint(-4, 5, (4, 6), generator=g).float()  # exact means
    same = common.expand(3, 4, 6)  # every class moves alike: all energy is class-common
    assert geometry.jacobian_geometry(same)["class_common_share"] == pytest.approx(1.0)
    assert geometry.jacobian_geometry(same)["effective_rank_differential"] == 0.0
    opposite = torch.stack([common, -common])  # mean zero: nothing is class-common
    assert geometry.jacobian_geometry(opposite)["class_common_share"] == pytest.approx(0.0, abs=1e-9)
    spread = torch.randn(30, 8, 40, generator=g)
    assert geometry.jacobian_geometry(spread)["effective_rank_differential"] > 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> PromptedCLIP:
    folder = make_tiny_clip(tmp_path_factory.mktemp("geometry_tiny"), CLASSNAMES)
    return PromptedCLIP(load_clip(folder, device="cpu"), CLASSNAMES[:5], HAND_TEMPLATE)


def test_context_jacobian_equals_autograd(tiny: PromptedCLIP) -> None:
    init = tiny.context_from_text(geometry.INIT_TEXT)  # [n, D]
    fast = geometry.context_jacobian(tiny, init)  # [C, E, n*D]
    full = torch.autograd.functional.jacobian(lambda ctx: tiny.text_features([ctx])[0], init)  # [C, E, n, D]
    torch.testing.assert_close(fast, full.flatten(2), atol=1e-5, rtol=1e-4)


def test_coop_fit_raises_accuracy_on_its_shots(tiny: PromptedCLIP) -> None:
    g = torch.Generator().manual_seed(1)
    features = torch.nn.functional.normalize(
        torch.randn(40, tiny.clip.model.config.projection_dim, generator=g), dim=-1
    )
    labels = np.arange(40) % 5
    init = tiny.context_from_text(geometry.INIT_TEXT)
    before = geometry.accuracy(tiny, [init], features, labels)
    tuned = geometry.coop_fit(tiny, init, features, labels, steps=60, lr=0.05)
    assert tuned.shape == init.shape
    assert geometry.accuracy(tiny, [tuned], features, labels) > before


def test_labelled_sets_are_seeded_and_disjoint_by_purpose() -> None:
    shots, labels = geometry.labelled_set("blur", 2, seed=3, per_class=2, purpose=1)
    again, _ = geometry.labelled_set("blur", 2, seed=3, per_class=2, purpose=1)
    test, _ = geometry.labelled_set("blur", 2, seed=3, per_class=2, purpose=2)
    np.testing.assert_array_equal(shots, again)
    assert shots.shape == (60, 32, 32, 3) and (labels == np.repeat(np.arange(30), 2)).all()
    assert (shots != test).any(axis=(1, 2, 3)).all()


@pytest.mark.slow
def test_a_small_geometry_run_reports_every_headline(tmp_path, tiny: PromptedCLIP) -> None:
    pclip = PromptedCLIP(tiny.clip, CLASSNAMES, HAND_TEMPLATE)
    result = geometry.measure_geometry(
        pclip, seed=100, shots=1, test_per_class=1, coop_steps=2, random_draws=1, adaprompt_stream=64,
        tpt_stream=4, tpt_views=3, tta_methods=("adaprompt", "tpt"), log=lambda line: None,
    )  # fmt: skip
    text = geometry.report(result)
    for key in ("coop_transfer", "adaprompt_vs_zero_shot", "tpt_vs_zero_shot", "noise_0.23_shifted"):
        assert np.isfinite(result["summary"][key]), key
    assert "class-differential context Jacobian" in text and "tpt online" in text
