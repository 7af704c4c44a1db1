"""The report page: ``report.md`` and its figures for one run, or a comparison page for several.

``write_report([run_dir])`` writes into ``run_dir/report/`` (or ``out``): ``report.md``, ``overview.png``
(the run at a glance), ``accuracy.png``, ``status.png``, ``peers.png`` (rules with peer weights) and
``fedrapp.png`` (FedRAPP's r, μ, γ and same-domain share per client per round).

``write_report([a, b, ...], out)`` writes a comparison page into ``out`` (default: a ``compare-…`` folder
beside the first run): ``report.md`` and ``compare.png``, plus every run's own report under ``runs/<name>/``.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedrapp_app.bench.rows import write_text_atomic
from fedrapp_app.bench.schema import RUNNER_KEYS
from fedrapp_app.config.privacy import privacy_words
from fedrapp_app.recording.results import outcome_summary, rule_failures, unmoved_warning
from fedrapp_app.report import figures
from fedrapp_app.report.runs import ROUNDS_FILE, Run, RunError, load_run, reference_beside
from fedrapp_app.report.tables import (
    XI_RULES,
    ClientStats,
    Comparison,
    Totals,
    WallTime,
    client_stats,
    compare,
    config_changes,
    events,
    fedrapp_signals,
    label_keys,
    mean_share,
    peer_matrix,
    round_curves,
    run_labels,
    same_domain_share,
    statuses_of,
    summary_mismatches,
    totals,
    wall_time,
)

REPORT_FILE = "report.md"
#: At most this many failed/rejected/missing/skipped rows are listed one by one.
MAX_EVENTS = 25


def _pct(value: float, digits: int = 2) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:.{digits}f}"


def _secs(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{0.0 if abs(value) < 0.05 else value:.1f}"  # no "-0.0" from a difference of rounded clocks


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _value(value: Any) -> str:
    return "(absent)" if value is None else f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _one_line(text: str, width: int = 140) -> str:
    line = " ".join(str(text).split())
    return (line[: width - 1] + "…" if len(line) > width else line).replace("|", "\\|")


# ---------------------------------------------------------------------------------------------- sections
def _accuracy_section(run: Run, t: Totals) -> str:
    out = io.StringIO()
    out.write("## Accuracy\n\n")
    out.write(
        "Online accuracy counts each sample once, predicted in the round it arrived after the client adapted on "
        "its batch (as in the paper); the received prompt's accuracy is the prompt the server sent, on the same "
        "samples before adaptation: the gap isolates what the local step added, the received prompt what aggregation "
        "brought. Recomputed from `rounds.jsonl`.\n\n"
    )
    out.write(
        _table(
            ["", "micro (over samples)", "macro (over clients)"],
            [
                ["online accuracy (%)", f"**{_pct(t.micro)}**", _pct(t.macro)],
                ["received prompt, before adaptation (%)", _pct(t.micro_received), _pct(t.macro_received)],
            ],
        )
    )
    out.write(
        f"\n{t.samples} samples scored in {t.rounds} rounds by {t.clients_scored} of {run.num_clients} clients.\n"
    )
    out.write(_reference_line(run, t))
    out.write(_movement_line(run))
    mismatches = summary_mismatches(run, t)
    if mismatches:
        out.write(
            "\n**summary.json disagrees with rounds.jsonl** (a resumed run whose rows were rewritten, or an edited "
            "file): " + "; ".join(mismatches) + ".\n"
        )
    out.write("\n![accuracy per round](accuracy.png)\n\n")
    return out.getvalue()


def _reference_line(run: Run, t: Totals) -> str:
    """Is this accuracy good? The none-fed run beside it on the same streams (a paired gain), or how to get one."""
    if run.strategy == "none-fed":
        return ""
    folder = reference_beside(run)
    if folder is None:
        return (
            f"\nIs {_pct(t.micro)}% good? No none-fed run on the same streams is beside this one to tell: "
            "`fedrapp-sim --compare` with this run's `-c` runs none-fed, FedAvg, FedRAPP and its trust option on "
            "this setting over three seeds (paired gains, 95% intervals; docs/choosing.md).\n"
        )
    reference = load_run(folder)
    c = compare([reference, run])
    return (
        f"\nBeside it, none-fed on the same streams (`{reference.name}`): {_pct(c.totals[0].micro)}% micro, so this "
        f"run gains **{100 * (t.micro - c.totals[0].micro):+.2f} points** (per client: "
        f"{c.paired(1).format(signed=True)}). One seed: `fedrapp-sim --compare` pairs the rules over several.\n"
    )


def _shift_section(run: Run) -> str:
    """Calibration, accuracy per shift domain, the switches and the held-out clients (``outcome_summary`` of the
    rows); empty for rows that carry none of them (runs of earlier versions)."""
    o = outcome_summary(run.rows)
    if o["ece"] is None and o["ece_before"] is None and not o["per_domain_samples"]:
        return ""
    out = io.StringIO()
    out.write("## Calibration and shift\n\n")
    if o["ece"] is not None or o["ece_before"] is not None:
        before, after = o["ece_before"], o["ece"]
        out.write(
            f"Expected calibration error (15 bins): {'–' if after is None else _pct(after)}% after adaptation, "
            f"{'–' if before is None else _pct(before)}% with the received prompt before it.\n\n"
        )
    if o["per_domain_samples"]:
        rows = [[d, n, _pct(o["per_domain_accuracy"].get(d, float("nan")))] for d, n in o["per_domain_samples"].items()]
        out.write(_table(["shift domain", "samples", "online accuracy (%)"], rows) + "\n")
    s = o["switches"]
    if s:
        out.write(
            f"{s['switches']} domain switches (dotted in the accuracy figures): {_pct(s['post_switch_accuracy'])}% "
            f"on the first batch after one. {_recovery_words(s)} {_forgetting_words(s)} (docs/shift.md)\n\n"
        )
    if o["held_out_samples"]:
        out.write(f"Held-out clients: {_pct(o['held_out_accuracy'])}% on {o['held_out_samples']} samples.\n\n")
    if o["per_domain_samples"]:
        out.write("![accuracy per shift domain over the stream](domains.png)\n\n")
    return out.getvalue()


def _movement_line(run: Run) -> str:
    """How often the local method moved no prompt, and the warning when it hardly ever did."""
    o = outcome_summary(run.rows)
    share = o["unmoved_share"]
    if share is None:
        return ""
    text = f"The local method moved no prompt in {_pct(share, 1)}% of the scored client-rounds"
    text += f" (commonest reason: {o['unmoved_reason']}).\n" if share else ".\n"
    warning = unmoved_warning(o)
    return text + (f"\n> **Warning.** {warning[0].upper()}{warning[1:]}.\n" if warning else "") + "\n"


def domains_seen(run: Run) -> dict[int, str]:
    """On moving streams, each client's domains in the order it met them ("blur:2 → contrast:2", "mixed"), for
    the client table's domain column."""
    seen: dict[int, list[str]] = {}
    for row in sorted(run.rows, key=lambda r: int(r["round"])):
        if row.get("status") == "ok" and row.get("domain"):
            order = seen.setdefault(int(row["client"]), [])
            if not order or order[-1] != row["domain"]:
                order.append(str(row["domain"]))
    out = {}
    for client, order in seen.items():
        distinct = list(dict.fromkeys(order))
        out[client] = " → ".join(order) if len(order) <= 4 else f"{len(distinct)} domains, {len(order) - 1} switches"
    return out


