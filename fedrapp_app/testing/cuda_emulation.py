"""CUDA emulated on the CPU: where each tensor would live, what CUDA would refuse, when the host would wait for
the GPU, and CUDA's autocast op lists. For tests and benchmarks: no GPU runs this project's CI.

* :class:`CudaPlacement`, a ``TorchFunctionMode``: every tensor stays on the CPU, but the mode records which
  ones would live on ``cuda:0`` (tensors moved or created there, model weights marked with
  :meth:`CudaPlacement.clip`, and every result of an op on them), answers ``tensor.device`` /
  ``is_cuda`` as CUDA would, and reports

  - *violations*, what CUDA would refuse: an op mixing ``cuda:0`` tensors with CPU tensors (0-d CPU
    scalars are allowed, as CUDA allows them), a CPU ``torch.Generator`` drawing for a ``cuda:0`` tensor,
    ``.numpy()`` of a ``cuda:0`` tensor, a CPU tensor indexed by a ``cuda:0`` index, an invalid device ordinal;
  - *syncs*, where the host waits for the GPU: device-to-host reads (``.item()``, ``float()``, ``bool()``,
    ``.tolist()``, ``.cpu()``, ``nonzero``, boolean-mask indexing, ...), and *uploads*, blocking host-to-device
    copies (``.to("cuda")`` of a CPU tensor, ``torch.tensor(..., device="cuda")``, a CPU index into a CUDA
    tensor): PyTorch's blocking copy waits for the stream (``memcpy_and_sync``), so each is a sync too.

* :class:`CudaAutocast`, a ``TorchFunctionMode`` with CUDA autocast's op lists: matmul-class ops (linear,
  matmul, einsum, bmm, convolutions, scaled-dot-product attention, ...) cast their inputs to the low dtype,
  the float32 list (layer_norm, softmax, log_softmax, exp, log, sum, cumsum, norms, losses, ...) casts them
  back to float32, everything else runs in its inputs' dtype. CPU autocast has other lists (it runs
  layer_norm, softmax, exp, sum in the low dtype), so it cannot stand in for a GPU's numerics.

* :func:`emulated_clip` gives a :class:`~fedrapp_app.engine.FrozenCLIP` whose ``autocast()`` is
  :class:`CudaAutocast` (``precision = "fp16"`` becomes possible on the CPU).

The rules are CUDA's as far as this project's code needs them; an op both sides allow in a way not modelled
here (e.g. a CPU scalar tensor in a matmul) is not reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from fedrapp_app.engine.loading import PRECISIONS, FrozenCLIP

EMULATED_DEVICE = torch.device("cuda", 0)
_MARK = "_fedrapp_emulated_cuda"
_HERE = str(Path(__file__).resolve())
_LIBRARIES = (f"{Path(torch.__file__).parent}", "/transformers/", "/contextlib.py", "/functools.py")

#: Device-to-host reads: the host waits until the GPU has computed the value.
_READS = frozenset(
    {
        "item",
        "tolist",
        "__bool__",
        "__float__",
        "__int__",
        "__index__",
        "__complex__",
        "__repr__",
        "__str__",
        "__format__",
        "nonzero",
        "argwhere",
        "masked_select",
        "unique",
        "unique_consecutive",
        "_unique",
        "_unique2",
        "bincount",
        "equal",
        "allclose",
        "is_nonzero",
    }
)
_RANDOM = frozenset({"multinomial", "bernoulli", "normal", "poisson", "rand_like", "randn_like", "randint_like"})
_HOST_DATA = frozenset({"tensor", "as_tensor", "asarray", "new_tensor"})


@dataclass(frozen=True)
class Event:
    """One recorded violation, sync or upload: what, through which op, from which line of the caller."""

    kind: str  # "violation", "sync" or "upload"
    op: str
    detail: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.op} at {self.where}: {self.detail}"


def _caller() -> str:
    """file:line of the innermost frame outside torch, transformers and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _HERE and not any(part in name for part in _LIBRARIES):
            return f"{Path(name).name}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


