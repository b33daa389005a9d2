"""The fold primitives: every sum over a partition axis in ordered-ssd goes through these (see
:mod:`ordered_ssd.fold` for the order they implement)."""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch

from csrc_bindings import _launch_cache  # imports nothing native
from csrc_bindings._native import device_guard  # imports nothing native

from .settings import accumulation_dtype

__all__ = ["LexicalFold", "lexical_fold", "tree_fold", "fold_dims", "lexical_cumsum", "dA_cumsum_grad_scans"]


class LexicalFold:
    """Running left fold ``acc = (((+0.0 + p0) + p1) + ...)`` in the accumulation dtype.

    Partials must be added in lexical order (example-major, then chunk, then tile); the object
    does not reorder them. All partials must have the same shape.

    Args:
        dtype: dtype of the final gradient (the parameter's dtype). The accumulator is
            :func:`accumulation_dtype` of it.

    Determinism: for the same sequence of partials (same bits, same order) the result has the
    same bits on any device, in any process. Source: ordered-ssd design, "The contract", item 3.

    Raises:
        TypeError: ``dtype`` is not a floating-point ``torch.dtype``; :meth:`add` of a non-tensor.
        ValueError: :meth:`add` of a partial whose shape differs from the first one's; :meth:`result` with no
            partial and no ``like``.
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.acc_dtype = accumulation_dtype(dtype)
        self._acc: Optional[torch.Tensor] = None
        self.count = 0

    def add(self, partial: torch.Tensor) -> None:
        """Add the next partial (any floating dtype; promoted to the accumulation dtype)."""
        if not isinstance(partial, torch.Tensor):
            raise TypeError(f"partial: expected a torch.Tensor, got {type(partial).__name__}")
        p = partial.to(self.acc_dtype)
        if self._acc is None:
            # +0.0 + p: keeps the documented start value (turns a -0.0 partial into +0.0).
            self._acc = torch.zeros_like(p).add_(p)
        else:
            if p.shape != self._acc.shape:
                raise ValueError(
                    f"partial: expected shape {tuple(self._acc.shape)} (the shape of the first partial), "
                    f"got {tuple(p.shape)}")
            self._acc.add_(p)
        self.count += 1

    def result(self, like: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The folded sum, cast once to the gradient dtype.

        Args:
            like: used for shape/device when no partial was added (gives zeros).

        Raises:
            ValueError: no partial was added and ``like`` is None.
        """
        if self._acc is None:
            if like is None:
                raise ValueError("LexicalFold.result: no partial was added and `like` is None")
            return torch.zeros_like(like, dtype=self.dtype)
        return self._acc.to(self.dtype)


