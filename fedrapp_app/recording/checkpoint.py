"""Checkpoints: the server state after every round, and each client's own state after each of its rounds.

Server side (``<run_dir>/checkpoint.npz``, written atomically after every round): memories, the prompts last
sent, which streams ended, every client's next stream position, the initial prompt, the round, the sampling
RNG state, the run token, what the server rule carries between rounds (FedRAPP's trust option: each
client's trust) and, under dp, the privacy accounting (each client's uploads and noise: a resumed run reports the
same epsilon). ``resume = true`` (with the same ``run-name``) continues from it.

Client side (``<state dir>/<run token>/client-<id>-pos<p>.npz``): the local method's state (AdaPrompt's
buffer, optimizer moments, step counters) as it was when the client reached stream position ``p``; the two
newest positions are kept. A client whose ``context.state`` is empty (a resumed run, a restarted SuperNode)
loads the snapshot of the position the server expects; without one it restarts at that position with a
fresh method state (its stream position is all it needs to go on; its buffer and moments refill).
The snapshot folder is the node config's ``state-dir`` or, by default, ``<run_dir>/client-state``.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SERVER_FILE = "checkpoint.npz"
RULE_STATE = "rule-state."  # prefix of the arrays a server rule carries between rounds (older checkpoints: none)
PRIVACY = "privacy."  # prefix of the privacy accounting's arrays under dp (older checkpoints and dp off: none)
CLIENT_STATE_DIR = "client-state"


def _save_npz_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def new_run_token() -> str:
    """A random token naming this run's client snapshots (a resumed run keeps it)."""
    return secrets.token_hex(8)


@dataclass
class ServerCheckpoint:
    """What the server needs to continue a run exactly where it stopped (arrays are [N, d] / [N])."""

    round: int
    memory: np.ndarray
    sent: np.ndarray
    exhausted: np.ndarray
    positions: np.ndarray  # next stream position of each client (-1: unknown)
    p0: np.ndarray
    shapes: list[tuple[int, ...]]
    rng_state: dict[str, Any]
    token: str
    config: dict[str, Any]
    rule_state: dict[str, np.ndarray] = field(default_factory=dict)  # per-client arrays a rule carries (trust)
    privacy: dict[str, np.ndarray] = field(default_factory=dict)  # under dp: each client's uploads, noise, own share
    num_samples: dict[int, int] = field(default_factory=dict)  # each discovered client's stream size (older: none)

    def save(self, run_dir: Path) -> None:
        meta = {
            "round": self.round,
            "shapes": self.shapes,
            "rng_state": self.rng_state,
            "token": self.token,
            "config": self.config,
            "num_samples": {str(c): int(n) for c, n in self.num_samples.items()},
        }
        _save_npz_atomic(
            Path(run_dir) / SERVER_FILE,
            {
                "memory": self.memory,
                "sent": self.sent,
                "exhausted": self.exhausted,
                "positions": self.positions,
                "p0": self.p0,
                "meta": np.array(json.dumps(meta)),
                **{RULE_STATE + name: value for name, value in self.rule_state.items()},
                **{PRIVACY + name: value for name, value in self.privacy.items()},
            },
        )

    @classmethod
    def load(cls, run_dir: Path) -> ServerCheckpoint:
        path = Path(run_dir) / SERVER_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"resume = true but {path} does not exist: give the run-name (and output-dir) of the run to "
                "continue, or set resume = false to start a new run"
            )
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            return cls(
                meta["round"],
                data["memory"],
                data["sent"],
                data["exhausted"],
                data["positions"],
                data["p0"],
                [tuple(s) for s in meta["shapes"]],
                meta["rng_state"],
                meta["token"],
                meta["config"],
                {name[len(RULE_STATE) :]: data[name] for name in data.files if name.startswith(RULE_STATE)},
                {name[len(PRIVACY) :]: data[name] for name in data.files if name.startswith(PRIVACY)},
                {int(c): int(n) for c, n in meta.get("num_samples", {}).items()},
            )


def _snapshot_path(state_dir: Path, token: str, client: int, position: int) -> Path:
    return Path(state_dir) / token / f"client-{client}-pos{position}.npz"


def save_client_snapshot(
    state_dir: Path, token: str, client: int, position: int, method_state: dict[str, np.ndarray]
) -> None:
    """Keep the method state reached at stream ``position``; drop snapshots older than ``position - 1``."""
    _save_npz_atomic(_snapshot_path(state_dir, token, client, position), dict(method_state))
    for old in Path(state_dir, token).glob(f"client-{client}-pos*.npz"):
        if int(old.stem.rsplit("pos", 1)[1]) < position - 1:
            old.unlink(missing_ok=True)


def load_client_snapshot(state_dir: Path, token: str, client: int, position: int) -> dict[str, np.ndarray] | None:
    """The method state saved at stream ``position``, or None when there is none."""
    path = _snapshot_path(state_dir, token, client, position)
    if not path.is_file():
        return None
    with np.load(path) as data:
        return {name: data[name] for name in data.files}
