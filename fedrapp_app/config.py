"""The run configuration: every knob as a kebab-case key, validated before any model or data is loaded.

``pyproject.toml``'s ``[tool.flwr.app.config]`` holds the same keys and defaults, the everyday ones first, and
docs/configuration.md describes them by group (``python -m fedrapp_app.config --sync`` writes both; a test checks
that they agree); ``flwr run . -c "k=v"`` or ``-c file.toml`` overrides them. ``validate(run_config)`` returns a
``RunConfig`` or raises ``ConfigError`` listing every bad key with its value and what is allowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrapp_app import builtins
from fedrapp_app.data.shift import SHIFTS
from fedrapp_app.data.spec import STREAM_ORDERS, DataSpec

Scalar = bool | int | float | str


_KIND = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


class ConfigError(ValueError):
    """A run-config value is unknown, of the wrong type, out of range or contradicts another one."""


@dataclass(frozen=True)
class Key:
    """One run-config key: its default (which also fixes its type), its allowed values, its meaning."""

    name: str
    default: Scalar
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    group: str = "run"  # one of GROUPS' names
    everyday: bool = False  # shown in the README and first in pyproject.toml; the rest: docs/configuration.md

    def check(self, value: Any) -> str | None:
        """Return why ``value`` is not allowed for this key, or None when it is."""
        kind = type(self.default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            return f"must be {_KIND[kind]}, got {_KIND.get(type(value), type(value).__name__)} {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(repr, self.choices))}"
        if self.minimum is not None:
            if self.exclusive_minimum and not value > self.minimum:
                return f"must be > {self.minimum}"
            if not self.exclusive_minimum and not value >= self.minimum:
                return f"must be >= {self.minimum}"
        if self.maximum is not None and not value <= self.maximum:
            return f"must be <= {self.maximum}"
        return None

    def allowed(self) -> str:
        """Human-readable description of the allowed values."""
        if self.choices is not None:
            return "one of " + ", ".join(map(repr, self.choices))
        lo = "" if self.minimum is None else f"{'>' if self.exclusive_minimum else '>='} {self.minimum}"
        hi = "" if self.maximum is None else f"<= {self.maximum}"
        bounds = " and ".join(b for b in (lo, hi) if b)
        return _KIND[type(self.default)] + (f" {bounds}" if bounds else "")


#: This project's rules and methods, for the docs (a run may name any registered rule or method, plugins
#: included: ``fedrapp-list``, or a module:attribute reference).
STRATEGIES = builtins.RULES
LOCAL_METHODS = builtins.METHODS
_DATA = DataSpec()  # the data layer owns its defaults

#: The groups of keys, in the order the docs list them: (name, what the group is for).
GROUPS: tuple[tuple[str, str], ...] = (
    ("run", "what runs and where its results go"),
    ("data", "the dataset, its partition over clients and each client's stream"),
    ("population", "clients that join late, drop out of rounds or only evaluate (ours; docs/shift.md)"),
    ("method", "the clients' test-time method"),
    ("server rule", "how the server mixes the clients' prompts"),
    ("trust", "FedRAPP's trust option (ours)"),
    ("deployment", "waiting for nodes, timeouts and what the server accepts"),
    ("engine", "model, device and numerics"),
    ("attack", "adversarial clients, for robustness experiments"),
)

KEYS: tuple[Key, ...] = (
    # --- run ----------------------------------------------------------------------------------------
    Key(
        "strategy",
        "fedrapp",
        f"server rule: {', '.join(STRATEGIES)} ('domain-oracle': a testbed-only reference that knows the domains), "
        "a plugin's name (fedrapp-list lists them) or module:attribute (docs/extending.md)",
        group="run",
        everyday=True,
    ),
    Key(
        "local-method",
        "adaprompt",
        f"client test-time method: {', '.join(LOCAL_METHODS)}, a prompt-tuning method with a training-free head "
        "(adaprompt+tda, docs/methods.md), a plugin's name or module:Class",
        group="run",
        everyday=True,
    ),
    Key(
        "seed",
        0,
        "drives partitions, stream order, augmentations, initialisations, client sampling",
        minimum=0,
        group="run",
        everyday=True,
    ),
    Key(
        "num-clients",
        0,
        "number of clients (= data partitions); 0 = one per SuperNode: the simulation's num-supernodes, or the "
        "SuperNodes connected when a deployed run starts",
        minimum=0,
        group="run",
        everyday=True,
    ),
    Key(
        "num-rounds",
        0,
        "rounds to run; 0 = until every client's stream has ended",
        minimum=0,
        group="run",
        everyday=True,
    ),
    Key(
        "fraction",
        1.0,
        "share of the available clients sampled each round",
        minimum=0.0,
        exclusive_minimum=True,
        maximum=1.0,
        group="run",
        everyday=True,
    ),
    Key(
        "output-dir",
        "outputs",
        "folder for results (a relative path is resolved where the run starts)",
        group="run",
        everyday=True,
    ),
    Key(
        "run-name",
        "",
        "name of the results folder inside output-dir; '' = derived from the config",
        group="run",
        everyday=True,
    ),
    Key(
        "resume",
        False,
        "continue the run in output-dir/run-name from its last checkpoint (needs run-name)",
        group="run",
        everyday=True,
    ),
    Key(
        "report-own-prompt",
        False,
        "ours: each client also scores its own last tuned prompt on every new batch (H_own and its accuracy in the "
        "rows; one extra text pass); always on with FedRAPP's trust option, which reads H_own",
        group="run",
    ),
    # --- data ---------------------------------------------------------------------------------------
    Key("dataset", "testbed", "'testbed' or a dataset preset (see docs/datasets.md)", group="data", everyday=True),
    Key(
        "data-dir",
        "",
        "local folder of a webdataset, CoOp or image-folder dataset",
        group="data",
        everyday=True,
    ),
    Key(
        "partition",
        "dirichlet",
        "how test samples are split over clients",
        choices=("iid", "dirichlet"),
        group="data",
        everyday=True,
    ),
    Key(
        "dirichlet-alpha",
        0.1,
        "Dirichlet concentration of the label skew (smaller = more skew)",
        minimum=0.0,
        exclusive_minimum=True,
        group="data",
        everyday=True,
    ),
    Key("batch-size", 64, "test samples per client per round", minimum=1, group="data", everyday=True),
    Key(
        "data-source",
        "auto",
        "where the dataset comes from",
        choices=("auto", "hf", "webdataset", "coop", "imagefolder", "testbed"),
        group="data",
    ),
    Key("hf-repo", "", "Hugging Face dataset repo id ('' = the preset's default)", group="data"),
    Key("hf-split", "test", "split of the Hugging Face dataset", group="data"),
    Key("hf-image-column", _DATA.hf_image_column, "image column ('auto' = the first Image column)", group="data"),
    Key("hf-label-column", _DATA.hf_label_column, "label column ('auto' = the first ClassLabel column)", group="data"),
    Key("min-partition-size", 10, "smallest partition a Dirichlet draw may give a client", minimum=0, group="data"),
    Key("max-samples-per-client", 0, "cap on each client's stream; 0 = all", minimum=0, group="data"),
    Key(
        "testbed-samples",
        _DATA.testbed_samples,
        "size of the testbed's test pool (all clients together)",
        minimum=1,
        group="data",
    ),
    Key(
        "testbed-domains",
        _DATA.testbed_domains,
        "testbed shift domains 'name:severity,...'; client i gets domain i mod D ('clean' = none)",
        group="data",
    ),
    Key(
        "shift",
        _DATA.shift,
        "ours: how a client's testbed domain moves along its stream: 'fixed' (the paper's), 'continual' (through the "
        "domains in turn), 'gradual' (severity up and down, family by family), 'mixed' (per sample); docs/shift.md",
        choices=SHIFTS,
        group="data",
    ),
    Key("shift-period", _DATA.shift_period, "batches per shift step (continual, gradual)", minimum=1, group="data"),
    Key(
        "shift-rate",
        _DATA.shift_rate,
        "below 1; > 0: a shift step at each batch with this probability (shared by all clients), not each period",
        minimum=0.0,
        group="data",
    ),
    Key(
        "shift-spread",
        _DATA.shift_spread,
        "domains active across clients at once under a schedule (client i starts at domain i mod it); 0 = all",
        minimum=0,
        group="data",
    ),
    Key(
        "corruptions",
        _DATA.corruptions,
        "ours: a real dataset's shift domains, ImageNet-C corruptions 'name:severity,...' (severity 1-5; client i "
        "gets domain i mod D, or they move with shift); needs pip install 'fedrapp[corruptions]'; docs/shift.md",
        group="data",
    ),
    Key(
        "stream-order",
        _DATA.stream_order,
        "ours: a client's stream at random (the paper's) or class after class ('class', class-correlated)",
        choices=STREAM_ORDERS,
        group="data",
    ),
    Key(
        "decode-workers",
        _DATA.decode_workers,
        "threads decoding images of a batch (0 = in the caller)",
        minimum=0,
        group="data",
    ),
    # --- population ---------------------------------------------------------------------------------
    Key(
        "late-clients",
        0,
        "clients (the ids just below the held-out ones) that take part only from late-round on; their first prompt "
        "is the rule's for a client never seen (FedRAPP, FedAMP: the mean of the memories)",
        minimum=0,
        group="population",
    ),
    Key("late-round", 5, "the round the late clients join in", minimum=2, group="population"),
    Key(
        "drop-rate",
        0.0,
        "below 1: each client sampled for a round is absent from it with this probability (seeded per round)",
        minimum=0.0,
        group="population",
    ),
    Key(
        "held-out-clients",
        0,
        "clients (the last ids) that are sent the rule's prompt for a client never seen and scored, but whose "
        "uploads never reach the rule",
        minimum=0,
        group="population",
    ),
    Key("held-out-every", 1, "a held-out client takes a batch every this many rounds", minimum=1, group="population"),
    # --- method -------------------------------------------------------------------------------------
    Key(
        "csc",
        False,
        "class-specific context (ours): one context per class (CoOp's CSC) in tpt, tpt-online, adaprompt, im",
        group="method",
        everyday=True,
    ),
    Key("adaprompt-lr", 5e-3, "AdaPrompt AdamW learning rate", minimum=0.0, exclusive_minimum=True, group="method"),
    Key(
        "adaprompt-threshold",
        0.7,
        "AdaPrompt confidence threshold of the buffer",
        minimum=0.0,
        maximum=1.0,
        group="method",
    ),
    Key("adaprompt-buffer-size", 64, "AdaPrompt class-balanced buffer size", minimum=1, group="method"),
    Key("adaprompt-double-softmax", True, "AdaPrompt reference loss (softmax before cross-entropy)", group="method"),
    Key("tpt-lr", 5e-3, "TPT AdamW learning rate", minimum=0.0, exclusive_minimum=True, group="method"),
    Key("tpt-views", 63, "TPT augmented views per image (plus the original)", minimum=1, group="method"),
    Key(
        "tpt-keep-ratio",
        0.1,
        "TPT share of lowest-entropy views kept",
        minimum=0.0,
        exclusive_minimum=True,
        maximum=1.0,
        group="method",
    ),
    Key("tpt-augmix", False, "TPT: AugMix on top of the random resized crop + flip views", group="method"),
    Key("im-lr", 5e-3, "IM (ours) AdamW learning rate", minimum=0.0, exclusive_minimum=True, group="method"),
    Key(
        "im-diversity-weight",
        1.0,
        "IM weight of the diversity term (0 = plain entropy minimisation, which collapses)",
        minimum=0.0,
        group="method",
    ),
    Key(
        "im-marginal",
        "batch",
        "IM diversity term: 'batch' = entropy of the batch-mean prediction, 'ema' = "
        "against a running marginal kept on the client",
        choices=("batch", "ema"),
        group="method",
    ),
    Key(
        "im-ema-momentum",
        0.5,
        "IM weight of the past in the running marginal (im-marginal = 'ema')",
        minimum=0.0,
        maximum=0.999,
        group="method",
    ),
    Key(
        "method-params",
        "",
        "parameters of the local method as key=value pairs, e.g. 'lr=0.001 share=0.5' (any method, plugins "
        "included; fedrapp-list shows each method's parameters); a built-in's own key above may not be given here too",
        group="method",
    ),
    # --- server rule (FedRAPP: SPEC §4; the baselines: SPEC §5) -------------------------------------
    Key(
        "lambda-drop",
        1.0,
        "FedRAPP weight of the entropy drop H_pre - H_post in the reliability",
        minimum=0.0,
        group="server rule",
    ),
    Key(
        "lambda-ent",
        0.5,
        "FedRAPP weight of the post-adaptation entropy in the reliability",
        minimum=0.0,
        group="server rule",
    ),
    Key("lambda-drift", 0.5, "FedRAPP weight of the prompt drift in the reliability", minimum=0.0, group="server rule"),
    Key("mu0", 0.5, "FedRAPP base memory rate", minimum=0.0, maximum=1.0, group="server rule"),
    Key("eta", 0.15, "FedRAPP reliability slope of the memory rate", minimum=0.0, group="server rule"),
    Key(
        "tau",
        0.2,
        "FedRAPP temperature of the peer weights",
        minimum=0.0,
        exclusive_minimum=True,
        group="server rule",
    ),
    Key(
        "gamma0",
        0.3,
        "FedRAPP base share of the peers in the personalized prompt",
        minimum=0.0,
        maximum=1.0,
        group="server rule",
    ),
    Key("gamma-max", 0.8, "FedRAPP cap of the peers' share", minimum=0.0, maximum=1.0, group="server rule"),
    Key(
        "update-clip",
        0.0,
        "FedRAPP (ours): memories and peer mixing use each update clipped to this multiple "
        "of the round's median update norm; the reliability still sees the raw update (0 = off)",
        minimum=0.0,
        group="server rule",
    ),
    Key(
        "fedamp-sigma",
        1.0,
        "FedAMP kernel scale sigma of exp(-||Pi - Pj||^2 / sigma)",
        minimum=0.0,
        exclusive_minimum=True,
        group="server rule",
    ),
    Key("fedamp-self-min", 0.1, "FedAMP smallest self weight xi_ii", minimum=0.0, maximum=1.0, group="server rule"),
    Key(
        "fedamp-cos-sigma",
        10.0,
        "HeurFedAMP (fedamp-cos) sharpness of exp(sigma * cos)",
        minimum=0.0,
        exclusive_minimum=True,
        group="server rule",
    ),
    Key(
        "fedamp-cos-self-weight",
        0.5,
        "HeurFedAMP (fedamp-cos) fixed self weight xi_ii",
        minimum=0.0,
        maximum=1.0,
        group="server rule",
    ),
    Key("trimmed-beta", 0.2, "FedTrimmedAvg share cut at each end", minimum=0.0, maximum=0.49, group="server rule"),
    Key("krum-malicious", 1.0, "Krum: number of adversarial clients tolerated", minimum=0.0, group="server rule"),
    Key(
        "rule-params",
        "",
        "parameters of the strategy's rule as key=value pairs, e.g. 'weight=0.3 mode=\"fast\"' (any rule, plugins "
        "included; fedrapp-list shows each rule's parameters); a built-in's own key above may not be given here too",
        group="server rule",
    ),
    # --- trust (ours: fedrapp_app/aggregation/trust.py) ------------------------------------------------
    Key(
        "trust",
        False,
        "FedRAPP's trust option (ours): each client's memory and peers are used only as far as they beat its own "
        "last tuned prompt on its new batch (label-free evidence the client reports); false = the paper's rule",
        group="trust",
        everyday=True,
    ),
    Key(
        "trust-memory-target",
        0.275,
        "trust option: share of rounds a client's sent prompt must win its neighbour vote for half its memory "
        "(the memory trust ramps from 0 to 1 between this - 0.075 and this + 0.075)",
        minimum=0.0,
        maximum=1.0,
        group="trust",
    ),
    Key(
        "trust-peer-target",
        0.15,
        "trust option: share of rounds the paper's prompt must beat a client's own in information for its peer "
        "trust to hold (it rises above, falls below)",
        minimum=0.0,
        maximum=1.0,
        group="trust",
    ),
    # --- deployment ---------------------------------------------------------------------------------
    Key(
        "min-nodes",
        0,
        "nodes to wait for before round 1; 0 = num-clients (or 1 when num-clients = 0)",
        minimum=0,
        group="deployment",
    ),
    Key(
        "node-wait-timeout",
        300.0,
        "seconds to wait for min-nodes nodes",
        minimum=0.0,
        exclusive_minimum=True,
        group="deployment",
    ),
    Key(
        "round-timeout",
        900.0,
        "seconds to wait for the replies of a round",
        minimum=0.0,
        exclusive_minimum=True,
        group="deployment",
    ),
    Key(
        "max-norm-ratio",
        100.0,
        "an upload whose norm exceeds this multiple of the initial prompt's is rejected",
        minimum=1.0,
        group="deployment",
    ),
    # --- engine -------------------------------------------------------------------------------------
    Key(
        "model",
        "testbed",
        "CLIP checkpoint: 'testbed' (shipped), a local folder or a Hugging Face Hub id",
        group="engine",
        everyday=True,
    ),
    Key(
        "device",
        "auto",
        "'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'; in the simulation each client sees its GPU share as "
        "cuda:0; a SuperNode's node config 'device' overrides it",
        group="engine",
        everyday=True,
    ),
    Key(
        "precision",
        "fp32",
        "compute precision: fp32 (IEEE, TF32 off on GPUs), bf16 or fp16 autocast (fp16 with loss scaling)",
        choices=("fp32", "bf16", "fp16"),
        group="engine",
        everyday=True,
    ),
    Key(
        "deterministic",
        False,
        "deterministic GPU kernels: bit-reproducible csc runs on one GPU, at some speed cost",
        group="engine",
    ),
    # --- attack (robustness experiments) --------------------------------------------------------------
    Key(
        "attack",
        "none",
        "what the clients in attack-clients upload instead of their tuned prompt",
        choices=("none", "random", "scaled"),
        group="attack",
    ),  # see fedrapp_app/attacks.py
    Key("attack-clients", "", "comma-separated ids of adversarial clients, e.g. '0,5'", group="attack"),
    Key(
        "attack-scale",
        10.0,
        "scaled attack: the upload is sent + attack-scale * (tuned - sent)",
        minimum=0.0,
        group="attack",
    ),
)

KEY_BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}
DEFAULTS: dict[str, Scalar] = {k.name: k.default for k in KEYS}


def override_hint(key: str, value: str = "<value>") -> str:
    """``-c "key=value"`` quoted as flwr's ``-c`` parser needs it: TOML values, so strings in single quotes."""
    key_spec = KEY_BY_NAME.get(key)
    if key_spec is not None and isinstance(key_spec.default, str):
        value = f"'{value}'"
    return f'-c "{key}={value}"'


