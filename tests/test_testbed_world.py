"""The testbed world: seeded, batch-independent renders; its corruptions (captions: test_testbed_captions.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fedrapp_app.testbed import corruptions, world
from fedrapp_app.testbed.corruptions import CORRUPTIONS, MAX_SEVERITY, corrupt
from fedrapp_app.testbed.world import CLASSNAMES, IMAGE_SIZE, render

LABELS = np.arange(40) % len(CLASSNAMES)
SEEDS = np.arange(40) * 7 + 3


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return render(LABELS, SEEDS)


def test_classes_are_many_distinct_ordinary_words() -> None:
    assert len(CLASSNAMES) >= 20
    assert len(set(CLASSNAMES)) == len(CLASSNAMES)
    assert all(name.replace(" ", "").isalpha() and name.islower() for name in CLASSNAMES)


def test_render_shape_and_dtype(images: np.ndarray) -> None:
    assert images.shape == (40, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert images.dtype == np.uint8


def test_render_is_a_function_of_label_and_seed_whatever_the_batch(images: np.ndarray) -> None:
    order = np.random.default_rng(0).permutation(40)[:13]
    np.testing.assert_array_equal(render(LABELS[order], SEEDS[order]), images[order])
    np.testing.assert_array_equal(render(LABELS[5:6], SEEDS[5:6])[0], images[5])
    np.testing.assert_array_equal(render(LABELS, SEEDS), images)


def test_render_varies_with_seed_and_label(images: np.ndarray) -> None:
    other_seed = render(LABELS[:10], SEEDS[:10] + 1)
    assert all((other_seed[i] != images[i]).any() for i in range(10))
    # Same seed, different class: a different object (colour or shape), not the same picture.
    other_label = render((LABELS[:10] + 1) % len(CLASSNAMES), SEEDS[:10])
    assert all((other_label[i] != images[i]).any() for i in range(10))


def test_render_draws_the_class_colour() -> None:
    # The object is the largest patch of the class colour: its mean hue is close to the palette colour.
    for label in (0, 5, 10):  # red, green, blue circles (large object, any background)
        image = render(np.array([label]), np.array([11]))[0].astype(float) / 255
        target = np.array(world.COLORS[CLASSNAMES[label].split()[0]])
        nearest = np.linalg.norm(image - target, axis=-1) < 0.15
        assert nearest.mean() > 0.03


@pytest.mark.parametrize(
    ("labels", "seeds", "message"),
    [
        (np.array([30]), np.array([0]), "out of range"),
        (np.array([-1]), np.array([0]), "out of range"),
        (np.array([0]), np.array([-5]), "negative"),
        (np.array([0, 1]), np.array([0]), "same length"),
        (np.array([0.5]), np.array([0]), "integers"),
    ],
)
def test_render_rejects_bad_input(labels: np.ndarray, seeds: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render(labels, seeds)


def test_render_empty_batch() -> None:
    assert render(np.array([], dtype=int), np.array([], dtype=int)).shape == (0, IMAGE_SIZE, IMAGE_SIZE, 3)


# --- corruptions -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruption_is_deterministic_per_sample_and_changes_the_image(name: str, images: np.ndarray) -> None:
    out = corrupt(images, name, 2, SEEDS)
    assert out.shape == images.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(corrupt(images, name, 2, SEEDS), out)
    order = np.array([7, 3, 30, 0])
    np.testing.assert_array_equal(corrupt(images[order], name, 2, SEEDS[order]), out[order])
    assert (out != images).any(axis=(1, 2, 3)).mean() > 0.9


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_severity_increases_the_damage(name: str, images: np.ndarray) -> None:
    damage = [np.abs(corrupt(images, name, s, SEEDS).astype(float) - images).mean() for s in range(1, MAX_SEVERITY + 1)]
    assert damage[0] < damage[1] < damage[2], damage


def test_seeded_corruptions_differ_between_seeds(images: np.ndarray) -> None:
    a = corrupt(images[:4], "gaussian_noise", 1, np.array([1, 2, 3, 4]))
    b = corrupt(images[:4], "gaussian_noise", 1, np.array([5, 6, 7, 8]))
    assert (a != b).any(axis=(1, 2, 3)).all()


def test_corruption_errors_name_the_allowed_values(images: np.ndarray) -> None:
    with pytest.raises(ValueError, match="allowed: gaussian_noise, blur"):
        corrupt(images, "fog", 1, SEEDS)
    for bad in (0, MAX_SEVERITY + 1, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"1..{MAX_SEVERITY}"):
            corrupt(images, "blur", bad, SEEDS)
    with pytest.raises(ValueError, match="uint8"):
        corrupt(images.astype(np.float32), "blur", 1, SEEDS)
    with pytest.raises(ValueError, match="one per image"):
        corrupt(images, "blur", 1, SEEDS[:3])
    with pytest.raises(ValueError, match=">= 0"):
        corrupt(images[:1], "blur", 1, np.array([-1]))


def test_default_domains_are_valid() -> None:
    assert len(corruptions.DEFAULT_DOMAINS) >= 4
    for name, severity in corruptions.DEFAULT_DOMAINS:
        assert name in CORRUPTIONS and 1 <= severity <= MAX_SEVERITY
