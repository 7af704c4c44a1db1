"""Load a frozen CLIP (model, tokenizer, image processor) from a Hub id, a local folder or ``"testbed"``.

Everything comes through ``from_pretrained`` of the same place, so the offline testbed model, a folder
copied from the Hub cache and ``openai/clip-vit-base-patch16`` all take one code path.

Precision: the weights stay float32; ``"bf16"``/``"fp16"`` run the forward passes under
``torch.autocast``. On CUDA both are allowed (fp16's backward needs loss scaling: the methods do it, see
``fedrapp_app.methods.scaling``), and ``"fp32"`` is IEEE float32 (TF32 off, ``devices.disable_tf32``). On
CPU ``"bf16"`` autocast is allowed (CPU autocast supports it) and ``"fp16"`` is refused, because CPU
autocast does not support float16 well (the tests emulate CUDA's fp16: ``fedrapp_app.testing.cuda_emulation``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoTokenizer,
    CLIPConfig,
    CLIPModel,
    PreTrainedTokenizerBase,
)
from transformers.image_processing_base import ImageProcessingMixin
from transformers.utils import logging as hf_logging

from fedrapp_app.engine.devices import check_device, disable_tf32

DEFAULT_CHECKPOINT = "openai/clip-vit-base-patch16"
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_TESTBED_FOLDER = Path(__file__).resolve().parent.parent / "testbed" / "model"


@dataclass(frozen=True, eq=False)
class FrozenCLIP:
    """A frozen ``CLIPModel`` with its tokenizer and image processor, on one device.

    ``precision`` is ``"fp32"``, ``"bf16"`` or ``"fp16"``; use :meth:`autocast` around every forward pass.
    """

    model: CLIPModel
    tokenizer: PreTrainedTokenizerBase
    image_processor: ImageProcessingMixin
    device: torch.device
    precision: str
    source: str

    @property
    def text_width(self) -> int:
        """D: width of the text transformer (token embedding size), 512 for ViT-B/16."""
        return int(self.model.config.text_config.hidden_size)

    @property
    def max_text_length(self) -> int:
        """Number of position embeddings of the text transformer (77 for OpenAI CLIP)."""
        return int(self.model.config.text_config.max_position_embeddings)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast context for ``precision`` on ``device`` (a no-op for fp32)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=PRECISIONS[self.precision])

    def full_precision(self) -> contextlib.AbstractContextManager:
        """Inside :meth:`autocast`, run the enclosed ops in their inputs' own dtype (autocast off there)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, enabled=False)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> ``cuda`` when available, else ``cpu``; other values go to ``torch.device``.

    A CUDA device this process cannot use (no GPU visible, ``cuda:N`` beyond the visible GPUs) raises
    ValueError with the reason and the fix (:func:`~fedrapp_app.engine.devices.check_device`), before the
    model is read.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        problem = check_device(str(resolved), visible, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if problem is not None:
            raise ValueError(problem)
    return resolved


def check_precision(precision: str, device: torch.device) -> None:
    """Reject unknown precisions and fp16 on CPU, with the fix in the message."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {sorted(PRECISIONS)}")
    if precision == "fp16" and device.type == "cpu":
        raise ValueError(
            "precision='fp16' needs a GPU (float16 autocast is not supported on CPU); "
            "use precision='bf16' or 'fp32' on CPU"
        )


def resolve_source(source: str | Path) -> tuple[str, bool]:
    """Return ``(where, is_local)`` for ``"testbed"``, a local folder or a Hub id."""
    text = str(source)
    if text == "testbed":
        if not (_TESTBED_FOLDER / "config.json").is_file():
            raise FileNotFoundError(
                f"the testbed model folder {_TESTBED_FOLDER} is missing or incomplete (no config.json); "
                "it ships with the fedrapp package: reinstall the package or run the testbed pretraining script"
            )
        return str(_TESTBED_FOLDER), True
    path = Path(text).expanduser()
    if path.is_dir():
        return str(path), True
    if text.startswith((".", "/", "~")) or path.is_file() or text.count("/") > 1:
        raise FileNotFoundError(
            f"model folder {text!r} does not exist (a local CLIP checkpoint folder, "
            f"a Hub id such as {DEFAULT_CHECKPOINT!r}, or 'testbed' were expected)"
        )
    return text, False


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Silence transformers' and huggingface_hub's tqdm bars ("Loading weights") while loading."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _unreachable_message(source: str, err: Exception) -> str:
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (
        f"could not load the CLIP checkpoint {source!r} from the Hugging Face Hub ({reason}). "
        "The Hub may be unreachable from this machine and the checkpoint is not in the local cache. "
        "Fix: point the run at a local checkpoint folder (config.json, weights, tokenizer and "
        "preprocessor files), e.g. `model=/path/to/clip-vit-base-patch16` in the run config, or "
        "download it once on a connected machine into the Hugging Face cache (HF_HOME) and run with "
        "HF_HUB_OFFLINE=1; `model=testbed` runs the shipped offline model"
    )


def _from_pretrained(where: str, local_files_only: bool) -> tuple[CLIPModel, PreTrainedTokenizerBase, object]:
    """Model, tokenizer and image processor of ``where`` (a folder or a Hub id) through ``from_pretrained``."""
    with _quiet_progress_bars():
        config = AutoConfig.from_pretrained(where, local_files_only=local_files_only)
        if not isinstance(config, CLIPConfig):
            raise ValueError(
                f"{where!r} holds a {type(config).__name__} (model_type="
                f"{getattr(config, 'model_type', '?')!r}), not a CLIP checkpoint; "
                "FedRAPP needs a CLIPModel checkpoint such as " + repr(DEFAULT_CHECKPOINT)
            )
        model = CLIPModel.from_pretrained(where, config=config, local_files_only=local_files_only)
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=local_files_only)
        image_processor = AutoImageProcessor.from_pretrained(where, local_files_only=local_files_only)
    return model, tokenizer, image_processor


def load_clip(
    source: str | Path = DEFAULT_CHECKPOINT, device: str | torch.device = "auto", precision: str = "fp32"
) -> FrozenCLIP:
    """Load a frozen CLIP from ``source`` (``"testbed"``, a local folder, or a Hub id).

    A Hub id is first looked up in the local Hugging Face cache only (``local_files_only``): a deployed
    ClientApp loads the model in every round (a new process per message), and a cached checkpoint then
    costs no network round-trip (nor a timeout on a node without Internet access). Only a checkpoint that
    is not fully cached is fetched from the Hub.

    Raises ``FileNotFoundError`` for a missing folder, ``ValueError`` for a checkpoint that is not a CLIP
    model or a bad device/precision, and ``OSError`` (with the fix) when a Hub id cannot be fetched.
    """
    resolved_device = resolve_device(device)
    check_precision(precision, resolved_device)
    where, local = resolve_source(source)
    if local and not (Path(where) / "config.json").is_file():
        raise ValueError(f"{where!r} is not a Hugging Face checkpoint folder: it has no config.json")
    try:
        parts = _from_pretrained(where, local_files_only=True)
    except OSError as err:
        if local:
            raise OSError(f"could not load the CLIP checkpoint folder {where!r}: {err}") from err
        # A Hub id that is not (completely) in the local cache: fetch it.
        try:
            parts = _from_pretrained(where, local_files_only=False)
        except OSError as err:
            raise OSError(_unreachable_message(where, err)) from None
    model, tokenizer, image_processor = parts
    if resolved_device.type == "cuda":
        disable_tf32()  # precision="fp32" is IEEE float32 on every GPU (bf16 is the fast setting)
    model.requires_grad_(False).eval().to(resolved_device)
    return FrozenCLIP(model, tokenizer, image_processor, resolved_device, precision, where)
