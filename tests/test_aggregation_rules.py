"""The contract every server rule keeps (docs/ARCHITECTURE.md, "Server rules"), and the registry."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrapp_app.aggregation import (
    ABLATIONS,
    BUILT_IN,
    FedRAPPParams,
    Rule,
    fedrapp_round,
    find_rule,
    make_params,
    make_rule,
    rules,
    synthetic_round,
)
from fedrapp_app.registry.entry_points import PluginError

#: This project's rules, as the registry finds them (its pyproject.toml's entry points).
RULES = {name: find_rule(name).target for name in BUILT_IN}

# The global rules send one prompt to all; so does domain-oracle without a domain map (one domain).
GLOBAL_RULES = ("fedavg", "fedmedian", "fedtrimmedavg", "krum", "domain-oracle")
KEEPS_ABSENT_ROWS = [name for name in RULES if name not in GLOBAL_RULES]


@pytest.mark.parametrize("name", list(RULES))
def test_outputs_are_fresh_float32_arrays_and_inputs_stay_intact(name) -> None:
    kw = synthetic_round(np.random.default_rng(0), 7, 12)
    before = {k: v.copy() for k, v in kw.items()}
    out = RULES[name](**kw)
    for array in (out.memory, out.personalized):
        assert array.dtype == np.float32 and array.shape == (7, 12) and np.isfinite(array).all()
        assert not any(np.shares_memory(array, v) for v in kw.values())
    for k, v in kw.items():
        np.testing.assert_array_equal(v, before[k])  # NaN rows compare equal to NaN rows here
    d = out.diagnostics
    assert d.peer_weights.shape == (7, 7) and d.r.shape == d.mu.shape == d.gamma.shape == (7,)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    name=st.sampled_from(list(RULES)),
    junk=st.sampled_from([np.nan, np.inf, -1e30]),
)
def test_what_absent_clients_hold_never_reaches_any_output(seed, name, junk) -> None:
    kw = synthetic_round(np.random.default_rng(seed), 8, 10, reply_prob=0.6)
    absent = ~kw["replied"]
    other = dict(kw)
    other["tuned"] = np.where(absent[:, None], np.float32(junk), kw["tuned"]).astype(np.float32)
    for key in ("h_pre", "h_post", "num_examples"):
        other[key] = np.where(absent, junk, kw[key])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a RuntimeWarning from arithmetic on the junk
        a, b = RULES[name](**kw), RULES[name](**other)
    assert np.array_equal(a.memory, b.memory) and np.array_equal(a.personalized, b.personalized)
    for field in ("informative", "update_norm", "r", "mu", "peer_weights", "gamma", "xi"):
        assert np.array_equal(getattr(a.diagnostics, field), getattr(b.diagnostics, field)), field
    if name in KEEPS_ABSENT_ROWS:
        assert np.array_equal(a.memory[absent], kw["memory"][absent])  # bit for bit: float32 in, float32 out
        assert np.array_equal(a.personalized[absent], kw["sent"][absent])


@pytest.mark.parametrize("name", list(RULES))
def test_a_round_without_replies_changes_nothing(name) -> None:
    kw = synthetic_round(np.random.default_rng(1), 5, 4)
    kw["replied"][:] = False
    out = RULES[name](**kw)
    assert np.array_equal(out.memory, kw["memory"]) and np.array_equal(out.personalized, kw["sent"])


# --------------------------------------------------------------------------------------- input checks
def _bad_inputs() -> list[tuple[str, dict, type[Exception], str]]:
    kw = synthetic_round(np.random.default_rng(2), 4, 6, reply_prob=1.0)
    nan_row = kw["tuned"].copy()
    nan_row[2, 3] = np.nan
    nan_memory = kw["memory"].copy()
    nan_memory[0, 0] = np.inf
    return [
        (
            "shape",
            {**kw, "tuned": kw["tuned"][:, :5]},
            ValueError,
            r"tuned has shape \(4, 5\), expected \(4, 6\)",
        ),
        ("1-d", {**kw, "sent": kw["sent"][0]}, ValueError, "sent must be a non-empty"),
        ("mask", {**kw, "replied": kw["replied"].astype(int)}, TypeError, r"astype\(bool\)"),
        ("nan-upload", {**kw, "tuned": nan_row}, ValueError, r"tuned is not finite in row\(s\) \[2\]"),
        ("inf-memory", {**kw, "memory": nan_memory}, ValueError, r"memory is not finite in row\(s\) \[0\]"),
        ("h-length", {**kw, "h_pre": kw["h_pre"][:3]}, ValueError, "h_pre has shape"),
        ("dtype", {**kw, "h_post": np.array(["a"] * 4)}, TypeError, "h_post must hold real numbers"),
    ]


@pytest.mark.parametrize(("case", "kw", "error", "match"), _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_bad_inputs_are_rejected_with_a_message_naming_them(case, kw, error, match) -> None:
    for rule in RULES.values():
        with pytest.raises(error, match=match):
            rule(**kw)


# ------------------------------------------------------------------------------------------- registry
def test_make_rule_binds_the_params_and_gives_the_same_result_as_the_function() -> None:
    kw = synthetic_round(np.random.default_rng(3), 6, 5)
    rule = make_rule("fedrapp", {"gamma-max": 0.6, "tau": 0.5})
    assert rule.params == FedRAPPParams(gamma_max=0.6, tau=0.5)
    assert rule.summary()["gamma_max"] == 0.6 and rule.summary()["rule"] == "fedrapp"
    ours = rule(*kw.values())
    direct = fedrapp_round(**kw, params=FedRAPPParams(gamma_max=0.6, tau=0.5))
    assert np.array_equal(ours.personalized, direct.personalized)


def test_every_built_in_rule_is_registered_with_its_params_and_every_ablation_is_valid() -> None:
    assert set(BUILT_IN) <= set(rules())
    assert all(isinstance(rule, Rule) for rule in RULES.values())
    for name, rule in RULES.items():
        overrides = {"groups": (0, 1)} if rule.reference else None  # the domain oracle's map is required
        assert isinstance(make_params(name, overrides), rule.params)
        assert make_rule(name, overrides).origin.startswith("fedrapp ")  # this package's entry point
    assert [name for name, rule in RULES.items() if rule.reference] == ["domain-oracle"]
    assert sorted(name for name, rule in RULES.items() if rule.stateful) == ["fedrapp-trust", "latte"]
    assert [name for name, rule in RULES.items() if rule.reads_payload] == ["latte"]
    for overrides in ABLATIONS.values():
        make_params("fedrapp", overrides)


def test_integers_from_a_config_become_floats() -> None:
    assert make_params("fedrapp", {"gamma0": 0, "mu0": 1}).mu0 == 1.0
    assert isinstance(make_params("fedrapp", {"gamma0": 0}).gamma0, float)


@pytest.mark.parametrize(
    ("name", "overrides", "error", "match"),
    [
        ("fedprox", {}, PluginError, r"unknown server rule 'fedprox' \(did you mean 'fedamp'\?\); installed: "),
        ("no_such_module:rule", {}, PluginError, "cannot import module 'no_such_module'.*PYTHONPATH"),
        ("numpy:pi", {}, PluginError, "is a float, not a Rule or a round function"),
        ("fedrapp", {"temperature": 1}, ValueError, "unknown parameter 'temperature'.*allowed: lambda-drop"),
        (
            "fedavg",
            {"sigma": 1},
            ValueError,
            "unknown parameter 'sigma' for server rule 'fedavg'; allowed: none",
        ),
        ("fedrapp", {"gamma_max": 0.5, "gamma-max": 0.6}, ValueError, "given twice"),
        (
            "fedrapp",
            {"tau": 0},
            ValueError,
            r"FedRAPPParams.tau = 0.0 is outside its allowed range \(0, inf\)",
        ),
        ("fedrapp", {"mu0": 1.5}, ValueError, r"mu0 = 1.5 is outside its allowed range \[0, 1\]"),
        ("fedrapp", {"gamma_max": 1.2}, ValueError, r"gamma_max = 1.2 is outside its allowed range \[0, 1\]"),
        ("fedrapp", {"gamma0": 0.9}, ValueError, "gamma0 = 0.9 exceeds gamma_max = 0.8"),
        ("fedrapp", {"trust_peer_target": 0.3}, ValueError, "unknown parameter 'trust_peer_target'"),
        ("fedrapp-trust", {"gamma0": 0.9}, ValueError, "TrustParams.gamma0 = 0.9 exceeds gamma_max = 0.8"),
        ("fedrapp", {"eta": float("nan")}, ValueError, "eta = nan is outside"),
        (
            "fedrapp",
            {"lambda_ent": -1},
            ValueError,
            r"lambda_ent = -1.0 is outside its allowed range \[0, inf\)",
        ),
        ("fedrapp", {"tau": True}, ValueError, "parameter 'tau' expects a float, got True"),
        ("fedamp", {"sigma": "1"}, ValueError, "parameter 'sigma' expects a float, got '1'"),
        ("fedamp", {"min_self_weight": 2}, ValueError, "min_self_weight = 2.0 is outside"),
        ("fedamp-cos", {"self_weight": -0.1}, ValueError, "self_weight = -0.1 is outside"),
    ],
)
def test_bad_names_and_params_are_rejected_with_the_allowed_values(name, overrides, error, match) -> None:
    with pytest.raises(error, match=match):
        make_rule(name, overrides)


def test_a_rule_refuses_the_params_of_another() -> None:
    kw = synthetic_round(np.random.default_rng(4), 3, 2)
    with pytest.raises(TypeError, match="fedamp_round needs FedAMPParams, got FedRAPPParams"):
        RULES["fedamp"](**kw, params=FedRAPPParams())
