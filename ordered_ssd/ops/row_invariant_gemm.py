"""The row-count-invariant GEMM: :func:`row_invariant_matmul` and :func:`row_invariant_linear`.

Why: cuBLAS chooses its kernel, its tiles and split-K by the problem's shape, so ``F.linear`` may give a row other
bits when the number of rows changes (a sequence batched with others, packed, or decoded one row at a time). For
the projections of a sequence-invariant layer (``OrderedMamba2.sequence_invariant``) and for
:class:`~ordered_ssd.modules.invariant.InvariantLinear` on CUDA, ordered-ssd runs its own Triton kernel
(:mod:`ordered_ssd.ops._gemm_kernels`) at the pinned configuration :data:`ROW_INVARIANT_GEMM_CONFIGS` (an
order-deciding setting, so it lives in :mod:`ordered_ssd.fold.settings`): fixed tiles,
the ``K`` loop in order from 0, no split-K, no choice by shape, fp32 accumulation (IEEE fp32 products for fp32
inputs, like ``F.linear`` without TF32), the bias added to the fp32 accumulator, one rounding. An output row's bits
depend on that input row (and the weight) alone: not on the number of rows, nor on the row's position among them.

Off CUDA, :func:`row_invariant_matmul` computes each row as its own one-row ``torch.bmm`` in blocks of
:data:`ROW_INVARIANT_BLOCK_ROWS` rows (the CPU's matmul also chooses by shape).

The bits are those of this kernel, not cuBLAS's: within fp32-accumulation rounding of ``F.linear``, not equal to it.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..fold.settings import ROW_INVARIANT_GEMM_CONFIGS, RowInvariantGemmConfig

__all__ = ["RowInvariantGemmConfig", "ROW_INVARIANT_GEMM_CONFIGS", "ROW_INVARIANT_BLOCK_ROWS", "row_invariant_matmul",
           "row_invariant_linear"]


#: Rows per block of the off-CUDA path (each row is still its own one-row product; the block only bounds the
#: launches).
ROW_INVARIANT_BLOCK_ROWS = 16


def _check(name, t, like=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    if like is not None:
        if t.dtype != like.dtype:
            raise TypeError(f"{name}: expected dtype {like.dtype} (a's), got {t.dtype}")
        if t.device != like.device:
            raise ValueError(f"{name}: expected device {like.device} (a's), got {t.device}")


def row_invariant_matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a @ b (+ bias)`` with each output row's bits a function of that row of ``a`` (and ``b``, ``bias``) alone.

    Args:
        a: ``[M, K]``; b: ``[K, N]``; bias: ``[N]`` or None. One floating dtype (bf16, fp16 or fp32 on CUDA; any
            float dtype elsewhere) and device; any strides (``b`` may be a transposed weight, ``W.t()``).

    Returns:
        ``[M, N]`` contiguous, in ``a``'s dtype.

    Raises:
        TypeError: a non-tensor, a non-floating or mixed dtype, a CUDA dtype without a configuration (fp64).
        ValueError: not 2-d, ``K`` mismatched, a wrong ``bias`` shape, mixed devices.

    No autograd (a plain function: :func:`ordered_ssd.ops.ordered_linear` with ``row_invariant=True`` is the
    differentiable form).

    Determinism: on CUDA one launch of the kernel at :data:`ROW_INVARIANT_GEMM_CONFIGS` ``[dtype]``, bitwise the
    same for a row whatever ``M`` and its position (one GPU model, torch/triton versions); off CUDA one one-row
    product per row (one torch build, CPU model and thread count).
    """
    _check("a", a)
    _check("b", b, a)
    if bias is not None:
        _check("bias", bias, a)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a, b: expected 2-d tensors [M, K], [K, N], got shapes {tuple(a.shape)}, {tuple(b.shape)}")
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"b: expected {K} rows (a's K), got shape {tuple(b.shape)}")
    N = b.shape[1]
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias: expected shape ({N},), got {tuple(bias.shape)}")
    if a.device.type != "cuda":
        blk = ROW_INVARIANT_BLOCK_ROWS
        nblocks = -(-M // blk)
        if M == 0:
            out = a.new_empty(0, N)
        else:
            padded = F.pad(a, (0, 0, 0, nblocks * blk - M)).reshape(nblocks, blk, 1, K)
            w = b.expand(blk, K, N)
            out = torch.cat([torch.bmm(padded[i], w)[:, 0] for i in range(nblocks)], dim=0)[:M]
        return out + bias if bias is not None else out
    cfg = ROW_INVARIANT_GEMM_CONFIGS.get(a.dtype)
    if cfg is None:
        raise TypeError(f"a: the row-invariant CUDA GEMM takes bf16, fp16 or fp32, got {a.dtype}")
    out = torch.empty(M, N, dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(M, N))
    from . import _gemm_kernels  # imports triton: only here, on CUDA
    from csrc_bindings._native import device_guard

    grid = (_cdiv(M, cfg.block_m) * _cdiv(N, cfg.block_n),)
    bias = bias.contiguous() if bias is not None else None  # the kernel reads it with stride 1
    with device_guard(a.device):
        _gemm_kernels.row_invariant_mm_kernel[grid](
            a, b, bias if bias is not None else a, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            out.stride(0), out.stride(1), HAS_BIAS=bias is not None, IEEE=a.dtype == torch.float32,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def row_invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x W^T + b`` by :func:`row_invariant_matmul` (no autograd): x ``[..., in]``, weight ``[out, in]``, bias
    ``[out]`` or None; returns ``[..., out]`` in ``x``'s dtype. Raises as :func:`row_invariant_matmul`."""
    _check("x", x)
    _check("weight", weight)
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x: expected [..., {weight.shape[1] if weight.dim() == 2 else 'in'}] for weight of shape "
                         f"{tuple(weight.shape)}, got shape {tuple(x.shape)}")
    rows = x.reshape(-1, x.shape[-1])
    return row_invariant_matmul(rows, weight.t(), bias).reshape(*x.shape[:-1], weight.shape[0])