def _clients_section(run: Run, stats: Sequence[ClientStats], shares: dict[int, tuple[float, float]]) -> str:
    statuses = statuses_of(run)
    headers = [
        "client",
        "domain",
        "online acc. (%)",
        "received prompt (%)",
        "samples",
        "rounds scored",
        *statuses,
        "skipped samples",
    ]
    if shares:
        headers.append("peer weight on own domain (%)")
    moving = domains_seen(run)
    rows = []
    for s in stats:
        row = [
            s.client,
            s.domain or moving.get(s.client, "–"),
            _pct(s.accuracy),
            _pct(s.accuracy_received),
            s.samples,
            s.rounds_scored,
            *(s.statuses[x] for x in statuses),
            s.skipped_samples,
        ]
        if shares:
            share = shares.get(s.client)
            row.append("–" if share is None else f"{_pct(share[0], 0)} (uniform {_pct(share[1], 0)})")
        rows.append(row)
    out = io.StringIO()
    out.write("## Clients\n\n")
    out.write(
        "Statuses count the client's rows: `ok` scored, `failed` (its ClientApp raised), `rejected` (an invalid "
        "upload), `missing` (no reply in time), `exhausted` (its stream had ended), `skipped` (a batch with no "
        "decodable sample); skipped samples are undecodable images dropped from its batches.\n\n"
    )
    out.write(_table(headers, rows))
    unscored = (run.summary or {}).get("unscored") or {}
    if unscored:
        out.write("\nSamples never scored (from summary.json):\n\n")
        for client, info in sorted(unscored.items(), key=lambda kv: int(kv[0])):
            info = info if isinstance(info, dict) else {"samples": info}
            reasons = info.get("reasons") or [info.get("reason") or "no reason recorded"]
            samples = "unknown number of" if info.get("samples") is None else info["samples"]
            out.write(f"- client {client}: {samples} samples; {_one_line('; '.join(map(str, reasons)))}\n")
    listed = events(run)
    if listed:
        out.write(f"\nRows that were not scored ({len(listed)}):\n\n")
        for row in listed[:MAX_EVENTS]:
            reason = _one_line(row.get("reason", "")) or "no reason recorded"
            out.write(f"- round {row['round']}, client {row['client']}: {row['status']} ({reason})\n")
        if len(listed) > MAX_EVENTS:
            out.write(f"- … and {len(listed) - MAX_EVENTS} more (see `{ROUNDS_FILE}`)\n")
    out.write("\n![row status per client and round](status.png)\n\n")
    return out.getvalue()


