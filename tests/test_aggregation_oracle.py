"""The domain-oracle reference: FedAvg within each known shift domain."""

from __future__ import annotations

import numpy as np
import pytest

from fedrapp_app.aggregation import find_rule, make_rule
from fedrapp_app.config import ConfigError, RunConfig


def test_each_client_gets_the_weighted_mean_of_its_own_domain():
    rng = np.random.default_rng(0)
    tuned = rng.normal(size=(5, 3)).astype(np.float32)
    sent = rng.normal(size=(5, 3)).astype(np.float32)
    replied = np.array([True, True, True, False, True])
    counts = np.array([1.0, 3.0, 2.0, 5.0, 4.0])
    rule = make_rule("domain-oracle", {"groups": (0, 0, 1, 1, 2)})
    out = rule(tuned, sent, sent.copy(), np.ones(5), np.ones(5), replied, counts)
    domain0 = (1 * tuned[0].astype(np.float64) + 3 * tuned[1]) / 4
    np.testing.assert_allclose(out.personalized[0], domain0, rtol=1e-6)
    np.testing.assert_allclose(out.personalized[1], domain0, rtol=1e-6)
    # Client 3 did not reply but shares domain 1 with client 2: it gets client 2's upload.
    np.testing.assert_allclose(out.personalized[3], tuned[2], rtol=1e-6)
    np.testing.assert_array_equal(out.personalized[4], tuned[4])
    assert np.allclose(out.diagnostics.xi.sum(axis=1), 1.0)


def test_a_domain_without_replies_is_untouched():
    sent = np.arange(12, dtype=np.float32).reshape(4, 3)
    memory = sent + 100
    replied = np.array([True, True, False, False])
    out = make_rule("domain-oracle", {"groups": (0, 0, 1, 1)})(
        sent + 1, sent, memory, np.ones(4), np.ones(4), replied, np.ones(4)
    )
    np.testing.assert_array_equal(out.personalized[2:], sent[2:])
    np.testing.assert_array_equal(out.memory[2:], memory[2:])


def test_the_oracle_is_a_reference_that_needs_a_domain_map():
    assert find_rule("domain-oracle").target.reference
    with pytest.raises(ValueError, match="groups"):
        make_rule("domain-oracle", {})
    assert RunConfig.from_run_config({"strategy": "domain-oracle", "num-clients": 8}).rule_params()[1]["groups"] == (
        0,
        1,
        2,
        3,
        0,
        1,
        2,
        3,
    )
    with pytest.raises(ConfigError, match="only the testbed"):
        RunConfig.from_run_config({"strategy": "domain-oracle", "testbed-domains": "clean"})
    with pytest.raises(ConfigError, match="only the testbed"):
        RunConfig.from_run_config({"strategy": "domain-oracle", "dataset": "dtd", "data-dir": "/x", "model": "/m"})
