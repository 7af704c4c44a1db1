"""The testbed world: coloured shapes drawn procedurally from seeded parameters (their captions: captions.py).

Thirty classes = six colours x five shapes ("red circle", "blue ring", ...). Classes share words, so a
text context can re-weight colour against shape. Every image is a pure function of its
``(label, seed)`` pair: the parameters (size, position, rotation, background luminance and tint,
stripes, a grey distractor, colour jitter, shading) come from ``numpy.random.default_rng([seed, label])``
and each image is drawn on its own, so any subset of a dataset renders lazily, in any order and any
batch, to identical pixels.

Images are drawn at twice ``IMAGE_SIZE`` and box-downsampled, which anti-aliases the edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.86, 0.16, 0.16),
    "green": (0.16, 0.67, 0.24),
    "blue": (0.16, 0.31, 0.86),
    "yellow": (0.90, 0.82, 0.16),
    "purple": (0.55, 0.20, 0.71),
    "orange": (0.94, 0.55, 0.12),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross", "ring")

#: Class names, label ``c`` = colour ``c // 5``, shape ``c % 5``.
CLASSNAMES: tuple[str, ...] = tuple(f"{color} {shape}" for color in COLORS for shape in SHAPES)
#: Side of the rendered square RGB images, in pixels.
IMAGE_SIZE: int = 32
#: The hand-written zero-shot prompt of the testbed (the CoOp/CLIP default for generic objects).
HAND_TEMPLATE: str = "a photo of a {}."

_SUPERSAMPLE = 2
_HI = IMAGE_SIZE * _SUPERSAMPLE
# Pixel-centre coordinates of the supersampled canvas in [-1, 1]; shared, read-only.
_AXIS = (np.arange(_HI, dtype=np.float32) + 0.5) / _HI * 2.0 - 1.0
_V, _U = np.meshgrid(_AXIS, _AXIS, indexing="ij")  # _V rows (down), _U columns (right)

#: Init texts of the local methods (SPEC section 2) and the hand prompt: the tokenizer must know them.
METHOD_TEXTS: tuple[str, ...] = (
    "a photo of a",
    "an image of a",
    "a colorful image of a",
    "a noisy picture of a",
    HAND_TEMPLATE,
)


@dataclass(frozen=True)
class SceneParams:
    """The seeded parameters of one render (sizes and positions in canvas units, [-1, 1])."""

    color: tuple[float, float, float]
    shape: str
    size: float
    center: tuple[float, float]
    angle: float
    background: tuple[float, float, float]
    luminance: float
    stripes: tuple[float, float, float, float] | None  # (angle, frequency, phase, amplitude)
    distractor: tuple[float, float, float, float] | None  # (x, y, radius, grey level)
    shading: tuple[float, float]  # brightness gradient along (u, v)
    pixel_noise: float


def _check_label(label: int) -> int:
    label = int(label)
    if not 0 <= label < len(CLASSNAMES):
        raise ValueError(f"label {label} is out of range: the world has labels 0..{len(CLASSNAMES) - 1}")
    return label


def _check_seed(seed: int) -> int:
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed {seed} is negative: per-sample seeds must be integers >= 0")
    return seed


def scene_params(label: int, seed: int) -> SceneParams:
    """Draw the parameters of the image of class ``label`` with per-sample ``seed``."""
    label, seed = _check_label(label), _check_seed(seed)
    rng = np.random.default_rng([seed, label])
    base = np.array(COLORS[CLASSNAMES[label].split()[0]])
    color = np.clip(base + rng.normal(0.0, 0.035, 3), 0.0, 1.0)
    size = float(rng.uniform(0.32, 0.75))
    margin = 1.0 - 0.8 * size
    center = (float(rng.uniform(-margin, margin)), float(rng.uniform(-margin, margin)))
    angle = float(rng.uniform(0.0, 2.0 * math.pi))
    luminance = float(rng.uniform(0.12, 0.88))
    background = np.clip(luminance + rng.normal(0.0, 0.06, 3), 0.0, 1.0)
    stripes = None
    if rng.random() < 0.5:
        stripes = (
            float(rng.uniform(0.0, math.pi)),
            float(rng.uniform(4.0, 12.0)),
            float(rng.uniform(0.0, 2.0 * math.pi)),
            float(rng.uniform(0.05, 0.12)),
        )
    distractor = None
    if rng.random() < 0.5:
        distractor = (
            float(rng.uniform(-0.8, 0.8)),
            float(rng.uniform(-0.8, 0.8)),
            float(rng.uniform(0.1, 0.22)),
            float(rng.uniform(0.2, 0.8)),
        )
    shading = (float(rng.uniform(-0.15, 0.15)), float(rng.uniform(-0.15, 0.15)))
    return SceneParams(
        color=tuple(float(x) for x in color),
        shape=SHAPES[label % len(SHAPES)],
        size=size,
        center=center,
        angle=angle,
        background=tuple(float(x) for x in background),
        luminance=luminance,
        stripes=stripes,
        distractor=distractor,
        shading=shading,
        pixel_noise=float(rng.uniform(0.0, 0.03)),
    )


def _shape_mask(shape: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Boolean mask of a unit-size ``shape`` in its own frame (x right, y up)."""
    if shape == "circle":
        return x * x + y * y <= 1.0
    if shape == "square":
        return np.maximum(np.abs(x), np.abs(y)) <= 0.82
    if shape == "triangle":
        return (y >= -0.55) & (y <= 1.0 - 1.7320508 * np.abs(x))
    if shape == "cross":
        arm, bar = 0.95, 0.3
        return ((np.abs(x) <= bar) & (np.abs(y) <= arm)) | ((np.abs(y) <= bar) & (np.abs(x) <= arm))
    if shape == "ring":
        r2 = x * x + y * y
        return (r2 <= 1.0) & (r2 >= 0.36)
    raise ValueError(f"unknown shape {shape!r}; known shapes: {', '.join(SHAPES)}")


