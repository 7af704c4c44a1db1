"""The benchmark YAML: shared run-config overrides and named grids of axes, expanded into cells.

A cell is a plain run-config dict (the same keys as ``flwr run -c``), so any key can be an axis::

    name: testbed                       # optional (default: the file's stem)
    output: outputs/bench/testbed       # optional (default: outputs/bench/<name>, relative to the cwd)
    base: {num-clients: 8}              # run-config overrides of every cell
    oracles: []                         # optional: compare labels that are never marked "best"
    grids:
      comparison:
        compare: [local-method, strategy]   # the axes whose values are the compared methods
        base: {}                            # optional overrides of this grid's cells
        axes:
          local-method: [zeroshot, adaprompt]               # a list: values of that run-config key
          strategy: [none-fed, fedavg, fedamp, fedrapp]
          partition:                                         # a mapping: named variants (label -> overrides)
            iid: {partition: iid}
            dir0.1: {partition: dirichlet, dirichlet-alpha: 0.1}
          seed: [0, 1, 2]                                    # the axis averaged over in the reports

The identity of a cell (what "finished" is checked against) is its overrides without the keys that cannot
change its results: keys of other server rules and local methods and keys that only tune speed (a key set
to its default value counts as set). zeroshot runs once per remaining setting with none-fed and carries the strategy
label "zeroshot". Within a grid, a cell several combinations reduce to appears once, under the labels of the
first combination; across grids a shared cell runs once and belongs to every grid that lists it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedrapp_app.config import DEFAULTS, METHOD_KEYS, RULE_KEYS, ConfigError, RunConfig, method_keys

#: Keys the runner sets for every cell (each cell writes into its own folder of the bench directory).
RUNNER_KEYS = ("output-dir", "run-name", "resume")
#: Keys that change how fast a cell runs, never what it computes.
SPEED_KEYS = ("decode-workers", "round-timeout", "node-wait-timeout")
#: The axis the reports average over.
SEED_AXIS = "seed"
ZEROSHOT = "zeroshot"
_TOP_KEYS = {"name", "output", "base", "oracles", "grids"}
_GRID_KEYS = {"compare", "base", "axes"}
_DEFAULT_COMPARE = ("local-method", "strategy")


class BenchError(ValueError):
    """The benchmark YAML is malformed; the message names the entry and the fix."""


@dataclass(frozen=True)
class Membership:
    """How one grid sees a cell: its label on each axis (in axis order) and which axes are compared."""

    grid: str
    index: int  # position of the grid in the file (the reports keep the file's order)
    labels: dict[str, str]
    order: tuple[int, ...]  # position of each label among its axis's values (for sorting tables)
    compare: tuple[str, ...]

    def to_json(self, oracles: tuple[str, ...] = ()) -> dict[str, Any]:
        """The row's record of this membership; ``oracle`` when a compared label is one of ``oracles``."""
        oracle = any(self.labels[a] in oracles for a in self.compare)
        return {
            "index": self.index,
            "labels": self.labels,
            "order": list(self.order),
            "compare": list(self.compare),
            "oracle": oracle,
        }


@dataclass
class Cell:
    """One run: its run-config overrides, its identity key and the grids it belongs to."""

    overrides: dict[str, Any]
    key: str
    memberships: list[Membership] = field(default_factory=list)

    @property
    def id(self) -> str:
        """Folder name: the first membership's labels, then the key (unique by the key alone)."""
        labels = self.memberships[0].labels.values() if self.memberships else ()
        # one folder name: no separator, no '..' (a run-name must stay inside output-dir)
        slug = "_".join(re.sub(r"[^A-Za-z0-9.]+|\.{2,}", "-", str(v)).strip("-") for v in labels)
        return f"{slug}_{self.key}" if slug else self.key


@dataclass(frozen=True)
class BenchSpec:
    """A validated benchmark file: cells in execution order, where they write, which labels are oracles."""

    name: str
    output: Path
    cells: list[Cell]
    oracles: tuple[str, ...]
    source: dict[str, Any]  # the parsed YAML, stored beside the results


