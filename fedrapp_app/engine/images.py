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
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from fedrapp_app.engine.devices import to_device_once

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


@dataclass(frozen=True)
class AugMixDraws:
    """AugMix's random choices for N images, on the host: W chains of up to S ops each.

    ``weights`` Tensor[N, W] (Dirichlet(1) chain weights), ``blend`` Tensor[N] (Beta(1, 1) weight of the
    input), ``depth`` Tensor[W, N] long (ops in each chain), ``ops`` Tensor[W, S, N] long, ``levels`` and
    ``signs`` Tensor[W, S, N].
    """

    weights: Tensor
    blend: Tensor
    depth: Tensor
    ops: Tensor
    levels: Tensor
    signs: Tensor

    @staticmethod
    def draw(n: int, generator: torch.Generator, severity: float = 1.0, width: int = 3, max_depth: int = 3):
        """Draw for ``n`` images from ``generator`` (always in this order: the views depend only on the seed)."""
        weights = -torch.log(torch.rand(n, width, generator=generator).clamp(min=1e-12))  # Dirichlet(1) via Gamma(1)
        weights = weights / weights.sum(1, keepdim=True)
        blend = torch.rand(n, generator=generator)  # Beta(1, 1) is uniform
        depth, ops, levels, signs = [], [], [], []
        for _ in range(width):
            depth.append(torch.randint(1, max_depth + 1, (n,), generator=generator))
            for _ in range(max_depth):
                ops.append(torch.randint(0, NUM_AUGMIX_OPS, (n,), generator=generator))
                levels.append(torch.empty(n).uniform_(0.1, max(severity, 0.1), generator=generator))
                signs.append(torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0))
        steps = (width, max_depth, n)
        return AugMixDraws(
            weights,
            blend,
            torch.stack(depth),
            torch.stack(ops).view(steps),
            torch.stack(levels).view(steps),
            torch.stack(signs).view(steps),
        )

    @staticmethod
    def concat(draws: Sequence[AugMixDraws]) -> AugMixDraws:
        """The draws of several groups of images as one (images in order)."""
        return AugMixDraws(
            torch.cat([d.weights for d in draws]),
            torch.cat([d.blend for d in draws]),
            torch.cat([d.depth for d in draws], 1),
            torch.cat([d.ops for d in draws], 2),
            torch.cat([d.levels for d in draws], 2),
            torch.cat([d.signs for d in draws], 2),
        )

    def op_groups(self) -> tuple[Tensor, list[list[tuple[int, int, int]]]]:
        """Rows grouped by op for every (chain, step), computed on the host.

        Returns ``order`` Tensor[M] long (row indices, grouped) and, per chain and step, the groups as
        (op index, start, end) slices of ``order``; rows whose chain is shorter than the step are in no group.
        """
        width, max_depth, _ = self.ops.shape
        pieces, groups, start = [], [], 0
        for chain in range(width):
            for step in range(max_depth):
                active = self.depth[chain] > step
                step_groups = []
                for index in range(NUM_AUGMIX_OPS):
                    rows = ((self.ops[chain, step] == index) & active).nonzero().squeeze(1)
                    if rows.numel():
                        pieces.append(rows)
                        step_groups.append((index, start, start + rows.numel()))
                        start += rows.numel()
                groups.append(step_groups)
        order = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
        return order, groups


def _augmix_on_device(x: Tensor, draws: AugMixDraws, order: Tensor, groups: list, device_draws: list[Tensor]) -> Tensor:
    """AugMix of Tensor[N, 3, H, W] in [0, 1] with ``draws`` already on ``x``'s device (``device_draws``:
    weights, blend, levels, signs, order)."""
    weights, blend, levels, signs, order = device_draws
    width, max_depth, n = draws.ops.shape
    blend = blend.view(n, 1, 1, 1)
    mix = torch.zeros_like(x)
    for chain in range(width):
        y = x
        for step in range(max_depth):
            y = y.clone()
            for index, start, end in groups[chain * max_depth + step]:
                rows = order[start:end]  # a slice of the uploaded tensor: no copy
                level = levels[chain, step][rows]
                if index < len(_POINT_OPS):
                    y[rows] = _POINT_OPS[index](y[rows], level)
                else:
                    sign = signs[chain, step][rows]
                    y[rows] = _GEOMETRIC_OPS[index - len(_POINT_OPS)](y[rows], level, sign)
        mix = mix + weights[:, chain].view(n, 1, 1, 1) * y
    return blend * x + (1 - blend) * mix


