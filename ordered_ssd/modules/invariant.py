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

CUDA: not implemented yet (a fixed-tile GEMM kernel without split-K is the plan, ``docs/guarantees.md``);
:func:`invariant_linear` raises ``NotImplementedError`` for CUDA tensors rather than run a row-count-dependent
kernel.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["INVARIANT_LINEAR_BLOCK_ROWS", "invariant_linear", "InvariantLinear"]

#: Rows per block of :func:`invariant_linear` (each row is still its own one-row product; the block only bounds
#: the launches).
INVARIANT_LINEAR_BLOCK_ROWS = 16


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x W^T + b`` with each output row's bits a function of that row of ``x`` (and ``W``, ``b``) alone.

    Args:
        x: [..., in_features], floating point; weight: [out_features, in_features]; bias: [out_features] or None;
            all of one dtype and device.

    Returns:
        [..., out_features] in ``x``'s dtype.

    Raises:
        TypeError: a non-tensor, or a non-floating or mixed dtype.
        ValueError: ``weight`` not 2-d, ``x``'s last dimension not ``in_features``, a ``bias`` of another shape,
            mixed devices.
        NotImplementedError: CUDA tensors (no row-invariant CUDA kernel yet).

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
        if t.dtype != x.dtype:
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
        raise NotImplementedError("invariant_linear: no row-invariant CUDA kernel yet; it runs on the CPU "
                                  "(docs/guarantees.md, \"A sequence's bits are its own\")")
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
    Raises as :func:`invariant_linear` (``NotImplementedError`` on CUDA).
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
