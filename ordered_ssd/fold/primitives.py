"""The fold primitives: every sum over a partition axis in ordered-ssd goes through these (see
:mod:`ordered_ssd.fold` for the order they implement)."""
from __future__ import annotations

import math
import time
from typing import Iterable, Optional

import torch

from csrc_bindings import _launch_cache  # imports nothing native
from csrc_bindings._native import device_guard  # imports nothing native

from . import settings as _settings
from .settings import (GEMM_FOLD_CONFIGS, GEMM_FOLD_VARIANTS, GEMM_FOLD_WORKSPACE_BYTES, LINEAR_GROUP_BYTES,
                       accumulation_dtype, gemm_fold_config, gemm_fold_examples_per_program, gemm_fold_shared_bytes)

__all__ = ["LexicalFold", "lexical_fold", "tree_fold", "fold_dims", "lexical_cumsum", "fold_example_gemms_grouped",
           "fold_example_gemms", "gemm_fold_timed_choices"]


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


# ------------------------------------------------------------------------------------ fused GEMM partials
def _tile_offsets_overflow(t: torch.Tensor, BK: int) -> bool:
    """Whether the largest in-tile element offset of ``t`` [E, L, W] (``(W - 1) * stride(2) + BK * stride(1)``)
    exceeds the 32-bit range of the kernel's tile offsets."""
    return (t.shape[2] - 1) * abs(t.stride(2)) + BK * abs(t.stride(1)) >= 2 ** 31


