"""Dataset presets: the paper's datasets (SPEC §6) with CoOp's zero-shot templates and class-name rules.

A preset never lists class names: they come from the source (label names, ``classnames.txt``, a CoOp split
file, folder names). A preset only says how to *clean* them the way CoOp does, which template to use, and
where the data can be found (a clip-benchmark webdataset on the Hugging Face Hub and/or CoOp's folder layout).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

#: CoOp's hand-written template for datasets without a specific one (``trainers/zsclip.py``).
DEFAULT_TEMPLATE = "a photo of a {}."
#: The seven ImageNet templates CLIP's prompt-engineering notebook selected from its 80: the ensemble TDA uses
#: for ImageNet, ImageNet-A/-V, Caltech101, StanfordCars and SUN397 (its ``datasets/*.py``; it uses the 80 for
#: ImageNet-R/-Sketch, ours the seven) and ZERO's "+Ensemble".
IMAGENET_ENSEMBLE: tuple[str, ...] = (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)


@dataclass(frozen=True)
class DatasetPreset:
    """What the data layer knows about one dataset (everything except its class names and images).

    Attributes
    ----------
    name : the config value (``dataset = "oxford-pets"``).
    title : the dataset's name in the paper / CoOp (``OxfordPets``).
    template : zero-shot template with one ``{}`` for the class name (CoOp's ``CUSTOM_TEMPLATES``).
    ensemble : the templates of a prompt ensemble (``classifier = "ensemble"`` of the training-free methods);
        empty = the template alone (as TDA does for the datasets outside the ImageNet family).
    aliases : other accepted spellings (matched ignoring case, ``-``, ``_`` and spaces).
    hub_repo : the clip-benchmark webdataset repo on the Hub used when no ``data-dir`` is given ("" = none).
    coop_dir : the folder under CoOp's ``$DATA`` root (``DATASETS.md`` of KaiyangZhou/CoOp).
    coop_image_dir : the image root inside ``coop_dir`` (paths in the split file are relative to it).
    coop_layout : ``"split-json"`` (``split_zhou_*.json``), ``"variants"`` (FGVC-Aircraft's txt lists) or
        ``"classnames-folders"`` (ImageNet family: ``classnames.txt`` + one folder per class).
    coop_split_file : the ``split_zhou_*.json`` name for the ``split-json`` layout.
    cleaners : names of the class-name rules in ``CLEANERS`` applied after "underscores to spaces".
    prepare : how to get the data, one instruction per line (shown in errors and docs/datasets.md).
    notes : caveats (split differences, unverified facts).
    """

    name: str
    title: str
    template: str
    ensemble: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    hub_repo: str = ""
    coop_dir: str = ""
    coop_image_dir: str = ""
    coop_layout: str = "split-json"
    coop_split_file: str = ""
    cleaners: tuple[str, ...] = ()
    prepare: tuple[str, ...] = ()
    notes: str = ""

    @property
    def templates(self) -> tuple[str, ...]:
        """The prompt ensemble: ``ensemble``, or the template alone."""
        return self.ensemble or (self.template,)

    def render(self, classname: str) -> str:
        """The zero-shot prompt of one class, e.g. ``"a photo of a pug, a type of pet."``."""
        return self.template.format(classname)


# --------------------------------------------------------------------------------------------------------
# Class-name rules. Each takes the raw name (underscores already turned into spaces) and returns the cleaned
# name, or None to drop the class (its samples leave the split, the remaining labels are renumbered).
# --------------------------------------------------------------------------------------------------------

# CoOp's Caltech101 (datasets/caltech101.py) ignores BACKGROUND_Google and Faces_easy and renames four
# folders. CLIP-style sources (clip-benchmark's classnames.txt) call these two classes "background" and
# "centered face", so both spellings are matched.
_CALTECH_DROP = {"background google", "faces easy", "background", "centered face"}
_CALTECH_RENAME = {"airplanes": "airplane", "faces": "face", "leopards": "leopard", "motorbikes": "motorbike"}


def _caltech101(name: str) -> str | None:
    key = name.lower()
    if key in _CALTECH_DROP:
        return None
    return _CALTECH_RENAME.get(key, name)


def _camel_case(name: str) -> str:
    # UCF101 folders are CamelCase ("ApplyEyeMakeup"); CoOp splits them on capitals (datasets/ucf101.py).
    if " " in name or not re.search(r"[a-z][A-Z]", name):
        return name
    return " ".join(re.findall(r"[A-Z][^A-Z]*", name))


def _sun397_path(name: str) -> str:
    # SUN397's raw class ids are paths ("/b/bakery/shop"): CoOp drops the letter and puts the qualifier
    # first ("shop bakery", datasets/sun397.py).
    if "/" not in name:
        return name
    parts = [p for p in name.strip("/").split("/") if p]
    if parts and len(parts[0]) == 1:
        parts = parts[1:]
    return " ".join(reversed(parts))


def _year_first(name: str) -> str:
    # CoOp writes Stanford Cars names year first ("2012 Tesla Model S", datasets/stanford_cars.py).
    words = name.split(" ")
    if len(words) > 1 and re.fullmatch(r"(19|20)\d\d", words[-1]) and not re.fullmatch(r"\d{4}", words[0]):
        return " ".join([words[-1], *words[:-1]])
    return name


def _first_synonym(name: str) -> str:
    # Hugging Face's ImageNet label names are WordNet synonym lists ("tench, Tinca tinca").
    return name.split(", ")[0]


CLEANERS: dict[str, Callable[[str], str | None]] = {
    "caltech101": _caltech101,
    "camel_case": _camel_case,
    "sun397_path": _sun397_path,
    "year_first": _year_first,
    "lowercase": str.lower,
    "first_synonym": _first_synonym,
}


def clean_classnames(preset: DatasetPreset, raw: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Clean raw class names the way CoOp does: underscores to spaces, then the preset's rules.

    Returns
    -------
    names : the kept classes' cleaned names, in the original order.
    keep : bool [C_raw], which raw classes are kept (False = dropped, e.g. Caltech101's background).
    """
    names: list[str] = []
    keep = np.zeros(len(raw), dtype=bool)
    for i, name in enumerate(raw):
        cleaned: str | None = " ".join(str(name).replace("_", " ").split())
        for rule in preset.cleaners:
            if cleaned is None:
                break
            cleaned = CLEANERS[rule](cleaned)
        if cleaned:
            names.append(cleaned)
            keep[i] = True
    return names, keep


# --------------------------------------------------------------------------------------------------------
# The presets. Hub repos: clip-benchmark's webdatasets (https://huggingface.co/clip-benchmark), whose layout
# is `<split>/nshards.txt`, `<split>/{0..n-1}.tar`, `classnames.txt` (LAION-AI/CLIP_benchmark,
# clip_benchmark/datasets/builder.py: build_wds_dataset). CoOp layouts: KaiyangZhou/CoOp DATASETS.md.
# --------------------------------------------------------------------------------------------------------

_COOP_SPLIT_NOTE = (
    "download the split file from the Google Drive link in CoOp's DATASETS.md "
    "(https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md)"
)


def _imagenet_classnames(where: str) -> str:
    return f"put CoOp's ImageNet classnames.txt (lines 'n01440764 tench', linked from CoOp's DATASETS.md) in {where}"


def _coop_lines(folder: str, layout: str, *downloads: str) -> tuple[str, ...]:
    return (*downloads, f"arrange it as CoOp does: <data-dir>/{folder}/ with {layout}")


PRESETS: dict[str, DatasetPreset] = {
    p.name: p
    for p in (
        DatasetPreset(
            name="flowers102",
            title="Flowers102",
            template="a photo of a {}, a type of flower.",
            aliases=("flower102", "oxford-flowers", "oxfordflowers", "flowers"),
            hub_repo="clip-benchmark/wds_vtab-flowers",
            coop_dir="oxford_flowers",
            coop_image_dir="jpg",
            coop_split_file="split_zhou_OxfordFlowers.json",
            prepare=_coop_lines(
                "oxford_flowers",
                "jpg/ and split_zhou_OxfordFlowers.json",
                "images: https://www.robots.ox.ac.uk/~vgg/data/flowers/102/102flowers.tgz",
                _COOP_SPLIT_NOTE,
            ),
            notes="clip-benchmark's test split is VTAB's (not CoOp's); use the CoOp layout for TPT-comparable numbers.",
        ),
        DatasetPreset(
            name="dtd",
            title="DTD",
            template="{} texture.",
            aliases=("describable-textures", "describabletextures"),
            hub_repo="clip-benchmark/wds_vtab-dtd",
            coop_dir="dtd",
            coop_image_dir="images",
            coop_split_file="split_zhou_DescribableTextures.json",
            prepare=_coop_lines(
                "dtd",
                "images/ and split_zhou_DescribableTextures.json",
                "images: https://www.robots.ox.ac.uk/~vgg/data/dtd/download/dtd-r1.0.1.tar.gz",
                _COOP_SPLIT_NOTE,
            ),
            notes="clip-benchmark's test split is VTAB's (not CoOp's).",
        ),
        DatasetPreset(
            name="caltech101",
            title="Caltech101",
            template=DEFAULT_TEMPLATE,
            ensemble=IMAGENET_ENSEMBLE,
            aliases=("caltech-101",),
            hub_repo="clip-benchmark/wds_vtab-caltech101",
            coop_dir="caltech-101",
            coop_image_dir="101_ObjectCategories",
            coop_split_file="split_zhou_Caltech101.json",
            cleaners=("caltech101",),
            prepare=_coop_lines(
                "caltech-101",
                "101_ObjectCategories/ and split_zhou_Caltech101.json",
                "images: 101_ObjectCategories.tar.gz from https://data.caltech.edu/records/mzrjq-6wc02",
                _COOP_SPLIT_NOTE,
            ),
            notes="background and centered-face classes dropped as in CoOp; clip-benchmark's test split is "
            "VTAB's (6.09k rows on the Hub viewer), not CoOp's.",
        ),
        DatasetPreset(
            name="oxford-pets",
            title="OxfordPets",
            template="a photo of a {}, a type of pet.",
            aliases=("oxfordpets", "pets", "oxford-iiit-pet"),
            hub_repo="clip-benchmark/wds_vtab-pets",
            coop_dir="oxford_pets",
            coop_image_dir="images",
            coop_split_file="split_zhou_OxfordPets.json",
            cleaners=("lowercase",),
            prepare=_coop_lines(
                "oxford_pets",
                "images/ and split_zhou_OxfordPets.json",
                "images: https://www.robots.ox.ac.uk/~vgg/data/pets/data/images.tar.gz",
                _COOP_SPLIT_NOTE,
            ),
            notes="breed names lower-cased as in CoOp's split file; the Hub viewer shows 3.67k test rows, the "
            "size of the official test split CoOp uses.",
        ),
        DatasetPreset(
            name="food101",
            title="Food101",
            template="a photo of {}, a type of food.",
            aliases=("food-101",),
            hub_repo="clip-benchmark/wds_food101",
            coop_dir="food-101",
            coop_image_dir="images",
            coop_split_file="split_zhou_Food101.json",
            prepare=_coop_lines(
                "food-101",
                "images/ and split_zhou_Food101.json",
                "images: https://data.vision.ee.ethz.ch/cvl/datasets_extra/food-101/ (food-101.tar.gz)",
                _COOP_SPLIT_NOTE,
            ),
            notes="CoOp re-splits Food101: its test split is not the one on the Hub.",
        ),
        DatasetPreset(
            name="ucf101",
            title="UCF101",
            template="a photo of a person doing {}.",
            aliases=("ucf-101",),
            coop_dir="ucf101",
            coop_image_dir="UCF-101-midframes",
            coop_split_file="split_zhou_UCF101.json",
            cleaners=("camel_case",),
            prepare=_coop_lines(
                "ucf101",
                "UCF-101-midframes/ and split_zhou_UCF101.json",
                "UCF-101-midframes.zip (CoOp's middle frames) and split_zhou_UCF101.json from the Google Drive "
                "links in CoOp's DATASETS.md",
            ),
            notes="no image version on the Hub was confirmed (clip-benchmark has none): data-dir is required.",
        ),
        DatasetPreset(
            name="sun397",
            title="SUN397",
            template=DEFAULT_TEMPLATE,
            ensemble=IMAGENET_ENSEMBLE,
            aliases=("sun-397",),
            hub_repo="clip-benchmark/wds_sun397",
            coop_dir="sun397",
            coop_image_dir="SUN397",
            coop_split_file="split_zhou_SUN397.json",
            cleaners=("sun397_path",),
            prepare=_coop_lines(
                "sun397",
                "SUN397/ and split_zhou_SUN397.json",
                "images: http://vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz",
                _COOP_SPLIT_NOTE,
            ),
            notes="clip-benchmark's test split (15.8k rows on the Hub viewer) is not CoOp's.",
        ),
        DatasetPreset(
            name="fgvc-aircraft",
            title="FGVCAircraft",
            template="a photo of a {}, a type of aircraft.",
            aliases=("fgvcaircraft", "aircraft", "fgvc_aircraft"),
            hub_repo="clip-benchmark/wds_fgvc_aircraft",
            coop_dir="fgvc_aircraft",
            coop_image_dir="images",
            coop_layout="variants",
            prepare=(
                "https://www.robots.ox.ac.uk/~vgg/data/fgvc-aircraft/archives/fgvc-aircraft-2013b.tar.gz",
                "keep its data/ folder and rename it <data-dir>/fgvc_aircraft/ (images/, variants.txt, "
                "images_variant_test.txt), as in CoOp's DATASETS.md",
            ),
            notes="the Hub viewer shows 3.33k test rows, the size of the official test split CoOp uses.",
        ),
        DatasetPreset(
            name="stanford-cars",
            title="StanfordCars",
            template=DEFAULT_TEMPLATE,
            ensemble=IMAGENET_ENSEMBLE,
            aliases=("stanfordcars", "cars", "stanford_cars"),
            hub_repo="clip-benchmark/wds_cars",
            coop_dir="stanford_cars",
            coop_image_dir="",
            coop_split_file="split_zhou_StanfordCars.json",
            cleaners=("year_first",),
            prepare=_coop_lines(
                "stanford_cars",
                "cars_test/ and split_zhou_StanfordCars.json",
                "images: cars_test.tgz (the Stanford URLs in CoOp's DATASETS.md are often offline; mirrors "
                "exist on Kaggle)",
                _COOP_SPLIT_NOTE,
            ),
            notes="the Hub viewer shows 8.04k test rows, the size of the official test split CoOp uses.",
        ),
        DatasetPreset(
            name="imagenet",
            title="ImageNet",
            template=DEFAULT_TEMPLATE,
            ensemble=IMAGENET_ENSEMBLE,
            aliases=("imagenet1k", "imagenet-1k", "ilsvrc2012"),
            hub_repo="clip-benchmark/wds_imagenet1k",
            coop_dir="imagenet",
            coop_image_dir="images/val",
            coop_layout="classnames-folders",
            cleaners=("first_synonym",),
            prepare=(
                "ILSVRC2012 validation images from https://image-net.org (terms of access apply), one folder "
                "per class (n01440764/ ...) under <data-dir>/imagenet/images/val/",
                _imagenet_classnames("<data-dir>/imagenet/"),
            ),
            notes="the test split is ImageNet's validation set (50,000 images); the Hub viewer lists only 37.2k "
            "test rows for clip-benchmark/wds_imagenet1k, so check the count after downloading it.",
        ),
        DatasetPreset(
            name="imagenet-a",
            title="ImageNet-A",
            template=DEFAULT_TEMPLATE,
            ensemble=IMAGENET_ENSEMBLE,
            aliases=("imageneta", "imagenet-adversarial"),
            hub_repo="clip-benchmark/wds_imagenet-a",
            coop_dir="imagenet-adversarial",
            coop_image_dir="imagenet-a",
            coop_layout="classnames-folders",
            cleaners=("first_synonym",),
            prepare=(
                "https://people.eecs.berkeley.edu/~hendrycks/imagenet-a.tar, extracted to "
                "<data-dir>/imagenet-adversarial/imagenet-a/",
                _imagenet_classnames("<data-dir>/imagenet-adversarial/"),
            ),
        ),
        DatasetPreset(
            name="imagenet-v2",
            title="ImageNet-V2",
            template=DEFAULT_TEMPLATE,
            ensemble=IMAGENET_ENSEMBLE,
            aliases=("imagenetv2",),
            hub_repo="clip-benchmark/wds_imagenetv2",
            coop_dir="imagenetv2",
            coop_image_dir="imagenetv2-matched-frequency-format-val",
            coop_layout="classnames-folders",
            cleaners=("first_synonym",),
            prepare=(
                "https://s3-us-west-2.amazonaws.com/imagenetv2public/imagenetv2-matched-frequency.tar.gz, "
                "extracted to <data-dir>/imagenetv2/ (folders 0..999)",
                _imagenet_classnames("<data-dir>/imagenetv2/"),
            ),
        ),
        DatasetPreset(
            name="imagenet-r",
            title="ImageNet-R",
            template=DEFAULT_TEMPLATE,
            ensemble=IMAGENET_ENSEMBLE,
            aliases=("imagenetr", "imagenet-rendition"),
            hub_repo="clip-benchmark/wds_imagenet-r",
            coop_dir="imagenet-rendition",
            coop_image_dir="imagenet-r",
            coop_layout="classnames-folders",
            cleaners=("first_synonym",),
            prepare=(
                "https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar, extracted to "
                "<data-dir>/imagenet-rendition/imagenet-r/",
                _imagenet_classnames("<data-dir>/imagenet-rendition/"),
            ),
        ),
        DatasetPreset(
            name="imagenet-sketch",
            title="ImageNet-Sketch",
            template=DEFAULT_TEMPLATE,
            ensemble=IMAGENET_ENSEMBLE,
            aliases=("imagenetsketch", "imagenet_sketch"),
            hub_repo="clip-benchmark/wds_imagenet_sketch",
            coop_dir="imagenet-sketch",
            coop_image_dir="images",
            coop_layout="classnames-folders",
            cleaners=("first_synonym",),
            prepare=(
                "https://github.com/HaohanWang/ImageNet-Sketch, extracted to <data-dir>/imagenet-sketch/images/",
                _imagenet_classnames("<data-dir>/imagenet-sketch/"),
            ),
        ),
        DatasetPreset(
            name="testbed",
            title="Testbed",
            template=DEFAULT_TEMPLATE,
            ensemble=("a photo of a {}.", "a picture of a {}.", "an image of a {}.", "a drawing of a {}."),
            notes="the built-in offline world (SPEC §8): always available, rendered on demand.",
        ),
        DatasetPreset(
            name="custom",
            title="Custom",
            template=DEFAULT_TEMPLATE,
            aliases=("generic",),
            prepare=(
                "point data-dir at your data (a class-per-folder image folder, a CoOp folder, a webdataset "
                "folder or a saved Hugging Face dataset) or hf-repo at a Hub dataset",
            ),
            notes="any labelled image set; class names from the source, CoOp's generic template.",
        ),
    )
}

#: The fourteen datasets of the paper (SPEC §6), in the paper's order.
PAPER_DATASETS: tuple[str, ...] = (
    "flowers102", "dtd", "caltech101", "oxford-pets", "food101", "ucf101", "sun397", "fgvc-aircraft",
    "stanford-cars", "imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch",
)  # fmt: skip


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_LOOKUP: dict[str, str] = {_key(alias): p.name for p in PRESETS.values() for alias in (p.name, p.title, *p.aliases)}


def resolve_preset(name: str) -> DatasetPreset | None:
    """The preset for a config value (``"OxfordPets"``, ``"oxford_pets"`` and ``"pets"`` all work), or None."""
    canonical = _LOOKUP.get(_key(name))
    return PRESETS[canonical] if canonical else None


def get_preset(name: str) -> DatasetPreset:
    """Like ``resolve_preset`` but raises a ``ValueError`` listing the known datasets."""
    preset = resolve_preset(name)
    if preset is None:
        raise ValueError(f"dataset={name!r} is not a known dataset; allowed: {', '.join(PRESETS)}")
    return preset


#: One-line descriptions of the class-name rules, for the datasets table.
CLEANER_DOCS: dict[str, str] = {
    "caltech101": "drops BACKGROUND_Google/Faces_easy ('background'/'centered face'); airplanes->airplane, "
    "Faces->face, Leopards->leopard, Motorbikes->motorbike",
    "camel_case": "CamelCase split into words (ApplyEyeMakeup -> Apply Eye Makeup)",
    "sun397_path": "'/b/bakery/shop' -> 'shop bakery'",
    "year_first": "year moved first (... SUV 2000 -> 2000 ... SUV)",
    "lowercase": "lower-cased",
    "first_synonym": "first WordNet synonym ('tench, Tinca tinca' -> 'tench')",
}


def datasets_table() -> str:
    """The markdown table of presets in docs/datasets.md (a test checks the docs hold exactly this)."""
    rows = [
        "| `dataset` | paper name | zero-shot template | Hub source (no `data-dir`) | CoOp folder under "
        "`data-dir` | class names: underscores to spaces, and |",
        "|---|---|---|---|---|---|",
    ]
    for preset in PRESETS.values():
        hub = f"[`{preset.hub_repo}`](https://huggingface.co/datasets/{preset.hub_repo})" if preset.hub_repo else "-"
        if preset.name == "testbed":
            hub = "built in (rendered)"
        folder = f"`{preset.coop_dir}/`" if preset.coop_dir else "-"
        if preset.coop_image_dir and preset.coop_dir:
            folder += f" (images in `{preset.coop_image_dir}/`)"
        rules = "; ".join(CLEANER_DOCS[c] for c in preset.cleaners) or "-"
        rows.append(f"| `{preset.name}` | {preset.title} | `{preset.template}` | {hub} | {folder} | {rules} |")
    return "\n".join(rows)
