"""Which server rule on a user's own setting: the grid behind ``fedrapp-sim --compare``, and its one page.

A setting (the run-config keys ``fedrapp-sim -c ...`` gives) becomes a benchmark grid of none-fed, FedAvg, FedRAPP and
FedRAPP's trust option (plus the user's own rule where ``-c`` names another one) over a few seeds. The grid runs
through the bench machinery (``grid.BenchRunner``: the ServerApp body, strategy and ClientApp of ``flwr run``, in
process; resumable, one row per run), and this module writes one page (``report.md``) and one figure (``gains.png``):
each rule's online accuracy and its gain over none-fed, paired by seed (the same streams, the same local method),
with a 95% Student-t interval. ``report/`` beside them holds the bench's full report (curves, every number).

Redraw the page from a folder's rows: ``python -m fedrapp_app.bench.compare <folder>``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrapp_app.bench.plots import gains_figure
from fedrapp_app.bench.rows import read_rows, report_main, write_text_atomic
from fedrapp_app.bench.schema import RULE_CHOICE_KEYS, RUNNER_KEYS, BenchError, BenchSpec, parse_bench
from fedrapp_app.bench.stats import ACCURACY, Setting, Stat, by_key, settings_of
from fedrapp_app.config import DEFAULTS, RULE_KEYS, rule_name
from fedrapp_app.config.privacy import privacy_words

#: The compared rules: label -> overrides. The trust option is FedRAPP's (``trust = true``).
RULES: dict[str, dict[str, Any]] = {
    "none-fed": {"strategy": "none-fed"},
    "fedavg": {"strategy": "fedavg"},
    "fedrapp": {"strategy": "fedrapp"},
    "fedrapp+trust": {"strategy": "fedrapp", "trust": True},
}
#: Seeds of a comparison unless ``--seeds`` says otherwise: three, the fewest with an interval worth reading.
DEFAULT_SEEDS = (0, 1, 2)
GRID = "compare"
PAGE, FIGURE, DETAILS = "report.md", "gains.png", "report"
#: The keys the user gave with ``-c``, beside the rows: the page lists them apart from what the comparison resolved.
GIVEN = "setting.json"
#: Every key that chooses or tunes a server rule: each goes to the rules it belongs to, never to the shared base.
_RULE_OWN = {key for keys in RULE_KEYS.values() for key in keys} | set(RULE_CHOICE_KEYS)


def user_keys(setting: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a full setting that differ from the defaults (what ``-c`` changed), without where a run writes
    (``output-dir``, ``run-name``, ``resume``), in the defaults' order."""
    return {k: setting[k] for k in DEFAULTS if k in setting and setting[k] != DEFAULTS[k] and k not in RUNNER_KEYS}


