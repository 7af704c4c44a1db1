"""The performance scripts run (shrunk) on the CPU: the GPU table script, the memory script, the shared helpers."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_step  # noqa: E402
import vitb16  # noqa: E402


def test_vision_flop_count_matches_the_analytic_count():
    from fedrapp_app.engine import PromptedCLIP

    clip = vitb16.vit_b16(tiny=True)
    tower = gpu_step.tower_throughput(PromptedCLIP(clip, vitb16.CALTECH101[:5]), batch=2, repeats=1)
    # torch's counter skips the CPU flash-attention kernel; on CUDA it counts attention too
    assert tower["flops_counted"] in (
        pytest.approx(tower["flops_dense"], rel=1e-9),
        pytest.approx(tower["flops_per_image"], rel=1e-9),
    )
    assert tower["flops_per_image"] == tower["flops_dense"] + tower["flops_attention"] > 0
    assert tower["tflops"] > 0 and tower["images_per_s"] > 0
    # the full-size count: ViT-B/16 at 224 px is about 17.6 GMACs = 35.1 GFLOP per image
    full = vitb16.vit_b16_config(100, 1, 2, 0)
    assert gpu_step.vision_flops_analytic(full)["total"] == pytest.approx(35.1e9, rel=0.01)


def test_gpu_script_tiny_run_on_cpu_writes_every_row(tmp_path, monkeypatch):
    out = tmp_path / "gpu.json"
    monkeypatch.setattr(
        sys,
        "argv",
        ["gpu_step.py", "--tiny", "--device", "cpu", "--precision", "fp32", "--classes", "10", "--json", str(out)],
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: a second thread only adds synchronisation on a busy machine
    try:
        gpu_step.main()
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    assert [row["method"] for row in result["methods"]] == list(gpu_step.METHODS)
    assert all(row["images_per_s"] > 0 and row["batch"] == 4 for row in result["methods"])
    assert result["tiny"] and result["tower"]["tflops"] > 0


def test_gpu_script_refuses_the_full_size_run_without_a_gpu(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_step.py", "--device", "cpu"])
    with pytest.raises(SystemExit):
        gpu_step.main()


def test_random_vit_b16_folder_loads_through_load_clip(tmp_path):
    from fedrapp_app.engine import PromptedCLIP, load_clip

    folder = vitb16.save_vit_b16(tmp_path / "clip", vitb16.CALTECH101[:3], tiny=True)
    clip = load_clip(folder, device="cpu")
    pclip = PromptedCLIP(clip, vitb16.CALTECH101[:3])
    assert pclip.text_features([pclip.context_from_text("a photo of a")]).shape[:2] == (1, 3)


def test_median_seconds_and_load_average():
    calls = []
    median, times = vitb16.median_seconds(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5 and len(times) == 3 and median >= 0
    assert vitb16.wait_for_quiet(threshold=float("inf")) == vitb16.load_average()


def test_naive_timings_are_reused_only_at_the_same_sizes(tmp_path):
    import argparse

    import client_step

    sizes = {"images": 64, "classes": 100, "tpt_images": 2, "tpt_views": 63, "threads": 1}
    earlier = tmp_path / "fp32.json"
    earlier.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in sizes.items()} | {"precision": "fp32"},
                "rows": [{"method": "adaprompt", "naive_s": 9.0}],
            }
        )
    )
    same = argparse.Namespace(**sizes, precision="bf16")  # our precision may differ: the naive path is fp32
    assert client_step.reused_naive(earlier, same)["adaprompt"]["naive_s"] == 9.0
    with pytest.raises(ValueError, match="classes: 100 there, 20 here"):
        client_step.reused_naive(earlier, argparse.Namespace(**(sizes | {"classes": 20})))
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a client_step.py --json file"):
        client_step.reused_naive(tmp_path / "other.json", same)
    assert client_step.agreement(None).startswith("n/a") and client_step.agreement(1.0) == "100%"


@pytest.mark.slow
def test_gpu_check_script_runs_its_cpu_path_end_to_end(tmp_path):
    """benchmarks/gpu_check.sh --cpu: every step of the GPU check at toy sizes, a summary, exit 0."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.sh"
    ray_tmp = tempfile.mkdtemp(prefix="fr-ray-")  # short: Ray's socket paths must fit in 107 bytes
    try:
        done = subprocess.run(["bash", str(script), "--cpu", str(tmp_path / "out")], capture_output=True, text=True,
                              timeout=900, env={**os.environ, "RAY_TMPDIR": ray_tmp})  # fmt: skip
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "default federation fp32:" in summary and "default federation bf16:" in summary
    assert "client 3 on cpu" in summary and "all steps ok" in done.stdout