def irrelevant_keys(strategy: str, method: str) -> set[str]:
    """Keys that cannot change the results of a cell with this server rule and local method."""
    foreign = {k for rule, keys in RULE_KEYS.items() if rule != strategy for k in keys}
    foreign |= {k for name, keys in METHOD_KEYS.items() if name != method for k in keys}
    foreign -= set(RULE_KEYS.get(strategy, {})) | set(method_keys(method))
    return foreign | set(SPEED_KEYS) | set(RUNNER_KEYS)


def _canonical(value: Any) -> Any:
    # 0 and 0.0 are the same setting for a float key; a bool is not a number here.
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def identity(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides that determine a run's results (see the module docstring), sorted, numbers as floats.

    It depends only on ``overrides`` (not on the current defaults), so keys stored in rows stay valid
    when a default changes; :meth:`BenchRunner.check_finished` catches rows whose defaults differ.
    """
    strategy = str(overrides.get("strategy", DEFAULTS["strategy"]))
    method = str(overrides.get("local-method", DEFAULTS["local-method"]))
    skip = irrelevant_keys(strategy, method)
    return {k: _canonical(overrides[k]) for k in sorted(overrides) if k not in skip}


def identity_key(overrides: Mapping[str, Any]) -> str:
    """Short stable hash of :func:`identity`."""
    text = json.dumps(identity(overrides), sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:10]


#: Keys that choose or tune the server rule beside ``strategy`` and its own hyperparameters (``RULE_KEYS``): the
#: reference of a cell under another rule drops them (FedRAPP's trust option has no meaning under none-fed).
RULE_CHOICE_KEYS = ("trust", "rule-params")


def reference_key(overrides: Mapping[str, Any], strategy: str = "none-fed") -> str:
    """Identity key of the same cell with another server rule (e.g. the none-fed run it is compared with): the
    same streams and local method, the rule's own keys (:data:`RULE_CHOICE_KEYS` too) left out."""
    kept = {k: v for k, v in overrides.items() if k not in RULE_CHOICE_KEYS}
    return identity_key({**kept, "strategy": strategy})


# ----------------------------------------------------------------------------------------------- parsing
def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BenchError(f"{where} must be a mapping of run-config keys to values, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def _unknown(found: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(found) - allowed)
    if extra:
        raise BenchError(f"{where}: unknown entr{'ies' if len(extra) > 1 else 'y'} {extra}; allowed: {sorted(allowed)}")


def _axis(name: str, values: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """An axis as (label, overrides) pairs: a list sets the key ``name``; a mapping lists named variants."""
    if isinstance(values, Mapping):
        if not values:
            raise BenchError(f"{where}: axis {name!r} has no values")
        return [
            (str(label), _mapping(over, f"{where}: variant {label!r} of axis {name!r}"))
            for label, over in values.items()
        ]
    if isinstance(values, list) and values:
        if any(isinstance(v, list | Mapping) for v in values):
            raise BenchError(f"{where}: axis {name!r} lists plain values, or maps variant labels to overrides")
        if name not in DEFAULTS:
            raise BenchError(
                f"{where}: axis {name!r} lists values but is not a run-config key; name the "
                "variants instead ({label: {key: value, ...}, ...})"
            )
        labels = [str(v) for v in values]
        if len(set(labels)) < len(labels):
            raise BenchError(f"{where}: axis {name!r} repeats a value: {values}")
        return [(str(v), {name: v}) for v in values]
    raise BenchError(f"{where}: axis {name!r} must be a non-empty list of values or a mapping of named variants")


def _check_overrides(overrides: Mapping[str, Any], where: str) -> None:
    runner = [k for k in RUNNER_KEYS if k in overrides]
    if runner:
        raise BenchError(
            f"{where}: {runner} are set by the benchmark runner (each cell writes into "
            "<output>/runs/<cell>); remove them and set 'output' at the top of the file instead"
        )
    try:
        RunConfig.from_run_config(overrides)
    except ConfigError as err:
        raise BenchError(f"{where}: {err}") from err


def _grid_cells(index: int, name: str, grid: Any, base: dict[str, Any], cells: dict[str, Cell]) -> None:
    where = f"grid {name!r}"
    if not isinstance(grid, Mapping):
        raise BenchError(f"{where} must be a mapping with 'axes' (and optionally 'compare', 'base')")
    _unknown(grid, _GRID_KEYS, where)
    axes_spec = _mapping(grid.get("axes"), f"{where}: axes")
    if not axes_spec:
        raise BenchError(f"{where} has no axes")
    axes = {axis: _axis(axis, values, where) for axis, values in axes_spec.items()}
    compare = tuple(grid.get("compare") or [a for a in _DEFAULT_COMPARE if a in axes])
    if not compare:
        raise BenchError(f"{where}: say which axes hold the compared methods, e.g. compare: [{next(iter(axes))}]")
    missing = [a for a in compare if a not in axes]
    if missing or SEED_AXIS in compare:
        raise BenchError(
            f"{where}: compare lists {missing or [SEED_AXIS]}, which must be axes other than "
            f"{SEED_AXIS!r}; axes: {list(axes)}"
        )
    grid_base = {**base, **_mapping(grid.get("base"), f"{where}: base")}
    seen: set[str] = set()
    for combo in itertools.product(*(list(enumerate(v)) for v in axes.values())):
        overrides = dict(grid_base)
        labels = {}
        for axis, (_, (label, over)) in zip(axes, combo, strict=True):
            overrides.update(over)
            labels[axis] = label
        names = "/".join(labels.values())
        _check_overrides(overrides, f"{where}, cell {names}")
        if overrides.get("local-method") == ZEROSHOT:  # no adaptation: the rule cannot matter (SPEC §7)
            overrides["strategy"] = "none-fed"
            if "strategy" in labels:
                labels["strategy"] = ZEROSHOT
        key = identity_key(overrides)
        if key in seen:
            continue
        seen.add(key)
        cell = cells.setdefault(key, Cell(overrides, key))
        cell.memberships.append(Membership(name, index, labels, tuple(i for i, _ in combo), compare))


def parse_bench(source: Mapping[str, Any], default_name: str = "bench") -> BenchSpec:
    """Validate a parsed benchmark file and expand it into cells; raise ``BenchError`` naming the problem.

    Every cell's run config is validated (``RunConfig.from_run_config``) here, before anything runs.
    """
    if not isinstance(source, Mapping):
        raise BenchError("the benchmark file must be a mapping with 'base' and 'grids'")
    _unknown(source, _TOP_KEYS, "benchmark file")
    name = str(source.get("name") or default_name)
    base = _mapping(source.get("base"), "base")
    _check_overrides(base, "base")
    grids = _mapping(source.get("grids"), "grids")
    if not grids:
        raise BenchError("the benchmark file has no grids; add grids: {<name>: {axes: {...}}}")
    cells: dict[str, Cell] = {}
    for index, (grid_name, grid) in enumerate(grids.items()):
        _grid_cells(index, grid_name, grid, base, cells)
    oracles = source.get("oracles") or []
    if not isinstance(oracles, list):
        raise BenchError("oracles must be a list of compare labels (e.g. [domain-oracle])")
    output = Path(str(source.get("output") or f"outputs/bench/{name}")).expanduser()
    return BenchSpec(name, output, list(cells.values()), tuple(map(str, oracles)), dict(source))


def load_bench(path: str | Path, base_overrides: Mapping[str, Any] | None = None) -> BenchSpec:
    """Read and validate a benchmark YAML file (see the module docstring for the format).

    ``base_overrides`` replace entries of the file's ``base`` (``--set key=value`` on the command line).
    """
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"benchmark file {path} not found (e.g. conf/bench/testbed.yaml)")
    try:
        source = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise BenchError(f"{path} is not valid YAML: {err}") from err
    if base_overrides and isinstance(source, dict):
        source["base"] = {**_mapping(source.get("base"), "base"), **base_overrides}
    try:
        return parse_bench(source, default_name=path.stem)
    except BenchError as err:
        raise BenchError(f"{path}: {err}") from err
