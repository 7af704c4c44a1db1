"""``python -m fedrapp_app.bench.personalization <bench-dir>``: does a personalized rule find its domain peers?

Reads only ``<bench-dir>/cells.jsonl`` (rows of a testbed grid whose clients know their shift domain) and writes,
per grid: the online accuracy of each shift domain for every compared method (``domains.md``), the share of
the peer weight of FedRAPP (and FedAMP, the other rule that weighs peers by similarity) that falls on
same-domain peers per round against the share uniform weights would give (``share-<grid>.png`` and a summary
table), and FedRAPP's reliability r, memory rate mu and peer share gamma per round and client, over all seeds
(``traces-<grid>.png``). The figures are saved as palette PNGs (small enough to commit next to a write-up).

The same-domain share of client i in a round is Σ_{j: d(j) = d(i)} w_ij / Σ_j w_ij (rows.py); with uniform
weights over the other clients that took part in that round it would be the share of those in i's domain
((n_d(i) − 1) / (N − 1) when every client takes part; late rounds of a label-skewed run hold fewer clients).
"""

from __future__ import annotations

import io
import math
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedrapp_app.bench.rows import report_input, report_main, write_text_atomic
from fedrapp_app.bench.schema import ZEROSHOT
from fedrapp_app.bench.stats import Setting, Stat, mean_std, settings_of

#: Rules whose peer weights say something about who a client listens to (FedAvg's are uniform by construction,
#: the oracle's are 1 on its domain by construction).
PEER_RULES = ("fedrapp", "fedamp")

#: Per-client curves that the traces figure draws, with their panel titles.
TRACES = (("r", "reliability r"), ("mu", "memory rate μ (weight kept on the old memory)"), ("gamma", "peer share γ"))


# ----------------------------------------------------------------------------------------- pure numbers
def domains_of(row: Mapping[str, Any]) -> dict[int, str]:
    """Client id -> shift domain of a row's clients (raises if a client has none: not a testbed row)."""
    out = {}
    for client, block in row["clients"].items():
        if block.get("domain") is None:
            raise ValueError(
                f"row {row.get('id', '?')}: client {client} has no shift domain; the personalization "
                "report needs a testbed grid with testbed-domains set"
            )
        out[int(client)] = str(block["domain"])
    return out


def uniform_share(domains: Mapping[int, str], client: int, present: Iterable[int] | None = None) -> float | None:
    """Same-domain share of ``client`` under equal weights on the other clients of ``present`` (default: all).

    (clients of its domain in ``present``, itself excluded) / (clients in ``present``, itself excluded); None
    when it has no other client.
    """
    others = [j for j in (domains if present is None else present) if j != client]
    if not others:
        return None
    return sum(domains[j] == domains[client] for j in others) / len(others)


def share_curves(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-round same-domain peer share of every client of one row, and the share uniform weights would give.

    Returns (rounds [T], shares [C, T], uniform [C, T]) with clients in id order. ``shares`` is NaN where a
    client had no peers, did not take part, or the rule records no peer weights; ``uniform`` is the share of
    equal weights over the other clients that took part in that round (NaN where the client did not).
    """
    clients = sorted(row["clients"], key=int)
    rounds = np.array(sorted({int(t) for c in clients for t in row["clients"][c]["round"]}), dtype=int)
    position = {int(t): k for k, t in enumerate(rounds)}
    domains = domains_of(row)
    present: dict[int, list[int]] = {}
    for c in clients:
        for t in row["clients"][c]["round"]:
            present.setdefault(int(t), []).append(int(c))
    shares = np.full((len(clients), rounds.size), np.nan)
    uniform = np.full_like(shares, np.nan)
    for i, c in enumerate(clients):
        block = row["clients"][c]
        for t, value in zip(block["round"], block["same_domain_share"], strict=True):
            k = position[int(t)]
            if value is not None:
                shares[i, k] = float(value)
            reference = uniform_share(domains, int(c), present[int(t)])
            if reference is not None:
                uniform[i, k] = reference
    return rounds, shares, uniform


def full_rounds(row: Mapping[str, Any]) -> np.ndarray:
    """Bool [T] over ``share_curves``' rounds: every client of the row took part."""
    rounds, _, uniform = share_curves(row)
    return np.isfinite(uniform).all(axis=0) if rounds.size else np.zeros(0, dtype=bool)


def pooled_share(rows: Sequence[Mapping[str, Any]], full_only: bool = False) -> tuple[Stat, Stat]:
    """Mean same-domain share over clients and rounds of each row, then mean ± std over rows; the same for the
    uniform-weights share over the same (client, round) entries. ``full_only``: rounds every client took part in."""
    ours, reference = [], []
    for row in rows:
        _, shares, uniform = share_curves(row)
        if full_only:
            keep = full_rounds(row)
            shares, uniform = shares[:, keep], uniform[:, keep]
        mask = np.isfinite(shares)
        ours.append(float(shares[mask].mean()) if mask.any() else None)
        reference.append(float(uniform[mask].mean()) if mask.any() else None)
    return mean_std(ours), mean_std(reference)


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
def save_small_png(fig: Any, path: Path, dpi: int = 100, colors: int = 64) -> Path:
    """Save a matplotlib figure as an adaptive-palette PNG: the semi-transparent line bundles of these figures
    make full-colour PNGs of megabytes; ``colors`` palette entries keep them a few hundred KB or less."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    with Image.open(buffer) as image:
        palette = image.convert("RGB").quantize(colors=colors, method=Image.Quantize.FASTOCTREE)
        tmp = path.with_name(path.name + ".tmp")
        palette.save(tmp, format="PNG", optimize=True)
    tmp.replace(path)
    return path


def _tight(fig: Any, height_in: float) -> None:
    """tight_layout that leaves ~0.35 inch at the top for the suptitle, whatever the figure's height."""
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 1.0 - 0.35 / height_in))