def rule_variants(setting: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each compared rule's overrides: :data:`RULES`, each with the rule keys of the setting that are its own (FedRAPP's
    hyperparameters go to FedRAPP and its trust option, the option's targets to the option alone), plus the
    setting's own rule when it is none of them (e.g. ``strategy='fedamp'``), with its keys and ``rule-params``."""
    given = user_keys(setting)
    own = str(setting.get("strategy", DEFAULTS["strategy"]))
    variants = dict(RULES)
    if own not in {v["strategy"] for v in RULES.values()}:
        variants[own] = {"strategy": own}
    out = {}
    for label, variant in variants.items():
        name = rule_name({"trust": False, **variant})
        keys = {k: v for k, v in given.items() if k in RULE_KEYS.get(name, {})}
        if variant["strategy"] == own and "rule-params" in given:
            keys["rule-params"] = given["rule-params"]
        out[label] = {**variant, **keys}
    return out


def shared_base(setting: Mapping[str, Any]) -> dict[str, Any]:
    """What every cell of the comparison shares: the setting's keys but the rule's and the seed."""
    return {k: v for k, v in user_keys(setting).items() if k not in _RULE_OWN and k not in ("strategy", "seed")}


def folder_name(setting: Mapping[str, Any]) -> str:
    """``compare-<dataset>-<model>-<method>-<hash>``: the same setting finds its folder again (a rerun resumes it),
    another setting gets its own; ``run-name`` when the setting gives one."""
    if setting.get("run-name"):
        return str(setting["run-name"])
    base = shared_base(setting)
    digest = hashlib.sha1(json.dumps(base, sort_keys=True, default=str).encode()).hexdigest()[:8]
    model = str(setting.get("model", DEFAULTS["model"])).rstrip("/").split("/")[-1]
    dataset, method = setting.get("dataset", DEFAULTS["dataset"]), setting.get("local-method", DEFAULTS["local-method"])
    return f"compare-{dataset}-{model}-{method}-{digest}".replace("..", "-")


def compare_spec(setting: Mapping[str, Any], seeds: Sequence[int] = DEFAULT_SEEDS) -> BenchSpec:
    """The comparison's grid on ``setting`` (a full run config: the app's defaults and ``-c``, ``num-clients``
    resolved) over ``seeds``, writing into ``output-dir/<folder_name>``; ``BenchError`` for a setting no rule
    can change (a local method that adapts nothing)."""
    base = shared_base(setting)
    if not base.get("num-clients"):
        raise BenchError("the comparison needs num-clients resolved (0 = one per SuperNode has no SuperNodes here)")
    if base.get("local-method", DEFAULTS["local-method"]) == "zeroshot":
        raise BenchError(
            "local-method = 'zeroshot' tunes no prompt, so every server rule sends back what it got: there is "
            "nothing to compare (fix: -c \"local-method='adaprompt'\", or another method that adapts)"
        )
    name = folder_name(setting)
    output = Path(str(setting.get("output-dir", DEFAULTS["output-dir"]))).expanduser() / name
    source = {
        "name": name,
        "output": str(output),
        "base": base,
        "grids": {GRID: {"compare": ["rule"], "axes": {"rule": rule_variants(setting), "seed": list(seeds)}}},
    }
    return parse_bench(source, default_name=name)


# ------------------------------------------------------------------------------------------------ the page
@dataclass(frozen=True)
class RuleResult:
    """One rule over the seeds: its online accuracy (micro) and its gain over none-fed, paired by seed."""

    label: str
    accuracy: Stat
    gain: Stat | None  # None for none-fed itself
    seconds: float  # mean wall time of one run
    seeds: int

    @property
    def verdict(self) -> str:
        """Where the 95% interval of the gain lies: above 0, below 0, or across it."""
        if self.gain is None:
            return "the reference"
        if self.gain.n < 2:
            return "one seed: no interval (add seeds)"
        low, high = self.gain.ci95()
        if low > 0:
            return "above none-fed"
        if high < 0:
            return "below none-fed"
        return "no clear difference (the interval holds 0)"


def rule_results(settings: Sequence[Setting], rows: Sequence[Mapping[str, Any]]) -> list[RuleResult]:
    """The comparison's rules in the grid's order, from its settings and the rows they are paired with."""
    index = by_key(rows)
    return [
        RuleResult(s.method, s.metric("micro_accuracy"), s.gain(index), s.seconds().mean, len(s.rows))
        for s in settings
        if s.grid == GRID
    ]


def console_lines(results: Sequence[RuleResult]) -> list[str]:
    """The comparison in a few lines of text: rule, accuracy, gain [interval], verdict."""
    width = max(len(r.label) for r in results)
    lines = []
    for r in results:
        gain = "" if r.gain is None else f"  {r.gain.format(signed=True)} {r.gain.format_ci95()}"
        lines.append(f"  {r.label:<{width}}  {r.accuracy.format()}%{gain}  {r.verdict}")
    return lines


def _code(keys: Mapping[str, Any]) -> str:
    """Keys as code: `` `k=v`, `k2=v2` ``."""
    return ", ".join(f"`{k}={v!r}`" for k, v in keys.items())


def write_given(folder: str | Path, given: Mapping[str, Any]) -> Path:
    """Record the keys the user gave with ``-c`` (``given``) in ``folder``; where a run writes and the seed are left
    out (the page names the folder and the seeds)."""
    path = Path(folder) / GIVEN
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {k: v for k, v in given.items() if k not in RUNNER_KEYS and k != "seed"}
    write_text_atomic(path, json.dumps({"given": kept}, indent=1) + "\n")
    return path


def read_given(folder: str | Path) -> dict[str, Any] | None:
    """The keys recorded by :func:`write_given`, or None for a folder without them (drawn before they were)."""
    path = Path(folder) / GIVEN
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text())["given"])


