"""Figures of a run report (matplotlib, Agg backend), drawn from the run files alone.

Each figure is assembled from small panel functions (``draw_*``, one matplotlib ``Axes`` each), so the
one-glance overview and the detailed figures share their drawing. Clients are coloured by shift domain
(by id where there are none) as in the benchmark figures, and saved as palette PNGs (a few tens of KB).

- ``overview_figure``: accuracy per round, accuracy per client, and who learns from whom (or, for a rule
  without peer weights, what happened to each client in each round);
- ``accuracy_figure``: online and received-prompt accuracy per round, overall and per client;
- ``status_figure``: each client's row status per round;
- ``peers_figure``: the peer weights w_ij and the mixing weights (ξ) averaged over rounds, by domain;
- ``compare_figure``: several runs' accuracy per round overlaid, the running gap to the first run and the
  per-client difference; runs are labelled by the config keys they differ in, with a key to their folders;
- ``signals_figure``: FedRAPP's r, μ, γ and same-domain share per client per round (the benchmark's
  ``fedrapp_figure``, its legends moved outside the panels).

Every ``*_figure(…, path)`` saves what ``build_*(…)`` returns (a matplotlib ``Figure``, laid out by
matplotlib's constrained layout so that titles, labels and legends neither clip nor overlap).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedrapp_app.bench.personalization import save_small_png  # noqa: E402
from fedrapp_app.bench.plots import fedrapp_figure  # noqa: E402
from fedrapp_app.bench.stats import round_curve  # noqa: E402
from fedrapp_app.metrics.switches import switch_rounds  # noqa: E402
from fedrapp_app.report.runs import Run  # noqa: E402
from fedrapp_app.report.tables import (  # noqa: E402
    NOT_SAMPLED,
    STREAM_ENDED,
    ClientStats,
    Comparison,
    PeerMatrix,
    cumulative_accuracy,
    domain_order,
    status_grid,
)

#: Colours of the row statuses (a status this version does not know is drawn black).
STATUS_COLORS = {
    "ok": "#4c9a2a",
    "failed": "#d62728",
    "rejected": "#ff7f0e",
    "missing": "#7f7f7f",
    "exhausted": "#aec7e8",
    "skipped": "#9467bd",
    "dropped": "#f7b6d2",  # absent from the round (drop-rate)
    "late": "#c7c7c7",  # a late joiner not joined yet
    "not-due": "#dbdb8d",  # a held-out client between its visits
    "not-sampled": "#ffffff",  # fraction < 1
}
#: Colours of the status grid's cells that are not a row status (runs of earlier versions had no row there).
CELL_COLORS = {NOT_SAMPLED: "#ffffff", STREAM_ENDED: STATUS_COLORS["exhausted"]}
#: Up to this many clients every client gets its own tick label (beyond, one label per domain or a few ids).
LABELLED_CLIENTS = 16
#: Font sizes (points), chosen so that the overview stays legible scaled to a README's width (~900 px).
TINY, SMALL, LABEL, TITLE, HEADLINE = 7.0, 7.5, 8.5, 9.5, 10.5


def client_colors(domains: Sequence[str | None]) -> list[str]:
    """A colour per client: its domain's (domains sorted by name, as in the benchmark figures), or its own
    without domains."""
    if any(d is None for d in domains):
        return [f"C{c % 10}" for c in range(len(domains))]
    index = {d: k for k, d in enumerate(sorted(set(domains)))}
    return [f"C{index[d] % 10}" for d in domains]


def client_label(client: int, domains: Sequence[str | None]) -> str:
    domain = domains[client] if client < len(domains) else None
    return f"{client}" if domain is None else f"{client} {domain}"


def _domain_legend(ax: Any, domains: Sequence[str | None], **kwargs: Any) -> None:
    if any(d is None for d in domains) or not domains:
        return
    colors = client_colors(domains)
    handles = {d: Patch(color=colors[c], label=d) for c, d in enumerate(domains)}
    ax.legend(handles=list(handles.values()), **kwargs)


def _legend(ax: Any) -> None:
    """The accuracy legend, in the band above 100% (no curve goes there)."""
    ax.legend(fontsize=SMALL, loc="upper center", ncol=2)


def client_ticks(ax: Any, axis: str, order: Sequence[int], domains: Sequence[str | None], long: bool) -> None:
    """Tick labels for clients placed at 0..len(order)−1 along ``axis`` ("x" or "y"): each client's id (with its
    domain when ``long``) for a few clients; for many, one label per domain group at its centre, or a few ids."""
    set_ticks = ax.set_xticks if axis == "x" else ax.set_yticks
    if len(order) <= LABELLED_CLIENTS:
        labels = [client_label(c, domains) if long else str(c) for c in order]
        set_ticks(range(len(order)), labels, fontsize=SMALL)
    elif None not in domains:
        groups: dict[str, list[int]] = {}
        for k, c in enumerate(order):
            groups.setdefault(str(domains[c]), []).append(k)
        set_ticks([float(np.mean(ks)) for ks in groups.values()], list(groups), fontsize=SMALL)
        if axis == "x":
            ax.tick_params(axis="x", labelrotation=20)
    else:
        positions = np.linspace(0, len(order) - 1, 6).round().astype(int)
        set_ticks(positions, [str(order[k]) for k in positions], fontsize=SMALL)


def _round_axis(ax: Any) -> None:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def draw_accuracy(
    ax: Any,
    curves: Mapping[str, Any],
    domains: Sequence[str | None],
    key: str = "acc",
    with_received: bool = True,
) -> None:
    """Per-round accuracy (%): one thin line per client (``key`` = "acc" online, "acc_before" received prompt),
    the pooled accuracy of the round over all its clients (thick), and, with ``with_received``, the received
    prompt's pooled accuracy (dashed). The clients scored per round go in a panel of their own (``draw_counts``)."""
    colors = client_colors(domains)
    for client, block in curves["clients"].items():
        ax.plot(block["round"], 100 * np.asarray(block[key]), color=colors[int(client)], linewidth=0.7, alpha=0.55)
    numerator = "correct" if key == "acc" else "correct_before"
    rounds, acc = round_curve([curves], numerator)
    label = "online, all clients" if key == "acc" else "received prompt, all clients"
    ax.plot(rounds, 100 * acc, color="black", linewidth=2.0, label=label)
    thin = thin_rounds(curves)  # a pooled point that rests on few clients: said, not hidden
    if thin.size:
        at = np.isin(rounds, thin)
        ax.plot(rounds[at], 100 * acc[at], linestyle="none", marker="o", markersize=5, markerfacecolor="white",
                color="black", label=f"rests on < {THIN_SHARE:.0%} of the clients")  # fmt: skip
    if with_received and key == "acc":
        _, before = round_curve([curves], "correct_before")
        label = "received prompt, all"
        ax.plot(rounds, 100 * before, color="black", linestyle="--", linewidth=1.3, label=label)
    if key == "acc":
        t, cumulative = cumulative_accuracy(curves)
        ax.plot(t, 100 * cumulative, color="#8c564b", linestyle=":", linewidth=1.6, label="online so far")
    ax.set_ylim(-2, 122)  # room above 100% for the legend
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("top-1 accuracy of the round's batches (%)", fontsize=LABEL)
    _round_axis(ax)


