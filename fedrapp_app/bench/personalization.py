"""``python -m fedrapp_app.bench.personalization <bench-dir>``: does a personalized rule find its domain peers?

Reads only ``<bench-dir>/cells.jsonl`` (rows of a testbed grid whose clients know their shift domain) and writes,
per grid: the online accuracy of each shift domain for every compared method (``domains.md``), the share of
FedRAPP's peer weight that falls on same-domain peers per round against the share uniform weights would give
(``share-<grid>.png`` and a summary table), and FedRAPP's reliability r, memory rate mu and peer share gamma per
round and client, over all seeds (``traces-<grid>.png``).

The same-domain share of client i in a round is Σ_{j: d(j) = d(i)} w_ij / Σ_j w_ij (rows.py); with uniform
weights over every other client it would be (n_d(i) − 1) / (N − 1).
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedrapp_app.bench.rows import read_rows, write_text_atomic
from fedrapp_app.bench.stats import Setting, Stat, mean_std, settings_of

#: Per-client curves that the traces figure draws, with their panel titles.
TRACES = (("r", "reliability r"), ("mu", "memory rate μ (weight kept on the old memory)"),
          ("gamma", "peer share γ"))


# ----------------------------------------------------------------------------------------- pure numbers
def domains_of(row: Mapping[str, Any]) -> dict[int, str]:
    """Client id -> shift domain of a row's clients (raises if a client has none: not a testbed row)."""
    out = {}
    for client, block in row["clients"].items():
        if block.get("domain") is None:
            raise ValueError(f"row {row.get('id', '?')}: client {client} has no shift domain; the personalization "
                             "report needs a testbed grid with testbed-domains set")
        out[int(client)] = str(block["domain"])
    return out


def uniform_share(domains: Mapping[int, str], client: int) -> float:
    """Same-domain share of ``client`` under equal weights on all other clients: (n_d − 1) / (N − 1)."""
    if len(domains) < 2:
        raise ValueError("a same-domain share needs at least two clients")
    same = sum(d == domains[client] for d in domains.values()) - 1
    return same / (len(domains) - 1)


