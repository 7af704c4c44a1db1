"""Pure aggregation of benchmark rows: settings (a cell without its seed), mean ± std over seeds, gains, best.

A *setting* is one grid's cell with the seed axis removed; its rows are its seeds. ``std`` is the sample
standard deviation over seeds (ddof = 1; NaN with a single seed). The gain over none-fed is paired: for
each seed, the cell's accuracy minus that of the none-fed cell with the same overrides (same streams,
same local method), then mean ± std of those differences, with a 95% Student-t interval over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedrapp_app.bench.schema import SEED_AXIS, ZEROSHOT, reference_key
from fedrapp_app.config import DEFAULTS

#: Summary numbers of a row that the tables report (row["summary"] keys).
METRICS = ("micro_accuracy", "macro_accuracy", "micro_accuracy_received_prompt")

#: The values an accuracy (a share) can take: its interval is cut to them.
ACCURACY = (0.0, 1.0)

#: Two-sided 95% quantiles of Student's t (0.975 quantile) for 1..30 degrees of freedom (no scipy needed).
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom (normal 1.960 beyond 30)."""
    if dof < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom (2 values), got {dof}")
    return _T975[dof - 1] if dof <= len(_T975) else 1.960


@dataclass(frozen=True)
class Stat:
    """Mean and sample std (ddof 1) of ``n`` values."""

    mean: float
    std: float
    n: int

    def format(self, scale: float = 100.0, digits: int = 2, signed: bool = False) -> str:
        """``"61.23 ± 0.45"`` (std left out with a single value, ``"–"`` without values)."""
        if self.n == 0 or not math.isfinite(self.mean):
            return "–"
        sign = "+" if signed else ""
        text = f"{scale * self.mean:{sign}.{digits}f}"
        return text if self.n < 2 else f"{text} ± {scale * self.std:.{digits}f}"

    def ci95(self, bounds: tuple[float, float] | None = None) -> tuple[float, float]:
        """95% Student-t interval of the mean, ``mean ± t(n-1)·std/sqrt(n)``, cut to ``bounds`` (the values the
        quantity can take: :data:`ACCURACY` for an accuracy); (nan, nan) under 2 values."""
        if self.n < 2 or not math.isfinite(self.std):
            return float("nan"), float("nan")
        half = t975(self.n - 1) * self.std / math.sqrt(self.n)
        low, high = self.mean - half, self.mean + half
        return (low, high) if bounds is None else (max(low, bounds[0]), min(high, bounds[1]))

    def format_ci95(
        self, scale: float = 100.0, digits: int = 2, signed: bool = True, bounds: tuple[float, float] | None = None
    ) -> str:
        """``"[-0.55, -0.01]"`` for a gain; ``signed=False, bounds=ACCURACY`` for an accuracy: ``"[48.10, 57.63]"``
        (``"–"`` under 2 values)."""
        low, high = self.ci95(bounds)
        if not math.isfinite(low):
            return "–"
        sign = "+" if signed else ""
        return f"[{scale * low:{sign}.{digits}f}, {scale * high:{sign}.{digits}f}]"


