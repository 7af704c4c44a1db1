"""fp16 without lost gradients, checked on the CPU under CUDA's autocast op lists (CudaAutocast), and the loss
scaler that does it (fedrapp_app.methods.scaling)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_CLASSNAMES, random_images
from torch.overrides import TorchFunctionMode

from fedrapp_app.engine import PromptedCLIP, load_clip
from fedrapp_app.methods import make_method
from fedrapp_app.methods.scaling import MIN_SCALE, LossScaler, scaler_for
from fedrapp_app.testbed.measure import make_stream, pixel_values
from fedrapp_app.testbed.world import CLASSNAMES, HAND_TEMPLATE
from fedrapp_app.testing.cuda_emulation import CudaAutocast, emulated_clip

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fp16_gradients  # noqa: E402


# ----- CUDA's autocast lists, emulated -------------------------------------------------------------------
def test_cuda_autocast_emulation_follows_cuda_op_lists():
    x = torch.randn(4, 8)
    w = torch.randn(3, 8)
    with CudaAutocast(torch.float16):
        hidden = F.linear(x, w)
        assert hidden.dtype == torch.float16  # matmul class: low precision
        assert torch.einsum("ij,kj->ik", x, w).dtype == torch.float16
        assert (x @ w.T).dtype == torch.float16
        # the float32 list: CPU autocast would run these in the low dtype, CUDA does not
        assert F.layer_norm(hidden, (3,)).dtype == torch.float32
        assert hidden.softmax(-1).dtype == torch.float32
        assert hidden.exp().dtype == torch.float32 and hidden.sum().dtype == torch.float32
        assert F.normalize(hidden, dim=-1).dtype == torch.float32
        assert torch.sigmoid(hidden).dtype == torch.float16  # on no list: the input's dtype
        with CudaAutocast.suspended():
            assert F.linear(x, w).dtype == torch.float32
    with CudaAutocast(torch.bfloat16):
        assert F.linear(x, w).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        CudaAutocast(torch.float64)


class EinsumDtypes(TorchFunctionMode):
    """Records the dtypes of every einsum's operands."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.einsum:
            self.dtypes.update(t.dtype for t in args[1:] if isinstance(t, torch.Tensor))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_attention_scores_run_in_float32_under_autocast(tiny_clip, precision):
    """The shared-prefix attention's docstring says float32 scores and softmax: true under autocast too."""
    pclip = PromptedCLIP(emulated_clip(tiny_clip, precision), TINY_CLASSNAMES)
    spy = EinsumDtypes()
    with spy:  # outside the autocast emulation, so it sees the einsums as they run
        features = pclip.text_features([pclip.context_from_text("a photo of a")])
    assert spy.dtypes == {torch.float32} and features.dtype == torch.float32
    reference = PromptedCLIP(tiny_clip, TINY_CLASSNAMES).text_features([pclip.context_from_text("a photo of a")])
    assert torch.allclose(features, reference, atol=0.05)


def test_full_precision_turns_cpu_autocast_off(tiny_clip):
    clip = load_clip(tiny_clip.source, device="cpu", precision="bf16")
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with clip.autocast():
        assert torch.mm(a, b).dtype == torch.bfloat16
        with clip.full_precision():
            assert torch.mm(a, b).dtype == torch.float32


# ----- fp16 gradients against fp32 --------------------------------------------------------------------
@pytest.fixture(scope="module")
def testbed_batch():
    clip = load_clip("testbed", device="cpu")
    pixels = pixel_values(PromptedCLIP(clip, CLASSNAMES, HAND_TEMPLATE), make_stream("clean", 0, 0, 4).images)
    return clip, pixels


@pytest.mark.parametrize(
    ("label", "images"), [("tpt+csc", 2), ("tpt", 2), ("adaprompt", 4), ("im", 4)], ids=lambda v: str(v)
)
def test_fp16_gradients_match_fp32_with_the_default_loss_scale(testbed_batch, label, images):
    """Each method's real step under emulated CUDA fp16 autocast, against fp32 (the testbed's trained CLIP)."""
    clip, pixels = testbed_batch
    method, params = fp16_gradients.variants(images, 3)[label]
    args = (clip, CLASSNAMES, HAND_TEMPLATE, method, params, pixels[:images])
    reference_grad, reference_update, _ = fp16_gradients.run_step(*args, "fp32")
    grad, update, stats = fp16_gradients.run_step(*args, "fp16")  # the methods' own scaler: 2^16
    assert stats["loss_scale"] >= 2.0**12  # no collapse of the scale on a normal step
    grad_cos, grad_ratio = fp16_gradients.compare(grad, reference_grad)
    update_cos, update_ratio = fp16_gradients.compare(update, reference_update)
    assert grad_cos > 0.999 and abs(grad_ratio - 1) < 0.01
    # fp16's rounding of the forward pass remains (AdamW's first step is about lr * sign(g)): a little slack
    assert update_cos > 0.995 and abs(update_ratio - 1) < 0.01


