"""Results of a run: one JSONL row per client per round, a summary JSON at the end, a progress line per round.

Files in the run folder:
- ``config.json``  the full validated config, library versions, git commit, start time, and where the server rule
  and the local method come from (``components``: distribution and version, or a module's file and hash);
- ``rounds.jsonl`` one row per sampled client per round (accuracy before/after adaptation, H_pre, H_post,
  reliability r, memory rate mu, peer weights, timings, status; ``rule_error`` in every row of a round whose
  server rule failed);
- ``summary.json`` micro and macro online accuracy, per-client accuracy, the rounds whose rule failed
  (``rule_failures``), the config and provenance (``components`` too).

``held_results`` says what a folder holds that a new run would overwrite (a new run is refused there: ``runlock``),
and ``clear_results`` removes a run's files for an explicit overwrite.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from fedrapp_app.metrics.calibration import Bins
from fedrapp_app.metrics.switches import Batch, switch_metrics
from fedrapp_app.privacy.upload import seeded
from fedrapp_app.recording.checkpoint import CLIENT_STATE_DIR, SERVER_FILE, ServerCheckpoint
from fedrapp_app.recording.outcomes import merge_outcomes, private_run, read_outcomes

log = logging.getLogger("fedrapp.results")

_LIBRARIES = ("fedrapp", "flwr", "torch", "transformers", "numpy", "ray", "tokenizers", "datasets")
#: Other distributions of the same import package (Flower's pre-releases are published as ``flwr-nightly``).
_ALSO_PUBLISHED_AS = {"flwr": ("flwr-nightly",)}


def provenance() -> dict[str, Any]:
    """Library versions, Python, platform and the git commit of the installed ``fedrapp_app`` sources."""
    versions: dict[str, str | None] = {}
    for lib in _LIBRARIES:
        versions[lib] = None
        for name in (lib, *_ALSO_PUBLISHED_AS.get(lib, ())):
            try:
                versions[lib] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return {
        "versions": versions,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git": git_state(Path(__file__).resolve().parents[1]),  # the fedrapp_app package
    }


def git_state(folder: Path) -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding ``folder``; commit None for a non-git install."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "."))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON through a temporary file and a rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=_json_default))
    os.replace(tmp, path)


def run_rows(run_dir: str | Path, folders: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """The rows of a run folder's ``rounds.jsonl`` ([] before its first round); under dp with the clients' outcome
    files merged (those in the run folder and in ``folders``: ``recording/outcomes.py``)."""
    run_dir = Path(run_dir)
    path = run_dir / "rounds.jsonl"
    if not path.is_file():
        return []
    rows = read_rows(path)
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()).get("config", {}) if config_path.is_file() else {}
    if private_run(config):
        merge_outcomes(rows, read_outcomes((run_dir, *folders)))
    return rows


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``rounds.jsonl``; a last line cut short by a killed writer is dropped (it has no checkpoint
    either), any other bad line is an error naming the file and line."""
    lines = path.read_text().split("\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):  # no newline after it: the writer died in the middle of the line
                log.warning("%s: dropped an incomplete last line (the run was killed while writing it)", path)
                break
            raise ValueError(f"{path}, line {number}: not a JSON row ({err})") from err
    return rows


#: Statuses of a client with no batch in a round while its stream goes on: dropped from it, a late joiner not yet
#: joined, a held-out client not due, or not sampled (``fraction`` < 1); such a row has no accuracy fields.
SITTING_OUT = ("dropped", "late", "not-due", "not-sampled")
#: How the progress line names each status of a row other than ok.
STATUS_WORDS = {
    "dropped": "dropped",
    "late": "not yet joined",
    "not-due": "held out, not due",
    "not-sampled": "not sampled",
    "failed": "failed",
    "rejected": "rejected",
    "missing": "missing",
    "exhausted": "stream ended",
    "skipped": "batch undecodable",
}


def comparable_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without what legitimately differs between two runs (timings, process and node ids, where a client
    ran: host, Ray node, device)."""
    out = []
    for r in rows:
        r = dict(r)
        for key in ("node", "round_seconds", "aggregate_seconds", "server_seconds", "host", "ray_node", "device"):
            r.pop(key, None)
        r["client_metrics"] = {
            k: v
            for k, v in r.get("client_metrics", {}).items()
            if not k.startswith("t-") and k not in ("pid", "model-loaded", "state-rebuilt")
        }
        out.append(r)
    return out


def progress_counts(rows: list[dict[str, Any]]) -> str:
    """``"6 of 8 ok, 1 dropped, 1 not yet joined"``: the round's rows by status (every client it concerned)."""
    counts = Counter(str(r["status"]) for r in rows)
    parts = [f"{counts.pop('ok', 0)} of {len(rows)} ok"]
    parts += [f"{n} {STATUS_WORDS.get(status, status)}" for status, n in sorted(counts.items())]
    return ", ".join(parts)


def unscored_samples(
    num_clients: int,
    num_samples: dict[int, int],
    rows: list[dict[str, Any]],
    stopped: str,
    capped: bool,
) -> tuple[bool, dict[int, dict[str, Any]]]:
    """(complete, unscored): whether the run scored every sample it set out to score, and per client the
    samples never scored with the reasons.

    A client's samples are its stream (``num_samples``, reported at discovery); scored and skipped (undecodable)
    samples come from ``rows``. A run that ended with the streams (or stopped early) is complete when nothing
    is left unscored. A run that stopped at ``num-rounds`` as asked (``capped``) is complete when every round a
    client was sampled in scored its batch: no failed, missing or rejected round, no client that never
    connected.
    """
    scored: dict[int, int] = defaultdict(int)
    skipped: dict[int, int] = defaultdict(int)
    lost: dict[int, list[str]] = defaultdict(list)
    for r in rows:
        c = r["client"]
        skipped[c] += int(r.get("skipped", 0) or 0)
        if r["status"] == "ok":
            scored[c] += int(r["num_examples"])
        elif r["status"] in ("failed", "missing", "rejected"):
            lost[c].append(f"round {r['round']} {r['status']}: {r.get('reason', '')}".rstrip(": "))
    unscored: dict[int, dict[str, Any]] = {}
    for c in range(num_clients):
        left = num_samples[c] - scored[c] - skipped[c] if c in num_samples else None
        short = left is None or left > 0
        if not (short or (capped and lost[c])):
            continue
        reasons = [] if c in num_samples else ["never connected: no node served this client"]
        if lost[c]:
            reasons.append(f"{len(lost[c])} round(s) without a valid reply, last: {lost[c][-1]}")
        if short and c in num_samples:
            reasons.append(f"stream not finished: {stopped}")
        unscored[c] = {"samples": left, "reasons": reasons}
    # Capped, the plan was num-rounds rounds: only lost rounds and absent clients fall short of it.
    complete = all(u["samples"] is not None and not lost[c] for c, u in unscored.items()) if capped else not unscored
    return complete, unscored


#: The keys of a row the summary reads (``unscored_samples``, ``outcome_summary``, ``rule_failures``); peer weights
#: and metrics stay out.
_OUTCOME_KEYS = ("round", "client", "status", "reason", "num_examples", "skipped", "correct", "calibration",
                 "calibration_before", "domains", "domain", "held_out", "moved", "why_unmoved",
                 "rule_error")  # fmt: skip


def movement(row: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether a scored row's local method moved its prompt (its ``updated`` statistic where it reports one, else a
    nonzero update norm), and why not where the method says (an AdaPrompt buffer that is not full yet); (None, "")
    when the row tells neither (a training-free method: nothing to move)."""
    metrics = row.get("client_metrics") or {}
    updated = metrics.get("stat-updated")
    if updated is None:
        norm = row.get("update_norm")
        return (None, "") if norm is None else (norm > 1e-8, "its update was zero")
    if updated:
        return True, ""
    fill = metrics.get("stat-buffer_fill")
    return False, "its buffer was not full (no pseudo-label confident enough)" if fill is not None else "no update"


def rule_failures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds whose server rule failed (``rule_error`` in their rows: the clients were scored, the server state
    stayed as it was and every client was sent again what it was sent): ``count``, ``rounds`` and ``last_error``."""
    failed: dict[int, str] = {}
    for row in rows:
        if row.get("rule_error"):
            failed[int(row["round"])] = str(row["rule_error"])
    rounds = sorted(failed)
    return {"count": len(rounds), "rounds": rounds, "last_error": failed[rounds[-1]] if rounds else None}


def outcome_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's scored rows say beyond accuracy (ours, issue 26), in row order:

    ``ece`` / ``ece_before``: the expected calibration error of every online prediction and of the received
    prompt's, from the rows' bins added up (None where the method gives no confidences); ``per_domain_accuracy``
    and ``per_domain_samples`` per shift domain; ``held_out_accuracy`` / ``held_out_samples``, the held-out
    clients' share (None without them); ``switches``: post-switch accuracy, recovery and forgetting
    (``switches.py``; None where no client's domain changed); ``unmoved_share``: the share of scored client-rounds
    in which the local method moved no prompt (None for a method with nothing to move) and ``unmoved_reason`` the
    commonest reason its statistics give."""
    ok = [r for r in rows if r.get("status") == "ok"]
    calibration: dict[str, Bins] = {}
    domains: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    batches: dict[int, list[Batch]] = defaultdict(list)
    for row in ok:
        for name in ("calibration", "calibration_before"):
            if name in row:
                bins = Bins(*(np.asarray(row[name][k]) for k in ("n", "correct", "confidence")))
                calibration[name] = calibration[name] + bins if name in calibration else bins
        for domain, (n, right) in (row.get("domains") or {}).items():
            domains[domain][0] += n
            domains[domain][1] += right
        if "domain" in row:
            batches[row["client"]].append(Batch(row["domain"], row["num_examples"], row["correct"]))
    held = [r for r in ok if r.get("held_out") and "correct" in r]  # under dp: those whose outcome is merged
    held_samples = sum(r["num_examples"] for r in held)
    moves = [(r["moved"], r.get("why_unmoved", "")) if "moved" in r else movement(r) for r in ok]
    judged = [(moved, why) for moved, why in moves if moved is not None]
    reasons = Counter(why or "no update" for moved, why in judged if not moved)
    return {
        "unmoved_share": sum(reasons.values()) / len(judged) if judged else None,
        "unmoved_reason": reasons.most_common(1)[0][0] if reasons else None,
        "ece": calibration["calibration"].ece if "calibration" in calibration else None,
        "ece_before": calibration["calibration_before"].ece if "calibration_before" in calibration else None,
        "per_domain_accuracy": {d: right / n for d, (n, right) in sorted(domains.items()) if n},
        "per_domain_samples": {d: n for d, (n, _) in sorted(domains.items())},
        "held_out_accuracy": sum(r["correct"] for r in held) / held_samples if held_samples else None,
        "held_out_samples": held_samples,
        "switches": switch_metrics([batches[c] for c in sorted(batches)]),
    }


def unmoved_warning(summary: dict[str, Any]) -> str:
    """A line for a run whose local method moved no prompt in most of its client-rounds ('' otherwise): the rule
    then had (almost) nothing to share, and every strategy gives about the same digits."""
    share = summary.get("unmoved_share")
    if share is None or share < 0.5:
        return ""
    what = "in any round" if share >= 1 else f"in {100 * share:.0f}% of its client-rounds"
    return (
        f"the local method moved no prompt {what} ({summary.get('unmoved_reason')}): the server rule had "
        f"{'nothing' if share >= 1 else 'little'} to share, so the strategies differ little (docs/methods.md)"
    )


class RunRecorder:
    """Writes the per-round rows and the summary of one run into ``run_dir``."""

    def __init__(
        self,
        run_dir: Path,
        config: dict[str, Any],
        resume_after: int | None = None,
        started: float | None = None,
        components: dict[str, Any] | None = None,
        resolved: dict[str, str] | None = None,
    ) -> None:
        """Start a run's files, or with ``resume_after = R`` continue them: rows of rounds after R (from a
        round that never reached its checkpoint) are dropped and the totals are rebuilt from the rest.
        ``started``: epoch seconds the run (this session) started, which the summary's ``seconds`` count from
        (default: now), so that they cover the setup before the files were opened too. ``components``: where the
        rule and the method come from (``registry.entry_points.provenance_of``); a resumed run without them keeps
        config.json's. ``resolved``: keys the run set itself when it started (``num-clients`` from 0: the
        SuperNodes), each with what the config said, so that a report tells them from the user's settings."""
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.started = time.time() if started is None else started
        self.provenance = provenance()
        if components is None and resume_after is not None and (self.run_dir / "config.json").is_file():
            components = json.loads((self.run_dir / "config.json").read_text()).get("components")
        if components is not None:
            self.provenance["components"] = components
        if resolved:
            self.provenance["resolved"] = dict(resolved)
        #: the clients and their streams' sizes, once discovery knows them (``expect``): what a failed run left
        self.num_clients = int(config.get("num-clients", 0) or 0)
        self.num_samples: dict[int, int] = {}
        self.rounds_path = self.run_dir / "rounds.jsonl"
        self.summary_path = self.run_dir / "summary.json"
        self.correct: dict[int, int] = defaultdict(int)
        self.correct_before: dict[int, int] = defaultdict(int)
        self.seen: dict[int, int] = defaultdict(int)  # samples scored (under dp: whether or not the server knows how)
        self.known: dict[int, int] = defaultdict(int)  # of those, the samples whose outcome this folder holds
        self.skipped: dict[int, int] = defaultdict(int)
        self.rows: list[dict[str, Any]] = []
        #: under dp: how the clients' outcome files were merged (:meth:`collect_outcomes`); None before
        self.outcomes: dict[str, Any] | None = None
        self.rounds = 0
        self.resumed_after = resume_after
        kept: list[dict[str, Any]] = []
        if resume_after is not None and self.rounds_path.is_file():
            kept = [r for r in read_rows(self.rounds_path) if r["round"] <= resume_after]
        else:
            private = {"noise_seeded": seeded()} if private_run(config) else {}  # as this host's environment says
            if private.get("noise_seeded"):
                log.warning(
                    "dp = true with FEDRAPP_DP_SEED set: the noise is seeded (experiments only: whoever knows the "
                    "secret can remove it); config.json and summary.json record noise_seeded"
                )
            write_json_atomic(
                self.run_dir / "config.json",
                {"config": config, **private, **self.provenance, "started": self.started},
            )
        tmp = self.rounds_path.with_name(self.rounds_path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, default=_json_default) + "\n" for r in kept))
        os.replace(tmp, self.rounds_path)
        # A summary of an earlier attempt would describe a run that goes on now: it is written again at the end.
        self.summary_path.unlink(missing_ok=True)
        self._count(kept)
        self.rounds = resume_after or 0

    def _count(self, rows: list[dict[str, Any]]) -> None:
        # What the summary needs of each row, not the row: peer weights and metrics would grow with the run.
        for r in rows:
            if r.get("status") == "ok":
                r["moved"], r["why_unmoved"] = movement(r)
        self.rows.extend({k: r[k] for k in _OUTCOME_KEYS if k in r} for r in rows)
        for r in rows:
            self.skipped[r["client"]] += int(r.get("skipped", 0) or 0)
            if r["status"] == "ok":
                self.seen[r["client"]] += r["num_examples"]
                if "correct" in r:  # under dp, only once the client's outcome is merged
                    self.known[r["client"]] += r["num_examples"]
                    self.correct[r["client"]] += r["correct"]
                    self.correct_before[r["client"]] += r["correct_before"]

    def collect_outcomes(self, folders: tuple[Path, ...] = ()) -> None:
        """Under dp: merge the outcome files of the clients that ran on this host (the run folder's
        ``client-state/``; and ``folders``) into the rows the summary reads, and count again. ``rounds.jsonl``
        stays the server's view."""
        if not private_run(self.config) or not self.rounds_path.is_file():
            return
        rows = read_rows(self.rounds_path)
        outcomes = read_outcomes((self.run_dir, *folders))
        merge_outcomes(rows, outcomes)
        for counter in (self.correct, self.correct_before, self.seen, self.known, self.skipped):
            counter.clear()
        self.rows = []
        self._count(rows)
        scored = [r for r in rows if r["status"] == "ok"]
        missing = sum(1 for r in scored if "correct" not in r)
        self.outcomes = {"kept_by_clients": True, "scored_rows": len(scored), "missing": missing}
        if missing:
            log.warning(
                "%d of %d scored rows have no outcome in %s: clients on other hosts keep theirs in their state "
                "folder (fedrapp-report %s --outcomes <their folder> merges them)",
                missing, len(scored), self.run_dir / CLIENT_STATE_DIR, self.run_dir,
            )  # fmt: skip

    def expect(self, num_clients: int, num_samples: dict[int, int]) -> None:
        """The federation's clients and their streams' sizes (discovery's), so that even a run that fails later
        says per client what was never scored."""
        self.num_clients, self.num_samples = num_clients, num_samples

    def record_round(
        self, round_number: int, rows: list[dict[str, Any]], seconds: float, timing: dict[str, float] | None = None
    ) -> str:
        """Append one round's client rows (dicts) and return its progress line.

        Each row also gets the round's wall time (``round_seconds``) and ``timing`` (the server's own time,
        ``server_seconds``, of which the rule's, ``aggregate_seconds``). The round's rows go out in one write,
        so a killed writer cuts at most the last line (dropped on resume).
        """
        rows = [{"round": round_number, **row, "round_seconds": seconds, **(timing or {})} for row in rows]
        with self.rounds_path.open("a") as f:
            f.write("".join(json.dumps(row, default=_json_default) + "\n" for row in rows))
        self._count(rows)
        self.rounds = round_number
        ok = [r for r in rows if r["status"] == "ok" and "correct" in r]
        n = sum(r["num_examples"] for r in ok)
        line = f"round {round_number} | {progress_counts(rows)}"
        if private_run(self.config) and any(r["status"] == "ok" for r in rows):
            line += " | accuracy kept by the clients (dp)"
        if n:
            acc = sum(r["correct"] for r in ok) / n
            before = sum(r["correct_before"] for r in ok) / n
            h_pre = np.mean([r["h_pre"] for r in ok])
            h_post = np.mean([r["h_post"] for r in ok])
            line += (
                f" | acc {100 * acc:.1f}% (received prompt {100 * before:.1f}%)"
                f" | H {h_pre:.3f}->{h_post:.3f} | online so far {100 * self.micro():.2f}%"
            )
        skipped = sum(int(r.get("skipped", 0) or 0) for r in rows)
        if skipped:
            line += f" | {skipped} undecodable sample(s) skipped"
        failed = next((r["rule_error"] for r in rows if r.get("rule_error")), "")
        if failed:  # the clients were scored, but the server's state did not move: say so on the line
            line += f" | RULE FAILED (state unchanged; {rule_failures(self.rows)['count']} round(s) so far): {failed}"
        line += f" | {seconds:.1f}s"
        return line

    def micro(self) -> float:
        """Online accuracy over every sample scored so far whose outcome is known here."""
        total = sum(self.known.values())
        return sum(self.correct.values()) / total if total else float("nan")

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write ``summary.json`` and return it (under dp, with the clients' outcome files merged)."""
        if self.outcomes is None:
            self.collect_outcomes()
        clients = sorted(self.seen)
        per_client = {c: self.correct[c] / self.known[c] for c in clients if self.known[c]}
        total = sum(self.known.values())
        summary = {
            "status": "finished",
            "micro_accuracy": self.micro(),
            "macro_accuracy": float(np.mean(list(per_client.values()))) if per_client else float("nan"),
            "micro_accuracy_received_prompt": (sum(self.correct_before.values()) / total) if total else float("nan"),
            "per_client_accuracy": per_client,
            **outcome_summary(self.rows),
            "per_client_samples": {c: self.seen[c] for c in clients},
            "per_client_skipped": {c: n for c, n in sorted(self.skipped.items()) if n},
            "samples": sum(self.seen.values()),
            "skipped": sum(self.skipped.values()),
            "rounds": self.rounds,
            "seconds": time.time() - self.started,
            "started": self.started,  # epoch seconds of this session's start, which ``seconds`` count from
            "run_dir": str(self.run_dir),
            "resumed_after_round": self.resumed_after,
            "rule_failures": rule_failures(self.rows),
            **({"outcomes": self.outcomes} if self.outcomes is not None else {}),
            **(extra or {}),
            "config": self.config,
            **self.provenance,
        }
        write_json_atomic(self.summary_path, summary)
        return summary

    def fail(self, status: str, error: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write ``summary.json`` for a run that did not end normally (``status`` "failed" or "interrupted"):
        what was scored so far, ``complete: false``, ``unscored`` per client (as docs/failures.md says: the
        samples left and why; every client's, with its size unknown, when the run ended before discovery) and
        the error."""
        why = f"the run {status}: {error.splitlines()[0] if error else status}"
        self.collect_outcomes()
        if self.num_samples:
            _, unscored = unscored_samples(self.num_clients, self.num_samples, self.rows, why, capped=False)
        else:
            unscored = {
                c: {"samples": None, "reasons": [f"{why} (before its stream's size was known)"]}
                for c in range(self.num_clients)
            }
        return self.finish({"complete": False, "unscored": unscored, **(extra or {}), "status": status, "error": error})


#: What a run writes in its folder (with their temporary files): all an explicit overwrite removes. The lock file
#: stays (it may be held: ``runlock``), and so does anything else a person put there.
RUN_FILES = ("rounds.jsonl", "summary.json", "config.json", SERVER_FILE, CLIENT_STATE_DIR, "report")


def held_results(run_dir: Path) -> str | None:
    """What ``run_dir`` holds that a new run would overwrite, in words (``"the results of a finished run (5 rounds,
    640 samples scored, ended 2026-05-01 10:00:00)"``), or None when it holds no result: no row, no checkpoint (a run
    that failed before its first round leaves nothing worth keeping)."""
    run_dir = Path(run_dir)
    rounds = run_dir / "rounds.jsonl"
    has_rows = rounds.is_file() and rounds.stat().st_size > 0
    checkpoint = run_dir / SERVER_FILE
    if not has_rows and not checkpoint.is_file():
        return None
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("status") == "finished":
        ended = summary.get("started", 0.0) + summary.get("seconds", 0.0)
        when = time.strftime(", ended %Y-%m-%d %H:%M:%S", time.localtime(ended)) if ended else ""
        incomplete = "" if summary.get("complete", True) else ", incomplete"
        return (
            f"the results of a finished run ({summary.get('rounds', '?')} rounds, {summary.get('samples', '?')} "
            f"samples scored{incomplete}{when})"
        )
    if checkpoint.is_file():
        try:
            after = f"after round {ServerCheckpoint.load(run_dir).round}"
        except (OSError, ValueError, KeyError):
            after = "with a checkpoint"
        how = f"{summary['status']}" if summary.get("status") else "killed: no summary"
        return f"a run that stopped {after} ({how}; its checkpoint is what a resume continues from)"
    return f"the rows of a run ({len(read_rows(rounds))} rows, no checkpoint)"


def clear_results(run_dir: Path) -> list[str]:
    """Remove the files a run wrote in ``run_dir`` (``RUN_FILES`` and their temporary files): an explicit
    overwrite. Returns the names removed."""
    run_dir = Path(run_dir)
    removed = []
    for name in RUN_FILES:
        for path in (run_dir / name, run_dir / f"{name}.tmp"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
            else:
                continue
            removed.append(path.name)
    return removed
