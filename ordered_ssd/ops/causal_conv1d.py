"""Causal depthwise conv1d (+ SiLU) with ordered weight and bias gradients, on causal-conv1d's CUDA kernels.

Layers: composition (:func:`ordered_causal_conv1d_fwd`, :func:`ordered_causal_conv1d_bwd`; plain functions, no
autograd) → the custom op ``ordered_ssd::causal_conv1d`` (fake, autograd through
``ordered_ssd::causal_conv1d_backward``) → :func:`ordered_causal_conv1d`.

Determinism: ``dx`` comes from causal-conv1d's backward, one launch for the whole batch
(:func:`csrc_bindings.launch_causal_conv1d_bwd_dx`; its ``dx`` has no atomics; the weight/bias gradients it adds
with ``atomicAdd`` are discarded). ``dweight``/``dbias`` come from ordered-ssd's own kernel: fp32 partials per
(example, tile of :data:`~ordered_ssd.fold.CONV1D_BWD_TILE_L` positions)
(:func:`ordered_ssd.fold.conv1d_grad_partials`), folded over (example, tile), example slowest
(:func:`ordered_ssd.fold.fold_many`: both in one launch), cast once. The number of launches does not depend on
``B`` or on the number of packed sequences, and nothing is read back to the host. Source:
``causal_conv1d.causal_conv1d_fn``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

import csrc_bindings

from ..fold import conv1d_grad_partials, fold_many
from .common import (as_dtype_of, autocast_context, autocast_dtype, call_op, check_causal_conv1d_args, or_none,
                     ordered_custom_op, register_op_autograd, require_cuda)

__all__ = ["ordered_causal_conv1d_fwd", "ordered_causal_conv1d_bwd", "ordered_causal_conv1d"]


# ------------------------------------------------------------------------------------------------ composition
def ordered_causal_conv1d_fwd(x, weight, bias, *, seq_idx=None, silu=False):
    """``out`` [B, D, L] of causal-conv1d's forward kernel at its pinned launch (no sum across examples)."""
    return csrc_bindings.launch_causal_conv1d_fwd(x, weight, bias, seq_idx=seq_idx, silu_activation=silu)


def _takes(t, channel_last):
    """Whether causal-conv1d's kernel of that layout takes ``t`` [B, D, L] as it is (channel-last: stride 1 in D,
    the other strides multiples of 8; channel-first: contiguous; both: a 16-byte aligned start)."""
    if t.data_ptr() % 16:
        return False
    if channel_last:
        return t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.stride(2) % 8 == 0
    return t.is_contiguous()


def _native_ready(t, channel_last):
    """``t`` itself when :func:`_takes` it, else a copy in that layout (a copy changes no value)."""
    if _takes(t, channel_last):
        return t
    if channel_last:
        return t.transpose(1, 2).clone(memory_format=torch.contiguous_format).transpose(1, 2)
    return t.clone(memory_format=torch.contiguous_format)


def _channel_last_bwd(x, seq_idx) -> bool:
    """Whether the backward runs causal-conv1d's channel-last kernel (always with ``seq_idx``)."""
    return seq_idx is not None or (x.stride(1) == 1 and x.stride(2) > 1)


def _dx_buffer(x, channel_last):
    """A fresh ``dx`` [B, D, L] in the layout of the backward's kernel (channel-last view of [B, L, D], or
    contiguous)."""
    batch, dim, seqlen = x.shape
    if channel_last:
        return torch.empty(batch, seqlen, dim, dtype=x.dtype, device=x.device).transpose(1, 2)
    return torch.empty(batch, dim, seqlen, dtype=x.dtype, device=x.device)


def ordered_causal_conv1d_bwd(x, weight, bias, dout, *, seq_idx=None, silu=False, dx=None, literal=False,
                              fold=True):
    """Backward: ``(dx, dweight, dbias, dweight_partial, dbias_partial)``.

    Args:
        x, dout: [B, D, L] (channel-last views of [B, L, D] memory, or channel-first; with ``seq_idx`` they are
            used channel-last). weight [D, W]; bias [D] or None; seq_idx [B, L] int32 or None; silu: the forward
            applied SiLU. dx: optional [B, D, L] output (written in place; computed in a fresh buffer and copied
            when causal-conv1d cannot write its layout). literal: launch both kernels once per example (the
            literal path; the same bits). fold: False leaves ``dweight``/``dbias`` None (for a caller that folds
            the partials itself, with others in one launch: :func:`conv1d_weight_folds`).

    Returns:
        ``dx`` [B, D, L]; ``dweight`` [D, W] / ``dbias`` [D] (None without a bias): the fp32 folds of
        ``dweight_partial`` [B, T, D, W] / ``dbias_partial`` [B, T, D] over (example, tile), example slowest,
        cast once to the parameter dtype (``T = ceil(L / CONV1D_BWD_TILE_L)``).

    Launches: one causal-conv1d backward and one partials kernel (``B`` of each with ``literal``) and one fold
    launch for both gradients (:func:`~ordered_ssd.fold.fold_many`), whatever ``B`` and the number of packed
    sequences (plus a copy of an input causal-conv1d does not take); nothing is read back to the host.

    Raises:
        ValueError: shapes that do not match (from :mod:`csrc_bindings` and :mod:`ordered_ssd.fold`, naming the
            argument); ``seq_idx`` not int32.
    """
    if seq_idx is not None and seq_idx.dtype != torch.int32:
        raise ValueError(f"seq_idx: expected dtype torch.int32, got {seq_idx.dtype}")
    channel_last = _channel_last_bwd(x, seq_idx)
    xr = _native_ready(x, channel_last)
    doutr = _native_ready(dout, channel_last)
    seq = seq_idx.contiguous() if seq_idx is not None else None
    out = dx
    if dx is None or not _takes(dx, channel_last):
        dx = _dx_buffer(x, channel_last)
    ranges = [(b, b + 1) for b in range(x.shape[0])] if literal else [(0, x.shape[0])]
    for b0, b1 in ranges:
        csrc_bindings.launch_causal_conv1d_bwd_dx(xr[b0:b1], weight, bias, doutr[b0:b1], silu_activation=silu,
                                                  seq_idx=seq[b0:b1] if seq is not None else None, dx=dx[b0:b1])
    if out is not None and out is not dx:
        out.copy_(dx)
        dx = out
    dweight_partial, dbias_partial = conv1d_grad_partials(xr, weight, bias, doutr, seq_idx=seq, silu=silu,
                                                          literal=literal)
    dweight = dbias = None
    if fold:
        dweight, dbias = fold_many(conv1d_weight_folds(weight, bias, dweight_partial, dbias_partial))
    return dx, dweight, dbias, dweight_partial, dbias_partial