def _peers_section(run: Run, shares: dict[int, tuple[float, float]]) -> str:
    xi = run.strategy in XI_RULES
    out = io.StringIO()
    out.write("## Who learns from whom\n\n")
    if xi:
        what = (
            f"{run.strategy} mixes the uploads: client i's next prompt is Σ_j ξ_ij·P̃_j. Left: the peers' "
            "part of ξ renormalised (w_ij = ξ_ij / Σ_{k≠i} ξ_ik); right: ξ itself, diagonal 1 − γ_i"
        )
    else:
        what = (
            f"{run.strategy}: client i's next prompt is (1 − γ_i)·M_i + γ_i·Σ_j w_ij·M_j. Left: the peer weights "
            "w_ij; right: the weight of memory j in it, γ_i·w_ij (diagonal 1 − γ_i)"
        )
    out.write(
        f"{what}. Both are averaged over the rounds client i was scored in (w over those in which it had "
        "peers; a peer absent in a round weighs 0 there). Rows: receivers, columns: sources"
        + (", grouped by shift domain (client i has domain i mod D of `testbed-domains`)" if shares else "")
        + ".\n\n"
    )
    share = mean_share(shares)
    if share is not None:
        out.write(
            f"Peer weight on same-domain peers, mean over clients: **{_pct(share[0], 1)}%** "
            f"(equal weights on every other client would give {_pct(share[1], 1)}%).\n\n"
        )
    out.write("![peer weights](peers.png)\n\n")
    return out.getvalue()


def _signals_section(run: Run) -> str:
    signals = fedrapp_signals(run)
    rows = [[c, s.informative, s.r.format(1, 2), s.mu.format(1, 3), s.gamma.format(1, 3)] for c, s in signals.items()]
    return (
        "## FedRAPP's server signals\n\n"
        "Per client, mean ± std over its scored rounds: reliability r (z-scores of the entropy drop, the "
        "post-adaptation entropy and the drift), memory rate μ (weight kept on the old memory) and peer share γ; "
        "an update counts when ‖Δ‖ > 1e-8 (an AdaPrompt buffer that is not full yet does not update).\n\n"
        + _table(["client", "rounds with an update", "r", "μ", "γ"], rows)
        + "\n![r, mu, gamma per round](fedrapp.png)\n\n"
    )


