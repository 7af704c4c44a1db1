"""Shift schedules and class-correlated streams (ours, issue 26), and the calibration error in the results."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flwr.app import MetricRecord

from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.data import DataSpec, build_client_stream, clear_caches, client_domains, client_partitions
from fedrapp_app.data.shift import ShiftPlan, class_order, dirichlet_order
from fedrapp_app.data.sources import cached_source
from fedrapp_app.data.spec import parse_domains, validate_spec
from fedrapp_app.data.streams import stream_order
from fedrapp_app.federation.client import app as client_app
from fedrapp_app.federation.records import METRICS, RejectedReply, parse_outcome
from fedrapp_app.metrics.calibration import bins_from_metrics, calibration_bins, empty_bins
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import read_rows, reply_with, run_federation, small_run

DOMAINS = (("blur", 2), ("contrast", 2), None)  # "blur:2,contrast:2,clean"


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_caches()
    yield
    clear_caches()


def small(**overrides) -> DataSpec:
    values = dict(num_clients=4, testbed_samples=160, batch_size=8, min_partition_size=4, decode_workers=0,
                  testbed_domains="blur:2,contrast:2,clean")  # fmt: skip
    return DataSpec(**{**values, **overrides})


# ----- the schedules ------------------------------------------------------------------------------------------
def test_a_continual_client_steps_through_the_domains_in_turn_every_period():
    plan = ShiftPlan("continual", DOMAINS, period=3)
    steps = plan.steps(12)
    assert steps.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    for client in range(5):
        seen = [plan.domain(client, int(s)) for s in steps]
        start = client % 3
        assert seen == [DOMAINS[(start + p // 3) % 3] for p in range(12)]


@pytest.mark.parametrize("spread", [1, 2, 3])
def test_the_spread_is_how_many_domains_are_active_across_clients_at_every_batch(spread):
    plan = ShiftPlan("continual", DOMAINS, period=2, spread=spread)
    for step in plan.steps(10):
        assert len({plan.domain(client, int(step)) for client in range(6)}) == spread


def test_random_switch_times_are_seeded_shared_and_one_step_at_a_time():
    plan = ShiftPlan("continual", DOMAINS, rate=0.3, seed=5)
    steps = plan.steps(200)
    assert steps[0] == 0 and set(np.diff(steps).tolist()) == {0, 1}
    assert 0.2 < steps[-1] / 199 < 0.4  # about the rate
    assert np.array_equal(steps, ShiftPlan("continual", DOMAINS, rate=0.3, seed=5).steps(200))
    assert np.array_equal(steps[:50], plan.steps(50))  # a position's step does not depend on the stream length
    assert not np.array_equal(steps, ShiftPlan("continual", DOMAINS, rate=0.3, seed=6).steps(200))


def test_a_gradual_client_raises_and_lowers_the_severity_then_moves_to_the_next_family():
    plan = ShiftPlan("gradual", DOMAINS, period=1, max_severity=3)
    seen = [plan.domain(0, step) for step in range(11)]
    assert seen == [("blur", 1), ("blur", 2), ("blur", 3), ("blur", 2), ("blur", 1),
                    ("contrast", 1), ("contrast", 2), ("contrast", 3), ("contrast", 2), ("contrast", 1),
                    ("blur", 1)]  # fmt: skip
    assert plan.domain(1, 0) == ("contrast", 1)  # client 1 starts at the second family


def test_a_mixed_stream_draws_every_samples_domain_seeded_by_client():
    plan = ShiftPlan("mixed", DOMAINS, seed=3)
    draws = plan.sample_domains(0, 3000)
    assert np.array_equal(draws, plan.sample_domains(0, 3000))
    assert not np.array_equal(draws, plan.sample_domains(1, 3000))
    assert np.allclose(np.bincount(draws, minlength=3) / 3000, 1 / 3, atol=0.04)


def test_class_order_puts_the_classes_one_after_the_other():
    labels = np.random.default_rng(0).integers(0, 5, size=200)
    order = class_order(labels, seed=1, client=2, key=201)
    assert sorted(order.tolist()) == list(range(200))
    ordered = labels[order]
    assert int((np.diff(ordered) != 0).sum()) == len(np.unique(labels)) - 1  # one block per class
    assert np.array_equal(order, class_order(labels, seed=1, client=2, key=201))


# ----- the streams --------------------------------------------------------------------------------------------
@pytest.mark.kernels
def test_the_fixed_schedule_is_the_papers_stream_bit_for_bit():
    """shift='fixed' with a random order: client i's order and images are what they were before schedules
    existed (the seeded permutation of its partition; every image corrupted by domain i mod D)."""
    spec = small()
    source = cached_source(spec)
    for client in range(spec.num_clients):
        stream = build_client_stream(spec, client)
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 201, client]))
        partition = client_partitions(spec)[client]
        assert np.array_equal(stream.order, partition[rng.permutation(len(partition))])
        domain = DOMAINS[client % 3]
        for position in range(stream.num_batches):
            batch = stream.batch(position)
            expected = source.load(stream.indices_at(position), domain)
            assert [np.asarray(a).tobytes() for a in batch.images] == [np.asarray(b).tobytes() for b in expected]
            assert batch.domains == (client_domains(spec)[client],) * len(batch.labels)


@pytest.mark.parametrize("shift", ["continual", "gradual", "mixed"])
def test_a_scheduled_stream_renders_each_sample_in_its_domain_and_is_the_same_after_a_restart(shift):
    spec = small(shift=shift, shift_period=1)
    stream = build_client_stream(spec, 1)
    source = cached_source(spec)
    first = [stream.batch(p) for p in range(stream.num_batches)]
    seen = set()
    for position, batch in enumerate(first):
        domains = stream.domains_at(position)
        seen.update(domains)
        assert batch.domains == tuple("clean" if d is None else f"{d[0]}:{d[1]}" for d in domains)
        for image, index, domain in zip(batch.images, batch.indices, domains, strict=True):
            assert np.array_equal(np.asarray(image), source.render([index], domain)[0])
    assert len(seen) > 1  # the domain moved
    clear_caches()  # a new client process: the same stream again
    again = build_client_stream(spec, 1)
    for position, batch in enumerate(first):
        later = again.batch(position)
        assert np.array_equal(later.indices, batch.indices) and later.domains == batch.domains
        assert all(
            np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(later.images, batch.images, strict=True)
        )


def test_a_class_ordered_stream_is_the_same_partition_class_after_class():
    spec = small(stream_order="class", partition="iid")
    labels = cached_source(spec).labels()
    for client in range(spec.num_clients):
        stream = build_client_stream(spec, client)
        assert sorted(stream.order.tolist()) == client_partitions(spec)[client].tolist()
        ordered = labels[stream.order]
        assert int((np.diff(ordered) != 0).sum()) == len(np.unique(ordered)) - 1
    expected = stream_order(client_partitions(spec)[0], 0, 0, labels, "class")
    assert np.array_equal(build_client_stream(spec, 0).order, expected)


def test_per_client_switch_times_are_each_clients_own_and_seeded():
    """shift-times='per-client': every client switches at its own seeded times (a phase of its own in the period,
    or random switches of its own), so a switch is seen by some clients and not by the others."""
    periodic = ShiftPlan("continual", DOMAINS, period=4, seed=3, times="per-client")
    steps = np.stack([periodic.steps(40, client) for client in range(8)])  # [clients, positions]
    assert (steps[:, 0] == 0).all() and set(np.diff(steps, axis=1).ravel().tolist()) == {0, 1}
    for row in steps:  # every period batches, after a first step 1..period batches in
        first = int(np.argmax(row > 0))
        assert 1 <= first <= 4 and np.array_equal(np.flatnonzero(np.diff(row)) + 1, np.arange(first, 40, 4))
    assert len({int(np.argmax(row > 0)) for row in steps}) > 1  # not all at the same batch
    assert np.array_equal(steps[2], ShiftPlan("continual", DOMAINS, period=4, seed=3, times="per-client").steps(40, 2))
    shared = ShiftPlan("continual", DOMAINS, period=4, seed=3)
    assert all(np.array_equal(shared.steps(40, client), shared.steps(40)) for client in range(8))

    random_times = ShiftPlan("continual", DOMAINS, rate=0.3, seed=5, times="per-client")
    draws = [random_times.steps(200, client) for client in range(4)]
    assert all(d[0] == 0 and 0.2 < d[-1] / 199 < 0.4 for d in draws)
    assert not np.array_equal(draws[0], draws[1])
    assert np.array_equal(draws[1], ShiftPlan("continual", DOMAINS, rate=0.3, seed=5, times="per-client").steps(200, 1))


def test_per_client_switch_times_reach_the_stream_and_survive_a_rebuild():
    spec = small(shift="continual", shift_period=2, shift_times="per-client", partition="iid", testbed_samples=320)
    first = [[build_client_stream(spec, c).domains_at(p)[0] for p in range(6)] for c in range(spec.num_clients)]
    switches = {tuple(k for k in range(1, 6) if row[k] != row[k - 1]) for row in first}
    assert len(switches) > 1  # the clients switch at different batches
    clear_caches()
    again = [[build_client_stream(spec, c).domains_at(p)[0] for p in range(6)] for c in range(spec.num_clients)]
    assert again == first


def test_a_dirichlet_ordered_stream_is_the_partition_spread_over_time_by_class():
    """stream-order='dirichlet' (RoTTA's): a permutation of the client's partition, the same on a rebuild, whose
    classes come in runs: close to class after class at a small gamma, close to random at a large one."""
    labels = np.repeat(np.arange(6), 40)  # 6 classes x 40 samples
    runs = {}
    for gamma in (0.01, 100.0):
        order = dirichlet_order(labels, gamma, seed=1, client=2, key=9)
        assert sorted(order.tolist()) == list(range(len(labels)))
        assert np.array_equal(order, dirichlet_order(labels, gamma, seed=1, client=2, key=9))
        runs[gamma] = int((np.diff(labels[order]) != 0).sum()) + 1
    assert runs[0.01] < 20 < runs[100.0]  # 6 runs when sorted, about 200 at random
    spec = small(stream_order="dirichlet", partition="iid")
    source_labels = cached_source(spec).labels()
    for client in range(spec.num_clients):
        stream = build_client_stream(spec, client)
        assert sorted(stream.order.tolist()) == client_partitions(spec)[client].tolist()
    expected = stream_order(client_partitions(spec)[1], 0, 1, source_labels, "dirichlet", 0.1)
    assert np.array_equal(build_client_stream(spec, 1).order, expected)


def test_a_schedule_has_no_domain_per_client():
    assert client_domains(small()) == ["blur:2", "contrast:2", "clean", "blur:2"]
    assert client_domains(small(shift="continual", shift_period=1)) == [None] * 4


# ----- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "key", "hint"),
    [
        ({"shift": "sometimes"}, "shift", "one of 'fixed'"),
        ({"shift": "continual", "testbed-domains": "fog:2"}, "testbed-domains", "unknown corruption 'fog'"),
        ({"shift": "continual", "testbed-domains": "blur:6"}, "testbed-domains", "outside 1..3"),
        ({"shift": "continual", "testbed-domains": "clean"}, "shift", "testbed-domains listing the domains"),
        ({"shift": "continual", "shift-period": 10}, "shift-period", "no client would ever switch"),
        ({"shift": "continual", "shift-rate": 1.0}, "shift-rate", "[0, 1)"),
        ({"shift": "continual", "shift-rate": -0.1}, "shift-rate", ">= 0"),
        ({"shift": "continual", "shift-spread": 5}, "shift-spread", "at most the 4 domains"),
        (
            {"shift": "gradual", "shift-spread": 3, "testbed-domains": "blur:1,blur:2,clean"},
            "shift-spread",
            "at most the 1",
        ),
        ({"stream-order": "sorted"}, "stream-order", "one of 'random', 'class', 'dirichlet'"),
        ({"shift-times": "per-client"}, "shift-times", "'per-client' needs shift='continual' or 'gradual'"),
        ({"shift": "mixed", "shift-times": "per-client"}, "shift-times", "no switch times"),
        ({"shift-times": "sometimes"}, "shift-times", "one of 'shared', 'per-client'"),
        ({"stream-order": "dirichlet", "stream-dirichlet": 0.0}, "stream-dirichlet", "> 0.0"),
        ({"stream-dirichlet": 1.0}, "stream-dirichlet", "has no effect with stream-order = 'random'"),
        ({"shift": "mixed", "strategy": "domain-oracle"}, "domain-oracle", "shift='fixed'"),
        (
            {"shift": "mixed", "dataset": "dtd", "data-dir": "/nowhere", "model": "openai/clip-vit-base-patch16"},
            "shift",
            "corruptions listing the domains",
        ),
    ],
)
def test_a_bad_schedule_is_refused_before_anything_loads(overrides, key, hint):
    sizes = {"num-clients": 8, "testbed-samples": 512, "batch-size": 64}  # one batch a client: period 10 is too long
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({**sizes, **overrides})
    assert key in str(err.value) and hint in str(err.value), str(err.value)


# ----- calibration --------------------------------------------------------------------------------------------
def test_the_calibration_error_is_the_hand_computed_one():
    confidence = np.array([0.95, 0.9, 0.55, 0.52, 0.2, 1.0])
    correct = np.array([True, False, True, False, False, True])
    bins = calibration_bins(confidence, correct, bins=5)  # (0, .2], (.2, .4], (.4, .6], (.6, .8], (.8, 1]
    assert bins.n.tolist() == [1, 0, 2, 0, 3] and bins.correct.tolist() == [0, 0, 1, 0, 2]
    # |0 - 0.2| + |1 - 1.07| + |2 - 2.85| = 0.2 + 0.07 + 0.85 over 6 predictions
    assert bins.ece == pytest.approx((0.2 + 0.07 + 0.85) / 6)
    halves = calibration_bins(confidence[:3], correct[:3], 5) + calibration_bins(confidence[3:], correct[3:], 5)
    assert halves.ece == pytest.approx(bins.ece)  # bins add up over batches: a run's ECE is exact
    assert empty_bins().ece is None


def test_bad_calibration_bins_and_domain_counts_are_refused():
    good = calibration_bins(np.array([0.5, 0.9]), np.array([True, False])).as_lists()
    assert bins_from_metrics(good, 2).ece == pytest.approx((abs(1 - 0.5) + abs(0 - 0.9)) / 2)
    for bad, count in [({**good, "n": good["n"][:-1]}, 2), (good, 3), ({**good, "correct": [2] * 15}, 2),
                       ({**good, "confidence": [float("nan")] * 15}, 2)]:  # fmt: skip
        with pytest.raises(ValueError, match="calibration bins"):
            bins_from_metrics(bad, count)
    report = {f"calib-{k}": v for k, v in good.items()}
    assert parse_outcome(report, [], 2).calibration is not None
    with pytest.raises(RejectedReply, match="calib-"):
        parse_outcome({"calib-n": good["n"]}, [], 2)
    assert parse_outcome({"domain-n": [1, 1], "domain-correct": [1, 0]}, ["blur:1", "clean"], 2).domains == {
        "blur:1": (1, 1),
        "clean": (1, 0),
    }
    for n, right, names in [([2], [3], ["blur:1"]), ([1, 1], [0, 0], ["blur:1"]), ([1], [0], ["blur:1"])]:
        with pytest.raises(RejectedReply, match="domain-n"):
            parse_outcome({"domain-n": n, "domain-correct": right}, names, 2)


def test_parse_domains_reads_what_the_schedules_move_through():
    assert parse_domains("blur:2,contrast:2,clean") == DOMAINS
    plan = dataclasses.replace(ShiftPlan("continual", DOMAINS), spread=2)
    assert plan.active == 2


# ----- a federation on a schedule -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory):
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_shift"), world.CLASSNAMES)


@pytest.mark.parametrize("shift", ["continual", "mixed"])
def test_a_run_on_a_schedule_reports_each_batchs_domains_and_the_calibration_error(testbed_tiny, tmp_path, shift):
    config = small_run(testbed_tiny, tmp_path, shift=shift, **{"shift-period": 1, "local-method": "tda"})
    summary, _, _ = run_federation(config)
    rows = read_rows(tmp_path / "run")
    assert all(r["status"] == "ok" for r in rows)
    for row in rows:
        assert sum(n for n, _ in row["domains"].values()) == row["num_examples"]
        assert sum(right for _, right in row["domains"].values()) == row["correct"]
        assert sum(row["calibration"]["n"]) == row["num_examples"] and 0 <= row["ece"] <= 1
    if shift == "continual":  # one domain a batch, moving every round
        assert all(len(r["domains"]) == 1 and r["domain"] in r["domains"] for r in rows)
        assert len({r["domain"] for r in rows if r["client"] == 0}) == 3
        assert summary["switches"]["switches"] == 3 * 2  # 3 clients, 3 batches: two switches each
    else:
        assert any(r["domain"] == "mixed" for r in rows) and summary["switches"] is None
    assert sum(summary["per_domain_samples"].values()) == summary["samples"]  # every sample in one domain
    right = sum(acc * summary["per_domain_samples"][d] for d, acc in summary["per_domain_accuracy"].items())
    assert right == pytest.approx(summary["micro_accuracy"] * summary["samples"])
    pooled = sum((bins_from_metrics(r["calibration"], r["num_examples"]) for r in rows), empty_bins())
    assert summary["ece"] == pytest.approx(pooled.ece) and summary["ece_before"] is not None


def test_a_reply_whose_domain_counts_do_not_add_up_is_rejected_and_the_round_goes_on(testbed_tiny, tmp_path):
    def tampering(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "train" and int(message.metadata.group_id) == 2:
            content = reply.content
            metrics = dict(content.metric_records[METRICS])
            if metrics.get("client-id") == 1:
                metrics["domain-n"] = [n + 1 for n in metrics["domain-n"]]
                content[METRICS] = MetricRecord(metrics)
                return reply_with(message, content)
        return reply

    summary, _, _ = run_federation(small_run(testbed_tiny, tmp_path), app=tampering)
    rows = read_rows(tmp_path / "run")
    bad = [r for r in rows if r["round"] == 2 and r["client"] == 1]
    assert bad[0]["status"] == "rejected" and "domain-n" in bad[0]["reason"]
    assert sum(summary["per_domain_samples"].values()) == summary["samples"]


# ----- switches -----------------------------------------------------------------------------------------------
def test_recovery_and_forgetting_are_the_hand_computed_ones():
    from fedrapp_app.metrics.switches import Batch, switch_metrics

    def b(domain: str, right: int) -> Batch:
        return Batch(domain, 10, right)

    # client 0: A A | B B B | A ; client 1: A | mixed | A (a mixed batch ends a segment)
    client0 = [b("A", 8), b("A", 6), b("B", 3), b("B", 5), b("B", 7), b("A", 5)]
    client1 = [b("A", 5), b("mixed", 9), b("A", 6)]
    metrics = switch_metrics([client0, client1])
    # switch A->B: level (8+6)/20 = .7; batches .3 .5 .7 -> recovered after 2. Switch B->A: level (5+7)/20 = .6;
    # .5 never reaches it -> unrecovered. Client 1's mixed batch ends a segment; A after it is a new segment of
    # the same domain: a switch with level .5, first batch .6 -> recovered at 0, and a return to A (.5 - .6).
    assert metrics["switches"] == 3 and metrics["unrecovered"] == 1
    assert metrics["recovery_batches"] == pytest.approx((2 + 0) / 2)
    assert metrics["post_switch_accuracy"] == pytest.approx((3 + 5 + 6) / 30)
    # returns: client 0 back to A (last A .6, first return .5 -> +.1); client 1 back to A (.5 -> .6: -.1)
    assert metrics["returns"] == 2 and metrics["forgetting"] == pytest.approx(0.0)
    assert switch_metrics([[b("A", 1), b("A", 2)]]) is None


def test_the_run_report_shows_calibration_domains_and_the_switches(testbed_tiny, tmp_path):
    from fedrapp_app.metrics.switches import switch_rounds
    from fedrapp_app.report.page import write_report

    config = small_run(testbed_tiny, tmp_path, shift="continual", **{"shift-period": 1, "local-method": "tda"})
    run_federation(config)
    rows = read_rows(tmp_path / "run")
    assert switch_rounds(rows) == [2, 3]  # every client moves at every batch
    text = write_report(tmp_path / "run").read_text()
    assert "## Calibration and shift" in text and "6 domain switches" in text and "| blur:2 |" in text


# ----- ImageNet-C corruptions of a real dataset -----------------------------------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An image folder (the 'custom' dataset's format) of 3 classes x 16 images of 40x48 px."""
    from PIL import Image

    root = tmp_path_factory.mktemp("real") / "data"
    rng = np.random.default_rng(0)
    for label in range(3):
        (root / f"class_{label}").mkdir(parents=True)
        for j in range(16):
            pixels = (rng.random((48, 40, 3)) * 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class_{label}" / f"{j:02d}.png")
    return str(root)


def real(folder: str, **overrides) -> DataSpec:
    values = dict(dataset="custom", data_dir=folder, num_clients=3, min_partition_size=4, batch_size=8,
                  decode_workers=0, corruptions="gaussian_noise:3,contrast:2,clean")  # fmt: skip
    return DataSpec(**{**values, **overrides})


def test_a_real_datasets_clients_see_their_imagenet_c_domain_the_same_way_every_time(folder):
    from fedrapp_app.data.corruptions import corrupt_image, sample_seed

    spec = real(folder)
    assert client_domains(spec) == ["gaussian_noise:3", "contrast:2", "clean"]
    source = cached_source(spec)
    for client, domain in enumerate([("gaussian_noise", 3), ("contrast", 2), None]):
        stream = build_client_stream(spec, client)
        batch = stream.batch(0)
        originals = source.load(stream.indices_at(0))
        for image, original, index in zip(batch.images, originals, batch.indices, strict=True):
            expected = original if domain is None else corrupt_image(original, *domain, sample_seed(0, index))
            assert np.array_equal(np.asarray(image), np.asarray(expected))
            assert (domain is None) == np.array_equal(np.asarray(image), np.asarray(original))
        clear_caches()
        again = build_client_stream(spec, client).batch(0)
        assert all(
            np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(again.images, batch.images, strict=True)
        )


def test_a_real_datasets_domains_move_with_a_schedule(folder):
    spec = real(folder, shift="continual", shift_period=1)
    stream = build_client_stream(spec, 0)
    assert [stream.batch(p).domains[0] for p in range(3)] == ["gaussian_noise:3", "contrast:2", "clean"]


@pytest.mark.parametrize(
    ("corruptions", "hint"),
    [
        ("fog:2", "'fog' is not offered"),
        ("impulse_noise:1", "not reproducible"),
        ("gaussian_noise:6", "outside 1..5"),
        ("rain:1", "unknown corruption 'rain'"),
    ],
)
def test_a_bad_corruption_is_refused_before_anything_loads(folder, corruptions, hint):
    with pytest.raises(ValueError, match=hint):
        validate_spec(real(folder, corruptions=corruptions))


def test_corruptions_on_the_testbed_are_refused_and_a_too_small_image_is_skipped_with_its_reason(tmp_path):
    from PIL import Image

    with pytest.raises(ValueError, match="testbed-domains"):
        validate_spec(small(corruptions="contrast:1"))
    for label in range(2):
        (tmp_path / f"c{label}").mkdir()
        for j in range(4):
            Image.new("RGB", (16, 16), (label, j, 0)).save(tmp_path / f"c{label}" / f"{j}.png")
    spec = real(str(tmp_path), num_clients=1, corruptions="contrast:1", partition="iid")
    batch = build_client_stream(spec, 0).batch(0)
    assert not batch.images and len(batch.skipped) == 8 and "below 32 px" in batch.skipped[0].reason


def test_without_the_library_the_error_says_how_to_install_it(folder, monkeypatch):
    import sys

    from fedrapp_app.data import spec as spec_module

    monkeypatch.setitem(sys.modules, "imagecorruptions", None)  # as if not installed
    spec_module._library_ready.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"pip install 'fedrapp\[corruptions\]'"):
            validate_spec(real(folder))
    finally:
        spec_module._library_ready.cache_clear()


def test_the_report_words_recovery_and_forgetting_so_that_no_number_reads_as_an_error():
    """Issue 39: "0.00 batches to get back ... (41 never did)" and a forgetting of "-1.00 points" read as errors."""
    from fedrapp_app.report.page import _forgetting_words, _recovery_words

    none = {"switches": 41, "unrecovered": 41, "recovery_batches": None, "forgetting": -0.01, "returns": 3}
    assert _recovery_words(none) == "None of the 41 got back to the accuracy before it."
    assert "-1.00 points (nothing forgotten" in _forgetting_words(none) and "3 returns" in _forgetting_words(none)
    at_once = {"switches": 10, "unrecovered": 2, "recovery_batches": 0.0, "forgetting": None, "returns": 0}
    assert _recovery_words(at_once) == "8 of 10 got back to the accuracy before the switch: each on its first batch " \
        "after the switch; 2 never did."  # fmt: skip
    assert _forgetting_words(at_once) == "No client returned to a domain it had left."
    slow = {"switches": 4, "unrecovered": 0, "recovery_batches": 1.5, "forgetting": 0.02, "returns": 4}
    assert "after 1.50 batches on average" in _recovery_words(slow) and "+2.00 points (it forgot)" in _forgetting_words(
        slow
    )
