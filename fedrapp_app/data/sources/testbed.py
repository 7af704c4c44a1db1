"""The built-in offline testbed (SPEC §8) as a source: a seeded pool of renders, corrupted per client domain.

Every sample is fixed by its label and its own seed (both drawn from the run seed), and its corruption by
that same seed, so a batch is the same whatever else is in it: resuming a stream reproduces its images.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from fedrapp_app.data.loader import parallel_map
from fedrapp_app.data.sources.base import Source, check_labels

Domain = tuple[str, int]

# Separate streams of randomness drawn from the run seed (numpy SeedSequence spawn keys).
_POOL_LABELS = 101
_POOL_SEEDS = 102


class TestbedSource(Source):
    """``num_samples`` procedural test images with balanced labels, all derived from ``seed``."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, num_samples: int, seed: int, *, decode_workers: int = 4) -> None:
        from fedrapp_app.testbed import world

        self.classnames = list(world.CLASSNAMES)
        self.template = world.HAND_TEMPLATE
        self.description = f"testbed pool of {num_samples} renders (seed {seed})"
        num_classes = len(self.classnames)
        # Balanced: every class appears floor or ceil(N / C) times, in a seeded order.
        labels = np.arange(num_samples, dtype=np.int64) % max(num_classes, 1)
        np.random.default_rng(np.random.SeedSequence([seed, _POOL_LABELS])).shuffle(labels)
        self._labels = check_labels(labels, num_classes, self.description)
        self._seeds = np.random.default_rng(np.random.SeedSequence([seed, _POOL_SEEDS])).integers(
            0, 2**31 - 1, size=num_samples, dtype=np.int64
        )
        self._workers = decode_workers

    def labels(self) -> np.ndarray:
        return self._labels

    def sample_seeds(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """int64 [B]: the per-sample seeds that fix each image (and its corruption)."""
        return self._seeds[np.asarray(indices, dtype=np.int64)]

    def render(self, indices: Sequence[int] | np.ndarray, domain: Domain | None = None) -> np.ndarray:
        """uint8 [B, H, W, 3]: the images of ``indices``, corrupted by ``domain`` (None = clean)."""
        from fedrapp_app.testbed import world

        idx = np.asarray(indices, dtype=np.int64)
        seeds = self._seeds[idx]
        images = world.render(self._labels[idx], seeds)
        if domain is not None:
            from fedrapp_app.testbed import corruptions

            name, severity = domain
            # corrupt() seeds sample b from (seeds[b], corruption), independently of the batch.
            images = corruptions.corrupt(images, name, severity, seeds)
        return np.asarray(images, dtype=np.uint8)

    def load(self, indices: Sequence[int] | np.ndarray, domain: Domain | None = None) -> list[Image.Image]:
        idx = np.asarray(indices, dtype=np.int64)
        # Images do not depend on batch composition, so chunks can be rendered on separate threads.
        chunks = np.array_split(idx, max(1, min(self._workers, len(idx) // 16)))
        arrays = parallel_map(lambda c: self.render(c, domain), [c for c in chunks if len(c)], self._workers)
        return [Image.fromarray(np.ascontiguousarray(image)) for block in arrays for image in block]