def _tensors(value: Any) -> Iterator[Tensor]:
    """Every tensor inside nested args/kwargs (tuples, lists, dicts)."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _name(func: Any) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _getter_name(func: Any) -> str | None:
    """The property's name when ``func`` is a tensor property's getter (``Tensor.device.__get__``), else None."""
    if _name(func) == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", None)
    return None


def _is_cuda(device: Any) -> bool:
    if device is None or isinstance(device, int):
        return isinstance(device, int)  # an int device means a CUDA ordinal
    return torch.device(device).type == "cuda"


class CudaPlacement(TorchFunctionMode):
    """Track where tensors would live on a one-GPU machine and report what CUDA would refuse or wait for.

    Use as a context manager; see the module docstring. ``visible`` is the number of GPUs the emulated process
    sees (ordinals ``>= visible`` are violations). After the block: :attr:`violations`, :attr:`syncs`,
    :attr:`uploads` (lists of :class:`Event`), :meth:`counts`, :meth:`check`.
    """

    def __init__(self, visible: int = 1) -> None:
        super().__init__()
        self.visible = visible
        self._token = object()  # marks are per instance: another tracker's marks mean nothing here
        self.violations: list[Event] = []
        self.syncs: list[Event] = []
        self.uploads: list[Event] = []

    # ----- marks ------------------------------------------------------------------------------------
    def on_cuda(self, tensor: Tensor) -> bool:
        """Whether ``tensor`` would live on ``cuda:0``."""
        return getattr(tensor, _MARK, None) is self._token

    def mark(self, tensor: Tensor) -> Tensor:
        """Record ``tensor`` as living on ``cuda:0`` (it stays on the CPU); returns it."""
        setattr(tensor, _MARK, self._token)
        return tensor

    def _unmark(self, tensor: Tensor) -> None:
        if getattr(tensor, _MARK, None) is self._token:
            delattr(tensor, _MARK)

    def mark_module(self, module: torch.nn.Module) -> None:
        """Mark every parameter and buffer of ``module`` (what ``module.to("cuda")`` would move)."""
        for tensor in [*module.parameters(), *module.buffers()]:
            self.mark(tensor)

    def clip(self, clip: FrozenCLIP, precision: str | None = None) -> FrozenCLIP:
        """``clip`` as if loaded on ``cuda:0`` (weights marked, ``device`` = cuda:0), with CUDA's autocast lists
        for ``precision`` (default: the clip's). The model object is shared, not copied."""
        self.mark_module(clip.model)
        return emulated_clip(clip, precision, EMULATED_DEVICE)

    # ----- reports ----------------------------------------------------------------------------------
    def _record(self, kind: str, op: str, detail: str) -> None:
        {"violation": self.violations, "sync": self.syncs, "upload": self.uploads}[kind].append(
            Event(kind, op, detail, _caller())
        )

    def counts(self) -> dict[str, int]:
        """``{"syncs": reads, "uploads": blocking copies, "waits": both, "violations": n}``."""
        return {
            "syncs": len(self.syncs),
            "uploads": len(self.uploads),
            "waits": len(self.syncs) + len(self.uploads),
            "violations": len(self.violations),
        }

    def by_site(self, kind: str = "waits") -> Counter[str]:
        """How many syncs/uploads/violations (or "waits": syncs and uploads) each caller line caused."""
        events = {"waits": self.syncs + self.uploads, "syncs": self.syncs, "uploads": self.uploads}.get(
            kind, self.violations
        )
        return Counter(f"{e.kind} {e.op} at {e.where}" for e in events)

    def check(self) -> None:
        """Raise AssertionError listing every violation (the first 20), if any."""
        if self.violations:
            lines = "\n".join(f"  {event}" for event in self.violations[:20])
            raise AssertionError(f"{len(self.violations)} op(s) CUDA would refuse:\n{lines}")

    # ----- the mode ---------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        prop = _getter_name(func)
        if prop is not None:
            return self._property(func, prop, args)
        name = _name(func)
        if func is Tensor.to:
            return self._to(func, args, kwargs)
        if func is Tensor.cuda:
            device = args[1] if len(args) > 1 else kwargs.get("device")
            return self._move(args[0], args[0], to_cuda=True, op="cuda", device=device)
        if func is Tensor.cpu:
            return self._move(args[0], func(*args, **kwargs), to_cuda=False, op="cpu")
        if func is Tensor.copy_:
            return self._copy(func, args, kwargs)
        if func in (Tensor.__getitem__, Tensor.__setitem__):
            return self._index(func, name, args, kwargs)
        if func is Tensor.get_device and self.on_cuda(args[0]):
            return 0
        if name in ("numpy", "__array__") and self.on_cuda(args[0]):
            self._record("violation", name, "numpy of a cuda:0 tensor (TypeError on CUDA): call .cpu() first")
            return func(*args, **kwargs)

        created = False
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            self._check_ordinal(kwargs["device"], name)
            kwargs["device"] = "cpu"
            created = True
        tensors = list(_tensors((args, kwargs)))
        on_gpu = [t for t in tensors if self.on_cuda(t)]
        if on_gpu:
            host = [tuple(t.shape) for t in tensors if not self.on_cuda(t) and t.dim() > 0]
            if host:
                self._record("violation", name, f"mixes cuda:0 tensors with CPU tensors of shapes {host}")
            if name in _READS or (name == "where" and len(args) + len(kwargs) == 1):
                self._record("sync", name, "reads a cuda:0 tensor on the host")
            if name == "repeat_interleave" and "output_size" not in kwargs:
                self._record("sync", name, "output size read from a cuda:0 tensor")
        if created and name in _HOST_DATA and not any(self.on_cuda(t) for t in tensors):
            self._record("upload", name, "host data copied to cuda:0")
        generator = kwargs.get("generator")
        if isinstance(generator, torch.Generator) and generator.device.type == "cpu":
            in_place = bool(on_gpu) and self.on_cuda(args[0]) and name.endswith("_")
            if created or in_place or (on_gpu and name in _RANDOM):
                self._record("violation", name, "a CPU torch.Generator draws for a cuda:0 tensor")
        out = func(*args, **kwargs)
        if on_gpu or created:
            for tensor in _tensors(out):
                self.mark(tensor)
        return out

    def _property(self, func, prop: str, args) -> Any:
        on_gpu = self.on_cuda(args[0])
        if prop == "device":
            return EMULATED_DEVICE if on_gpu else func(*args)
        if prop == "is_cuda":
            return on_gpu or func(*args)
        if prop == "is_cpu":
            return not on_gpu and func(*args)
        out = func(*args)
        if on_gpu and isinstance(out, Tensor):  # .grad, .data, .T, ...
            self.mark(out)
        return out

    def _check_ordinal(self, device: Any, op: str) -> None:
        index = device if isinstance(device, int) else torch.device(device).index
        if index is not None and not 0 <= index < self.visible:
            self._record("violation", op, f"invalid device ordinal cuda:{index} ({self.visible} GPU(s) visible)")

    def _move(self, src: Tensor, out: Tensor, to_cuda: bool, op: str, device: Any = None) -> Tensor:
        if to_cuda and device is not None:
            self._check_ordinal(device, op)
        if self.on_cuda(src) == to_cuda:
            return self.mark(out) if to_cuda else out
        if out is src:  # a real no-op on the CPU; CUDA would return a copy on the other device
            out = src.clone()
        if to_cuda:
            self._record("upload", op, f"{tuple(src.shape)} {src.dtype} copied to cuda:0")
            return self.mark(out)
        self._record("sync", op, f"{tuple(src.shape)} {src.dtype} copied to the host")
        self._unmark(out)
        return out

    def _to(self, func, args, kwargs) -> Tensor:
        src, rest = args[0], list(args[1:])
        if rest and isinstance(rest[0], Tensor):  # .to(other): other's dtype and device
            return self._move(src, func(*args, **kwargs), self.on_cuda(rest[0]), "to")
        copy = kwargs.pop("copy", False)
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kwargs)
        if device is None:
            out = func(*args, **kwargs, copy=copy)
            return self.mark(out) if self.on_cuda(src) else out
        extra = {} if memory_format is None else {"memory_format": memory_format}
        out = func(src, device="cpu", dtype=dtype, non_blocking=non_blocking, copy=copy, **extra)
        to_cuda = device.type == "cuda"
        return self._move(src, out, to_cuda, "to", device if to_cuda else None)

    def _copy(self, func, args, kwargs) -> Tensor:
        dst, src = args[0], args[1]
        if self.on_cuda(dst) and not self.on_cuda(src):
            self._record("upload", "copy_", f"{tuple(src.shape)} copied to cuda:0")
        elif self.on_cuda(src) and not self.on_cuda(dst):
            self._record("sync", "copy_", f"{tuple(src.shape)} copied to the host")
        return func(*args, **kwargs)

    def _index(self, func, name: str, args, kwargs) -> Any:
        target, index = args[0], args[1]
        on_gpu = self.on_cuda(target)
        for tensor in _tensors(index):
            if on_gpu and not self.on_cuda(tensor):
                self._record("upload", name, f"CPU index {tuple(tensor.shape)} copied to cuda:0")
            if not on_gpu and self.on_cuda(tensor):
                self._record("violation", name, "a CPU tensor indexed by a cuda:0 tensor")
            if on_gpu and tensor.dtype == torch.bool:
                self._record("sync", name, "boolean mask: the result's size is read on the host")
        if name == "__setitem__" and isinstance(args[2], Tensor):
            value = args[2]
            if on_gpu and not self.on_cuda(value):
                self._record("upload", name, f"CPU value {tuple(value.shape)} copied to cuda:0")
            elif not on_gpu and self.on_cuda(value):
                self._record("sync", name, f"cuda:0 value {tuple(value.shape)} copied to the host")
        out = func(*args, **kwargs)
        if on_gpu and isinstance(out, Tensor):
            self.mark(out)
        return out


