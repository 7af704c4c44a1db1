"""The conformance kit's guard: process-wide state one check of a rule or method must leave as it found it.

A plugin runs in the same process as the run's other code (a client's method beside the data pipeline, a rule
inside the ServerApp), and in a test session beside the next plugin's checks. Switching autograd off, changing
torch's thread count or default dtype, seeding or drawing from a global RNG (numpy's, Python's ``random``,
torch's), or writing into the frozen CLIP changes what runs after it: such a bug shows up as someone else's
failure. :func:`guarded` reads that state before a check and compares it after; what changed is named in the
check's failure, with the fix, and restored (a changed CLIP is rebuilt), so one plugin cannot poison the next.

Torch's entries are read only when torch was imported before the check (a rule's checks never import it).
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Global:
    """One piece of process-wide state: how to read it, put it back, compare and show it, and what a plugin
    should do instead of changing it."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None]
    fix: str
    same: Callable[[Any, Any], bool] = lambda a, b: a == b
    show: Callable[[Any, Any], str] | None = None  # (before, after) -> how it changed; None: "changed"

    def changed(self, before: Any, after: Any) -> str:
        """How it changed, in words, and the fix."""
        return f"{self.name}: {self.show(before, after) if self.show else 'changed'} -- {self.fix}"


def _was(show: Callable[[Any], str]) -> Callable[[Any, Any], str]:
    """``show(after)``, then the value before: "torch.is_grad_enabled() False, was True"."""
    return lambda before, after: f"{show(after)}, was {before}"


def _same_numpy_state(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def _rng_globals() -> list[Global]:
    entries = [
        Global(
            "numpy's global RNG (np.random)",
            np.random.get_state,
            np.random.set_state,
            "it was seeded or drawn from; use a generator of your own (np.random.default_rng(seed)) or, in a method, "
            "the torch.Generator adapt gets",
            _same_numpy_state,
        ),
        Global(
            "Python's random module",
            random.getstate,
            random.setstate,
            "it was seeded or drawn from; use random.Random(seed) of your own, or the generator adapt gets",
        ),
    ]
    if "torch" in sys.modules:
        import torch

        entries.append(
            Global(
                "torch's global RNG",
                torch.get_rng_state,
                torch.set_rng_state,
                "it was seeded or drawn from (torch.manual_seed, torch.rand*/randn* or dropout without "
                "generator=); draw from the torch.Generator adapt gets",
                torch.equal,
            )
        )
    return entries


def _torch_globals() -> list[Global]:
    if "torch" not in sys.modules:
        return []
    import torch

    return [
        Global(
            "torch's grad mode",
            torch.is_grad_enabled,
            torch.set_grad_enabled,
            "autograd was switched and left so; use `with torch.no_grad():` (it restores the mode) instead of "
            "torch.set_grad_enabled(...)",
            show=_was(lambda on: f"torch.is_grad_enabled() {on}"),
        ),
        Global(
            "torch's thread count",
            torch.get_num_threads,
            torch.set_num_threads,
            "leave torch.set_num_threads to the run (it gives each client its share of the cores)",
            show=_was(lambda n: f"{n} thread(s)"),
        ),
        Global(
            "torch's default dtype",
            torch.get_default_dtype,
            torch.set_default_dtype,
            "give the tensors you make a dtype instead of calling torch.set_default_dtype",
            show=_was(str),
        ),
    ]


def model_fingerprint(module: Any) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """What a frozen ``torch.nn.Module`` must keep: (a digest of each parameter's and buffer's values by name, the
    parameters that require a gradient, the submodules in training mode)."""
    import torch

    digests = {}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()  # any dtype
        digests[name] = hashlib.blake2b(raw.tobytes()).hexdigest()
    trainable = tuple(name for name, p in module.named_parameters() if p.requires_grad)
    training = tuple(name or "(the model)" for name, m in module.named_modules() if m.training)
    return digests, trainable, training


def _model_changes(before: tuple, after: tuple) -> str:
    written = [name for name, digest in after[0].items() if before[0].get(name) != digest]
    out = [f"values of {_few(written)} written"] if written else []
    if after[1] != before[1]:
        out.append(f"requires_grad switched on for {_few(sorted(set(after[1]) - set(before[1])))}")
    if after[2] != before[2]:
        out.append(f"training mode switched on for {_few(sorted(set(after[2]) - set(before[2])))}")
    return "; ".join(out) or "changed"


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _model_global(name: str, module: Callable[[], Any], rebuild: Callable[[], None]) -> Global:
    """``module()``'s weights, gradient flags and mode; put back by ``rebuild`` (a fresh copy from disk: the
    caches built on it go with it)."""
    return Global(
        name,
        lambda: model_fingerprint(module()),
        lambda _: rebuild(),
        "the model is frozen: tune only the prompt blocks (copies of what adapt gets), never its weights (e.g. the "
        "text encoder's LayerNorms), their requires_grad or its mode",
        same=lambda a, b: a == b,
        show=_model_changes,
    )


def changes(entries: list[Global], before: list[Any]) -> list[str]:
    """What changed since ``before`` (read from ``entries``), in words; each changed entry is put back."""
    out = []
    for entry, value in zip(entries, before, strict=True):
        now = entry.read()
        if not entry.same(value, now):
            out.append(entry.changed(value, now))
            entry.write(value)
    return out


@contextlib.contextmanager
def guarded(where: str, *, model: tuple[str, Callable[[], Any], Callable[[], None]] | None = None) -> Iterator[None]:
    """Run the block, then fail naming every piece of process-wide state it left changed, after putting it back.

    ``where`` names the check in the failure. ``model``: (its name, a function returning the frozen module the
    block gets, a function that rebuilds it). A block that raised and left something changed fails naming that
    first (the likelier cause: autograd left off fails the next backward pass), then its error.
    """
    entries = [*_torch_globals(), *_rng_globals()]
    if model is not None:
        model[1]()  # built before the state is read: building it the first time seeds torch's RNG
        entries.append(_model_global(*model))
    before = [entry.read() for entry in entries]
    try:
        yield
    except Exception as err:
        leaks = changes(entries, before)
        if not leaks:
            raise
        # The leak is the likelier cause (autograd left off fails the next backward pass): it comes first.
        raise AssertionError(
            f"{where} left process-wide state changed (now restored): {'; '.join(leaks)}; and then raised "
            f"{type(err).__name__}: {err}"
        ) from err
    except BaseException:
        changes(entries, before)  # Ctrl-C: put it back, say nothing
        raise
    leaks = changes(entries, before)
    if leaks:
        raise AssertionError(f"{where} left process-wide state changed (now restored): " + "; ".join(leaks))


@contextlib.contextmanager
def global_rngs_seeded(seed: int) -> Iterator[None]:
    """Inside, numpy's, ``random``'s and (when imported) torch's global RNGs are seeded with ``seed``; after, they
    are as before. Running a plugin under two seeds tells whether its result depends on them."""
    entries = _rng_globals()
    before = [entry.read() for entry in entries]
    np.random.seed(seed)
    random.seed(seed)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)
    try:
        yield
    finally:
        for entry, value in zip(entries, before, strict=True):
            entry.write(value)