def _time_section(w: WallTime) -> str:
    if w.total_is_partial:
        total_label, total = "total (start to the last row written so far)", _secs(w.total)
    elif w.from_files:
        total_label = "total, from opening the run's files to the summary (setup began earlier)"
        total = _secs(w.total)
    else:
        total_label, total = "total (start to the summary)", _secs(w.total)
    setup = "setup (start to the first round)"
    if w.before_files is not None and w.before_files >= 0.05:
        setup += f", of which {_secs(w.before_files)} s before the run's files were opened"
    rest_label = "rest (between the rounds: sampling, checkpoints; after the last: results)"
    if w.other is not None:
        rest = _secs(w.other)
    elif w.overlap is not None:
        rest = f"n/a: setup began at least {_secs(w.overlap)} s before the total's clock"
    elif w.from_files and w.remainder is not None:
        rest = f"at least {_secs(w.remainder)} (setup began before the total's clock)"
    else:
        rest = "n/a"
    rows = [
        [total_label, total],
        [setup, _secs(w.setup)],
        ["rounds", _secs(w.rounds)],
        ["… server rule (aggregation)", _secs(w.server)],
        ["… client compute, slowest client of each round summed", _secs(w.client_slowest)],
        [rest_label, rest],
    ]
    if w.rounds_before_resume is not None:
        rows.append(["rounds before the resume (an earlier session, not in the total)", _secs(w.rounds_before_resume)])
    rows.append(
        ["client compute, all client rounds summed (client-seconds, not a part of the total)", _secs(w.client_sum)]
    )
    how = "Setup, rounds and rest are consecutive and add up to the total. " if w.other is not None else ""
    if w.from_files and not w.total_is_partial:
        how += (
            "`summary.json`'s `seconds` counts from when the run opened its files, its `setup_seconds` from the "
            "server's start, earlier (the run lock, counting the SuperNodes when num-clients = 0, provenance); "
            "when the server started is read from the run folder's `.lock`, which this folder lacks or which "
            "a later session rewrote, so the setup and the total overlap and the rest is not known exactly. "
        )
    return (
        "## Wall time\n\n"
        "Seconds. " + how + "Clients of a round run in parallel under `flwr run` and one after another "
        "in-process, so the round's client time lies between the slowest client and the sum; what a round spends "
        "beyond its clients and the server rule is Flower's messaging and waiting. n/a: this run's files do not "
        "record it.\n\n" + _table(["part", "seconds"], rows) + "\n"
    )


def _launch_section(launch: dict | None) -> str:
    """The fedrapp-sim command's phases (``launch.json``): what the user waited, startup included."""
    if not launch:
        return ""
    phases = [p for p in launch["phases"] if isinstance(p, dict)]
    rows = [[str(p.get("phase")), _secs(p.get("seconds")), str(p.get("what", ""))] for p in phases]
    total = sum(float(p.get("seconds") or 0.0) for p in phases)
    rows.append(["**total**", _secs(total), "the launcher's start to its last mark"])
    names = [p.get("phase") for p in phases]
    later = (
        ""
        if "report" in names
        else " This report was written while the launcher ended the run: the phases after it (the status, the "
        "stop, the report) are in `launch.json` and the launcher's last line, and `fedrapp-report` redraws this "
        "page with them."
    )
    return (
        "### What the command waited for (fedrapp-sim)\n\n"
        "Seconds, consecutive from the moment `fedrapp-sim` started: they add up to the wall time of the command. "
        "The server's phases (from the ServerApp's start to the results) are the ones above, placed on the "
        "launcher's clock." + later + "\n\n" + _table(["phase", "seconds", "what"], rows) + "\n"
    )


