"""Privacy accounting of a client's uploads (ours, issue 38), through Google's ``dp-accounting`` (RDP).

Each round a client uploads in is one Gaussian mechanism of noise multiplier z (``mechanism.py``); its ε after n
uploads at the run's δ is that of n self-composed Gaussian mechanisms, from ``dp_accounting.rdp.RdpAccountant``
(the accountant Opacus and TensorFlow Privacy use). No amplification by sampling: the server sees which clients
upload in a round, so a round a client takes part in is never hidden among rounds it skips. A client calibrates
z before its first upload so that the most rounds it can take part in (its stream's batches) stay within the
budget: a budget is met by construction, never overrun.
"""

from __future__ import annotations

import functools
import math

#: The most noise a run may need (noise std over sensitivity): beyond it an upload is noise a hundred times its
#: signal's largest size, and a budget that needs more is refused before the start, naming the fix.
MAX_NOISE_MULTIPLIER = 100.0


class BudgetError(ValueError):
    """A privacy budget that is malformed or would need more than :data:`MAX_NOISE_MULTIPLIER`."""


def check_budget(epsilon: float, delta: float) -> None:
    """``BudgetError`` unless ε > 0 (∞ allowed: clipping without noise) and 0 < δ < 1."""
    if not epsilon > 0 or math.isnan(epsilon):
        raise BudgetError(f"dp-epsilon = {epsilon!r} must be > 0 (inf: clipping without noise)")
    if not 0 < delta < 1:
        raise BudgetError(f"dp-delta = {delta!r} must lie in (0, 1), e.g. 1e-5")


def epsilon(noise_multiplier: float, uploads: int, delta: float) -> float:
    """ε after ``uploads`` rounds of the Gaussian mechanism of ``noise_multiplier`` at ``delta`` (0 before any,
    ∞ without noise)."""
    if uploads <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    return _rdp_epsilon(float(noise_multiplier), int(uploads), float(delta))


@functools.lru_cache(maxsize=4096)
def _rdp_epsilon(noise_multiplier: float, uploads: int, delta: float) -> float:
    import dp_accounting
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), uploads))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def noise_for_budget(epsilon_budget: float, delta: float, uploads: int) -> float:
    """The smallest noise multiplier z with ε(z, ``uploads``, ``delta``) ≤ ``epsilon_budget`` (0 for ε = ∞);
    ``BudgetError`` for a malformed budget or one that needs more than :data:`MAX_NOISE_MULTIPLIER`."""
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

    z = dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        lambda z: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), uploads),
        epsilon_budget,
        delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(1e-3, MAX_NOISE_MULTIPLIER),
    )
    return float(z)
