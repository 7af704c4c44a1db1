"""Shift schedules (ours, issue 26): which shift domain each sample of a client's stream is seen under.

The paper's protocol gives client ``i`` one domain for the whole run (``fixed``: domain ``i mod D`` of the
configured list). The schedules of the test-time-adaptation benchmarks move it along the stream:

- ``continual``: the client steps through the configured domains in order, one step every ``shift-period``
  batches (or, with ``shift-rate`` > 0, at each batch with that probability); client ``i`` starts at domain
  ``i mod S``, where ``S`` (``shift-spread``, default D) is how many domains are active across clients at once:
  S = 1 puts every client in the same domain at the same time, S = D spreads them (FedCTTA's spatial rate; the
  period or rate is its temporal one). With ``shift-times = 'shared'`` (the default) the switch times are the
  federation's, so S holds at every batch; with ``'per-client'`` every client switches at its own seeded times (a
  phase of its own in the period, or random switches of its own with the rate), so a switch is seen by one client
  and not the others, and S holds only at the start.
- ``gradual``: the severity of the client's corruption family steps 1, 2, ..., max, ..., 2, 1 (one step per
  period), then the next family of the list does the same (the "gradual" setting of the continual-TTA
  benchmarks); families rotate like ``continual``'s domains.
- ``mixed``: every sample draws its domain uniformly from the list (each batch mixes domains).

A client's stream order is seeded random (the paper's), ``class`` (the classes one after the other) or
``dirichlet`` (RoTTA's correlated order: each class's samples spread over time slots by a Dirichlet(γ) draw,
γ = ``stream-dirichlet``; small γ is close to the class-sorted order, large γ to the random one).

Everything is a pure function of (seed, client, stream position), so a resumed stream sees the same domains.
This module reads no images; the orders read labels to build the experiment, as the partition does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Domain = tuple[str, int]

SHIFTS = ("fixed", "continual", "gradual", "mixed")
#: When clients switch: all at the federation's times, or each at its own.
SHIFT_TIMES = ("shared", "per-client")
_SWITCHES = 211  # SeedSequence key of the random switch times (distinct from the other seeded draws)
_MIXED = 212  # SeedSequence key of the mixed stream's per-sample domains
_PHASES = 213  # SeedSequence key of the per-client phases of a periodic schedule


@dataclass(frozen=True)
class ShiftPlan:
    """A shift schedule over the configured ``domains`` (None = clean), as the run config sets it."""

    shift: str
    domains: tuple[Domain | None, ...]
    period: int = 4
    rate: float = 0.0
    spread: int = 0  # 0 = len(domains)
    seed: int = 0
    max_severity: int = 3
    times: str = "shared"  # one of SHIFT_TIMES

    def __post_init__(self) -> None:
        if self.shift not in SHIFTS:
            raise ValueError(f"shift={self.shift!r} is invalid: expected one of {', '.join(map(repr, SHIFTS))}")
        if self.shift != "fixed" and not self.domains:
            raise ValueError(f"shift={self.shift!r} needs domains: set testbed-domains (e.g. 'blur:2,contrast:2')")
        if self.shift == "gradual" and not self.families:
            raise ValueError("shift='gradual' needs a corrupted domain in testbed-domains (not only 'clean')")
        if self.times not in SHIFT_TIMES:
            allowed = ", ".join(map(repr, SHIFT_TIMES))
            raise ValueError(f"shift-times={self.times!r} is invalid: expected one of {allowed}")

    @property
    def families(self) -> tuple[str, ...]:
        """The corruption families of the list, in order, each once (what ``gradual`` steps through)."""
        return tuple(dict.fromkeys(d[0] for d in self.domains if d is not None))

    @property
    def active(self) -> int:
        """S: how many domains (``gradual``: families) are active across clients at once."""
        count = len(self.families) if self.shift == "gradual" else len(self.domains)
        return min(self.spread, count) if self.spread else count

    def steps(self, num_batches: int, client: int = 0) -> np.ndarray:
        """int64 [num_batches]: the schedule's step at every stream position of ``client`` (0 at position 0); the
        same for every client with shared switch times."""
        positions = np.arange(num_batches, dtype=np.int64)
        own = self.times == "per-client"
        if self.rate <= 0:
            if not own:
                return positions // self.period
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, _PHASES, client]))
            phase = int(rng.integers(0, self.period))  # the client's first switch comes after period - phase batches
            return (positions + phase) // self.period
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _SWITCHES, *([client] if own else [])]))
        switches = rng.random(num_batches) < self.rate
        switches[:1] = False  # a stream starts in its first domain
        return np.cumsum(switches, dtype=np.int64)

    def domain(self, client: int, step: int) -> Domain | None:
        """The domain of ``client`` at schedule step ``step`` (not for ``mixed``: see ``sample_domains``)."""
        if self.shift == "fixed":
            return self.domains[client % len(self.domains)] if self.domains else None
        if self.shift == "continual":
            return self.domains[(client % self.active + step) % len(self.domains)]
        if self.shift == "gradual":
            cycle = 2 * self.max_severity - 1  # severities 1..max..1
            family = self.families[(client % self.active + step // cycle) % len(self.families)]
            return family, self.max_severity - abs(self.max_severity - 1 - step % cycle)
        raise ValueError("a mixed stream has no domain per batch: use sample_domains")

    def sample_domains(self, client: int, num_samples: int) -> np.ndarray:
        """int64 [num_samples]: for ``mixed``, the index into ``domains`` of every stream position's sample."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _MIXED, client]))
        return rng.integers(0, len(self.domains), size=num_samples, dtype=np.int64)


def class_order(labels: np.ndarray, seed: int, client: int, key: int) -> np.ndarray:
    """int64 [N]: a class-correlated stream order of N samples with ``labels`` (int [N]): the classes one after
    the other, in a seeded order, each class's samples shuffled (the sorted stream of the TTA benchmarks).

    Labels build the experiment here, as they do in the partition; nothing a method or the server reads
    depends on them."""
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, key, client]))
    classes = rng.permutation(np.unique(labels))
    shuffled = rng.permutation(len(labels))
    rank = np.empty(int(labels.max(initial=-1)) + 1, dtype=np.int64)
    rank[classes] = np.arange(len(classes))
    return shuffled[np.argsort(rank[labels[shuffled]], kind="stable")]


def dirichlet_order(labels: np.ndarray, gamma: float, seed: int, client: int, key: int) -> np.ndarray:
    """int64 [N]: RoTTA's correlated stream order of N samples with ``labels`` (int [N]) (Yuan et al., CVPR 2023,
    ``LabelDirichletDomainSequence``): each class's samples (shuffled) are cut into S time slots (S = the number of
    classes, at most 100) in proportions drawn from Dirichlet(``gamma``), and each slot holds its classes' pieces
    one after the other in a random order."""
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, key, client]))
    classes = np.unique(labels)
    slots: list[list[np.ndarray]] = [[] for _ in range(min(len(classes), 100))]
    shares = rng.dirichlet([gamma] * len(slots), size=len(classes)) if len(slots) else np.zeros((0, 0))
    for label, share in zip(classes, shares, strict=True):
        members = rng.permutation(np.flatnonzero(labels == label))
        cuts = (np.cumsum(share)[:-1] * len(members)).astype(np.int64)
        for slot, piece in zip(slots, np.split(members, cuts), strict=True):
            slot.append(piece)
    pieces = [slot[k] for slot in slots for k in rng.permutation(len(slot))]
    return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)