def fold_example_gemms(a: torch.Tensor, b: torch.Tensor, init: Optional[torch.Tensor] = None, *,
                       examples_per_program: Optional[int] = None) -> torch.Tensor:
    """``out = fold_e(a[e]^T @ b[e])``: the lexical fold over examples of per-example GEMM partials.

    The weight gradient of a linear layer ``y = x W^T`` is ``fold_e(dy[e]^T @ x[e])`` with ``a = dy``, ``b = x``.

    Args:
        a: ``[E, L, M]``, b: ``[E, L, N]``; the same dtype (bf16, fp16 or fp32 on CUDA; any float dtype
            elsewhere), any strides.
        init: optional ``[M, N]`` accumulator to continue from (any float dtype).
        examples_per_program: CUDA kernel only: consecutive examples per program (bit-neutral; default: rule
            ``gemm-chain-v1``, :func:`~ordered_ssd.fold.gemm_fold_examples_per_program`); for tests.

    Returns:
        ``[M, N]`` in fp32 (fp64 for fp64 inputs).

    Raises:
        TypeError: ``a``/``b``/``init`` not tensors, of non-float dtypes, or ``a`` and ``b`` of different dtypes;
            ``examples_per_program`` not None or an int.
        ValueError: not 3-d, mismatched ``E``/``L``, a wrong ``init`` shape, different devices, an
            ``examples_per_program`` below 1, or (CUDA) a width so large that ``BK`` rows of it overflow 32-bit
            offsets.

    On CUDA (bf16/fp16/fp32) each partial is computed from one example alone (blocks of ``BK`` positions in
    order, tensor-core products accumulated in fp32; IEEE fp32 products for fp32 inputs) and added to the running sum
    (``init`` or +0.0), one fp32 addition per example, example 0 first: the bits of :class:`LexicalFold` over the
    partials. A partial's bits depend on ``L`` and :data:`GEMM_FOLD_CONFIGS` only, not on ``E`` or on the other
    examples. Which kernel does this is bit-neutral (:data:`~ordered_ssd.fold.GEMM_FOLD_VARIANTS`):

    * the static choice, one launch of ``kernels.gemm_fold_chain_kernel`` (and the zeroing of a small int32
      buffer): one program per (group of consecutive examples, tile of ``out``), the tile's running sum handed
      from group to group in example order; the groups run in parallel, only the additions wait for the previous
      group's (rule ``gemm-chain-v1``). The configuration is :func:`~ordered_ssd.fold.gemm_fold_config` for the
      device's shared memory (fewer pipeline stages on devices with less than the pinned one needs: the same
      bits);
    * rule ``gemm-timed-v2`` (bf16/fp16 on sm_90, ``examples_per_program`` None): at the first call of a shape
      (``E``, ``L``, ``M``, ``N``, strides, dtype, ``init`` or not) in the process, every variant is launched and
      timed (GPU time by CUDA events plus the host time of its launches, :func:`_gpu_and_host_ms`; the host waits
      for each timing, 14 times at most) and the least costly is kept for the shape
      (:func:`gemm_fold_timed_choices`); inside a CUDA-graph capture an untimed shape takes the static choice, and
      so does every shape at ``L = 1`` (:func:`_timed_variants`).
      The ``"partials"`` variant allocates up to :data:`~ordered_ssd.fold.GEMM_FOLD_WORKSPACE_BYTES` of fp32
      workspace for the call.

    A compiled kernel that Triton still refuses raises ``ValueError`` before it is launched. Elsewhere each partial
    is one ``torch.mm`` in the accumulation dtype, folded by :class:`LexicalFold`.
    """
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name}: expected a 3-d tensor [E, L, *], got shape {tuple(t.shape)}")
    if not a.dtype.is_floating_point:
        raise TypeError(f"a: expected a float dtype, got {a.dtype}")
    if b.dtype != a.dtype:
        raise TypeError(f"b: expected the dtype of a ({a.dtype}), got {b.dtype}")
    if a.shape[:2] != b.shape[:2]:
        raise ValueError(f"b: expected [E, L] = {tuple(a.shape[:2])} as in a, got {tuple(b.shape[:2])}")
    if a.device != b.device:
        raise ValueError(f"b: expected device {a.device} as a, got {b.device}")
    E, L, M = a.shape
    N = b.shape[2]
    if init is not None:
        if not isinstance(init, torch.Tensor):
            raise TypeError(f"init: expected a torch.Tensor or None, got {type(init).__name__}")
        if not init.dtype.is_floating_point:
            raise TypeError(f"init: expected a float dtype, got {init.dtype}")
        if tuple(init.shape) != (M, N):
            raise ValueError(f"init: expected shape {(M, N)}, got {tuple(init.shape)}")
        if init.device != a.device:
            raise ValueError(f"init: expected device {a.device} as a, got {init.device}")
    if examples_per_program is not None:
        if isinstance(examples_per_program, bool) or not isinstance(examples_per_program, int):
            raise TypeError(f"examples_per_program: expected None or an int, got "
                            f"{type(examples_per_program).__name__}")
        if examples_per_program < 1:
            raise ValueError(f"examples_per_program: expected None or an int >= 1, got {examples_per_program}")
    acc_dtype = accumulation_dtype(a.dtype)
    if a.device.type != "cuda" or a.dtype not in GEMM_FOLD_CONFIGS:
        folder = LexicalFold(acc_dtype)
        if init is not None:
            folder.add(init)
        for ae, be in zip(a.unbind(0), b.unbind(0)):
            folder.add(torch.mm(ae.t().to(acc_dtype), be.to(acc_dtype)))
        return folder.result(like=torch.empty(M, N, device=a.device))
    out = torch.empty(M, N, dtype=torch.float32, device=a.device)
    if M * N == 0:
        return out
    from csrc_bindings import _resources  # imports nothing native

    from . import kernels  # imports triton: only here, on CUDA

    static = ("chain", gemm_fold_config(a.dtype, _resources.shared_memory_limit(a.device)))
    BK = static[1][2]  # every variant takes K blocks of this size (GEMM_FOLD_VARIANTS)
    # in-tile offsets are 32-bit: give such a tensor unit stride on its last axis (never changes a value)
    a = a.contiguous() if _tile_offsets_overflow(a, BK) else a
    b = b.contiguous() if _tile_offsets_overflow(b, BK) else b
    for name, t in (("a", a), ("b", b)):
        if _tile_offsets_overflow(t, BK):
            raise ValueError(f"{name}: expected BK * width < 2**31 elements for 32-bit tile offsets, got width "
                             f"{t.shape[2]}")
    if E == 0:  # no partial: the running sum is +0.0 (+ init), as the kernel would start it
        return out.zero_() if init is None else out.copy_(init).add_(0.0)
    init_c = init.contiguous() if init is not None else out

    def launch(variant):
        _launch_gemm_variant(kernels, variant, a, b, init_c, init is not None, out, examples_per_program)

    if examples_per_program is not None:  # an explicit grouping: the chain, never timed
        launch(static)
        return out
    key = (a.device.index, a.dtype, E, L, M, N, a.stride(), b.stride(), init is not None)
    chosen = _gemm_timed.get(key)  # a shape timed before keeps its choice
    if chosen is None:
        variants = _timed_variants(a, static, M * N, L)
        if not variants or torch.cuda.is_current_stream_capturing():
            launch(static)  # not timed (or inside a CUDA-graph capture): the static choice, the same bits
            return out
        chosen = _gemm_timed[key] = _fastest(variants, launch, _gpu_and_host_ms)
    launch(chosen)
    return out


