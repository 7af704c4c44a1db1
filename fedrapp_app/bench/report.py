"""``python -m fedrapp_app.bench.report <bench-dir>``: tables and figures of a benchmark from its rows alone.

Writes into ``<bench-dir>/report`` (or ``--out``): ``report.md`` (per grid: a pivot of the micro online
accuracy, then every number), ``settings.csv`` (one line per setting), ``cells.csv`` (one line per cell),
``curves-*.png`` (per-round accuracy per context), ``gains-*.png`` (paired gains over none-fed with 95%
intervals) and ``fedrapp-*.png`` (r, mu, gamma, same-domain peer share per client for the first seed of
each FedRAPP setting). Only ``cells.jsonl`` is read.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedrapp_app.bench.plots import curves_figure, fedrapp_figure, gains_figure
from fedrapp_app.bench.rows import read_rows, report_main, write_text_atomic
from fedrapp_app.bench.stats import Setting, Stat, best_settings, by_key, fedrapp_signals, settings_of

COLUMNS = (
    ("micro_accuracy", "online acc. (micro)"),
    ("macro_accuracy", "online acc. (macro)"),
    ("micro_accuracy_received_prompt", "received prompt, before adaptation (micro)"),
)


def _slug(*parts: str) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9.]+", "_", p).strip("_") for p in parts if p)


def _bold(text: str, on: bool) -> str:
    return f"**{text}**" if on and text != "–" else text


def _fixed_settings(settings: Sequence[Setting]) -> dict[str, Any]:
    """Overrides that every cell of these settings shares (what the grid holds fixed)."""
    configs = [row["config"] for s in settings for row in s.rows]
    shared = dict(configs[0])
    for config in configs[1:]:
        shared = {k: v for k, v in shared.items() if k in config and config[k] == v}
    return shared


def _label(s: Setting) -> str:
    return s.method + (" (oracle)" if s.oracle else "")


def _seconds(stat: Stat) -> str:
    return f"{stat.mean:.1f}" if stat.mean < 10 else f"{stat.mean:.0f}"


def _gain_text(gain: Stat | None) -> str:
    return "" if gain is None else gain.format(signed=True)


def _partial(text: str, n: int, seeds: int) -> str:
    """Flag a value over fewer seeds than the grid has (a grid still running): ``"40.41 (1 of 3 seeds)"``."""
    return f"{text} ({n} of {seeds} seeds)" if 0 < n < seeds and text not in ("", "–") else text


def grid_markdown(
    settings: Sequence[Setting], best: set[int], index: Mapping[str, Any], figures: Mapping[str, str], offset: int
) -> str:
    """One grid's section: fixed settings, the micro-accuracy pivot, the full table and its figures."""
    grid = settings[0].grid
    out = io.StringIO()
    seeds = sorted({row["config"].get("seed", 0) for s in settings for row in s.rows})
    fixed = ", ".join(f"`{k}={v}`" for k, v in _fixed_settings(settings).items() if k != "seed")
    out.write(
        f"## Grid `{grid}`\n\nSeeds: {', '.join(map(str, seeds))}. Fixed in every cell: {fixed or 'defaults'}."
        " Values are top-1 accuracy in %, mean ± sample std over seeds; **bold** marks the best "
        "non-oracle method of each column (micro online accuracy) among those with every seed.\n\n"
    )

    contexts = list(dict.fromkeys(s.context_name for s in settings))
    methods = list(dict.fromkeys(_label(s) for s in settings))
    cell = {(s.context_name, _label(s)): (offset + i, s) for i, s in enumerate(settings)}
    out.write("### Online accuracy (micro), mean ± std over seeds\n\n")
    out.write("| method | " + " | ".join(contexts) + " |\n|---|" + "---|" * len(contexts) + "\n")
    for method in methods:
        entries = []
        for context in contexts:
            if (context, method) not in cell:
                entries.append("")
                continue
            i, s = cell[(context, method)]
            entries.append(_partial(_bold(s.metric("micro_accuracy").format(), i in best), len(s.rows), len(seeds)))
        out.write(f"| {method} | " + " | ".join(entries) + " |\n")

    gains = [(s, s.gain(index)) for s in settings]
    if any(g is not None and g.n for _, g in gains):
        out.write("\n### Gain over none-fed (paired by seed, micro online accuracy, points)\n\n")
        out.write("| method | " + " | ".join(contexts) + " |\n|---|" + "---|" * len(contexts) + "\n")
        gain_of = {(s.context_name, _label(s)): g for s, g in gains}
        for method in methods:
            row = [
                _partial(_gain_text(g), g.n, len(seeds)) if (g := gain_of.get((c, method))) else "" for c in contexts
            ]
            if any(row):
                out.write(f"| {method} | " + " | ".join(row) + " |\n")

    context_axes = list(settings[0].context)
    headers = [
        *context_axes,
        "method",
        *(name for _, name in COLUMNS),
        "Δ micro vs none-fed",
        "Δ 95% CI (t over seeds)",
        "peer weight on own domain (%)",
        "seeds",
        "s / cell",
    ]
    out.write("\n### All numbers\n\n| " + " | ".join(headers) + " |\n")
    out.write("|" + "---|" * len(headers) + "\n")
    for i, (s, gain) in enumerate(gains):
        values = [s.metric(key).format() for key, _ in COLUMNS]
        values[0] = _bold(values[0], offset + i in best)
        share = s.same_domain_share().format(digits=0)
        interval = "" if gain is None else gain.format_ci95()
        out.write(
            "| "
            + " | ".join(
                [
                    *s.context.values(),
                    _label(s),
                    *values,
                    _gain_text(gain),
                    interval,
                    share,
                    str(len(s.rows)),
                    _seconds(s.seconds()),
                ]
            )
            + " |\n"
        )
    out.write(_signals_markdown(settings))
    for context in contexts:
        if context in figures:
            out.write(f"\n![{grid}: {context}]({figures[context]})\n")
    return out.getvalue()


