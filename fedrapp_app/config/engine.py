"""The engine group: model, device and numerics (``fedrapp_app.engine``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedrapp_app.config.keys import Group, Key, Scalar, problem

#: The testbed CLIP, which a run may also name by its path.
TESTBED_MODEL = Path(__file__).resolve().parents[1] / "testbed" / "model"


def check(v: Mapping[str, Scalar]) -> list[str]:
    """The model knows the dataset's words, and the device is one this project can name."""
    from fedrapp_app.engine.devices import parse_device  # light: no torch

    problems = []
    if v["dataset"] != "testbed" and (
        v["model"] == "testbed" or Path(str(v["model"])).expanduser().resolve() == TESTBED_MODEL
    ):
        problems.append(
            problem(
                "model",
                v["model"],
                f"the testbed CLIP only knows the testbed world's words, not dataset {v['dataset']!r}; "
                'use a real CLIP such as model="openai/clip-vit-base-patch16"',
            )
        )
    try:
        parse_device(str(v["device"]))
    except ValueError:
        problems.append(problem("device", v["device"], "must be 'auto', 'cpu', 'cuda' or 'cuda:N'"))
    return problems


GROUP = Group(
    "engine",
    "model, device and numerics",
    (
        Key(
            "model",
            "testbed",
            "CLIP checkpoint: 'testbed' (shipped), a local folder or a Hugging Face Hub id",
            everyday=True,
        ),
        Key(
            "device",
            "auto",
            "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'; in the simulation each client sees its GPU share "
            "as "
            "cuda:0; a SuperNode's node config 'device' overrides it",
            everyday=True,
        ),
        Key(
            "precision",
            "fp32",
            "compute precision: fp32 (IEEE, TF32 off on GPUs), bf16 or fp16 autocast (fp16 with loss scaling)",
            choices=("fp32", "bf16", "fp16"),
            everyday=True,
        ),
        Key(
            "deterministic",
            False,
            "deterministic GPU kernels: bit-reproducible csc runs on one GPU, at some speed cost",
        ),
    ),
    check,
)
