"""Device selection without a GPU: faked GPU counts and CUDA_VISIBLE_DEVICES (fedrapp_app.engine.devices)."""

from __future__ import annotations

import pytest
import torch

from fedrapp_app.engine import devices, load_clip
from fedrapp_app.engine.devices import (
    check_device,
    describe_device,
    device_for_node,
    launcher_gpu_share,
    parse_device,
    set_deterministic,
    to_device_once,
    to_host_once,
)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("auto", ("auto", None)), ("cpu", ("cpu", None)), ("cuda", ("cuda", None)), ("cuda:3", ("cuda", 3))],
)
def test_parse_device_accepts_the_config_forms(value, parsed):
    assert parse_device(value) == parsed


@pytest.mark.parametrize("value", ["gpu", "cpu:0", "cuda:", "cuda:-1", "auto:1", "mps", ""])
def test_parse_device_rejects_other_forms_with_the_allowed_ones(value):
    with pytest.raises(ValueError, match="'auto', 'cpu', 'cuda' or 'cuda:N'"):
        parse_device(value)


def test_node_config_device_overrides_the_run_config():
    assert device_for_node("auto", {}) == "auto"
    assert device_for_node("cuda", {"client-id": 3}) == "cuda"
    assert device_for_node("cuda", {"device": "cuda:1"}) == "cuda:1"
    assert device_for_node("cuda", {"device": ""}) == "cuda"  # an empty override means none
    with pytest.raises(ValueError, match="node config has device = 'gpu1'"):
        device_for_node("auto", {"device": "gpu1"})
    with pytest.raises(ValueError, match="cuda:N"):
        device_for_node("tpu", {"device": "cuda"})


def test_check_device_accepts_what_can_run():
    for device in ("auto", "cpu"):
        assert check_device(device, 0) is None
    assert check_device("cuda", 1) is None
    assert check_device("cuda:0", 1) is None
    assert check_device("cuda:3", 4) is None


def test_check_device_explains_a_client_without_a_gpu_share():
    message = check_device("cuda", 0, cuda_visible_devices="")
    assert "sees no GPU" in message and "CUDA_VISIBLE_DEVICES is ''" in message
    assert "--gpus-per-client 1" in message and "client-resources-num-gpus=1" in message


def test_check_device_explains_the_cuda0_rule_for_an_ordinal_out_of_range():
    message = check_device("cuda:1", 1, cuda_visible_devices="3")
    assert "sees 1 GPU(s), cuda:0" in message and "CUDA_VISIBLE_DEVICES is '3'" in message
    assert "as cuda:0" in message and "device='cuda'" in message
    assert "CUDA_VISIBLE_DEVICES=1" in message and "--node-config" in message
    assert "cuda:0..cuda:1" in check_device("cuda:2", 2)


def test_check_device_reports_a_malformed_value():
    assert "cuda:N" in check_device("gpu", 1)


def test_load_clip_refuses_an_unusable_cuda_device_before_reading_the_model(tmp_path, monkeypatch):
    """The check runs before the folder is read: a missing folder is not what the user is told about."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="sees no GPU .*--gpus-per-client"):
        load_clip(tmp_path / "nowhere", device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="invalid|sees 1 GPU"):
        load_clip(tmp_path / "nowhere", device="cuda:1")


# ----- the launcher's GPU share -----------------------------------------------------------------------
def test_a_gpu_host_gives_clients_a_gpu_by_default():
    for device in ("auto", "cuda", "cuda:0"):
        share, note = launcher_gpu_share(device, host_gpus=2, gpus_per_client=None)
        assert share == 1.0
        assert "2 GPU(s)" in note and "--gpus-per-client 1/k" in note


def test_a_cpu_host_or_a_cpu_run_gets_no_share():
    assert launcher_gpu_share("auto", host_gpus=0, gpus_per_client=None) == (0.0, None)
    assert launcher_gpu_share("cpu", host_gpus=4, gpus_per_client=None) == (0.0, None)
    share, note = launcher_gpu_share("cpu", host_gpus=4, gpus_per_client=0.5)
    assert share == 0.5 and "compute on the CPU" in note


def test_an_explicit_share_is_kept():
    assert launcher_gpu_share("auto", host_gpus=1, gpus_per_client=0.25) == (0.25, None)
    assert launcher_gpu_share("cuda", host_gpus=8, gpus_per_client=2) == (2.0, None)


def test_auto_with_an_explicit_zero_share_runs_on_the_cpu_and_says_so():
    share, note = launcher_gpu_share("auto", host_gpus=1, gpus_per_client=0.0)
    assert share == 0.0 and "run on the CPU" in note


@pytest.mark.parametrize(
    ("device", "host", "flag", "fragment"),
    [
        ("cuda", 1, 0.0, "--gpus-per-client 1"),  # Ray would hide the GPU from every client
        ("cuda", 0, None, "no GPU"),
        ("cuda:1", 2, None, "as cuda:0"),  # inside Ray every client sees its share as cuda:0
        ("cuda:1", 2, 0.5, "use device='cuda'"),
        ("auto", 1, 2.0, "has 1 GPU(s)"),  # more than the host has: Ray could never start a client
        ("auto", 4, 1.5, "fraction below 1 or a whole number"),
        ("auto", 1, -0.5, ">= 0"),
        ("auto", 0, 0.25, "--gpus-per-client 0"),
    ],
)
def test_combinations_that_would_fail_in_every_client_are_refused_with_the_fix(device, host, flag, fragment):
    with pytest.raises(ValueError, match=None) as error:
        launcher_gpu_share(device, host_gpus=host, gpus_per_client=flag)
    assert fragment in str(error.value)


# ----- what a client runs on ----------------------------------------------------------------------------
def test_describe_device_names_the_gpu_and_its_physical_slot():
    assert describe_device("cpu") == "cpu"
    assert describe_device(torch.device("cuda"), gpu_name=lambda i: f"NVIDIA H200 #{i}") == "cuda:0 (NVIDIA H200 #0)"
    described = describe_device("cuda:1", gpu_name=lambda i: "NVIDIA T4", cuda_visible_devices="2,3")
    assert described == "cuda:1 (NVIDIA T4; CUDA_VISIBLE_DEVICES=2,3)"


def test_current_device_description_reads_this_process_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "Fake GPU")
    assert devices.current_device_description(torch.device("cuda", 0)) == "cuda:0 (Fake GPU; CUDA_VISIBLE_DEVICES=5)"
    assert devices.current_device_description("cpu") == "cpu"


# ----- numerics flags and transfers --------------------------------------------------------------------
def test_set_deterministic_sets_and_restores_torch_flags(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic


def test_disable_tf32_turns_tf32_off_for_matmuls_and_convolutions():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        devices.disable_tf32()
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_one_copy_transfers_round_trip_exactly():
    parts = [torch.randn(2, 3), torch.arange(5), torch.zeros(0), torch.tensor(0.5)]
    moved = to_device_once(parts, torch.device("cpu"))
    assert [m.dtype for m in moved] == [torch.float32, torch.int64, torch.float32, torch.float32]
    assert all(torch.equal(m, p.to(m.dtype)) for m, p in zip(moved, parts, strict=True))
    back = to_host_once([parts[0], parts[0].double()])
    assert all(torch.equal(b, parts[0]) for b in back)
    back[0].add_(1)  # a copy: the input is untouched
    assert not torch.equal(back[0], parts[0]) and to_device_once([], torch.device("cpu")) == []