#: Rule ``gemm-timed-v2``'s choices in this process: ``{(device index, dtype, E, L, M, N, a strides, b strides,
#: has init): (kind, config)}`` (:func:`gemm_fold_timed_choices`).
_gemm_timed: dict = {}


def gemm_fold_timed_choices() -> dict:
    """A copy of the variants that rule ``gemm-timed-v2`` chose in this process for
    :func:`fold_example_gemms`, ``{(device index, dtype, E, L, M, N, a strides, b strides, has init): (kind,
    (BM, BN, BK, GROUP_M, num_warps, num_stages))}`` (:data:`~ordered_ssd.fold.GEMM_FOLD_VARIANTS`)."""
    return dict(_gemm_timed)


def _timed_variants(a: torch.Tensor, static: tuple, mn: int, seqlen: int) -> list:
    """The variants rule ``gemm-timed-v2`` times for ``a`` (CUDA, checked) with ``seqlen`` positions per example and
    an output of ``mn`` elements: :data:`GEMM_FOLD_VARIANTS` with the static choice first, the configurations that
    fit the device's shared memory, and ``"partials"`` only where one fp32 partial fits
    :data:`GEMM_FOLD_WORKSPACE_BYTES`; for bf16/fp16 inputs on sm_90 (where their bit-neutrality was checked) while
    ``GEMM_FOLD_TIMING`` is on; else none (the static choice).

    None at ``seqlen == 1`` either: before reduction version 4 Triton compiled ``L == 1`` as a constant and the
    chain and nest kernels folded the running sum's addition into the tensor-core accumulation there, unlike the
    partials variant; the kernels no longer allow that (``kernels`` module docstring), but the variants have not
    been compared at ``L == 1`` on a GPU since."""
    if not (_settings.GEMM_FOLD_TIMING and seqlen != 1 and a.dtype in (torch.bfloat16, torch.float16)
            and torch.cuda.get_device_capability(a.device) == (9, 0)):
        return []
    from csrc_bindings import _resources  # imports nothing native

    limit = _resources.shared_memory_limit(a.device)
    out = [static]
    for kind, config in GEMM_FOLD_VARIANTS[1:]:
        if kind == "partials" and 4 * mn > GEMM_FOLD_WORKSPACE_BYTES:
            continue
        if config[2] == static[1][2] and gemm_fold_shared_bytes(config, a.dtype) <= limit:
            out.append((kind, config))
    return out