def share_curves(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per-round same-domain peer share of every client of one row.

    Returns (rounds [T], shares [C, T]) with clients in id order and NaN where a client had no peers, did not
    take part in that round, or the rule records no peer weights.
    """
    clients = sorted(row["clients"], key=int)
    rounds = np.array(sorted({int(t) for c in clients for t in row["clients"][c]["round"]}), dtype=int)
    position = {int(t): k for k, t in enumerate(rounds)}
    shares = np.full((len(clients), rounds.size), np.nan)
    for i, c in enumerate(clients):
        block = row["clients"][c]
        for t, value in zip(block["round"], block["same_domain_share"], strict=True):
            if value is not None:
                shares[i, position[int(t)]] = float(value)
    return rounds, shares


def pooled_share(rows: Sequence[Mapping[str, Any]], last: int | None = None) -> tuple[Stat, float]:
    """Mean same-domain share over clients and rounds (the last ``last`` rounds of each row), mean ± std over rows,
    and the mean uniform share of the same clients."""
    per_row, uniform = [], []
    for row in rows:
        _, shares = share_curves(row)
        if last is not None:
            shares = shares[:, -last:]
        per_row.append(float(np.nanmean(shares)) if np.isfinite(shares).any() else None)
        domains = domains_of(row)
        uniform.append(float(np.mean([uniform_share(domains, c) for c in domains])))
    return mean_std(per_row), float(np.mean(uniform))


def domain_accuracy(row: Mapping[str, Any]) -> dict[str, float]:
    """Online accuracy of each shift domain in one row: samples of all its clients pooled (micro)."""
    correct: dict[str, float] = {}
    total: dict[str, int] = {}
    for block in row["clients"].values():
        domain = str(block["domain"])
        correct[domain] = correct.get(domain, 0.0) + sum(a * n for a, n in zip(block["acc"], block["n"], strict=True))
        total[domain] = total.get(domain, 0) + sum(block["n"])
    return {d: correct[d] / total[d] for d in sorted(correct) if total[d]}


def domain_stats(setting: Setting) -> dict[str, Stat]:
    """Per-domain online accuracy of a setting, mean ± std over its seeds."""
    per_seed = [domain_accuracy(row) for row in setting.rows]
    domains = sorted({d for acc in per_seed for d in acc})
    return {d: mean_std(acc.get(d) for acc in per_seed) for d in domains}


# ----------------------------------------------------------------------------------------------- figures
def _color_of(domains: Sequence[str]) -> dict[str, str]:
    return {d: f"C{i % 10}" for i, d in enumerate(sorted(set(domains)))}


def share_figure(settings: Sequence[Setting], title: str, path: Path) -> Path:
    """One panel per FedRAPP setting: each client's same-domain share per round (thin, every seed, coloured by
    domain), the mean over clients and seeds (black) and the uniform-weights share (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(settings), 4)
    fig, axes = plt.subplots(1, cols, figsize=(3.6 * cols, 3.4), squeeze=False, sharey=True)
    for ax, s in zip(axes.flat, settings, strict=False):
        colors = _color_of([d for row in s.rows for d in domains_of(row).values()])
        per_round: dict[int, list[float]] = {}
        uniform = []
        for row in s.rows:
            rounds, shares = share_curves(row)
            domains = domains_of(row)
            for i, client in enumerate(sorted(domains)):
                ax.plot(rounds, shares[i], color=colors[domains[client]], alpha=0.25, linewidth=0.8)
                uniform.append(uniform_share(domains, client))
            for k, t in enumerate(rounds):
                per_round.setdefault(int(t), []).extend(v for v in shares[:, k] if np.isfinite(v))
        order = sorted(t for t, v in per_round.items() if v)
        ax.plot(order, [np.mean(per_round[t]) for t in order], color="black", linewidth=2, label="mean")
        ax.axhline(float(np.mean(uniform)), color="grey", linestyle="--", linewidth=1.2, label="uniform weights")
        for domain, color in colors.items():
            ax.plot([], [], color=color, label=domain)
        ax.set_title(f"{s.method} (n={len(s.rows)} seeds)", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(settings):]:
        ax.axis("off")
    axes[0, 0].set_ylabel("peer weight on same-domain peers")
    axes[0, 0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def traces_figure(settings: Sequence[Setting], title: str, path: Path) -> Path:
    """Rows: FedRAPP settings; columns: r, μ, γ per round. Thin lines: every client of every seed (coloured by
    domain); thick: the mean of each domain over its clients and seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(settings), len(TRACES), figsize=(11, 2.6 * len(settings)), squeeze=False,
                             sharex=True)
    for row_axes, s in zip(axes, settings, strict=True):
        colors = _color_of([d for row in s.rows for d in domains_of(row).values()])
        for ax, (key, name) in zip(row_axes, TRACES, strict=True):
            by_domain: dict[str, dict[int, list[float]]] = {}
            for row in s.rows:
                for block in row["clients"].values():
                    pairs = [(int(t), float(v)) for t, v in zip(block["round"], block[key], strict=True)
                             if v is not None]
                    domain = str(block["domain"])
                    ax.plot([t for t, _ in pairs], [v for _, v in pairs], color=colors[domain], alpha=0.2,
                            linewidth=0.7)
                    for t, v in pairs:
                        by_domain.setdefault(domain, {}).setdefault(t, []).append(v)
            for domain, series in by_domain.items():
                order = sorted(series)
                ax.plot(order, [np.mean(series[t]) for t in order], color=colors[domain], linewidth=2.2,
                        label=f"{domain} (mean)")
            ax.set_title(f"{s.method}: {name}", fontsize=8)
            ax.grid(alpha=0.3)
        row_axes[0].legend(fontsize=7, loc="best")
    for ax in axes[-1]:
        ax.set_xlabel("round")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- markdown
def _fmt(stat: Stat) -> str:
    return stat.format() if stat.n else "–"


def grid_tables(settings: Sequence[Setting]) -> str:
    """Markdown: per-domain online accuracy of every method, and FedRAPP's same-domain share vs uniform."""
    out = io.StringIO()
    stats = [(s, domain_stats(s)) for s in settings]
    domains = sorted({d for _, st in stats for d in st})
    out.write("| method | " + " | ".join(domains) + " |\n|---|" + "---|" * len(domains) + "\n")
    for s, st in stats:
        label = s.method + (" (oracle)" if s.oracle else "")
        out.write(f"| {label} | " + " | ".join(_fmt(st[d]) if d in st else "" for d in domains) + " |\n")
    fedrapp = [s for s in settings if s.strategy == "fedrapp"]
    if fedrapp:
        out.write("\n| FedRAPP setting | same-domain share, all rounds | last 3 rounds | uniform weights |\n"
                  "|---|---|---|---|\n")
        for s in fedrapp:
            every, uniform = pooled_share(s.rows)
            late, _ = pooled_share(s.rows, last=3)
            out.write(f"| {s.method} | {every.format(digits=1)} | {late.format(digits=1)} | "
                      f"{100 * uniform:.1f} |\n")
    return out.getvalue()


def write_personalization(bench_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write the per-domain tables and the share and trace figures of every grid; return the markdown path."""
    rows = read_rows(bench_dir)
    if not rows:
        raise FileNotFoundError(f"no finished cells in {Path(bench_dir) / 'cells.jsonl'}")
    out = Path(out_dir) if out_dir else Path(bench_dir) / "personalization"
    out.mkdir(parents=True, exist_ok=True)
    settings = settings_of(rows)
    text = io.StringIO()
    text.write(f"# Per-domain accuracy and same-domain peer share: `{Path(bench_dir).name}`\n\n"
               "Online accuracy (%) per shift domain, mean ± std over seeds; same-domain share (%) of FedRAPP's "
               "peer weight, mean over clients and rounds, ± std over seeds.\n\n")
    for grid in dict.fromkeys(s.grid for s in settings):
        members = [s for s in settings if s.grid == grid]
        for context in dict.fromkeys(s.context_name for s in members):
            block = [s for s in members if s.context_name == context]
            name = grid if context == "all" else f"{grid}-{context}"
            slug = "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in name)
            text.write(f"## {name}\n\n{grid_tables(block)}\n")
            fedrapp = [s for s in block if s.strategy == "fedrapp"]
            if fedrapp:
                share_figure(fedrapp, f"{name}: FedRAPP peer weight on same-domain peers", out / f"share-{slug}.png")
                traces_figure(fedrapp, f"{name}: FedRAPP r, μ, γ per client (all seeds)", out / f"traces-{slug}.png")
                text.write(f"![share {name}](share-{slug}.png)\n\n![traces {name}](traces-{slug}.png)\n\n")
    path = out / "domains.md"
    write_text_atomic(path, text.getvalue())
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedrapp_app.bench.personalization",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("bench_dir", type=Path, help="a bench directory of a testbed grid (holds cells.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: <bench-dir>/personalization)")
    args = parser.parse_args(argv)
    try:
        print(write_personalization(args.bench_dir, args.out))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
