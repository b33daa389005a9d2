"""Row-invariant projections: :func:`invariant_linear` and :class:`InvariantLinear`, an ``nn.Linear`` whose output
row has bits that depend on that row alone, never on how many rows come with it.

Why: a matmul library picks its kernel by shape, so ``F.linear`` gives a row other bits when the number of rows
changes (measured on the CPU of CI: 1 to 11 rows against 4000 rows of the same values; cuBLAS chooses tiles and
split-K by shape the same way). The layer's own projections are row-invariant on the reference path already (they
run on one chunk of ``chunk_size`` rows at a time, ``ordered_ssd.reference.canonical``); this module is for the
rest of a model, e.g. the ``lm_head`` of ``MambaLMHeadModel`` or ``Mamba2ForCausalLM``
(``convert_to_ordered(model, invariant_linears=True)``).

How (the CPU and any non-CUDA device): the rows are taken :data:`INVARIANT_LINEAR_BLOCK_ROWS` at a time
(zero-padded), and each block is one ``torch.bmm`` of ``[16, 1, in] x [16, in, out]``: every row is its own
matrix product of one row, computed by the same call with the same shapes whatever the number of rows, then the
bias is added. About 3x the time of ``F.linear`` on the CPU. Backward: plain autograd (the input gradient is
row-invariant the same way; the weight gradient is deterministic, summed block by block in autograd's order, and
depends on the layout).

CUDA: the row-count-invariant Triton GEMM (:mod:`ordered_ssd.ops.row_invariant_gemm`: fixed tiles, no split-K)
for the output and the input gradient, through :func:`ordered_ssd.ops.ordered_linear` (the rows as one example:
the weight gradient is its ordered fold over segments of rows, deterministic, and depends on the layout); CUDA
autocast as ``F.linear``'s.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.row_invariant_gemm import ROW_INVARIANT_BLOCK_ROWS, row_invariant_matmul

__all__ = ["INVARIANT_LINEAR_BLOCK_ROWS", "invariant_linear", "InvariantLinear", "invariant_rms_norm",
           "InvariantRMSNorm"]

#: Rows per block of :func:`invariant_linear` off CUDA (each row is still its own one-row product; the block only
#: bounds the launches).
INVARIANT_LINEAR_BLOCK_ROWS = ROW_INVARIANT_BLOCK_ROWS


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x W^T + b`` with each output row's bits a function of that row of ``x`` (and ``W``, ``b``) alone.

    Args:
        x: [..., in_features], floating point; weight: [out_features, in_features]; bias: [out_features] or None;
            all of one dtype and device.

    Returns:
        [..., out_features] in ``x``'s dtype.

    Raises:
        TypeError: a non-tensor, or a non-floating or mixed dtype (mixed is allowed under CUDA autocast).
        ValueError: ``weight`` not 2-d, ``x``'s last dimension not ``in_features``, a ``bias`` of another shape,
            mixed devices.

    Determinism: the same row gives the same bits in any number of rows, at any position among them, in any
    process (one torch build, CPU model and thread count).
    """
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
        if t.dtype != x.dtype and not (x.is_cuda and torch.is_autocast_enabled("cuda")):  # autocast casts them
            raise TypeError(f"{name}: expected x's dtype {x.dtype}, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected 2-d [out_features, in_features], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x: expected last dimension in_features = {weight.shape[1]}, got shape {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if x.device.type == "cuda":
        from ..ops.linear import ordered_linear

        rows = x.reshape(1, -1, weight.shape[1])
        return ordered_linear(rows, weight, bias, row_invariant=True).reshape(*x.shape[:-1], weight.shape[0])
    lead = x.shape[:-1]
    rows = x.reshape(-1, weight.shape[1])
    R, blk = rows.shape[0], INVARIANT_LINEAR_BLOCK_ROWS
    nblocks = -(-R // blk)
    padded = F.pad(rows, (0, 0, 0, nblocks * blk - R)).reshape(nblocks, blk, 1, weight.shape[1])
    w = weight.t().expand(blk, *weight.t().shape)
    out = torch.cat([torch.bmm(padded[i], w)[:, 0] for i in range(nblocks)], dim=0)[:R] if R else \
        rows.new_empty(0, weight.shape[0])
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


class InvariantLinear(nn.Linear):
    """``nn.Linear`` computed by :func:`invariant_linear` (same constructor, parameters and ``state_dict``).

    :meth:`from_linear` makes one from an ``nn.Linear`` holding the same parameter objects (tied weights stay tied).
    Raises as :func:`invariant_linear`.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return invariant_linear(x, self.weight, self.bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "InvariantLinear":
        """An :class:`InvariantLinear` holding ``linear``'s ``weight`` and ``bias`` objects, in its train/eval mode.

        Raises: TypeError: ``linear`` is not an ``nn.Linear``."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new


class _RowSumOfSquares(torch.autograd.Function):
    """``s[m] = sum_k h[m, k]^2`` (fp32 ``h`` [M, D] -> [M, 1]) by the row-invariant GEMM against a column of ones
    (IEEE fp32 products in a fixed ``K`` order on CUDA; one one-row product per row elsewhere); ``dh = 2 h ds``."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return row_invariant_matmul(h * h, h.new_ones(h.shape[1], 1))

    @staticmethod
    def backward(ctx, ds):
        (h,) = ctx.saved_tensors
        return 2 * h * ds


def invariant_rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, *,
                       style: str = "torch") -> torch.Tensor:
    """RMSNorm over the last dimension with each row's bits a function of that row alone: the mean of squares is a
    row-invariant sum (:func:`~ordered_ssd.ops.row_invariant_gemm.row_invariant_matmul` against ones, in fp32), not a
    reduction kernel that a library may partition by the number of rows (torch's CUDA reductions do).

    Args:
        x: [..., D] floating; weight: [D] or None; eps: float.
        style: ``"torch"`` (``torch.nn.RMSNorm``: ``(h * rsqrt(mean(h^2) + eps)) * weight`` in fp32, then cast to
            ``x``'s dtype) or ``"hf"`` (``transformers``' ``Mamba2RMSNorm`` / ``LlamaRMSNorm``: the normalised fp32
            ``h`` cast to ``x``'s dtype, then times ``weight``).

    Returns [..., D] (``"torch"``: ``x``'s dtype; ``"hf"``: the promotion of ``weight``'s and ``x``'s).
    Raises: TypeError: ``x`` not a floating tensor. ValueError: ``style`` unknown, ``weight`` of another shape.
    Determinism: as :func:`invariant_linear` (the output and the input gradient); the weight gradient is autograd's
    sum over rows (deterministic, depends on the layout).
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x: expected a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if style not in ("torch", "hf"):
        raise ValueError(f"style: expected 'torch' or 'hf', got {style!r}")
    D = x.shape[-1]
    if weight is not None and tuple(weight.shape) != (D,):
        raise ValueError(f"weight: expected shape ({D},), got {tuple(weight.shape)}")
    h = x.reshape(-1, D).to(torch.promote_types(x.dtype, torch.float32))  # fp32 (fp64 stays fp64)
    rstd = torch.rsqrt(_RowSumOfSquares.apply(h) / D + eps)
    if style == "hf":
        out = (h * rstd).to(x.dtype)
        return (weight * out if weight is not None else out).reshape(x.shape)
    out = h * rstd
    if weight is not None:
        out = out * weight
    return out.to(x.dtype).reshape(x.shape)


class InvariantRMSNorm(nn.Module):
    """An RMSNorm (``torch.nn.RMSNorm`` or ``transformers``' ``Mamba2RMSNorm``) computed by
    :func:`invariant_rms_norm`, holding the original's ``weight`` object (same ``state_dict``).
    :meth:`from_module` makes one; ``convert_to_ordered(model, invariant_linears=True)`` swaps them in."""

    def __init__(self, weight: Optional[nn.Parameter], eps: float, style: str):
        if style not in ("torch", "hf"):
            raise ValueError(f"style: expected 'torch' or 'hf', got {style!r}")
        super().__init__()
        self.weight = weight
        self.eps, self.style = float(eps), style

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return invariant_rms_norm(x, self.weight, self.eps, style=self.style)

    @staticmethod
    def swappable(module: nn.Module) -> bool:
        """Whether :meth:`from_module` takes ``module`` (the classes themselves, not subclasses)."""
        if type(module) is nn.RMSNorm:
            return len(module.normalized_shape) == 1
        return type(module).__name__ == "Mamba2RMSNorm" and type(module).__module__.startswith("transformers.")

    @classmethod
    def from_module(cls, module: nn.Module) -> "InvariantRMSNorm":
        """From an ``nn.RMSNorm`` (``eps`` None: ``torch.finfo`` of the input's dtype is not known here, so its
        fp32 value) or a ``Mamba2RMSNorm``. Raises: TypeError: another module."""
        if type(module) is nn.RMSNorm:
            if len(module.normalized_shape) != 1:
                raise TypeError(f"module: expected an RMSNorm over the last dimension, got normalized_shape "
                                f"{module.normalized_shape}")
            eps = module.eps if module.eps is not None else torch.finfo(torch.float32).eps
            new = cls(module.weight, eps, "torch")
        elif cls.swappable(module):
            new = cls(module.weight, module.variance_epsilon, "hf")
        else:
            raise TypeError(f"module: expected torch.nn.RMSNorm or transformers' Mamba2RMSNorm, got "
                            f"{type(module).__name__}")
        new.train(module.training)
        return new