def conv1d_weight_folds(weight, bias, dweight_partial, dbias_partial) -> list:
    """The :func:`~ordered_ssd.fold.fold_many` requests ``[dweight, dbias]`` of :func:`ordered_causal_conv1d_bwd`'s
    partials: folds over (example, tile), example slowest, cast once to the parameter's dtype (None without a
    bias)."""
    return [(dweight_partial, (0, 1), weight.dtype),
            (dbias_partial, (0, 1), bias.dtype) if bias is not None else None]


# --------------------------------------------------------------------------------------------- custom op
def _causal_conv1d_body(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                        seq_idx: Optional[torch.Tensor], silu: bool, autocast: Optional[torch.dtype]) -> torch.Tensor:
    with autocast_context(autocast):
        return ordered_causal_conv1d_fwd(x, weight, bias, seq_idx=seq_idx, silu=silu)  # torch.empty_like(x)


_causal_conv1d = ordered_custom_op("causal_conv1d", _causal_conv1d_body)


@_causal_conv1d.register_fake
def _(x, weight, bias, seq_idx, silu, autocast):
    return torch.empty_like(x)  # the launcher's allocation: the layout of x (channel-first or channel-last)


def _causal_conv1d_backward_body(dout: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                 bias: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor], silu: bool,
                                 autocast: Optional[torch.dtype]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with autocast_context(autocast):
        dx, dweight, dbias, _, _ = ordered_causal_conv1d_bwd(x, weight, bias, dout, seq_idx=seq_idx, silu=silu)
    return (dx, *as_dtype_of((dweight, dbias), (weight, bias), x))  # dx: _dx_buffer, dtype of x


_causal_conv1d_backward = ordered_custom_op("causal_conv1d_backward", _causal_conv1d_backward_body)


@_causal_conv1d_backward.register_fake
def _(dout, x, weight, bias, seq_idx, silu, autocast):
    dbias = torch.empty_like(bias, memory_format=torch.contiguous_format) if bias is not None else x.new_empty(
        (0,), dtype=torch.float32)
    dx = _dx_buffer(x, _channel_last_bwd(x, seq_idx))  # the composition's allocation
    return dx, torch.empty_like(weight, memory_format=torch.contiguous_format), dbias


def _causal_conv1d_setup_context(ctx, inputs, output):
    x, weight, bias, seq_idx, silu, autocast = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx)
    ctx.silu, ctx.autocast = silu, autocast


def _causal_conv1d_bwd(backward, ctx, dout):
    x, weight, bias, seq_idx = ctx.saved_tensors
    dx, dweight, dbias = backward(dout, x, weight, bias, seq_idx, ctx.silu, ctx.autocast)
    return dx, dweight, or_none(dbias, bias), None, None, None


_CausalConv1dFunction = register_op_autograd(_causal_conv1d, _causal_conv1d_body, _causal_conv1d_setup_context,
                                             _causal_conv1d_bwd, _causal_conv1d_backward, _causal_conv1d_backward_body)


# --------------------------------------------------------------------------------------------- public function
def ordered_causal_conv1d(x, weight, bias=None, seq_idx=None, activation=None):
    """``causal_conv1d_fn`` with ordered gradients.

    Args:
        x: [B, D, L] CUDA tensor (channel-first, or a channel-last view of [B, L, D] memory), fp32/fp16/bf16.
        weight: [D, W] with W in 2..4. bias: [D] or None. seq_idx: [B, L] int32 packed-sequence ids
            (a tap across a change of id is zero) or None; with it ``x`` is used channel-last (``D % 8 == 0``).
        activation: None, "silu" or "swish".

    Returns:
        [B, D, L], the dtype of ``x``.

    Raises:
        TypeError: a non-tensor or a dtype outside fp32/fp16/bf16. ValueError: a wrong shape, W outside 2..4, mixed
        devices, ``x`` of 2**31 elements or more (:func:`~ordered_ssd.ops.common.check_causal_conv1d_args`), then
        ``x`` not on CUDA, an unknown ``activation``; all before any kernel.

    Determinism: ``dweight``/``dbias`` are fp32 folds of per-(example, tile) partials in lexical order (see the
    module docstring); bitwise repeatable for a GPU model and the pinned versions.
    """
    check_causal_conv1d_args(x, weight, bias, seq_idx)
    require_cuda("x", x)
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    if x.stride(1) == 1 and (x.stride(0) % 8 or x.stride(2) % 8):
        # channel-last view whose strides causal-conv1d's channel-last kernel rejects: copy it channel-last
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif x.stride(1) != 1 and x.stride(2) != 1:
        x = x.contiguous()
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    return call_op(_causal_conv1d, _CausalConv1dFunction, x, weight, bias, seq_idx, activation is not None,
                   autocast_dtype(x))