def _signals_markdown(settings: Sequence[Setting]) -> str:
    """FedRAPP's server signals per FedRAPP setting (empty when the grid has none)."""
    lines = []
    for s in settings:
        sig = fedrapp_signals(s.rows) if s.strategy == "fedrapp" else None
        if sig is None:
            continue
        corr = [f"{v:+.2f}" if math.isfinite(v) else "–" for v in (sig.r_vs_gain, sig.drop_vs_gain)]
        lines.append(
            "| "
            + " | ".join(
                [
                    s.context_name,
                    _label(s),
                    str(sig.pairs),
                    f"{100 * sig.update_share:.0f}",
                    f"{sig.update_norm:.3f}",
                    f"{100 * sig.norm_cv:.1f}",
                    f"{100 * sig.in_round_gain:+.2f}",
                    *corr,
                    f"{sig.mu_std:.3f}",
                    f"{sig.gamma:.2f}",
                ]
            )
            + " |\n"
        )
    if not lines:
        return ""
    headers = [
        "context",
        "method",
        "updates",
        "rounds with an update (%)",
        "mean ‖Δ‖",
        "‖Δ‖ spread in a round (CV, %)",
        "in-round gain (points)",
        "corr(r, gain)",
        "corr(H drop, gain)",
        "std μ",
        "mean γ",
    ]
    return (
        "\n### FedRAPP's signals, pooled over seeds\n\nPer (client, round) with an update: the in-round gain is "
        "the accuracy after minus before the client's local step on that batch; the correlations (centred "
        "within each round, as r's z-scores are) say whether r and the entropy drop pick the updates that "
        "helped (0: no information).\n\n| "
        + " | ".join(headers)
        + " |\n|"
        + "---|" * len(headers)
        + "\n"
        + "".join(lines)
    )


