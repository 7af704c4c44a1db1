"""``python -m fedrapp_app.bench.trust <bench-dir> ...``: is the own-prompt signal honest, is the goal met?

(docs/results/personalization.md, "Personalization that never hurts".)

Reads only ``<bench-dir>/cells.jsonl`` and writes ``trust.md`` (and ``signal-<grid>.png``) into ``--out``; several
bench directories (the same grids on other seeds) pool their rows per setting:

* **Signal honesty**, per setting that ran with ``report-own-prompt`` (or the trust option): for every (client,
  round) in which the client had an own prompt, the real accuracy change of what the server sent over what the
  client would have kept alone, Δacc = acc(received) − acc(own) on that batch before adaptation, against three
  label-free candidates the client can compute from the same two sets of logits: the entropy gap H_own − H_pre
  (positive: the sent prompt is the more confident), the marginal gap Hm_pre − Hm_own (positive: the sent prompt
  spreads its predictions over more classes) and their sum, the information gap (I = Hm − H, the mutual
  information between an image and its prediction on the batch: positive when the sent prompt has the larger I).
  For each: the Pearson correlation with Δacc, centred within each round of each seed (a signal that only
  tracked the round would not count), and how often its sign is Δacc's (over pairs where both are non-zero).
* **Goal table** of a grid compared on [method, rule] with a context axis (the setting): per (setting, method),
  every rule's online accuracy (mean ± std over seeds) and the paired gaps to none-fed and FedAvg.
* **Goal check**, every grid together: per (setting, method), each trust-option rule against the issue's goal
  (``goal_check_markdown``).

Labels enter only the scoring (Δacc, accuracies), never a signal.
"""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedrapp_app.bench.personalization import paired_gap, save_small_png
from fedrapp_app.bench.rows import bench_dirs, report_input, report_main, write_text_atomic
from fedrapp_app.bench.stats import Setting, Stat, mean_std, settings_of

#: The label-free candidates, by name: a function of the arrays (e, dm, nb) -> signal, with e = H_own − H_pre,
#: dm = Hm_own − Hm_pre and nb = V_pre − V_own (the neighbour votes of methods.base.neighbour_votes); every
#: candidate is positive when it says the sent prompt is the better one.
CANDIDATES: dict[str, str] = {
    "entropy": "H_own − H_pre",
    "marginal": "Hm_pre − Hm_own",
    "information": "I_pre − I_own",
    "neighbours": "V_pre − V_own",
}


def candidate(name: str, e: np.ndarray, dm: np.ndarray, nb: np.ndarray | None = None) -> np.ndarray:
    """The candidate signal ``name`` (see :data:`CANDIDATES`) from the entropy, marginal-entropy and vote gaps."""
    if name == "entropy":
        return e
    if name == "marginal":
        return -dm
    if name == "information":
        return e - dm
    if name == "neighbours":
        return np.full_like(e, np.nan) if nb is None else nb
    raise ValueError(f"unknown signal {name!r}; choose one of {sorted(CANDIDATES)}")


@dataclass(frozen=True)
class Pairs:
    """(client, round) pairs of one setting with an own prompt: arrays of equal length M."""

    ident: np.ndarray  # [M] int: one id per (seed, round), for centring within a round
    e: np.ndarray  # [M] H_own − H_pre
    dm: np.ndarray  # [M] Hm_own − Hm_pre
    dacc: np.ndarray  # [M] acc(received) − acc(own), fractions
    nb: np.ndarray  # [M] V_pre − V_own, the neighbour-vote gap (NaN in rows that predate it)

    def __len__(self) -> int:
        return int(self.dacc.size)


