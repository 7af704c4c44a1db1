"""CUDA-only bugs caught on the CPU: the placement emulation itself, then every method, a whole federation and the
benchmarks' step functions run under it, with no op CUDA would refuse and a bounded number of host-device waits."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_CLASSNAMES, random_images

from fedrapp_app.engine import PromptedCLIP
from fedrapp_app.methods import make_method
from fedrapp_app.testbed import world
from fedrapp_app.testbed.tiny import make_tiny_clip
from fedrapp_app.testing.cuda_emulation import EMULATED_DEVICE, CudaPlacement

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


# ----- the emulation catches what CUDA refuses --------------------------------------------------------
def on_gpu(*shape: int) -> torch.Tensor:
    """Ones on the emulated cuda:0 (call inside a CudaPlacement)."""
    return torch.ones(*shape).to("cuda")


def test_tensors_moved_or_created_on_cuda_report_cuda_and_their_results_follow():
    tracker = CudaPlacement()
    with tracker:
        x = on_gpu(3)
        y = torch.zeros(3, device=x.device)  # the device property answers cuda:0
        z = (x + y).sum()
        back = x.cpu()
        assert x.device == EMULATED_DEVICE and x.is_cuda and not x.is_cpu and x.get_device() == 0
        assert tracker.on_cuda(y) and tracker.on_cuda(z)
        assert not tracker.on_cuda(back) and tracker.on_cuda(x)  # .cpu() is a copy: x stays on the GPU
        host = torch.ones(3)
        assert host.device.type == "cpu" and not tracker.on_cuda(host.to(torch.float64))
    tracker.check()
    assert tracker.counts() == {"syncs": 1, "uploads": 1, "waits": 2, "violations": 0}


@pytest.mark.parametrize(
    ("bug", "fragment"),
    [
        (lambda x: x + torch.ones(3), "mixes cuda:0 tensors with CPU tensors"),
        (lambda x: torch.randn(3, device="cuda", generator=torch.Generator()), "CPU torch.Generator"),
        (lambda x: x.uniform_(0, 1, generator=torch.Generator()), "CPU torch.Generator"),
        (lambda x: x.numpy(), "numpy of a cuda:0 tensor"),
        (lambda x: np.asarray(x), "numpy of a cuda:0 tensor"),
        (lambda x: torch.arange(5)[x.long()], "CPU tensor indexed by a cuda:0 tensor"),
        (lambda x: torch.zeros(2, device="cuda:1"), "invalid device ordinal"),
        (lambda x: x.to("cuda:2"), "invalid device ordinal"),
        (lambda x: torch.index_select(x, 0, torch.tensor([0, 1])), "mixes"),
    ],
)
def test_what_cuda_would_refuse_is_a_violation(bug, fragment):
    tracker = CudaPlacement()
    with tracker:
        bug(on_gpu(3))
    assert len(tracker.violations) == 1 and fragment in tracker.violations[0].detail
    assert "test_cuda_emulation.py" in tracker.violations[0].where  # the caller's line, not torch's
    with pytest.raises(AssertionError, match="CUDA would refuse"):
        tracker.check()


def test_what_cuda_allows_is_no_violation():
    tracker = CudaPlacement()
    with tracker:
        x = on_gpu(3)
        x * torch.tensor(2.0)  # a 0-d CPU scalar
        x[torch.tensor([0, 2])]  # a CPU index into a CUDA tensor (copied over)
        torch.randn(3, generator=torch.Generator()).to(x.device)  # drawn on the host, then moved
        x.cpu().numpy()
    tracker.check()


@pytest.mark.parametrize(
    ("read", "kind"),
    [
        (lambda x: x.sum().item(), "syncs"),
        (lambda x: float(x.sum()), "syncs"),
        (lambda x: bool((x > 0).all()), "syncs"),
        (lambda x: x.tolist(), "syncs"),
        (lambda x: x.nonzero(), "syncs"),
        (lambda x: x[x > 0], "syncs"),  # boolean mask: the result's size is read on the host
        (lambda x: x.to("cpu"), "syncs"),
        (lambda x: torch.tensor([1.0, 2.0], device=x.device), "uploads"),
        (lambda x: x.copy_(torch.zeros(3)), "uploads"),
        (lambda x: x[torch.tensor([0, 1])], "uploads"),
    ],
)
def test_each_host_device_wait_is_counted_once(read, kind):
    tracker = CudaPlacement()
    with tracker:
        x = on_gpu(3)
        before = tracker.counts()
        read(x)
    after = tracker.counts()
    assert after[kind] - before[kind] == 1 and after["waits"] - before["waits"] == 1


def test_gradients_and_optimizer_state_of_cuda_parameters_live_on_cuda():
    tracker = CudaPlacement()
    with tracker:
        weight = on_gpu(4).requires_grad_(True)
        optimizer = torch.optim.AdamW([weight], lr=0.1)
        (weight * 2).sum().backward()
        optimizer.step()
        assert tracker.on_cuda(weight.grad) and tracker.on_cuda(optimizer.state[weight]["exp_avg"])
    tracker.check()


# ----- every local method under the emulation ----------------------------------------------------------
VARIANTS = [
    ("zeroshot", {}),
    ("adaprompt", {"threshold": 0.0, "buffer_size": 4}),
    ("adaprompt", {"threshold": 0.0, "buffer_size": 4, "csc": True, "double_softmax": False}),
    ("im", {}),
    ("im", {"csc": True, "marginal": "ema"}),
    ("tpt", {"n_views": 5}),
    ("tpt", {"n_views": 5, "csc": True, "augmix": True}),
    ("tpt-online", {"n_views": 5, "augmix": True}),
    ("tpt-online", {"n_views": 5, "csc": True}),
]


def emulated_rounds(tiny_clip, name, params, precision, images=6, rounds=2, tracker=None):
    """``rounds`` steps of a method on an emulated cuda:0, one PromptedCLIP (a client process)."""
    tracker = tracker or CudaPlacement()
    method = make_method(name, params)
    with tracker:
        pclip = PromptedCLIP(tracker.clip(tiny_clip, precision), TINY_CLASSNAMES)
        pixels = pclip.preprocess(random_images(images))
        prompt = method.initial_prompt(pclip)
        for position in range(rounds):
            adaptation = method.adapt(pclip, prompt, pixels, torch.Generator().manual_seed(position))
            prompt = adaptation.prompt
    return tracker, adaptation


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_method_runs_clean_on_emulated_cuda(tiny_clip, name, params, precision):
    tracker, adaptation = emulated_rounds(tiny_clip, name, params, precision)
    tracker.check()
    # what a method hands back to the ClientApp is on the host
    assert all(not tracker.on_cuda(block) for block in adaptation.prompt)
    assert not tracker.on_cuda(adaptation.predictions) and not tracker.on_cuda(adaptation.predictions_before)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("tpt", {"n_views": 5}),
        ("tpt", {"n_views": 5, "augmix": True}),
        ("tpt-online", {"n_views": 5, "augmix": True}),
        ("adaprompt", {"threshold": 0.0, "buffer_size": 2}),
        ("im", {}),
    ],
    ids=str,
)
def test_host_device_waits_of_a_step_do_not_grow_with_the_batch(tiny_clip, name, params):
    """A per-image read or copy (AugMix's ~100 small copies an image, tpt-online's loss read) would make the
    count grow with the batch; here a step of 8 images waits as often as one of 2 (one 256-view chunk)."""
    counts = {}
    for images in (2, 8):
        tracker = CudaPlacement()
        with tracker:
            pclip = PromptedCLIP(tracker.clip(tiny_clip, "bf16"), TINY_CLASSNAMES)
            method = make_method(name, params)
            pixels = pclip.preprocess(random_images(images))
            first = method.adapt(pclip, method.initial_prompt(pclip), pixels, torch.Generator().manual_seed(0))
            del tracker.syncs[:], tracker.uploads[:]
            method.adapt(pclip, first.prompt, pixels, torch.Generator().manual_seed(1))
        tracker.check()
        counts[images] = tracker.counts()["waits"]
    assert counts[8] == counts[2] <= 20, tracker.by_site()


# ----- a whole federation ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def testbed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_clip(tmp_path_factory.mktemp("tiny_testbed_cuda"), world.CLASSNAMES)


@pytest.mark.parametrize(
    "overrides",
    [{"precision": "fp16"}, {"local-method": "tpt-online", "tpt-views": 3, "tpt-augmix": True, "precision": "bf16"}],
    ids=["adaprompt-fp16", "tpt-online-augmix-bf16"],
)
def test_a_federation_runs_clean_on_emulated_cuda(testbed_tiny, tmp_path, monkeypatch, overrides):
    """The real ServerApp body, strategy and ClientApp in-process, with every client's model on cuda:0."""
    import fedrapp_app.federation.client as client_module

    from federation import read_rows, run_federation, small_run

    tracker = CudaPlacement()
    real_load = client_module.load_clip

    def load_on_emulated_cuda(source, device="auto", precision="fp32"):
        return tracker.clip(real_load(source, device="cpu", precision="fp32"), precision)

    monkeypatch.setattr(client_module, "load_clip", load_on_emulated_cuda)
    monkeypatch.setattr(client_module, "_CLIPS", {})  # no model cached by another test (on the plain CPU)
    monkeypatch.setattr(client_module, "_PROMPTED", {})
    with tracker:
        summary, _, _ = run_federation(small_run(testbed_tiny, tmp_path, **overrides))
    tracker.check()
    rows = read_rows(summary["run_dir"])
    assert {r["status"] for r in rows} == {"ok"} and len(rows) == 9
    if overrides["precision"] == "fp16":  # the loss scale is client state: it reaches every round's stats
        assert all(r["client_metrics"].get("stat-loss_scale", 0) >= 1 for r in rows if r["round"] > 1)


