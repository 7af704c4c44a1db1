"""The run configuration: every knob as a kebab-case key, validated before any model or data is loaded.

One module per group of keys, each holding its keys (default, range, meaning) and the check of contradictions
between them: ``run``, ``data``, ``population``, ``method``, ``rule`` (the server rule), ``trust``,
``deployment``, ``engine``, ``attack``. ``keys`` says what a key and a group are, ``schema`` puts the groups
together and checks a whole config, ``run_config`` holds ``RunConfig``, and ``docs`` writes the documents.

``pyproject.toml``'s ``[tool.flwr.app.config]`` holds the same keys and defaults, the everyday ones first, and
docs/configuration.md describes them by group (``python -m fedrapp_app.config --sync`` writes both; a test checks
that they agree); ``flwr run . -c "k=v"`` or ``-c file.toml`` overrides them. ``RunConfig.from_run_config(...)``
returns a validated config or raises ``ConfigError`` listing every bad key with its value and what is allowed.
"""

from fedrapp_app.config.attack import attack_clients
from fedrapp_app.config.data import DATA_KEYS
from fedrapp_app.config.keys import ConfigError, Group, Key, Scalar, override_hint
from fedrapp_app.config.method import METHOD_KEYS, method_keys, method_values
from fedrapp_app.config.rule import RULE_KEYS, resolve_rule, rule_values
from fedrapp_app.config.run import LOCAL_METHODS, STRATEGIES
from fedrapp_app.config.run_config import RunConfig
from fedrapp_app.config.schema import DEFAULTS, EVERYDAY, GROUPS, KEY_BY_NAME, KEYS, RESUMABLE_KEYS, check_values
from fedrapp_app.config.trust import rule_name

__all__ = [
    "DATA_KEYS",
    "DEFAULTS",
    "EVERYDAY",
    "GROUPS",
    "KEYS",
    "KEY_BY_NAME",
    "LOCAL_METHODS",
    "METHOD_KEYS",
    "RESUMABLE_KEYS",
    "RULE_KEYS",
    "STRATEGIES",
    "ConfigError",
    "Group",
    "Key",
    "RunConfig",
    "Scalar",
    "attack_clients",
    "check_values",
    "method_keys",
    "method_values",
    "override_hint",
    "resolve_rule",
    "rule_name",
    "rule_values",
]
