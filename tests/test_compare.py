"""``fedrapp-sim --compare``: which server rule on a user's own setting, in one command. The grid it builds from a
setting (each rule gets its own keys, the rest is shared), its folder (the same setting resumes, another gets its
own), and a tiny comparison run end to end in this process: one page, one figure, gains paired by seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedrapp_app.bench.compare import (
    DEFAULT_SEEDS,
    FIGURE,
    PAGE,
    compare_spec,
    folder_name,
    read_given,
    rule_variants,
    setting_sentence,
    shared_base,
    write_given,
)
from fedrapp_app.bench.schema import BenchError, reference_key
from fedrapp_app.config import DEFAULTS
from fedrapp_app.running import compare as running_compare
from fedrapp_app.running import launch
from fedrapp_app.running.compare import estimate_basis, run_compare
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import small_run


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_compare"), world.CLASSNAMES)


def setting(**keys) -> dict:
    """A full run config as fedrapp-sim builds it: the defaults and -c."""
    return {**DEFAULTS, "num-clients": 4, **keys}


def test_each_rule_gets_its_own_keys_and_the_rest_is_shared(tmp_path):
    s = setting(**{"mu0": 0.3, "trust-probe": 0.5, "fedavg-weighting": "uniform", "seed": 7, "output-dir": "x"})
    s = {k: v for k, v in s.items() if k in DEFAULTS}  # keys a user can give
    variants = rule_variants(s)
    assert list(variants) == ["none-fed", "fedavg", "fedrapp", "fedrapp+trust"]
    assert variants["none-fed"] == {"strategy": "none-fed"}
    assert variants["fedrapp"].get("mu0") == 0.3 and variants["fedrapp+trust"].get("mu0") == 0.3
    assert "mu0" not in shared_base(s) and "seed" not in shared_base(s) and "output-dir" not in shared_base(s)
    assert shared_base(s)["num-clients"] == 4
    own = rule_variants(setting(strategy="fedamp"))  # the user's own rule joins the four
    assert list(own)[-1] == "fedamp" and own["fedamp"]["strategy"] == "fedamp"


def test_the_grid_pairs_every_rule_with_none_fed_on_each_seed(tmp_path):
    spec = compare_spec(setting(**{"output-dir": str(tmp_path)}), DEFAULT_SEEDS)
    assert len(spec.cells) == 4 * len(DEFAULT_SEEDS) and spec.output.parent == tmp_path
    keys = {cell.key for cell in spec.cells}
    assert all(reference_key(cell.overrides) in keys for cell in spec.cells)  # the trust option's too


def test_the_same_setting_finds_its_folder_again_and_another_gets_its_own():
    assert folder_name(setting()) == folder_name(setting(seed=3, strategy="fedavg", mu0=0.9))  # rule keys, seed
    assert folder_name(setting()) != folder_name(setting(**{"num-clients": 8}))
    assert folder_name(setting(**{"run-name": "mine"})) == "mine"
    assert "/" not in folder_name(setting(model="/models/clip/"))


def test_a_setting_no_rule_can_change_or_without_clients_is_refused():
    with pytest.raises(BenchError, match="local-method = 'zeroshot' tunes no prompt"):
        compare_spec(setting(**{"local-method": "zeroshot"}))
    with pytest.raises(BenchError, match="num-clients"):
        compare_spec(setting(**{"num-clients": 0}))


def test_the_page_calls_only_the_keys_given_with_c_the_users_setting(tmp_path):
    shared = {"num-clients": 8, "local-method": "im", "csc": True, "seed": 0}
    words = setting_sentence(shared, {"local-method": "im", "csc": True})
    mine, resolved = words.split(" Also used by every run, resolved by the comparison: ")
    assert "`local-method='im'`, `csc=True`" in mine and "num-clients" not in mine
    assert resolved == "`num-clients=8`." and "seed" not in words
    untouched = setting_sentence({"num-clients": 8}, {})  # fedrapp-sim --compare alone
    assert untouched.startswith("Your setting (what `-c` changed from the defaults): nothing, the defaults.")
    assert "resolved by the comparison: `num-clients=8`" in untouched
    assert "`num-clients=8`" in setting_sentence({"num-clients": 8}, None)  # a folder drawn before: as it was
    # the record beside the rows: where a run writes and the seed are not the setting
    write_given(tmp_path, {"csc": True, "output-dir": "/x", "run-name": "r", "seed": 3})
    assert read_given(tmp_path) == {"csc": True} and read_given(tmp_path / "none") is None


def test_compare_hands_on_what_c_changed_apart_from_the_resolved_clients(monkeypatch, capsys):
    seen = {}

    def run_compare_seen(setting, seeds, check, given):
        seen.update(setting=setting, given=given)
        return 0

    monkeypatch.setattr(running_compare, "run_compare", run_compare_seen)
    assert launch.main([str(Path(__file__).resolve().parents[1]), "--compare", "-c", "num-rounds=3"]) == 0
    assert seen["setting"]["num-clients"] == launch.DEFAULT_SUPERNODES and seen["setting"]["num-rounds"] == 3
    assert seen["given"] == {"num-rounds": 3}  # num-clients = 0 in the app: resolved, not the user's


def test_the_time_estimate_says_it_assumes_quiet_cores_and_when_this_host_is_busy():
    quiet = estimate_basis(None, 0.4, 2)
    assert "estimated for 2 quiet CPU cores" in quiet and "load" not in quiet
    assert "this host's load is 6.2 on 2 cores, so expect longer" in estimate_basis(None, 6.2, 2)
    assert "load" not in estimate_basis(None, 6.2, 16) and "load" not in estimate_basis(None, None, 2)
    assert estimate_basis("H100", 9.0, 2).startswith("estimated for H100 to itself")


@pytest.mark.slow  # 8 tiny runs: about 90 s on 2 busy cores
def test_a_tiny_comparison_runs_in_one_call_and_resumes_with_nothing_to_do(tiny_model, tmp_path, capsys):
    s = {**DEFAULTS, **small_run(tiny_model, tmp_path / "out", **{"testbed-samples": 120, "num-rounds": 2})}
    s["run-name"] = ""  # the comparison names its own folder
    assert run_compare(s, [0, 1]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "out" / folder_name(s)
    page = (folder / PAGE).read_text()
    assert (folder / FIGURE).stat().st_size > 0 and (folder / "report" / PAGE).is_file()
    for label in ("none-fed", "fedavg", "fedrapp", "fedrapp+trust"):
        assert f"| {label} | " in page and f"  {label}" in out
    assert "| none-fed | " in page and "the reference" in page and "95% interval" in page
    assert "Your setting (what `-c` changed from the defaults): " in page  # every key differs here: all given
    assert "comparing none-fed, fedavg, fedrapp, fedrapp+trust on this setting over seeds 0, 1: 8 runs" in out
    assert run_compare(s, [0, 1]) == 0  # the same command again: every run finished, nothing runs
    assert "(8 finished before)" in capsys.readouterr().out