def mean_std(values: Iterable[float | None]) -> Stat:
    """Mean ± sample std of the finite values (None and NaN are left out)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return Stat(float("nan"), float("nan"), 0)
    std = float(np.std(finite, ddof=1)) if len(finite) > 1 else float("nan")
    return Stat(float(np.mean(finite)), std, len(finite))


@dataclass
class Setting:
    """One grid's cells that differ only in their seed."""

    grid: str
    grid_index: int
    labels: dict[str, str]  # axis -> label, seed axis removed, in axis order
    order: tuple[int, ...]
    compare: tuple[str, ...]
    oracle: bool
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def method(self) -> str:
        """The compared method's name: its compare labels ("adaprompt + fedrapp"; zeroshot alone)."""
        values = [self.labels[a] for a in self.compare]
        if ZEROSHOT in values:
            return ZEROSHOT
        return " + ".join(dict.fromkeys(values))

    @property
    def context(self) -> dict[str, str]:
        """Labels of the axes that are neither compared nor the seed (e.g. the partition)."""
        return {a: v for a, v in self.labels.items() if a not in self.compare}

    @property
    def context_name(self) -> str:
        return ", ".join(self.context.values()) or "all"

    @property
    def strategy(self) -> str:
        """The server rule its cells ran (``"zeroshot"`` for the zero-shot reference)."""
        config = self.rows[0]["config"]
        if config.get("local-method") == ZEROSHOT:
            return ZEROSHOT
        return str(config.get("strategy", DEFAULTS["strategy"]))

    def metric(self, name: str) -> Stat:
        """Mean ± std over seeds of ``row["summary"][name]``."""
        return mean_std(row["summary"].get(name) for row in self.rows)

    def same_domain_share(self) -> Stat:
        """Share of the peer weight on same-domain clients: mean over clients and rounds, then over seeds."""
        per_seed = []
        for row in self.rows:
            values = [
                v
                for block in row.get("clients", {}).values()
                for v in block.get("same_domain_share", [])
                if v is not None
            ]
            per_seed.append(float(np.mean(values)) if values else None)
        return mean_std(per_seed)

    def seconds(self) -> Stat:
        return mean_std(row["seconds"] for row in self.rows)

    def gain(self, by_key: Mapping[str, Mapping[str, Any]], metric: str = "micro_accuracy") -> Stat | None:
        """Paired gain over the none-fed cells with the same overrides; None for none-fed and zeroshot."""
        if self.strategy in ("none-fed", ZEROSHOT):
            return None
        diffs = []
        for row in self.rows:
            reference = by_key.get(reference_key(row["config"]))
            if reference is not None:
                diffs.append(row["summary"][metric] - reference["summary"][metric])
        return mean_std(diffs)


def settings_of(rows: Sequence[Mapping[str, Any]]) -> list[Setting]:
    """Group rows into settings, in grid order, then by the YAML order of their labels."""
    groups: dict[tuple, Setting] = {}
    for row in rows:
        for grid, member in row["grids"].items():
            axes = list(member["labels"])
            keep = [i for i, a in enumerate(axes) if a != SEED_AXIS]
            labels = {axes[i]: member["labels"][axes[i]] for i in keep}
            order = tuple(member["order"][i] for i in keep)
            ident = (grid, tuple(labels.items()))
            if ident not in groups:
                groups[ident] = Setting(
                    grid, member["index"], labels, order, tuple(member["compare"]), bool(member.get("oracle"))
                )
            groups[ident].rows.append(dict(row))

    def sort_key(s: Setting) -> tuple:
        axes = list(s.labels)
        context = tuple(s.order[i] for i, a in enumerate(axes) if a not in s.compare)
        compared = tuple(s.order[i] for i, a in enumerate(axes) if a in s.compare)
        return (s.grid_index, s.grid, context, s.method != ZEROSHOT, compared)

    settings = sorted(groups.values(), key=sort_key)
    for s in settings:
        s.rows.sort(key=lambda r: r["config"].get(SEED_AXIS, 0))
    return settings


def best_settings(settings: Sequence[Setting], metric: str = "micro_accuracy") -> set[int]:
    """Indices (into ``settings``) of the best non-oracle setting of each grid and context (ties: all).

    Only settings with every seed of their block compete: a mean over fewer seeds (a grid still running)
    is over other streams and would win or lose by its seeds alone.
    """
    blocks: dict[tuple, list[int]] = {}
    for i, s in enumerate(settings):
        if not s.oracle:
            blocks.setdefault((s.grid, tuple(s.context.items())), []).append(i)
    best: set[int] = set()
    for members in blocks.values():
        full = max(len(settings[i].rows) for i in members)
        means = {i: settings[i].metric(metric).mean for i in members if len(settings[i].rows) == full}
        finite = [m for m in means.values() if math.isfinite(m)]
        if finite:
            top = max(finite)
            best |= {i for i, m in means.items() if m == top}
    return best