# ----- the benchmarks' step functions --------------------------------------------------------------------
def test_gpu_benchmark_steps_run_clean_on_emulated_cuda():
    sys.path.insert(0, str(BENCHMARKS))
    import gpu_step
    import vitb16

    clip = vitb16.vit_b16(vitb16.CALTECH101[:5], tiny=True)
    tracker = CudaPlacement()
    with tracker:
        pclip = PromptedCLIP(tracker.clip(clip, "bf16"), vitb16.CALTECH101[:5])
        pixels = pclip.preprocess(random_images(3)).to(pclip.device)
        for name in gpu_step.METHODS:
            gpu_step.step_function(name, pclip, pixels, views=3)()
        size = clip.model.config.vision_config.image_size
        pclip.image_features(torch.randn(2, 3, size, size).to(pclip.device))
    tracker.check()


def test_accuracy_helpers_read_predictions_back_from_the_gpu(tiny_clip):
    sys.path.insert(0, str(BENCHMARKS))
    import bf16_accuracy

    from fedrapp_app.testbed.measure import frozen_init_accuracy, zero_shot_accuracy

    tracker = CudaPlacement()
    with tracker:
        pclip = PromptedCLIP(tracker.clip(tiny_clip, "bf16"), TINY_CLASSNAMES)
        pixels = pclip.preprocess(random_images(4))
        labels = np.array([0, 1, 2, 3])
        assert 0 <= zero_shot_accuracy(pclip, pixels, labels) <= 1
        assert 0 <= frozen_init_accuracy(pclip, "adaprompt", {}, pixels, labels) <= 1
        assert bf16_accuracy.zero_shot_predictions(pclip, pixels).shape == (4,)
    tracker.check()