def mark_switches(ax: Any, rounds: Sequence[int]) -> None:
    """Dotted verticals at the rounds where a client's shift domain changed (``switches.switch_rounds``)."""
    for k, t in enumerate(rounds):
        ax.axvline(
            t - 0.5, color="#7f7f7f", linestyle=(0, (1, 2)), linewidth=0.9, label="domain switch" if not k else None
        )


#: A round whose pooled accuracy rests on fewer than this share of the clients that ever scored is marked as such.
THIN_SHARE = 0.5


def thin_rounds(curves: Mapping[str, Any]) -> np.ndarray:
    """The rounds [k] in which fewer than :data:`THIN_SHARE` of the clients that ever scored did (late rounds of
    the clients with long streams, rounds most clients sat out)."""
    counts = np.asarray(curves["rounds"]["clients"])
    everyone = len(curves["clients"])
    return np.asarray(curves["rounds"]["round"])[counts < THIN_SHARE * everyone] if everyone else np.array([], int)


def domain_curves(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each shift domain's online accuracy per round over every client's samples in it: domain -> (rounds [k],
    accuracy [k]), from the rows' per-domain counts."""
    totals: dict[str, dict[int, list[int]]] = {}
    for row in rows:
        if row.get("status") != "ok":
            continue
        for domain, (n, right) in (row.get("domains") or {}).items():
            cell = totals.setdefault(domain, {}).setdefault(int(row["round"]), [0, 0])
            cell[0] += n
            cell[1] += right
    out = {}
    for domain, by_round in sorted(totals.items()):
        rounds = np.array(sorted(by_round))
        out[domain] = rounds, np.array([by_round[t][1] / by_round[t][0] for t in rounds])
    return out


def domain_figure(run: Run, title: str, path: Path) -> Path | None:
    """``domains.png``: each shift domain's online accuracy over the stream (None for a run without domains)."""
    curves = domain_curves(run.rows)
    if not curves:
        return None
    fig = _figure(7, 3.4)
    ax = fig.add_subplot()
    for domain, (rounds, acc) in curves.items():
        ax.plot(rounds, 100 * acc, marker=".", linewidth=1.2, label=domain)
    mark_switches(ax, switch_rounds(run.rows))
    ax.set_ylabel("online accuracy of the round's samples (%)", fontsize=LABEL)
    ax.set_title(title, fontsize=TITLE)
    _round_axis(ax)
    ax.legend(fontsize=SMALL, loc="best", ncol=2)
    return _save(fig, path)


def draw_counts(ax: Any, curves: Mapping[str, Any], num_clients: int) -> None:
    """Bars: the clients scored in each round, on a count axis of their own (0 to ``num_clients``)."""
    ax.bar(curves["rounds"]["round"], curves["rounds"]["clients"], color="grey", alpha=0.6, width=0.8)
    top = max(1, num_clients, *curves["rounds"]["clients"])
    ax.set_ylim(0, top)
    ax.set_yticks([t for t in MaxNLocator(nbins=3, integer=True).tick_values(0, top) if 0 <= t <= top])
    ax.tick_params(axis="y", labelsize=SMALL)
    ax.set_ylabel("clients\nscored", fontsize=LABEL)
    _round_axis(ax)


def draw_clients(ax: Any, stats: Sequence[ClientStats], domains: Sequence[str | None]) -> None:
    """Bars: each client's online accuracy (%) ordered by domain; ticks: its received prompt's accuracy;
    a note above a client whose rows were failed, rejected, missing or skipped."""
    order = domain_order(domains) if len(domains) == len(stats) else list(range(len(stats)))
    colors = client_colors(domains)
    x = np.arange(len(order))
    acc = [100 * stats[c].accuracy if stats[c].samples else 0.0 for c in order]
    ax.bar(x, acc, color=[colors[c] for c in order], width=0.75)
    received = [100 * stats[c].accuracy_received if stats[c].samples else np.nan for c in order]
    ax.plot(x, received, linestyle="none", marker="_", markersize=12, markeredgewidth=2, color="black")
    ax.plot([], [], linestyle="none", marker="_", markersize=10, markeredgewidth=2, color="black", label="received")
    for k, c in enumerate(order):
        trouble = {s: n for s, n in stats[c].statuses.items() if n and s not in ("ok", "exhausted")}
        if not stats[c].samples:
            trouble["no samples"] = 1
        if not trouble:
            continue
        if len(order) <= LABELLED_CLIENTS:
            text = "\n".join(f"{n} {s}" if s != "no samples" else s for s, n in trouble.items())
            ax.annotate(text, (k, min(acc[k], 88) + 2), ha="center", va="bottom", fontsize=TINY, color="#d62728")
        else:  # too many clients for words: a red mark above the bar (the table has the counts)
            ax.plot(k, min(acc[k], 95) + 3, marker="v", markersize=3, color="#d62728")
    client_ticks(ax, "x", order, domains, long=False)
    ax.set_xlabel("client" + (" (grouped by shift domain)" if None not in domains else ""))
    ax.set_ylim(0, 115)  # room above 100% for the domain legend
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("online accuracy (%)", fontsize=LABEL)
    ax.grid(axis="y", alpha=0.3)


def draw_matrix(ax: Any, values: np.ndarray, domains: Sequence[str | None], title: str, diagonal: bool = False) -> Any:
    """Heatmap of a client × client matrix (%), rows and columns grouped by domain, with domain separators;
    values printed in the cells when there are at most 12 clients. Returns the image (for a colour bar)."""
    order = domain_order(domains)
    shown = 100 * values[np.ix_(order, order)]
    if not diagonal:
        shown = np.where(np.eye(len(order), dtype=bool), np.nan, shown)
    image = ax.imshow(shown, cmap="Blues", vmin=0, vmax=max(1.0, float(np.nanmax(shown))), interpolation="nearest")
    client_ticks(ax, "x", order, domains, long=False)
    client_ticks(ax, "y", order, domains, long=True)
    ax.set_xlabel("peer j (source)", fontsize=LABEL)
    ax.set_ylabel("client i (receiver)", fontsize=LABEL)
    if None not in domains:
        grouped = [domains[c] for c in order]
        for k in range(1, len(grouped)):
            if grouped[k] != grouped[k - 1]:
                ax.axhline(k - 0.5, color="black", linewidth=0.8)
                ax.axvline(k - 0.5, color="black", linewidth=0.8)
    if len(order) <= 12:
        top = np.nanmax(shown) if np.isfinite(shown).any() else 1.0
        for i in range(len(order)):
            for j in range(len(order)):
                if np.isfinite(shown[i, j]):
                    color = "white" if shown[i, j] > 0.6 * top else "black"
                    ax.text(j, i, f"{shown[i, j]:.0f}", ha="center", va="center", fontsize=TINY, color=color)
    ax.set_title(title, fontsize=TITLE)
    return image


def draw_status(ax: Any, run: Run) -> None:
    """Client × round grid of row statuses; ``stream ended`` from a client's ``exhausted`` row (or the round
    after its last batch) on, white where a client could have been sampled but was not; dropped, not yet joined
    and held-out clients between visits each in their own colour."""
    grid = status_grid(run)
    palette = [CELL_COLORS.get(label) or STATUS_COLORS.get(label, "black") for label in grid.labels]
    last = grid.cells.shape[1]
    ax.imshow(
        grid.cells,
        cmap=ListedColormap(palette),
        vmin=-0.5,
        vmax=len(palette) - 0.5,
        aspect="auto",
        interpolation="nearest",
        extent=(0.5, last + 0.5, len(grid.order) - 0.5, -0.5),
    )
    client_ticks(ax, "y", grid.order, run.domains, long=True)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    seen = sorted({int(v) for v in grid.cells.flat})
    words = {"late": "not yet joined", "not-due": "held out, not due", "dropped": "dropped (drop-rate)"}
    handles = [
        Patch(facecolor=palette[v], edgecolor="grey", label=words.get(grid.labels[v], grid.labels[v])) for v in seen
    ]
    ax.legend(handles=handles, fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def headline(run: Run, micro: float, macro: float, samples: int) -> str:
    state = "  [INCOMPLETE]" if not run.complete else ""
    return (
        f"{run.name}{state}\n{run.title}: online accuracy {100 * micro:.2f}% micro / {100 * macro:.2f}% macro "
        f"over {samples} samples"
    )


def _save(fig: Figure, path: Path, dpi: int = 100) -> Path:
    save_small_png(fig, path, dpi=dpi)
    plt.close(fig)
    return path


def _figure(width: float, height: float) -> Figure:
    """A figure laid out by constrained layout: titles, labels, colour bars and legends outside the axes get
    room of their own instead of being clipped or drawn over each other."""
    return plt.figure(figsize=(width, height), layout="constrained")


def _wrap(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (a title that would not fit the figure)."""
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) for line in text.splitlines())


def build_overview(
    run: Run,
    curves: Mapping[str, Any],
    stats: Sequence[ClientStats],
    matrix: PeerMatrix | None,
    share: tuple[float, float] | None,
    title: str,
) -> Figure:
    """The run at a glance: accuracy per round (above the clients scored per round, on their own count axis),
    accuracy per client, and who learns from whom (or statuses).

    ``share``: mean same-domain peer share and its equal-weights reference, printed under the matrix."""
    fig = _figure(12, 4.6)
    grid = fig.add_gridspec(2, 3, width_ratios=[1.3, 1.0, 1.0], height_ratios=[4.0, 1.0])
    accuracy = fig.add_subplot(grid[0, 0])
    counts = fig.add_subplot(grid[1, 0], sharex=accuracy)
    draw_accuracy(accuracy, curves, run.domains)
    mark_switches(accuracy, switch_rounds(run.rows))
    accuracy.set_xlabel("")
    accuracy.tick_params(axis="x", labelbottom=False)
    accuracy.set_title("accuracy per round (thin: each client, online)", fontsize=TITLE)
    _legend(accuracy)
    draw_counts(counts, curves, run.num_clients)
    clients = fig.add_subplot(grid[:, 1])
    draw_clients(clients, stats, run.domains)
    clients.set_title("online accuracy per client (tick: received prompt)", fontsize=TITLE)
    _domain_legend(clients, run.domains, fontsize=SMALL, loc="upper right", ncol=2)
    right = fig.add_subplot(grid[:, 2])
    if matrix is not None:
        heading = "who learns from whom: w_ij (%)"
        if share is not None:
            heading += f"\non own domain {100 * share[0]:.0f}% (equal weights {100 * share[1]:.0f}%)"
        draw_matrix(right, matrix.weights, run.domains, heading)
    else:
        draw_status(right, run)
        right.set_title(f"row status per round\n({run.strategy}: no peer weights)", fontsize=TITLE)
    fig.suptitle(title, fontsize=HEADLINE)
    return fig


def overview_figure(
    run: Run,
    curves: Mapping[str, Any],
    stats: Sequence[ClientStats],
    matrix: PeerMatrix | None,
    share: tuple[float, float] | None,
    title: str,
    path: Path,
) -> Path:
    """``build_overview`` saved to ``path``."""
    return _save(build_overview(run, curves, stats, matrix, share, title), path)


def build_accuracy(run: Run, curves: Mapping[str, Any], title: str) -> Figure:
    """Online (left) and received-prompt (right) accuracy per round, overall and per client, each above the
    clients scored per round."""
    fig = _figure(11, 4.6)
    grid = fig.add_gridspec(2, 2, height_ratios=[4.0, 1.0])
    left = fig.add_subplot(grid[0, 0])
    right = fig.add_subplot(grid[0, 1], sharey=left)
    draw_accuracy(left, curves, run.domains, "acc", with_received=False)
    draw_accuracy(right, curves, run.domains, "acc_before")
    for ax in (left, right):
        mark_switches(ax, switch_rounds(run.rows))
    left.set_title("online accuracy (after local adaptation)", fontsize=TITLE)
    right.set_title("received prompt, before adaptation", fontsize=TITLE)
    _legend(left)
    _domain_legend(right, run.domains, fontsize=SMALL, loc="upper center", ncol=4)
    for column, ax in enumerate((left, right)):
        ax.set_xlabel("")
        ax.tick_params(axis="x", labelbottom=False)
        draw_counts(fig.add_subplot(grid[1, column], sharex=ax), curves, run.num_clients)
    fig.suptitle(title, fontsize=TITLE)
    return fig


def accuracy_figure(run: Run, curves: Mapping[str, Any], title: str, path: Path) -> Path:
    """``build_accuracy`` saved to ``path``."""
    return _save(build_accuracy(run, curves, title), path)


def build_status(run: Run, title: str) -> Figure:
    """What happened to each client in each round."""
    fig = _figure(9, 1.5 + 0.28 * min(run.num_clients, 24))
    ax = fig.add_subplot()
    draw_status(ax, run)
    ax.set_title(title, fontsize=TITLE)
    return fig


def status_figure(run: Run, title: str, path: Path) -> Path:
    """``build_status`` saved to ``path``."""
    return _save(build_status(run, title), path)


def build_peers(run: Run, matrix: PeerMatrix, xi_rule: bool, title: str) -> Figure:
    """Left: peer weights w_ij (rows sum to 100%); right: the weight of j in i's next prompt (ξ_ij)."""
    size = 3.2 + 0.32 * min(run.num_clients, LABELLED_CLIENTS)
    fig = _figure(2 * size + 1.2, size + 0.3)
    axes = fig.subplots(1, 2)
    draw_matrix(axes[0], matrix.weights, run.domains, "peer weight w_ij (%):\nshare of peer j in i's peer part")
    right = "ξ_ij (%): weight of upload j in i's next prompt" if xi_rule else "weight of memory j in P̂_i (%)"
    image = draw_matrix(axes[1], matrix.mixing, run.domains, right + "\n(diagonal: 1 − γ_i)", diagonal=True)
    fig.colorbar(image, ax=axes[1], fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=TITLE)
    return fig


def peers_figure(run: Run, matrix: PeerMatrix, xi_rule: bool, title: str, path: Path) -> Path:
    """``build_peers`` saved to ``path``."""
    return _save(build_peers(run, matrix, xi_rule, title), path)


def _short(name: str, width: int = 64) -> str:
    """A folder name cut in its middle to ``width`` characters (the report page has it whole)."""
    return name if len(name) <= width else name[: width // 2 - 1] + "…" + name[-(width - width // 2) :]


def build_compare(
    comparison: Comparison,
    curves: Sequence[Mapping[str, Any]],
    domains: Sequence[str | None],
    labels: Sequence[str],
    names: Sequence[str],
) -> Figure:
    """Top: every run's online and received-prompt accuracy per round (pooled over clients). Bottom left: each
    run's online accuracy so far minus the first run's, per round (the running gap that ends at the micro
    difference); bottom right: per-client online accuracy minus the first run's (points), clients grouped by
    domain. Runs are drawn under their ``labels`` (what differs between them); the key under the panels gives
    each label's folder (``names``)."""
    runs = comparison.runs
    fig = _figure(12, 7.8 + 0.22 * len(runs))
    axes = fig.subplots(2, 2)
    colors = [f"C{k % 10}" for k in range(len(runs))]
    for k, c in enumerate(curves):
        for ax, numerator in zip(axes[0], ("correct", "correct_before"), strict=True):
            rounds, acc = round_curve([c], numerator)
            ax.plot(rounds, 100 * acc, color=colors[k], linewidth=1.6, marker=".", markersize=4)
    reference = dict(zip(*cumulative_accuracy(curves[0]), strict=True))
    for k in range(1, len(runs)):
        t, acc = cumulative_accuracy(curves[k])
        gap = [(int(r), 100 * (a - reference[int(r)])) for r, a in zip(t, acc, strict=True) if int(r) in reference]
        axes[1, 0].plot([r for r, _ in gap], [g for _, g in gap], color=colors[k], linewidth=1.6, marker=".")
    axes[0, 0].set_title("online accuracy per round (all clients)", fontsize=TITLE)
    axes[0, 1].set_title("received prompt, before adaptation (all clients)", fontsize=TITLE)
    axes[1, 0].set_title("online accuracy so far, minus the reference's", fontsize=TITLE)
    for ax in (*axes[0], axes[1, 0]):
        _round_axis(ax)
    axes[0, 0].set_ylabel("top-1 accuracy of the round's batches (%)", fontsize=LABEL)
    axes[0, 1].set_ylabel("received prompt's accuracy (%)", fontsize=LABEL)
    axes[1, 0].set_ylabel("difference (accuracy points)", fontsize=LABEL)

    n = comparison.accuracy.shape[1]
    order = domain_order(domains) if len(domains) == n and None not in domains else list(range(n))
    width = 0.8 / max(1, len(runs) - 1)
    for k in range(1, len(runs)):
        delta = 100 * comparison.delta(k)[order]
        offset = (k - 1 - (len(runs) - 2) / 2) * width
        axes[1, 1].bar(np.arange(n) + offset, np.nan_to_num(delta), width=width, color=colors[k])
    for ax in axes[1]:
        ax.axhline(0, color="black", linewidth=0.8)
    client_ticks(axes[1, 1], "x", order, domains if len(domains) == n else [None] * n, long=True)
    if n <= LABELLED_CLIENTS:
        axes[1, 1].tick_params(axis="x", labelrotation=35)
        for label in axes[1, 1].get_xticklabels():
            label.set_horizontalalignment("right")
            label.set_rotation_mode("anchor")
    axes[1, 1].set_xlabel("client" + (" (grouped by shift domain)" if order != list(range(n)) else ""))
    axes[1, 1].set_ylabel("difference (accuracy points)", fontsize=LABEL)
    axes[1, 1].set_title("per-client online accuracy minus the reference's (paired)", fontsize=TITLE)
    axes[1, 1].grid(axis="y", alpha=0.3)

    handles = [Line2D([], [], color=colors[k], linewidth=1.6, marker=".") for k in range(len(runs))]
    entries = []
    for k, (run, label, name) in enumerate(zip(runs, labels, names, strict=True)):
        state = "" if run.complete else " [incomplete]"
        entries.append(f"{label}{' (reference)' if k == 0 else ''}{state}:  {_short(name)}")
    fig.legend(
        handles,
        entries,
        loc="outside lower center",  # above it, the key would cover the suptitle
        ncol=1 if len(runs) <= 4 else 2,
        fontsize=SMALL,
        title="runs (label: folder)",
        title_fontsize=SMALL,
        frameon=False,
    )
    others = ", ".join(labels[1:])
    fig.suptitle(_wrap(f"{others} against the reference, {labels[0]}", 110), fontsize=HEADLINE)
    return fig


def compare_figure(
    comparison: Comparison,
    curves: Sequence[Mapping[str, Any]],
    domains: Sequence[str | None],
    labels: Sequence[str],
    names: Sequence[str],
    path: Path,
) -> Path:
    """``build_compare`` saved to ``path``."""
    return _save(build_compare(comparison, curves, domains, labels, names), path)


def _legends_outside(fig: Figure) -> Figure:
    """Every axes legend of ``fig`` gathered into one legend right of the panels, where it covers no data."""
    handles: list[Any] = []
    texts: list[str] = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        wanted = [t.get_text() for t in legend.get_texts()]
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if text in wanted and text not in texts:
                handles.append(handle)
                texts.append(text)
        legend.remove()
    if handles:
        width, height = fig.get_size_inches()
        fig.set_size_inches(width + 1.8, height)
        fig.set_layout_engine("constrained")
        fig.legend(handles, texts, loc="outside right upper", fontsize=TINY, frameon=False)
    return fig


def build_signals(curves: Mapping[str, Any], title: str) -> Figure:
    """FedRAPP's r, μ, γ and same-domain peer share per client per round (the benchmark's ``fedrapp_figure``,
    its legends gathered right of the panels)."""
    made: list[Figure] = []
    fedrapp_figure(curves, title, Path("signals.png"), save=lambda fig, _: made.append(fig))
    return _legends_outside(made[0])


def signals_figure(curves: Mapping[str, Any], title: str, path: Path) -> Path:
    """``build_signals`` saved to ``path`` (palette PNG)."""
    return _save(build_signals(curves, title), path)