def _problem(key: str, value: Any, why: str) -> str:
    return f"  {key} = {value!r}: {why} (fix: {override_hint(key)} or edit [tool.flwr.app.config])"


def check_values(run_config: Mapping[str, Any], with_rule: bool = True) -> dict[str, Scalar]:
    """Defaults overlaid with ``run_config``; raise ``ConfigError`` naming every unknown or bad key (the server
    rule's included unless ``with_rule`` is False)."""
    problems = []
    for name, value in run_config.items():
        key = KEY_BY_NAME.get(name)
        if key is None:
            family = [k for k in KEY_BY_NAME if k.split("-")[0] == str(name).split("-")[0]]  # trust-*, shift-*
            close = difflib.get_close_matches(name, family, n=1) or difflib.get_close_matches(name, KEY_BY_NAME, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "every key is in docs/configuration.md"
            problems.append(f"  {name} = {value!r}: unknown key ({hint})")
            continue
        why = key.check(value)
        if why:
            problems.append(_problem(name, value, why))
    if problems:
        raise ConfigError("invalid run config:\n" + "\n".join(problems))
    values = dict(DEFAULTS)
    for name, value in run_config.items():
        values[name] = float(value) if isinstance(KEY_BY_NAME[name].default, float) else value
    _check_combinations(values, with_rule)
    return values


def attack_clients(text: str) -> frozenset[int]:
    """Client ids of ``attack-clients`` ('' = none); ValueError on anything but comma-separated integers."""
    return frozenset(int(part) for part in text.split(",") if part.strip())


def _testbed_pool_problems(clients: int, v: Mapping[str, Scalar]) -> list[str]:
    """The testbed's pool size is a config value: check here that ``clients`` partitions of it can exist.

    The suggested pool for a Dirichlet partition is 4x the smallest that fits (``clients x min-partition-size``):
    a Dirichlet(alpha) draw gives many clients fewer samples than the minimum, and those are topped up from the
    largest clients (``data.partition.repair_min_size``), which evens out the partition drawn. Measured at alpha 0.1,
    seed 0, 600 clients x 10: a pool of 6000 tops up 323 clients (24% of the samples move, median client 10
    samples), 24000 tops up 23 (0.3%, median 35).
    """
    pool, batch = int(v["testbed-samples"]), int(v["batch-size"])
    if v["partition"] != "dirichlet":  # iid: one sample per client fits; one batch each is a run worth its name
        if clients <= pool:
            return []
        return [
            f"  num-clients = {clients}: the testbed pool of testbed-samples = {pool} cannot give {clients} clients "
            f'one sample each (fix: -c "testbed-samples={clients * batch}", one batch of batch-size = {batch} per '
            f'client, or -c "num-clients={pool}")'
        ]
    minimum = int(v["min-partition-size"])
    if clients * minimum <= pool:
        return []
    fits = [f'-c "num-clients={pool // minimum}"'] if pool >= minimum else []
    fits += [f'-c "min-partition-size={pool // clients}"'] if pool >= clients else []
    return [
        f"  num-clients = {clients}: the testbed pool of testbed-samples = {pool} cannot give {clients} clients x "
        f"min-partition-size = {minimum} samples = {clients * minimum} (fix: "
        f'-c "testbed-samples={clients * minimum * 4}", 4x the {clients * minimum} that just fit: a Dirichlet draw '
        f"leaves many clients short of min-partition-size, and topping them up from the largest ones evens out the "
        f"partition it drew; or {' or '.join(fits) or 'fewer clients'})"
    ]


def _check_combinations(v: Mapping[str, Scalar], with_rule: bool = True) -> None:
    """Contradictions between keys that each look fine alone."""
    problems = []
    clients = int(v["num-clients"])  # 0: one per SuperNode, known once the run starts
    if clients and v["min-nodes"] > clients:
        problems.append(_problem("min-nodes", v["min-nodes"], f"cannot exceed num-clients = {clients}"))
    if clients and v["dataset"] == "testbed":
        problems.extend(_testbed_pool_problems(clients, v))
    if not 0 <= v["drop-rate"] < 1:
        problems.append(_problem("drop-rate", v["drop-rate"], "must be below 1 (every client would drop every round)"))
    if clients and v["late-clients"] + v["held-out-clients"] >= clients:
        problems.append(
            _problem(
                "late-clients",
                v["late-clients"],
                f"late-clients + held-out-clients = {v['late-clients'] + v['held-out-clients']} must leave a client "
                f"of the {clients} that takes part from round 1",
            )
        )
    if v["gamma0"] > v["gamma-max"]:
        problems.append(_problem("gamma0", v["gamma0"], f"cannot exceed gamma-max = {v['gamma-max']}"))
    if v["resume"] and not v["run-name"]:
        problems.append(
            _problem(
                "resume",
                True,
                "needs the run-name of the run to continue (derived names "
                "carry a start time); set -c \"run-name='<name>'\"",
            )
        )
    shipped = Path(__file__).resolve().parent / "testbed" / "model"  # the testbed CLIP, also given by its path
    if v["dataset"] != "testbed" and (
        v["model"] == "testbed" or Path(str(v["model"])).expanduser().resolve() == shipped
    ):
        problems.append(
            _problem(
                "model",
                v["model"],
                f"the testbed CLIP only knows the testbed world's words, not dataset {v['dataset']!r}; "
                'use a real CLIP such as model="openai/clip-vit-base-patch16"',
            )
        )
    if v["trust"] and v["strategy"] != "fedrapp":
        problems.append(  # the fix is another key's value, so not _problem's hint to change this one
            f"  trust = True: the trust option is FedRAPP's; strategy = {v['strategy']!r} has none "
            f"(fix: {override_hint('strategy', 'fedrapp')}, or drop trust)"
        )
    inert = [k for k in ("trust-memory-target", "trust-peer-target") if v[k] != DEFAULTS[k]]
    if inert and rule_name(v) != "fedrapp-trust":
        problems.append(  # the fix is another key's value, so not _problem's hint to change this one
            f"  {inert[0]} = {v[inert[0]]!r}: has no effect: FedRAPP's trust option is off (strategy = "
            f"{v['strategy']!r}, trust = {v['trust']}); it needs strategy='fedrapp' and trust = true "
            f"(fix: {override_hint('trust', 'true')}, or drop {inert[0]})"
        )
    try:
        attackers = attack_clients(str(v["attack-clients"]))
    except ValueError:
        problems.append(_problem("attack-clients", v["attack-clients"], "must be comma-separated client ids"))
    else:
        if clients and any(not 0 <= c < clients for c in attackers):
            problems.append(_problem("attack-clients", v["attack-clients"], f"ids must be in 0..{clients - 1}"))
        if attackers and v["attack"] == "none":
            problems.append(_problem("attack", "none", "attack-clients is set: choose 'random' or 'scaled'"))
    from fedrapp_app.engine.devices import parse_device  # light: no torch

    try:
        parse_device(str(v["device"]))
    except ValueError:
        problems.append(_problem("device", v["device"], "must be 'auto', 'cpu', 'cuda' or 'cuda:N'"))
    if not problems:
        problems.extend(_plugin_problems(v, with_rule))
    if problems:
        raise ConfigError("invalid run config:\n" + "\n".join(problems))


def _plugin_problems(v: Mapping[str, Scalar], with_rule: bool = True) -> list[str]:
    """The rule (unless ``with_rule`` is False) and the method the config names exist here and take the
    parameters it gives them."""
    from fedrapp_app.plugins import PluginError

    problems, own_prompt = [], False
    if with_rule:
        try:
            rule = resolve_rule(v)
            own_prompt = rule.reads_own_prompt
            if rule.selected_by and v["strategy"] == rule_name(v):
                problems.append(_problem("strategy", v["strategy"], f"is selected by {rule.selected_by}, not by name"))
            else:
                rule_values(v)
        except (PluginError, ValueError, TypeError) as err:
            key = "rule-params" if v["rule-params"] and not isinstance(err, PluginError) else "strategy"
            problems.append(_plugin_problem(key, v[key], err))
    try:
        method_values(v, own_prompt)
    except (PluginError, ValueError, TypeError) as err:
        key = "method-params" if v["method-params"] and not isinstance(err, PluginError) else "local-method"
        problems.append(_plugin_problem(key, v[key], err))
    return problems


def _plugin_problem(key: str, value: Any, err: Exception) -> str:
    """One line for a rule or method problem; the fix hint where the message gives none."""
    hint = "" if "fix:" in str(err) else f" (fix: {override_hint(key)})"
    return f"  {key} = {value!r}: {err}{hint}"


def rule_name(v: Mapping[str, Scalar]) -> str:
    """The registry name of the rule the config runs: ``strategy``, or FedRAPP's trust option with trust = true."""
    return "fedrapp-trust" if v["strategy"] == "fedrapp" and v["trust"] else str(v["strategy"])


def resolve_rule(v: Mapping[str, Scalar]):
    """The :class:`~fedrapp_app.aggregation.Rule` the config runs (``PluginError`` if it is not installed here)."""
    from fedrapp_app.aggregation import find_rule

    return find_rule(rule_name(v)).target


def _merged(own_keys: Mapping[str, str], v: Mapping[str, Scalar], where: str) -> dict[str, Any]:
    """The parameters a built-in's own keys give (``own_keys``: config key -> parameter) with the ``key=value``
    pairs of ``v[where]``; a parameter that has a key of its own is refused there."""
    from fedrapp_app.parameters import parse_assignments

    extra = {k.replace("-", "_"): value for k, value in parse_assignments(str(v[where]), where).items()}
    for key, param in own_keys.items():
        if param in extra:
            raise ValueError(f"{param!r} has a key of its own (fix: {override_hint(key)}, not in {where})")
    return {**{param: v[key] for key, param in own_keys.items()}, **extra}


def rule_values(v: Mapping[str, Scalar], groups: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """The rule's parameters the config gives (its own keys and ``rule-params``), checked: a ``ValueError`` or
    ``TypeError`` names the bad one. A reference rule (the domain oracle) also gets ``groups``, the client ->
    domain map (a placeholder for the checks made before the clients are known)."""
    from fedrapp_app.parameters import build_params

    name = rule_name(v)
    rule = resolve_rule(v)
    values = _merged(RULE_KEYS.get(name, {}), v, "rule-params")
    if rule.reference:
        values["groups"] = groups
    build_params(rule.params, values, f"server rule {name!r}")
    return values


def method_values(v: Mapping[str, Scalar], own_prompt: bool) -> dict[str, Any]:
    """The local method's parameters the config gives (its own keys, ``csc``, ``method-params``, and own_prompt
    where the rule or report-own-prompt needs it), checked as :func:`rule_values` does."""
    from fedrapp_app.methods import find_method
    from fedrapp_app.parameters import build_params, field_names

    name = str(v["local-method"])
    spec = find_method(name).target
    fields = field_names(spec.params)
    own_keys = dict(method_keys(name))
    if v["csc"] and "csc" not in own_keys:
        if "csc" not in fields:
            raise ValueError(
                f"csc = true: this method has no class-specific context (fix: {override_hint('csc', 'false')})"
            )
        own_keys["csc"] = "csc"
    values = _merged(own_keys, v, "method-params")
    if own_prompt or v["report-own-prompt"]:
        if "own-prompt" not in fields:
            raise ValueError(
                "it cannot score its own last tuned prompt (no own_prompt parameter), which report-own-prompt and "
                "FedRAPP's trust option need"
            )
        values["own_prompt"] = True
    build_params(spec.params, values, f"local method {name!r}")
    return values


#: Run-config keys of each local method's hyperparameters -> the method's parameter names.
METHOD_KEYS: dict[str, dict[str, str]] = {
    "adaprompt": {
        "adaprompt-lr": "lr",
        "adaprompt-threshold": "threshold",
        "adaprompt-buffer-size": "buffer_size",
        "adaprompt-double-softmax": "double_softmax",
        "csc": "csc",
    },
    "tpt": {
        "tpt-lr": "lr",
        "tpt-views": "n_views",
        "tpt-keep-ratio": "keep_ratio",
        "tpt-augmix": "augmix",
        "csc": "csc",
    },
    "im": {
        "im-lr": "lr",
        "im-diversity-weight": "diversity_weight",
        "im-marginal": "marginal",
        "im-ema-momentum": "ema_momentum",
        "csc": "csc",
    },
    "zeroshot": {},
}
METHOD_KEYS["tpt-online"] = METHOD_KEYS["tpt"]


def method_keys(name: str) -> dict[str, str]:
    """The run-config keys of local method ``name`` (a stacked ``base+head``: its base's)."""
    return METHOD_KEYS.get(name.partition("+")[0], {})


#: Run-config keys of each server rule's hyperparameters -> the rule's parameter names.
RULE_KEYS: dict[str, dict[str, str]] = {
    "fedrapp": {
        "lambda-drop": "lambda_drop",
        "lambda-ent": "lambda_ent",
        "lambda-drift": "lambda_drift",
        "mu0": "mu0",
        "eta": "eta",
        "tau": "tau",
        "gamma0": "gamma0",
        "gamma-max": "gamma_max",
        "update-clip": "update_clip",
    },
    "none-fed": {},
    "fedavg": {},
    "fedamp": {"fedamp-sigma": "sigma", "fedamp-self-min": "min_self_weight"},
    "fedamp-cos": {"fedamp-cos-sigma": "sigma", "fedamp-cos-self-weight": "self_weight"},
    "fedmedian": {},
    "fedtrimmedavg": {"trimmed-beta": "beta"},
    "krum": {"krum-malicious": "num_malicious"},
    "domain-oracle": {},  # its parameter, the client -> domain map, comes from the data spec
}
#: FedRAPP with its trust option (``trust = true``): the paper's keys and the option's two targets.
RULE_KEYS["fedrapp-trust"] = {
    **RULE_KEYS["fedrapp"],
    "trust-memory-target": "trust_memory_target",
    "trust-peer-target": "trust_peer_target",
}

#: Run-config keys of the data layer -> DataSpec fields.
DATA_KEYS: dict[str, str] = {
    "dataset": "dataset",
    "data-source": "source",
    "data-dir": "data_dir",
    "hf-repo": "hf_repo",
    "hf-split": "hf_split",
    "hf-image-column": "hf_image_column",
    "hf-label-column": "hf_label_column",
    "num-clients": "num_clients",
    "partition": "partition",
    "dirichlet-alpha": "dirichlet_alpha",
    "min-partition-size": "min_partition_size",
    "seed": "seed",
    "batch-size": "batch_size",
    "max-samples-per-client": "max_samples_per_client",
    "testbed-samples": "testbed_samples",
    "testbed-domains": "testbed_domains",
    "decode-workers": "decode_workers",
    "shift": "shift",
    "shift-period": "shift_period",
    "shift-rate": "shift_rate",
    "shift-spread": "shift_spread",
    "stream-order": "stream_order",
    "corruptions": "corruptions",
}


#: Keys a resumed run may change; every other key must equal the checkpointed run's.
RESUMABLE_KEYS = frozenset({"resume", "num-rounds", "node-wait-timeout", "round-timeout", "decode-workers"})


@dataclass(frozen=True)
class RunConfig:
    """A validated run config: ``values`` maps every key (kebab-case) to its value, defaults included."""

    values: dict[str, Scalar]
    with_rule: bool = True  # the server rule was checked too (not where only clients run: see from_run_config)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], with_rule: bool = True) -> RunConfig:
        """Validate Flower's ``context.run_config`` (or any mapping of overrides); raise ``ConfigError``.

        ``with_rule = False`` leaves the server rule out of the checks: a ClientApp does not run it, and a rule
        plugin need only be installed where the ServerApp runs (docs/extending.md)."""
        values = check_values(run_config, with_rule)
        config = cls(values, with_rule)
        # The data layer checks its own combinations (domains, sources) here, cheaply, and the domain oracle
        # its domain map; with one client per SuperNode (0), on one client until the run has counted them.
        spec = config.data_spec(num_clients=config.num_clients or 1)
        if with_rule and resolve_rule(values).reference:
            _domain_groups(spec)
        return config

    @property
    def num_clients(self) -> int:
        """The number of clients, or 0 while it is "one per SuperNode" and the run has not counted them."""
        return int(self.values["num-clients"])

    def with_num_clients(self, num_clients: int) -> RunConfig:
        """This config with ``num-clients`` resolved (e.g. to the SuperNodes of the run), validated again."""
        return RunConfig.from_run_config({**self.values, "num-clients": int(num_clients)}, self.with_rule)

    def __getitem__(self, key: str) -> Scalar:
        return self.values[key]

    def method_params(self, own_prompt: bool | None = None) -> tuple[str, dict[str, Any]]:
        """Name and hyperparameters of the local method (a registered name or module:Class); ``own_prompt``:
        whether it scores its own last tuned prompt (default: :attr:`reports_own_prompt`; a client is told by
        the server, which knows the rule)."""
        own = self.reports_own_prompt if own_prompt is None else own_prompt
        return str(self.values["local-method"]), method_values(self.values, own)

    @property
    def reports_own_prompt(self) -> bool:
        """Whether clients score their own last tuned prompt on each batch (H_own): asked for, or read by the
        server rule (FedRAPP's trust option)."""
        return bool(self.values["report-own-prompt"]) or resolve_rule(self.values).reads_own_prompt

    def rule_params(self) -> tuple[str, dict[str, Any]]:
        """Registry name and hyperparameters of the server rule."""
        reference = resolve_rule(self.values).reference
        return rule_name(self.values), rule_values(self.values, self.domain_groups() if reference else (0,))

    def domain_groups(self) -> tuple[int, ...]:
        """Each client's shift-domain index (testbed only); ``ConfigError`` where no domain map exists."""
        return _domain_groups(self.data_spec())

    def population(self):
        """Who takes part in each round (``fedrapp_app.population.Population``); needs num-clients resolved."""
        from fedrapp_app.population import Population

        v = self.values
        return Population(
            self.num_clients, int(v["late-clients"]), int(v["late-round"]), float(v["drop-rate"]),
            int(v["held-out-clients"]), int(v["held-out-every"]), int(v["seed"]),
        )  # fmt: skip

    def data_spec(self, **overrides: Scalar):
        """The data layer's spec (``fedrapp_app.data.DataSpec``), validated; ``overrides`` by field name."""
        from fedrapp_app.data import DataSpec, validate_spec

        if not self.num_clients and "num_clients" not in overrides:
            raise ConfigError("num-clients = 0 (one client per SuperNode) must be resolved first: with_num_clients(n)")
        spec = DataSpec(**{**{field: self.values[key] for key, field in DATA_KEYS.items()}, **overrides})
        try:
            validate_spec(spec)
        except ValueError as err:
            raise ConfigError(f"invalid run config:\n  {err}") from err
        return spec

    def run_name(self) -> str:
        """The results folder's name: ``run-name`` or one derived from the main choices."""
        if self.values["run-name"]:
            return str(self.values["run-name"])
        v = self.values
        model = str(v["model"]).rstrip("/").split("/")[-1]
        return f"{v['dataset']}-{model}-{v['local-method']}-{v['strategy']}-seed{v['seed']}"


def _domain_groups(spec) -> tuple[int, ...]:
    """Each client's shift-domain index under ``spec`` (a ``DataSpec``); ``ConfigError`` without a domain map."""
    from fedrapp_app.data import client_domains

    domains = client_domains(spec)
    if any(d is None for d in domains):
        raise ConfigError(
            "invalid run config:\n  strategy = 'domain-oracle': it needs every client's shift domain, which "
            "only the testbed with testbed-domains and shift='fixed' has; it is a reference, not a deployable strategy"
        )
    index = {d: i for i, d in enumerate(dict.fromkeys(domains))}
    return tuple(index[d] for d in domains)


#: The keys the README shows and pyproject.toml lists first, with their meaning.
EVERYDAY: tuple[Key, ...] = tuple(k for k in KEYS if k.everyday)


if __name__ == "__main__":  # the config's documents: python -m fedrapp_app.config [--sync | --pyproject]
    from fedrapp_app.config_docs import main

    main()