def by_key(rows: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Rows indexed by their identity key."""
    return {row["key"]: row for row in rows}


def round_curve(rows: Sequence[Mapping[str, Any]], numerator: str = "correct") -> tuple[np.ndarray, np.ndarray]:
    """Per-round accuracy over all clients, averaged over the rows (seeds) that reached each round.

    Returns (rounds [T], accuracy [T]); ``numerator`` is ``"correct"`` or ``"correct_before"``.
    """
    per_round: dict[int, list[float]] = {}
    for row in rows:
        r = row["rounds"]
        for t, n, c in zip(r["round"], r["n"], r[numerator], strict=True):
            if n:
                per_round.setdefault(int(t), []).append(c / n)
    order = sorted(per_round)
    return np.array(order, dtype=int), np.array([np.mean(per_round[t]) for t in order])


@dataclass(frozen=True)
class Signals:
    """What FedRAPP's server saw in one setting, pooled over its seeds' (client, round) pairs with an update.

    ``norm_cv`` is the median over rounds of std/mean of ‖Δ‖ across that round's updating clients (how much
    the drift statistic Q can tell clients apart). ``r_vs_gain`` and ``drop_vs_gain`` are Pearson
    correlations of the reliability r and of the entropy drop H_pre − H_post with the client's in-round
    accuracy gain (accuracy after minus before its local step on that batch), each centred within its round
    as r's z-scores are: do the signals pick the updates that helped? Labels enter only this scoring.
    """

    pairs: int
    update_share: float  # share of all (client, round) pairs with an update (‖Δ‖ > 1e-8)
    update_norm: float  # mean ‖Δ‖
    norm_cv: float
    in_round_gain: float  # mean accuracy after minus before the local step (fraction)
    r_vs_gain: float
    drop_vs_gain: float
    mu_std: float  # std of μ over the pairs (μ's mean is μ0 by construction: r's z-scores are centred)
    gamma: float  # mean γ over the pairs


def _centred_by_round(records: Sequence[tuple[tuple, float, float, float]]) -> np.ndarray:
    """[M, 3] (r, drop, gain), each minus its round's mean (records: (round id, r, drop, gain))."""
    groups: dict[tuple, list[int]] = {}
    for i, (ident, *_rest) in enumerate(records):
        groups.setdefault(ident, []).append(i)
    values = np.array([rest for _, *rest in records], dtype=float).reshape(-1, 3)
    for members in groups.values():
        values[members] -= values[members].mean(axis=0)
    return values


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def fedrapp_signals(rows: Sequence[Mapping[str, Any]]) -> Signals | None:
    """FedRAPP's per-client traces (``row["clients"]``) summarised; None when no row carries an update."""
    records: list[tuple[tuple, float, float, float]] = []
    norms: dict[tuple, list[float]] = {}
    mus, gammas, total = [], [], 0
    for seed_index, row in enumerate(rows):
        for block in row.get("clients", {}).values():
            traces = zip(
                block["round"],
                block["update_norm"],
                block["r"],
                block["mu"],
                block["gamma"],
                block["h_pre"],
                block["h_post"],
                block["acc"],
                block["acc_before"],
                strict=True,
            )
            for t, norm, r, mu, gamma, h_pre, h_post, acc, acc_before in traces:
                total += 1
                if norm is None or r is None or norm <= 1e-8:
                    continue
                ident = (seed_index, t)
                records.append((ident, r, h_pre - h_post, acc - acc_before))
                norms.setdefault(ident, []).append(norm)
                mus.append(mu)
                gammas.append(gamma)
    if not records:
        return None
    centred = _centred_by_round(records)
    gains = np.array([g for *_, g in records])
    cvs = [float(np.std(v) / np.mean(v)) for v in norms.values() if len(v) > 1]
    return Signals(
        pairs=len(records),
        update_share=len(records) / total,
        update_norm=float(np.mean([n for v in norms.values() for n in v])),
        norm_cv=float(np.median(cvs)) if cvs else float("nan"),
        in_round_gain=float(gains.mean()),
        r_vs_gain=_pearson(centred[:, 0], centred[:, 2]),
        drop_vs_gain=_pearson(centred[:, 1], centred[:, 2]),
        mu_std=float(np.std([m for m in mus if m is not None])),
        gamma=float(np.mean([g for g in gammas if g is not None])),
    )
