"""ImageNet-C corruptions of real images (ours, issue 26), through ``imagecorruptions`` (Michaelis et al., the
package of the common-corruptions benchmarks): ``pip install 'fedrapp[corruptions]'``.

The run config's ``corruptions`` (``"gaussian_noise:3,defocus_blur:3,clean"``) are the shift domains of a real
dataset, as ``testbed-domains`` are the testbed's: client ``i`` gets domain ``i mod D`` (``shift='fixed'``) or the
domains move along its stream (``data/shift.py``). Severities are ImageNet-C's 1-5.

``imagecorruptions`` 1.1.2 (its latest release) draws from numpy's global random state; an image is corrupted
under a lock with that state seeded from (run seed, sample index), so a sample is corrupted the same way in any
batch, any process and after a resume. Three of its fifteen corruptions are refused: ``glass_blur`` and ``fog``
fail on numpy 2 / scikit-image >= 0.19 (removed APIs), and ``impulse_noise`` draws from an unseeded generator of
its own (the same image comes out differently on every call).
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
from PIL import Image

#: ImageNet-C's fifteen corruptions, in its order.
IMAGENET_C = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)  # fmt: skip
#: Those refused, with why.
REFUSED = {
    "glass_blur": "imagecorruptions 1.1.2 calls a scikit-image API removed in 0.19",
    "fog": "imagecorruptions 1.1.2 uses numpy's np.float_, removed in numpy 2",
    "impulse_noise": "imagecorruptions 1.1.2 draws it from an unseeded generator: not reproducible",
}
CORRUPTIONS = tuple(name for name in IMAGENET_C if name not in REFUSED)
MAX_SEVERITY = 5
#: The smallest side the corruptions handle (smaller images are refused by imagecorruptions' own code).
MIN_SIDE = 32
_SEEDS = 213  # SeedSequence key of the per-sample corruption seeds
_LOCK = threading.Lock()  # the corruptions draw from numpy's global random state
INSTALL = "pip install 'fedrapp[corruptions]' (imagecorruptions and its OpenCV, scikit-image and SciPy)"


def check_corruption(name: str, severity: int) -> None:
    """Raise ``ValueError`` naming ``corruptions`` if a domain is unknown, refused or out of range."""
    if name in REFUSED:
        raise ValueError(f"corruptions: {name!r} is not offered ({REFUSED[name]}); allowed: {', '.join(CORRUPTIONS)}")
    if name not in CORRUPTIONS:
        raise ValueError(f"corruptions: unknown corruption {name!r}; allowed: 'clean', {', '.join(CORRUPTIONS)}")
    if not 1 <= severity <= MAX_SEVERITY:
        raise ValueError(f"corruptions: severity {severity} of {name!r} is outside 1..{MAX_SEVERITY}")


def require_library() -> None:
    """Raise ``ImportError`` with the install command when ``imagecorruptions`` cannot be imported."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import imagecorruptions  # noqa: F401
    except ImportError as err:  # also a missing OpenCV system library (libGL) or pkg_resources
        raise ImportError(f"the corruptions setting needs imagecorruptions, which could not be imported ({err}): "
                          f"{INSTALL}") from err  # fmt: skip


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index``'s corruption: a function of (run seed, sample) only."""
    return int(np.random.SeedSequence([seed, _SEEDS, int(index)]).generate_state(1)[0])


def corrupt_image(image: Image.Image, name: str, severity: int, seed: int) -> Image.Image:
    """``image`` (RGB, both sides >= MIN_SIDE) corrupted by ``name`` at ``severity``, deterministically per
    ``seed``; same size."""
    from imagecorruptions import corrupt

    array = np.asarray(image.convert("RGB"))
    if min(array.shape[:2]) < MIN_SIDE:
        raise ValueError(f"an image of {array.shape[1]}x{array.shape[0]} is below {MIN_SIDE} px a side: too small "
                         "to corrupt")  # fmt: skip
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.random.seed(seed % 2**32)
        out = corrupt(array, corruption_name=name, severity=severity)
    return Image.fromarray(np.clip(np.asarray(out), 0, 255).astype(np.uint8))
