"""The causal conv1d's weight/bias gradient as per-(example, tile) partials: ordered-ssd's own kernel and its order.

causal-conv1d's backward kernels add their per-block weight/bias gradients into one buffer with ``atomicAdd``
(``csrc/causal_conv1d_bwd.cu``), so the order of those sums varies from run to run. ordered-ssd computes them
itself: :func:`conv1d_grad_partials` writes one fp32 partial per (example ``b``, tile ``t`` of
:data:`~ordered_ssd.fold.CONV1D_BWD_TILE_L` positions), each summed one position at a time in position order, and
the caller folds them with :func:`~ordered_ssd.fold.fold_dims` over ``(b, t)``, ``b`` slowest (the lexical order of
:mod:`ordered_ssd.fold`), casting once. The tile is a shape-only constant, so example ``b``'s partials have the same
bits alone or in any batch.

Math (source: causal-conv1d's backward formula, ``causal_conv1d_bwd.cu``): the forward is
``out[d, l] = act(pre[d, l])``, ``pre[d, l] = bias[d] + sum_w weight[d, w] x[d, l - (W-1) + w]`` (taps before
position 0 are zero; with ``seq_idx``, taps whose id differs from ``seq_idx[l]`` are zero, as in causal-conv1d's
masked channel-last kernel). With ``g = dout * act'(pre)``:
``dweight[d, w] = sum_{b, l} g[b, d, l] x[b, d, l - (W-1) + w]`` (same masks) and ``dbias[d] = sum_{b, l} g[b, d, l]``.
"""
from __future__ import annotations

import torch

from csrc_bindings import _launch_cache  # imports nothing native
from csrc_bindings._native import device_guard  # imports nothing native

from .settings import CONV1D_BWD_BLOCK_D, CONV1D_BWD_NUM_WARPS, CONV1D_BWD_TILE_L

__all__ = ["conv1d_grad_partials", "conv1d_grad_partials_torch"]


