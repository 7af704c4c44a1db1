"""Results of a run: one JSONL row per client per round, a summary JSON at the end, a progress line per round.

Files in the run folder:
- ``config.json``  the full validated config, library versions, git commit, start time;
- ``rounds.jsonl`` one row per sampled client per round (accuracy before/after adaptation, H_pre, H_post,
  reliability r, memory rate mu, peer weights, timings, status);
- ``summary.json`` micro and macro online accuracy, per-client accuracy, the config and provenance.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("fedrapp.results")

_LIBRARIES = ("fedrapp", "flwr", "torch", "transformers", "numpy", "ray", "tokenizers", "datasets")


def provenance() -> dict[str, Any]:
    """Library versions, Python, platform and the git commit of the installed ``fedrapp_app`` sources."""
    versions = {}
    for lib in _LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return {
        "versions": versions,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git": git_state(Path(__file__).resolve().parent),
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


class RunRecorder:
    """Writes the per-round rows and the summary of one run into ``run_dir``."""

    def __init__(self, run_dir: Path, config: dict[str, Any], resume_after: int | None = None) -> None:
        """Start a run's files, or with ``resume_after = R`` continue them: rows of rounds after R (from a
        round that never reached its checkpoint) are dropped and the totals are rebuilt from the rest."""
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.provenance = provenance()
        self.started = time.time()
        self.rounds_path = self.run_dir / "rounds.jsonl"
        self.summary_path = self.run_dir / "summary.json"
        self.correct: dict[int, int] = defaultdict(int)
        self.correct_before: dict[int, int] = defaultdict(int)
        self.seen: dict[int, int] = defaultdict(int)
        self.rounds = 0
        self.resumed_after = resume_after
        kept: list[dict[str, Any]] = []
        if resume_after is not None and self.rounds_path.is_file():
            rows = [json.loads(line) for line in self.rounds_path.read_text().splitlines() if line.strip()]
            kept = [r for r in rows if r["round"] <= resume_after]
        else:
            write_json_atomic(
                self.run_dir / "config.json", {"config": config, **self.provenance, "started": self.started}
            )
        tmp = self.rounds_path.with_name(self.rounds_path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, default=_json_default) + "\n" for r in kept))
        os.replace(tmp, self.rounds_path)
        self._count(kept)
        self.rounds = resume_after or 0

    def _count(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            if r["status"] == "ok":
                self.correct[r["client"]] += r["correct"]
                self.correct_before[r["client"]] += r["correct_before"]
                self.seen[r["client"]] += r["num_examples"]

    def record_round(self, round_number: int, rows: list[dict[str, Any]], seconds: float) -> str:
        """Append one round's client rows (dicts) and return its progress line."""
        with self.rounds_path.open("a") as f:
            for row in rows:
                f.write(json.dumps({"round": round_number, **row}, default=_json_default) + "\n")
        ok = [r for r in rows if r["status"] == "ok"]
        self._count(ok)
        self.rounds = round_number
        n = sum(r["num_examples"] for r in ok)
        line = f"round {round_number} | {len(ok)}/{len(rows)} clients ok"
        if n:
            acc = sum(r["correct"] for r in ok) / n
            before = sum(r["correct_before"] for r in ok) / n
            h_pre = np.mean([r["h_pre"] for r in ok])
            h_post = np.mean([r["h_post"] for r in ok])
            line += (
                f" | acc {100 * acc:.1f}% (received prompt {100 * before:.1f}%)"
                f" | H {h_pre:.3f}->{h_post:.3f} | online so far {100 * self.micro():.2f}%"
            )
        line += f" | {seconds:.1f}s"
        return line

    def micro(self) -> float:
        """Online accuracy over every sample scored so far."""
        total = sum(self.seen.values())
        return sum(self.correct.values()) / total if total else float("nan")

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write ``summary.json`` and return it."""
        clients = sorted(self.seen)
        per_client = {c: self.correct[c] / self.seen[c] for c in clients if self.seen[c]}
        total = sum(self.seen.values())
        summary = {
            "micro_accuracy": self.micro(),
            "macro_accuracy": float(np.mean(list(per_client.values()))) if per_client else float("nan"),
            "micro_accuracy_received_prompt": (sum(self.correct_before.values()) / total) if total else float("nan"),
            "per_client_accuracy": per_client,
            "per_client_samples": {c: self.seen[c] for c in clients},
            "samples": total,
            "rounds": self.rounds,
            "seconds": time.time() - self.started,
            "run_dir": str(self.run_dir),
            "resumed_after_round": self.resumed_after,
            **(extra or {}),
            "config": self.config,
            **self.provenance,
        }
        write_json_atomic(self.summary_path, summary)
        return summary