def _color_of(domains: Sequence[str]) -> dict[str, str]:
    return {d: f"C{i % 10}" for i, d in enumerate(sorted(set(domains)))}


def share_figure(settings: Sequence[Setting], title: str, path: Path) -> Path:
    """One panel per peer-weighting setting (FedRAPP, FedAMP): each client's same-domain share per round (thin,
    every seed, coloured by domain), the mean over clients and seeds (black) and the uniform-weights share
    (dashed). Shaded: rounds in which some client of some seed no longer took part (its label-skewed stream
    had ended), where both curves average fewer, and late on very few, clients."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(settings), 4)
    lines = -(-len(settings) // cols)
    height = 3.2 * lines
    fig, axes = plt.subplots(lines, cols, figsize=(3.6 * cols, height), squeeze=False, sharey=True)
    for ax, s in zip(axes.flat, settings, strict=False):
        colors = _color_of([d for row in s.rows for d in domains_of(row).values()])
        per_round: dict[int, list[float]] = {}
        per_round_uniform: dict[int, list[float]] = {}
        partial: set[int] = set()  # rounds some client of some seed sat out (its stream had ended)
        for row in s.rows:
            rounds, shares, uniform = share_curves(row)
            partial.update(int(t) for t in rounds[~full_rounds(row)])
            domains = domains_of(row)
            for i, client in enumerate(sorted(domains)):
                ax.plot(rounds, shares[i], color=colors[domains[client]], alpha=0.25, linewidth=0.8)
            for k, t in enumerate(rounds):
                mask = np.isfinite(shares[:, k])
                per_round.setdefault(int(t), []).extend(shares[mask, k])
                per_round_uniform.setdefault(int(t), []).extend(uniform[mask, k])
        order = sorted(t for t, v in per_round.items() if v)
        ax.plot(order, [np.mean(per_round[t]) for t in order], color="black", linewidth=2, label="mean")
        ax.plot(
            order,
            [np.mean(per_round_uniform[t]) for t in order],
            color="grey",
            linestyle="--",
            linewidth=1.4,
            label="uniform weights",
        )
        for t in sorted(partial):
            ax.axvspan(t - 0.5, t + 0.5, color="grey", alpha=0.12, linewidth=0)
        if partial:
            ax.fill_between([], [], color="grey", alpha=0.12, label="round with fewer clients")
        for domain, color in colors.items():
            ax.plot([], [], color=color, label=domain)
        ax.set_title(f"{s.method} (n={len(s.rows)} seeds)", fontsize=8)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(settings) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("round")
    for ax in axes[:, 0]:
        ax.set_ylabel("peer weight on same-domain peers", fontsize=8)
    spare = list(axes.flat[len(settings) :])
    if spare:  # an empty panel holds the legend, which would otherwise hide curves
        spare[0].legend(*axes[0, 0].get_legend_handles_labels(), fontsize=8, loc="center")
    else:
        axes[0, 0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    _tight(fig, height)
    save_small_png(fig, path)
    plt.close(fig)
    return path


def traces_figure(settings: Sequence[Setting], title: str, path: Path) -> Path:
    """Rows: FedRAPP settings; columns: r, μ, γ per round. Thin lines: every client of every seed (coloured by
    domain); thick: the mean of each domain over its clients and seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 2.4 * len(settings) + 0.4
    fig, axes = plt.subplots(len(settings), len(TRACES), figsize=(11, height), squeeze=False, sharex=True)
    for row_axes, s in zip(axes, settings, strict=True):
        colors = _color_of([d for row in s.rows for d in domains_of(row).values()])
        for ax, (key, _) in zip(row_axes, TRACES, strict=True):
            by_domain: dict[str, dict[int, list[float]]] = {}
            for row in s.rows:
                for block in row["clients"].values():
                    pairs = [
                        (int(t), float(v)) for t, v in zip(block["round"], block[key], strict=True) if v is not None
                    ]
                    domain = str(block["domain"])
                    ax.plot(
                        [t for t, _ in pairs], [v for _, v in pairs], color=colors[domain], alpha=0.2, linewidth=0.7
                    )
                    for t, v in pairs:
                        by_domain.setdefault(domain, {}).setdefault(t, []).append(v)
            for domain, series in by_domain.items():
                order = sorted(series)
                ax.plot(
                    order,
                    [np.mean(series[t]) for t in order],
                    color=colors[domain],
                    linewidth=2.2,
                    label=f"{domain} (mean)",
                )
            ax.grid(alpha=0.3)
        # the setting names the row (left), the quantity the column (top): long rule labels no longer collide
        row_axes[0].set_ylabel(textwrap.fill(s.method, 26), fontsize=8)
        row_axes[0].legend(fontsize=7, loc="best")
    for ax, (_, name) in zip(axes[0], TRACES, strict=True):
        ax.set_title(name, fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("round")
    fig.suptitle(title, fontsize=10)
    _tight(fig, height)
    save_small_png(fig, path, dpi=90 if len(settings) <= 8 else 66)  # a tall figure stays a few hundred KB
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- markdown
def _fmt(stat: Stat) -> str:
    return stat.format() if stat.n else "–"


def paired_gap(setting: Setting, reference: Setting, metric: str = "micro_accuracy") -> Stat:
    """Per seed, ``setting`` minus ``reference`` (same seed), then mean ± std over the seeds both have."""
    theirs = {row["config"].get("seed", 0): row["summary"][metric] for row in reference.rows}
    return mean_std(
        row["summary"][metric] - theirs[seed]
        for row in setting.rows
        if (seed := row["config"].get("seed", 0)) in theirs
    )


def pivot_markdown(settings: Sequence[Setting], metric: str = "micro_accuracy") -> str:
    """Markdown pivot of a grid compared on two axes (e.g. [method, rule]): columns are the first axis's labels,
    rows the second's; zero-shot is one row for every column. Per column the best non-oracle value is bold.
    Below it, the paired gap (points, mean ± std over seeds) of every rule to none-fed, to FedAvg and to the
    oracle (the three references of the personalization goal)."""
    if not settings or len(settings[0].compare) != 2:
        raise ValueError("pivot_markdown needs settings compared on exactly two axes, e.g. compare: [method, rule]")
    col_axis, row_axis = settings[0].compare
    table: dict[tuple[str, str], Setting] = {}
    zeroshot = None
    for s in settings:
        if s.strategy == ZEROSHOT:
            zeroshot = s
        else:
            table[(s.labels[row_axis], s.labels[col_axis])] = s
    cols = list(dict.fromkeys(c for _, c in table))
    rows = list(dict.fromkeys(r for r, _ in table))
    oracle_rows = {r for (r, _), s in table.items() if s.oracle}

    def value(row: str, col: str) -> Setting | None:
        return zeroshot if row == ZEROSHOT else table.get((row, col))

    order = ([ZEROSHOT] if zeroshot else []) + rows
    best = {}
    for col in cols:
        means = {r: value(r, col).metric(metric).mean for r in order if r not in oracle_rows and value(r, col)}
        best[col] = max(means.values()) if means else math.nan
    out = io.StringIO()
    out.write(f"| {row_axis} | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n")
    for r in order:
        cells = []
        for col in cols:
            s = value(r, col)
            if s is None:
                cells.append("")
                continue
            stat = s.metric(metric)
            text = stat.format()
            cells.append(f"**{text}**" if r not in oracle_rows and stat.mean == best[col] else text)
        label = f"{r} (oracle, reference)" if r in oracle_rows else r
        out.write(f"| {label} | " + " | ".join(cells) + " |\n")

    def first_row_of(strategy: str) -> str | None:
        return next(
            (r for r in rows if any((s := table.get((r, c))) is not None and s.strategy == strategy for c in cols)),
            None,
        )

    references = [
        ("none-fed", first_row_of("none-fed")),
        ("FedAvg", first_row_of("fedavg")),
        ("the oracle", next(iter(oracle_rows), None)),
    ]
    for name, ref in references:
        if ref is None:
            continue
        out.write(f"\n| Δ vs {name} (paired, points) | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n")
        for r in rows:
            if r == ref:
                continue
            cells = []
            for col in cols:
                s, base = table.get((r, col)), table.get((ref, col))
                cells.append(paired_gap(s, base, metric).format(signed=True) if s and base else "")
            out.write(f"| {r} | " + " | ".join(cells) + " |\n")
    return out.getvalue()


def grid_tables(settings: Sequence[Setting]) -> str:
    """Markdown: per-domain online accuracy of every method, and FedRAPP's same-domain share vs uniform."""
    out = io.StringIO()
    stats = [(s, domain_stats(s)) for s in settings]
    domains = sorted({d for _, st in stats for d in st})
    out.write("| method | " + " | ".join(domains) + " |\n|---|" + "---|" * len(domains) + "\n")
    for s, st in stats:
        label = s.method + (" (oracle)" if s.oracle else "")
        out.write(f"| {label} | " + " | ".join(_fmt(st[d]) if d in st else "" for d in domains) + " |\n")
    peered = [s for s in settings if s.strategy in PEER_RULES]
    if peered:
        out.write(
            "\n| peer-weighting setting | same-domain share, all rounds | uniform weights, same rounds | "
            "rounds with every client | uniform weights, same rounds |\n|---|---|---|---|---|\n"
        )
        for s in peered:
            every, every_uniform = pooled_share(s.rows)
            full, full_uniform = pooled_share(s.rows, full_only=True)
            out.write(
                f"| {s.method} | {every.format(digits=1)} | {every_uniform.format(digits=1)} | "
                f"{full.format(digits=1)} | {full_uniform.format(digits=1)} |\n"
            )
    return out.getvalue()


def write_personalization(bench_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write the per-domain tables and the share and trace figures of every grid; return the markdown path."""
    rows, out = report_input(bench_dir, out_dir, "personalization")
    settings = settings_of(rows)
    text = io.StringIO()
    text.write(
        f"# Per-domain accuracy and same-domain peer share: `{Path(bench_dir).name}`\n\n"
        "Online accuracy (%) per shift domain, mean ± std over seeds; same-domain share (%) of the peer "
        "weight of FedRAPP and FedAMP, mean over clients and rounds, ± std over seeds.\n\n"
    )
    for grid in dict.fromkeys(s.grid for s in settings):
        members = [s for s in settings if s.grid == grid]
        for context in dict.fromkeys(s.context_name for s in members):
            block = [s for s in members if s.context_name == context]
            name = grid if context == "all" else f"{grid}-{context}"
            slug = "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in name)
            text.write(f"## {name}\n\n")
            if len(block[0].compare) == 2:
                text.write("Online accuracy (micro, %), mean ± std over seeds:\n\n" + pivot_markdown(block) + "\n")
            text.write(f"Per shift domain:\n\n{grid_tables(block)}\n")
            peered = [s for s in block if s.strategy in PEER_RULES]
            if peered:
                share_figure(peered, f"{name}: peer weight on same-domain peers", out / f"share-{slug}.png")
                text.write(f"![share {name}](share-{slug}.png)\n\n")
            fedrapp = [s for s in block if s.strategy == "fedrapp"]
            if fedrapp:
                traces_figure(fedrapp, f"{name}: FedRAPP r, μ, γ per client (all seeds)", out / f"traces-{slug}.png")
                text.write(f"![traces {name}](traces-{slug}.png)\n\n")
    path = out / "domains.md"
    write_text_atomic(path, text.getvalue())
    return path


def main(argv: list[str] | None = None) -> int:
    return report_main(
        argv, "python -m fedrapp_app.bench.personalization", __doc__, write_personalization, "personalization"
    )


if __name__ == "__main__":
    sys.exit(main())