# ----- CUDA autocast --------------------------------------------------------------------------------
#: CUDA autocast's lower-precision list (the entries this code base can reach, by their Python entry points).
LOW_PRECISION_OPS = frozenset(
    {
        F.linear,
        F.bilinear,
        F.conv1d,
        F.conv2d,
        F.conv3d,
        F.conv_transpose1d,
        F.conv_transpose2d,
        F.conv_transpose3d,
        F.prelu,
        F.scaled_dot_product_attention,
        torch.matmul,
        Tensor.matmul,
        Tensor.__matmul__,
        Tensor.__rmatmul__,
        torch.mm,
        Tensor.mm,
        torch.mv,
        Tensor.mv,
        torch.bmm,
        Tensor.bmm,
        torch.baddbmm,
        Tensor.baddbmm,
        torch.addmm,
        Tensor.addmm,
        torch.addbmm,
        torch.addmv,
        torch.addr,
        torch.einsum,
        torch.chain_matmul,
        torch.linalg.multi_dot,
        torch.linalg.vecdot,
    }
)
#: CUDA autocast's float32 lists (fp32 and fp32_set_opt_dtype), plus composites whose CUDA result is float32
#: because their reduction is on the list (``F.normalize``: a norm; ``F.cross_entropy``: log_softmax + nll).
FLOAT32_OPS = frozenset(
    {
        torch.exp,
        Tensor.exp,
        torch.expm1,
        torch.log,
        Tensor.log,
        torch.log2,
        torch.log10,
        torch.log1p,
        Tensor.log1p,
        torch.reciprocal,
        Tensor.reciprocal,
        torch.rsqrt,
        Tensor.rsqrt,
        torch.acos,
        torch.asin,
        torch.cosh,
        torch.sinh,
        torch.tan,
        torch.erfinv,
        torch.pow,
        Tensor.pow,
        Tensor.__pow__,
        F.softplus,
        F.layer_norm,
        torch.layer_norm,
        F.group_norm,
        F.softmax,
        torch.softmax,
        Tensor.softmax,
        F.log_softmax,
        torch.log_softmax,
        Tensor.log_softmax,
        torch.cumsum,
        Tensor.cumsum,
        torch.cumprod,
        Tensor.cumprod,
        torch.prod,
        Tensor.prod,
        torch.sum,
        Tensor.sum,
        torch.logsumexp,
        Tensor.logsumexp,
        torch.norm,
        Tensor.norm,
        torch.linalg.norm,
        torch.linalg.vector_norm,
        torch.linalg.matrix_norm,
        torch.dist,
        torch.cdist,
        torch.renorm,
        F.normalize,
        F.cosine_similarity,
        F.cross_entropy,
        F.nll_loss,
        F.kl_div,
        F.mse_loss,
        F.l1_loss,
        F.smooth_l1_loss,
        F.huber_loss,
        F.binary_cross_entropy_with_logits,
        F.interpolate,
    }
)
_LOW_DTYPES = (torch.float16, torch.bfloat16)
_suspension = threading.local()


