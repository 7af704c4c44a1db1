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


# The mistakes real plugins made that only real runs showed (tests/plugin_rules.py, tests/plugin_methods.py): each
# caught by the check named, whose message names the cause.
@pytest.mark.parametrize(
    ("rule", "check", "says"),
    [
        ("plugin_rules:nan_when_unmoved", "degenerate-rounds", "a round where clients 1 and 3 did not move"),
        ("plugin_rules:zscore_ddof1", "degenerate-rounds", "a round where exactly one client replied"),
        ("plugin_rules:zscore_unguarded", "degenerate-rounds", "a round where every client reported the same entrop"),
        ("plugin_rules:reseeds_numpy", "outputs", "left process-wide state changed (now restored): numpy's global RNG"),
        ("plugin_rules:draws_from_numpy", "deterministic", "under other global RNG states gave other outputs"),
        ("plugin_rules:sleeps", "cost", "over its budget"),
        ("plugin_rules:quadratic", "cost", "over its budget"),
    ],
)
def test_the_kit_names_the_cause_of_a_rule_that_fails_in_real_runs(rule, check, says):
    failed = _failures(rule_checks(rule))
    assert check in failed and says in failed[check], failed


def test_a_rule_that_draws_from_a_global_rng_is_told_so_not_blamed_on_the_client_order_or_a_resume():
    failed = _failures(rule_checks("plugin_rules:draws_from_numpy"))
    assert {"deterministic", "client-order", "state-and-resume"} <= set(failed), failed
    for check, message in failed.items():
        assert "global RNG" in message and "depends on the order" not in message, (check, message)


@pytest.mark.parametrize(
    ("method", "check", "says"),
    [
        ("plugin_methods:Swapped", "reports", "h_pre and h_post are swapped"),
        ("plugin_methods:InBits", "reports", "is in bits"),
        ("plugin_methods:WrongPredictions", "reports", "the argmax of the returned prompt's logits"),
        ("plugin_methods:GradLeftOff", "adapt", "torch's grad mode: torch.is_grad_enabled() False, was True"),
        ("plugin_methods:OneThread", "adapt", "torch's thread count: 1 thread(s)"),
        ("plugin_methods:DoubleDefault", "adapt", "torch's default dtype: torch.float64, was torch.float32"),
        ("plugin_methods:TorchGlobalNoise", "deterministic", "other global RNG states"),
        ("plugin_methods:TunesLayerNorms", "adapt", "the conformance kit's frozen CLIP: values of"),
        ("plugin_methods:TunesInPlace", "adapt", "adapt changed the prompt it received (block 0: its values"),
        ("plugin_methods:ShortPredictions", "adapt", "predictions has shape (3,) and dtype torch.int64, expected (6,)"),
        (
            "plugin_methods:ExtraBlock",
            "adapt",
            "the returned prompt has blocks [(4, 32), (4, 32)], expected the received [(4, 32)]",
        ),
        ("plugin_methods:NegativeEntropy", "adapt", "expected a mean prediction entropy in nats"),
    ],
)
def test_the_kit_names_the_cause_of_a_method_that_fails_in_real_runs(method, check, says):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # OneThread's leak shows only where the process had more than one thread before it
    try:
        failed = _failures([c for c in method_checks(method) if not c.slow])
    finally:
        torch.set_num_threads(threads)
    assert check in failed and says in failed[check], failed


def test_a_plugin_that_leaks_process_wide_state_cannot_fail_the_next_ones_checks():
    """Each check restores what it found changed: after the leaking methods' checks, the example's pass."""
    import torch

    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    for leaking in ("plugin_methods:GradLeftOff", "plugin_methods:OneThread", "plugin_methods:TunesLayerNorms"):
        _failures([c for c in method_checks(leaking) if not c.slow])
    assert torch.is_grad_enabled() and torch.get_num_threads() == threads and torch.get_default_dtype() == dtype
    assert not _failures([c for c in method_checks("confident-half") if not c.slow])


@pytest.mark.slow
def test_the_label_check_reports_a_nondeterministic_method_as_such():
    (labels,) = [c for c in method_checks("plugin_methods:Drifting") if c.slow]
    with pytest.raises(AssertionError, match="is nondeterministic: the same federation run twice") as err:
        labels()
    assert "labels reach" not in str(err.value)


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
