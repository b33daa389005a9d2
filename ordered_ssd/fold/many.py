"""Batched folds: :func:`fold_many` (independent :func:`~ordered_ssd.fold.fold_dims` folds in one launch) and
:func:`fold_example_sums` (the projection bias's fold of per-example folds, two launches).

A training step folds a handful of small partial tensors at the same point of the backward (the gradients of
``A_log``, ``dt_bias``, ``D``, the RMSNorm weight, the conv weight and bias; the per-position tile partials of the
SSD backward). On CUDA each :func:`~ordered_ssd.fold.fold_dims` is one launch, plus a transposing copy when the
folded axis is not the leading one. :func:`fold_many` runs up to eight of them as one Triton launch
(:func:`~ordered_ssd.fold.kernels.fold_many_kernel`) that reads every partial in place, through its strides:
output element ``m`` of fold ``i`` is the same sequential fp32 sum, from +0.0, over the same partials in the same
(lexical) order as :func:`~ordered_ssd.fold.fold_dims` computes it, so every result has its bits. Which programs of
the launch own which outputs (bit-neutral) is all that differs. Off CUDA (or for fp64 accumulation) it is the
:func:`~ordered_ssd.fold.fold_dims` loop itself.
"""
from __future__ import annotations

import functools
import math
from typing import List, Optional, Sequence, Tuple

import torch

from csrc_bindings import _launch_cache  # imports nothing native
from csrc_bindings._native import device_guard  # imports nothing native
from csrc_bindings._util import next_pow2  # imports nothing native

from .primitives import LexicalFold, _fold_rows, fold_axes, fold_dims, normalize_dims
from .settings import accumulation_dtype

__all__ = ["fold_many", "fold_example_sums", "FOLD_MANY_MAX"]

#: How many folds one launch of :func:`fold_many` takes (a larger request is split into launches of this many).
FOLD_MANY_MAX = 8
_BLOCK = 256
#: positions per iteration of :func:`~ordered_ssd.fold.kernels.example_sums_kernel`'s loop (bit-neutral: how many
#: loads are in flight before their additions; ``benchmarks/example_sums_bench.py`` times 16 to 256)
_EXAMPLE_SUMS_UNROLL = 256


def _runs(sizes: Sequence[int], strides: Sequence[int]) -> List[Tuple[int, int]]:
    """``[(size, stride)]`` of the axes, in order, without size-1 axes, adjacent axes merged where one stride walks
    both (``stride_a == size_b * stride_b``): the same index order, fewer axes."""
    runs: List[Tuple[int, int]] = []
    for n, s in zip(sizes, strides):
        if n == 1:
            continue
        if runs and runs[-1][1] == n * s:
            runs[-1] = (runs[-1][0] * n, s)
        else:
            runs.append((n, s))
    return runs


def _two(runs, total: int):
    """``(outer, s_outer, inner, s_inner)`` of at most two runs (inner 1 for one run, both 1 for none)."""
    if not runs:
        return 1, 0, 1, 0
    if len(runs) == 1:
        return total, runs[0][1], 1, 0
    (no, so), (ni, si) = runs
    return no, so, ni, si


@functools.lru_cache(maxsize=4096)
def _layout_of(shape: Tuple[int, ...], strides: Tuple[int, ...], dims: Tuple[int, ...]):
    """``(copy, KO, KI, M, MI, s_ko, s_ki, s_mo, s_mi, out_shape)`` of the fold over the normalized axes ``dims``
    of a tensor of this shape and these strides: at most two runs of partials and two runs of outputs, or, with
    ``copy``, the strides of a copy in ``fold_dims``'s ``[K, M]`` layout (when either side needs more: the same
    values in the same order). A function of the metadata alone, kept per (shape, strides, dims)."""
    keep = [d for d in range(len(shape)) if d not in dims]
    out_shape = tuple(shape[d] for d in keep)
    K, M = math.prod(shape[d] for d in dims), math.prod(out_shape)
    krun = _runs([shape[d] for d in dims], [strides[d] for d in dims])
    mrun = _runs(out_shape, [strides[d] for d in keep])
    copy = len(krun) > 2 or len(mrun) > 2
    if copy:
        krun, mrun = _runs([K], [M]), _runs([M], [1])
    KO, s_ko, KI, s_ki = _two(krun, K)
    MO, s_mo, MI, s_mi = _two(mrun, M)
    return copy, KO, KI, M, MI, s_ko, s_ki, s_mo, s_mi, out_shape


