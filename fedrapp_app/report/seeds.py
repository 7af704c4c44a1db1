"""One experiment over several seeds (``fedrapp-sim --seeds``): each seed's numbers and their mean with a 95% interval.

Reads the seeds' run folders alone (``report/runs.py``), like every report, and writes ``report.md`` and
``seeds.json`` into the given folder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from fedrapp_app.bench.rows import write_text_atomic
from fedrapp_app.bench.stats import ACCURACY, Stat, mean_std, t975
from fedrapp_app.config.privacy import privacy_words
from fedrapp_app.recording.results import outcome_summary
from fedrapp_app.report.runs import load_run
from fedrapp_app.report.tables import client_stats, totals


def _cell(stat: Stat) -> str:
    """``mean ± std [low, high]`` of an accuracy over seeds: the 95% interval cut to 0-100, unsigned."""
    return f"{stat.format()} {stat.format_ci95(signed=False, bounds=ACCURACY)}" if stat.n > 1 else stat.format()


def write_seeds_report(run_dirs: Sequence[Path], out: Path) -> Path:
    """``report.md`` (a row per seed, then the mean ± std and the 95% t interval over the seeds) and ``seeds.json``
    of the runs in ``run_dirs`` into ``out``; returns the page's path."""
    runs = [load_run(Path(d)) for d in run_dirs]
    rows, numbers = [], []
    for run in runs:
        t = totals(client_stats(run), run)
        o = outcome_summary(run.rows)
        entry = {
            "seed": run.config.get("seed"),
            "run": str(run.path),
            "complete": run.complete,
            "micro_accuracy": t.micro,
            "macro_accuracy": t.macro,
            "micro_accuracy_received_prompt": t.micro_received,
            "ece": o["ece"],
            **{f"accuracy {d}": acc for d, acc in o["per_domain_accuracy"].items()},
        }
        numbers.append(entry)
    keys = [k for k in numbers[0] if k not in ("seed", "run", "complete")]
    for entry in numbers:
        shown = ["–" if entry.get(k) is None else f"{100 * entry[k]:.2f}" for k in keys]
        rows.append(f"| {entry['seed']} | {'yes' if entry['complete'] else '**no**'} | " + " | ".join(shown) + " |")
    stats = {k: mean_std(entry.get(k) for entry in numbers) for k in keys}
    header = "| seed | complete | " + " | ".join(f"{k.replace('_', ' ')} (%)" for k in keys) + " |"
    mean_row = "| mean ± std [95% interval] | | " + " | ".join(_cell(stats[k]) for k in keys) + " |"
    first = runs[0]
    seeds = ", ".join(str(entry["seed"]) for entry in numbers)
    privacy = privacy_words(first.config)
    few = (
        f" With {len(runs)} seeds the interval is wide (t = {t975(len(runs) - 1):.1f}): more seeds narrow it."
        if 1 < len(runs) < 4
        else ""
    )
    page = (
        f"# {first.setting}: {len(runs)} seeds ({seeds})\n\n"
        + (f"Every run under client-level differential privacy: {privacy} (docs/privacy.md).\n\n" if privacy else "")
        + "Each seed's run has its own report (`<run>/report/report.md`). Online accuracy counts each sample once, "
        "after the client adapted on its batch; the interval is Student's t over the seeds, cut to 0-100."
        + few
        + "\n\n"
        + header
        + "\n|"
        + "---|" * (len(keys) + 2)
        + "\n"
        + "\n".join(rows)
        + "\n"
        + mean_row
        + "\n\nRuns: "
        + ", ".join(f"`{r.path}`" for r in runs)
        + "\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    write_text_atomic(path, page)
    summary = {
        k: {"mean": s.mean, "std": s.std, "seeds": s.n, "ci95": list(s.ci95(ACCURACY))} for k, s in stats.items()
    }
    (out / "seeds.json").write_text(json.dumps({"seeds": numbers, "over_seeds": summary}, indent=1))
    return path