def _cast(value: Any, dtype: torch.dtype, eligible: tuple[torch.dtype, ...]) -> Any:
    """``value`` with every floating tensor of an ``eligible`` dtype cast to ``dtype`` (nested containers)."""
    if isinstance(value, Tensor):
        return value.to(dtype) if value.dtype in eligible and value.dtype != dtype else value
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        cast = [_cast(item, dtype, eligible) for item in value]
        return type(value)(cast) if not hasattr(value, "_fields") else type(value)(*cast)
    if isinstance(value, dict):
        return {key: _cast(item, dtype, eligible) for key, item in value.items()}
    return value


class CudaAutocast(TorchFunctionMode):
    """CUDA autocast's numerics on any device: see the module docstring.

    ``dtype`` float16 or bfloat16 (float32: casts nothing, for a reference run with the same probes).
    ``probe(tensor)``, if given, is called with the output of every lower-precision op (e.g. to hook its
    gradient). :meth:`suspended` turns the casting off inside, like ``torch.autocast(enabled=False)``.
    """

    def __init__(self, dtype: torch.dtype, probe: Callable[[Tensor], None] | None = None) -> None:
        super().__init__()
        if dtype not in (*_LOW_DTYPES, torch.float32):
            raise ValueError(f"CudaAutocast emulates float16 or bfloat16 autocast (float32: no casts), got {dtype}")
        self.dtype = dtype
        self.probe = probe

    @staticmethod
    @contextlib.contextmanager
    def suspended() -> Iterator[None]:
        """Inside, every :class:`CudaAutocast` of this thread casts nothing."""
        _suspension.depth = getattr(_suspension, "depth", 0) + 1
        try:
            yield
        finally:
            _suspension.depth -= 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(_suspension, "depth", 0):
            return func(*args, **kwargs)
        if func in LOW_PRECISION_OPS:
            if self.dtype != torch.float32:
                eligible = (torch.float32, *_LOW_DTYPES)
                args, kwargs = _cast(args, self.dtype, eligible), _cast(kwargs, self.dtype, eligible)
            out = func(*args, **kwargs)
            if self.probe is not None and isinstance(out, Tensor):
                self.probe(out)
            return out
        if func in FLOAT32_OPS:
            args, kwargs = _cast(args, torch.float32, _LOW_DTYPES), _cast(kwargs, torch.float32, _LOW_DTYPES)
        return func(*args, **kwargs)


@dataclass(frozen=True, eq=False)
class EmulatedCLIP(FrozenCLIP):
    """A :class:`FrozenCLIP` whose :meth:`autocast` emulates CUDA's autocast (any device, fp16 included)."""

    probe: Callable[[Tensor], None] | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "fp32" and self.probe is None:
            return contextlib.nullcontext()
        return CudaAutocast(PRECISIONS[self.precision], self.probe)

    def full_precision(self) -> contextlib.AbstractContextManager:
        return CudaAutocast.suspended()


def emulated_clip(
    clip: FrozenCLIP,
    precision: str | None = None,
    device: torch.device | None = None,
    probe: Callable[[Tensor], None] | None = None,
) -> EmulatedCLIP:
    """``clip`` (same model object) with CUDA's autocast lists for ``precision`` (default: the clip's),
    reporting ``device`` (default: the clip's); ``probe`` sees every lower-precision op's output."""
    precision = clip.precision if precision is None else precision
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {sorted(PRECISIONS)}")
    fields = {field.name: getattr(clip, field.name) for field in dataclasses.fields(FrozenCLIP)}
    fields.update(precision=precision, device=clip.device if device is None else device)
    return EmulatedCLIP(**fields, probe=probe)
