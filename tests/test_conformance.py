"""The conformance kit (fedrapp_app/plugins/conformance.py) on every rule and method the entry points register --
this project's own and the installed plugins (the two examples) -- so that a new built-in is checked with no new
test code; and on rules and methods that break the contract in one way each, which it must catch by name."""

from __future__ import annotations

import pytest

from fedrapp_app.plugins import METHODS, RULES, method_checks, names, parametrize_with_checks, rule_checks

#: Parameters the checks need where the defaults do not do: the oracle's domain map (the run sets it: six clients,
#: two domains), and AdaPrompt's buffer filled by a random model's near-uniform predictions (so its state moves).
PARAMS = {
    "domain-oracle": {"groups": (0, 1, 0, 1, 0, 1)},
    "adaprompt": {"threshold": 0.0, "buffer-size": 8},
}
#: The rule a method's label check runs under, where it needs its own (Latte's payload then reaches its rule).
STRATEGY: dict[str, str] = {"latte": "latte"}


def _with_params(group: str) -> list:
    return [(name, PARAMS[name]) if name in PARAMS else name for name in names(group)]


def test_the_examples_are_among_the_checked():
    assert "mean-mix" in names(RULES) and "confident-half" in names(METHODS)


@parametrize_with_checks(rules=_with_params(RULES), methods=_with_params(METHODS), method_strategy=STRATEGY)
def test_every_registered_rule_and_method_meets_the_contract(check):
    check()


# ------------------------------------------------------------------------------- the kit catches what it should
def _failures(checks) -> dict[str, str]:
    out = {}
    for check in checks:
        try:
            check()
        except AssertionError as err:
            out[check.id.rsplit(":", 1)[1]] = str(err)
    return out


@pytest.mark.parametrize(
    ("rule", "check", "says"),
    [
        ("plugin_rules:order_dependent", "client-order", "depends on the order of the clients"),
        ("plugin_rules:writes_its_inputs", "isolated", "wrote into its input 'memory'"),
        ("plugin_rules:changes_what_it_returned", "isolated", "changed its earlier output memory"),
        ("plugin_rules:counts_outside_its_state", "state-and-resume", "a resumed round differs"),
        ("plugin_rules:bad_weights", "outputs", "must sum to 1 or be all zero"),
    ],
)
def test_the_kit_names_the_rule_check_that_fails(rule, check, says):
    failed = _failures(rule_checks(rule))
    assert check in failed and says in failed[check], failed


def test_a_correct_stateful_plugin_rule_passes_and_a_declared_range_holds_without_rule_params():
    from plugin_rules import UncheckedParams

    from fedrapp_app.plugins import build_params

    assert not _failures(rule_checks("plugin_rules:counting"))  # its count lives in its state: resumable
    with pytest.raises(ValueError, match=r"weight = 1.5 is outside its allowed range \[0, 1\]"):
        build_params(UncheckedParams, {"weight": 1.5}, "server rule 'bad_weights'")  # param()'s range, no RuleParams


@pytest.mark.parametrize(
    ("method", "check", "says"),
    [
        ("plugin_methods:Unseeded", "deterministic", "under the same seed"),
        ("plugin_methods:Forgetful", "state-round-trip", "state after load_state_dict(state_dict())"),
        ("plugin_methods:Overconfident", "adapt", "confidence outside [0, 1]"),
        ("plugin_methods:RandomStart", "initial-prompt", "identical on all clients"),
        ("plugin_methods:Mutable", "parameters", "must be frozen"),
    ],
)
def test_the_kit_names_the_method_check_that_fails(method, check, says):
    failed = _failures([c for c in method_checks(method) if not c.slow])
    assert check in failed and says in failed[check], failed


@pytest.mark.slow
def test_the_kit_catches_a_method_that_reads_labels_through_the_stack():
    (labels,) = [c for c in method_checks("plugin_methods:Peeking") if c.slow]
    with pytest.raises(AssertionError, match="permuting every stream's labels changed an upload"):
        labels()


def test_a_method_given_as_a_class_or_a_spec_is_checked_too():
    from fedrapp_confident_half import CONFIDENT_HALF
    from fedrapp_confident_half.method import ConfidentHalf

    for target in (ConfidentHalf, CONFIDENT_HALF):
        checks = [c for c in method_checks(target, {"share": 0.25}) if not c.slow]
        for check in checks:
            check()