def _check(x, weight, bias, dout, seq_idx):
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x: expected a 3-d [B, D, L] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    batch, dim, seqlen = x.shape
    if weight.dim() != 2 or weight.shape[0] != dim or not 2 <= weight.shape[1] <= 4:
        raise ValueError(f"weight: expected shape [D, W] with D = {dim} and W in 2..4, got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (dim,):
        raise ValueError(f"bias: expected shape [D] = {(dim,)}, got {tuple(bias.shape)}")
    if tuple(dout.shape) != tuple(x.shape):
        raise ValueError(f"dout: expected shape [B, D, L] = {tuple(x.shape)}, got {tuple(dout.shape)}")
    if seq_idx is not None and tuple(seq_idx.shape) != (batch, seqlen):
        raise ValueError(f"seq_idx: expected shape [B, L] = {(batch, seqlen)}, got {tuple(seq_idx.shape)}")
    return batch, dim, seqlen, weight.shape[1]


def conv1d_grad_partials(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dout: torch.Tensor, *,
                         seq_idx: torch.Tensor | None = None, silu: bool = False, literal: bool = False,
                         use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-(example, tile) fp32 partials of the causal conv1d's weight and bias gradients.

    Args:
        x: ``[B, D, L]`` (any strides: channel-first, or a channel-last view of ``[B, L, D]`` memory);
            fp32/fp16/bf16. weight: ``[D, W]``, ``W`` in 2..4. bias: ``[D]`` or None. dout: ``[B, D, L]``.
        seq_idx: ``[B, L]`` int32 packed-sequence ids or None (taps across an id change are zero).
        silu: the forward applied SiLU (``g = dout * silu'(pre)``; else ``g = dout``).
        literal: launch the kernel once per example (the literal path); same bits as one launch.
        use_triton: run the Triton kernel (default: when ``x`` is on CUDA; ``True`` on the CPU runs it under
            ``TRITON_INTERPRET=1``); otherwise :func:`conv1d_grad_partials_torch`, the same order in PyTorch.

    Returns:
        ``(dweight_partial [B, T, D, W], dbias_partial [B, T, D] or None)`` in fp32, ``T = ceil(L / TILE_L)``
        (:data:`~ordered_ssd.fold.CONV1D_BWD_TILE_L`). ``dweight = fold_dims(dweight_partial, (0, 1))``.

    Determinism: each partial is a sequential fp32 sum over its tile's positions in order, from +0.0, in its
    own registers (no operation mixes channels); the bits depend on the example's values and the shape only (never
    on ``B``, the other examples or the launch grid). On the GPU the Triton compiler may contract a product and a
    sum into one FMA, so the CUDA bits can differ from :func:`conv1d_grad_partials_torch`'s; they are fixed for a
    GPU model and triton version.

    Raises:
        ValueError: a shape other than the above (the message names the argument, expected and actual value).
    """
    batch, dim, seqlen, width = _check(x, weight, bias, dout, seq_idx)
    if use_triton is None:
        use_triton = x.is_cuda
    if not use_triton:
        return conv1d_grad_partials_torch(x, weight, bias, dout, seq_idx=seq_idx, silu=silu)
    from . import kernels  # imports triton: only here

    ntiles = -(-seqlen // CONV1D_BWD_TILE_L)
    dw = torch.empty(batch, ntiles, dim, width, dtype=torch.float32, device=x.device)
    db = torch.empty(batch, ntiles, dim, dtype=torch.float32, device=x.device) if bias is not None else None
    if dw.numel() == 0:
        return dw, db
    seq = seq_idx if seq_idx is not None else dw  # unused pointer without seq_idx
    s_sb, s_sl = (seq_idx.stride(0), seq_idx.stride(1)) if seq_idx is not None else (0, 0)
    ranges = [(b, b + 1) for b in range(batch)] if literal else [(0, batch)]
    with device_guard(x):
        for b0, b1 in ranges:
            grid = (b1 - b0, ntiles, -(-dim // CONV1D_BWD_BLOCK_D))
            _launch_cache.launch(
                kernels.conv1d_grad_partials_kernel, grid,
                (x[b0:b1], weight, bias if bias is not None else weight, dout[b0:b1],
                 seq[b0:b1] if seq_idx is not None else seq, dw[b0:b1], db[b0:b1] if db is not None else dw,
                 seqlen, dim, ntiles, x.stride(0), x.stride(1), x.stride(2), dout.stride(0), dout.stride(1),
                 dout.stride(2), s_sb, s_sl, weight.stride(0), weight.stride(1)),
                dict(W=width, HAS_BIAS=bias is not None, HAS_SEQ=seq_idx is not None, SILU=bool(silu),
                     TILE_L=CONV1D_BWD_TILE_L, BLOCK_D=CONV1D_BWD_BLOCK_D), x,
                num_warps=CONV1D_BWD_NUM_WARPS)
    return dw, db


def conv1d_grad_partials_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               dout: torch.Tensor, *, seq_idx: torch.Tensor | None = None,
                               silu: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The partials of :func:`conv1d_grad_partials` in PyTorch, in the kernel's order: the specification of that
    order and the oracle of its tests (any device).

    For every tile, position ``i = 0, 1, ..., TILE_L - 1`` of all tiles at once: the masked taps, ``pre`` summed
    oldest tap first, ``g``, then one fp32 addition per partial (positions past ``L`` add nothing). Same arguments
    and return value as :func:`conv1d_grad_partials`.
    """
    batch, dim, seqlen, width = _check(x, weight, bias, dout, seq_idx)
    tile = CONV1D_BWD_TILE_L
    ntiles = -(-seqlen // tile)
    f32 = torch.float32
    dev = x.device
    pad = width - 1
    xp = torch.zeros(batch, dim, pad + ntiles * tile, dtype=f32, device=dev)
    xp[..., pad:pad + seqlen] = x.to(f32)
    dp = torch.zeros(batch, dim, ntiles * tile, dtype=f32, device=dev)
    dp[..., :seqlen] = dout.to(f32)
    if seq_idx is not None:
        sp = torch.full((batch, pad + ntiles * tile), -1, dtype=torch.int64, device=dev)
        sp[:, pad:pad + seqlen] = seq_idx.to(torch.int64)
    w = weight.to(f32)  # [D, W]
    bias_f = bias.to(f32) if bias is not None else torch.zeros(dim, dtype=f32, device=dev)
    dw = torch.zeros(batch, ntiles, dim, width, dtype=f32, device=dev)
    db = torch.zeros(batch, ntiles, dim, dtype=f32, device=dev)
    starts = torch.arange(ntiles, device=dev) * tile
    for i in range(tile):
        pos = starts + i  # [T]
        valid = (pos < seqlen).view(1, ntiles, 1)
        lag = [xp[..., pad + pos - j].transpose(1, 2) for j in range(width)]  # m_j: [B, T, D], x[l - j]
        if seq_idx is not None:
            q0 = sp[:, pad + pos]
            lag = [lag[0]] + [torch.where((sp[:, pad + pos - j] == q0).unsqueeze(-1), lag[j], 0.0)
                              for j in range(1, width)]
        g = dp[..., pos].transpose(1, 2)
        if silu:
            pre = bias_f.expand_as(g)
            for j in range(width - 1, -1, -1):  # oldest tap first: weight[:, W-1-j] times x[l - j]
                pre = pre + w[:, width - 1 - j] * lag[j]
            sig = 1.0 / (1.0 + torch.exp(-pre))
            g = g * (sig * (1.0 + pre * (1.0 - sig)))
        for j in range(width):
            dw[..., width - 1 - j] += torch.where(valid, g * lag[j], 0.0)
        db += torch.where(valid, g, 0.0)
    return dw, (db if bias is not None else None)