def _draw(p: SceneParams, label: int, seed: int) -> np.ndarray:
    """Float32 [IMAGE_SIZE, IMAGE_SIZE, 3] image in [0, 1] of one scene."""
    canvas = np.empty((_HI, _HI, 3), dtype=np.float32)
    canvas[:] = np.asarray(p.background, dtype=np.float32)
    if p.stripes is not None:
        phi, freq, phase, amp = p.stripes
        wave = np.sin(freq * (_U * math.cos(phi) + _V * math.sin(phi)) + phase).astype(np.float32)
        canvas += amp * wave[..., None]
    if p.distractor is not None:
        dx, dy, radius, grey = p.distractor
        blob = (_U - dx) ** 2 + (_V - dy) ** 2 <= radius * radius
        canvas[blob] = grey
    cos_a, sin_a = math.cos(p.angle), math.sin(p.angle)
    du, dv = _U - p.center[0], -(_V - p.center[1])  # y up in the shape frame
    x = (cos_a * du + sin_a * dv) / p.size
    y = (-sin_a * du + cos_a * dv) / p.size
    mask = _shape_mask(p.shape, x, y)
    shade = 1.0 + p.shading[0] * _U + p.shading[1] * _V
    obj = np.asarray(p.color, dtype=np.float32)[None, None, :] * shade[..., None]
    canvas = np.where(mask[..., None], obj, canvas)
    low = canvas.reshape(IMAGE_SIZE, _SUPERSAMPLE, IMAGE_SIZE, _SUPERSAMPLE, 3).mean(axis=(1, 3))
    if p.pixel_noise > 0:
        noise_rng = np.random.default_rng([seed, label, 1])  # its own stream: params stay put
        low = low + noise_rng.normal(0.0, p.pixel_noise, low.shape).astype(np.float32)
    return np.clip(low, 0.0, 1.0)


def _as_int_array(values: np.ndarray | list[int], name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of integers, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def render(labels: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Render one image per ``(label, seed)`` pair.

    Parameters
    ----------
    labels, seeds : int arrays [B]; labels in ``0..len(CLASSNAMES)-1``, seeds >= 0.

    Returns
    -------
    uint8 [B, IMAGE_SIZE, IMAGE_SIZE, 3]; image b depends only on ``(labels[b], seeds[b])``.
    """
    labels, seeds = _as_int_array(labels, "labels"), _as_int_array(seeds, "seeds")
    if labels.shape != seeds.shape:
        raise ValueError(f"labels and seeds must have the same length, got {labels.size} and {seeds.size}")
    out = np.empty((labels.size, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for b, (label, seed) in enumerate(zip(labels.tolist(), seeds.tolist(), strict=True)):
        image = _draw(scene_params(label, seed), label, seed)
        out[b] = np.round(image * 255.0).astype(np.uint8)
    return out