def test_unscaled_fp16_loses_class_specific_gradients(testbed_batch):
    """Why the scaler exists, and proof that the emulation does run fp16: without scaling, most of TPT+csc's
    prompt-gradient entries underflow to exactly 0 and the first AdamW step is off (benchmarks/fp16_gradients.py)."""
    clip, pixels = testbed_batch
    method, params = fp16_gradients.variants(2, 3)["tpt+csc"]
    args = (clip, CLASSNAMES, HAND_TEMPLATE, method, params, pixels[:2])
    probe = fp16_gradients.GradientProbe((1.0,))
    reference_grad, reference_update, _ = fp16_gradients.run_step(*args, "fp32", probe=probe)
    assert probe.below_normal[1.0] / probe.nonzero > 0.8  # most intermediate gradients: below fp16's normal range

    def zeros_and_update_cosine(scale: float | None) -> tuple[float, float]:
        grad, update, _ = fp16_gradients.run_step(*args, "fp16", scale)  # scale None: the methods' 2^16
        zero = float(((grad == 0) & (reference_grad != 0)).double().mean())
        return zero, fp16_gradients.compare(update, reference_update)[0]

    unscaled_zero, unscaled_cos = zeros_and_update_cosine(1.0)
    scaled_zero, scaled_cos = zeros_and_update_cosine(None)
    assert unscaled_zero > 0.3 and unscaled_cos < 0.9
    assert scaled_zero < unscaled_zero / 2 and scaled_cos > 0.999


# ----- the scaler ---------------------------------------------------------------------------------------
def quadratic(weights: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    """A loss whose gradient, factor * weights, passes through a float16 tensor (as the text tower's does)."""
    return (weights.half() * weights.half()).float().sum() * factor / 2


def test_a_disabled_scaler_is_plain_backward():
    weights = torch.randn(5, requires_grad=True)
    scaler = LossScaler(enabled=False)
    assert scaler.backward(quadratic(weights), [weights])
    expected = torch.autograd.grad(quadratic(weights), weights)[0]
    assert torch.equal(weights.grad, expected) and scaler.stats() == {} and scaler.state_arrays("s.") == {}


def test_the_scaler_recovers_gradients_that_underflow_in_float16():
    weights = torch.full((4,), 1.0, requires_grad=True)
    tiny = 2.0**-26  # the gradient, tiny * weights, is below float16's smallest subnormal
    assert torch.autograd.grad(quadratic(weights, tiny), weights)[0].eq(0).all()
    scaler = LossScaler(enabled=True)
    assert scaler.backward(quadratic(weights, tiny), [weights])
    assert torch.allclose(weights.grad, torch.full((4,), tiny), rtol=1e-3)


def test_an_overflow_is_retried_at_half_the_scale_not_skipped():
    weights = torch.full((3,), 1.0, requires_grad=True)
    big = 2.0**4  # 2^4 * 2^16 overflows float16 (max 65504); 2^4 * 2^11 does not
    scaler = LossScaler(enabled=True)
    assert scaler.backward(quadratic(weights, big), [weights])
    assert torch.allclose(weights.grad, torch.full((3,), big)) and scaler.scale < 2.0**16
    assert scaler.stats()["loss_scale_retries"] >= 1 and scaler.stats()["steps_skipped"] == 0
    optimizer = torch.optim.AdamW([weights], lr=0.1)
    optimizer.step()
    assert (weights < 1).all()  # the step was taken


def test_a_non_finite_loss_skips_the_step():
    weights = torch.ones(2, requires_grad=True)
    scaler = LossScaler(enabled=True)
    assert not scaler.backward((weights * math.inf).sum(), [weights])
    assert weights.grad is None and scaler.scale == MIN_SCALE and scaler.stats()["steps_skipped"] == 1


def test_the_scale_grows_after_clean_steps_and_round_trips_through_arrays():
    weights = torch.ones(2, requires_grad=True)
    scaler = LossScaler(enabled=True, init_scale=2.0**3, growth_interval=2)
    for _ in range(3):
        scaler.backward(quadratic(weights), [weights])
    assert scaler.scale == 2.0**4 and scaler.clean_steps == 1
    restored = scaler_for("fp16", scaler.state_arrays("scaler."))
    assert (restored.scale, restored.clean_steps) == (scaler.scale, scaler.clean_steps)
    assert not scaler_for("bf16").enabled and not scaler_for("fp32").enabled
    with pytest.raises(ValueError, match="invalid"):
        scaler_for("fp16", {"scaler.scale": np.asarray(0.5), "scaler.clean_steps": np.asarray(0)})


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("adaprompt", {"threshold": 0.0, "buffer_size": 4}),
        ("tpt-online", {"n_views": 3}),
        ("im", {}),
        ("tpt", {"n_views": 3}),
    ],
    ids=str,
)
def test_the_loss_scale_survives_a_resumed_client_exactly(tiny_clip, name, params):
    """Two rounds in one method object equal round 1, state_dict -> a fresh object -> round 2 (fp16)."""
    pclip = PromptedCLIP(emulated_clip(tiny_clip, "fp16"), TINY_CLASSNAMES)
    pixels = pclip.preprocess(random_images(4))
    steady = make_method(name, params)
    first = steady.adapt(pclip, steady.initial_prompt(pclip), pixels, torch.Generator().manual_seed(0))
    saved = steady.state_dict()
    assert {"scaler.scale", "scaler.clean_steps"} <= set(saved)
    second = steady.adapt(pclip, first.prompt, pixels, torch.Generator().manual_seed(1))
    resumed = make_method(name, params)
    resumed.load_state_dict(saved)
    again = resumed.adapt(pclip, first.prompt, pixels, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(second.prompt, again.prompt, strict=True))
    assert second.stats == again.stats and second.stats["loss_scale"] >= 1


def test_fp32_client_state_has_no_scaler_keys(tiny_pclip, make_pixels):
    method = make_method("adaprompt", {"threshold": 0.0, "buffer_size": 2})
    method.adapt(tiny_pclip, method.initial_prompt(tiny_pclip), make_pixels(2), torch.Generator().manual_seed(0))
    assert not any(key.startswith("scaler.") for key in method.state_dict())
    assert (
        "loss_scale"
        not in method.adapt(tiny_pclip, method.initial_prompt(tiny_pclip), make_pixels(2), torch.Generator()).stats
    )
