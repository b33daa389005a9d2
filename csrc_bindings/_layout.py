"""Layout copies for the launchers: one tiled Triton kernel that copies a 3-d tensor into another of any strides.

causal-conv1d's channel-first backward (the one with a single writer per weight address, see
:mod:`csrc_bindings.causal_conv1d`) needs ``[1, D, L]`` inputs with stride 1 along ``L``, while Mamba-2 keeps ``xBC``
and its gradient channel-last
(``[B, L, D]`` memory). torch's ``copy_`` of such a transposed view is a non-vectorised elementwise kernel whose
reads or writes are strided; :func:`copy3d` instead moves ``[BLOCK_I, BLOCK_J]`` tiles, so both the load and the
store are coalesced, and it copies a whole group of examples in one launch.

A copy moves bytes and does no arithmetic: the destination has the bits of the source, whatever the kernel.
"""
from __future__ import annotations

import contextlib

import torch

from ._util import cdiv, check

__all__ = ["copy3d", "aligned_channel_first", "aligned_example_stride", "is_aligned_channel_first", "GROUP_BYTES"]

#: Upper bound on the bytes of the channel-first group buffers (``x``, ``dout``, ``dx``) that
#: ``launch_causal_conv1d_bwd_per_example`` holds at once; the group size is a function of the shape alone.
GROUP_BYTES = 64 << 20

_BLOCK_I, _BLOCK_J, _WARPS = 64, 64, 4
_KERNEL = None


def _copy3d_kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def copy3d_kernel(src, dst, I, J, s_b, s_i, s_j, d_b, d_i, d_j,
                          BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
            oj = (tl.program_id(0) * BLOCK_J + tl.arange(0, BLOCK_J)).to(tl.int64)
            oi = (tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)).to(tl.int64)
            b = tl.program_id(2).to(tl.int64)
            mask = (oi[:, None] < I) & (oj[None, :] < J)
            v = tl.load(src + b * s_b + oi[:, None] * s_i + oj[None, :] * s_j, mask=mask)
            tl.store(dst + b * d_b + oi[:, None] * d_i + oj[None, :] * d_j, v, mask=mask)

        _KERNEL = (triton, copy3d_kernel)
    return _KERNEL


def copy3d(src: torch.Tensor, dst: torch.Tensor, *, use_triton: bool | None = None) -> torch.Tensor:
    """``dst[b, i, j] = src[b, i, j]`` for 3-d tensors of the same shape and dtype and any strides; returns ``dst``.

    On CUDA (or with ``use_triton=True``, e.g. under ``TRITON_INTERPRET=1`` on the CPU) one launch of a tiled
    Triton kernel, grid ``(ceil(J / 64), ceil(I / 64), B)``; elsewhere ``dst.copy_(src)``. The destination must
    not overlap the source.

    Raises:
        ValueError: different shapes, dtypes or devices, not 3-d, or ``B`` or ``ceil(I / 64)`` over 65535 (the
            grid's y and z limits).
    """
    check(src.dim() == 3 and dst.dim() == 3, f"src, dst: expected 3-d tensors, got {src.dim()}-d and {dst.dim()}-d")
    check(src.shape == dst.shape, f"dst: expected the shape of src {list(src.shape)}, got {list(dst.shape)}")
    check(src.dtype == dst.dtype, f"dst: expected the dtype of src {src.dtype}, got {dst.dtype}")
    check(src.device == dst.device, f"dst: expected the device of src {src.device}, got {dst.device}")
    if use_triton is None:
        use_triton = src.device.type == "cuda"
    if not use_triton:
        dst.copy_(src)
        return dst
    B, I, J = src.shape
    if src.numel() == 0:
        return dst
    check(B <= 65535, f"src: expected at most 65535 in dim 0 (grid z), got {B}")
    check(cdiv(I, _BLOCK_I) <= 65535, f"src: expected at most {65535 * _BLOCK_I} in dim 1 (grid y), got {I}")
    triton, kernel = _copy3d_kernel()
    grid = (cdiv(J, _BLOCK_J), cdiv(I, _BLOCK_I), B)
    ctx = torch.cuda.device(src.device) if src.device.type == "cuda" else contextlib.nullcontext()
    with ctx:
        kernel[grid](src, dst, I, J, *src.stride(), *dst.stride(), BLOCK_I=_BLOCK_I, BLOCK_J=_BLOCK_J,
                     num_warps=_WARPS)
    return dst


def aligned_example_stride(dim: int, seqlen: int, element_size: int) -> int:
    """Elements between consecutive examples of a channel-first group buffer: ``D * L`` rounded up so every
    example starts on a 16-byte boundary (causal-conv1d's vectorised loads assume an aligned row start)."""
    return cdiv(dim * seqlen * element_size, 16) * 16 // element_size


def is_aligned_channel_first(t: torch.Tensor) -> bool:
    """``t`` ``[B, D, L]`` has stride 1 along ``L`` (also when ``L == 1``: causal-conv1d picks its channel-last kernel
    whenever ``stride(1) == 1 and stride(2) > 1``), ``L`` along ``D``, and every example starts 16-byte aligned."""
    B, D, L = t.shape
    element_size = t.element_size()
    return t.stride(2) == 1 and (t.stride(1) == L or D <= 1) and t.data_ptr() % 16 == 0 and (
        B <= 1 or ((t.stride(0) * element_size) % 16 == 0 and t.stride(0) >= D * L))


def aligned_channel_first(t: torch.Tensor, *, use_triton: bool | None = None) -> torch.Tensor:
    """``t`` ``[B, D, L]`` itself if :func:`is_aligned_channel_first`, else a copy into a new buffer of strides
    ``(aligned_example_stride, L, 1)`` made by :func:`copy3d`."""
    if is_aligned_channel_first(t):
        return t
    B, D, L = t.shape
    buf = torch.empty_strided((B, D, L), (aligned_example_stride(D, L, t.element_size()), L, 1), dtype=t.dtype,
                              device=t.device)
    return copy3d(t, buf, use_triton=use_triton)
