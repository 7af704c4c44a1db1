"""``python -m fedrapp_app.bench.trainingfree <bench-dir>``: training-free methods beside prompt sharing.

Reads ``<bench-dir>/cells.jsonl`` of ``conf/bench/training-free.yaml`` (grids ``X`` with the training-free methods
under none-fed and ``X-tuned`` / ``X-csc`` with AdaPrompt and AdaPrompt+TDA under none-fed, FedRAPP and
FedRAPP's trust option, for settings X) and each cell's ``rounds.jsonl`` (the clients' step times), and writes
``training-free.md``: per setting, every (method, rule)'s online micro accuracy (mean ± std over seeds), its
gain over TDA alone and over its own method under none-fed (paired by seed, with the 95% interval), and the
client step time (``t-adapt``: the method's ``adapt``, mean over steps and seeds) relative to zero-shot in the
same bench run; then one summary table over the settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedrapp_app.bench.rows import report_input, report_main, write_text_atomic
from fedrapp_app.bench.stats import Stat, mean_std

#: The reference every gain is taken against (a training-free method under none-fed).
REFERENCE = ("tda", "none-fed")
#: The grid label of the zero-shot row (the cost reference).
ZEROSHOT = ("zeroshot", "none-fed")
#: Table order: the training-free methods first, then the rest as the bench file lists them.
FIRST = ("zeroshot", "ensemble", "tda", "zero")


def ordered(keys: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(method, rule) keys with the training-free methods first (:data:`FIRST`), otherwise in the given order."""
    keys = list(dict.fromkeys(keys))
    rank = {name: i for i, name in enumerate(FIRST)}
    return sorted(keys, key=lambda k: (rank.get(k[0], len(FIRST)), keys.index(k)))


def setting_of(grid: str) -> str:
    """The setting a grid belongs to: ``S1-tuned`` and ``S1-csc`` -> ``S1`` (the same streams)."""
    return grid.partition("-")[0]


def step_seconds(run_dir: str | Path) -> float | None:
    """Mean ``t-adapt`` (seconds of the method's adapt per client step) of a run's ok rows; None without any."""
    path = Path(run_dir) / "rounds.jsonl"
    if not path.is_file():
        return None
    times = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        value = row.get("client_metrics", {}).get("t-adapt")
        if row.get("status") == "ok" and value is not None:
            times.append(float(value))
    return float(np.mean(times)) if times else None


def collect(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[tuple[str, str], dict[int, dict[str, float]]]]:
    """setting -> (method, rule) -> seed -> {"acc": micro accuracy, "step": mean t-adapt or NaN}."""
    out: dict[str, dict[tuple[str, str], dict[int, dict[str, float]]]] = {}
    for row in rows:
        if row.get("status") != "ok":
            continue
        for grid, member in row["grids"].items():
            labels = member["labels"]
            key = (str(labels["method"]), str(labels["rule"]))
            seed = int(row["config"]["seed"])
            step = step_seconds(row["run_dir"]) if row.get("run_dir") else None
            entry = {"acc": float(row["summary"]["micro_accuracy"]), "step": float("nan") if step is None else step}
            out.setdefault(setting_of(grid), {}).setdefault(key, {})[seed] = entry
    return out


def paired(cells: Mapping[int, Mapping[str, float]], reference: Mapping[int, Mapping[str, float]] | None) -> Stat:
    """Mean ± std over the shared seeds of acc(cells) − acc(reference)."""
    if not reference:
        return Stat(float("nan"), float("nan"), 0)
    return mean_std(cells[s]["acc"] - reference[s]["acc"] for s in sorted(set(cells) & set(reference)))


def setting_table(name: str, cells: Mapping[tuple[str, str], Mapping[int, Mapping[str, float]]]) -> str:
    """The markdown table of one setting."""
    zeroshot = cells.get(ZEROSHOT)
    zero_step = mean_std(v["step"] for v in zeroshot.values()).mean if zeroshot else float("nan")
    lines = [
        f"### {name}",
        "",
        "| method | rule | accuracy (%) | vs TDA alone | 95% interval | vs its none-fed | step (ms) | × zero-shot |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, rule in ordered(list(cells)):
        by_seed = cells[(method, rule)]
        accuracy = mean_std(v["acc"] for v in by_seed.values())
        versus_tda = paired(by_seed, cells.get(REFERENCE)) if (method, rule) != REFERENCE else None
        own = paired(by_seed, cells.get((method, "none-fed"))) if rule != "none-fed" else None
        step = mean_std(v["step"] for v in by_seed.values())
        ratio = step.mean / zero_step if np.isfinite(zero_step) and zero_step > 0 else float("nan")
        lines.append(
            f"| {method} | {rule} | {accuracy.format()} | {versus_tda.format(signed=True) if versus_tda else '–'} | "
            f"{versus_tda.format_ci95() if versus_tda else '–'} | {own.format(signed=True) if own else '–'} | "
            f"{step.format(scale=1000.0, digits=0)} | {ratio:.1f} |"
        )
    return "\n".join(lines)


def summary_table(collected: Mapping[str, Mapping[tuple[str, str], Mapping[int, Mapping[str, float]]]]) -> str:
    """Accuracy (mean over seeds) of every (method, rule) in every setting, one column per setting."""
    settings = list(collected)
    keys = ordered([k for cells in collected.values() for k in cells])
    lines = ["| method | rule | " + " | ".join(settings) + " |", "|---|---|" + "---|" * len(settings)]
    for method, rule in keys:
        values = []
        for setting in settings:
            by_seed = collected[setting].get((method, rule))
            values.append(mean_std(v["acc"] for v in by_seed.values()).format() if by_seed else "–")
        lines.append(f"| {method} | {rule} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def write_report(bench_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write ``training-free.md`` (module docstring) and return its path."""
    rows, out = report_input(bench_dir, out_dir, "training-free")
    collected = collect(rows)
    if not collected:
        raise ValueError(
            f"{bench_dir}: no finished cell has 'method' and 'rule' labels (conf/bench/training-free.yaml)"
        )
    seeds = sorted({s for cells in collected.values() for by in cells.values() for s in by})
    parts = [
        "# Training-free methods beside prompt sharing (generated)",
        "",
        f"Written by `python -m fedrapp_app.bench.trainingfree {bench_dir}`. Online micro accuracy over each "
        f"run's stream, mean ± std over seeds {seeds}; gains paired by seed. Step: the client's `adapt` per batch "
        "of 64 (`t-adapt`), mean over steps and seeds, relative to zero-shot in the same bench run.",
        "",
        "## All settings",
        "",
        summary_table(collected),
        "",
    ]
    parts += [setting_table(name, cells) + "\n" for name, cells in collected.items()]
    path = out / "training-free.md"
    write_text_atomic(path, "\n".join(parts))
    return path


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, "python -m fedrapp_app.bench.trainingfree", __doc__, write_report, "training-free")


if __name__ == "__main__":
    raise SystemExit(main())
