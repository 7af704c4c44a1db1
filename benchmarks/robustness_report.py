"""Honest clients' online accuracy under adversarial uploads, from a robustness bench directory.

    python benchmarks/robustness_report.py outputs/bench/robustness docs/results/robustness.md

Reads only the bench rows (``cells.jsonl``: per-client curves of every cell, under ``clients``) and writes
markdown tables (online accuracy, and accuracy of the received prompt before adaptation):
for each server rule (rows) and attack setting (columns), the micro online accuracy over the clients that
are honest in every setting of the grid (every client named in some ``attack-clients`` is left out of every
column, so all columns score the same clients), mean ± std over seeds, and its change from the same rule
without attack. A local-only rule (none-fed) must read the same in every column: a sanity check.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedrapp_app.bench.rows import read_rows
from fedrapp_app.config import attack_clients


def attackers_of(rows: list[dict]) -> set[int]:
    """Every client that is an attacker in at least one row."""
    return {c for row in rows for c in attack_clients(str(row["config"].get("attack-clients", "")))}


def honest_accuracy(row: dict, attackers: set[int], curve: str = "acc") -> float:
    """Micro accuracy of the clients not in ``attackers``, from a row's per-client curves.

    ``curve="acc"``: online accuracy (after adapting); ``"acc_before"``: of the prompt the server sent,
    before the client adapted on the batch (what the aggregation itself delivered).
    """
    correct = seen = 0.0
    for client, block in row["clients"].items():
        if int(client) in attackers:
            continue
        correct += sum(a * n for a, n in zip(block[curve], block["n"], strict=True))
        seen += sum(block["n"])
    return correct / seen


def table(rows: list[dict], curve: str = "acc") -> str:
    by_cell: dict[tuple[str, str], list[float]] = defaultdict(list)
    strategies, attacks = [], []
    attackers = attackers_of(rows)
    for row in rows:
        labels = row["grids"]["robustness"]["labels"]
        strategy, attack = labels["strategy"], labels["attack"]
        strategies += [strategy] if strategy not in strategies else []
        attacks += [attack] if attack not in attacks else []
        by_cell[(strategy, attack)].append(100 * honest_accuracy(row, attackers, curve))
    lines = ["| rule | " + " | ".join(attacks) + " |", "|---|" + "---|" * len(attacks)]
    for strategy in strategies:
        clean = np.mean(by_cell[(strategy, attacks[0])]) if by_cell[(strategy, attacks[0])] else np.nan
        cells = []
        for attack in attacks:
            values = by_cell[(strategy, attack)]
            if not values:
                cells.append("–")
                continue
            text = f"{np.mean(values):.2f} ± {np.std(values):.2f}"
            if attack != attacks[0]:
                text += f" ({np.mean(values) - clean:+.2f})"
            cells.append(text)
        lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
    seeds = sorted({row["config"].get("seed", 0) for row in rows})
    what = "online accuracy" if curve == "acc" else "accuracy of the received prompt before adaptation"
    return "\n".join(lines) + (
        f"\n\nMicro {what} (%) of the clients honest in every column (all but "
        f"{sorted(attackers)}), mean ± std over seeds {seeds}; in brackets the change from the "
        "same rule without attack.\n"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows = [r for r in read_rows(argv[0]) if "robustness" in r["grids"]]
    if not rows:
        print(f"no robustness rows in {argv[0]}", file=sys.stderr)
        return 1
    Path(argv[1]).parent.mkdir(parents=True, exist_ok=True)
    text = (
        f"**Online accuracy** (the primary metric)\n\n{table(rows)}\n"
        f"**Received prompt, before adaptation** (what the server's rule delivered)\n\n"
        f"{table(rows, 'acc_before')}"
    )
    print(text)
    out = Path(argv[1])
    marker = "<!-- table -->"
    if out.exists() and marker in out.read_text():
        head, _, tail = out.read_text().partition(marker)
        tail = tail.partition(marker)[2]
        out.write_text(f"{head}{marker}\n{text}{marker}{tail}")
    else:
        out.write_text(f"# Robustness to adversarial clients\n\n{marker}\n{text}{marker}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
