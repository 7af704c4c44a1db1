"""Images: PIL -> pixel tensors through the checkpoint's processor, and TPT's augmented views on tensors.

Views are made from the preprocessed (normalised, H x W) tensor with torch ops only (no torchvision):
a random resized crop + horizontal flip is one affine resampling (``grid_sample``), batched over views.
Normalisation is a per-channel affine map, so cropping and bilinear resizing commute with it. AugMix
(optional) works in [0, 1] pixel space and re-normalises. Randomness comes from an explicit
``torch.Generator`` on the CPU, so views are the same on every device.

Difference from TPT's reference: its crops are taken from the full-resolution image, ours from the
processor's H x W centre crop (the only pixels a method receives).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

#: Longest side / shortest side kept before the processor: its centre crop never uses more.
_MAX_ASPECT = 2.0


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode (L, LA, P, RGBA, CMYK, I;16, I, F, 1, ...) -> RGB, high bit depths scaled to 8 bit."""
    if not isinstance(image, Image.Image):
        raise TypeError(f"expected a PIL.Image.Image, got {type(image).__name__}; load images with PIL first")
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I") or image.mode == "F":
        array = np.asarray(image, dtype=np.float64)
        peak = array.max(initial=0.0)
        # float images in [0, 1]; 16-bit integer images in [0, 65535]; otherwise already 8-bit levels
        top = 1.0 if (image.mode == "F" and peak <= 1.0) else (65535.0 if peak > 255 else 255.0)
        image = Image.fromarray(np.clip(array / top * 255.0, 0, 255).astype(np.uint8))
    if image.mode == "P":
        image = image.convert("RGBA")  # palette transparency survives only through RGBA
    return image.convert("RGB")


def _limit_aspect(image: Image.Image, processor: object) -> Image.Image:
    """Centre-crop extreme panoramas when the processor centre-crops anyway (saves a huge resize)."""
    if not getattr(processor, "do_center_crop", False):
        return image
    width, height = image.size
    short, long = min(width, height), max(width, height)
    if long <= _MAX_ASPECT * short:
        return image
    keep = math.ceil(_MAX_ASPECT * short)
    if width > height:
        left = (width - keep) // 2
        return image.crop((left, 0, left + keep, height))
    top = (height - keep) // 2
    return image.crop((0, top, width, top + keep))


def image_tensor_batch(processor: object, images: Sequence[Image.Image]) -> Tensor:
    """PIL images -> Tensor[B, 3, H, W] float32 through ``processor`` (the checkpoint's image processor)."""
    if isinstance(images, Image.Image):
        images = [images]
    images = list(images)
    if not images:
        raise ValueError("no images given: the batch is empty")
    rgb = [_limit_aspect(to_rgb(image), processor) for image in images]
    pixels = processor(images=rgb, return_tensors="pt")["pixel_values"]
    return pixels.float()