def _config_section(run: Run) -> str:
    out = io.StringIO()
    out.write("## Config and provenance\n\n")
    resolved = run.provenance.get("resolved") or {}
    changes = [c for c in config_changes(run.config) if c[0] not in RUNNER_KEYS]  # where it writes: named above
    settings = [c for c in changes if c[0] not in resolved]
    if settings:
        out.write("Settings that differ from this version's defaults (`fedrapp_app.config.DEFAULTS`):\n\n")
        out.write(_table(["key", "this run", "default"], [[k, _value(v), _value(d)] for k, v, d in settings]))
    else:
        out.write("Every setting has its default value.\n")
    for key, value, _ in (c for c in changes if c[0] in resolved):
        out.write(f"\nSet by the run when it started: {key} = {_value(value)} ({resolved[key]}).\n")
    p = run.provenance
    git = p.get("git") or {}
    commit = git.get("commit") or "unknown (not a git checkout)"
    dirty = " (with uncommitted changes)" if git.get("dirty") else ""
    started = p.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, int | float) else "?"
    versions = ", ".join(f"{k} {v}" for k, v in (p.get("versions") or {}).items() if v)
    out.write(
        f"\nCommit `{commit}`{dirty}; started {when}; Python {p.get('python', '?')} on {p.get('platform', '?')}.\n\n"
        f"Versions: {versions or 'unknown'}.\n"
    )
    components = p.get("components") or {}
    for role, label in (("rule", "Server rule"), ("method", "Local method")):
        if role in components:
            out.write(f"\n{label}: {component_text(components[role])}.\n")
    return out.getvalue()


def component_text(found: dict[str, Any]) -> str:
    """Where a rule or method came from, as config.json's ``components`` says (``provenance_of``), in words."""
    if found.get("parts"):
        return f"`{found.get('name')}`, made of " + " and ".join(component_text(part) for part in found["parts"])
    if found.get("file"):
        digest = (found.get("sha256") or "?")[:12]
        return f"`{found.get('name')}` from the file `{found['file']}` (SHA-256 {digest}…)"
    where = f"{found.get('distribution')} {found.get('version')}"
    return f"`{found.get('name')}` from {where} (entry point {found.get('entry_point')})"


def _rule_failure_text(run: Run) -> str:
    """A banner for a run whose server rule failed in some rounds (their rows hold ``rule_error``)."""
    failed = rule_failures(run.rows)
    if not failed["count"]:
        return ""
    return (
        f"> **The server rule failed in {failed['count']} round(s)** ({', '.join(map(str, failed['rounds']))}): the "
        "clients were scored, but the server's state did not move and every client was sent again what it was sent. "
        f"Last error: `{failed['last_error']}`.\n\n"
    )


# ---------------------------------------------------------------------------------------------- one run
def _last_write(run: Run) -> float | None:
    try:
        return (run.path / ROUNDS_FILE).stat().st_mtime
    except OSError:
        return None


def _privacy_section(run: Run) -> str:
    """Under dp: each client's privacy loss after its last release (from the rows' ``dp_epsilon``) and the budget;
    empty for a run without dp."""
    spent: dict[int, float] = {}
    for row in run.rows:
        if row.get("dp_epsilon") is not None:
            spent[int(row["client"])] = float(row["dp_epsilon"])
    if not spent:
        return ""
    cfg = run.config
    budget, delta = cfg.get("dp-epsilon"), cfg.get("dp-delta")
    worst = max(spent.values())
    rows = [[c, "∞" if math.isinf(e) else f"{e:.3g}"] for c, e in sorted(spent.items())]
    text = "∞ (clipping without noise)" if math.isinf(worst) else f"{worst:.3g}"
    seeded = bool((run.summary or {}).get("noise_seeded"))
    return (
        "## Privacy\n\n"
        f"Client-level differential privacy (`dp = true`, docs/privacy.md): each client's whole stream within "
        f"epsilon = {budget} at delta = {delta} (PLD accountant); the largest epsilon spent is {text}. The server "
        "saw every upload clipped and noised and only the fields docs/privacy.md lists; the accuracy on this page "
        "comes from the outcome files the clients kept. Which clients took part in a round and the streams' "
        "lengths are public.\n\n"
        + (
            "**The noise was seeded** (`FEDRAPP_DP_SEED`): an experiment's noise, which anyone who knows the secret "
            "can remove; a deployment leaves it unset.\n\n"
            if seeded
            else ""
        )
        + _table(["client", "epsilon spent"], rows)
        + "\n"
    )


