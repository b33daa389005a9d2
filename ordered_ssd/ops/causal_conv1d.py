"""Causal depthwise conv1d (+ SiLU) with ordered weight and bias gradients, on causal-conv1d's CUDA kernels.

Layers: composition (:func:`ordered_causal_conv1d_fwd`, :func:`ordered_causal_conv1d_bwd`; plain functions, no
autograd) → the custom op ``ordered_ssd::causal_conv1d`` (fake, autograd through
``ordered_ssd::causal_conv1d_backward``) → :func:`ordered_causal_conv1d`.

Determinism: causal-conv1d's channel-first backward ``atomicAdd``s every example's weight gradient into one buffer,
so the backward runs it once per example (or per packed sequence with ``seq_idx``), where every address has a
single writer (:func:`csrc_bindings.launch_causal_conv1d_bwd_per_example`), and folds the per-example fp32
partials in example order (:func:`ordered_ssd.fold.fold_dims`). Source: ``causal_conv1d.causal_conv1d_fn``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

import csrc_bindings

from ..fold import fold_dims
from .common import NAMESPACE, OP_TAGS, as_dtype_of, autocast_context, autocast_dtype, or_none, require_cuda

__all__ = ["ordered_causal_conv1d_fwd", "ordered_causal_conv1d_bwd", "ordered_causal_conv1d"]


# ------------------------------------------------------------------------------------------------ composition
def ordered_causal_conv1d_fwd(x, weight, bias, *, seq_idx=None, silu=False):
    """``out`` [B, D, L] of causal-conv1d's forward kernel at its pinned launch (no sum across examples)."""
    return csrc_bindings.launch_causal_conv1d_fwd(x, weight, bias, seq_idx=seq_idx, silu_activation=silu)


def ordered_causal_conv1d_bwd(x, weight, bias, dout, *, seq_idx=None, silu=False, dx=None):
    """Backward: ``(dx, dweight, dbias, dweight_partial, dbias_partial)``.

    ``dx`` [B, D, L] (written into ``dx`` when given); ``dweight`` [D, W] / ``dbias`` [D] (None without a bias):
    fp32 folds of the per-example (per-sequence) partials ``dweight_partial`` [S, D, W] / ``dbias_partial`` [S, D]
    in order, cast once to the parameter dtype.
    """
    dx, dweight_partial, dbias_partial, _ = csrc_bindings.launch_causal_conv1d_bwd_per_example(
        x, weight, bias, dout, silu_activation=silu, seq_idx=seq_idx, dx=dx)
    dweight = fold_dims(dweight_partial, 0, dtype=weight.dtype)
    dbias = fold_dims(dbias_partial, 0, dtype=bias.dtype) if bias is not None else None
    return dx, dweight, dbias, dweight_partial, dbias_partial


# --------------------------------------------------------------------------------------------- custom op
@torch.library.custom_op(f"{NAMESPACE}::causal_conv1d", mutates_args=(), tags=OP_TAGS)
def _causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   seq_idx: Optional[torch.Tensor], silu: bool, autocast: Optional[torch.dtype]) -> torch.Tensor:
    with autocast_context(autocast):
        return ordered_causal_conv1d_fwd(x, weight, bias, seq_idx=seq_idx, silu=silu)  # torch.empty_like(x)


@_causal_conv1d.register_fake
def _(x, weight, bias, seq_idx, silu, autocast):
    return torch.empty_like(x)  # the launcher's allocation: the layout of x (channel-first or channel-last)


@torch.library.custom_op(f"{NAMESPACE}::causal_conv1d_backward", mutates_args=(), tags=OP_TAGS)
def _causal_conv1d_backward(dout: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                            seq_idx: Optional[torch.Tensor], silu: bool, autocast: Optional[torch.dtype]
                            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with autocast_context(autocast):
        dx, dweight, dbias, _, _ = ordered_causal_conv1d_bwd(x, weight, bias, dout, seq_idx=seq_idx, silu=silu)
    return (dx.to(x.dtype), *as_dtype_of((dweight, dbias), (weight, bias), x))  # dx: torch.empty_like(x)


@_causal_conv1d_backward.register_fake
def _(dout, x, weight, bias, seq_idx, silu, autocast):
    dbias = torch.empty_like(bias, memory_format=torch.contiguous_format) if bias is not None else x.new_empty(
        (0,), dtype=torch.float32)
    return torch.empty_like(x), torch.empty_like(weight, memory_format=torch.contiguous_format), dbias


def _causal_conv1d_setup_context(ctx, inputs, output):
    x, weight, bias, seq_idx, silu, autocast = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx)
    ctx.silu, ctx.autocast = silu, autocast


def _causal_conv1d_bwd(ctx, dout):
    x, weight, bias, seq_idx = ctx.saved_tensors
    dx, dweight, dbias = _causal_conv1d_backward(dout, x, weight, bias, seq_idx, ctx.silu, ctx.autocast)
    return dx, dweight, or_none(dbias, bias), None, None, None


_causal_conv1d.register_autograd(_causal_conv1d_bwd, setup_context=_causal_conv1d_setup_context)


# --------------------------------------------------------------------------------------------- public function
def ordered_causal_conv1d(x, weight, bias=None, seq_idx=None, activation=None):
    """``causal_conv1d_fn`` with ordered gradients.

    Args:
        x: [B, D, L] CUDA tensor (channel-first, or a channel-last view of [B, L, D] memory), fp32/fp16/bf16.
        weight: [D, W] with W in 2..4. bias: [D] or None. seq_idx: [B, L] int32 packed-sequence ids
            (non-decreasing rows) or None. activation: None, "silu" or "swish".

    Returns:
        [B, D, L], the dtype of ``x``.

    Raises:
        TypeError: ``x`` is not a tensor. ValueError: ``x`` not on CUDA; an unknown ``activation``; shapes the
        kernels reject (from :mod:`csrc_bindings`, naming the argument).

    Determinism: ``dweight``/``dbias`` are fp32 folds of per-example partials in example order.
    """
    require_cuda("x", x)
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    if x.stride(1) == 1 and (x.stride(0) % 8 or x.stride(2) % 8):
        # channel-last view whose strides causal-conv1d's channel-last kernel rejects: copy it channel-last
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif x.stride(1) != 1 and x.stride(2) != 1:
        x = x.contiguous()
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    return _causal_conv1d(x, weight, bias, seq_idx, activation is not None, autocast_dtype(x))
