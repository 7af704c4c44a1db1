"""Sources read tiny fixtures written here in each real format: class names, labels and images come out right.

Every fixture image encodes its (class, sample) in its pixels: red = 20 * class + 10, green = sample id, so a
decoded image can be checked against the label the source reports for it.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from fedrapp_app.data import DataSpec, DataUnavailableError, build_source, resolve_source
from fedrapp_app.data.presets import get_preset
from fedrapp_app.data.sources.base import ClassSubset

# ------------------------------------------------------------------------------------------------ fixtures


def make_image(label: int, sample: int, mode: str = "RGB") -> Image.Image:
    image = Image.new("RGB", (12, 10), (20 * label + 10, sample % 256, 7))
    return image.convert(mode) if mode != "RGB" else image


def decode_ids(image: Image.Image) -> tuple[int, int]:
    """(class, sample) encoded in a fixture image."""
    red, green, _ = image.getpixel((5, 5))
    return (red - 10) // 20, green


def encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    return buffer.getvalue()


def check_images(source, expected_ids: list[tuple[int, int]] | None = None) -> None:
    """Every image decodes as RGB and encodes the label the source reports for it."""
    labels = source.labels()
    images = source.load(np.arange(len(labels)))
    assert len(images) == len(labels)
    ids = [decode_ids(im) for im in images]
    assert all(im.mode == "RGB" for im in images)
    if expected_ids is None:
        return
    assert ids == expected_ids


def write_image_folder(root: Path, classes: list[str], per_class: int) -> list[tuple[int, int]]:
    ids = []
    for label, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for j in range(per_class):
            sample = 10 * label + j
            make_image(label, sample).save(root / name / f"{j}.png")
            ids.append((label, sample))
    return ids


def write_webdataset(root: Path, classnames: list[str], labels: list[int], shards: int = 2) -> None:
    (root / "test").mkdir(parents=True)
    (root / "classnames.txt").write_text("\n".join(classnames) + "\n")
    (root / "test" / "nshards.txt").write_text(f"{shards}\n")
    chunks = np.array_split(np.arange(len(labels)), shards)
    for shard, chunk in enumerate(chunks):
        with tarfile.open(root / "test" / f"{shard}.tar", "w") as tar:
            for i in chunk:
                fmt, ext = ("WEBP", "webp") if shard == 0 else ("PNG", "png")
                for name, payload in (
                    (f"s{i:06d}.{ext}", encode(make_image(labels[i], int(i)), fmt)),
                    (f"s{i:06d}.cls", str(labels[i]).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))


def hf_dataset(classnames: list[str], labels: list[int]) -> datasets.Dataset:
    features = datasets.Features({"img": datasets.Image(), "fine_label": datasets.ClassLabel(names=classnames)})
    images = [make_image(label, i) for i, label in enumerate(labels)]
    return datasets.Dataset.from_dict({"img": images, "fine_label": labels}, features=features)


@pytest.fixture(autouse=True)
def _hf_cache(tmp_path, monkeypatch):
    # load_dataset prepares parquet into the datasets cache: keep it in the test's folder.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


# ------------------------------------------------------------------------------------------------ image folder


def test_image_folder_reads_names_labels_and_rgb_images(tmp_path):
    ids = write_image_folder(tmp_path / "data", ["apple_pie", "baby_back_ribs", "caesar_salad"], 3)
    spec = DataSpec(dataset="food101", data_dir=str(tmp_path / "data"))
    assert resolve_source(spec) == ("imagefolder", str(tmp_path / "data"))
    source = build_source(spec)
    assert source.classnames == ["apple pie", "baby back ribs", "caesar salad"]
    assert source.template == "a photo of {}, a type of food."
    np.testing.assert_array_equal(source.labels(), [0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert source.labels().dtype == np.int64
    check_images(source, ids)


def test_grey_and_palette_images_come_out_rgb(tmp_path):
    (tmp_path / "data" / "a").mkdir(parents=True)
    make_image(3, 0, mode="L").save(tmp_path / "data" / "a" / "grey.png")
    make_image(3, 0, mode="P").save(tmp_path / "data" / "a" / "palette.png")
    make_image(3, 0, mode="RGBA").save(tmp_path / "data" / "a" / "alpha.png")
    images = build_source(DataSpec(dataset="custom", data_dir=str(tmp_path / "data"))).load([0, 1, 2])
    assert [im.mode for im in images] == ["RGB", "RGB", "RGB"]
    assert [im.size for im in images] == [(12, 10)] * 3


def test_image_folder_loads_any_order(tmp_path):
    ids = write_image_folder(tmp_path / "data", ["a", "b"], 4)
    source = build_source(DataSpec(dataset="custom", data_dir=str(tmp_path / "data"), decode_workers=3))
    order = [7, 0, 5, 5, 2]
    assert [decode_ids(im) for im in source.load(order)] == [ids[i] for i in order]


# ------------------------------------------------------------------------------------------------ CoOp layouts


def write_coop_pets(data_root: Path) -> list[tuple[int, int]]:
    folder = data_root / "oxford_pets"
    (folder / "images").mkdir(parents=True)
    names = ["Abyssinian", "american_bulldog", "Bengal"]
    items, ids = [], []
    for i, label in enumerate([2, 0, 1, 0, 2, 1, 1]):
        make_image(label, i).save(folder / "images" / f"{names[label]}_{i}.png")
        items.append([f"{names[label]}_{i}.png", label, names[label]])
        ids.append((label, i))
    split = {"train": items[:1], "val": [], "test": items}
    (folder / "split_zhou_OxfordPets.json").write_text(json.dumps(split))
    return ids


@pytest.mark.parametrize("point_at", ["data-root", "dataset-folder"])
def test_coop_split_json(tmp_path, point_at):
    ids = write_coop_pets(tmp_path)
    data_dir = tmp_path if point_at == "data-root" else tmp_path / "oxford_pets"
    spec = DataSpec(dataset="OxfordPets", data_dir=str(data_dir))
    assert resolve_source(spec)[0] == "coop"
    source = build_source(spec)
    # Class names from the split file's class column, lower-cased and cleaned as in CoOp.
    assert source.classnames == ["abyssinian", "american bulldog", "bengal"]
    assert source.template.format(source.classnames[1]) == "a photo of a american bulldog, a type of pet."
    np.testing.assert_array_equal(source.labels(), [2, 0, 1, 0, 2, 1, 1])
    check_images(source, ids)


def test_coop_split_json_other_split_and_bad_split(tmp_path):
    write_coop_pets(tmp_path)
    source = build_source(DataSpec(dataset="oxford-pets", data_dir=str(tmp_path), hf_split="train"))
    assert len(source) == 1
    with pytest.raises(ValueError, match="hf-split='nope'"):
        build_source(DataSpec(dataset="oxford-pets", data_dir=str(tmp_path), hf_split="nope"))


def test_coop_fgvc_variants_layout(tmp_path):
    folder = tmp_path / "fgvc_aircraft"
    (folder / "images").mkdir(parents=True)
    (folder / "variants.txt").write_text("707-320\nA300B4\nDC-3\n")
    lines = []
    for i, label in enumerate([1, 2, 0, 1]):
        make_image(label, i).save(folder / "images" / f"{1000 + i}.jpg", quality=100)
        lines.append(f"{1000 + i} {['707-320', 'A300B4', 'DC-3'][label]}")
    (folder / "images_variant_test.txt").write_text("\n".join(lines) + "\n")
    source = build_source(DataSpec(dataset="fgvc-aircraft", data_dir=str(tmp_path)))
    assert source.classnames == ["707-320", "A300B4", "DC-3"]
    np.testing.assert_array_equal(source.labels(), [1, 2, 0, 1])
    assert [decode_ids(im)[0] for im in source.load([0, 1, 2, 3])] == [1, 2, 0, 1]  # JPEG: class survives


def test_coop_imagenet_a_maps_wordnet_ids(tmp_path):
    folder = tmp_path / "imagenet-adversarial"
    wnids = ["n01440764", "n01443537", "n01484850", "n01491361"]
    (folder).mkdir()
    (folder / "classnames.txt").write_text(
        "n01440764 tench\nn01443537 goldfish\nn01484850 great white shark\nn01491361 tiger shark\n"
    )
    # ImageNet-A holds a subset of the classes: labels 0..k-1 over its own sorted folders.
    for label, wnid in enumerate([wnids[1], wnids[3]]):
        (folder / "imagenet-a" / wnid).mkdir(parents=True)
        make_image(label, label).save(folder / "imagenet-a" / wnid / "x.png")
    (folder / "imagenet-a" / "README.txt").write_text("not a class")
    source = build_source(DataSpec(dataset="imagenet-a", data_dir=str(tmp_path)))
    assert source.classnames == ["goldfish", "tiger shark"]
    check_images(source, [(0, 0), (1, 1)])


def test_coop_imagenet_v2_numeric_folders_follow_classnames_order(tmp_path):
    folder = tmp_path / "imagenetv2"
    names = [f"class {k}" for k in range(12)]
    (folder / "imagenetv2-matched-frequency-format-val").mkdir(parents=True)
    (folder / "classnames.txt").write_text("".join(f"n{k:08d} {n}\n" for k, n in enumerate(names)))
    for k in range(12):
        (folder / "imagenetv2-matched-frequency-format-val" / str(k)).mkdir()
        make_image(k, k).save(folder / "imagenetv2-matched-frequency-format-val" / str(k) / "a.png")
    source = build_source(DataSpec(dataset="imagenetv2", data_dir=str(folder)))
    # Folder "10" is class 10 (numeric order, not "0, 1, 10, 11, 2, ...").
    assert source.classnames == names
    np.testing.assert_array_equal(source.labels(), np.arange(12))
    check_images(source, [(k, k) for k in range(12)])


def test_wordnet_folders_without_classnames_file_are_an_error(tmp_path):
    (tmp_path / "imgs" / "n01440764").mkdir(parents=True)
    make_image(0, 0).save(tmp_path / "imgs" / "n01440764" / "a.png")
    with pytest.raises(DataUnavailableError, match="classnames.txt"):
        build_source(DataSpec(dataset="custom", source="imagefolder", data_dir=str(tmp_path / "imgs")))


# ------------------------------------------------------------------------------------------------ webdataset


def test_local_webdataset(tmp_path):
    labels = [3, 0, 2, 1, 1, 0, 3]
    write_webdataset(tmp_path / "wds", ["banded", "blotchy", "braided", "bubbly"], labels)
    spec = DataSpec(dataset="dtd", data_dir=str(tmp_path / "wds"))
    assert resolve_source(spec)[0] == "webdataset"
    source = build_source(spec)
    assert source.classnames == ["banded", "blotchy", "braided", "bubbly"]
    assert source.template.format("banded") == "banded texture."
    np.testing.assert_array_equal(source.labels(), labels)
    check_images(source, [(label, i) for i, label in enumerate(labels)])
    # Random access across both shards, in any order, from several threads.
    assert [decode_ids(im) for im in source.load([6, 0, 3])] == [(3, 6), (3, 0), (1, 3)]


def test_webdataset_caltech101_drops_background_and_centered_face(tmp_path):
    raw = ["accordion", "airplane", "background", "centered face", "off-center face", "leopard"]
    labels = [0, 2, 1, 3, 4, 5, 2, 0]
    write_webdataset(tmp_path / "wds", raw, labels, shards=1)
    source = build_source(DataSpec(dataset="caltech101", source="webdataset", data_dir=str(tmp_path / "wds")))
    assert isinstance(source, ClassSubset)
    assert source.classnames == ["accordion", "airplane", "off-center face", "leopard"]
    kept = [i for i, label in enumerate(labels) if label not in (2, 3)]
    new = {0: 0, 1: 1, 4: 2, 5: 3}
    np.testing.assert_array_equal(source.labels(), [new[labels[i]] for i in kept])
    # Images still belong to the samples they are labelled with (raw class ids in the pixels).
    assert [decode_ids(im) for im in source.load(np.arange(len(kept)))] == [(labels[i], i) for i in kept]


def test_webdataset_zero_classes_is_an_error(tmp_path):
    write_webdataset(tmp_path / "wds", ["a"], [0, 0], shards=1)
    (tmp_path / "wds" / "classnames.txt").write_text("\n")
    with pytest.raises(ValueError, match="zero classes"):
        build_source(DataSpec(dataset="custom", source="webdataset", data_dir=str(tmp_path / "wds")))


def test_hub_webdataset_unreachable_gives_instructions(tmp_path, monkeypatch):
    import huggingface_hub

    def offline(**kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("Cannot reach the Hub (simulated: no network)")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(DataUnavailableError) as info:
        build_source(DataSpec(dataset="oxford-pets"))
    message = str(info.value)
    assert "clip-benchmark/wds_vtab-pets" in message
    assert "hf download --repo-type dataset clip-benchmark/wds_vtab-pets" in message
    assert "data-dir" in message and "hf-repo" in message
    assert "LocalEntryNotFoundError" in message


# ------------------------------------------------------------------------------------------------ Hugging Face


def test_hf_save_to_disk_with_auto_columns(tmp_path):
    labels = [1, 0, 2, 2, 0]
    hf_dataset(["rose", "tiger_lily", "daisy"], labels).save_to_disk(tmp_path / "saved")
    spec = DataSpec(dataset="flowers102", data_dir=str(tmp_path / "saved"))
    assert resolve_source(spec)[0] == "hf"
    source = build_source(spec)
    assert source.classnames == ["rose", "tiger lily", "daisy"]
    np.testing.assert_array_equal(source.labels(), labels)
    check_images(source, [(label, i) for i, label in enumerate(labels)])


def test_hf_datasetdict_on_disk_picks_the_split(tmp_path):
    data = datasets.DatasetDict({"train": hf_dataset(["a", "b"], [0]), "test": hf_dataset(["a", "b"], [1, 0, 1])})
    data.save_to_disk(tmp_path / "dd")
    source = build_source(DataSpec(dataset="custom", source="hf", hf_repo=str(tmp_path / "dd")))
    np.testing.assert_array_equal(source.labels(), [1, 0, 1])
    with pytest.raises(ValueError, match="hf-split"):
        build_source(DataSpec(dataset="custom", source="hf", hf_repo=str(tmp_path / "dd"), hf_split="val"))


def test_hf_parquet_folder_loads_offline(tmp_path):
    labels = [0, 1, 1, 0, 1, 0]
    (tmp_path / "pq").mkdir()
    hf_dataset(["cat", "dog"], labels).to_parquet(str(tmp_path / "pq" / "test-00000-of-00001.parquet"))
    source = build_source(
        DataSpec(dataset="custom", hf_repo=str(tmp_path / "pq"), hf_image_column="img", hf_label_column="fine_label")
    )
    assert source.classnames == ["cat", "dog"]
    np.testing.assert_array_equal(source.labels(), labels)
    check_images(source, [(label, i) for i, label in enumerate(labels)])


def test_hf_string_labels_and_bad_column(tmp_path):
    images = [make_image(i % 2, i) for i in range(4)]
    data = datasets.Dataset.from_dict(
        {"image": images, "label": ["dog", "cat", "dog", "cat"]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("string")}),
    )
    data.save_to_disk(tmp_path / "s")
    source = build_source(DataSpec(dataset="custom", data_dir=str(tmp_path / "s")))
    assert source.classnames == ["cat", "dog"]
    np.testing.assert_array_equal(source.labels(), [1, 0, 1, 0])
    with pytest.raises(ValueError, match="hf-image-column"):
        build_source(DataSpec(dataset="custom", data_dir=str(tmp_path / "s"), hf_image_column="pixels"))


def test_hf_hub_unreachable_gives_instructions(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'ethz/food101' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataUnavailableError) as info:
        build_source(DataSpec(dataset="food101", source="hf", hf_repo="ethz/food101"))
    message = str(info.value)
    assert "ethz/food101" in message and "save_to_disk" in message and "hf-repo" in message


# ------------------------------------------------------------------------------------------------ errors


def test_missing_data_dir_names_the_key_and_how_to_prepare(tmp_path):
    with pytest.raises(DataUnavailableError) as info:
        build_source(DataSpec(dataset="dtd", data_dir=str(tmp_path / "nowhere")))
    message = str(info.value)
    assert "data-dir" in message and "split_zhou_DescribableTextures.json" in message
    assert "data-source='webdataset'" in message


def test_ucf101_needs_a_data_dir():
    with pytest.raises(ValueError, match="data-dir"):
        build_source(DataSpec(dataset="ucf101"))


def test_unrecognised_layout(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("x")
    with pytest.raises(DataUnavailableError, match="recognising the layout"):
        build_source(DataSpec(dataset="custom", data_dir=str(tmp_path / "d")))


def test_coop_images_missing(tmp_path):
    write_coop_pets(tmp_path)
    for image in (tmp_path / "oxford_pets" / "images").iterdir():
        image.unlink()
    with pytest.raises(DataUnavailableError, match="reading the image"):
        build_source(DataSpec(dataset="oxford-pets", data_dir=str(tmp_path)))


def test_presets_point_at_their_coop_folders():
    assert get_preset("Caltech101").coop_image_dir == "101_ObjectCategories"
    assert get_preset("imagenet").coop_image_dir == "images/val"