def write_run_report(run: Run, out: Path, regenerate: str) -> Path:
    """``report.md`` and the figures of one run into ``out``; returns the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    stats = client_stats(run)
    t = totals(stats, run)
    curves = round_curves(run)
    matrix = peer_matrix(run)
    shares = same_domain_share(matrix, run.domains) if matrix is not None else {}
    head = figures.headline(run, t.micro, t.macro, t.samples)
    figures.overview_figure(run, curves, stats, matrix, mean_share(shares), head, out / "overview.png")
    figures.accuracy_figure(run, curves, head, out / "accuracy.png")
    figures.status_figure(run, f"{run.name}: row status per client and round", out / "status.png")
    figures.domain_figure(run, f"{run.name}: online accuracy per shift domain", out / "domains.png")
    if matrix is not None:
        figures.peers_figure(
            run, matrix, run.strategy in XI_RULES, f"{run.name}: who learns from whom", out / "peers.png"
        )
    if run.strategy == "fedrapp":
        figures.signals_figure(curves, f"{run.name}: FedRAPP's signals per client", out / "fedrapp.png")

    page = io.StringIO()
    page.write(f"# Run `{run.name}`: {run.title}\n\n")
    if run.summary is None:
        page.write(f"> **Incomplete run.** {run.status}. The numbers below cover what was written so far.\n\n")
    elif not run.complete:
        page.write(f"> **Incomplete run.** {run.status}. See the samples never scored under Clients.\n\n")
    page.write(_rule_failure_text(run))
    page.write(f"Folder: `{run.path}`. Status: {run.status}. Regenerate: `{regenerate}`.\n\n")
    for note in run.notes:
        page.write(f"Note: {note}.\n\n")
    page.write("![the run at a glance](overview.png)\n\n")
    page.write(_accuracy_section(run, t))
    page.write(_shift_section(run))
    page.write(_privacy_section(run))
    page.write(_clients_section(run, stats, shares))
    if matrix is not None:
        page.write(_peers_section(run, shares))
    if run.strategy == "fedrapp":
        page.write(_signals_section(run))
    page.write(_time_section(wall_time(run, _last_write(run))))
    page.write(_launch_section(run.launch))
    page.write(_config_section(run))
    path = out / REPORT_FILE
    write_text_atomic(path, page.getvalue())
    return path


# ---------------------------------------------------------------------------------------------- several
def default_compare_dir(runs: Sequence[Run]) -> Path:
    """``compare-<label a>-vs-<label b>…`` in the folder that holds the runs (their common parent), named by what
    the runs differ in (``run_labels``; a hash of the folders when that gets long)."""
    labels = run_labels(runs, _unique_names(runs))
    slug = "-vs-".join(re.sub(r"[^A-Za-z0-9.+]+", "-", label).strip("-") for label in labels)
    if len(slug) > 120:
        digest = hashlib.sha1("\n".join(str(run.path) for run in runs).encode()).hexdigest()[:8]
        slug = f"{slug[:60].rstrip('-')}-and-{len(runs) - 1}-more-{digest}"
    parent = Path(os.path.commonpath([str(run.path.resolve().parent) for run in runs]))
    return parent / f"compare-{slug}"


def _unique_names(runs: Sequence[Run]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
        out.append(run.name if seen[run.name] == 1 else f"{run.name}-{seen[run.name]}")
    return out


def _pairing_text(c: Comparison) -> str:
    keys = ", ".join(
        f"`{k}` ({' / '.join(repr(run.config.get(k, '(absent)')) for run in c.runs)})" for k in c.differing
    )
    if c.same_streams:
        also = f" They also differ in {keys}: that is what is compared." if c.differing else ""
        return (
            "Every client saw the same stream in every run (the same data keys, clients and seed: the streams' "
            f"fingerprint), so the per-client differences are paired.{also}\n\n"
        )
    return (
        f"**The clients did not see the same streams** (the runs differ in what fixes them: {keys or 'the data'}), "
        "so the per-client differences below are not paired; read them with that in mind.\n\n"
    )


def write_compare_report(runs: Sequence[Run], out: Path, regenerate: str) -> Path:
    """A comparison page of several runs (the first is the reference) plus each run's own report."""
    out.mkdir(parents=True, exist_ok=True)
    c = compare(runs)
    curves = [round_curves(run) for run in runs]
    names = _unique_names(runs)
    for run, name in zip(runs, names, strict=True):
        write_run_report(run, out / "runs" / name, f"fedrapp-report {run.path}")
    domains = max((run.domains for run in runs), key=len)
    labels = run_labels(runs, names)
    figures.compare_figure(c, curves, domains, labels, names, out / "compare.png")

    page = io.StringIO()
    page.write(f"# Comparison: {' vs '.join(f'`{label}`' for label in labels)}\n\n")
    page.write(
        f"Regenerate: `{regenerate}`. Reference: `{labels[0]}`; every difference is another run minus the "
        "reference, in accuracy points. Runs are labelled by the config keys they differ in"
        + (f" ({', '.join(f'`{k}`' for k in label_keys(runs))})" if label_keys(runs) else "")
        + "; the table below gives each label's folder and links its own report.\n\n"
    )
    page.write(_pairing_text(c))
    incomplete = [f"`{label}` ({run.status})" for run, label in zip(runs, labels, strict=True) if not run.complete]
    if incomplete:
        page.write(f"> **Incomplete runs**: {'; '.join(incomplete)}.\n\n")
    page.write("![accuracy per round and per-client differences](compare.png)\n\n")
    outcomes = [outcome_summary(run.rows) for run in runs]
    domain_names = sorted({d for o in outcomes for d in o["per_domain_accuracy"]})
    privacy = [privacy_words(run.config) for run in runs]
    if any(privacy):  # a dp run beside one without is not a like-for-like comparison: say which is which
        page.write(
            "Client-level differential privacy (docs/privacy.md): "
            + "; ".join(f"`{label}`: {words or 'off'}" for label, words in zip(labels, privacy, strict=True))
            + ".\n\n"
        )
    rows = []
    for k, (run, name, label, t) in enumerate(zip(runs, names, labels, c.totals, strict=True)):
        delta = "" if k == 0 else f"{100 * (t.micro - c.totals[0].micro):+.2f}"
        paired = "" if k == 0 else c.paired(k).format(signed=True)
        rows.append(
            [
                f"`{label}`" + (" (reference)" if k == 0 else ""),
                f"[{name}](runs/{name}/{REPORT_FILE})",
                run.strategy + (" + trust" if run.config.get("trust") else ""),
                run.method,
                "finished" if run.complete else "**incomplete**",
                _pct(t.micro),
                _pct(t.macro),
                _pct(t.micro_received),
                t.samples,
                t.rounds,
                delta,
                paired,
                "–" if outcomes[k]["ece"] is None else _pct(outcomes[k]["ece"]),
                *(_pct(outcomes[k]["per_domain_accuracy"][d]) if d in outcomes[k]["per_domain_accuracy"] else "–"
                  for d in domain_names),
            ]
        )  # fmt: skip
    page.write(
        _table(
            [
                "label",
                "run folder (its report)",
                "strategy",
                "method",
                "state",
                "online micro (%)",
                "online macro (%)",
                "received prompt micro (%)",
                "samples",
                "rounds",
                "Δ micro",
                "Δ per client, mean ± std",
                "ECE (%)",
                *(f"{d} (%)" for d in domain_names),
            ],
            rows,
        )
    )
    if domain_names:
        page.write(
            "\nECE: expected calibration error after adaptation; then the online accuracy in each shift domain.\n"
        )
    page.write("\n## Per client\n\nOnline accuracy (%) of each run; Δ: minus the reference (points).\n\n")
    headers = ["client", "domain", *(f"{label} (%)" for label in labels), *(f"Δ {label}" for label in labels[1:])]
    n_clients = c.accuracy.shape[1]
    table = []
    for j in range(n_clients):
        deltas = [c.delta(k)[j] for k in range(1, len(runs))]
        table.append(
            [
                j,
                domains[j] if j < len(domains) and domains[j] else "–",
                *(_pct(c.accuracy[k, j]) for k in range(len(runs))),
                *("–" if not math.isfinite(d) else f"{100 * d:+.2f}" for d in deltas),
            ]
        )
    page.write(_table(headers, table))
    unequal = [labels[k] for k in range(1, len(runs)) if not c.same_samples(k)]
    if unequal:
        page.write(
            f"\nSome clients scored a different number of samples in {', '.join(f'`{n}`' for n in unequal)} than "
            "in the reference (failed or missing rounds, an interrupted run): their accuracies are over different "
            "samples.\n"
        )
    for k in range(1, len(runs)):
        stat = c.paired(k)
        if stat.n:
            better = int((c.delta(k) > 0).sum())
            worse = int((c.delta(k) < 0).sum())
            page.write(
                f"\n`{labels[k]}` vs `{labels[0]}`: {better} clients better, {worse} worse, "
                f"{stat.n - better - worse} equal; mean Δ {stat.format(signed=True)} points"
                + (f", 95% t interval {stat.format_ci95()}" if stat.n > 1 else "")
                + ".\n"
            )
    write_text_atomic(out / REPORT_FILE, page.getvalue())
    return out / REPORT_FILE


