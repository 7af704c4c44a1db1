"""DataSpec validation, dataset presets (templates, class-name rules) and the datasets table in the docs."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from fedrapp_app.data import PAPER_DATASETS, PRESETS, DataSpec, clean_classnames, get_preset, validate_spec
from fedrapp_app.data.presets import datasets_table
from fedrapp_app.data.spec import kebab, parse_domains

DOCS = Path(__file__).resolve().parents[1] / "docs" / "datasets.md"


def test_defaults_are_valid_and_fields_map_to_kebab_keys():
    assert validate_spec(DataSpec()) == DataSpec()
    assert {kebab(f.name) for f in fields(DataSpec)} >= {
        "dataset", "data-source", "data-dir", "hf-repo", "hf-split", "hf-image-column", "hf-label-column",
        "num-clients", "partition", "dirichlet-alpha", "min-partition-size", "seed", "batch-size",
        "max-samples-per-client", "testbed-samples", "testbed-domains", "decode-workers",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dataset": "mnist"}, "dataset='mnist' is invalid: expected one of flowers102"),
        ({"source": "s3"}, "source='s3' is invalid: expected one of 'auto', 'hf'"),
        ({"partition": "shards"}, "partition='shards' is invalid: expected one of 'iid', 'dirichlet'"),
        ({"dirichlet_alpha": 0.0}, "dirichlet-alpha=0.0 is invalid: expected a finite number > 0"),
        ({"dirichlet_alpha": float("nan")}, "dirichlet-alpha=nan is invalid"),
        ({"num_clients": 0}, "num-clients=0 is invalid: expected an integer >= 1"),
        ({"num_clients": 2.5}, "num-clients=2.5 is invalid: expected an integer >= 1"),
        ({"batch_size": True}, "batch-size=True is invalid"),
        ({"min_partition_size": -1}, "min-partition-size=-1 is invalid: expected an integer >= 0"),
        ({"seed": -3}, "seed=-3 is invalid: expected an integer >= 0"),
        ({"max_samples_per_client": -1}, "max-samples-per-client=-1 is invalid"),
        ({"testbed_samples": 0}, "testbed-samples=0 is invalid"),
        ({"decode_workers": -1}, "decode-workers=-1 is invalid"),
        ({"hf_split": " "}, "hf-split=' ' is invalid: expected a non-empty string"),
        ({"testbed_domains": "blur:0"}, "testbed-domains='blur:0' is invalid"),
        ({"testbed_domains": "fog:1"}, "testbed-domains: unknown corruption 'fog'"),
        ({"source": "hf"}, "source='hf' is invalid: expected 'auto' or 'testbed' when dataset='testbed'"),
        ({"dataset": "dtd", "source": "testbed"}, "source='testbed' is invalid"),
        ({"dataset": "dtd", "source": "coop"}, "data-dir='' is invalid"),
        ({"dataset": "custom", "source": "hf"}, "hf-repo='' is invalid"),
        ({"dataset": "ucf101"}, "data-dir='' is invalid: expected a local folder for dataset='ucf101'"),
        ({"dataset": "custom"}, "data-dir='' is invalid"),
        ({"data_dir": 3}, "data-dir=3 is invalid: expected a string"),
    ],
)
def test_validation_names_key_value_and_range(overrides, message):
    with pytest.raises(ValueError) as info:
        validate_spec(DataSpec(**overrides))
    assert message in str(info.value)


def test_parse_domains():
    assert parse_domains("gaussian_noise:1, blur:2,contrast") == (("gaussian_noise", 1), ("blur", 2), ("contrast", 1))
    assert parse_domains("clean,blur:1") == (None, ("blur", 1))
    assert parse_domains("") == parse_domains("clean") == ()


def test_every_paper_dataset_has_a_preset():
    assert len(PAPER_DATASETS) == 14
    assert set(PAPER_DATASETS) <= set(PRESETS)
    for name in PAPER_DATASETS:
        preset = PRESETS[name]
        assert preset.template.count("{}") == 1
        assert preset.coop_dir and preset.prepare
        assert preset.hub_repo.startswith("clip-benchmark/wds_") or name == "ucf101"


@pytest.mark.parametrize(
    ("dataset", "classname", "prompt"),
    [
        ("OxfordPets", "pug", "a photo of a pug, a type of pet."),
        ("Flower102", "sunflower", "a photo of a sunflower, a type of flower."),
        ("FGVCAircraft", "707-320", "a photo of a 707-320, a type of aircraft."),
        ("DTD", "banded", "banded texture."),
        ("Food101", "apple pie", "a photo of apple pie, a type of food."),
        ("UCF101", "Apply Eye Makeup", "a photo of a person doing Apply Eye Makeup."),
        ("StanfordCars", "2012 Tesla Model S", "a photo of a 2012 Tesla Model S."),
        ("SUN397", "abbey", "a photo of a abbey."),
        ("Caltech101", "accordion", "a photo of a accordion."),
        ("ImageNet", "tench", "a photo of a tench."),
        ("ImageNet-A", "goldfish", "a photo of a goldfish."),
        ("ImageNetV2", "goldfish", "a photo of a goldfish."),
        ("ImageNet-R", "goldfish", "a photo of a goldfish."),
        ("ImageNet-Sketch", "goldfish", "a photo of a goldfish."),
    ],
)
def test_templates_render_as_coop(dataset, classname, prompt):
    assert get_preset(dataset).render(classname) == prompt


@pytest.mark.parametrize(
    ("dataset", "raw", "clean"),
    [
        ("food101", ["apple_pie", "baby_back_ribs"], ["apple pie", "baby back ribs"]),
        ("caltech101", ["BACKGROUND_Google", "Faces", "Faces_easy", "Leopards", "airplanes", "ant"],
         ["face", "leopard", "airplane", "ant"]),
        ("caltech101", ["background", "off-center face", "centered face", "leopard"], ["off-center face", "leopard"]),
        ("ucf101", ["ApplyEyeMakeup", "Apply_Eye_Makeup", "YoYo"], ["Apply Eye Makeup", "Apply Eye Makeup", "Yo Yo"]),
        ("sun397", ["/a/abbey", "/b/bakery/shop", "airplane_cabin"], ["abbey", "shop bakery", "airplane cabin"]),
        ("stanford-cars", ["AM General Hummer SUV 2000", "2012 Tesla Model S"],
         ["2000 AM General Hummer SUV", "2012 Tesla Model S"]),
        ("oxford-pets", ["Abyssinian", "american_bulldog"], ["abyssinian", "american bulldog"]),
        ("imagenet", ["tench, Tinca tinca", "goldfish"], ["tench", "goldfish"]),
        ("fgvc-aircraft", ["707-320", "F/A-18"], ["707-320", "F/A-18"]),
    ],
)  # fmt: skip
def test_class_name_rules(dataset, raw, clean):
    names, keep = clean_classnames(get_preset(dataset), raw)
    assert names == clean
    assert int(keep.sum()) == len(clean)


def test_aliases_resolve():
    assert get_preset("Flower102").name == get_preset("oxford_flowers").name == "flowers102"
    assert get_preset("imagenet_sketch").name == "imagenet-sketch"
    with pytest.raises(ValueError, match="not a known dataset"):
        get_preset("cifar10")


def test_docs_table_is_the_presets_table():
    text = DOCS.read_text(encoding="utf-8")
    assert datasets_table() in text, "docs/datasets.md is stale: paste the output of datasets_table() into it"
    for preset in PRESETS.values():
        assert f"`{preset.name}`" in text
