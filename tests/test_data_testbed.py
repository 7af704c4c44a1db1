"""The testbed source: balanced seeded pool, per-client domains (client i -> domain i mod D), determinism."""

from __future__ import annotations

import numpy as np
import pytest

from fedrapp_app.data import DataSpec, build_client_stream, build_source, clear_caches, client_domains
from fedrapp_app.testbed import corruptions, world


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_caches()
    yield
    clear_caches()


def spec(**overrides) -> DataSpec:
    settings = dict(testbed_samples=300, num_clients=4, batch_size=16, min_partition_size=5, decode_workers=2)
    settings.update(overrides)
    return DataSpec(**settings)


def arrays(batch) -> np.ndarray:
    return np.stack([np.asarray(im) for im in batch.images])


def test_pool_is_balanced_seeded_and_named_by_the_world():
    source = build_source(spec())
    assert source.classnames == list(world.CLASSNAMES)
    assert source.template == world.HAND_TEMPLATE
    counts = np.bincount(source.labels(), minlength=len(world.CLASSNAMES))
    assert counts.max() - counts.min() <= 1
    np.testing.assert_array_equal(build_source(spec()).labels(), source.labels())
    assert not np.array_equal(build_source(spec(seed=1)).labels(), source.labels())


def test_images_are_the_world_renders_of_label_and_seed():
    source = build_source(spec())
    idx = np.array([5, 17, 3])
    images = np.stack([np.asarray(im) for im in source.load(idx)])
    expected = world.render(source.labels()[idx], source.sample_seeds(idx))
    np.testing.assert_array_equal(images, expected)
    assert images.shape == (3, world.IMAGE_SIZE, world.IMAGE_SIZE, 3)


def test_client_domain_map_is_i_mod_d():
    s = spec(num_clients=5, testbed_domains="gaussian_noise:1,blur:2,clean")
    assert client_domains(s) == ["gaussian_noise:1", "blur:2", "clean", "gaussian_noise:1", "blur:2"]
    assert [build_client_stream(s, c).domain for c in range(5)] == client_domains(s)
    for no_domains in ("", "clean", "clean,clean"):
        assert client_domains(spec(testbed_domains=no_domains)) == [None] * 4
        assert build_client_stream(spec(testbed_domains=no_domains), 0).domain is None


def test_domain_images_are_the_corrupted_renders():
    s = spec(testbed_domains="blur:2,contrast:1")
    stream = build_client_stream(s, 1)  # domain 1 mod 2 -> contrast:1
    assert stream.domain == "contrast:1"
    batch = stream.batch(0)
    source = stream.source
    clean = world.render(source.labels()[batch.indices], source.sample_seeds(batch.indices))
    expected = corruptions.corrupt(clean, "contrast", 1, source.sample_seeds(batch.indices))
    np.testing.assert_array_equal(arrays(batch), expected)
    assert not np.array_equal(arrays(batch), clean)


def test_resume_and_batch_composition_do_not_change_images():
    s = spec(testbed_domains="gaussian_noise:2")
    stream = build_client_stream(s, 0)
    whole = [arrays(b) for b in stream.iter_batches()]
    clear_caches()
    again = build_client_stream(s, 0)
    np.testing.assert_array_equal(arrays(again.batch(2)), whole[2])
    # The same sample in another batch (alone) is the same image: noise is seeded per sample.
    single = again.source.load(again.batch(2).indices[:1], ("gaussian_noise", 2))
    np.testing.assert_array_equal(np.asarray(single[0]), whole[2][0])


def test_streams_partition_the_pool():
    s = spec(partition="dirichlet", dirichlet_alpha=0.5)
    orders = [build_client_stream(s, c).order for c in range(4)]
    np.testing.assert_array_equal(np.sort(np.concatenate(orders)), np.arange(300))


@pytest.mark.parametrize(
    ("domains", "match"),
    [("fog:1", "unknown corruption 'fog'"), ("blur:9", "outside 1..3"), ("blur:x", "testbed-domains")],
)
def test_bad_domains_are_rejected_before_any_rendering(domains, match):
    with pytest.raises(ValueError, match=match):
        build_client_stream(spec(testbed_domains=domains), 0)


def test_default_domains_are_valid_and_shared_by_two_clients_each():
    default = DataSpec()
    assert client_domains(default) == [
        "gaussian_noise:1", "blur:2", "contrast:2", "color_cast:2",
        "gaussian_noise:1", "blur:2", "contrast:2", "color_cast:2",
    ]  # fmt: skip


def test_a_stream_batch_goes_through_the_engine_preprocessing(tmp_path):
    from fedrapp_app.engine.loading import load_clip
    from fedrapp_app.engine.prompts import PromptedCLIP
    from fedrapp_app.testbed.tiny import make_tiny_clip

    stream = build_client_stream(spec(), 1)
    pclip = PromptedCLIP(load_clip(make_tiny_clip(tmp_path, stream.classnames)), stream.classnames, stream.template)
    pixels = pclip.preprocess(stream.batch(0).images)
    assert tuple(pixels.shape) == (16, 3, 32, 32)
    assert pclip.image_features(pixels).shape[0] == 16
