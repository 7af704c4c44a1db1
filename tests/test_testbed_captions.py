"""Pretraining captions: the render's facts in words, hard negatives that change one fact, the vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from fedrapp_app.testbed import captions
from fedrapp_app.testbed.tokenizer import words_of
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE, METHOD_TEXTS, scene_params


def test_facts_follow_the_render() -> None:
    for seed in range(40):
        p, f = scene_params(5, seed), captions.facts_of(5, seed)
        assert f.size == (0 if p.size < 0.46 else 2 if p.size > 0.61 else 1)
        assert (f.stripes is None) == (p.stripes is None)
        assert (f.distractor is None) == (p.distractor is None)
    assert captions.facts_of(5, 3, "blur", 2.0).strength == 2
    with pytest.raises(ValueError, match="hue_shift"):
        captions.facts_of(5, 3, "hue_shift")


def test_captions_are_seeded_varied_and_name_the_class() -> None:
    texts = [captions.caption(captions.facts_of(c, s), 100 * c + s) for c in range(30) for s in range(20)]
    assert all(CLASSNAMES[c] in texts[20 * c + s] for c in range(30) for s in range(20))
    assert len(set(texts)) > 500  # synonyms, subsets and orders
    f = captions.facts_of(7, 4)
    assert captions.caption(f, 11) == captions.caption(f, 11)
    blurry = [captions.caption(captions.facts_of(7, s, "blur", 2.0), s) for s in range(30)]
    adjectives = (*captions.DOMAIN_ADJECTIVES["blur"], *captions.DOMAIN_PHRASES["blur"])
    assert all(any(word in text for word in adjectives) for text in blurry)


def test_a_hard_negative_changes_one_fact_and_keeps_the_class() -> None:
    changed = 0
    for seed in range(200):
        f = captions.facts_of(seed % 30, seed, "contrast" if seed % 3 == 0 else None)
        true, said = captions.describe(f, seed)
        negative = captions.hard_negative(f, seed)
        if not said:
            assert negative is None
            continue
        if negative is None:
            continue
        changed += 1
        assert negative != true and CLASSNAMES[f.label] in negative
        # the same structure: the words around the changed fact are the true caption's
        assert negative.split()[0] == true.split()[0] or f.domain is not None
    assert changed > 100


def test_the_vocabulary_covers_every_caption_and_is_wider_than_the_text_width() -> None:
    vocabulary = set(words_of(t.replace("{}", "") for t in captions.VOCABULARY))
    texts = [
        captions.hard_negative(f, s) or captions.caption(f, s)
        for s in range(300)
        for f in [captions.facts_of(s % 30, s, [None, *captions.DOMAIN_ADJECTIVES][s % 8], 0.5 + s % 3 * 0.5)]
    ]
    texts += [captions.caption(captions.facts_of(s % 30, s), s) for s in range(300)]
    texts += [*METHOD_TEXTS, HAND_TEMPLATE, *CLASSNAMES]
    assert set(words_of(t.replace("{}", "") for t in texts)) <= vocabulary
    assert len(vocabulary) >= 150, len(vocabulary)
    assert np.mean([len(t.split()) for t in texts]) > 6
