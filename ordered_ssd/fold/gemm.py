"""The projections' weight-gradient folds: :func:`fold_example_gemms` (the lexical fold of per-(example, segment)
GEMM partials; on CUDA the Triton kernels of :mod:`ordered_ssd.fold.kernels` and rule ``gemm-timed-v2``'s choice
among their bit-neutral variants) and :func:`fold_example_gemms_grouped` (one GEMM per example: fp64, off CUDA).
The order they implement is :mod:`ordered_ssd.fold`'s."""
from __future__ import annotations

import time
from typing import Optional

import torch

from csrc_bindings._native import device_guard  # imports nothing native

from . import settings as _settings
from .primitives import LexicalFold, _fold_rows, fold_dims
from .settings import (GEMM_FOLD_CONFIGS, GEMM_FOLD_VARIANTS, GEMM_FOLD_WORKSPACE_BYTES, LINEAR_GROUP_BYTES,
                       accumulation_dtype, gemm_fold_config, gemm_fold_segments, gemm_fold_segments_per_program,
                       gemm_fold_shared_bytes)

__all__ = ["fold_example_gemms", "fold_example_gemms_grouped", "gemm_fold_timed_choices"]


def _tile_offsets_overflow(t: torch.Tensor, BK: int) -> bool:
    """Whether the largest in-tile element offset of ``t`` [E, L, W] (``(W - 1) * stride(2) + BK * stride(1)``)
    exceeds the 32-bit range of the kernel's tile offsets."""
    return (t.shape[2] - 1) * abs(t.stride(2)) + BK * abs(t.stride(1)) >= 2 ** 31


