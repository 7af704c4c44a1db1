"""The goal of issue 34 from a bench's rows: each rule's online accuracy against the better of none-fed and FedAvg,
in every (setting, method) cell, keyed by each cell's config, whatever its grid calls it.

    python -m fedrapp_app.bench.goal outputs/bench/personalization-goal --out docs/results/personalization/goal

A cell's **rule** is what its config says about the server rule (``strategy``, ``trust``, ``rule-params`` and the
rule's own keys), its **method** the local method's keys (``local-method``, ``csc``, ``method-params``, the method's
own keys), its **setting** every other key that changes results (the data, the streams, the population); the seed
pairs cells. So two grids that name their labels differently land in the same table, and a grid whose settings
have no label at all gets one from its config. The goal: at or above max(none-fed, FedAvg) − 0.2 points (mean
over the seeds, paired by seed) and, where the domain oracle beats both, within 0.5 points of it. Writes
``goal.md`` (a table per method, the misses counted per rule) and ``gain-<setting>.png`` (each rule's gain over the
better of none-fed and FedAvg with its 95% interval, per method).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrapp_app.bench.rows import read_rows, write_text_atomic
from fedrapp_app.bench.schema import RUNNER_KEYS, SEED_AXIS, SPEED_KEYS
from fedrapp_app.bench.stats import Stat, mean_std
from fedrapp_app.config import DEFAULTS, METHOD_KEYS, RULE_KEYS

#: The goal's margins (points of accuracy): below the better of none-fed and FedAvg, and below the oracle.
MARGIN, ORACLE_MARGIN = 0.2, 0.5
#: The references every cell is held against, by their rule's config.
NONE_FED, FEDAVG, ORACLE = "none-fed", "fedavg", "domain-oracle"

_RULE_KEYS = {"strategy", "trust", "rule-params"} | {k for keys in RULE_KEYS.values() for k in keys}
_METHOD_KEYS = {"local-method", "csc", "method-params"} | {k for keys in METHOD_KEYS.values() for k in keys}
_IGNORED = {SEED_AXIS, "report-own-prompt", *RUNNER_KEYS, *SPEED_KEYS}


@dataclass(frozen=True)
class Identity:
    """A cell's place in the goal table: its setting, method and rule, each a canonical text of config keys."""

    setting: str
    method: str
    rule: str


def _describe(values: Mapping[str, Any]) -> str:
    """``key=value`` pairs in key order (empty: the defaults)."""
    return " ".join(f"{k}={values[k]}" for k in sorted(values)) or "defaults"


#: The budget's keys, which change nothing while ``dp`` is off (a cell recorded before a default changed keeps the old).
_DP_BUDGET = ("dp-epsilon", "dp-delta", "dp-clip")


def identity(config: Mapping[str, Any]) -> Identity:
    """The cell's identity from its full config (every key; values that equal the defaults are left out, and so are
    the privacy budget's keys while dp is off)."""
    ignored = _IGNORED | (set() if config.get("dp") else set(_DP_BUDGET))
    changed = {k: v for k, v in config.items() if k not in ignored and DEFAULTS.get(k, v) != v}
    rule = {k: v for k, v in changed.items() if k in _RULE_KEYS}
    rule["strategy"] = config.get("strategy", DEFAULTS["strategy"])
    method = {k: v for k, v in changed.items() if k in _METHOD_KEYS}
    method["local-method"] = config.get("local-method", DEFAULTS["local-method"])
    setting = {k: v for k, v in changed.items() if k not in _RULE_KEYS and k not in _METHOD_KEYS}
    return Identity(_describe(setting), _describe(method), _describe(rule))


