"""fedrapp-plugin new: the package it writes installs and passes its own tests (the conformance kit) as generated."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from fedrapp_app.plugins.scaffold import files, main


def test_the_package_names_its_entry_point_and_a_test_that_runs_the_kit():
    rule, method = files("entropy-topk", "rule"), files("entropy-topk", "method")
    points = tomllib.loads(rule["pyproject.toml"])["project"]["entry-points"]
    assert points == {"fedrapp.rules": {"entropy-topk": "fedrapp_entropy_topk:entropy_topk"}}
    points = tomllib.loads(method["pyproject.toml"])["project"]["entry-points"]
    assert points == {"fedrapp.methods": {"entropy-topk": "fedrapp_entropy_topk:ENTROPY_TOPK"}}
    assert "import torch" not in method["fedrapp_entropy_topk/__init__.py"]  # the spec: checked without torch
    for package in (rule, method):
        assert "parametrize_with_checks" in package["tests/test_fedrapp_entropy_topk.py"]
        assert "fedrapp-sim -c" in package["README.md"] and "python -m fedrapp_app.bench" in package["README.md"]


def test_a_bad_name_or_an_existing_folder_is_refused(tmp_path, capsys):
    assert main(["new", "Bad_Name", "--kind", "rule", "--dir", str(tmp_path)]) == 2
    assert "lower-case words joined by '-'" in capsys.readouterr().err
    assert main(["new", "fine", "--kind", "rule", "--dir", str(tmp_path)]) == 0
    assert main(["new", "fine", "--kind", "method", "--dir", str(tmp_path)]) == 2
    assert "exists" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["rule", "method"])
def test_a_generated_plugin_installs_and_passes_its_tests(kind, tmp_path):
    """As its README says: install it (here into a folder of its own, so this environment stays as it was),
    run its tests (the kit, slow checks included), and find it in fedrapp-list."""
    name = f"scaffolded-{kind}"
    assert main(["new", name, "--kind", kind, "--dir", str(tmp_path)]) == 0
    root, site = tmp_path / f"fedrapp-{name}", tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(root)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert tests.returncode == 0 and " passed" in tests.stdout and "failed" not in tests.stdout, tests.stdout[-3000:]
    listing = subprocess.run(
        [sys.executable, "-m", "fedrapp_app.plugins.catalogue", f"{kind}s"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"from fedrapp-{name} 0.1.0" in listing.stdout, listing.stdout