def _layout(t: torch.Tensor, dims: Tuple[int, ...]):
    """``(t_or_copy, KO, KI, M, MI, s_ko, s_ki, s_mo, s_mi, out_shape)`` of the fold of ``t`` over the normalized
    axes ``dims`` (:func:`_layout_of`; ``t_or_copy`` the copy where it says so)."""
    copy, *rest = _layout_of(tuple(t.shape), t.stride(), dims)
    if copy:
        keep, _, K = fold_axes(t, dims)
        t = t.permute(*dims, *keep).reshape(K, rest[2]).contiguous()
    return (t, *rest)


def fold_many(requests: Sequence[Optional[tuple]], *,
              use_triton: Optional[bool] = None) -> List[Optional[torch.Tensor]]:
    """``[fold_dims(t, dims, dtype) for (t, dims[, dtype]) in requests]`` with every CUDA fold of fp32 accumulation
    in as few launches as possible (one per :data:`FOLD_MANY_MAX` folds).

    Args:
        requests: each ``(t, dims)`` or ``(t, dims, dtype)`` as :func:`~ordered_ssd.fold.fold_dims` takes them
            (``dtype`` default ``t.dtype``), or None (its result is None).
        use_triton: launch :func:`~ordered_ssd.fold.kernels.fold_many_kernel` (default: when the partials are on
            CUDA; ``True`` on the CPU runs it under ``TRITON_INTERPRET=1``).

    Returns:
        One result per request, each with the bits of :func:`~ordered_ssd.fold.fold_dims` on the same arguments
        (a separate, contiguous tensor).

    Raises:
        ValueError: ``dims`` names an axis twice. IndexError: an axis out of range. TypeError: a non-float ``dtype``.
    """
    results: List[Optional[torch.Tensor]] = [None] * len(requests)
    fused = []
    for i, req in enumerate(requests):
        if req is None:
            continue
        t, dims = req[0], normalize_dims(req[0], req[1])
        dtype = req[2] if len(req) > 2 and req[2] is not None else t.dtype
        triton_ok = use_triton if use_triton is not None else t.device.type == "cuda"
        if not triton_ok or accumulation_dtype(dtype) != torch.float32:
            results[i] = fold_dims(t, dims, dtype=dtype)
        else:
            fused.append((i, t, dims, dtype))
    for first in range(0, len(fused), FOLD_MANY_MAX):
        group = fused[first:first + FOLD_MANY_MAX]
        outs = _launch([(t, dims) for _, t, dims, _ in group])
        for (i, _, _, dtype), (acc, shape) in zip(group, outs):
            results[i] = acc.to(dtype).reshape(shape)
    return results


