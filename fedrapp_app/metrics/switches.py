"""What happens at a domain switch (ours, issue 26): accuracy after it, recovery and forgetting, from a client's
batches in stream order.

A client's stream falls into segments: runs of consecutive batches in one shift domain (a mixed batch belongs
to no segment and ends one). A **switch** is the start of every segment but the first.

- post-switch accuracy: the accuracy of the first batch after a switch (pooled over switches);
- recovery: batches after the switch until one is at least as accurate as the pre-switch level (the accuracy
  of the last ``window`` batches before it); 0 when the first already is; a segment that never gets there is
  counted as unrecovered. Domains differ in difficulty, so a switch into a harder one may never recover: read
  recovery beside the none-fed reference on the same streams, as a comparison of methods;
- forgetting: when a client returns to a domain it saw in an earlier segment, the accuracy of the last batch of
  that earlier segment minus the accuracy of the first batch of the return (> 0: it forgot).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Batch:
    """One scored batch of a client: its domain (``"mixed"`` for none), samples and right predictions."""

    domain: str
    n: int
    right: int

    @property
    def accuracy(self) -> float:
        return self.right / self.n


def segments(batches: Sequence[Batch]) -> list[list[Batch]]:
    """Runs of consecutive batches in one domain, in stream order (mixed batches dropped, ending a run)."""
    out: list[list[Batch]] = []
    previous = None
    for batch in batches:
        if batch.domain == "mixed":
            previous = None
            continue
        if batch.domain != previous:
            out.append([])
        out[-1].append(batch)
        previous = batch.domain
    return out


def switch_metrics(clients: Sequence[Sequence[Batch]], window: int = 2) -> dict[str, float | int | None] | None:
    """Post-switch accuracy, recovery and forgetting over every client's batches (each in stream order), or None
    when no client switched."""
    first_n = first_right = unrecovered = 0
    recoveries: list[int] = []
    forgetting: list[float] = []
    for batches in clients:
        runs = segments(batches)
        last_seen: dict[str, Batch] = {}
        for k, run in enumerate(runs):
            if k:
                before = runs[k - 1][-window:]
                level = sum(b.right for b in before) / sum(b.n for b in before)
                first_n, first_right = first_n + run[0].n, first_right + run[0].right
                reached = [j for j, b in enumerate(run) if b.accuracy >= level]
                if reached:
                    recoveries.append(reached[0])
                else:
                    unrecovered += 1
            domain = run[0].domain
            if domain in last_seen:
                forgetting.append(last_seen[domain].accuracy - run[0].accuracy)
            last_seen[domain] = run[-1]
    if not first_n:
        return None
    return {
        "switches": len(recoveries) + unrecovered,
        "post_switch_accuracy": first_right / first_n,
        "recovery_batches": sum(recoveries) / len(recoveries) if recoveries else None,
        "unrecovered": unrecovered,
        "returns": len(forgetting),
        "forgetting": sum(forgetting) / len(forgetting) if forgetting else None,
    }


def switch_rounds(rows: Sequence[dict]) -> list[int]:
    """The rounds in which some client's batch is in another domain than its previous batch (rows of a run's
    ``rounds.jsonl`` with status ok and a ``domain``; mixed batches neither start nor end one)."""
    last: dict[int, str] = {}
    rounds = set()
    for row in sorted(rows, key=lambda r: (r["round"], r["client"])):
        domain = row.get("domain")
        if row.get("status") != "ok" or domain is None or domain == "mixed":
            continue
        if row["client"] in last and last[row["client"]] != domain:
            rounds.add(int(row["round"]))
        last[row["client"]] = domain
    return sorted(rounds)
