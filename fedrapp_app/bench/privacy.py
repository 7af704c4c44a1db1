"""Privacy against utility from a bench's rows (issue 38): each rule's online accuracy at each privacy budget, paired
by seed with its own non-private accuracy and with none-fed's, and the inference attacks' success against ε.

    python -m fedrapp_app.bench.privacy outputs/bench/privacy --leakage outputs/leak_imcsc.json \\
        --out docs/results/privacy

A cell's **budget** is what its config says about ``dp`` (``off``; else ε, ``∞`` for the clip alone, and the clip
where it is not the default); its setting, method and rule are read from the rest of its config as the goal report
does (``bench/goal.py``), so grids that label their axes differently land in the same table. The goal: the trust
option within ``GOAL_DROP`` points of its own non-private accuracy at ε = ``GOAL_EPSILON`` and still above none-fed
(non-private; none-fed under dp predicts with the client's exact prompt, so it is the same). Writes ``privacy.md``
(a table per setting and method, the goal's verdicts), ``privacy.json`` and ``privacy-utility.png``; with
``--leakage`` (``benchmarks/upload_leakage.py``'s JSON files) also ``leakage.png`` and its table.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedrapp_app.bench.goal import Identity, display_names, identity
from fedrapp_app.bench.rows import read_rows, write_text_atomic
from fedrapp_app.bench.schema import SEED_AXIS
from fedrapp_app.bench.stats import Stat, mean_std
from fedrapp_app.config import DEFAULTS

#: The config keys of the privacy group: they make a cell's budget, not its setting.
PRIVACY_KEYS = ("dp", "dp-epsilon", "dp-delta", "dp-clip")
#: The goal (points of accuracy, and the budget it is stated at).
GOAL_DROP, GOAL_EPSILON = 2.0, "8"
OFF, CLIP_ONLY = "off", "∞"
#: The trust option's rule text and none-fed's (``goal.identity``'s canonical texts).
TRUST, NONE_FED = "strategy=fedrapp trust=True", "strategy=none-fed"
#: The attacks of ``benchmarks/upload_leakage.py``: their JSON key, name and chance level.
ATTACKS = {
    "pair_auc": ("pairs in one domain (AUC)", 0.5),
    "domain_accuracy": ("each client's domain (accuracy)", 0.25),
    "class_precision": ("top-3 classes, class-specific context (precision)", 0.1),
}


def budget(config: Mapping[str, Any]) -> str:
    """A cell's privacy budget in words: ``off``, ``∞`` (clip only) or ε, with the clip where it is not the default."""
    if not config.get("dp", False):
        return OFF
    epsilon = float(config.get("dp-epsilon", DEFAULTS["dp-epsilon"]))
    text = CLIP_ONLY if math.isinf(epsilon) else f"{epsilon:g}"
    clip = config.get("dp-clip", DEFAULTS["dp-clip"])
    return text if clip == DEFAULTS["dp-clip"] else f"{text}, clip {clip:g}"


def _order(text: str) -> tuple[int, float, str]:
    """Budgets from the weakest protection to the strongest: off, ∞, then ε falling."""
    if text == OFF:
        return (0, 0.0, text)
    head = text.split(",")[0]
    return (1, 0.0, text) if head == CLIP_ONLY else (2, -float(head), text)


def collect(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[Identity, str], dict[int, float]]:
    """Micro accuracy (fraction) of each finished cell, by (identity without the privacy keys, budget) and seed."""
    out: dict[tuple[Identity, str], dict[int, float]] = defaultdict(dict)
    for row in rows:
        summary = row.get("summary") or {}
        if row.get("status", "ok") != "ok" or summary.get("micro_accuracy") is None:
            continue
        config = row["full_config"]
        ident = identity({k: v for k, v in config.items() if k not in PRIVACY_KEYS})
        out[(ident, budget(config))][int(config[SEED_AXIS])] = float(summary["micro_accuracy"])
    return out


def names_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """A display name for each setting, method and rule text: a grid label that names it (``goal.display_names``, on the
    configs without their privacy keys)."""
    stripped = [
        {**row, "full_config": {k: v for k, v in row["full_config"].items() if k not in PRIVACY_KEYS}} for row in rows
    ]
    return display_names(stripped)


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> Stat:
    """``a − b`` over the seeds both have."""
    return mean_std(a[s] - b[s] for s in sorted(set(a) & set(b)))


