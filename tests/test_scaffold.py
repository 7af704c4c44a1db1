"""fedrapp-plugin new: the package it writes installs and passes its own tests (the conformance kit) as generated."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib

import pytest

from fedrapp_app.config import ConfigError
from fedrapp_app.plugins.scaffold import files, main
from fedrapp_app.running.launch import app_folder, installed_app_folder


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


def test_the_help_says_the_whole_first_paragraph_and_the_examples(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "that installs and passes its tests as generated, for its author to edit." in text
    assert "fedrapp-plugin new my-method --kind method" in text


def test_fedrapp_sim_run_from_a_plugins_folder_runs_fedrapps_app_and_a_wrong_folder_is_named(tmp_path):
    """The generated README runs fedrapp-sim from the plugin's folder: its pyproject.toml is no Flower app."""
    assert main(["new", "my-rule", "--kind", "rule", "--dir", str(tmp_path)]) == 0
    plugin, project = tmp_path / "fedrapp-my-rule", installed_app_folder()
    assert project is not None and (project / "fedrapp_app").is_dir()  # this checkout (pip install -e)
    assert app_folder(None, cwd=plugin) == project and app_folder(None, cwd=project) == project
    with pytest.raises(ConfigError, match=r"has no \[tool.flwr.app.config\] table\): pass FedRAPP's own folder"):
        app_folder(str(plugin))
    with pytest.raises(
        ConfigError, match=f"holds no pyproject.toml: pass FedRAPP's own folder, e.g. fedrapp-sim {project}"
    ):
        app_folder(str(tmp_path))


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
    (command,) = [line for line in package_readme(root) if line.startswith("fedrapp-sim -c")]  # as the README says
    check = subprocess.run(
        [sys.executable, "-m", "fedrapp_app.running.launch", "--check", *shlex.split(command)[1:],
         "-c", f"output-dir='{tmp_path / 'runs'}'"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert check.returncode == 0 and "Traceback" not in check.stderr, check.stdout[-2000:] + check.stderr[-3000:]


def package_readme(root):
    return (root / "README.md").read_text().splitlines()