def _launch(folds):
    """One :func:`~ordered_ssd.fold.kernels.fold_many_kernel` launch for ``folds`` = ``[(t, dims)]`` (at most
    :data:`FOLD_MANY_MAX`); returns ``[(acc fp32 [M], out_shape)]``."""
    from . import kernels  # imports triton: only here

    args, outs, blocks = [], [], 0
    for t, dims in folds:
        t, KO, KI, M, MI, s_ko, s_ki, s_mo, s_mi, shape = _layout(t, dims)
        acc = torch.empty(M, dtype=torch.float32, device=t.device)
        outs.append((acc, shape))
        args += [t, acc, KO, KI, M, MI, s_ko, s_ki, s_mo, s_mi]
        blocks += -(-M // _BLOCK)
    if blocks == 0:
        return outs
    args += [None] * (10 * (FOLD_MANY_MAX - len(folds)))
    ref = folds[0][0]
    with device_guard(ref):
        _launch_cache.launch(kernels.fold_many_kernel, (blocks,), args, dict(NFOLDS=len(folds), BLOCK=_BLOCK), ref,
                             num_warps=4)
    return outs


def fold_example_sums(t: torch.Tensor, dtype: torch.dtype, *, use_triton: Optional[bool] = None) -> torch.Tensor:
    """``fold_e(fold_l(t[e, l]))`` [M]: per example a fold over its positions in order from +0.0, in fp32, then the
    lexical fold of those per-example sums in :func:`~ordered_ssd.fold.accumulation_dtype` of ``dtype`` from +0.0,
    cast once to ``dtype``: the order of the projection bias's gradient
    (:func:`~ordered_ssd.ops.linear.ordered_linear_weight_grad`).

    Args:
        t: ``[E, L, M]``, any float dtype and strides (on the Triton path, a copy with a unit-stride last dim when
            it has another, so that the kernel's load of a position's features is coalesced: the same values).
            dtype: the dtype of the result (the bias's).
        use_triton: two launches (default: on CUDA with an fp32 accumulation; ``True`` on the CPU runs the first
            under ``TRITON_INTERPRET=1`` and the second as a PyTorch loop of the same additions):
            :func:`~ordered_ssd.fold.kernels.example_sums_kernel`, one program per
            ``(example, block of m)``, writes each example's sum [E, M], then ``fold_kernel`` folds those over the
            examples, example 0 first. Otherwise one :func:`~ordered_ssd.fold.fold_dims` per example folded by
            :class:`~ordered_ssd.fold.LexicalFold` (the same additions in the same order; ``E + 1`` launches on
            CUDA).

    Returns:
        ``[M]`` in ``dtype`` (zeros for ``E == 0``).

    Raises:
        ValueError: on the Triton path, ``M`` over 65535 blocks of 256 features (the launch grid's second axis).
    """
    E, L, M = t.shape
    acc_dtype = accumulation_dtype(dtype)
    triton_ok = use_triton if use_triton is not None else t.device.type == "cuda"
    if not triton_ok or acc_dtype != torch.float32:
        folder = LexicalFold(dtype)
        for e in range(E):
            folder.add(fold_dims(t[e], 0, dtype=torch.float32))  # the example's positions in order
        return folder.result(like=torch.empty(M, device=t.device))
    if not E or not M:
        return torch.zeros(M, dtype=dtype, device=t.device)
    block = _example_sums_block(M)
    if -(-M // block) > 65535:
        raise ValueError(f"t: expected at most {65535 * block} features (the last dim) on the Triton path, got {M}")
    if M > 1 and t.stride(2) != 1:  # bit-neutral: the kernel loads a position's M features at once, coalesced
        t = t.contiguous()
    return _fold_rows(example_sums(t), None, torch.float32).to(dtype)


def _example_sums_block(M: int) -> int:
    """Features per program of :func:`example_sums` (bit-neutral: which elements a program owns)."""
    return min(_BLOCK, max(32, next_pow2(M)))


def example_sums(t: torch.Tensor, unroll: int = _EXAMPLE_SUMS_UNROLL) -> torch.Tensor:
    """The first launch of :func:`fold_example_sums`: each example's fp32 sum over its positions in order,
    ``[E, M]``, from ``t`` [E, L, M] on CUDA as it is laid out (:func:`~ordered_ssd.fold.kernels.example_sums_kernel`;
    ``unroll`` positions per loop iteration, bit-neutral; ``benchmarks/example_sums_bench.py`` times it). No checks:
    :func:`fold_example_sums` makes them."""
    from . import kernels  # imports triton: only here
    E, L, M = t.shape
    block = _example_sums_block(M)
    sums = torch.empty(E, M, dtype=torch.float32, device=t.device)
    with device_guard(t):
        _launch_cache.launch(kernels.example_sums_kernel, (E, -(-M // block)),
                             (t, sums, L, M, t.stride(0), t.stride(1), t.stride(2)),
                             dict(BLOCK=block, UNROLL=unroll), t, num_warps=block // 32)
    return sums
