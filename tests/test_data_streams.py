"""Client streams: seeded order, batches, resuming from a position, truncation and prefetching."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedrapp_app.data import DataSpec, build_client_stream, clear_caches, client_partitions


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An image folder of 5 classes x 30 images; pixel (0, 0) encodes the sample (red = class, green = id)."""
    root = tmp_path_factory.mktemp("streams") / "data"
    for label in range(5):
        (root / f"class_{label}").mkdir(parents=True)
        for j in range(30):
            Image.new("RGB", (6, 6), (label, j, 0)).save(root / f"class_{label}" / f"{j:02d}.png")
    return str(root)


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_caches()
    yield
    clear_caches()


def spec(folder: str, **overrides) -> DataSpec:
    settings = dict(dataset="custom", data_dir=folder, num_clients=4, min_partition_size=5, batch_size=8)
    settings.update(overrides)
    return DataSpec(**settings)


def pixels(batch) -> list[tuple[int, int, int]]:
    return [im.getpixel((0, 0)) for im in batch.images]


def test_stream_shape_and_batches(folder):
    stream = build_client_stream(spec(folder), 1)
    assert stream.client_id == 1 and stream.domain is None
    assert stream.num_batches == -(-stream.num_samples // 8)
    sizes = [len(stream.batch(p).images) for p in range(stream.num_batches)]
    assert sizes[:-1] == [8] * (len(sizes) - 1) and 1 <= sizes[-1] <= 8
    assert sum(sizes) == stream.num_samples
    batch = stream.batch(0)
    assert batch.position == 0 and batch.labels.dtype == np.int64 and batch.indices.dtype == np.int64
    # Labels and images belong together (the fixture's red channel is the class).
    assert [p[0] for p in pixels(batch)] == batch.labels.tolist()
    assert stream.classnames == [f"class {k}" for k in range(5)]
    assert stream.template == "a photo of a {}."


def test_streams_cover_the_partitions_in_a_seeded_order(folder):
    s = spec(folder)
    streams = [build_client_stream(s, c) for c in range(4)]
    parts = client_partitions(s)
    for stream, part in zip(streams, parts, strict=True):
        np.testing.assert_array_equal(np.sort(stream.order), part)
        assert not np.array_equal(stream.order, part), "the stream order is shuffled, not the sorted partition"
    assert sum(st.num_samples for st in streams) == 150


def test_same_seed_same_batches_and_resume(folder):
    first = build_client_stream(spec(folder, seed=5, partition="iid"), 2)
    seen = [(b.indices.tolist(), pixels(b)) for b in first.iter_batches()]
    assert len(seen) == 5
    clear_caches()  # a new process: nothing cached
    again = build_client_stream(spec(folder, seed=5, partition="iid"), 2)
    # Resuming at position 3 needs nothing but the position.
    resumed = again.batch(3)
    assert (resumed.indices.tolist(), pixels(resumed)) == seen[3]
    assert [(b.indices.tolist(), pixels(b)) for b in again.iter_batches(start=1)] == seen[1:]


def test_other_seed_or_client_gives_another_stream(folder):
    base = build_client_stream(spec(folder, seed=5), 2).order
    assert not np.array_equal(build_client_stream(spec(folder, seed=6), 2).order, base)
    assert not np.array_equal(build_client_stream(spec(folder, seed=5), 3).order, base)


def test_batch_size_changes_batching_not_order(folder):
    a = build_client_stream(spec(folder, batch_size=8), 0)
    b = build_client_stream(spec(folder, batch_size=5), 0)
    np.testing.assert_array_equal(a.order, b.order)
    np.testing.assert_array_equal(b.batch(1).indices, a.order[5:10])


def test_max_samples_per_client_truncates_the_stream(folder):
    full = build_client_stream(spec(folder), 0)
    short = build_client_stream(spec(folder, max_samples_per_client=11), 0)
    assert short.num_samples == 11 and short.num_batches == 2
    np.testing.assert_array_equal(short.order, full.order[:11])
    assert len(short.batch(1).images) == 3


def test_prefetch_returns_the_same_batch(folder):
    stream = build_client_stream(spec(folder, decode_workers=2), 0)
    direct = stream.batch(1)
    stream.prefetch(1)
    stream.prefetch(1)  # idempotent
    stream.prefetch(stream.num_batches)  # past the end: ignored
    fetched = stream.batch(1)
    np.testing.assert_array_equal(fetched.indices, direct.indices)
    assert pixels(fetched) == pixels(direct)


def test_a_process_reuses_its_stream_so_a_prefetch_survives_the_round(folder):
    s = spec(folder)
    stream = build_client_stream(s, 0)
    stream.prefetch(1)  # end of round 0
    assert build_client_stream(s, 0) is stream  # round 1, same process
    assert build_client_stream(spec(folder, batch_size=4), 0) is not stream


def test_bad_positions_and_client_ids(folder):
    stream = build_client_stream(spec(folder), 0)
    with pytest.raises(IndexError, match="stream position"):
        stream.batch(stream.num_batches)
    with pytest.raises(IndexError, match="stream position"):
        stream.batch(-1)
    with pytest.raises(ValueError, match="client id 4 is outside 0..num-clients-1"):
        build_client_stream(spec(folder), 4)


def test_partition_that_cannot_meet_the_minimum_is_reported(folder):
    with pytest.raises(ValueError, match="min-partition-size"):
        build_client_stream(spec(folder, num_clients=10, min_partition_size=20), 0)


def test_the_prefetcher_keeps_a_bounded_number_of_batches_and_stops_when_they_go_unused():
    from fedrapp_app.data.prefetch import Prefetcher

    p = Prefetcher(max_pending=2, min_events=4, min_hit_rate=0.25)
    p.submit("a", lambda: 1)
    assert p.take("a").result(timeout=10) == 1 and p.take("a") is None and p.hits == 1
    for key in "bcde":  # one process, many clients whose next batches are asked for elsewhere
        p.submit(key, lambda: 0)
    assert p.dropped == 2 and len(p._pending) == 2  # only the two newest wait
    p.submit("f", lambda: 0)
    p.submit("g", lambda: 0)
    assert not p.enabled  # 1 hit of 5 events: switched off
    p.submit("h", lambda: 0)
    assert p.take("h") is None


def test_an_error_while_prefetching_surfaces_when_the_batch_is_taken():
    from fedrapp_app.data.prefetch import Prefetcher

    p = Prefetcher()

    def broken():
        raise OSError("disk gone")

    p.submit("x", broken)
    with pytest.raises(OSError, match="disk gone"):
        p.take("x").result(timeout=10)