def augmix(x: Tensor, generator: torch.Generator, severity: float = 1.0, width: int = 3, max_depth: int = 3) -> Tensor:
    """AugMix (Hendrycks et al.) of Tensor[N, 3, H, W] in [0, 1]: ``width`` chains of 1..``max_depth``
    random ops, mixed with Dirichlet(1) weights, then blended with the input with a Beta(1, 1) weight.

    The ops follow AugMix's list (autocontrast, equalize, posterize, rotate, solarize, shear x/y,
    translate x/y) with its level sampling (uniform in [0.1, severity]), done with torch ops. The random
    choices are drawn on the host (:class:`AugMixDraws`); each op then runs once on all the rows that
    drew it, and the choices reach the device in one copy.
    """
    draws = AugMixDraws.draw(x.shape[0], generator, severity, width, max_depth)
    order, groups = draws.op_groups()
    device_draws = to_device_once([draws.weights, draws.blend, draws.levels, draws.signs, order], x.device, x.dtype)
    return _augmix_on_device(x, draws, order, groups, device_draws)


# ----- TPT's views ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ViewDraws:
    """The random choices behind one image's augmented views, on the host: ``theta`` Tensor[n, 2, 3] (crop +
    flip maps) and, with AugMix, its draws for the n views."""

    theta: Tensor
    augmix: AugMixDraws | None

    @staticmethod
    def draw(n_views: int, generator: torch.Generator, use_augmix: bool = False, severity: float = 1.0):
        """Draw for ``n_views`` views from ``generator``: crops first, then AugMix (a fixed order)."""
        if n_views == 0:  # nothing drawn: the generator is left as it is
            return ViewDraws(torch.zeros(0, 2, 3), None)
        theta = crop_flip_thetas(n_views, generator)
        return ViewDraws(theta, AugMixDraws.draw(n_views, generator, severity) if use_augmix else None)


def views_batch(
    pixels: Tensor, draws: Sequence[ViewDraws], mean: Tensor | None = None, std: Tensor | None = None
) -> Tensor:
    """Each image's original plus its augmented views, for B images at once, on ``pixels``' device.

    ``pixels`` Tensor[B, 3, H, W] (normalised by the processor), ``draws`` one :class:`ViewDraws` per image
    (all with the same number of views n and the same AugMix setting); ``mean``/``std`` Tensor[3, 1, 1] (the
    processor's normalisation), needed for AugMix. Returns Tensor[B * (1 + n), 3, H, W], image by image, the
    original first. The host's draws reach the device in one copy, and every op runs on all B * n views at
    once (a GPU would otherwise wait for one small copy per image and op). Row by row the same values as
    :func:`tpt_views` of each image with its own draws.
    """
    if pixels.dim() != 4 or len(draws) != pixels.shape[0]:
        raise ValueError(f"views_batch takes [B, 3, H, W] and B draws, got {tuple(pixels.shape)} and {len(draws)}")
    batch = pixels.shape[0]
    n_views = draws[0].theta.shape[0] if draws else 0
    use_augmix = bool(draws) and draws[0].augmix is not None
    if any(d.theta.shape[0] != n_views or (d.augmix is not None) != use_augmix for d in draws):
        raise ValueError("views_batch: every image needs the same number of views and the same AugMix setting")
    if n_views == 0:
        return pixels
    if use_augmix and (mean is None or std is None):
        raise ValueError("views_batch: AugMix needs the processor's mean and std")
    host = [torch.cat([d.theta for d in draws])]
    if use_augmix:
        mixes = AugMixDraws.concat([d.augmix for d in draws])
        order, groups = mixes.op_groups()
        host += [mixes.weights, mixes.blend, mixes.levels, mixes.signs, order, mean, std]
    device_draws = to_device_once(host, pixels.device, pixels.dtype)
    sources = pixels.unsqueeze(1).expand(-1, n_views, -1, -1, -1).flatten(0, 1)  # [B * n, 3, H, W]
    views = warp(sources, device_draws[0])
    if use_augmix:
        mean, std = device_draws[-2:]
        views = (
            _augmix_on_device((views * std + mean).clamp(0, 1), mixes, order, groups, device_draws[1:6]) - mean
        ) / std
    return torch.cat([pixels.unsqueeze(1), views.view(batch, n_views, *pixels.shape[1:])], 1).flatten(0, 1)


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
    if use_augmix and (mean is None or std is None):
        raise ValueError("tpt_views: AugMix needs the processor's mean and std")
    draws = ViewDraws.draw(n_views, generator, use_augmix, severity)
    return views_batch(pixels.unsqueeze(0), [draws], mean, std)