def privacy_tables(collected: Mapping[tuple[Identity, str], Mapping[int, float]], names: Mapping[str, str]):
    """The markdown of every (setting, method) table and the goal's verdicts, and the data behind them."""
    cells: dict[tuple[str, str], dict[str, dict[str, Mapping[int, float]]]] = defaultdict(lambda: defaultdict(dict))
    for (ident, spent), accuracy in collected.items():
        cells[(ident.setting, ident.method)][ident.rule][spent] = accuracy
    lines, data, verdicts = [], [], []
    for (setting, method), rules in sorted(cells.items()):
        budgets = sorted({b for by_budget in rules.values() for b in by_budget}, key=_order)
        name = f"{names.get(setting, setting)}, {names.get(method, method)}"
        lines += [
            f"### {name}",
            "",
            "| rule | " + " | ".join(f"ε = {b}" if b != OFF else "no dp" for b in budgets) + " |",
        ]
        lines.append("|---|" + "---|" * len(budgets))
        none_fed = rules.get(NONE_FED, {}).get(OFF, {})
        for rule in sorted(rules, key=lambda r: (r != NONE_FED, r)):
            by_budget, own = rules[rule], rules[rule].get(OFF, {})
            row = []
            for spent in budgets:
                accuracy = by_budget.get(spent)
                if accuracy is None:
                    row.append("–")
                    continue
                text = mean_std(accuracy.values()).format()
                if spent != OFF and own:
                    text += f" ({paired(accuracy, own).format(signed=True)})"
                row.append(text)
                data.append(
                    {
                        "setting": names.get(setting, setting),
                        "method": names.get(method, method),
                        "rule": names.get(rule, rule),
                        "budget": spent,
                        "accuracy": mean_std(accuracy.values()).mean,
                        "drop": paired(accuracy, own).mean if spent != OFF and own else None,
                        "vs_none_fed": paired(accuracy, none_fed).mean if none_fed else None,
                        "seeds": len(accuracy),
                    }
                )
            lines.append(f"| {names.get(rule, rule)} | " + " | ".join(row) + " |")
            if rule == TRUST and GOAL_EPSILON in by_budget and own and none_fed:
                drop, above = paired(by_budget[GOAL_EPSILON], own), paired(by_budget[GOAL_EPSILON], none_fed)
                holds = [b for b in budgets if b != OFF and b in by_budget and _goal(by_budget[b], own, none_fed)]
                met = _goal(by_budget[GOAL_EPSILON], own, none_fed)
                verdicts.append(
                    f"| {name} | {drop.format(signed=True)} | {above.format(signed=True)} | {'yes' if met else 'no'} "
                    f"| {', '.join(holds) or 'none'} |"
                )
        lines += ["", "Accuracy in %, mean ± std over seeds; in brackets the change from the same rule without dp, "
                  "paired by seed (points).", ""]  # fmt: skip
    goal = [
        f"| setting, method | trust option at ε = {GOAL_EPSILON} − without dp | − none-fed | goal met | budgets where "
        "both hold |",
        "|---|---|---|---|---|",
        *verdicts,
    ]
    return "\n".join(lines), "\n".join(goal), data


def _goal(accuracy: Mapping[int, float], own: Mapping[int, float], none_fed: Mapping[int, float]) -> bool:
    return paired(accuracy, own).mean >= -GOAL_DROP / 100 and paired(accuracy, none_fed).mean > 0


