"""Figures of a benchmark, drawn from its rows alone (matplotlib, Agg backend: no display needed).

- ``curves_figure``: per-round accuracy of each compared method in one context (mean over seeds): online
  accuracy after local adaptation, and accuracy of the received prompt before adaptation.
- ``gains_figure``: each method's paired gain over none-fed with its 95% t interval over seeds, per context.
- ``fedrapp_figure``: for one FedRAPP cell, each client's reliability r, memory rate mu, peer share gamma
  and the share of its peer weight on clients of its own shift domain, over rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedrapp_app.bench.stats import Setting, Stat, round_curve  # noqa: E402

_STYLES = ("-", "--", ":", "-.")


def curves_figure(settings: Sequence[Setting], title: str, path: Path) -> Path:
    """Per-round online and received-prompt accuracy (%) of ``settings`` (one context), saved to ``path``."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for i, s in enumerate(settings):
        color = "black" if s.strategy == "zeroshot" else f"C{i % 10}"
        for ax, numerator in zip(axes, ("correct", "correct_before"), strict=True):
            rounds, acc = round_curve(s.rows, numerator)
            ax.plot(
                rounds,
                100 * acc,
                color=color,
                linestyle=_STYLES[(i // 10) % len(_STYLES)],
                linewidth=1.4,
                label=f"{s.method} (n={len(s.rows)})",
            )
    axes[0].set_title("online accuracy (after local adaptation)")
    axes[1].set_title("received prompt, before adaptation")
    for ax in axes:
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("top-1 accuracy of the round's batches (%)")
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gains_figure(gains: Mapping[str, Sequence[tuple[str, Stat]]], title: str, path: Path) -> Path:
    """Dot plot of paired gains (points) with 95% t intervals: ``gains[context] = [(method, gain), ...]``."""
    methods = list(dict.fromkeys(m for rows in gains.values() for m, _ in rows))
    contexts = list(gains)
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.32 * len(methods) * max(1, len(contexts) / 2)))
    step = 0.7 / max(1, len(contexts))
    for k, context in enumerate(contexts):
        for method, gain in gains[context]:
            y = methods.index(method) + (k - (len(contexts) - 1) / 2) * step
            low, high = gain.ci95()
            ax.plot([100 * low, 100 * high], [y, y], color=f"C{k}", linewidth=1.2)
            ax.plot(
                100 * gain.mean,
                y,
                "o",
                color=f"C{k}",
                markersize=4,
                label=context if method == gains[context][0][0] else None,
            )
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(methods)), methods, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("gain over none-fed, paired by seed (points): mean and 95% t interval")
    ax.grid(axis="x", alpha=0.3)
    if len(contexts) > 1:
        ax.legend(fontsize=8, loc="best")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _client_series(block: Mapping[str, Any], key: str) -> tuple[list[int], list[float]]:
    pairs = [(t, v) for t, v in zip(block["round"], block[key], strict=True) if v is not None]
    return [t for t, _ in pairs], [v for _, v in pairs]


def _uniform_share(domains: Sequence[str]) -> float | None:
    """Same-domain share a client would get with equal weights on every other client (mean over clients)."""
    if len(domains) < 2:
        return None
    return sum((domains.count(d) - 1) / (len(domains) - 1) for d in domains) / len(domains)


def fedrapp_figure(
    row: Mapping[str, Any], title: str, path: Path, save: Callable[[Any, Path], Any] | None = None
) -> Path:
    """r, mu, gamma and same-domain peer share per client over rounds for one FedRAPP cell.

    ``save(fig, path)`` replaces the default full-colour PNG (the run report saves a palette PNG).
    """
    clients = row["clients"]
    # Without shift domains (a real dataset) each client gets its own colour and there is no same-domain share.
    known = all(b.get("domain") is not None for b in clients.values())
    domain_of = {c: str(b["domain"]) if known else f"client {c}" for c, b in clients.items()}
    color_of = {d: f"C{i % 10}" for i, d in enumerate(sorted(set(domain_of.values())))}
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    panels = (
        ("r", "reliability r"),
        ("mu", "memory rate μ (weight of the old memory)"),
        ("gamma", "peer share γ"),
        ("same_domain_share", "peer weight on same-domain clients"),
    )
    seen_domain: dict[str, int] = {}
    for client, block in clients.items():
        domain = domain_of[client]
        style = _STYLES[seen_domain.get(domain, 0) % len(_STYLES)]
        seen_domain[domain] = seen_domain.get(domain, 0) + 1
        for ax, (key, _) in zip(axes.flat, panels, strict=True):
            rounds, values = _client_series(block, key)
            ax.plot(
                rounds,
                values,
                color=color_of[domain],
                linestyle=style,
                linewidth=1.2,
                marker=".",
                markersize=3,
                label=f"client {client} ({domain})" if known else domain,
            )
    for ax, (_, name) in zip(axes.flat, panels, strict=True):
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    share_ax = axes.flat[3]
    share_ax.set_ylim(-0.05, 1.05)
    uniform = _uniform_share(list(domain_of.values())) if known else None
    if uniform is not None:
        line = share_ax.axhline(uniform, color="grey", linestyle="--", linewidth=1, label="uniform weights")
        share_ax.legend(**({} if len(clients) <= 16 else {"handles": [line]}), fontsize=7, loc="best")
    for ax in axes[1]:
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(clients) <= 16:  # beyond, a legend would cover the panel; the colours still tell the domains
        axes.flat[0].legend(fontsize=7, ncol=2, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if save is None:
        fig.savefig(path, dpi=110)
    else:
        save(fig, path)
    plt.close(fig)
    return path