def setting_sentence(shared: Mapping[str, Any], given: Mapping[str, Any] | None) -> str:
    """The page's words for the setting. ``shared``: the keys every run shares beyond the defaults; ``given``: the
    keys the user gave with ``-c`` (None: not recorded). Only ``given`` is called the user's setting; what the
    comparison resolved itself (``num-clients`` from the SuperNodes) is listed apart, as settings used."""
    shared = {k: v for k, v in shared.items() if k not in ("seed", "strategy")}
    if given is None:
        return f"Setting (keys that differ from the defaults, shared by every run): {_code(shared) or 'the defaults'}."
    resolved = {k: v for k, v in shared.items() if k not in given}
    words = f"Your setting (what `-c` changed from the defaults): {_code(given) or 'nothing, the defaults'}."
    if resolved:
        words += f" Also used by every run, resolved by the comparison: {_code(resolved)}."
    return words


def _shared(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The config keys every row has with the same value."""
    configs = [row["config"] for row in rows]
    return {k: v for k, v in configs[0].items() if all(c.get(k) == v for c in configs)}


def write_compare_page(folder: str | Path, out_dir: str | Path | None = None) -> Path:
    """``report.md`` and ``gains.png`` of the comparison in ``folder`` (its ``cells.jsonl``) into ``out_dir``
    (default: the folder itself); returns the page."""
    folder = Path(folder)
    rows = [row for row in read_rows(folder) if GRID in row.get("grids", {})]
    if not rows:
        raise FileNotFoundError(f"no finished comparison runs in {folder / 'cells.jsonl'}: run fedrapp-sim --compare")
    out = Path(out_dir) if out_dir else folder
    out.mkdir(parents=True, exist_ok=True)
    results = rule_results(settings_of(rows), rows)
    seeds = sorted({int(row["config"].get("seed", 0)) for row in rows})
    gains = [(r.label, r.gain) for r in results if r.gain is not None and r.gain.n >= 2]
    if gains:
        gains_figure({"this setting": gains}, "gain over none-fed on this setting", out / FIGURE)
    first = {**DEFAULTS, **rows[0]["config"]}
    privacy = privacy_words(first)
    table = [
        "| rule | online accuracy (%), mean ± std | gain over none-fed (points) | 95% interval | verdict | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        gain = "–" if r.gain is None else r.gain.format(signed=True)
        interval = "–" if r.gain is None else r.gain.format_ci95()
        table.append(
            f"| {r.label} | {r.accuracy.format()} {r.accuracy.format_ci95(signed=False, bounds=ACCURACY)} | "
            f"{gain} | {interval} | {r.verdict} | {r.seeds} |"
        )
    page = "\n".join(
        [
            "# Which rule on this setting?",
            "",
            f"{setting_sentence(_shared(rows), read_given(folder))} Seeds: {', '.join(map(str, seeds))}."
            + (f" Every run under client-level differential privacy: {privacy}." if privacy else ""),
            "",
            *table,
            "",
            "Online accuracy counts each sample once, predicted in the round it arrived after the client's local "
            "step. A gain is a rule's accuracy minus none-fed's on the same seed (the same streams, the same local "
            "method: paired), averaged over the seeds; its interval is Student's t over the seeds (accuracy "
            "intervals in brackets, cut to 0-100). Few seeds give wide intervals: more narrow them (`--seeds 0-4`).",
            "",
            f"![gain over none-fed]({FIGURE})" if gains else "(No figure: a gain needs two seeds.)",
            "",
            "What each rule does and when it pays, from the project's measurements: `docs/choosing.md` in the "
            f"FedRAPP repository. Curves and every number of these runs: [{DETAILS}/{PAGE}]({DETAILS}/{PAGE}); each "
            "run's own folder: `runs/`. Redraw this page: "
            f"`python -m fedrapp_app.bench.compare {folder.resolve()}`.",
            "",
        ]
    )
    path = out / PAGE
    write_text_atomic(path, page)
    return path


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, "python -m fedrapp_app.bench.compare", __doc__ or "", write_compare_page, "")


if __name__ == "__main__":
    sys.exit(main())
