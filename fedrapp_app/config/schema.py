"""Every run-config key, from the groups' modules, and the check of a whole config.

``KEY_GROUPS`` holds the group modules' groups in the order the docs show them; each holds its keys, their defaults and
ranges, and the check of contradictions between them. A key is added in its group's module alone (then
``python -m fedrapp_app.config --sync`` rewrites the documents); a group, here too.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from fedrapp_app.config import attack, data, deployment, engine, method, population, privacy, rule, run, trust
from fedrapp_app.config.keys import ConfigError, Group, Key, Scalar, override_hint, problem
from fedrapp_app.config.method import method_values
from fedrapp_app.config.rule import resolve_rule, rule_values
from fedrapp_app.config.trust import rule_name

#: The groups of keys, in the order the docs list them.
KEY_GROUPS: tuple[Group, ...] = tuple(
    module.GROUP for module in (run, data, population, method, rule, trust, privacy, deployment, engine, attack)
)
#: (name, what the group is for), in the same order.
GROUPS: tuple[tuple[str, str], ...] = tuple((group.name, group.purpose) for group in KEY_GROUPS)
KEYS: tuple[Key, ...] = tuple(key for group in KEY_GROUPS for key in group.keys)
KEY_BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}
DEFAULTS: dict[str, Scalar] = {k.name: k.default for k in KEYS}
#: The keys the README shows and pyproject.toml lists first, with their meaning.
EVERYDAY: tuple[Key, ...] = tuple(k for k in KEYS if k.everyday)
#: Keys a resumed run may change; every other key must equal the checkpointed run's.
RESUMABLE_KEYS = frozenset(k.name for k in KEYS if k.resumable)


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
            problems.append(problem(name, value, why, example=key.default))
    if problems:
        raise ConfigError("invalid run config:\n" + "\n".join(problems))
    values = dict(DEFAULTS)
    for name, value in run_config.items():
        values[name] = float(value) if isinstance(KEY_BY_NAME[name].default, float) else value
    _check_combinations(values, with_rule)
    return values


def _check_combinations(v: Mapping[str, Scalar], with_rule: bool = True) -> None:
    """Contradictions between keys that each look fine alone (each group's check), then the rule and the method
    the config names."""
    problems = [line for group in KEY_GROUPS for line in group.check(v)]
    if not problems:
        problems.extend(_plugin_problems(v, with_rule))
    if problems:
        raise ConfigError("invalid run config:\n" + "\n".join(problems))


def _plugin_problems(v: Mapping[str, Scalar], with_rule: bool = True) -> list[str]:
    """The rule (unless ``with_rule`` is False) and the method the config names exist here and take the
    parameters it gives them."""
    from fedrapp_app.registry.entry_points import PluginError

    problems, own_prompt, reads_payload = [], False, False
    if with_rule:
        try:
            found = resolve_rule(v)
            own_prompt, reads_payload = found.reads_own_prompt, found.reads_payload
            if found.selected_by and v["strategy"] == rule_name(v):
                problems.append(problem("strategy", v["strategy"], f"is selected by {found.selected_by}, not by name"))
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
    problems.extend(_payload_problems(v, reads_payload))
    return problems


def _payload_problems(v: Mapping[str, Scalar], reads_payload: bool) -> list[str]:
    """A rule that reads the arrays a method uploads beside its prompt needs a method that uploads them; dp
    protects the prompt and the scalars, not such arrays."""
    from fedrapp_app.methods import find_method

    method = v["local-method"]
    uploads = find_method(str(method)).target.uploads_payload
    if reads_payload and not uploads:
        return [
            f"  local-method = {method!r}: uploads no payload, which strategy = {v['strategy']!r} reads (the arrays "
            f"a method uploads beside its prompt; fix: a method that uploads them, e.g. "
            f"{override_hint('local-method', v['strategy'])})"
        ]
    if uploads and v["dp"]:
        return [
            f"  local-method = {method!r}: uploads a payload beside its prompt, which dp = true does not protect (it "
            f"releases the prompt and the scalars noised; fix: {override_hint('dp', False)} or another method)"
        ]
    return []


def _plugin_problem(key: str, value: Any, err: Exception) -> str:
    """One line for a rule or method problem; the fix hint where the message gives none."""
    hint = "" if "fix:" in str(err) else f" (fix: {override_hint(key, example=value)})"
    return f"  {key} = {value!r}: {err}{hint}"