def _gpu_and_host_ms(fn, repeats: int = 3) -> float:
    """The cost of one call of ``fn`` by rule ``gemm-timed-v2``, in milliseconds, mean over ``repeats`` calls: the
    span of CUDA events on the current stream from before the first call to after the last, plus the host time of
    the calls (``time.perf_counter`` around each). The stream is synchronized first, so every variant starts on an
    idle GPU. The span is the GPU's time where the GPU runs the calls more slowly than the host enqueues them;
    where the host is slower, the span follows the host (the GPU waits between launches), so the host time counts
    twice: such a variant waits on the host even alone. A layer step that waits on the host (many examples, short
    sequences) pays a variant's host time, one that waits on the GPU its GPU time; the sum ranks a variant with
    many launches (``"partials"`` in many groups) below one launch of the same GPU time."""
    torch.cuda.current_stream().synchronize()  # no earlier work (the variants' first launches) inside the span
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = 0.0
    start.record()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        host += time.perf_counter() - t0
    end.record()
    end.synchronize()
    return (start.elapsed_time(end) + 1000.0 * host) / repeats


def _fastest(variants: list, launch, timer, rounds: int = 2):
    """Rule ``gemm-timed-v2``: ``launch`` every variant once (compiles it), then time each ``rounds`` times,
    interleaved, with ``timer(fn) -> ms`` (a cost); the least cost wins, the earlier variant on a tie. A variant that
    Triton refuses for a resource (``ValueError``) or that runs out of memory, at its first launch or while timed, is
    dropped, except the static choice ``variants[0]``, whose error propagates. The winner gives the bits of every other
    (docstring of :data:`~ordered_ssd.fold.GEMM_FOLD_VARIANTS`)."""
    best = {}
    for i, variant in enumerate(variants):
        try:
            launch(variant)
        except (ValueError, torch.cuda.OutOfMemoryError):
            if i == 0:
                raise
            continue
        best[variant] = float("inf")
    for _ in range(rounds):
        for v in list(best):
            try:
                best[v] = min(best[v], timer(lambda v=v: launch(v)))
            except (ValueError, torch.cuda.OutOfMemoryError):
                if v == variants[0]:
                    raise
                del best[v]
    ran = list(best)
    return min(ran, key=lambda v: (best[v], ran.index(v)))


