"""Adversarial uploads for the robustness experiments, and their config."""

from __future__ import annotations

import pytest
import torch

from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.federation.attacks import poisoned_upload


def test_random_upload_keeps_the_block_norms_and_scaled_blows_up_the_update():
    g = torch.Generator().manual_seed(0)
    received = [torch.randn(4, 8, generator=g), torch.randn(5, 8, generator=g)]
    tuned = [r + 0.01 * torch.randn(r.shape, generator=g) for r in received]
    random = poisoned_upload("random", tuned, received, 10.0, torch.Generator().manual_seed(1))
    for r, t in zip(random, tuned, strict=True):
        assert torch.allclose(r.norm(), t.norm()) and not torch.allclose(r, t)
    scaled = poisoned_upload("scaled", tuned, received, 10.0, g)
    for s, t, r in zip(scaled, tuned, received, strict=True):
        assert torch.allclose(s - r, 10 * (t - r), atol=1e-6)
    with pytest.raises(ValueError, match="unknown attack"):
        poisoned_upload("flip", tuned, received, 1.0, g)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"attack": "random", "attack-clients": "0,x"}, "attack-clients"),
        ({"attack": "random", "attack-clients": "8", "num-clients": 8}, "attack-clients"),
        ({"attack-clients": "1"}, "attack"),
    ],
)
def test_attack_config_is_checked(overrides, key):
    with pytest.raises(ConfigError, match=key):
        RunConfig.from_run_config(overrides)


def test_a_valid_attack_config():
    config = RunConfig.from_run_config({"attack": "scaled", "attack-clients": "0, 3", "attack-scale": 5.0})
    assert config["attack-scale"] == 5.0
