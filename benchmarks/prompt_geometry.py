"""The prompt-geometry benchmark of testbed candidates, and the table that compares them with the targets.

    python benchmarks/prompt_geometry.py run --model testbed --label shipped --seed 100   # validation seed
    python benchmarks/prompt_geometry.py run --model runs/candidate --label hn1 --seed 100
    python benchmarks/prompt_geometry.py compare docs/results/raw/prompt_geometry_*_s100.json

``run`` measures one checkpoint with :func:`fedrapp_app.testbed.geometry.measure_geometry` (one thread; about 10
minutes on a busy 2-core machine) and writes docs/results/raw/prompt_geometry_<label>_s<seed>.{json,md}.
``compare`` prints the headline of several runs beside the targets a real CLIP sets (docs/results/testbed.md).
Choose a candidate on a validation seed (>= 100) and report it on another (0-99).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from fedrapp_app.testbed import geometry

RAW = Path(__file__).resolve().parents[1] / "docs" / "results" / "raw"
#: (summary key, what it measures, target) in the order of the table.
HEADLINE: tuple[tuple[str, str, str], ...] = (
    ("coop_transfer", "shared CoOp prompt from one shifted domain, gain on the others", ">= -0.5 (real +1 to +3)"),
    ("adaprompt_vs_zero_shot", "AdaPrompt online vs zero-shot, shifted", "> 0"),
    ("tpt_vs_zero_shot", "TPT (episodic) vs zero-shot, shifted", "> 0 (real +3.6)"),
    ("tpt-online_vs_zero_shot", "online TPT vs zero-shot, shifted", "> 0"),
    ("coop_own_gain", "CoOp 16-shot gain in its own shifted domain", "+10 to +20 (real ~+15)"),
    ("coop_csc_transfer", "class-specific CoOp prompt from one shifted domain, on the others", "reported"),
    ("coop_mean_prompt_shifted", "mean of the shifted domains' prompts vs zero-shot, shifted", "reported"),
    ("effective_rank_differential", "effective rank, class-differential context Jacobian", ">= 15"),
    ("class_common_share", "class-common share of the Jacobian", "reported"),
    ("token_embedding_rank", "rank of the token embeddings", "reported"),
    ("random_context_shifted", "random context of a word's norm vs zero-shot, shifted", "reported"),
    ("noise_0.23_shifted", "isotropic context noise sigma 0.23 vs zero-shot, shifted", "reported"),
    ("noise_1.25_shifted", "isotropic context noise sigma 1.25 vs zero-shot, shifted", "reported"),
    ("clean_zero_shot", "clean zero-shot accuracy (%)", ">= 85"),
    ("shifted_zero_shot", "shifted zero-shot accuracy (%)", "reported"),
)


def _cell(key: str, value: float | None) -> str:
    """A share with two decimals, a rank or accuracy with one, a difference in points with its sign."""
    if value is None:
        return "-"
    if "share" in key:
        return f"{value:.2f}"
    return f"{value:.1f}" if "rank" in key or key.endswith("zero_shot") and "_vs_" not in key else f"{value:+.1f}"


def compare(paths: Sequence[Path]) -> str:
    """A markdown table: one row per headline number, one column per run (label and seed in the header)."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    labels = [f"{Path(p).stem.removeprefix('prompt_geometry_')}" for p in paths]
    lines = ["| measure | target | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(runs)]
    for key, what, target in HEADLINE:
        cells = [_cell(key, run["summary"].get(key)) for run in runs]
        lines.append(f"| {what} | {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="measure one checkpoint")
    run.add_argument("--model", default="testbed", help="'testbed' (shipped) or a checkpoint folder")
    run.add_argument("--label", required=True, help="names the raw files")
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--out", type=Path, default=RAW)
    table = sub.add_parser("compare", help="the headline of several runs")
    table.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "compare":
        print(compare(args.paths), end="")
        return
    stem = args.out / f"prompt_geometry_{args.label}_s{args.seed}"
    geometry.main(
        ["--model", str(args.model), "--seed", str(args.seed), "--json", f"{stem}.json", "--markdown", f"{stem}.md"]
    )


if __name__ == "__main__":
    main()