def own_prompt_pairs(rows: Sequence[Mapping[str, Any]]) -> Pairs:
    """Every (client, round) of ``rows`` (one setting's seeds) whose client scored an own prompt."""
    ident, e, dm, dacc, nb = [], [], [], [], []
    rounds: dict[tuple[int, int], int] = {}
    for seed_index, row in enumerate(rows):
        for block in row.get("clients", {}).values():
            if "h_own" not in block:
                continue
            missing = [None] * len(block["round"])
            votes = zip(block.get("v_pre", missing), block.get("v_own", missing), strict=True)
            series = zip(
                block["round"],
                block["h_pre"],
                block["h_own"],
                block["acc_before"],
                block["acc_own"],
                block["marginal_received"],
                block["marginal_own"],
                votes,
                strict=True,
            )
            for t, h_pre, h_own, acc_before, acc_own, m_pre, m_own, (v_pre, v_own) in series:
                if h_own is None or acc_own is None or m_pre is None or m_own is None:
                    continue
                ident.append(rounds.setdefault((seed_index, int(t)), len(rounds)))
                e.append(h_own - h_pre)
                dm.append(m_own - m_pre)
                dacc.append(acc_before - acc_own)
                nb.append(np.nan if v_pre is None or v_own is None else v_pre - v_own)
    return Pairs(np.array(ident, dtype=int), np.array(e), np.array(dm), np.array(dacc), np.array(nb, dtype=float))


def centred(values: np.ndarray, ident: np.ndarray) -> np.ndarray:
    """``values`` minus the mean of its group (same ``ident``) [M]."""
    if values.size == 0:
        return values
    sums = np.bincount(ident, weights=values)
    counts = np.bincount(ident)
    return values - (sums / np.maximum(counts, 1))[ident]


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN with fewer than 3 values or no spread."""
    if x.size < 3 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def sign_agreement(signal: np.ndarray, dacc: np.ndarray) -> float:
    """Share of the pairs with a non-zero signal and a non-zero Δacc in which both have the same sign."""
    both = (np.abs(signal) > 1e-9) & (np.abs(dacc) > 1e-9)
    return float(np.mean(np.sign(signal[both]) == np.sign(dacc[both]))) if both.any() else float("nan")


@dataclass(frozen=True)
class Honesty:
    """How well each candidate predicts Δacc in one setting."""

    pairs: int
    dacc: float  # mean Δacc (fraction)
    received_better: float  # share of pairs with Δacc > 0
    corr: dict[str, float]  # candidate -> correlation with Δacc, both centred within rounds
    agreement: dict[str, float]  # candidate -> sign agreement with Δacc
    positive: dict[str, float]  # candidate -> share of pairs in which it says the sent prompt is better


def honesty(pairs: Pairs) -> Honesty | None:
    """The signal-honesty numbers of one setting (None without pairs)."""
    if not len(pairs):
        return None
    corr, agreement, positive = {}, {}, {}
    for name in CANDIDATES:
        signal = candidate(name, pairs.e, pairs.dm, pairs.nb)
        known = np.isfinite(signal)  # a candidate the rows predate is NaN
        if not known.any():
            corr[name] = agreement[name] = positive[name] = float("nan")
            continue
        signal, dacc, ident = signal[known], pairs.dacc[known], pairs.ident[known]
        corr[name] = pearson(centred(signal, ident), centred(dacc, ident))
        agreement[name] = sign_agreement(signal, dacc)
        positive[name] = float(np.mean(signal > 1e-9))
    return Honesty(len(pairs), float(pairs.dacc.mean()), float(np.mean(pairs.dacc > 1e-9)), corr, agreement, positive)


# ---------------------------------------------------------------------------------------------- markdown
def honesty_markdown(settings: Sequence[Setting]) -> str:
    """One line per setting with own-prompt pairs: Δacc and, per candidate, corr / sign agreement / P(positive);
    then, over the settings, how well each candidate's share of "sent better" tracks the true share (Pearson)."""
    head = " | ".join(f"{name}: corr, sign agrees, says sent better" for name in CANDIDATES)
    out = io.StringIO()
    rule = "|---|---|---|---|" + "---|" * len(CANDIDATES)
    out.write(f"| setting | pairs | Δacc (points) | sent better | {head} |\n{rule}\n")
    found = []
    for s in settings:
        h = honesty(own_prompt_pairs(s.rows))
        if h is None:
            continue
        found.append(h)
        label = ", ".join(s.labels[a] for a in s.labels)
        cells = [
            f"{h.corr[name]:+.2f}, {100 * h.agreement[name]:.0f}%, {100 * h.positive[name]:.0f}%" for name in CANDIDATES
        ]
        lead = f"| {label} | {h.pairs} | {100 * h.dacc:+.2f} | {100 * h.received_better:.0f}% | "
        out.write(lead + " | ".join(cells) + " |\n")
    if len(found) >= 3:
        truth = np.array([h.received_better for h in found])
        tracks = [pearson(np.array([h.positive[name] for h in found]), truth) for name in CANDIDATES]
        out.write(
            f"| across the {len(found)} settings: corr of the shares with the true share | | | | "
            + " | ".join(f"{c:+.2f}" for c in tracks)
            + " |\n"
        )
    return out.getvalue()


