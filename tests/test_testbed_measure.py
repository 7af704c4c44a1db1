"""The testbed measurement: seeded streams, argument parsing, and agreement with the product's methods."""

from __future__ import annotations

import numpy as np
import pytest

from fedrapp_app.testbed import measure


def test_streams_are_seeded_and_differ_between_seeds_and_domains() -> None:
    a = measure.make_stream("blur", 2, seed=3, size=20)
    np.testing.assert_array_equal(a.images, measure.make_stream("blur", 2, seed=3, size=20).images)
    assert (a.images != measure.make_stream("blur", 2, seed=4, size=20).images).any()
    assert (a.images != measure.make_stream("contrast", 2, seed=3, size=20).images).any()
    assert a.images.shape == (20, 32, 32, 3) and a.labels.shape == (20,)


def test_label_skew_concentrates_the_class_mix() -> None:
    uniform = measure.make_stream("clean", 0, seed=0, size=600)
    skewed = measure.make_stream("clean", 0, seed=0, size=600, label_skew=0.1)
    top = lambda labels: np.bincount(labels, minlength=30).max() / labels.size  # noqa: E731
    assert top(skewed.labels) > 2 * top(uniform.labels)


def test_stream_errors() -> None:
    with pytest.raises(ValueError, match="unknown domain"):
        measure.make_stream("fog", 1, seed=0, size=4)
    with pytest.raises(ValueError, match="size"):
        measure.make_stream("blur", 1, seed=0, size=0)


def test_parsing_of_overrides_and_domains() -> None:
    assert measure.parse_overrides(["adaprompt.lr=0.01", "adaprompt.double-softmax=false"]) == {
        "adaprompt": {"lr": 0.01, "double-softmax": False}
    }
    assert measure.parse_domains(["blur:2", "hue_shift:1"]) == [("blur", 2), ("hue_shift", 1)]
    with pytest.raises(ValueError, match="METHOD.PARAM=VALUE"):
        measure.parse_overrides(["lr=0.01"])
    with pytest.raises(ValueError, match="SEVERITY in 1..3"):
        measure.parse_domains(["blur:7"])


@pytest.mark.kernels
def test_zeroshot_method_online_equals_hand_prompt_zero_shot() -> None:
    """The online loop over the product's zeroshot method scores exactly the hand-prompt accuracy."""
    from fedrapp_app.engine import PromptedCLIP, load_clip
    from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE

    pclip = PromptedCLIP(load_clip("testbed", device="cpu"), CLASSNAMES, HAND_TEMPLATE)
    stream = measure.make_stream("blur", 1, seed=5, size=96)
    pixels = measure.pixel_values(pclip, stream.images)
    online = measure.online_accuracy(pclip, "zeroshot", {}, pixels, stream.labels, batch_size=32, seed=0)
    assert online == measure.zero_shot_accuracy(pclip, pixels, stream.labels)
    assert 0.3 < online <= 1.0
