"""Which device a client runs on, checked before any model is loaded; the GPU numerics policy.

Facts these rules follow:

* Flower's simulation runs each client in a Ray actor, and Ray sets ``CUDA_VISIBLE_DEVICES`` in every actor to
  the GPUs of that actor's share: ``""`` (no GPU at all) when the client has no GPU share, else one physical GPU,
  which the actor then sees as ``cuda:0``. So inside the simulation ``device = "cuda:1"`` never exists, and a
  client without a GPU share cannot use CUDA, even on a GPU host.
* A deployed SuperNode is a process of its own: ``CUDA_VISIBLE_DEVICES=<n>`` in its environment, or a
  ``device`` in its node config, picks its GPU. The run config's ``device`` is the same for every node, so
  several SuperNodes of one multi-GPU host would otherwise all land on ``cuda:0``.
* Numerics: ``precision = "fp32"`` means IEEE float32 on a GPU too (:func:`disable_tf32`; ``bf16`` autocast is
  the fast setting); :func:`set_deterministic` asks torch for deterministic kernels.

Everything here except those two flag setters is a pure function of its arguments (the tests fake GPU counts
and ``CUDA_VISIBLE_DEVICES``). The rules import no torch (``fedrapp-sim`` checks them in a second); the
helpers that move tensors do.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the launcher checks devices without loading it
    import torch
    from torch import Tensor

_DEVICE = re.compile(r"^(auto|cpu|cuda)(?::(\d+))?$")
#: Shown in every message about the simulation's GPU rule.
_RAY_RULE = "inside Flower's simulation every client runs in a Ray actor that sees only its own GPU share, as cuda:0"


def parse_device(device: str) -> tuple[str, int | None]:
    """``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` -> (kind, N or None); ValueError otherwise."""
    match = _DEVICE.match(str(device).strip())
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise ValueError(f"device {device!r} is not one of 'auto', 'cpu', 'cuda' or 'cuda:N' (N = 0, 1, ...)")
    index = match.group(2)
    return match.group(1), None if index is None else int(index)


def device_for_node(run_config_device: str, node_config: Mapping[str, object]) -> str:
    """The device setting of one client: the node config's ``device`` when present, else the run config's.

    A SuperNode started with ``--node-config "device='cuda:1'"`` overrides the run-wide ``device`` (several
    SuperNodes on one multi-GPU host, one GPU each). Both values are validated.
    """
    parse_device(run_config_device)
    value = node_config.get("device")
    if value is None or str(value).strip() == "":
        return str(run_config_device)
    try:
        parse_device(str(value))
    except ValueError as err:
        raise ValueError(f"the SuperNode's node config has device = {value!r}: {err}") from None
    return str(value).strip()


def check_device(device: str, visible_count: int, cuda_visible_devices: str | None = None) -> str | None:
    """Why ``device`` cannot run in a process that sees ``visible_count`` GPUs, with the fix; None if it can.

    ``cuda_visible_devices`` is that process's ``CUDA_VISIBLE_DEVICES`` (None = not set), quoted in the message.
    ``"auto"`` and ``"cpu"`` always run (``"auto"`` falls back to the CPU).
    """
    try:
        kind, index = parse_device(device)
    except ValueError as err:
        return str(err)
    if kind != "cuda":
        return None
    env = "not set" if cuda_visible_devices is None else repr(cuda_visible_devices)
    if visible_count == 0:
        return (
            f"device={device!r}, but this process sees no GPU (CUDA_VISIBLE_DEVICES is {env}). In fedrapp-sim or "
            "flwr run's simulation, Ray hides every GPU from a client without a GPU share: give clients one with "
            "--gpus-per-client 1 (or 0.25 to put four clients on a GPU), or flwr run's federation config "
            "client-resources-num-gpus=1. Elsewhere install a CUDA build of torch, or use device='auto' or 'cpu'"
        )
    if index is not None and index >= visible_count:
        visible = "cuda:0" if visible_count == 1 else f"cuda:0..cuda:{visible_count - 1}"
        return (
            f"device={device!r}, but this process sees {visible_count} GPU(s), {visible} (CUDA_VISIBLE_DEVICES is "
            f"{env}); {_RAY_RULE}, so use device='cuda' there. To put a SuperNode on GPU {index} of its host, "
            f"start it with CUDA_VISIBLE_DEVICES={index} (it then sees that GPU as cuda:0) or give it "
            f"--node-config \"device='cuda:{index}'\""
        )
    return None


def host_gpu_count(cuda_visible_devices: str | None = None, driver: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """GPUs this host offers to a new process, without loading torch or CUDA: the NVIDIA driver's GPU list
    (Linux), narrowed by ``CUDA_VISIBLE_DEVICES`` (default: this process's). 0 without the driver."""
    physical = len(list(driver.iterdir())) if driver.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if cuda_visible_devices is None else cuda_visible_devices
    if visible is None or physical == 0:
        return physical
    count = 0
    for entry in visible.split(","):  # CUDA stops at the first invalid entry
        entry = entry.strip()
        if not ((entry.isdigit() and int(entry) < physical) or entry.startswith(("GPU-", "MIG-"))):
            break
        count += 1
    return min(count, physical)


def launcher_gpu_share(
    requested_device: str, host_gpus: int, gpus_per_client: float | None
) -> tuple[float, str | None]:
    """The GPU share each simulated client gets, and a note for the user (None when there is nothing to say).

    ``requested_device`` is the run config's ``device``, ``host_gpus`` the GPUs the launcher sees (what Ray
    will hand out), ``gpus_per_client`` the ``--gpus-per-client`` flag (None = not given). Raises ValueError
    for a combination that would fail or hang in every client, naming the flag or key to change.

    Rules: a user who gave the flag gets it, unless it cannot work. Without the flag, a run that asks for a
    GPU (``auto`` or ``cuda`` on a host with GPUs) gives each client a whole GPU: Ray would otherwise hide the
    GPUs (``auto`` silently on the CPU, ``cuda`` failing in every client), and one client per GPU cannot run
    out of GPU memory whatever the method; the note says how to put several clients on a GPU.
    """
    kind, index = parse_device(requested_device)
    if host_gpus < 0:
        raise ValueError(f"host_gpus must be >= 0, got {host_gpus}")
    if gpus_per_client is not None:
        share = float(gpus_per_client)
        if not math.isfinite(share) or share < 0:
            raise ValueError(f"--gpus-per-client must be >= 0, got {gpus_per_client}")
        if share > 1 and not share.is_integer():
            raise ValueError(
                f"--gpus-per-client {gpus_per_client}: Ray accepts a fraction below 1 or a whole number of GPUs"
            )
        if share > host_gpus:
            raise ValueError(
                f"--gpus-per-client {gpus_per_client}, but this host has {host_gpus} GPU(s): Ray could never start "
                f"a client; use --gpus-per-client 0 (CPU){' or at most ' + str(host_gpus) if host_gpus else ''}"
            )
    if kind == "cuda" and index is not None and index > 0:
        raise ValueError(
            f"device={requested_device!r}: {_RAY_RULE}, so cuda:{index} does not exist in any client; use "
            "device='cuda' (each client gets its own GPU through --gpus-per-client)"
        )
    if kind == "cpu":
        note = None
        if gpus_per_client:
            note = f"device='cpu': the clients reserve {gpus_per_client} GPU each but compute on the CPU"
        return float(gpus_per_client or 0.0), note
    if host_gpus == 0:
        if kind == "cuda":
            raise ValueError(
                f"device={requested_device!r}, but this host has no GPU that torch can see; "
                "use device='auto' or 'cpu', or install a CUDA build of torch"
            )
        return 0.0, None
    if gpus_per_client is None:
        return 1.0, (
            f"this host has {host_gpus} GPU(s) and device={requested_device!r}: each client gets a whole GPU "
            f"(--gpus-per-client 1, so {host_gpus} client(s) run at a time). To run k clients on a GPU at once, "
            "pass --gpus-per-client 1/k (e.g. 0.25) after checking the memory per client (benchmarks/gpu_step.py); "
            "--gpus-per-client 0 keeps the clients on the CPU"
        )
    if gpus_per_client == 0:
        if kind == "cuda":
            raise ValueError(
                f"device={requested_device!r} with --gpus-per-client 0: Ray hides the GPUs from clients without a "
                "GPU share, so CUDA would be unavailable in every client; pass --gpus-per-client 1 (or 0.25 to put "
                "four clients on a GPU), or set device='cpu'"
            )
        return 0.0, (
            f"--gpus-per-client 0: the clients run on the CPU although this host has {host_gpus} GPU(s) "
            "(Ray hides the GPUs from clients without a GPU share)"
        )
    return float(gpus_per_client), None


def describe_device(
    device: torch.device | str,
    gpu_name: Callable[[int], str] | None = None,
    cuda_visible_devices: str | None = None,
) -> str:
    """``"cpu"`` or e.g. ``"cuda:0 (NVIDIA H200; CUDA_VISIBLE_DEVICES=3)"``: the device a client really uses.

    ``gpu_name`` maps a CUDA index to the GPU's name (default ``torch.cuda.get_device_name``); the physical GPU
    behind ``cuda:0`` in a Ray actor or a SuperNode is what ``CUDA_VISIBLE_DEVICES`` says.
    """
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return str(device.type)
    index = 0 if device.index is None else device.index
    try:
        name = (gpu_name or torch.cuda.get_device_name)(index)
    except (RuntimeError, AssertionError):  # no CUDA to ask (e.g. the tests' emulation of cuda:0 on the CPU)
        name = "GPU name unknown"
    where = "" if cuda_visible_devices is None else f"; CUDA_VISIBLE_DEVICES={cuda_visible_devices}"
    return f"cuda:{index} ({name}{where})"


def current_device_description(device: torch.device | str) -> str:
    """:func:`describe_device` for this process (its ``CUDA_VISIBLE_DEVICES`` and torch's GPU names)."""
    return describe_device(device, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def disable_tf32() -> None:
    """fp32 means IEEE float32 on a GPU: TF32 off for CUDA matmuls (torch's default) and cuDNN convolutions
    (cuDNN's default is on). Process-wide; :func:`~fedrapp_app.engine.load_clip` calls it for a CUDA device,
    ``benchmarks/gpu_step.py`` too, so the benchmark's fp32 row is the app's fp32. No effect on the CPU."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def set_deterministic(enabled: bool) -> None:
    """Ask torch for deterministic kernels (process-wide), or give torch its defaults back.

    ``enabled``: ``torch.use_deterministic_algorithms(True)`` (kernels without floating-point atomics, e.g. in
    the backward of scaled-dot-product attention, which the class-specific-context text pass runs), cuDNN
    without autotuning, and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS needs it for reproducible results; it
    must be set before the process's first CUDA matmul: call this before loading the model). An op that has
    no deterministic CUDA kernel then raises an error naming it instead of silently varying. The CPU's
    kernels used here are deterministic either way.
    """
    import torch

    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = False


# ----- few host-device copies: on a GPU each blocking copy waits for the device's queue to drain --------
def to_device_once(parts: Sequence[Tensor], device: torch.device, dtype: torch.dtype | None = None) -> list[Tensor]:
    """Host tensors -> ``device`` in one copy: float parts in ``dtype`` (default float32), integer parts as long.

    Integer parts travel as float (exact below 2^24 in float32, 2^53 in float64). The results are views of
    one device buffer (not overlapping).
    """
    import torch

    if not parts:
        return []
    dtype = dtype or torch.float32
    carrier = torch.float64 if dtype == torch.float64 else torch.float32
    moved = torch.cat([part.reshape(-1).to(carrier) for part in parts]).to(device)
    return [
        chunk.view(part.shape).to(dtype) if part.is_floating_point() else chunk.view(part.shape).long()
        for chunk, part in zip(moved.split([part.numel() for part in parts]), parts, strict=True)
    ]


def to_host_once(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Tensors on any device -> detached float32 CPU copies, read in one device-to-host copy (one sync).

    The results are views of one new host buffer (not overlapping, not sharing memory with the inputs).
    """
    import torch

    if not tensors:
        return []
    flat = torch.cat([tensor.detach().reshape(-1).to(torch.float32) for tensor in tensors]).cpu()
    return [chunk.view(t.shape) for chunk, t in zip(flat.split([t.numel() for t in tensors]), tensors, strict=True)]