def _launch_gemm_variant(kernels, variant, a, b, init_c, has_init, out, examples_per_program) -> None:
    """``out = fold_e(a[e]^T @ b[e])`` (+ ``init_c`` first if ``has_init``) by one variant of
    :data:`~ordered_ssd.fold.GEMM_FOLD_VARIANTS` (the checks done; ``E >= 1``, ``out`` fp32 ``[M, N]``)."""
    from csrc_bindings import _resources  # imports nothing native

    kind, (BM, BN, BK, GROUP_M, num_warps, num_stages) = variant
    E, L, M = a.shape
    N = b.shape[2]
    tiles = -(-M // BM) * -(-N // BN)
    ieee = a.dtype == torch.float32
    strides = (a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2))
    consts = {"IEEE": ieee, "BM": BM, "BN": BN, "BK": BK, "GROUP_M": GROUP_M}
    config = {**consts, "num_warps": num_warps, "num_stages": num_stages}
    sizes = lambda: f"M={M}, N={N}, dtype={a.dtype}"  # noqa: E731
    with device_guard(a):
        # a compiled kernel that still does not fit: ValueError before anything is launched
        if kind == "chain":
            epp = examples_per_program
            if epp is None:  # bit-neutral rule gemm-chain-v1
                epp = gemm_fold_examples_per_program(E, tiles, _resources.multiprocessor_count(a.device))
            epp = min(epp, E)  # more than E is one group: the same launch
            # per tile of out, the number of groups folded so far, then the ticket counter (the chain's handoff)
            sync = torch.zeros(tiles + 1, dtype=torch.int32, device=a.device)
            _resources.launch_fitting("fold_example_gemms", kernels.gemm_fold_chain_kernel, (-(-E // epp) * tiles,),
                                      (a, b, init_c, out, sync, E, L, M, N, *strides, epp),
                                      {"HAS_INIT": has_init, **consts}, config, a, explicit=True, sizes=sizes)
        elif kind in ("nest", "nest-flat"):
            _resources.launch_fitting("fold_example_gemms", kernels.gemm_fold_nest_kernel, (tiles,),
                                      (a, b, init_c, out, E, L, M, N, *strides),
                                      {"HAS_INIT": has_init, "FLAT": kind == "nest-flat", **consts}, config, a,
                                      explicit=True, sizes=sizes)
        elif kind == "partials":
            # examples on grid axis 1: at most 65535 per launch
            group = max(1, min(E, 65535, GEMM_FOLD_WORKSPACE_BYTES // (4 * M * N)))
            buf = torch.empty(group, M * N, dtype=torch.float32, device=a.device)
            flat = out.view(-1)
            for e0 in range(0, E, group):
                n = min(group, E - e0)
                _resources.launch_fitting("fold_example_gemms", kernels.gemm_partials_kernel, (tiles, n),
                                          (a, b, buf, e0, L, M, N, *strides), consts, config, a, explicit=True,
                                          sizes=sizes)
                # the partials in example order onto init (then onto what the groups before left in out)
                first = (init_c.view(-1) if has_init else None) if e0 == 0 else flat
                _fold_rows(buf[:n], first, torch.float32, out=flat, block=1024)  # block as measured in exp7
        else:
            raise ValueError(f"variant: expected a kind of GEMM_FOLD_VARIANTS, got {kind!r}")


def fold_example_gemms_grouped(dy: torch.Tensor, x: torch.Tensor, weight_dtype: torch.dtype,
                               group_bytes: int = LINEAR_GROUP_BYTES) -> torch.Tensor:
    """``fold_e(dy[e]^T @ x[e])`` [out, in] in ``weight_dtype``: the per-example algorithm of the projections' weight
    gradient (:func:`~ordered_ssd.ops.linear.ordered_linear_weight_grad`), taken where :func:`fold_example_gemms`
    is not (:func:`~ordered_ssd.fold.linear_weight_grad_is_fused`: sequences of ``LINEAR_FUSED_BELOW_L`` positions
    or more, fp64, off CUDA).

    Args: dy [E, L, out]; x [E, L, in]; ``group_bytes``: bound on the fp32 partial buffer (bit-neutral).

    One GEMM per example (``torch.mm(..., out_dtype=torch.float32)`` for half inputs on CUDA, an fp32 (fp64 for
    fp64) GEMM otherwise; cuBLAS picks its algorithm per GPU model) into a 256-byte aligned slot of a group buffer,
    and one :func:`fold_dims` launch per group into the running sum, example 0 first: the bits of
    :class:`LexicalFold` over the per-example partials, whatever the group size.

    Raises:
        RuntimeError: from ``torch.mm`` for mismatched shapes or devices (the callers pass checked tensors).
    """
    batch, _, out_features = dy.shape
    in_features = x.shape[-1]
    acc_dtype = accumulation_dtype(weight_dtype)
    numel = out_features * in_features
    acc = None
    if batch > 0 and numel > 0:
        slot = -(-numel // 64) * 64  # 256-byte aligned slots, as a fresh allocation would be
        group = max(1, min(batch, group_bytes // (4 * slot)))
        buf = torch.empty(group, slot, dtype=torch.float32, device=dy.device)
        fp32_out_of_half = dy.device.type == "cuda" and dy.dtype != torch.float32
        dy_t = dy.transpose(1, 2)  # dy_t[b] is dy[b].t()
        for first in range(0, batch, group):
            last = min(batch, first + group)
            # the per-example views made in one call each (host time at large B)
            parts = buf[:last - first, :numel].view(last - first, out_features, in_features).unbind(0)
            for part, a, b in zip(parts, dy_t[first:last].unbind(0), x[first:last].unbind(0)):
                if fp32_out_of_half:
                    torch.mm(a, b, out_dtype=torch.float32, out=part)
                else:
                    torch.mm(a.float(), b.float(), out=part)
            acc = fold_dims(buf[:last - first, :numel], 0, dtype=acc_dtype, init=acc)
    dW = (acc.view(out_features, in_features) if acc is not None
          else torch.zeros(out_features, in_features, dtype=acc_dtype, device=dy.device))
    return dW.to(weight_dtype)