def fold_example_gemms(a: torch.Tensor, b: torch.Tensor, init: Optional[torch.Tensor] = None, *,
                       segments_per_program: Optional[int] = None) -> torch.Tensor:
    """``out = fold_e(fold_s(a[e, s]^T @ b[e, s]))``: the lexical fold over examples, and inside an example over
    segments of :data:`~ordered_ssd.fold.GEMM_FOLD_SEGMENT_L` consecutive positions, of per-segment GEMM partials.

    The weight gradient of a linear layer ``y = x W^T`` is this fold with ``a = dy``, ``b = x``.

    Args:
        a: ``[E, L, M]``, b: ``[E, L, N]``; the same dtype (bf16, fp16 or fp32 on CUDA; any float dtype
            elsewhere), any strides.
        init: optional ``[M, N]`` accumulator to continue from (any float dtype).
        segments_per_program: CUDA kernel only: consecutive segments per program (bit-neutral; default: rule
            ``gemm-chain-v1``, :func:`~ordered_ssd.fold.gemm_fold_segments_per_program`); for tests.

    Returns:
        ``[M, N]`` in fp32 (fp64 for fp64 inputs).

    Raises:
        TypeError: ``a``/``b``/``init`` not tensors, of non-float dtypes, or ``a`` and ``b`` of different dtypes;
            ``segments_per_program`` not None or an int.
        ValueError: not 3-d, mismatched ``E``/``L``, a wrong ``init`` shape, different devices, a
            ``segments_per_program`` below 1, or (CUDA) a width so large that ``BK`` rows of it overflow 32-bit
            offsets.

    The segments: example ``e`` has :func:`~ordered_ssd.fold.gemm_fold_segments` ``(L)`` of them, segment ``s``
    its positions ``s * GEMM_FOLD_SEGMENT_L`` up to the next segment or ``L``; up to ``GEMM_FOLD_SEGMENT_L``
    positions an example is one segment. The partition depends on ``L`` alone. Each partial is computed from one
    segment alone (on CUDA in bf16/fp16/fp32: blocks of ``BK`` positions in order, tensor-core products
    accumulated in fp32; IEEE fp32 products for fp32 inputs; elsewhere one ``torch.mm`` in the accumulation
    dtype) and added to the running sum (``init`` or +0.0), one addition per segment, example 0's segment 0 first:
    the bits of :class:`LexicalFold` over the partials. A partial's bits depend on ``L`` and
    :data:`GEMM_FOLD_CONFIGS` only, not on ``E`` or on the other examples. The launches do not depend on ``E``.
    Which kernel does this on CUDA is bit-neutral (:data:`~ordered_ssd.fold.GEMM_FOLD_VARIANTS`):

    * the static choice, one launch of ``kernels.gemm_fold_chain_kernel`` (and the zeroing of a small int32
      buffer): one program per (group of consecutive segments, tile of ``out``), the tile's running sum handed
      from group to group in segment order; the groups run in parallel, only the additions wait for the previous
      group's (rule ``gemm-chain-v1``). The configuration is :func:`~ordered_ssd.fold.gemm_fold_config` for the
      device's shared memory (fewer pipeline stages on devices with less than the pinned one needs: the same
      bits);
    * rule ``gemm-timed-v2`` (bf16/fp16 on sm_90, ``segments_per_program`` None): at the first call of a shape
      (``E``, ``L``, ``M``, ``N``, strides, dtype, ``init`` or not) in the process, every variant is launched and
      timed (GPU time by CUDA events plus the host time of its launches, :func:`_gpu_and_host_ms`; the host waits
      for each timing, 14 times at most) and the least costly is kept for the shape
      (:func:`gemm_fold_timed_choices`); inside a CUDA-graph capture an untimed shape takes the static choice, and
      so does every shape at ``L = 1`` (:func:`_timed_variants`).
      The ``"partials"`` variant allocates the fp32 partials of all segments (timed only where they fit
      :data:`~ordered_ssd.fold.GEMM_FOLD_WORKSPACE_BYTES`) for the call.

    A compiled kernel that Triton still refuses raises ``ValueError`` before it is launched.
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
    if segments_per_program is not None:
        if isinstance(segments_per_program, bool) or not isinstance(segments_per_program, int):
            raise TypeError(f"segments_per_program: expected None or an int, got "
                            f"{type(segments_per_program).__name__}")
        if segments_per_program < 1:
            raise ValueError(f"segments_per_program: expected None or an int >= 1, got {segments_per_program}")
    acc_dtype = accumulation_dtype(a.dtype)
    seg = _settings.GEMM_FOLD_SEGMENT_L
    nseg = gemm_fold_segments(L)
    if a.device.type != "cuda" or a.dtype not in GEMM_FOLD_CONFIGS:
        folder = LexicalFold(acc_dtype)
        if init is not None:
            folder.add(init)
        for ae, be in zip(a.unbind(0), b.unbind(0)):
            for s0 in range(0, nseg * seg, seg):
                folder.add(torch.mm(ae[s0:s0 + seg].t().to(acc_dtype), be[s0:s0 + seg].to(acc_dtype)))
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
    segments = (E * nseg, nseg, seg)

    def launch(variant):
        _launch_gemm_variant(kernels, variant, a, b, init_c, init is not None, out, segments, segments_per_program)

    if segments_per_program is not None:  # an explicit grouping: the chain, never timed
        launch(static)
        return out
    key = (a.device.index, a.dtype, E, L, M, N, a.stride(), b.stride(), init is not None, seg)
    chosen = _gemm_timed.get(key)  # a shape timed before keeps its choice
    if chosen is None:
        variants = _timed_variants(a, static, M * N, L, E * nseg, b)
        if not variants or torch.cuda.is_current_stream_capturing():
            launch(static)  # not timed (or inside a CUDA-graph capture): the static choice, the same bits
            return out
        chosen = _gemm_timed[key] = _fastest(variants, launch, _gpu_and_host_ms)
    launch(chosen)
    return out


#: Rule ``gemm-timed-v2``'s choices in this process: ``{(device index, dtype, E, L, M, N, a strides, b strides,
#: has init, positions per segment): (kind, config)}`` (:func:`gemm_fold_timed_choices`).
_gemm_timed: dict = {}


def gemm_fold_timed_choices() -> dict:
    """A copy of the variants that rule ``gemm-timed-v2`` chose in this process for
    :func:`fold_example_gemms`, ``{(device index, dtype, E, L, M, N, a strides, b strides, has init, positions per
    segment): (kind, (BM, BN, BK, GROUP_M, num_warps, num_stages))}`` (:data:`~ordered_ssd.fold.GEMM_FOLD_VARIANTS`)."""
    return dict(_gemm_timed)


def _timed_variants(a: torch.Tensor, static: tuple, mn: int, seqlen: int, segments: int,
                    b: Optional[torch.Tensor] = None) -> list:
    """The variants rule ``gemm-timed-v2`` times for ``a`` (and ``b``; CUDA, checked) with ``seqlen`` positions per
    example, ``segments`` segments in all and an output of ``mn`` elements: :data:`GEMM_FOLD_VARIANTS` with the
    static choice first, the configurations that fit the device's shared memory, ``"partials"`` only where the fp32
    partials of all segments fit :data:`GEMM_FOLD_WORKSPACE_BYTES` (one group: its launches do not grow with the
    batch), and the ``"tma"`` kinds only where :func:`tma_ready` holds for ``a`` and ``b`` (``b`` None: ``a``); for
    bf16/fp16 inputs on sm_90 (where their bit-neutrality was checked) while
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
    tma = tma_ready(a) and (b is None or tma_ready(b))
    for kind, config in GEMM_FOLD_VARIANTS[1:]:
        if kind == "partials" and 4 * mn * segments > GEMM_FOLD_WORKSPACE_BYTES:
            continue
        if kind.startswith("tma") and not tma:
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


