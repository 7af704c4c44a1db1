"""What a run folder holds, and who may write it.

- ``results``: the per-round rows (``rounds.jsonl``), ``summary.json`` and the provenance in ``config.json``.
- ``checkpoint``: the server's checkpoint and the clients' snapshots, which a resume reads.
- ``runlock``: one writer per run folder (a lock dropped when its holder dies).
"""
