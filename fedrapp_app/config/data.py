"""The data group: the dataset, its partition over clients and each client's stream (``fedrapp_app.data``)."""

from __future__ import annotations

from collections.abc import Mapping

from fedrapp_app.config.keys import Group, Key, Scalar, override_hint
from fedrapp_app.data.shift import SHIFT_TIMES, SHIFTS
from fedrapp_app.data.spec import STREAM_ORDERS, DataSpec

_DATA = DataSpec()  # the data layer owns its defaults

#: Run-config keys of the data layer -> DataSpec fields.
DATA_KEYS: dict[str, str] = {
    "dataset": "dataset",
    "data-source": "source",
    "data-dir": "data_dir",
    "hf-repo": "hf_repo",
    "hf-split": "hf_split",
    "hf-image-column": "hf_image_column",
    "hf-label-column": "hf_label_column",
    "num-clients": "num_clients",
    "partition": "partition",
    "dirichlet-alpha": "dirichlet_alpha",
    "min-partition-size": "min_partition_size",
    "seed": "seed",
    "batch-size": "batch_size",
    "max-samples-per-client": "max_samples_per_client",
    "testbed-samples": "testbed_samples",
    "testbed-domains": "testbed_domains",
    "decode-workers": "decode_workers",
    "shift": "shift",
    "shift-period": "shift_period",
    "shift-rate": "shift_rate",
    "shift-spread": "shift_spread",
    "shift-times": "shift_times",
    "stream-order": "stream_order",
    "stream-dirichlet": "stream_dirichlet",
    "corruptions": "corruptions",
}


def _testbed_pool_problems(clients: int, v: Mapping[str, Scalar]) -> list[str]:
    """The testbed's pool size is a config value: check here that ``clients`` partitions of it can exist.

    The suggested pool for a Dirichlet partition is 4x the smallest that fits (``clients x min-partition-size``):
    a Dirichlet(alpha) draw gives many clients fewer samples than the minimum, and those are topped up from the
    largest clients (``data.partition.repair_min_size``), which evens out the partition drawn. Measured at alpha 0.1,
    seed 0, 600 clients x 10: a pool of 6000 tops up 323 clients (24% of the samples move, median client 10
    samples), 24000 tops up 23 (0.3%, median 35).
    """
    pool, batch = int(v["testbed-samples"]), int(v["batch-size"])
    if v["partition"] != "dirichlet":  # iid: one sample per client fits; one batch each is a run worth its name
        if clients <= pool:
            return []
        return [
            f"  num-clients = {clients}: the testbed pool of testbed-samples = {pool} cannot give {clients} clients "
            f'one sample each (fix: -c "testbed-samples={clients * batch}", one batch of batch-size = {batch} per '
            f'client, or -c "num-clients={pool}")'
        ]
    minimum = int(v["min-partition-size"])
    if clients * minimum <= pool:
        return []
    fits = [f'-c "num-clients={pool // minimum}"'] if pool >= minimum else []
    fits += [f'-c "min-partition-size={pool // clients}"'] if pool >= clients else []
    return [
        f"  num-clients = {clients}: the testbed pool of testbed-samples = {pool} cannot give {clients} clients x "
        f"min-partition-size = {minimum} samples = {clients * minimum} (fix: "
        f'-c "testbed-samples={clients * minimum * 4}", 4x the {clients * minimum} that just fit: a Dirichlet draw '
        f"leaves many clients short of min-partition-size, and topping them up from the largest ones evens out the "
        f"partition it drew; or {' or '.join(fits) or 'fewer clients'})"
    ]


def check(v: Mapping[str, Scalar]) -> list[str]:
    """The testbed's pool can give every client its partition, and stream-dirichlet acts only on its order (the data
    layer checks the rest: ``RunConfig``)."""
    clients = int(v["num-clients"])  # 0: one per SuperNode, known once the run starts
    problems = _testbed_pool_problems(clients, v) if clients and v["dataset"] == "testbed" else []
    if v["stream-dirichlet"] != _DATA.stream_dirichlet and v["stream-order"] != "dirichlet":
        problems.append(  # the fix is another key's value, so not problem()'s hint to change this one
            f"  stream-dirichlet = {v['stream-dirichlet']!r}: has no effect with stream-order = "
            f"{v['stream-order']!r} (fix: {override_hint('stream-order', 'dirichlet')}, or drop stream-dirichlet)"
        )
    return problems