def write_report(run_dirs: Sequence[Path] | Path | str, out: Path | None = None, outcomes: Sequence[Path] = ()) -> Path:
    """Write the report of one run folder, or the comparison of several; return the ``report.md`` path.

    One run: into ``out`` (default ``run_dir/report``). Several: into ``out`` (default
    :func:`default_compare_dir`), the first run being the reference. ``outcomes``: folders holding the outcome
    files that a dp run's clients kept on other hosts (``recording/outcomes.py``). ``RunError`` names the first bad
    file.
    """
    dirs = [Path(run_dirs)] if isinstance(run_dirs, str | Path) else [Path(d) for d in run_dirs]
    if not dirs:
        raise RunError("no run folder given: pass one or more (output-dir/run-name)")
    runs = [load_run(d, outcomes) for d in dirs]
    kept = "".join(f" --outcomes {Path(d).resolve()}" for d in outcomes)
    if len(runs) == 1:
        run = runs[0]
        target = Path(out) if out is not None else run.path / "report"
        return write_run_report(run, target, f"fedrapp-report {run.path}{kept}")
    target = Path(out) if out is not None else default_compare_dir(runs)
    regenerate = "fedrapp-report " + " ".join(str(run.path) for run in runs) + f" --out {target.resolve()}{kept}"
    return write_compare_report(runs, target, regenerate)


def _recovery_words(s: dict) -> str:
    """The recovery after a switch in words: how many switches got back to the level before them, and how fast."""
    recovered = s["switches"] - s["unrecovered"]
    if not recovered:
        return f"None of the {s['switches']} got back to the accuracy before it."
    mean = s["recovery_batches"]
    speed = (
        "each on its first batch after the switch"
        if mean == 0
        else f"after {mean:.2f} batches on average (0: the first batch after it)"
    )
    left = f"; {s['unrecovered']} never did" if s["unrecovered"] else ""
    return f"{recovered} of {s['switches']} got back to the accuracy before the switch: {speed}{left}."


def _forgetting_words(s: dict) -> str:
    """Forgetting on a return to a domain in words, its sign explained."""
    if s["forgetting"] is None:
        return "No client returned to a domain it had left."
    points = 100 * s["forgetting"]
    sign = "it forgot" if points > 0 else "nothing forgotten: the return was as accurate or more"
    return (
        f"Forgetting on a return to a domain ({s['returns']} returns; accuracy when it left minus on its return): "
        f"{points:+.2f} points ({sign})."
    )