def settings_records(settings: Sequence[Setting], best: set[int], index: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One CSV record per setting (axes as columns, empty where a grid lacks the axis)."""
    records = []
    for i, s in enumerate(settings):
        record: dict[str, Any] = {"grid": s.grid, **s.context, "method": s.method, "strategy": s.strategy}
        for key, _ in COLUMNS:
            stat = s.metric(key)
            record[f"{key}_mean"], record[f"{key}_std"] = stat.mean, stat.std
        gain = s.gain(index)
        record["gain_vs_none_fed_mean"] = gain.mean if gain else ""
        record["gain_vs_none_fed_std"] = gain.std if gain else ""
        low, high = gain.ci95() if gain else ("", "")
        record["gain_vs_none_fed_ci95_low"], record["gain_vs_none_fed_ci95_high"] = low, high
        share = s.same_domain_share()
        record.update(
            same_domain_share_mean=share.mean,
            seeds=len(s.rows),
            seconds_mean=s.seconds().mean,
            best=i in best,
            oracle=s.oracle,
        )
        records.append(record)
    return records


def _csv_text(records: Sequence[Mapping[str, Any]]) -> str:
    columns = list(dict.fromkeys(k for r in records for k in r))
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def cell_records(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One CSV record per cell: id, overrides (JSON) and summary numbers."""
    return [
        {
            "key": r["key"],
            "id": r["id"],
            "config": json.dumps(r["config"], sort_keys=True),
            **{k: r["summary"][k] for k, _ in COLUMNS},
            "samples": r["summary"]["samples"],
            "rounds": r["summary"]["rounds"],
            "seconds": r["seconds"],
        }
        for r in rows
    ]


def write_gain_figures(settings: Sequence[Setting], index: Mapping[str, Any], out_dir: Path) -> dict[str, str]:
    """One gain dot plot per grid whose settings have paired gains over at least 2 seeds; grid -> file name."""
    per_grid: dict[str, dict[str, list[tuple[str, Stat]]]] = {}
    for s in settings:
        gain = s.gain(index)
        if gain is not None and gain.n >= 2:
            per_grid.setdefault(s.grid, {}).setdefault(s.context_name, []).append((_label(s), gain))
    names = {}
    for grid, gains in per_grid.items():
        names[grid] = f"gains-{_slug(grid)}.png"
        gains_figure(gains, f"{grid}: gain over none-fed", out_dir / names[grid])
    return names


def write_figures(settings: Sequence[Setting], out_dir: Path) -> tuple[dict[tuple[str, str], str], list[str]]:
    """Curves per (grid, context) and FedRAPP diagnostics per FedRAPP setting; returns their file names."""
    figures: dict[tuple[str, str], str] = {}
    diagnostics: list[str] = []
    groups: dict[tuple[str, str], list[Setting]] = {}
    for s in settings:
        groups.setdefault((s.grid, s.context_name), []).append(s)
    drawn: set[str] = set()
    for (grid, context), members in groups.items():
        name = f"curves-{_slug(grid, context)}.png"
        curves_figure(members, f"{grid}: {context} (mean over seeds)", out_dir / name)
        figures[(grid, context)] = name
        for s in members:
            row = s.rows[0]
            if s.strategy != "fedrapp" or row["key"] in drawn:
                continue
            drawn.add(row["key"])
            seed = row["config"].get("seed", 0)
            name = f"fedrapp-{_slug(grid, context, s.method)}.png"
            fedrapp_figure(row, f"{grid}: {context}, {s.method}, seed {seed}", out_dir / name)
            diagnostics.append(name)
    return figures, diagnostics


def write_report(bench_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Regenerate every table and figure of ``bench_dir`` from its ``cells.jsonl``; return the report path."""
    bench_dir = Path(bench_dir)
    rows = read_rows(bench_dir)
    if not rows:
        raise FileNotFoundError(
            f"no finished cells in {bench_dir / 'cells.jsonl'}: run the grid first "
            "(python -m fedrapp_app.bench <bench.yaml>)"
        )
    out = Path(out_dir) if out_dir else bench_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    settings = settings_of(rows)
    best = best_settings(settings)
    index = by_key(rows)
    figures, diagnostics = write_figures(settings, out)
    gain_figures = write_gain_figures(settings, index, out)

    text = io.StringIO()
    text.write(
        f"# Benchmark `{bench_dir.name}`\n\nRegenerate: `python -m fedrapp_app.bench.report {bench_dir}` "
        f"({len(rows)} cells). Online accuracy counts each sample once, predicted in the round it arrived "
        'after the client\'s local adaptation (as in the paper); "received prompt" scores the prompt the '
        "server sent, before adaptation.\n\n"
    )
    grids = list(dict.fromkeys(s.grid for s in settings))
    for grid in grids:
        members = [(i, s) for i, s in enumerate(settings) if s.grid == grid]
        offset = members[0][0]
        grid_figures = {c: name for (g, c), name in figures.items() if g == grid}
        text.write(grid_markdown([s for _, s in members], best, index, grid_figures, offset))
        if grid in gain_figures:
            text.write(f"\n![{grid}: gain over none-fed]({gain_figures[grid]})\n")
        text.write("\n")
    if diagnostics:
        text.write("## FedRAPP per-client diagnostics (first seed)\n\n")
        text.write("".join(f"- [{name}]({name})\n" for name in diagnostics))
    report = out / "report.md"
    write_text_atomic(report, text.getvalue())
    write_text_atomic(out / "settings.csv", _csv_text(settings_records(settings, best, index)))
    write_text_atomic(out / "cells.csv", _csv_text(cell_records(rows)))
    return report


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, "python -m fedrapp_app.bench.report", __doc__, write_report, "report")


if __name__ == "__main__":
    sys.exit(main())