def contest(block: Mapping[str, Any]) -> list[tuple[float, float, float | None]]:
    """The rounds of one client's curves in which it scored a rival against its own prompt, as (V_rival − V_own,
    acc(rival) − acc(own) or None): the rival is the probe where the server sent one (FedRAPP's trust probe: the
    contest the trusts read), else the received prompt before adaptation."""
    probe = "v_probe" in block
    keys = ("v_probe", "v_own_probe", "acc_probe") if probe else ("v_pre", "v_own", "acc_before")
    missing = [None] * len(block["round"])
    rival, own, acc = (block.get(key, missing) for key in keys)
    acc_own = block.get("acc_own", missing)
    return [
        (a - b, None if x is None or y is None else x - y)
        for a, b, x, y in zip(rival, own, acc, acc_own, strict=False)
        if a is not None and b is not None
    ]


def trust_summary_markdown(settings: Sequence[Setting]) -> str:
    """Per setting of a trust-option grid: the mean memory and peer trust over clients and rounds and, where the
    clients reported neighbour votes, over the contest the trusts read (:func:`contest`: the probe against the own
    prompt where there is one, else the sent prompt): the share of rounds the votes side with the rival, the share
    of ties, and how often, where the votes and the accuracies both differ, the votes side with the more accurate
    prompt (a label-scored check of the evidence; labels reach no trust)."""
    out = io.StringIO()
    for s in settings:
        memory, peers, wins, ties, right = [], [], [], [], []
        for block in (b for row in s.rows for b in row.get("clients", {}).values()):
            memory += [x for x in block.get("trust_memory", []) if x is not None]
            peers += [x for x in block.get("trust_peers", []) if x is not None]
            rounds = contest(block)
            wins += [gap > 0 for gap, _ in rounds]
            ties += [gap == 0 for gap, _ in rounds]
            right += [(gap > 0) == (dacc > 0) for gap, dacc in rounds if gap != 0 and dacc]
        if not memory:
            continue
        label = ", ".join(s.labels[a] for a in s.labels)
        vote = f"{100 * np.mean(wins):.0f}% | {100 * np.mean(ties):.0f}%" if wins else "– | –"
        vote += f" | {100 * np.mean(right):.0f}%" if right else " | –"
        out.write(f"| {label} | {np.mean(memory):.2f} | {np.mean(peers):.2f} | {vote} |\n")
    if not out.getvalue():
        return ""
    head = (
        "| setting | memory trust | peer trust | votes side with the sent prompt (the probe, where sent) | vote ties "
        "| votes side with the more accurate |\n|---|---|---|---|---|---|\n"
    )
    return head + out.getvalue()


#: The mean memory trust at which a run counts as having trusted its memory (the timing table's second column).
TRUSTED = 0.9


