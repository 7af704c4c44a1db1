"""Captions of the testbed's renders: the scene and its corruption said in words, with synonyms and varied order.

A real CLIP learned from captions that describe far more than the object: where it is, how big, the light, the
background, the defects of the photo. A prompt's context words then carry meaning, and tuning a context moves the
class features along many directions. Here every seeded scene parameter of :func:`world.scene_params` that shows
in the image is turned into words (:class:`Facts`): size, position, tilt, background brightness, stripes (their
direction and width), the grey distractor, the lighting; and a pretraining corruption into its family's words and
a strength adverb ("a slightly blurry photo", "heavily pixelated"). Each fact has several synonyms, a caption says
a random subset of the facts in a random order around the class name, and a quarter of the captions say only the
class ("a photo of a red circle.").

:func:`caption` builds one caption from the facts and a seeded generator; :func:`hard_negative` builds the same
caption (the same generator, so the same template and synonyms where it can) with one of the facts it states
changed to a false value: it differs from the true caption only in the words around the class name, the negative
that teaches the towers what those words mean. :data:`VOCABULARY` is every word a caption can use, plus the hand
prompt, the local methods' init texts and the dataset's prompt ensemble.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fedrapp_app.testbed.world import CLASSNAMES, METHOD_TEXTS, SHAPES, SceneParams, scene_params

#: Families a pretraining caption can name (hue_shift stays unseen: a strong rotation changes which colour word
#: is right, so no caption could describe it honestly), each with adjectives ("a {adj} photo of ...") and phrases
#: that follow a noun ("... red circle, {phrase}.").
DOMAIN_ADJECTIVES: dict[str, tuple[str, ...]] = {
    "gaussian_noise": ("noisy", "grainy", "staticky"),
    "blur": ("blurry", "blurred", "fuzzy", "unfocused"),
    "contrast": ("faded", "hazy", "foggy", "murky"),
    "color_cast": ("tinted", "teal", "cyan", "greenish"),
    "occlusion": ("occluded", "obstructed", "covered", "blocked"),
    "salt_pepper": ("speckled", "spotted", "dusty", "peppered"),
    "pixelate": ("pixelated", "blocky", "jagged", "mosaic"),
}
DOMAIN_PHRASES: dict[str, tuple[str, ...]] = {
    "gaussian_noise": ("with noise", "with film grain", "full of noise"),
    "blur": ("out of focus", "with blur", "not in focus"),
    "contrast": ("washed out", "with low contrast", "with weak contrast"),
    "color_cast": ("with a teal tint", "with a colour cast", "with a cyan cast"),
    "occlusion": ("partly hidden", "partly covered", "behind grey boxes"),
    "salt_pepper": ("with salt and pepper noise", "with black and white specks", "with specks"),
    "pixelate": ("in low resolution", "with coarse pixels", "with big square pixels"),
}
#: Strength adverbs by corruption level: below 0.75, up to 1.4, above ("" = no adverb).
STRENGTH_WORDS: tuple[tuple[str, ...], ...] = (
    ("slightly", "a bit", "mildly", "a little", "lightly"),
    ("", "somewhat", "moderately", "fairly", "rather"),
    ("very", "heavily", "strongly", "badly", "extremely"),
)
MEDIA: tuple[str, ...] = ("photo", "picture", "image", "render", "drawing", "snapshot", "shot")
SIZE_WORDS: tuple[tuple[str, ...], ...] = (
    ("small", "tiny", "little"),
    ("medium", "medium sized", "mid sized", "modest"),
    ("large", "big", "huge"),
)
_SIDES = ("left", "right")
_ROWS = (("top", "upper"), ("bottom", "lower"))
CENTRE_PHRASES: tuple[str, ...] = ("in the center", "in the middle", "centered", "in the centre of the frame")
TILT_WORDS: tuple[tuple[str, ...], ...] = (
    ("upright", "straight", "level", "not rotated"),
    ("tilted", "rotated", "slanted", "turned", "askew"),
)
BACKGROUND_WORDS: tuple[tuple[str, ...], ...] = (
    ("dark", "black", "dim", "shadowy"),
    ("grey", "gray", "neutral", "mid grey"),
    ("light", "white", "bright", "pale"),
)
BACKGROUND_NOUNS: tuple[str, ...] = ("background", "backdrop", "ground")
STRIPE_DIRECTIONS: tuple[str, ...] = ("horizontal", "vertical", "diagonal")
STRIPE_WIDTHS: tuple[tuple[str, ...], ...] = (("thin", "fine", "narrow"), ("wide", "broad", "thick"))
STRIPE_NOUNS: tuple[str, ...] = ("stripes", "lines", "bands")
GREY_WORDS: tuple[str, ...] = ("dark grey", "grey", "light grey")
DISTRACTOR_NOUNS: tuple[str, ...] = ("dot", "spot", "blob", "disc")
DISTRACTOR_PLACES: tuple[str, ...] = ("nearby", "beside it", "next to it", "")
ALONE_PHRASES: tuple[str, ...] = ("alone", "on its own", "by itself", "with nothing else")
LIGHT_SIDES: tuple[tuple[str, ...], ...] = (("left",), ("right",), ("above", "top"), ("below", "bottom"))
EVEN_LIGHT: tuple[str, ...] = ("evenly lit", "with flat lighting", "uniformly lit")
#: Share of captions that say only the class ("a photo of a red circle."), like the hand prompt.
BARE_SHARE = 0.25
#: The facts a caption can state, in the order that seeds their words.
FACT_NAMES: tuple[str, ...] = (
    "size", "tilt", "position", "background", "distractor", "light", "domain adjective", "domain phrase",
)  # fmt: skip


@dataclass(frozen=True)
class Facts:
    """What a caption may say about one render; None = not said (not visible or ambiguous).

    size 0/1/2 (small, medium, large); column 0/1/2 (left, centre, right) and row 0/1/2 (top, middle, bottom);
    tilt 0/1 (upright, tilted; None for round shapes or in between); background 0/1/2 (dark, grey, light);
    stripes (direction 0/1/2 horizontal, vertical, diagonal; width 0/1 thin, wide, or None in between) or None
    for a plain background; distractor grey level 0/1/2 or None for none; light 0-3 (from the left, right, above,
    below), 4 (even) or None in between; domain a corruption family with strength 0/1/2, or None.
    """

    label: int
    size: int
    column: int
    row: int
    tilt: int | None
    background: int
    stripes: tuple[int, int | None] | None
    distractor: int | None
    light: int | None
    domain: str | None = None
    strength: int = 1


def _tilt(p: SceneParams) -> int | None:
    period = {"square": math.pi / 2, "cross": math.pi / 2, "triangle": 2 * math.pi / 3}.get(p.shape)
    if period is None:  # circle, ring: every angle looks the same
        return None
    deviation = math.degrees(min(p.angle % period, period - p.angle % period))
    return 0 if deviation < 10 else 1 if deviation > 22 else None


def _stripes(p: SceneParams) -> tuple[int, int | None] | None:
    if p.stripes is None:
        return None
    phi, frequency = p.stripes[0], p.stripes[1]
    # the wave runs along (cos phi, sin phi) in (column, row): lines of equal phase run across it
    degrees = math.degrees(phi)
    direction = 1 if degrees < 20 or degrees > 160 else 0 if 70 < degrees < 110 else 2
    width = 1 if frequency < 6.5 else 0 if frequency > 9.5 else None
    return direction, width


def _light(p: SceneParams) -> int | None:
    across, down = p.shading  # brightness 1 + across * column + down * row (rows point down)
    strongest = max(abs(across), abs(down))
    if strongest < 0.04:
        return 4
    if strongest < 0.08:
        return None
    if abs(across) >= abs(down):
        return 1 if across > 0 else 0
    return 3 if down > 0 else 2


def _third(value: float) -> int:
    return 0 if value < -0.2 else 2 if value > 0.2 else 1


def strength_of(level: float) -> int:
    """Strength 0/1/2 of a corruption level (severity units; severity 1 = level 1)."""
    return 0 if level < 0.75 else 1 if level <= 1.4 else 2


def facts_of(label: int, seed: int, domain: str | None = None, level: float = 1.0) -> Facts:
    """The facts of render ``(label, seed)``; ``domain`` and ``level``: the corruption it was given, if any."""
    if domain is not None and domain not in DOMAIN_ADJECTIVES:
        raise ValueError(f"domain {domain!r} has no caption words; use one of {', '.join(DOMAIN_ADJECTIVES)}")
    p = scene_params(label, seed)
    luminance = 0 if p.luminance < 0.38 else 2 if p.luminance > 0.62 else 1
    grey = None if p.distractor is None else 0 if p.distractor[3] < 0.4 else 2 if p.distractor[3] > 0.6 else 1
    return Facts(
        label=label,
        size=0 if p.size < 0.46 else 2 if p.size > 0.61 else 1,
        column=_third(p.center[0]),
        row=_third(p.center[1]),
        tilt=_tilt(p),
        background=luminance,
        stripes=_stripes(p),
        distractor=grey,
        light=_light(p),
        domain=domain,
        strength=strength_of(level) if domain is not None else 1,
    )


# ----- words -----------------------------------------------------------------------------------------
def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]


def _position(f: Facts, rng: np.random.Generator) -> str:
    if f.column == 1 and f.row == 1:
        return _pick(rng, CENTRE_PHRASES)
    side = None if f.column == 1 else _SIDES[f.column // 2]
    row = None if f.row == 1 else _pick(rng, _ROWS[f.row // 2])
    if side is None:
        return _pick(rng, (f"at the {row}", f"near the {row}", f"in the {row} part"))
    if row is None:
        return _pick(rng, (f"on the {side}", f"at the {side}", f"on the {side} side", f"to the {side}"))
    return _pick(rng, (f"in the {row} {side} corner", f"at the {row} {side}", f"near the {row} {side} corner"))


def _background(f: Facts, rng: np.random.Generator) -> str:
    tone, noun = _pick(rng, BACKGROUND_WORDS[f.background]), _pick(rng, BACKGROUND_NOUNS)
    if f.stripes is not None:
        direction, width = f.stripes
        lines = STRIPE_DIRECTIONS[direction]
        if width is not None:
            lines = f"{_pick(rng, STRIPE_WIDTHS[width])} {lines}"
        return _pick(
            rng,
            (
                f"on a {tone} {noun} with {lines} {_pick(rng, STRIPE_NOUNS)}",
                f"on a {tone} {'striped' if rng.random() < 0.5 else 'lined'} {noun}",
                f"against {lines} {_pick(rng, STRIPE_NOUNS)} on {tone}",
            ),
        )
    return _pick(rng, (f"on a {tone} {noun}", f"against a {tone} {noun}", f"on a plain {tone} {noun}"))


def _distractor(f: Facts, rng: np.random.Generator) -> str:
    if f.distractor is None:
        return _pick(rng, ALONE_PHRASES)
    place = _pick(rng, DISTRACTOR_PLACES)
    return f"with a {GREY_WORDS[f.distractor]} {_pick(rng, DISTRACTOR_NOUNS)}" + (f" {place}" if place else "")


def _light_phrase(f: Facts, rng: np.random.Generator) -> str:
    if f.light == 4:
        return _pick(rng, EVEN_LIGHT)
    side = _pick(rng, LIGHT_SIDES[f.light])
    if side in ("left", "right", "top", "bottom"):
        return _pick(rng, (f"lit from the {side}", f"with light from the {side}", f"brighter on the {side}"))
    return _pick(rng, (f"lit from {side}", f"with light from {side}"))


def _domain_adjective(f: Facts, rng: np.random.Generator) -> str:
    adverb = _pick(rng, STRENGTH_WORDS[f.strength])
    return f"{adverb} {_pick(rng, DOMAIN_ADJECTIVES[f.domain])}".strip()


def _domain_phrase(f: Facts, rng: np.random.Generator) -> str:
    adverb = _pick(rng, STRENGTH_WORDS[f.strength])
    if rng.random() < 0.5:
        return f"{adverb} {_pick(rng, DOMAIN_ADJECTIVES[f.domain])}".strip()
    return f"{adverb} {_pick(rng, DOMAIN_PHRASES[f.domain])}".strip()


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


# ----- captions --------------------------------------------------------------------------------------
def _stated(f: Facts) -> list[str]:
    """The facts this render has words for, in a fixed order."""
    names = ["size", "position", "background", "distractor"]
    names += [name for name, value in (("tilt", f.tilt), ("light", f.light)) if value is not None]
    return names


def _clauses(f: Facts, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """Choose which facts to say: (facts said before the class name, facts said after it)."""
    names = [name for name in _stated(f) if rng.random() < 0.45]
    rng.shuffle(names)
    before = [name for name in names if name in ("size", "tilt") and rng.random() < 0.7]
    return before, [name for name in names if name not in before]


def _words(name: str, f: Facts, seed: int) -> str:
    """The words of fact ``name``, drawn from a generator of its own: changing one fact changes no other words."""
    rng = np.random.default_rng([seed, 1 + FACT_NAMES.index(name)])
    if name == "size":
        return _pick(rng, SIZE_WORDS[f.size])
    if name == "tilt":
        return _pick(rng, TILT_WORDS[f.tilt])
    if name == "position":
        return _position(f, rng)
    if name == "background":
        return _background(f, rng)
    if name == "distractor":
        return _distractor(f, rng)
    if name == "light":
        return _light_phrase(f, rng)
    return _domain_adjective(f, rng) if name == "domain adjective" else _domain_phrase(f, rng)


def describe(f: Facts, seed: int) -> tuple[str, list[str]]:
    """A caption of ``f`` drawn with ``seed`` and the names of the facts it states (``"domain"`` among them).

    The structure (bare or not, which facts, their order, the head, the punctuation) comes from one generator and
    depends only on which facts the render has words for; each fact's words come from a generator of their own.
    """
    rng = np.random.default_rng(seed)
    name = CLASSNAMES[f.label]
    if rng.random() < BARE_SHARE and f.domain is None:
        return f"{_pick(rng, ('a photo of a', 'a picture of a', 'an image of a', 'a drawing of a'))} {name}.", []
    before, after = _clauses(f, rng)
    said = [*before, *after]
    adjectives = " ".join(_words(n, f, seed) for n in before)
    noun = f"{adjectives} {name}".strip()
    medium = _pick(rng, MEDIA)
    domain_first = f.domain is not None and rng.random() < 0.6
    head = int(rng.integers(3))
    if domain_first:  # "a very blurry photo of a small red circle"
        adjective = _words("domain adjective", f, seed)
        head_words = f"{_article(adjective)} {adjective} {medium} of {_article(noun)} {noun}"
    else:
        head_words = (
            f"{_article(noun)} {noun}",
            f"{_article(medium)} {medium} of {_article(noun)} {noun}",
            f"this is {_article(noun)} {noun}",
        )[head]
    parts = [head_words, *(_words(n, f, seed) for n in after)]
    if f.domain is not None and not domain_first:
        parts.append(_words("domain phrase", f, seed))
    if f.domain is not None:
        said.append("domain")
    joiner = ", " if rng.random() < 0.5 else " "
    return joiner.join(parts) + ".", said


def caption(f: Facts, seed: int) -> str:
    """The caption of facts ``f`` drawn with ``seed``."""
    return describe(f, seed)[0]


def _false_fact(f: Facts, name: str, rng: np.random.Generator) -> Facts:
    """``f`` with fact ``name`` changed to a value that is false for the render."""
    other = lambda value, count: int((value + 1 + rng.integers(count - 1)) % count)  # noqa: E731
    if name == "size":
        return replace(f, size=other(f.size, 3))
    if name == "tilt":
        return replace(f, tilt=1 - f.tilt)
    if name == "position":
        column, row = f.column, f.row
        while (column, row) == (f.column, f.row):
            column, row = int(rng.integers(3)), int(rng.integers(3))
        return replace(f, column=column, row=row)
    if name == "background":
        if f.stripes is not None and rng.random() < 0.5:
            return replace(f, stripes=None)
        return replace(f, background=other(f.background, 3))
    if name == "distractor":
        return replace(f, distractor=int(rng.integers(3)) if f.distractor is None else None)
    if name == "light":
        return replace(f, light=other(f.light, 5))
    families = tuple(DOMAIN_ADJECTIVES)
    return replace(f, domain=families[other(families.index(f.domain), len(families))])


def hard_negative(f: Facts, seed: int, k: int = 0) -> str | None:
    """A caption like ``caption(f, seed)`` with one stated fact made false; None if it states no fact.

    The same seed draws the same structure and the same words for every fact but the changed one, so the two
    captions share the class name and all other wording. ``k`` numbers the negatives of one caption (each picks
    its fact and false value with a generator of its own).
    """
    text, said = describe(f, seed)
    if not said:
        return None
    chooser = np.random.default_rng([seed, 0, k])
    false, _ = describe(_false_fact(f, said[int(chooser.integers(len(said)))], chooser), seed)
    return false if false != text else None


def vocabulary_texts() -> tuple[str, ...]:
    """Every text whose words a caption can use, the class names, the hand prompt and the methods' init texts."""
    texts: list[str] = [*METHOD_TEXTS, *CLASSNAMES, *SHAPES, *MEDIA, *CENTRE_PHRASES, *BACKGROUND_NOUNS]
    texts += [", a an the of on in at near to is this with and against part side corner frame plain striped lined"]
    texts += ["lit from light brighter colorful drawing", *_SIDES, *(w for row in _ROWS for w in row)]
    groups = (SIZE_WORDS, TILT_WORDS, BACKGROUND_WORDS, STRIPE_WIDTHS, LIGHT_SIDES, STRENGTH_WORDS)
    texts += [word for group in groups for options in group for word in options]
    texts += [*STRIPE_DIRECTIONS, *STRIPE_NOUNS, *GREY_WORDS, *DISTRACTOR_NOUNS, *DISTRACTOR_PLACES]
    texts += [*ALONE_PHRASES, *EVEN_LIGHT]
    texts += [w for words in (*DOMAIN_ADJECTIVES.values(), *DOMAIN_PHRASES.values()) for w in words]
    texts += ["a picture of a {}.", "an image of a {}.", "a drawing of a {}."]  # the testbed preset's ensemble
    return tuple(texts)


#: All texts the tokenizer covers.
VOCABULARY: tuple[str, ...] = vocabulary_texts()