def test_training_free_cost_script_times_every_method(tmp_path):
    import training_free_cost

    out = tmp_path / "cost.json"
    assert (
        training_free_cost.main(["--tiny", "--images", "4", "--view-images", "1", "--repeats", "1", "--out", str(out)])
        == 0
    )
    result = json.loads(out.read_text())
    assert list(result["results"]) == [name for name, _, _ in training_free_cost.METHODS]
    assert all(cost["per_image"] > 0 for cost in result["results"].values())
    assert result["results"]["zero"]["images"] == 1 and result["results"]["tda"]["images"] == 4


def test_upload_sizes_averages_each_method_and_rules_ok_rows(tmp_path):
    import upload_sizes

    cells = []
    for name, (method, rule, rows) in {
        "a": ("latte", "latte", [(100, 500, "ok"), (300, 700, "ok"), (999, 999, "failed")]),
        "b": ("adaprompt", "none-fed", [(50, 50, "ok"), (70, 70, "dropped")]),
    }.items():
        run = tmp_path / name
        run.mkdir()
        lines = [{"status": s, "upload_bytes": u, "download_bytes": d} for u, d, s in rows]
        (run / "rounds.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        labels = {"method": method, "rule": rule}
        cells.append({"status": "ok", "run_dir": str(run), "grids": {"g": {"labels": labels}}})
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    sizes = upload_sizes.sizes(tmp_path)
    assert sizes[("latte", "latte")] == {"upload": 200.0, "download": 600.0, "rows": 2}
    assert sizes[("adaprompt", "none-fed")] == {"upload": 50.0, "download": 50.0, "rows": 1}


def test_prompt_geometry_averages_each_candidates_seeds_and_ranks_by_the_fixed_rule(tmp_path, capsys):
    import prompt_geometry

    base = {"clean_zero_shot": 90.0, "coop_own_gain": 12.0, "adaprompt_vs_zero_shot": 1.0, "tpt_vs_zero_shot": 0.5,
            "tpt-online_vs_zero_shot": -1.0, "effective_rank_differential": 8.0}  # fmt: skip
    runs = {"a_s100": {**base, "coop_transfer": 0.2}, "a_s101": {**base, "coop_transfer": -1.4},
            "b_s100": {**base, "coop_transfer": -0.4, "tpt-online_vs_zero_shot": 1.0},
            "c_s100": {**base, "coop_transfer": 2.0, "clean_zero_shot": 80.0}}  # fmt: skip
    paths = []
    for stem, summary in runs.items():
        paths.append(tmp_path / f"prompt_geometry_{stem}.json")
        paths[-1].write_text(json.dumps({"summary": summary}))
    names, means = prompt_geometry.mean_runs(paths)
    assert names == ["a (s100, s101)", "b (s100)", "c (s100)"]
    assert means[0]["coop_transfer"] == pytest.approx(-0.6) and means[0]["clean_zero_shot"] == 90.0
    ranking = prompt_geometry.rank_candidates(names, means)
    # b meets transfer, AdaPrompt, TPT and online TPT (4); a misses transfer and online TPT (2); c is not eligible
    assert ranking[0].startswith("1. b (s100): 4 of 5 targets, transfer -0.40")
    assert ranking[1].startswith("2. a (s100, s101): 2 of 5") and "not eligible" in ranking[2]
    prompt_geometry.main(["compare", "--mean", "--choose", *map(str, paths)])
    out = capsys.readouterr().out
    assert "| a (s100, s101) | b (s100) |" in out and "1. b (s100)" in out
