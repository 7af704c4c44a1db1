"""Two real hosts without surprises (issue 36), the fast part: a run folder with results is never overwritten
silently (in-process ServerApp body and fedrapp-sim; the deployment's refusal is in the guide's test,
``tests/test_guide.py``), the certificate check before a SuperLink starts, the bounded wait for a restarted
SuperLink, and the systemd units the guide ships."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest

from fedrapp_app.recording.results import RUN_FILES, clear_results, held_results
from fedrapp_app.recording.runlock import RunFolderTaken
from fedrapp_app.running import launch as launcher
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip

from federation import interrupt_after, run_federation, small_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny"), world.CLASSNAMES)


def fingerprint(run_dir: Path) -> dict[str, str]:
    """Every file of a run folder (the lock aside) with a hash of its bytes."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


# ------------------------------------------------------------------------------ 2. no silent overwrite
def test_a_new_run_in_a_finished_runs_folder_is_refused_in_one_line_and_loses_nothing(tiny_model, tmp_path):
    """Before: the same run-name submitted again (the guide's first-check) replaced the finished results without a
    word."""
    config = small_run(tiny_model, tmp_path, **{"num-rounds": 1, "num-clients": 2, "testbed-samples": 64})
    first, _, _ = run_federation(config)
    run_dir = tmp_path / "run"
    before = fingerprint(run_dir)
    with pytest.raises(RunFolderTaken) as err:
        run_federation({**config, "strategy": "none-fed"})
    message = str(err.value)
    assert "\n" not in message and str(run_dir) in message and "finished run (1 rounds" in message
    assert "nothing was written" in message and "another run-name" in message
    assert "fedrapp-sim --overwrite" in message and f"mv {run_dir} {run_dir}.old" in message
    assert socket.gethostname() in message  # the host whose folder it is (deployment: the SuperLink's)
    assert fingerprint(run_dir) == before  # not one byte changed


def test_a_forgotten_resume_after_a_crash_is_refused_and_the_resume_still_works(tiny_model, tmp_path):
    config = small_run(tiny_model, tmp_path, **{"num-rounds": 2, "num-clients": 2, "testbed-samples": 64})
    interrupt_after(config, 1)
    run_dir = tmp_path / "run"
    before = fingerprint(run_dir)
    with pytest.raises(RunFolderTaken, match="stopped after round 1 .*resume it with resume = true"):
        run_federation(config)
    assert fingerprint(run_dir) == before
    summary, _, _ = run_federation({**config, "resume": True})
    assert summary["status"] == "finished" and summary["resumed_after_round"] == 1 and summary["rounds"] == 2


def test_what_a_folder_holds_and_what_an_explicit_overwrite_removes(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    (run_dir / "summary.json").write_text('{"status": "failed", "rounds": 0}')
    assert held_results(run_dir) is None  # failed before its first round: nothing worth keeping
    (run_dir / "rounds.jsonl").write_text('{"round": 1, "client": 0}\n')
    assert held_results(run_dir) == "the rows of a run (1 rows, no checkpoint)"
    (run_dir / "summary.json").write_text('{"status": "finished", "rounds": 1, "samples": 8, "complete": false}')
    assert held_results(run_dir).startswith("the results of a finished run (1 rounds, 8 samples scored, incomplete")
    (run_dir / "client-state" / "token").mkdir(parents=True)
    (run_dir / "report").mkdir()
    (run_dir / "notes.txt").write_text("mine")
    (run_dir / ".lock").write_text("{}")
    assert sorted(clear_results(run_dir)) == sorted(["rounds.jsonl", "summary.json", "config.json", "client-state",
                                                     "report"])  # fmt: skip
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "notes.txt"]  # only the run's own files went
    assert held_results(run_dir) is None and set(RUN_FILES) >= {"checkpoint.npz", "rounds.jsonl"}


def _sim(capsys, *args: str) -> tuple[int, str]:
    code = launcher.main([str(ROOT), *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_fedrapp_sim_refuses_a_taken_folder_before_it_starts_and_overwrites_only_when_told(
    tiny_model, tmp_path, capsys, monkeypatch
):
    config = small_run(tiny_model, tmp_path, **{"num-rounds": 1, "num-clients": 2, "testbed-samples": 64})
    run_federation(config)
    run_dir = tmp_path / "run"
    before = fingerprint(run_dir)
    overrides = f"model='{tiny_model}' num-clients=2 testbed-samples=64 output-dir='{tmp_path}' run-name='run'"
    started: list[dict] = []
    monkeypatch.setattr(launcher, "launch", lambda args, app, values, cfg, folder: started.append(fingerprint(folder)))

    code, text = _sim(capsys, "-c", overrides)
    assert code == 2 and not started and "already holds the results of a finished run" in text
    assert "fedrapp-sim --overwrite" in text and len(text.strip().splitlines()) == 1
    code, text = _sim(capsys, "--overwrite", "--check", "-c", overrides)
    assert code == 0 and "replacing the results of a finished run" in text and fingerprint(run_dir) == before
    code, text = _sim(capsys, "--overwrite", "-c", overrides + " resume=true")
    assert code == 2 and "contradict" in text and fingerprint(run_dir) == before
    code, text = _sim(capsys, "--overwrite", "-c", overrides)
    assert started == [{}] and "--overwrite: removed the results of a finished run" in text  # gone before the start