GROUP = Group(
    "data",
    "the dataset, its partition over clients and each client's stream",
    (
        Key("dataset", "testbed", "'testbed' or a dataset preset (see docs/datasets.md)", everyday=True),
        Key(
            "data-dir",
            "",
            "local folder of a webdataset, CoOp or image-folder dataset",
            everyday=True,
        ),
        Key(
            "partition",
            "dirichlet",
            "how test samples are split over clients",
            choices=("iid", "dirichlet"),
            everyday=True,
        ),
        Key(
            "dirichlet-alpha",
            0.1,
            "Dirichlet concentration of the label skew (smaller = more skew)",
            minimum=0.0,
            exclusive_minimum=True,
            everyday=True,
        ),
        Key("batch-size", 64, "test samples per client per round", minimum=1, everyday=True),
        Key(
            "data-source",
            "auto",
            "where the dataset comes from",
            choices=("auto", "hf", "webdataset", "coop", "imagefolder", "testbed"),
        ),
        Key("hf-repo", "", "Hugging Face dataset repo id ('' = the preset's default)"),
        Key("hf-split", "test", "split of the Hugging Face dataset"),
        Key("hf-image-column", _DATA.hf_image_column, "image column ('auto' = the first Image column)"),
        Key("hf-label-column", _DATA.hf_label_column, "label column ('auto' = the first ClassLabel column)"),
        Key("min-partition-size", 10, "smallest partition a Dirichlet draw may give a client", minimum=0),
        Key("max-samples-per-client", 0, "cap on each client's stream; 0 = all", minimum=0),
        Key(
            "testbed-samples",
            _DATA.testbed_samples,
            "size of the testbed's test pool (all clients together)",
            minimum=1,
        ),
        Key(
            "testbed-domains",
            _DATA.testbed_domains,
            "testbed shift domains 'name:severity,...'; client i gets domain i mod D ('clean' = none)",
        ),
        Key(
            "shift",
            _DATA.shift,
            "ours: how a client's testbed domain moves along its stream: 'fixed' (the paper's), 'continual' (through "
            "the domains in turn), 'gradual' (severity up and down, family by family), 'mixed' (per sample); "
            "docs/shift.md",
            choices=SHIFTS,
        ),
        Key("shift-period", _DATA.shift_period, "batches per shift step (continual, gradual)", minimum=1),
        Key(
            "shift-rate",
            _DATA.shift_rate,
            "below 1; > 0: a shift step at each batch with this probability (at the times shift-times says), not each "
            "period",
            minimum=0.0,
        ),
        Key(
            "shift-spread",
            _DATA.shift_spread,
            "domains active across clients at once under a schedule (client i starts at domain i mod it); 0 = all",
            minimum=0,
        ),
        Key(
            "shift-times",
            _DATA.shift_times,
            "ours: when clients switch under continual or gradual: all at the federation's times ('shared'), or each "
            "at its own seeded times ('per-client': its own phase of the period, or its own random switches)",
            choices=SHIFT_TIMES,
        ),
        Key(
            "corruptions",
            _DATA.corruptions,
            "ours: a real dataset's shift domains, ImageNet-C corruptions 'name:severity,...' (severity 1-5; client i "
            "gets domain i mod D, or they move with shift); needs pip install 'fedrapp[corruptions]'; docs/shift.md",
        ),
        Key(
            "stream-order",
            _DATA.stream_order,
            "ours: a client's stream at random (the paper's), class after class ('class', class-correlated) or in "
            "RoTTA's Dirichlet-in-time order ('dirichlet', with stream-dirichlet)",
            choices=STREAM_ORDERS,
        ),
        Key(
            "stream-dirichlet",
            _DATA.stream_dirichlet,
            "stream-order='dirichlet': the concentration gamma of each class's spread over time (0.1, RoTTA's: close "
            "to class after class; large: close to random)",
            minimum=0.0,
            exclusive_minimum=True,
        ),
        Key(
            "decode-workers",
            _DATA.decode_workers,
            "threads decoding images of a batch (0 = in the caller)",
            minimum=0,
            resumable=True,
        ),
    ),
    check,
)
