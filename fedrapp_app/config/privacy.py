"""The privacy group: client-level differential privacy of every upload (ours; docs/privacy.md,
``fedrapp_app.privacy``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from fedrapp_app.config.keys import Group, Key, Scalar, override_hint, problem

_DP_KEYS = ("dp-epsilon", "dp-delta", "dp-clip")


def check(v: Mapping[str, Scalar]) -> list[str]:
    """δ below 1/(number of clients), a finite clip, and the budget's keys act only with dp on (a budget that needs
    too much noise for a client's stream is refused where the streams are known: the pre-start check, or the client
    before its first upload).

    The protected unit is a client: a mechanism that publishes one client of n whole at random is (0, 1/n)-DP, so
    δ ≥ 1/n promises nothing (the usual bound; with num-clients = 0 it is checked once the SuperNodes are counted).
    """
    problems = []
    clients = int(v["num-clients"])  # 0: one per SuperNode, known once the run starts
    if not v["dp-delta"] < 1:
        problems.append(problem("dp-delta", v["dp-delta"], "must be < 1 (e.g. 1e-5, below 1/num-clients)"))
    elif v["dp"] and clients and not v["dp-delta"] < 1 / clients:
        problems.append(
            problem(
                "dp-delta",
                v["dp-delta"],
                f"must be < 1/num-clients = {1 / clients:.3g}: with δ at or above it the guarantee allows one "
                "client's data to be published whole (e.g. 1e-5)",
            )
        )
    if math.isnan(v["dp-epsilon"]):
        problems.append(problem("dp-epsilon", v["dp-epsilon"], "must be a number > 0 (inf: clipping without noise)"))
    if not math.isfinite(v["dp-clip"]):
        problems.append(
            problem(
                "dp-clip", v["dp-clip"], "must be a finite number > 0: an infinite clip bounds nothing (e.g. 0.001)"
            )
        )
    inert = [k for k in _DP_KEYS if v[k] != _DEFAULTS[k]]
    if inert and not v["dp"]:
        problems.append(  # the fix is another key's value, so not problem()'s hint to change this one
            f"  {inert[0]} = {v[inert[0]]!r}: has no effect: differential privacy is off "
            f"(fix: {override_hint('dp', True)}, or drop {inert[0]})"
        )
    return problems


GROUP = Group(
    "privacy",
    "client-level differential privacy of every upload (ours; docs/privacy.md)",
    (
        Key(
            "dp",
            False,
            "ours: each client clips its prompt update and adds Gaussian noise to it and to the scalars the rule "
            "reads, so that its whole stream stays within (dp-epsilon, dp-delta); the server sees noised uploads only",
        ),
        Key(
            "dp-epsilon",
            8.0,
            "the privacy budget epsilon of a client's whole stream (inf: clipping without noise); the noise is "
            "chosen before the client's first upload to meet it over the most rounds it can take part in",
            minimum=0.0,
            exclusive_minimum=True,
        ),
        Key(
            "dp-delta",
            1e-5,
            "the budget's delta: below 1 / num-clients (the protected unit is a client), e.g. 1e-5",
            minimum=0.0,
            exclusive_minimum=True,
        ),
        Key(
            "dp-clip",
            0.001,
            "bound on the root mean square of a client's prompt update per coordinate (the L2 clip is dp-clip x "
            "sqrt(prompt size)); the noise scales with it; chosen on validation seeds (docs/results/privacy.md)",
            minimum=0.0,
            exclusive_minimum=True,
        ),
    ),
    check,
)
_DEFAULTS = {key.name: key.default for key in GROUP.keys}


def privacy_words(values: Mapping[str, object]) -> str | None:
    """What a run's config says about its privacy, for a console line or a table: ``"dp ε = 8, δ = 1e-05"`` (each
    client's whole stream within that budget) under ``dp = true``, None without dp."""
    if not values.get("dp", False):
        return None
    epsilon, delta = values.get("dp-epsilon", _DEFAULTS["dp-epsilon"]), values.get("dp-delta", _DEFAULTS["dp-delta"])
    budget = "∞ (clipping, no noise)" if math.isinf(float(epsilon)) else f"{float(epsilon):g}"
    return f"dp ε = {budget}, δ = {float(delta):g}"
