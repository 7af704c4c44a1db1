"""Privacy accounting of a client's uploads (ours), through Google's ``dp-accounting``.

Each round a client uploads in is one Gaussian mechanism of noise multiplier z (``mechanism.py``); its ε after n
uploads at the run's δ is that of n composed Gaussian mechanisms. The accountant is the privacy loss distribution
(PLD: ``dp_accounting.pld.PLDAccountant``, pessimistic, so its ε is an upper bound): it composes Gaussian
mechanisms exactly up to its discretisation, where Rényi DP (``RdpAccountant``, the accountant Opacus and TensorFlow
Privacy use) converts to (ε, δ) with slack: for the default schedule (ε = 8, δ = 1e-5, 16 uploads) PLD needs a
noise multiplier 6% smaller for the same guarantee. RDP's ε of the same releases stays in the summary as a second,
looser upper bound (:func:`rdp_epsilon`).

No amplification by sampling: the server sees which clients upload in a round, so a round a client takes part in
is never hidden among rounds it skips. A client calibrates z before its first upload so that the most rounds it can
take part in (its stream's batches) stay within the budget: a budget is met by construction, never overrun.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

#: The most noise a run may need (noise std over sensitivity): beyond it an upload is noise a hundred times its
#: signal's largest size, and a budget that needs more is refused before the start, naming the fix.
MAX_NOISE_MULTIPLIER = 100.0
#: The PLD's grid of privacy-loss values. A coarser grid only makes the pessimistic ε larger (still an upper
#: bound); 1e-3 gives the same calibrated z as 1e-4 to 4 digits on the default schedule, 20x faster.
PLD_INTERVAL = 1e-3


class BudgetError(ValueError):
    """A privacy budget that is malformed or would need more than :data:`MAX_NOISE_MULTIPLIER`."""


def check_budget(epsilon: float, delta: float) -> None:
    """``BudgetError`` unless ε > 0 (∞ allowed: clipping without noise) and 0 < δ < 1."""
    if not epsilon > 0 or math.isnan(epsilon):
        raise BudgetError(f"dp-epsilon = {epsilon!r} must be > 0 (inf: clipping without noise)")
    if not 0 < delta < 1:
        raise BudgetError(f"dp-delta = {delta!r} must lie in (0, 1), e.g. 1e-5")


def _event(releases: Mapping[float, int]):
    """The DpEvent of ``{noise multiplier: count}`` Gaussian releases, composed."""
    import dp_accounting

    events = [
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), n)
        for z, n in sorted(releases.items())
        if n > 0
    ]
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def _pld():
    from dp_accounting import pld

    return pld.PLDAccountant(value_discretization_interval=PLD_INTERVAL)


def _releases_epsilon(releases: Mapping[float, int], delta: float, accountant_epsilon) -> float:
    """``accountant_epsilon(((z, count), ...), delta)`` of the releases made (0 before any, ∞ where one had no
    noise)."""
    counted = {float(z): int(n) for z, n in releases.items() if n > 0}
    if not counted:
        return 0.0
    if min(counted) <= 0:
        return math.inf
    return accountant_epsilon(tuple(sorted(counted.items())), float(delta))


def epsilon_of(releases: Mapping[float, int], delta: float) -> float:
    """ε at ``delta`` of ``{noise multiplier: count}`` releases (0 before any, ∞ where one had no noise)."""
    return _releases_epsilon(releases, delta, _pld_epsilon)


def epsilon(noise_multiplier: float, uploads: int, delta: float) -> float:
    """ε after ``uploads`` rounds of the Gaussian mechanism of ``noise_multiplier`` at ``delta`` (0 before any,
    ∞ without noise)."""
    return epsilon_of({float(noise_multiplier): int(uploads)}, delta)


@functools.lru_cache(maxsize=4096)
def _pld_epsilon(releases: tuple[tuple[float, int], ...], delta: float) -> float:
    return float(_pld().compose(_event(dict(releases))).get_epsilon(delta))


def rdp_epsilon(releases: Mapping[float, int], delta: float) -> float:
    """The same releases' ε from Rényi DP: a looser upper bound than :func:`epsilon_of` (for the summary)."""
    return _releases_epsilon(releases, delta, _rdp_epsilon)


@functools.lru_cache(maxsize=4096)
def _rdp_epsilon(releases: tuple[tuple[float, int], ...], delta: float) -> float:
    from dp_accounting import rdp

    return float(rdp.RdpAccountant().compose(_event(dict(releases))).get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def noise_for_budget(epsilon_budget: float, delta: float, uploads: int) -> float:
    """The smallest noise multiplier z with ε(z, ``uploads``, ``delta``) ≤ ``epsilon_budget`` by the PLD accountant
    (0 for ε = ∞); ``BudgetError`` for a malformed budget or one that needs more than
    :data:`MAX_NOISE_MULTIPLIER`."""
    check_budget(epsilon_budget, delta)
    if math.isinf(epsilon_budget) or uploads <= 0:
        return 0.0
    if epsilon(MAX_NOISE_MULTIPLIER, uploads, delta) > epsilon_budget:
        raise BudgetError(
            f"dp-epsilon = {epsilon_budget:g} at dp-delta = {delta:g} over {uploads} rounds needs a noise "
            f"multiplier above {MAX_NOISE_MULTIPLIER:g} (the uploads would be pure noise); fix: a larger dp-epsilon "
            f"(at least {epsilon(MAX_NOISE_MULTIPLIER, uploads, delta):.3g}) or fewer rounds"
        )
    import dp_accounting
    from dp_accounting import rdp

    def schedule(z: float):
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), uploads)

    # RDP's z is an upper end (its ε is never below PLD's); it is cheap, and it brackets PLD's search, whose
    # discretised losses grow without bound as z goes to 0.
    upper = dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        schedule,
        epsilon_budget,
        delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(1e-3, MAX_NOISE_MULTIPLIER),
    )
    if epsilon(upper / 2, uploads, delta) <= epsilon_budget:  # never seen: PLD saves a few percent, not half
        return float(upper / 2)
    z = dp_accounting.calibrate_dp_mechanism(
        _pld,
        schedule,
        epsilon_budget,
        delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(upper / 2, upper),
        tol=1e-5,
    )
    return float(z)