def lexical_fold(partials: Iterable[torch.Tensor], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Fold a sequence of same-shaped partials in the given (lexical) order.

    Args:
        partials: an iterable of tensors, or one tensor ``[K, ...]`` whose leading axis is the
            lexical partition index (folded from index 0 up).
        dtype: dtype of the result; default: the dtype of the first partial.

    Returns:
        Tensor of the partials' shape (without the leading axis when a stacked tensor is given).

    Raises:
        ValueError: no partials, or partials of different shapes.
    """
    if isinstance(partials, torch.Tensor):
        if partials.dim() == 0:
            raise ValueError("partials: expected a tensor [K, ...] with a leading partition axis, got a 0-d tensor")
        partials = partials.unbind(0)
    folder: Optional[LexicalFold] = None
    for p in partials:
        if folder is None:
            folder = LexicalFold(dtype if dtype is not None else p.dtype)
        folder.add(p)
    if folder is None:
        raise ValueError("partials: expected at least one partial, got none")
    return folder.result()


def tree_fold(partials, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Pairwise tree sum of ``K`` same-shaped partials (``K`` a power of two), partial 0 leftmost.

    ``tree(p[0:K]) = tree(p[0:K/2]) + tree(p[K/2:K])`` (left + right), ``tree([p]) = p`` cast to ``dtype``. This
    is the order of the split-invariant gradient accumulation (:mod:`ordered_ssd.accumulate`) and of its
    reduction over ranks (:func:`ordered_ssd.distributed.tree_all_reduce`): a contiguous run of ``2^j`` partials
    aligned to ``2^j`` is a subtree, so the sum of ``R * m`` block gradients is the same whichever
    power-of-two ``R`` ranks each add their ``m`` contiguous blocks first. Elementwise: element ``i`` of the
    result depends on element ``i`` of the partials only (so the bits do not depend on how the partials are
    laid out or sharded). Unlike :func:`lexical_fold` there is no +0.0 start (a single ``-0.0`` stays ``-0.0``).

    Args:
        partials: a sequence of tensors, or one tensor ``[K, ...]`` (leading axis = partial index).
        dtype: dtype of the additions and of the result; default :func:`accumulation_dtype` of the first
            partial's dtype (fp32; fp64 for fp64).

    Returns:
        A new tensor (never one of the inputs).

    Raises:
        ValueError: no partials, ``K`` not a power of two, or partials of different shapes.
    """
    if isinstance(partials, torch.Tensor):
        if partials.dim() == 0:
            raise ValueError("partials: expected a tensor [K, ...] with a leading partition axis, got a 0-d tensor")
        rows = partials
    else:
        partials = list(partials)
        if not partials:
            raise ValueError("partials: expected at least one partial, got none")
        shape = partials[0].shape
        for p in partials:
            if p.shape != shape:
                raise ValueError(f"partial: expected shape {tuple(shape)} (the shape of the first partial), "
                                 f"got {tuple(p.shape)}")
        rows = None
    k = rows.shape[0] if rows is not None else len(partials)
    if k < 1 or k & (k - 1):
        raise ValueError(f"tree_fold: the number of partials {k} is not a power of two (1, 2, 4, 8, ...)")
    first_dtype = rows.dtype if rows is not None else partials[0].dtype
    dtype = accumulation_dtype(first_dtype) if dtype is None else dtype
    if rows is None:
        def rec(lo: int, hi: int) -> torch.Tensor:
            if hi - lo == 1:
                return partials[lo].to(dtype, copy=True)
            mid = (lo + hi) // 2
            return rec(lo, mid).add_(rec(mid, hi))
        return rec(0, k)
    x = rows.to(dtype)
    if k == 1:
        return x[0].clone()
    while x.shape[0] > 1:  # bottom-up adjacent pairs: the same tree as the top-down halves for K = 2^j
        pairs = x.reshape(x.shape[0] // 2, 2, *x.shape[1:])
        x = pairs[:, 0] + pairs[:, 1]
    return x[0]



# ----------------------------------------------------------------------------------------------- tensors
def _fold_rows_loop(p2d: torch.Tensor, init: Optional[torch.Tensor], acc_dtype: torch.dtype) -> torch.Tensor:
    acc = torch.zeros(p2d.shape[1], dtype=acc_dtype, device=p2d.device)
    if init is not None:
        acc.add_(init.to(acc_dtype))
    for k in range(p2d.shape[0]):
        acc.add_(p2d[k].to(acc_dtype))
    return acc


def _fold_rows(p2d: torch.Tensor, init: Optional[torch.Tensor], acc_dtype: torch.dtype, *,
               out: Optional[torch.Tensor] = None, block: int = 256) -> torch.Tensor:
    """``out[m] = fold(+, p2d[k, m] for k)`` (starting from ``init`` or +0.0), in ``acc_dtype``.

    On CUDA in fp32 one ``fold_kernel`` launch of ``block`` elements per program (``block`` only tiles ``m``: the
    bits do not depend on it); ``out`` (fp32, ``[M]``, contiguous) receives the result if given (it may be ``init``
    itself: each element is read before it is written), else a new tensor. Elsewhere ``out`` and ``block`` must be
    left at their defaults."""
    if p2d.device.type != "cuda" or acc_dtype != torch.float32:
        if out is not None or block != 256:
            given = "a tensor" if out is not None else "None"
            raise ValueError(f"out / block: only the CUDA fp32 fold takes them, got out {given} and block {block} on "
                             f"{p2d.device.type} in {acc_dtype}")
        return _fold_rows_loop(p2d, init, acc_dtype)
    from . import kernels  # imports triton: only here, on CUDA

    fold_kernel = kernels.fold_kernel
    K, M = p2d.shape
    p2d = p2d if p2d.stride(1) == 1 else p2d.contiguous()
    if out is None:
        out = torch.empty(M, dtype=torch.float32, device=p2d.device)
    if M == 0:
        return out
    init_c = init.contiguous().view(-1) if init is not None else out
    with device_guard(p2d):
        _launch_cache.launch(fold_kernel, (-(-M // block),), (p2d, init_c, out, K, M, p2d.stride(0)),
                             dict(HAS_INIT=init is not None, BLOCK=block), p2d, num_warps=4)
    return out


def normalize_dims(t: torch.Tensor, dims) -> tuple:
    """``dims`` (an int or a sequence of axes of ``t``) as a tuple of non-negative axes, in the given order.

    Raises:
        ValueError: an axis named twice. IndexError: an axis out of range.
    """
    if isinstance(dims, int):
        dims = (dims,)
    nd = t.dim()
    for d in dims:
        if not -nd <= d < nd:
            raise IndexError(f"dims: axis {d} is out of range for a {nd}-d tensor")
    dims = tuple(d % nd for d in dims)
    if len(set(dims)) != len(dims):
        raise ValueError(f"dims: expected distinct axes, got {dims}")
    return dims


def fold_axes(t: torch.Tensor, dims: tuple) -> tuple:
    """``(keep, out_shape, K)`` of a fold of ``t`` over the normalized axes ``dims`` (:func:`normalize_dims`): the
    axes kept, in order, their sizes (the result's shape) and the number of partials folded into each output."""
    keep = [d for d in range(t.dim()) if d not in dims]
    return keep, [t.shape[d] for d in keep], math.prod(t.shape[d] for d in dims)


def fold_dims(t: torch.Tensor, dims, dtype: Optional[torch.dtype] = None,
              init: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Fold ``t`` over the axes ``dims``, in lexical order of those axes (the first listed is the slowest).

    Args:
        t: partials, any float dtype and device.
        dims: an int or a sequence of distinct axes; e.g. ``(0, 1)`` on a ``[B, C, H]`` tensor folds
            ``(b, c)`` in the order ``(0, 0), (0, 1), ..., (1, 0), ...`` and returns ``[H]``.
        dtype: dtype of the result (default: ``t.dtype``); the accumulation is in
            :func:`accumulation_dtype` of it and the cast happens once.
        init: optional accumulator to continue from (shape of the result, any float dtype).

    Returns:
        The folded tensor with the ``dims`` axes removed.

    The result has the same bits as :func:`lexical_fold` over ``t`` with those axes moved to the front and
    flattened; on CUDA the fold runs as one Triton kernel (one sequential loop per output element).

    Raises:
        ValueError: ``dims`` names an axis twice. IndexError: an axis out of range.
    """
    dims = normalize_dims(t, dims)
    keep, out_shape, K = fold_axes(t, dims)
    p2d = t.permute(*dims, *keep).reshape(K, -1)
    dtype = t.dtype if dtype is None else dtype
    acc = _fold_rows(p2d, None if init is None else init.reshape(-1), accumulation_dtype(dtype))
    return acc.to(dtype).reshape(out_shape)


def lexical_cumsum(t: torch.Tensor, dim: int = -1, reverse: bool = False,
                   dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Running sum along ``dim`` computed one position at a time (position 0 first, or the last first
    with ``reverse``), in fp32 (fp64 for fp64), each row independently.

    Used for the per-position ``dA_cumsum`` gradient scans, so their rounding is fixed by the row alone.

    Raises:
        TypeError: ``dtype`` (or ``t``'s dtype) is not a floating-point dtype. IndexError: ``dim`` out of range.
    """
    dtype = t.dtype if dtype is None else dtype
    acc_dtype = accumulation_dtype(dtype)
    x = t.movedim(dim, -1)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    R, N = x2.shape
    if t.device.type == "cuda" and acc_dtype == torch.float32 and R * N > 0:
        from . import kernels  # imports triton: only here, on CUDA

        scan_kernel = kernels.scan_kernel
        out = torch.empty(R, N, dtype=torch.float32, device=t.device)
        BLOCK = 128
        with device_guard(x2):
            _launch_cache.launch(scan_kernel, (-(-R // BLOCK),), (x2, out, R, N), dict(REVERSE=reverse, BLOCK=BLOCK),
                                 x2, num_warps=4)
    else:
        out = torch.empty(R, N, dtype=acc_dtype, device=t.device)
        acc = torch.zeros(R, dtype=acc_dtype, device=t.device)
        order = range(N - 1, -1, -1) if reverse else range(N)
        for j in order:
            acc.add_(x2[:, j].to(acc_dtype))
            out[:, j] = acc
    return out.to(dtype).reshape(shape).movedim(-1, dim)


def dA_cumsum_grad_scans(ddA: torch.Tensor, ddA_prev: torch.Tensor, ddA_chunk: torch.Tensor, ddA_next: torch.Tensor,
                         *, use_triton: Optional[bool] = None) -> torch.Tensor:
    """The running sums of the SSD backward's ``dA_cumsum`` gradient, as upstream assembles it
    (``_mamba_chunk_scan_combined_bwd``), in a fixed order: ``ddA_prev[..., -1] += ddA_chunk``, then
    ``ddA += lexical_cumsum(ddA_next) + lexical_cumsum(ddA_prev, reverse=True)`` along the chunk's positions.

    Args:
        ddA: ``[B, H, C, cs]`` fp32, contiguous; updated in place and returned.
        ddA_prev: ``[B, H, C, cs]`` fp32, contiguous: the gradient through the previous chunks' states. Overwritten:
            ``ddA_chunk`` added at the last position, then its reverse running sum from that position down.
        ddA_chunk: ``[B, H, C]`` fp32, contiguous: the gradient through the chunk's own state.
        ddA_next: ``[B, H, C, cs]`` fp32, contiguous: through the next chunks' states (read only).
        use_triton: one launch of :func:`~ordered_ssd.fold.kernels.dA_cumsum_grad_kernel` (default: on CUDA;
            ``True`` on the CPU runs it under ``TRITON_INTERPRET=1``) instead of five operations (the add, two
            :func:`lexical_cumsum`, two adds). Both add in the same order, from +0.0, one position at a time, so
            they give the same bits.

    Raises:
        ValueError: ``ddA`` not 4-d, or a tensor of another shape, dtype, layout or device than ``ddA``'s (nothing
            is written).
    """
    if ddA.dim() != 4:
        raise ValueError(f"ddA: expected a 4-d tensor [B, H, C, cs], got shape {list(ddA.shape)}")
    shape = tuple(ddA.shape)
    for name, t, want in (("ddA", ddA, shape), ("ddA_prev", ddA_prev, shape), ("ddA_chunk", ddA_chunk, shape[:-1]),
                          ("ddA_next", ddA_next, shape)):
        if tuple(t.shape) != want or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous float32 tensor of shape {list(want)} ([B, H, C, cs] "
                             f"of ddA, [B, H, C] for ddA_chunk), got {t.dtype} {list(t.shape)} "
                             f"(contiguous: {t.is_contiguous()})")
        if t.device != ddA.device:
            raise ValueError(f"{name}: expected a tensor on ddA's device {ddA.device}, got {t.device}")
    triton_ok = use_triton if use_triton is not None else ddA.device.type == "cuda"
    if not triton_ok:
        ddA_prev[..., -1] += ddA_chunk
        ddA_prev.copy_(lexical_cumsum(ddA_prev, dim=-1, reverse=True))
        ddA += lexical_cumsum(ddA_next, dim=-1) + ddA_prev
        return ddA
    R, N = math.prod(shape[:-1]), shape[-1]
    if R * N:
        from . import kernels  # imports triton: only here
        BLOCK = 128
        with device_guard(ddA):
            _launch_cache.launch(kernels.dA_cumsum_grad_kernel, (-(-R // BLOCK),), (ddA, ddA_prev, ddA_chunk, ddA_next,
                                 R, N), dict(BLOCK=BLOCK), ddA, num_warps=4)
    return ddA
