"""The run group: what runs (the rule, the method, the seed, how many clients and rounds) and where its results go."""

from __future__ import annotations

import re
from collections.abc import Mapping

from fedrapp_app.config.keys import Group, Key, Scalar, problem
from fedrapp_app.registry import builtins

#: This project's rules and methods, for the docs (a run may name any registered rule or method, plugins
#: included: ``fedrapp-list``, or a module:attribute reference).
STRATEGIES = builtins.RULES
LOCAL_METHODS = builtins.METHODS


def run_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a run-name (a folder name inside output-dir, never a path), or None.

    A separator or ``..`` would put the run outside output-dir: in a deployment a remote ``-c`` would choose where the
    SuperLink's host writes; ``--seeds`` and the reports would look in another folder than the run wrote."""
    if ".." in name or name == ".":
        return "holds '..' (or is '.'), which points outside output-dir"
    if "/" in name or "\\" in name:
        return "is a path, not a folder name: a run-name is one folder inside output-dir (no '/' or '\\')"
    if any(ord(c) < 32 for c in name):
        return "holds a control character"
    return None


def check(v: Mapping[str, Scalar]) -> list[str]:
    """A resume names the run it continues; a run-name stays inside output-dir."""
    problems = []
    name = str(v["run-name"])
    why = run_name_problem(name) if name else None
    if why:
        fixed = "-".join(part for part in re.split(r"[/\\]+|\.\.+", name) if part.strip(". ")) or "my-run"
        problems.append(
            f"  run-name = {name!r}: {why} (fix: -c \"run-name='{fixed}'\", and put the folder in "
            f"output-dir: -c \"output-dir='<folder>'\")"
        )
    if v["resume"] and not v["run-name"]:
        why = (
            "needs the run-name of the run to continue (derived names carry a start time); set -c \"run-name='<name>'\""
        )
        problems.append(problem("resume", True, why))
    return problems


GROUP = Group(
    "run",
    "what runs and where its results go",
    (
        Key(
            "strategy",
            "fedrapp",
            f"server rule: {', '.join(STRATEGIES)} ('domain-oracle': a testbed-only reference that knows the domains), "
            "a plugin's name (fedrapp-list lists them) or module:attribute (docs/extending.md)",
            everyday=True,
        ),
        Key(
            "local-method",
            "adaprompt",
            f"client test-time method: {', '.join(LOCAL_METHODS)}, a prompt-tuning method with a training-free head "
            "(adaprompt+tda, docs/methods.md), a plugin's name or module:Class",
            everyday=True,
        ),
        Key(
            "seed",
            0,
            "drives partitions, stream order, augmentations, initialisations, client sampling",
            minimum=0,
            everyday=True,
        ),
        Key(
            "num-clients",
            0,
            "number of clients (= data partitions); 0 = one per SuperNode: the simulation's num-supernodes, or the "
            "SuperNodes connected when a deployed run starts",
            minimum=0,
            everyday=True,
        ),
        Key(
            "num-rounds",
            0,
            "rounds to run; 0 = until every client's stream has ended",
            minimum=0,
            everyday=True,
            resumable=True,
        ),
        Key(
            "fraction",
            1.0,
            "share of the available clients sampled each round",
            minimum=0.0,
            exclusive_minimum=True,
            maximum=1.0,
            everyday=True,
        ),
        Key(
            "output-dir",
            "outputs",
            "folder for results (a relative path is resolved where the run starts)",
            everyday=True,
        ),
        Key(
            "run-name",
            "",
            "name of the results folder inside output-dir; '' = derived from the config",
            everyday=True,
        ),
        Key(
            "resume",
            False,
            "continue the run in output-dir/run-name from its last checkpoint (needs run-name)",
            everyday=True,
            resumable=True,
        ),
        Key(
            "report-own-prompt",
            False,
            "ours: each client also scores its own last tuned prompt on every new batch (H_own and its accuracy in the "
            "rows; one extra text pass); always on with FedRAPP's trust option, which reads H_own",
        ),
    ),
    check,
)
