"""The run config: pyproject.toml and the schema agree; every bad value fails early with a useful message."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedrapp_app.aggregation import FedRAPPParams, TrustParams, make_params, make_rule
from fedrapp_app.config import (
    DEFAULTS,
    EVERYDAY,
    GROUPS,
    KEYS,
    LOCAL_METHODS,
    STRATEGIES,
    ConfigError,
    RunConfig,
)
from fedrapp_app.config.docs import markdown_table, pyproject_block, reference_page
from fedrapp_app.methods import make_method

ROOT = Path(__file__).resolve().parent.parent


def _pyproject_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_pyproject_holds_every_key_with_the_schema_default():
    assert _pyproject_config() == DEFAULTS


def test_run_override_file_is_valid():
    overrides = tomllib.loads((ROOT / "pyproject-run.toml").read_text())
    config = RunConfig.from_run_config(overrides)
    assert config["model"] == "openai/clip-vit-base-patch16" and config["num-clients"] == 10
    assert config["dirichlet-alpha"] == 0.1 and config["local-method"] == "adaprompt"


@pytest.mark.parametrize("method", LOCAL_METHODS)
def test_every_method_accepts_its_config_keys(method):
    name, params = RunConfig.from_run_config({"local-method": method}).method_params()
    assert make_method(name, params).name == method


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_accepts_its_config_keys(strategy):
    method = {"local-method": "latte"} if strategy == "latte" else {}  # latte reads what its method uploads
    name, params = RunConfig.from_run_config({"strategy": strategy, "num-clients": 8, **method}).rule_params()
    assert make_rule(name, params).name == strategy


def test_config_values_reach_the_method_and_the_rule():
    config = RunConfig.from_run_config({"adaprompt-lr": 0.01, "tau": 0.5, "gamma0": 0.2})
    assert make_method(*config.method_params()).params.lr == 0.01
    rule = make_rule(*config.rule_params())
    assert (rule.params.tau, rule.params.gamma0) == (0.5, 0.2)


@pytest.mark.parametrize(
    ("overrides", "key", "hint"),
    [
        ({"strategy": "fedprox"}, "strategy", "installed: domain-oracle, fedamp"),
        ({"local-method": "tent"}, "local-method", "unknown local method 'tent'; installed: adaprompt, "),
        ({"num-clients": -1}, "num-clients", ">= 0"),
        ({"num-clients": 2.5}, "num-clients", "must be an integer"),
        ({"fraction": 0.0}, "fraction", "> 0.0"),
        ({"fraction": 1.5}, "fraction", "<= 1.0"),
        ({"dirichlet-alpha": -1.0}, "dirichlet-alpha", "> 0.0"),
        ({"mu0": 2.0}, "mu0", "<= 1.0"),
        ({"tau": 0.0}, "tau", "> 0.0"),
        ({"batch-size": "64"}, "batch-size", "must be an integer"),
        ({"tpt-augmix": 1}, "tpt-augmix", "must be a boolean"),
        ({"precision": "fp8"}, "precision", "one of"),
        ({"device": "tpu"}, "device", "cuda:N"),
        ({"min-nodes": 9, "num-clients": 8}, "min-nodes", "num-clients"),
        ({"gamma0": 0.9}, "gamma0", "gamma-max"),
        ({"dataset": "dtd"}, "model", "real CLIP"),
        ({"testbed-domains": "fog:1"}, "testbed-domains", "fog"),
        ({"partition": "shards"}, "partition", "one of"),
        ({"trust-memory-target": 0.3}, "trust-memory-target", '-c "trust=true"'),  # the trust option is off
        ({"strategy": "fedavg", "trust-peer-target": 0.2}, "trust-peer-target", "strategy='fedrapp'"),
        ({"strategy": "fedavg", "trust": True}, "trust = True", "strategy='fedrapp'"),
        ({"trust": 1}, "trust", "must be a boolean"),
        ({"trust-rate": 1.0}, "trust-rate", "unknown key (did you mean 'trust'"),  # the knobs of the exploration
        ({"trust": True, "trust-peer-target": 1.5}, "trust-peer-target", "<= 1.0"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(overrides, key, hint):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config(overrides)
    assert key in str(err.value) and hint in str(err.value)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match="did you mean 'dirichlet-alpha'"):
        RunConfig.from_run_config({"dirichlet_alpha": 0.5})


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"tau": -1.0, "eta": -1.0, "nope": 1})
    text = str(err.value)
    assert "tau" in text and "eta" in text and "nope" in text


def test_ints_are_accepted_for_float_keys_and_defaults_fill_the_rest():
    config = RunConfig.from_run_config({"tau": 1})
    assert config["tau"] == 1.0 and isinstance(config["tau"], float)
    assert set(config.values) == {k.name for k in KEYS}


def test_derived_run_name_names_the_main_choices():
    name = RunConfig.from_run_config({"strategy": "fedavg", "seed": 3}).run_name()
    assert name == "testbed-testbed-adaprompt-fedavg-seed3"


def test_the_readme_the_reference_and_pyproject_show_the_schema():
    """README's table (the everyday keys), docs/configuration.md (every key, by group) and pyproject's config block
    are what ``python -m fedrapp_app.config --sync`` writes; pyproject declares every key (Flower refuses an
    override of an undeclared one), the everyday ones first."""
    assert markdown_table() in (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "configuration.md").read_text() == reference_page()
    assert pyproject_block() in (ROOT / "pyproject.toml").read_text()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert list(declared) == [k.name for k in EVERYDAY] + [
        k.name for k in KEYS if not k.everyday and k.name in declared
    ]
    assert declared == DEFAULTS
    assert {k.group for k in KEYS} == {name for name, _ in GROUPS}


def test_the_trust_switch_selects_the_option_with_its_two_targets():
    config = RunConfig.from_run_config({"trust": True, "trust-memory-target": 0.3})
    name, params = config.rule_params()
    assert name == "fedrapp-trust" and config.reports_own_prompt
    assert make_params(name, params) == TrustParams(trust_memory_target=0.3)
    paper = RunConfig.from_run_config({}).rule_params()
    assert paper[0] == "fedrapp" and make_params(*paper) == FedRAPPParams()
    assert not RunConfig.from_run_config({}).reports_own_prompt
