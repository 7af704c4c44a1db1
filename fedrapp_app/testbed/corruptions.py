"""Image corruptions that make the testbed's per-client domains (SPEC section 8).

``corrupt(images, name, severity, seeds)`` is deterministic per (image, name, severity, per-sample
seed): the random parts of image b come from ``numpy.random.default_rng([seeds[b], k])`` (k = the
corruption's index) and each image is processed on its own, so a sample is corrupted identically
whatever batch it travels in. Severity ``s`` is strength level ``s`` of a continuous scale; pretraining
draws fractional levels through ``corrupt_level``.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

#: Corruption families, in a fixed order (the order is part of each corruption's seeding).
CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "blur",
    "contrast",
    "hue_shift",
    "color_cast",
    "occlusion",
    "salt_pepper",
    "pixelate",
)
#: Severities run from 1 (mild) to MAX_SEVERITY (strong).
MAX_SEVERITY: int = 3
#: A sensible default list of client domains, (corruption, severity): one per family, at a severity
#: where the shipped model's hand-prompt zero-shot accuracy drops clearly but keeps a signal to adapt
#: on (README table; gaussian noise at severity 2 leaves about 25% and no adaptation recovers it).
#: hue_shift is the family pretraining never saw (a strong rotation changes which colour word is right).
DEFAULT_DOMAINS: tuple[tuple[str, int], ...] = (
    ("gaussian_noise", 1),
    ("blur", 2),
    ("contrast", 2),
    ("color_cast", 2),
    ("occlusion", 2),
    ("salt_pepper", 2),
    ("pixelate", 2),
    ("hue_shift", 1),
)
#: The colour ``color_cast`` pulls every pixel toward (teal), so a cast domain is one consistent shift.
_CAST = np.array([0.10, 0.55, 0.65], dtype=np.float32)


def _gaussian_noise(img: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    return img + rng.normal(0.0, 0.08 * level, img.shape).astype(np.float32)


def _blur(img: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    sigma = 0.7 * level
    radius = max(1, math.ceil(3 * sigma))
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2).astype(np.float32)
    taps /= taps.sum()
    for axis in (0, 1):  # separable; reflect padding keeps the border's brightness
        pad = [(0, 0)] * 3
        pad[axis] = (radius, radius)
        padded = np.pad(img, pad, mode="reflect")
        size = img.shape[axis]
        out = np.zeros_like(img)
        for k, w in enumerate(taps):
            out += w * np.take(padded, np.arange(k, k + size), axis=axis)
        img = out
    return img


def _contrast(img: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    mean = img.mean(axis=(0, 1), keepdims=True)
    return mean + 0.55**level * (img - mean)


def _hue_shift(img: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    # Rotation about the grey axis (Rodrigues): a hue rotation that keeps luminance roughly fixed.
    theta = math.radians(25.0 * level)
    c, s, k = math.cos(theta), math.sin(theta), 1.0 / 3.0
    t = (1.0 - c) * k
    r = math.sqrt(k) * s
    rot = np.array([[c + t, t - r, t + r], [t + r, c + t, t - r], [t - r, t + r, c + t]], dtype=np.float32)
    return img @ rot.T


def _color_cast(img: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    alpha = 0.18 * level
    cast = np.clip(_CAST + rng.normal(0.0, 0.04, 3).astype(np.float32), 0.0, 1.0)
    return (1.0 - alpha) * img + alpha * cast


def _occlusion(img: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    img = img.copy()
    h, w = img.shape[:2]
    for _ in range(max(1, round(2 * level))):
        bh, bw = (int(rng.integers(round(0.2 * n), round(0.4 * n) + 1)) for n in (h, w))
        top, left = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        img[top : top + bh, left : left + bw] = rng.uniform(0.0, 0.6)
    return img


def _salt_pepper(img: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    img = img.copy()
    hit = rng.random(img.shape[:2]) < 0.06 * level
    salt = rng.random(img.shape[:2]) < 0.5
    img[hit & salt] = 1.0
    img[hit & ~salt] = 0.0
    return img


def _pixelate(img: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    h, w = img.shape[:2]
    small = max(2, round(h / (1.0 + level))), max(2, round(w / (1.0 + level)))
    pil = Image.fromarray(np.round(np.clip(img, 0.0, 1.0) * 255.0).astype(np.uint8))
    pil = pil.resize((small[1], small[0]), Image.Resampling.BOX).resize((w, h), Image.Resampling.NEAREST)
    return np.asarray(pil, dtype=np.float32) / 255.0


_APPLY = {
    "gaussian_noise": _gaussian_noise,
    "blur": _blur,
    "contrast": _contrast,
    "hue_shift": _hue_shift,
    "color_cast": _color_cast,
    "occlusion": _occlusion,
    "salt_pepper": _salt_pepper,
    "pixelate": _pixelate,
}


def _check_name(name: str) -> str:
    if name not in _APPLY:
        raise ValueError(f"unknown corruption {name!r}; allowed: {', '.join(CORRUPTIONS)}")
    return name


def _check_batch(images: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    is_batch = isinstance(images, np.ndarray) and images.ndim == 4 and images.shape[-1] == 3
    if not is_batch or images.dtype != np.uint8:
        shape = getattr(images, "shape", None)
        dtype = getattr(images, "dtype", type(images).__name__)
        raise ValueError(f"images must be a uint8 array [B, H, W, 3], got {dtype} with shape {shape}")
    seeds = np.asarray(seeds)
    if seeds.shape != (images.shape[0],) or (seeds.size and not np.issubdtype(seeds.dtype, np.integer)):
        raise ValueError(
            f"seeds must be {images.shape[0]} integers (one per image), got shape {seeds.shape} {seeds.dtype}"
        )
    if seeds.size and seeds.min() < 0:
        raise ValueError("seeds must be >= 0")
    return seeds.astype(np.int64)


def corrupt_level(images: np.ndarray, name: str, level: float, seeds: np.ndarray) -> np.ndarray:
    """Apply corruption ``name`` at a continuous strength ``level`` (> 0; severity s is level s).

    images: uint8 [B, H, W, 3]; seeds: int [B]. Returns uint8 [B, H, W, 3].
    """
    apply = _APPLY[_check_name(name)]
    seeds = _check_batch(images, seeds)
    if not level > 0:
        raise ValueError(f"corruption level must be > 0, got {level}")
    index = CORRUPTIONS.index(name)
    out = np.empty_like(images)
    for b, seed in enumerate(seeds.tolist()):
        rng = np.random.default_rng([seed, index])
        result = apply(images[b].astype(np.float32) / 255.0, float(level), rng)
        out[b] = np.round(np.clip(result, 0.0, 1.0) * 255.0).astype(np.uint8)
    return out


def corrupt(images: np.ndarray, name: str, severity: int, seeds: np.ndarray) -> np.ndarray:
    """Corrupt each image with family ``name`` at ``severity`` (1..MAX_SEVERITY), seeded per sample.

    Parameters
    ----------
    images : uint8 [B, H, W, 3]
    name : one of ``CORRUPTIONS``
    severity : int in ``1..MAX_SEVERITY``
    seeds : int [B], >= 0; image b's random draws depend only on ``(seeds[b], name)``.

    Returns
    -------
    uint8 [B, H, W, 3]
    """
    _check_name(name)
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not (1 <= severity <= MAX_SEVERITY):
        raise ValueError(f"severity must be an integer in 1..{MAX_SEVERITY}, got {severity!r}")
    return corrupt_level(images, name, float(severity), seeds)