def trust_timing(row: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """One run's (lock round, trusted round): the first round from which every reporting client has both trusts at
    0 to the end of the run (a lock: sent its own prompt back, none-fed from then on), and the first round in which
    the clients' mean memory trust reaches :data:`TRUSTED`; None where it never happens."""
    by_round: dict[int, list[tuple[float, float]]] = {}
    for block in row.get("clients", {}).values():
        pairs = zip(block["round"], block.get("trust_memory", []), block.get("trust_peers", []), strict=False)
        for t, memory, peers in pairs:
            if memory is not None and peers is not None:
                by_round.setdefault(int(t), []).append((memory, peers))
    rounds = sorted(by_round)
    locked = [all(m == 0 and p == 0 for m, p in by_round[t]) for t in rounds]
    lock = None
    for t, is_locked in zip(reversed(rounds), reversed(locked), strict=True):
        if not is_locked:
            break
        lock = t
    trusted = next((t for t in rounds if np.mean([m for m, _ in by_round[t]]) >= TRUSTED), None)
    return lock, trusted


def trust_timing_markdown(settings: Sequence[Setting]) -> str:
    """Per setting of a trust-option grid, per seed: the round a run locks (:func:`trust_timing`; – never) and the
    round its clients' mean memory trust reaches :data:`TRUSTED` (– never)."""
    out = io.StringIO()
    for s in settings:
        runs = [
            trust_timing(row) for row in s.rows if any("trust_memory" in b for b in row.get("clients", {}).values())
        ]
        if not runs:
            continue
        label = ", ".join(s.labels[a] for a in s.labels)
        locks = ", ".join("–" if lock is None else str(lock) for lock, _ in runs)
        trusted = ", ".join("–" if t is None else str(t) for _, t in runs)
        out.write(f"| {label} | {sum(lock is not None for lock, _ in runs)} of {len(runs)} | {locks} | {trusted} |\n")
    if not out.getvalue():
        return ""
    head = (
        f"| setting | runs locked | locked from round (per seed) | mean memory trust ≥ {TRUSTED} from round |\n"
        "|---|---|---|---|\n"
    )
    return head + out.getvalue()


def goal_markdown(settings: Sequence[Setting], rules: Sequence[str] | None = None) -> str:
    """Per (context, method) of a [method, rule] grid: each rule's accuracy, and paired gaps to none-fed and FedAvg.

    ``rules``: the rule labels to show, in order (default: all, in the grid's order). The gap columns use the
    rules whose strategy is none-fed and fedavg.
    """
    if not settings:
        return ""
    method_axis, rule_axis = settings[0].compare
    table: dict[tuple[str, str], dict[str, Setting]] = {}
    for s in settings:
        if rule_axis not in s.labels:
            continue
        key = (s.context_name, s.labels[method_axis])
        table.setdefault(key, {})[s.labels[rule_axis]] = s
    order = list(rules) if rules else list(dict.fromkeys(r for block in table.values() for r in block))
    out = io.StringIO()
    out.write("| setting | method | " + " | ".join(order) + " |\n|---|---|" + "---|" * len(order) + "\n")
    for (context, method), block in table.items():
        cells = [block[r].metric("micro_accuracy").format() if r in block else "" for r in order]
        out.write(f"| {context} | {method} | " + " | ".join(cells) + " |\n")
    for reference in ("none-fed", "fedavg"):
        if not any(s.strategy == reference for block in table.values() for s in block.values()):
            continue  # a grid without that reference: the goal check pools the grids
        out.write(
            f"\n| Δ vs {reference} (paired, points) | method | "
            + " | ".join(r for r in order if not _is(table, r, reference))
            + " |\n|---|---|"
            + "---|" * sum(not _is(table, r, reference) for r in order)
            + "\n"
        )
        for (context, method), block in table.items():
            base = next((s for s in block.values() if s.strategy == reference), None)
            cells = [
                paired_gap(block[r], base).format(signed=True) if base is not None and r in block else ""
                for r in order
                if not _is(table, r, reference)
            ]
            out.write(f"| {context} | {method} | " + " | ".join(cells) + " |\n")
    return out.getvalue()


#: The FedRAPP rows whose gain the option must keep (issue 15): the paper's rule with the code defaults and the
#: setting the earlier validation chose (docs/results/personalization.md).
GAIN_RULES = ("fedrapp", "fedrapp (mu0=0, gamma0=0.6)")
#: The goal's thresholds: at most 0.2 points below none-fed; at least 80% of the best FedRAPP gain where there is one.
NONE_FED_MARGIN, KEPT_GAIN = 0.002, 0.8


def is_trust(setting: Setting) -> bool:
    """Whether the setting ran FedRAPP's trust option: ``trust = true``, or ``trust-rate`` > 0 in the rows of the
    exploration (commit 9c3f0c6 and before, when the option had sixteen knobs)."""
    config = setting.rows[0]["config"]
    return bool(config.get("trust", False)) or float(config.get("trust-rate", 0.0)) > 0


def thresholds_within_noise(vs_none: Stat, best: float) -> list[float] | None:
    """The goal's thresholds on the gap to none-fed (−0.2 points, and 80% of ``best`` where ``best`` > 0) that lie
    inside the 95% Student-t interval of the gap's mean [fractions]: where one does, the seeds cannot tell the
    option's side of it, whatever the verdict says. ``best`` is taken as exact (it is a mean over the same seeds,
    so the interval understates the noise of the 80% check). None under 2 seeds (no interval)."""
    low, high = vs_none.ci95()
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    thresholds = [-NONE_FED_MARGIN] + ([KEPT_GAIN * best] if best > 0 else [])
    return [t for t in thresholds if low <= t <= high]


def goal_check_markdown(
    settings: Sequence[Setting], gain_rules: Sequence[str] = GAIN_RULES, also: Sequence[str] = ("fedrapp",)
) -> str:
    """The issue's goal, per (setting, method) and trust-option rule, pooling every grid of a [method, rule] bench:
    the paired gap to none-fed (goal: ≥ −0.2 points), to FedAvg (goal: not below by more than noise, i.e. mean +
    std ≥ 0) and, where a ``gain_rules`` row gains over none-fed, the share of the best such gain the option keeps
    (goal: ≥ 80%). The rules named in ``also`` (the paper's rule) are judged the same way, for comparison. A last
    column names the thresholds on the gap to none-fed that its 95% interval contains
    (:func:`thresholds_within_noise`): a verdict the seeds cannot decide. A rule with fewer seeds than none-fed
    (pooled benches where it ran on some seeds only) is not judged, and named below. Empty when no setting ran the
    option."""
    table: dict[tuple[str, str], dict[str, Setting]] = {}
    for s in settings:
        if len(s.compare) == 2 and s.compare[1] in s.labels:
            table.setdefault((s.context_name, s.labels[s.compare[0]]), {})[s.labels[s.compare[1]]] = s
    lines = []
    # rule -> per (setting, method): met, Δ none-fed, above FedAvg, a threshold inside the gap's 95% interval
    totals: dict[str, list[tuple[bool, float, bool, bool]]] = {}
    partial: dict[str, str] = {}  # rule -> its seeds against none-fed's, where it has fewer (not judged)
    for (context, method), block in table.items():
        none_fed = next((s for s in block.values() if s.strategy == "none-fed"), None)
        fedavg = next((s for s in block.values() if s.strategy == "fedavg"), None)
        if none_fed is None:
            continue
        gains = [paired_gap(block[r], none_fed) for r in gain_rules if r in block]
        best = max((g.mean for g in gains if g.n), default=float("nan"))
        for label, option in block.items():
            if not (is_trust(option) or label in also):
                continue
            if len(option.rows) < len(none_fed.rows):  # pooled benches: a rule that ran on some of the seeds only
                partial.setdefault(label, f"{len(option.rows)} of {len(none_fed.rows)}")
                continue
            vs_none = paired_gap(option, none_fed)
            vs_avg = paired_gap(option, fedavg) if fedavg is not None else None
            kept = vs_none.mean / best if best > 0 else float("nan")
            checks = [vs_none.mean >= -NONE_FED_MARGIN]
            if vs_avg is not None and vs_avg.n:
                checks.append(vs_avg.mean + (vs_avg.std if vs_avg.n > 1 else 0.0) >= 0)
            if best > 0:
                checks.append(kept >= KEPT_GAIN)
            above_fedavg = vs_avg is not None and vs_avg.n > 0 and vs_avg.mean > 0
            noisy = thresholds_within_noise(vs_none, best)
            totals.setdefault(label, []).append((all(checks), vs_none.mean, above_fedavg, bool(noisy)))
            lines.append(
                f"| {context} | {method} | {label} | {vs_none.format(signed=True)} | "
                f"{vs_avg.format(signed=True) if vs_avg is not None else '–'} | "
                f"{f'{100 * best:+.2f}' if best == best else '–'} | {f'{100 * kept:.0f}%' if kept == kept else '–'} | "
                f"{'yes' if all(checks) else '**no**'} | {vs_none.format_ci95()} | "
                f"{'–' if noisy is None else ', '.join(f'{100 * t:+.2f}' for t in noisy) or 'none'} |"
            )
    if not any(is_trust(s) for s in settings):
        return ""
    head = (
        "| setting | method | option | Δ vs none-fed | Δ vs fedavg | best FedRAPP gain | kept | goal met | "
        "Δ vs none-fed, 95% CI | thresholds inside the CI |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    summary = (
        "\n| rule | goal met | mean Δ vs none-fed | worst Δ vs none-fed | above FedAvg (mean) | "
        "misses with a threshold inside the CI |\n"
        "|---|---|---|---|---|---|\n"
    )
    for label, judged in totals.items():
        gaps = [gap for _, gap, _, _ in judged]
        misses = [noisy for met, _, _, noisy in judged if not met]
        summary += (
            f"| {label} | {sum(met for met, *_ in judged)} of {len(judged)} | {100 * np.mean(gaps):+.2f} | "
            f"{100 * min(gaps):+.2f} | {sum(above for _, _, above, _ in judged)} of {len(judged)} | "
            f"{sum(misses)} of {len(misses)} |\n"
        )
    if partial:
        summary += "\nNot judged (fewer seeds than none-fed, whose seeds the best gain is taken over): " + (
            "; ".join(f"{label} ({seeds} seeds)" for label, seeds in partial.items()) + ".\n"
        )
    return head + "\n".join(lines) + "\n" + summary


def _is(table: Mapping[tuple[str, str], Mapping[str, Setting]], label: str, strategy: str) -> bool:
    """Whether rule label ``label`` runs ``strategy`` (checked on any method that has it)."""
    return any(label in block and block[label].strategy == strategy for block in table.values())


def signal_figure(settings: Sequence[Setting], title: str, path: Path) -> Path | None:
    """Binned Δacc against each candidate signal (one panel per candidate, one line per setting): a signal is
    honest where its line rises from left to right through (0, 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [(s, own_prompt_pairs(s.rows)) for s in settings]
    data = [(s, p) for s, p in data if len(p) >= 20]
    if not data:
        return None
    fig, axes = plt.subplots(1, len(CANDIDATES), figsize=(4.0 * len(CANDIDATES), 3.4), squeeze=False)
    for ax, name in zip(axes[0], CANDIDATES, strict=True):
        for k, (s, p) in enumerate(data):
            signal = candidate(name, p.e, p.dm, p.nb)
            known = np.isfinite(signal)
            if known.sum() < 20:
                continue
            signal, dacc = signal[known], p.dacc[known]
            edges = np.quantile(signal, np.linspace(0, 1, 6))
            which = np.clip(np.searchsorted(edges, signal, side="right") - 1, 0, 4)
            x = [signal[which == b].mean() for b in range(5) if (which == b).any()]
            y = [100 * dacc[which == b].mean() for b in range(5) if (which == b).any()]
            ax.plot(x, y, marker="o", markersize=3, color=f"C{k % 10}", label=", ".join(s.labels.values()))
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.set_title(f"{name}: {CANDIDATES[name]}", fontsize=9)
        ax.set_xlabel("signal (quintile means)", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("Δacc, sent − own (points)", fontsize=8)
    axes[0, -1].legend(fontsize=6, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_small_png(fig, path)
    plt.close(fig)
    return path


#: The per-client curves of the trust option that :func:`trust_figure` draws, with their panel titles.
TRUST_TRACES = (("trust_memory", "memory trust (factor on μ)"), ("trust_peers", "peer trust (factor on γ)"))


#: At most this many settings (rows) in one trust-traces figure.
MAX_TRACE_ROWS = 12


def trust_figure(settings: Sequence[Setting], title: str, path: Path) -> Path | None:
    """Rows: settings that ran the trust option; columns: its memory and peer trust per round. Thin lines: every
    client of every seed (coloured by shift domain); thick: the mean of each domain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in settings if any("trust_memory" in b for r in s.rows for b in r.get("clients", {}).values())]
    if not rows or len(rows) > MAX_TRACE_ROWS:  # a taller figure is unreadable: one grid per variant instead
        return None
    rules = {s.labels.get(s.compare[-1]) for s in rows}  # one rule in the figure: the title names it, not each row
    height = 1.9 * len(rows) + 0.6
    fig, axes = plt.subplots(len(rows), len(TRUST_TRACES), figsize=(9, height), squeeze=False, sharex=True)
    for row_axes, s in zip(axes, rows, strict=True):
        domains = sorted({str(b.get("domain")) for r in s.rows for b in r["clients"].values()})
        colors = {d: f"C{i % 10}" for i, d in enumerate(domains)}
        for ax, (key, _) in zip(row_axes, TRUST_TRACES, strict=True):
            series: dict[str, dict[int, list[float]]] = {}
            for r in s.rows:
                for block in r["clients"].values():
                    curve = zip(block["round"], block.get(key, []), strict=False)
                    pairs = [(int(t), v) for t, v in curve if v is not None]
                    domain = str(block.get("domain"))
                    xs, ys = [t for t, _ in pairs], [v for _, v in pairs]
                    ax.plot(xs, ys, color=colors[domain], alpha=0.2, linewidth=0.7)
                    for t, v in pairs:
                        series.setdefault(domain, {}).setdefault(t, []).append(v)
            for domain, values in series.items():
                order = sorted(values)
                ax.plot(order, [np.mean(values[t]) for t in order], color=colors[domain], linewidth=2, label=domain)
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
        shown = [v for k, v in s.labels.items() if len(rules) > 1 or k != s.compare[-1]]
        row_axes[0].set_ylabel(", ".join(shown), fontsize=8)
    for ax, (_, name) in zip(axes[0], TRUST_TRACES, strict=True):
        ax.set_title(name, fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("round")
    axes[0, -1].legend(fontsize=6, loc="lower left")
    fig.suptitle(title if len(rules) > 1 else f"{title}: {next(iter(rules))}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.99))
    save_small_png(fig, path, dpi=80)
    plt.close(fig)
    return path


def write_trust(bench_dir: str | Path | Sequence[str | Path], out_dir: str | Path | None = None) -> Path:
    """Write ``trust.md`` (signal honesty and goal tables of every grid) and the signal figures; several bench
    directories (the same grids on other seeds) are pooled per setting."""
    rows, out = report_input(bench_dir, out_dir, "trust")
    settings = settings_of(rows)
    text = io.StringIO()
    names = " + ".join(f"`{d.name}`" for d in bench_dirs(bench_dir))
    text.write(f"# Own-prompt signal and trust option: {names}\n\n")
    for grid in dict.fromkeys(s.grid for s in settings):
        members = [s for s in settings if s.grid == grid]
        text.write(f"## {grid}\n\nOnline accuracy (micro, %), mean ± std over seeds:\n\n")
        if len(members[0].compare) == 2:
            text.write(goal_markdown(members) + "\n")
        honest = honesty_markdown(members)
        if honest.count("\n") > 2:
            text.write(
                "Signal honesty: per (client, round) with an own prompt, Δacc = acc(sent) − acc(own) on the batch "
                "before adaptation; per candidate its correlation with Δacc (both centred within each round), how "
                "often its sign is Δacc's, and how often it says the sent prompt is the better one.\n\n" + honest + "\n"
            )
            figure = signal_figure(members, f"{grid}: Δacc against each candidate signal", out / f"signal-{grid}.png")
            if figure is not None:
                text.write(f"![signal {grid}]({figure.name})\n\n")
        summary = trust_summary_markdown(members)
        if summary:
            text.write(
                "Trusts (mean over clients, rounds and seeds) and the neighbour votes' verdicts:\n\n" + summary + "\n"
            )
        timing = trust_timing_markdown(members)
        if timing:
            text.write(
                "When the trusts lock or trust the memory (per seed; a lock: every client at both trusts 0 from that "
                "round to the end, so none-fed):\n\n" + timing + "\n"
            )
        traces = trust_figure(members, f"{grid}: trusts per client and round (all seeds)", out / f"trust-{grid}.png")
        if traces is not None:
            text.write(f"![trusts {grid}]({traces.name})\n\n")
    check = goal_check_markdown(settings)
    if check:
        text.write(
            "## The goal, every grid together\n\nPer (setting, method), each trust-option rule and the paper's rule, "
            "paired over seeds "
            "(points): at most 0.2 below none-fed, not below FedAvg by more than noise (mean + std ≥ 0), and at least "
            f"80% of the best gain of {', '.join(GAIN_RULES)} over none-fed where there is one.\n\n" + check + "\n"
        )
    path = out / "trust.md"
    write_text_atomic(path, text.getvalue())
    return path


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, "python -m fedrapp_app.bench.trust", __doc__, write_trust, "trust", pool=True)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CANDIDATES", "Honesty", "Pairs", "candidate", "honesty", "mean_std", "own_prompt_pairs", "write_trust"]