def _fastest(variants: list, launch, timer, rounds: int = 3):
    """Rule ``gemm-timed-v2``: ``launch`` every variant once (compiles it), then time each ``rounds`` times,
    interleaved, with ``timer(fn) -> ms`` (a cost); a variant's least cost over the rounds ranks it, the least wins,
    the earlier variant on a tie (3 rounds since 2026-12-01: with 2, the choice at G2's in_proj moved between runs
    to a variant 20 % slower). A variant that
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


def _pow2_divisor(*values: int) -> int:
    """The largest power of two up to 8 that divides every one of ``values``."""
    q = 8
    while q > 1 and any(v % q for v in values):
        q //= 2
    return q


def _aligned_strides(t: torch.Tensor) -> tuple:
    """``(q, (stride(0) // q, stride(1) // q, stride(2)))``: ``q`` the largest power of two up to 8 that divides
    the example and position strides of ``t`` [E, L, W]. The GEMM-fold kernels multiply them back by the constant
    ``q`` (and ``M``, ``N`` by theirs), so the compiler knows the rows' alignment and gives a width such as 3224
    16-byte copies; addresses only, never a value."""
    q = _pow2_divisor(t.stride(0), t.stride(1))
    return q, (t.stride(0) // q, t.stride(1) // q, t.stride(2))


def _launch_gemm_variant(kernels, variant, a, b, init_c, has_init, out, segments, segments_per_program) -> None:
    """``out = fold_u(partial_u)`` (+ ``init_c`` first if ``has_init``) by one variant of
    :data:`~ordered_ssd.fold.GEMM_FOLD_VARIANTS` (the checks done; ``E >= 1``, ``out`` fp32 ``[M, N]``);
    ``segments``: ``(segments in all, segments per example, positions per segment)``."""
    from csrc_bindings import _resources  # imports nothing native

    kind, (BM, BN, BK, GROUP_M, num_warps, num_stages) = variant
    NU, NSEG, SEG = segments
    _, L, M = a.shape
    N = b.shape[2]
    tiles = -(-M // BM) * -(-N // BN)
    ieee = a.dtype == torch.float32
    AQ, a_strides = _aligned_strides(a)
    BQ, b_strides = _aligned_strides(b)
    MQ, NQ = _pow2_divisor(M), _pow2_divisor(N)
    strides = a_strides + b_strides
    mn = (M // MQ, N // NQ)  # multiplied back by the kernels (alignment hints only)
    consts = {"IEEE": ieee, "BM": BM, "BN": BN, "BK": BK, "GROUP_M": GROUP_M, "SEG": SEG, "AQ": AQ, "BQ": BQ,
              "MQ": MQ, "NQ": NQ}
    config = {**consts, "num_warps": num_warps, "num_stages": num_stages}
    sizes = lambda: f"M={M}, N={N}, dtype={a.dtype}"  # noqa: E731
    with device_guard(a):
        # a compiled kernel that still does not fit: ValueError before anything is launched
        if kind == "chain":
            spp = segments_per_program
            if spp is None:  # bit-neutral rule gemm-chain-v1
                spp = gemm_fold_segments_per_program(NU, tiles, _resources.multiprocessor_count(a.device))
            spp = min(spp, NU)  # more than NU is one group: the same launch
            # per tile of out, the number of groups folded so far, then the ticket counter (the chain's handoff)
            sync = torch.zeros(tiles + 1, dtype=torch.int32, device=a.device)
            _resources.launch_fitting("fold_example_gemms", kernels.gemm_fold_chain_kernel, (-(-NU // spp) * tiles,),
                                      (a, b, init_c, out, sync, NU, NSEG, L, *mn, *strides, spp),
                                      {"HAS_INIT": has_init, **consts}, config, a, explicit=True, sizes=sizes)
        elif kind == "nest":
            _resources.launch_fitting("fold_example_gemms", kernels.gemm_fold_nest_kernel, (tiles,),
                                      (a, b, init_c, out, NU, NSEG, L, *mn, *strides),
                                      {"HAS_INIT": has_init, **consts}, config, a, explicit=True, sizes=sizes)
        elif kind == "partials":
            # segments on grid axis 1: at most 65535 per launch
            group = max(1, min(NU, 65535, GEMM_FOLD_WORKSPACE_BYTES // (4 * M * N)))
            buf = torch.empty(group, M * N, dtype=torch.float32, device=a.device)
            flat = out.view(-1)
            for u0 in range(0, NU, group):
                n = min(group, NU - u0)
                _resources.launch_fitting("fold_example_gemms", kernels.gemm_partials_kernel, (tiles, n),
                                          (a, b, buf, u0, NSEG, L, *mn, *strides), consts, config, a, explicit=True,
                                          sizes=sizes)
                # the partials in segment order onto init (then onto what the groups before left in out)
                first = (init_c.view(-1) if has_init else None) if u0 == 0 else flat
                _fold_rows(buf[:n], first, torch.float32, out=flat, block=1024)  # block as measured in exp7
        elif kind in ("tma", "tma-persistent"):
            for name, t in (("a", a), ("b", b)):
                if not tma_ready(t):
                    raise ValueError(f"{name}: the {kind!r} variant expects bf16/fp16 with unit stride on the last "
                                     f"axis and 16-byte aligned data and strides, got {t.dtype}, strides "
                                     f"{t.stride()}, data pointer {t.data_ptr()}")
            from triton.tools.tensor_descriptor import TensorDescriptor

            a_desc = TensorDescriptor(a, list(a.shape), list(a.stride()), [1, BK, BM])
            b_desc = TensorDescriptor(b, list(b.shape), list(b.stride()), [1, BK, BN])
            tma_consts = {"HAS_INIT": has_init, "BM": BM, "BN": BN, "BK": BK, "GROUP_M": GROUP_M, "SEG": SEG}
            if kind == "tma":
                _resources.launch_fitting("fold_example_gemms", kernels.gemm_fold_tma_kernel, (tiles,),
                                          (a_desc, b_desc, init_c, out, NU, NSEG, L, M, N), tma_consts, config, a,
                                          explicit=True, sizes=sizes)
            else:
                programs = min(tiles, _resources.multiprocessor_count(a.device))
                _resources.launch_fitting("fold_example_gemms", kernels.gemm_fold_tma_persistent_kernel, (programs,),
                                          (a_desc, b_desc, init_c, out, NU, NSEG, L, M, N, programs), tma_consts,
                                          config, a, explicit=True, sizes=sizes)
        else:
            raise ValueError(f"variant: expected a kind of GEMM_FOLD_VARIANTS, got {kind!r}")


def tma_ready(t: torch.Tensor) -> bool:
    """Whether the ``"tma"`` variants of :data:`~ordered_ssd.fold.GEMM_FOLD_VARIANTS` can load ``t`` [E, L, W]
    (a CUDA tensor): bf16 or fp16, unit stride on the last axis, the data pointer and the other two strides
    multiples of 16 bytes (what a TMA descriptor requires)."""
    return (t.dtype in (torch.bfloat16, torch.float16) and t.stride(2) == 1 and t.data_ptr() % 16 == 0
            and t.stride(0) % 8 == 0 and t.stride(1) % 8 == 0)


def fold_example_gemms_grouped(dy: torch.Tensor, x: torch.Tensor, weight_dtype: torch.dtype,
                               group_bytes: int = LINEAR_GROUP_BYTES) -> torch.Tensor:
    """``fold_e(dy[e]^T @ x[e])`` [out, in] in ``weight_dtype``: the per-example algorithm of the projections' weight
    gradient (:func:`~ordered_ssd.ops.linear.ordered_linear_weight_grad`), taken where :func:`fold_example_gemms`
    is not (:func:`~ordered_ssd.fold.linear_weight_grad_is_fused`: fp64, off CUDA).

    Args: dy [E, L, out]; x [E, L, in]; ``group_bytes``: bound on the bytes of the partial buffer, in the
    accumulation dtype (bit-neutral).

    One GEMM per example (``torch.mm(..., out_dtype=torch.float32)`` for bf16/fp16 inputs on CUDA, a GEMM in the
    accumulation dtype otherwise: fp32, fp64 for fp64; cuBLAS picks its algorithm per GPU model) into a slot
    (aligned to 64 elements) of a group buffer,
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
        slot = -(-numel // 64) * 64  # slots aligned to 64 elements (256 bytes in fp32), as a fresh allocation would be
        group = max(1, min(batch, group_bytes // (acc_dtype.itemsize * slot)))
        buf = torch.empty(group, slot, dtype=acc_dtype, device=dy.device)
        fp32_out_of_half = dy.device.type == "cuda" and dy.dtype in (torch.bfloat16, torch.float16)
        dy_t = dy.transpose(1, 2)  # dy_t[b] is dy[b].t()
        for first in range(0, batch, group):
            last = min(batch, first + group)
            # the per-example views made in one call each (host time at large B)
            parts = buf[:last - first, :numel].view(last - first, out_features, in_features).unbind(0)
            for part, a, b in zip(parts, dy_t[first:last].unbind(0), x[first:last].unbind(0)):
                if fp32_out_of_half:
                    torch.mm(a, b, out_dtype=torch.float32, out=part)
                else:
                    torch.mm(a.to(acc_dtype), b.to(acc_dtype), out=part)
            acc = fold_dims(buf[:last - first, :numel], 0, dtype=acc_dtype, init=acc)
    dW = (acc.view(out_features, in_features) if acc is not None
          else torch.zeros(out_features, in_features, dtype=acc_dtype, device=dy.device))
    return dW.to(weight_dtype)