def normalisation(processor: object) -> tuple[Tensor, Tensor]:
    """The processor's per-channel mean and std as Tensor[3, 1, 1] each (identity if it does not normalise)."""
    if not getattr(processor, "do_normalize", True):
        return torch.zeros(3, 1, 1), torch.ones(3, 1, 1)
    mean = torch.tensor(processor.image_mean, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(processor.image_std, dtype=torch.float32).view(3, 1, 1)
    return mean, std


# ----- random resized crop + flip -------------------------------------------------------------------
def crop_flip_thetas(
    n: int,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    attempts: int = 10,
) -> Tensor:
    """``n`` random resized crops with random horizontal flips as affine maps -> Tensor[n, 2, 3].

    Same sampling as torchvision's ``RandomResizedCrop`` (area fraction uniform in ``scale``, log-uniform
    aspect ratio, first of ``attempts`` that fits, else the whole image) in continuous coordinates of a
    square frame, then a flip with probability 1/2. The map takes output to input coordinates in
    ``grid_sample``'s normalised frame.
    """
    area = torch.empty(n, attempts).uniform_(*scale, generator=generator)
    log_ratio = torch.empty(n, attempts).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    width = torch.sqrt(area * log_ratio.exp())  # fractions of the frame's side
    height = torch.sqrt(area / log_ratio.exp())
    fits = (width <= 1) & (height <= 1)
    first = torch.where(fits.any(1), fits.float().argmax(1), torch.full((n,), -1))
    pick = first.clamp(min=0).unsqueeze(1)
    width = torch.where(first >= 0, width.gather(1, pick).squeeze(1), torch.ones(n))
    height = torch.where(first >= 0, height.gather(1, pick).squeeze(1), torch.ones(n))
    offset = torch.rand(n, 2, generator=generator)
    left, top = offset[:, 0] * (1 - width), offset[:, 1] * (1 - height)
    flip = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = width * flip
    theta[:, 0, 2] = 2 * left + width - 1  # crop centre in [-1, 1]
    theta[:, 1, 1] = height
    theta[:, 1, 2] = 2 * top + height - 1
    return theta


def warp(pixels: Tensor, theta: Tensor) -> Tensor:
    """Resample Tensor[N, 3, H, W] through affine maps Tensor[N, 2, 3] (bilinear, zeros outside)."""
    grid = F.affine_grid(theta.to(pixels), list(pixels.shape), align_corners=False)
    return F.grid_sample(pixels, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


# ----- AugMix on [0, 1] tensors (severity as in TPT's reference, 1 by default) ------------------------
def _autocontrast(x: Tensor, level: Tensor) -> Tensor:
    low = x.amin(dim=(2, 3), keepdim=True)
    high = x.amax(dim=(2, 3), keepdim=True)
    span = high - low
    return torch.where(span > 0, (x - low) / span.clamp(min=1e-8), x)


def _equalize(x: Tensor, level: Tensor) -> Tensor:
    """PIL's ``ImageOps.equalize`` per channel on 8-bit levels."""
    n, c, h, w = x.shape
    q = (x * 255).round().clamp(0, 255).long().reshape(n * c, h * w)
    hist = torch.zeros(n * c, 256, device=x.device).scatter_add_(1, q, torch.ones_like(q, dtype=torch.float32))
    last = hist.gather(1, (255 - (hist.flip(1) > 0).float().argmax(1, keepdim=True)))  # count of top level
    step = torch.div(h * w - last, 255, rounding_mode="floor")  # [N*C, 1]
    before = hist.cumsum(1) - hist
    lut = torch.div(before + torch.div(step, 2, rounding_mode="floor"), step.clamp(min=1), rounding_mode="floor")
    lut = torch.where(step > 0, lut.clamp(max=255), torch.arange(256, device=x.device).float())
    return (lut.gather(1, q) / 255).view(n, c, h, w)


def _posterize(x: Tensor, level: Tensor) -> Tensor:
    bits = (4 - (level * 4 / 10).floor()).view(-1, 1, 1, 1)  # severity 1 -> 4 bits
    keep = 2 ** (8 - bits)
    return ((x * 255).round() / keep).floor() * keep / 255


def _solarize(x: Tensor, level: Tensor) -> Tensor:
    threshold = (256 - (level * 256 / 10).floor()).view(-1, 1, 1, 1) / 255
    return torch.where(x >= threshold, 1 - x, x)


def _affine_op(kind: str):
    def op(x: Tensor, level: Tensor, sign: Tensor) -> Tensor:
        theta = torch.zeros(x.shape[0], 2, 3, device=x.device)
        theta[:, 0, 0] = theta[:, 1, 1] = 1
        if kind == "rotate":
            angle = torch.deg2rad((level * 30 / 10).floor() * sign)
            theta[:, 0, 0], theta[:, 0, 1] = angle.cos(), -angle.sin()
            theta[:, 1, 0], theta[:, 1, 1] = angle.sin(), angle.cos()
        elif kind in ("shear_x", "shear_y"):
            theta[:, 0 if kind == "shear_x" else 1, 1 if kind == "shear_x" else 0] = level * 0.3 / 10 * sign
        else:  # translate by up to a third of the side at level 10 (AugMix: 224/3 pixels)
            shift = (level * x.shape[-1] / 3 / 10).floor() * 2 / x.shape[-1] * sign
            theta[:, 0 if kind == "translate_x" else 1, 2] = shift
        return warp(x, theta)

    return op


_POINT_OPS = (_autocontrast, _equalize, _posterize, _solarize)
_GEOMETRIC_OPS = tuple(_affine_op(k) for k in ("rotate", "shear_x", "shear_y", "translate_x", "translate_y"))
NUM_AUGMIX_OPS = len(_POINT_OPS) + len(_GEOMETRIC_OPS)


def augmix(x: Tensor, generator: torch.Generator, severity: float = 1.0, width: int = 3, max_depth: int = 3) -> Tensor:
    """AugMix (Hendrycks et al.) of Tensor[N, 3, H, W] in [0, 1]: ``width`` chains of 1..``max_depth``
    random ops, mixed with Dirichlet(1) weights, then blended with the input with a Beta(1, 1) weight.

    The ops follow AugMix's list (autocontrast, equalize, posterize, rotate, solarize, shear x/y,
    translate x/y) with its level sampling (uniform in [0.1, severity]), done with torch ops.
    """
    n = x.shape[0]
    weights = -torch.log(torch.rand(n, width, generator=generator).clamp(min=1e-12))  # Dirichlet(1) via Gamma(1)
    weights = (weights / weights.sum(1, keepdim=True)).to(x)
    blend = torch.rand(n, generator=generator).to(x).view(n, 1, 1, 1)  # Beta(1, 1) is uniform
    mix = torch.zeros_like(x)
    for chain in range(width):
        y = x
        depth = torch.randint(1, max_depth + 1, (n,), generator=generator)
        for step in range(max_depth):
            ops = torch.randint(0, NUM_AUGMIX_OPS, (n,), generator=generator)
            levels = torch.empty(n).uniform_(0.1, max(severity, 0.1), generator=generator).to(x)
            signs = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0).to(x)
            y = y.clone()
            for index in range(NUM_AUGMIX_OPS):
                rows = ((ops == index) & (depth > step)).nonzero().squeeze(1).to(x.device)
                if rows.numel() == 0:
                    continue
                if index < len(_POINT_OPS):
                    y[rows] = _POINT_OPS[index](y[rows], levels[rows])
                else:
                    y[rows] = _GEOMETRIC_OPS[index - len(_POINT_OPS)](y[rows], levels[rows], signs[rows])
        mix = mix + weights[:, chain].view(n, 1, 1, 1) * y
    return blend * x + (1 - blend) * mix


def tpt_views(
    pixels: Tensor,
    n_views: int,
    generator: torch.Generator,
    *,
    use_augmix: bool = False,
    mean: Tensor | None = None,
    std: Tensor | None = None,
    severity: float = 1.0,
) -> Tensor:
    """The original view plus ``n_views`` augmented ones of one preprocessed image.

    ``pixels`` is Tensor[3, H, W] (normalised by the processor); returns Tensor[1 + n_views, 3, H, W]
    with row 0 the original. Augmented views: random resized crop + flip, then AugMix when asked
    (``mean``/``std``: the processor's normalisation, Tensor[3, 1, 1], needed for AugMix).
    """
    if pixels.dim() != 3:
        raise ValueError(f"tpt_views takes one image [3, H, W], got {tuple(pixels.shape)}")
    if n_views == 0:
        return pixels.unsqueeze(0)
    theta = crop_flip_thetas(n_views, generator)
    views = warp(pixels.unsqueeze(0).expand(n_views, -1, -1, -1), theta)
    if use_augmix:
        if mean is None or std is None:
            raise ValueError("tpt_views: AugMix needs the processor's mean and std")
        mean, std = mean.to(views), std.to(views)
        views = (augmix((views * std + mean).clamp(0, 1), generator, severity) - mean) / std
    return torch.cat([pixels.unsqueeze(0), views])