def utility_figure(data: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Accuracy against the budget, one panel per (setting, method), a line per rule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(d["setting"], d["method"]) for d in data})
    budgets = sorted({d["budget"] for d in data}, key=_order)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), squeeze=False)
    for ax, (setting, method) in zip(axes[0], panels, strict=True):
        for rule in sorted({d["rule"] for d in data if (d["setting"], d["method"]) == (setting, method)}):
            mine = (setting, method, rule)
            points = {d["budget"]: d["accuracy"] for d in data if (d["setting"], d["method"], d["rule"]) == mine}
            if len(points) == 1 and OFF in points:
                ax.axhline(100 * points[OFF], color="grey", linestyle="--", linewidth=1, label=f"{rule} (no dp)")
                continue
            xs = [i for i, b in enumerate(budgets) if b in points]
            ax.plot(xs, [100 * points[budgets[i]] for i in xs], marker="o", markersize=3, label=rule)
        ax.set_xticks(range(len(budgets)), ["no dp" if b == OFF else b for b in budgets], fontsize=7)
        ax.set_title(f"{setting}, {method}", fontsize=8)
        ax.set_xlabel("ε (δ = 1e-5)", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("online accuracy (%)", fontsize=8)
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def leakage_table(results: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The attacks' scores (mean ± std over target seeds) per (method, ε) from ``upload_leakage.py``'s JSON."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for result in results:
        groups[(str(result["method"]), str(result["epsilon"]))].append(result)
    lines = ["| method | ε | " + " | ".join(f"{name} (chance {chance:g})" for name, chance in ATTACKS.values()) + " |"]
    lines.append("|---|---|" + "---|" * len(ATTACKS))
    data = []
    for (method, epsilon), cell in sorted(groups.items(), key=lambda kv: (kv[0][0], _leak_order(kv[0][1]))):
        stats = {key: mean_std(r.get(key) for r in cell) for key in ATTACKS}
        shown = "no dp" if epsilon == "inf" else epsilon
        lines.append(f"| {method} | {shown} | " + " | ".join(s.format(scale=1.0) for s in stats.values()) + " |")
        data.append({"method": method, "epsilon": epsilon, **{k: s.mean for k, s in stats.items() if s.n}})
    return "\n".join(lines), data


def _leak_order(epsilon: str) -> float:
    return -math.inf if epsilon == "inf" else -float(epsilon)


def leakage_figure(data: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Each attack's success against ε (no dp at the left), a line per method, chance dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epsilons = sorted({d["epsilon"] for d in data}, key=_leak_order)
    methods = sorted({d["method"] for d in data})
    colours = {method: f"C{i}" for i, method in enumerate(methods)}  # one colour per method in every panel
    fig, axes = plt.subplots(1, len(ATTACKS), figsize=(3.6 * len(ATTACKS), 3.1))
    for ax, (key, (name, chance)) in zip(axes, ATTACKS.items(), strict=True):
        for method in methods:
            points = {d["epsilon"]: d[key] for d in data if d["method"] == method and key in d}
            xs = [i for i, e in enumerate(epsilons) if e in points]
            if xs:
                ax.plot(xs, [points[epsilons[i]] for i in xs], marker="o", markersize=3, color=colours[method],
                        label=method)  # fmt: skip
        ax.axhline(chance, color="grey", linestyle="--", linewidth=1, label="chance")
        ax.set_xticks(range(len(epsilons)), ["no dp" if e == "inf" else e for e in epsilons], fontsize=7)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("ε (δ = 1e-5)", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(
    bench_dir: str | Path, out_dir: str | Path, leakage: str | Path | Sequence[str | Path] | None = None
) -> Path:
    """Write ``privacy.md``, ``privacy.json`` and the figures into ``out_dir``; returns the markdown's path.
    ``leakage``: one or several JSON files of ``benchmarks/upload_leakage.py`` (their results together)."""
    rows = read_rows(bench_dir)
    if not rows:
        raise SystemExit(f"{bench_dir}: no finished cell (run the grid first: python -m fedrapp_app.bench ...)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables, goal, data = privacy_tables(collect(rows), names_of(rows))
    utility_figure(data, out / "privacy-utility.png")
    parts = [
        "# Privacy against utility (generated)",
        "",
        f"Written by `python -m fedrapp_app.bench.privacy {bench_dir}`. Online micro accuracy, mean ± std over seeds.",
        "",
        f"## The goal: the trust option within {GOAL_DROP:g} points of its accuracy without dp at ε = "
        f"{GOAL_EPSILON}, above none-fed",
        "",
        goal,
        "",
        "## Every cell",
        "",
        "![accuracy against ε](privacy-utility.png)",
        "",
        tables,
    ]
    payload: dict[str, Any] = {"bench": str(bench_dir), "cells": data}
    if leakage:
        files = [leakage] if isinstance(leakage, str | Path) else list(leakage)
        table, leaks = leakage_table([r for f in files for r in json.loads(Path(f).read_text())])
        leakage_figure(leaks, out / "leakage.png")
        parts += [
            "## What an upload leaks",
            "",
            "From " + ", ".join(f"`{f}`" for f in files) + ".",
            "",
            table,
            "",
            "![attacks against ε](leakage.png)",
        ]
        payload["leakage"] = leaks
    write_text_atomic(out / "privacy.json", json.dumps(payload, indent=1, default=str))
    path = out / "privacy.md"
    write_text_atomic(path, "\n".join(parts) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("bench_dir", type=Path, help="a bench output folder (its cells.jsonl)")
    parser.add_argument("--out", type=Path, required=True, help="folder for privacy.md, privacy.json, figures")
    parser.add_argument("--leakage", type=Path, nargs="+", help="benchmarks/upload_leakage.py's JSON file(s)")
    args = parser.parse_args(argv)
    print(write_report(args.bench_dir, args.out, args.leakage))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
