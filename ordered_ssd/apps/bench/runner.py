"""One shape's layers and inputs, and one training step of a mode (``LayerRunner``); the device helpers the rest of
the bench shares."""
from __future__ import annotations

import gc
import importlib
from typing import Dict, Iterable

import torch

from ... import OrderedMamba2
from ...modules import NATIVE_LAYERS
from ...digest import tensor_sha256
from .requirements import BenchError
from .shapes import Shape, torch_dtype


def _share_parameters(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Make ``dst`` use ``src``'s parameter tensors (same names and shapes required)."""
    dst.load_state_dict(src.state_dict(), strict=True)  # also checks names and shapes
    src_params = dict(src.named_parameters())
    for name in [n for n, _ in dst.named_parameters()]:
        if name not in src_params:
            raise BenchError(f"internal: parameter {name} of {type(dst).__name__} has no counterpart")
        path, _, leaf = name.rpartition(".")
        setattr(dst.get_submodule(path) if path else dst, leaf, src_params[name])


class LayerRunner:
    """One shape's layers (sharing parameters) and inputs; ``step(mode)`` runs one training step.

    ``mode`` is ``native`` (mamba-ssm's ``Mamba2``, or ``Mamba3`` for a Mamba-3 shape; in an upstream-det child this
    is the deterministic one), ``ordered`` or ``literal`` (``OrderedMamba2`` / ``OrderedMamba3`` with ``literal``
    False / True), ``invariant`` (``OrderedMamba2`` with ``sequence_invariant = True``: the row-invariant GEMM). On CUDA, Mamba-2: fp32 parameters, ``u``/``dout`` [B, L, d_model] in the shape's dtype (bf16 or
    fp16), ``torch.autocast("cuda", dtype=...)`` of that dtype; Mamba-3: the layer built in the shape's dtype (its
    ``dt_bias``, biases and ``D`` fp32, as upstream's), ``u``/``dout`` in that dtype, no autocast
    (``OrderedMamba3`` takes inputs of its weights' dtype only). The same for every mode. On the CPU: fp32
    everything, no autocast (the reference path).
    """

    def __init__(self, shape: Shape, modes: Iterable[str], device: torch.device, seed: int):
        self.device = device
        self.cuda = device.type == "cuda"
        self.in_dtype = torch_dtype(shape.run_dtype(self.cuda))
        if shape.layer == "mamba3":
            from ...modules.mamba3 import OrderedMamba3 as ordered_cls

            layer_kwargs = dict(d_model=shape.d_model, d_state=shape.N, expand=2, headdim=shape.headdim,
                                ngroups=shape.G, chunk_size=shape.chunk, device=device, dtype=self.in_dtype)
        else:
            ordered_cls = OrderedMamba2
            layer_kwargs = dict(d_model=shape.d_model, d_state=shape.N, d_conv=4, expand=2, headdim=shape.headdim,
                                ngroups=shape.G, chunk_size=shape.chunk, device=device)  # fp32 parameters
        self.autocast = self.cuda and shape.layer != "mamba3"
        torch.manual_seed(seed)
        self.ordered = ordered_cls(**layer_kwargs)
        self.layers = {"ordered": self.ordered, "literal": self.ordered, "invariant": self.ordered}
        if "native" in modes:
            native_module, native_name = NATIVE_LAYERS[shape.layer]
            native = getattr(importlib.import_module(native_module), native_name)(**layer_kwargs)
            _share_parameters(native, self.ordered)
            self.layers["native"] = native
        self.params = list(self.ordered.named_parameters())
        generator = torch.Generator(device=device).manual_seed(seed + 1)
        shp = (shape.B, shape.L, shape.d_model)
        self.u = torch.randn(shp, generator=generator, device=device).to(self.in_dtype).requires_grad_(True)
        self.dout = torch.randn(shp, generator=generator, device=device).to(self.in_dtype)

    def zero_grads(self) -> None:
        for _, p in self.params:
            p.grad = None
        self.u.grad = None

    def start(self, mode: str) -> torch.nn.Module:
        """The layer of ``mode``, set for it (``literal``), with every gradient cleared: a step's first part."""
        layer = self.layers[mode]
        if mode != "native":
            layer.literal = mode == "literal"
            if hasattr(layer, "sequence_invariant"):
                layer.sequence_invariant = mode == "invariant"
        self.zero_grads()
        return layer

    def forward(self, layer: torch.nn.Module) -> torch.Tensor:
        """``layer(u)``; a Mamba-2 layer on CUDA under ``torch.autocast`` in the shape's dtype."""
        if self.autocast:
            with torch.autocast("cuda", dtype=self.in_dtype):
                return layer(self.u)
        return layer(self.u)

    def step(self, mode: str) -> None:
        self.forward(self.start(mode)).backward(self.dout)

    def grad_digests(self) -> Dict[str, str]:
        digests = {name: (tensor_sha256(p.grad) if p.grad is not None else "none") for name, p in self.params}
        digests["input"] = tensor_sha256(self.u.grad) if self.u.grad is not None else "none"
        return digests


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def error_text(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def device_is_cuda(text: str) -> bool:
    return str(text).strip().lower().startswith("cuda")


def resolve_device(text: str, index: bool = False) -> torch.device:
    """``cpu`` / ``cuda`` / ``cuda:N`` -> a torch.device (``index``: ``cuda`` becomes ``cuda:<current>``, which
    ``torch.cuda.set_device`` needs). Raises :class:`BenchError` for anything else."""
    try:
        device = torch.device(text)
    except (RuntimeError, TypeError):
        raise BenchError(f"--device: expected cuda, cuda:N or cpu, got {text!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise BenchError(f"--device: expected cuda, cuda:N or cpu, got {text!r}")
    if index and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