def display_names(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """A display name for each setting, method and rule text: a grid label that names it (the first seen), else
    the text itself."""
    names: dict[str, str] = {}
    for row in rows:
        ident = identity(row["full_config"])
        for member in row.get("grids", {}).values():
            labels = member.get("labels", {})
            for text, axis in ((ident.setting, "setting"), (ident.method, "method"), (ident.rule, "rule")):
                label = labels.get(axis) or labels.get({"setting": "stream"}.get(axis, axis))
                if label and text not in names:
                    names[text] = str(label)
    return names


def collect(rows: Sequence[Mapping[str, Any]]) -> dict[Identity, dict[int, float]]:
    """Micro accuracy (fraction) of each finished cell, by identity and seed."""
    out: dict[Identity, dict[int, float]] = defaultdict(dict)
    for row in rows:
        summary = row.get("summary") or {}
        if row.get("status", "ok") != "ok" or summary.get("micro_accuracy") is None:
            continue
        out[identity(row["full_config"])][int(row["full_config"][SEED_AXIS])] = float(summary["micro_accuracy"])
    return out


def _strategy(rule_text: str) -> str:
    return dict(part.split("=", 1) for part in rule_text.split(" "))["strategy"]


def reference_rules(rules: Sequence[str]) -> dict[str, str]:
    """The rule texts of none-fed, FedAvg and the oracle among ``rules`` (plain: no other key)."""
    return {name: f"strategy={name}" for name in (NONE_FED, FEDAVG, ORACLE) if f"strategy={name}" in rules}


@dataclass(frozen=True)
class Verdict:
    """One rule in one (setting, method) cell: its gain over the better of none-fed and FedAvg (paired by seed),
    the oracle's over the same, and whether the goal is met."""

    gain: Stat
    oracle_gain: Stat | None
    met: bool | None  # None: a reference is missing


def verdict(
    rule: Mapping[int, float], nf: Mapping[int, float], fa: Mapping[int, float], oracle: Mapping[int, float]
) -> Verdict:
    """The goal for one rule's accuracies by seed against the references'."""
    seeds = sorted(set(rule) & set(nf) & set(fa))
    if not seeds:
        return Verdict(mean_std([]), None, None)
    best = {s: max(nf[s], fa[s]) for s in seeds}
    gain = mean_std(rule[s] - best[s] for s in seeds)
    oracle_seeds = [s for s in seeds if s in oracle]
    oracle_gain = mean_std(oracle[s] - best[s] for s in oracle_seeds) if oracle_seeds else None
    met = gain.mean >= -MARGIN / 100
    if oracle_gain is not None and oracle_gain.mean > 0:
        met = met and gain.mean >= oracle_gain.mean - ORACLE_MARGIN / 100
    return Verdict(gain, oracle_gain, met)


def goal_tables(collected: Mapping[Identity, Mapping[int, float]], names: Mapping[str, str]) -> tuple[str, dict]:
    """The markdown of the goal (a table per method) and the verdicts by (setting, method, rule)."""
    settings = list(dict.fromkeys(i.setting for i in collected))
    methods = list(dict.fromkeys(i.method for i in collected))
    rules = list(dict.fromkeys(i.rule for i in collected))
    refs = reference_rules(rules)
    candidates = [r for r in rules if r not in refs.values()]
    verdicts: dict[tuple[str, str, str], Verdict] = {}
    misses: dict[str, int] = defaultdict(int)
    counted: dict[str, int] = defaultdict(int)
    parts = []
    for method in methods:
        header = ["setting", "none-fed (%)", "FedAvg − none-fed", *[names.get(r, r) for r in candidates]]
        if ORACLE in refs:
            header.insert(3, "oracle − best")
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for setting in settings:

            def get(rule: str, setting: str = setting, method: str = method) -> Mapping[int, float]:
                return collected.get(Identity(setting, method, rule), {})

            nf, fa = get(refs.get(NONE_FED, "")), get(refs.get(FEDAVG, ""))
            if not nf or not fa:
                continue
            oracle = get(refs.get(ORACLE, ""))
            seeds = sorted(set(nf) & set(fa))
            cells = [
                names.get(setting, setting),
                mean_std(nf[s] for s in seeds).format(),
                mean_std(fa[s] - nf[s] for s in seeds).format(signed=True),
            ]
            if ORACLE in refs:
                o = verdict(oracle, nf, fa, oracle).oracle_gain if oracle else None
                cells.append(o.format(signed=True) if o else "–")
            for rule in candidates:
                v = verdict(get(rule), nf, fa, oracle)
                verdicts[(setting, method, rule)] = v
                if v.met is None:
                    cells.append("–")
                    continue
                counted[rule] += 1
                misses[rule] += not v.met
                cells.append(v.gain.format(signed=True) + ("" if v.met else " ✗"))
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        parts.append(f"### {names.get(method, method)}\n\n" + "\n".join(lines))
    tally = ", ".join(f"{names.get(r, r)}: {counted[r] - misses[r]} of {counted[r]}" for r in candidates if counted[r])
    head = (
        "Online micro accuracy, mean ± std over the seeds; for each rule its gain over the better of none-fed and "
        f"FedAvg on the same seed (points). ✗: below −{MARGIN}, or more than {ORACLE_MARGIN} below the domain oracle "
        f"where it beats both. Goal met: {tally or 'no cell has both references'}."
    )
    return head + "\n\n" + "\n\n".join(parts) + "\n", verdicts


def gain_figures(
    verdicts: Mapping[tuple[str, str, str], Verdict], names: Mapping[str, str], out_dir: Path
) -> list[Path]:
    """``gain-<setting>.png``: per method, each rule's gain over the better of none-fed and FedAvg with its 95%
    interval, the goal's line dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedrapp_app.bench.personalization import save_small_png

    written = []
    by_setting: dict[str, list[tuple[str, str, Verdict]]] = defaultdict(list)
    for (setting, method, rule), v in verdicts.items():
        if v.met is not None:
            by_setting[setting].append((method, rule, v))
    for index, (setting, items) in enumerate(by_setting.items()):
        methods = list(dict.fromkeys(m for m, _, _ in items))
        rules = list(dict.fromkeys(r for _, r, _ in items))
        fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(methods) * max(1, len(rules)) / 2, 3.2))
        width = 0.8 / len(rules)
        for k, rule in enumerate(rules):
            xs, ys, lows, highs = [], [], [], []
            for j, method in enumerate(methods):
                v = next((v for m, r, v in items if m == method and r == rule), None)
                if v is None:
                    continue
                low, high = v.gain.ci95()
                xs.append(j + (k - (len(rules) - 1) / 2) * width)
                ys.append(100 * v.gain.mean)
                lows.append(100 * (v.gain.mean - low) if math.isfinite(low) else 0.0)
                highs.append(100 * (high - v.gain.mean) if math.isfinite(high) else 0.0)
            ax.bar(xs, ys, width, yerr=[lows, highs], capsize=2, label=names.get(rule, rule))
        ax.axhline(-MARGIN, color="grey", linestyle="--", linewidth=0.8)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(methods)), [names.get(m, m) for m in methods], fontsize=8)
        ax.set_ylabel("gain over max(none-fed, FedAvg) (points)", fontsize=8)
        ax.set_title(names.get(setting, setting), fontsize=9)
        ax.legend(fontsize=7, loc="best")
        path = out_dir / f"gain-{index:02d}-{names.get(setting, 'setting').replace(' ', '_').replace('/', '_')}.png"
        save_small_png(fig, path)
        plt.close(fig)
        written.append(path)
    return written


def write_report(bench_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """``goal.md`` and the gain figures of a bench folder's rows into ``out_dir`` (default: ``<bench>/goal``)."""
    rows = read_rows(bench_dir)
    if not rows:
        raise ValueError(f"{bench_dir}: no finished cell")
    out = Path(out_dir) if out_dir else Path(bench_dir) / "goal"
    out.mkdir(parents=True, exist_ok=True)
    names = display_names(rows)
    text, verdicts = goal_tables(collect(rows), names)
    figures = gain_figures(verdicts, names, out)
    unnamed = sorted({i for i in {identity(r["full_config"]).setting for r in rows} if i not in names})
    legend = "".join(f"- `{text}`\n" for text in unnamed)
    page = (
        f"# The goal: at or above the better of none-fed and FedAvg\n\nFrom `{bench_dir}` "
        f"(`python -m fedrapp_app.bench.goal {bench_dir}`).\n\n{text}\n"
        + (f"\nSettings without a grid label, named by their config:\n\n{legend}" if legend else "")
        + "\n"
        + "".join(f"![{p.stem}]({p.name})\n" for p in figures)
    )
    path = out / "goal.md"
    write_text_atomic(path, page)
    (out / "goal.json").write_text(
        json.dumps(
            {
                f"{names.get(s, s)} | {names.get(m, m)} | {names.get(r, r)}": {
                    "gain": v.gain.mean, "std": v.gain.std, "seeds": v.gain.n, "met": v.met,
                    "oracle_gain": None if v.oracle_gain is None else v.oracle_gain.mean,
                }
                for (s, m, r), v in verdicts.items()
            },
            indent=1,
        )
    )  # fmt: skip
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    print(write_report(args.bench_dir, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
