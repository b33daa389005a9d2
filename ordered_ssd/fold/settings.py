"""Every setting of ordered-ssd's own code that decides the bits of a sum, with the reduction version.

The launch configurations of mamba-ssm's and causal-conv1d's kernels live in :mod:`csrc_bindings` (its pinned
table and rule, hashed by :func:`csrc_bindings.fingerprint`); this module holds the rest: the configurations of
ordered-ssd's own fold kernels and the shape rules that choose an algorithm or a partition. A change to a value
marked *order-deciding* gives other bits: raise :data:`REDUCTION_VERSION`, document the new order in
``docs/native.md``, and keep the literal path equal to the fast path. Values marked *bit-neutral* only change
speed or memory.

:func:`reduction_fingerprint` hashes the order-deciding values into the determinism fingerprint
(:func:`ordered_ssd.fingerprint.determinism_fingerprint`, field ``reduction``).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import torch

__all__ = ["accumulation_dtype", "GEMM_FOLD_CONFIGS", "GEMM_FOLD_FIT_RULE", "GEMM_FOLD_SEGMENT_L",
           "gemm_fold_segments", "LINEAR_GROUP_BYTES", "REDUCTION_VERSION", "CONV1D_BWD_TILE_L", "CONV1D_BWD_BLOCK_D",
           "CONV1D_BWD_NUM_WARPS", "gemm_fold_config",
           "gemm_fold_configs_for", "gemm_fold_shared_bytes", "reduction_fingerprint", "linear_weight_grad_is_fused",
           "GEMM_FOLD_PROGRAMS_PER_SM", "GEMM_FOLD_CHAIN_RULE", "gemm_fold_segments_per_program",
           "GEMM_FOLD_TIMED_RULE", "GEMM_FOLD_VARIANTS", "GEMM_FOLD_WORKSPACE_BYTES",
           "rmsnorm_rows_per_program", "RowInvariantGemmConfig", "ROW_INVARIANT_GEMM_CONFIGS",
           "row_invariant_gemm_order"]

def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Order-deciding rule. Dtype in which partials of a ``dtype`` gradient are folded: fp64 for fp64, else fp32.

    Raises:
        TypeError: ``dtype`` is not a ``torch.dtype``, or not a floating-point one.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype, got {type(dtype).__name__}")
    if not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating-point dtype, got {dtype}")
    return torch.float64 if dtype == torch.float64 else torch.float32


#: Order-deciding. Pinned launch configuration of :func:`~ordered_ssd.fold.fold_example_gemms`'s static kernel per
#: input dtype: ``(BM, BN, BK, GROUP_M, num_warps, num_stages)``; ``BK`` is how many positions of an example one
#: tensor-core step takes (the one order parameter: every variant of :data:`GEMM_FOLD_VARIANTS` keeps it; the
#: others are bit-neutral). bf16/fp16: of 7 tried on an H200, the fastest in total over the
#: bench shapes that take this path (S1, S2, S3, S5; docs/performance.md).
GEMM_FOLD_CONFIGS = {
    torch.bfloat16: (128, 128, 64, 8, 8, 4),
    torch.float16: (128, 128, 64, 8, 8, 4),
    torch.float32: (64, 64, 32, 8, 4, 2),
}

#: Name of the rule that fits :data:`GEMM_FOLD_CONFIGS` to a device's shared memory (:func:`gemm_fold_config`).
GEMM_FOLD_FIT_RULE = "gemm-fit-v1"

#: Order-deciding (reduction version 5). Positions per segment of :func:`~ordered_ssd.fold.fold_example_gemms` on
#: CUDA: example ``e`` of ``L`` positions is cut into ``ceil(L / GEMM_FOLD_SEGMENT_L)`` segments of this many
#: consecutive positions (the last one shorter), each segment's partial is computed alone, and the partials are
#: folded segment by segment, example 0's first. A shape-only constant (never the batch size), so an example's
#: partials are the same alone or in any batch. Sequences up to this length are one segment (with the bits of
#: reduction version 4 below 8192 positions). Why: a long sequence with few output tiles otherwise leaves most SMs
#: idle on one long K loop; the segments run in parallel (bench S4, L 65536: docs/performance.md).
GEMM_FOLD_SEGMENT_L = 16384


def gemm_fold_segments(seqlen: int) -> int:
    """Order-deciding rule: how many segments of :data:`GEMM_FOLD_SEGMENT_L` positions an example of ``seqlen``
    positions is cut into by :func:`~ordered_ssd.fold.fold_example_gemms` on CUDA: ``ceil(seqlen /
    GEMM_FOLD_SEGMENT_L)``, and 1 for ``seqlen == 0`` (one empty segment, whose partial is +0.0).

    Raises:
        TypeError: ``seqlen`` not an int. ValueError: ``seqlen`` below 0.
    """
    if isinstance(seqlen, bool) or not isinstance(seqlen, int):
        raise TypeError(f"seqlen: expected an int, got {type(seqlen).__name__}")
    if seqlen < 0:
        raise ValueError(f"seqlen: expected an int >= 0, got {seqlen}")
    return max(1, -(-seqlen // GEMM_FOLD_SEGMENT_L))


def gemm_fold_shared_bytes(config: tuple, dtype: torch.dtype) -> int:
    """Bytes of shared memory per program that :func:`~ordered_ssd.fold.fold_example_gemms`'s kernel asks at
    ``config`` = ``(BM, BN, BK, GROUP_M, num_warps, num_stages)`` for ``dtype`` inputs: a conservative estimate,
    ``max(num_stages, 2) * (BM * BK + BK * BN) * element size``.

    Why: the only tiles in shared memory are the pipelined loads of the K loop, one ``[BM, BK]`` tile of ``a`` and
    one ``[BK, BN]`` tile of ``b`` per buffer (the epilogue's layout conversion reuses them). Compiled with triton
    3.6.0 (``metadata.shared``, 16-byte aligned inputs), the kernel keeps ``num_stages`` buffers for bf16/fp16 on
    sm_90 (wgmma; at least 2) and ``num_stages - 1`` (at least 1) on sm_80/86/89 and for fp32 everywhere: bf16
    128x128x64 asks 131,072 / 98,304 / 65,536 bytes at 4 / 3 / 2 stages on sm_90 and 98,304 / 65,536 / 32,768 on
    sm_86. The estimate is the largest of these; should Triton still refuse the compiled kernel, the launch raises
    ``ValueError`` before anything runs (:func:`csrc_bindings._resources.launch_fitting`).
    """
    BM, BN, BK, _, _, stages = config
    return max(int(stages), 2) * (BM * BK + BK * BN) * dtype.itemsize


def gemm_fold_config(dtype: torch.dtype, shared_limit: int) -> tuple:
    """Bit-neutral rule ``gemm-fit-v1``: the configuration of :func:`~ordered_ssd.fold.fold_example_gemms`'s kernel
    for ``dtype`` inputs on a device that allows ``shared_limit`` bytes of shared memory per program.

    :data:`GEMM_FOLD_CONFIGS` ``[dtype]`` if its :func:`gemm_fold_shared_bytes` fits, else the same configuration
    with ``num_stages`` lowered one at a time (down to 1); the first that fits. ``num_stages`` only sets how many
    K blocks the pipeliner loads ahead: the loop body (``p = tl.dot(a, b, p)`` over the K blocks in order, then
    ``acc += p`` per segment) and hence every bit of the result are the same (compared bit for bit by the GPU
    test ``tests/gpu/fold/test_gemm_fold_fit.py``). On the H200 (232,448 bytes) and the A100 (166,912) the pinned
    configurations fit; on sm_86/sm_89 (101,376) bf16/fp16 run at 3 stages. A pure function of ``dtype`` and
    ``shared_limit``.

    Raises:
        KeyError: ``dtype`` has no pinned configuration.
        ValueError: not even one stage fits (message names the configuration, the bytes and the limit).
    """
    pinned = GEMM_FOLD_CONFIGS[dtype]
    for stages in range(pinned[5], 0, -1):
        config = pinned[:5] + (stages,)
        if gemm_fold_shared_bytes(config, dtype) <= shared_limit:
            return config
    raise ValueError(f"fold_example_gemms: configuration (BM, BN, BK, GROUP_M, num_warps, num_stages) = {pinned} for "
                     f"{dtype} asks {gemm_fold_shared_bytes(pinned[:5] + (1,), dtype)} bytes of shared memory per "
                     f"program even at num_stages=1, more than the {shared_limit} bytes the device allows "
                     f"(shared_memory_per_block_optin)")


def gemm_fold_configs_for(shared_limit: int | None = None) -> dict:
    """``{dtype: configuration}`` that :func:`gemm_fold_config` picks for every dtype on a device allowing
    ``shared_limit`` bytes (None: :data:`GEMM_FOLD_CONFIGS` as pinned). A dtype that fits nowhere is left out."""
    if shared_limit is None:
        return dict(GEMM_FOLD_CONFIGS)
    out = {}
    for dtype in GEMM_FOLD_CONFIGS:
        try:
            out[dtype] = gemm_fold_config(dtype, int(shared_limit))
        except ValueError:
            continue
    return out


#: Bit-neutral. Programs per multiprocessor that :func:`~ordered_ssd.fold.fold_example_gemms` aims at when it splits
#: the segments into groups of consecutive ones (rule ``gemm-chain-v1``, :func:`gemm_fold_segments_per_program`).
GEMM_FOLD_PROGRAMS_PER_SM = 8

#: Name of the rule that sets how many segments one program of :func:`~ordered_ssd.fold.fold_example_gemms` folds.
GEMM_FOLD_CHAIN_RULE = "gemm-chain-v1"


def gemm_fold_segments_per_program(segments: int, tiles: int, multiprocessors: int) -> int:
    """Bit-neutral rule ``gemm-chain-v1``: how many consecutive segments (:func:`gemm_fold_segments` per example;
    one per example up to :data:`GEMM_FOLD_SEGMENT_L` positions) one program of
    :func:`~ordered_ssd.fold.fold_example_gemms`'s kernel folds into its output tile.

    Args:
        segments: the segments of the launch (0 allowed).
        tiles: output tiles of the launch (``ceil(M / BM) * ceil(N / BN)``, at least 1).
        multiprocessors: SMs of the device (132 on the H200, at least 1).

    Returns:
        ``ceil(S / wanted)`` for ``S`` segments, with ``wanted = min(S, max(1, ceil(GEMM_FOLD_PROGRAMS_PER_SM *
        multiprocessors / tiles)))`` (1 for ``S = 0``): about 8 programs per SM, enough to fill the device when the
        tiles are few, few hand-offs when they are many. The launch then has ``ceil(S / result)`` groups, which may
        be fewer than ``wanted`` (64 segments, 59 wanted: 2 per program, 32 groups).

    Raises:
        TypeError: an argument that is not an int. ValueError: ``tiles`` or ``multiprocessors`` below 1, or
        ``segments`` below 0.

    Why it changes no bit: every output element gets one fp32 addition per segment, in segment order, of a partial
    computed from that segment alone, whichever program holds the segment (``kernels.gemm_fold_chain_kernel``).
    Checked on the H200: groupings 1, 2, 3, 7, ``S // 2``, ``S`` and the rule's in bf16, fp16 and fp32
    (``tests/gpu/fold/test_gemm_fold.py``), and 1 to 64 in powers of two on the bench shapes' projections.
    Speed there (``docs/performance.md``, "Projection weight gradients"): at S5's in_proj (64 examples of 512
    positions, 156 tiles) about 1.3 ms at 1 to 16 examples per program, 1.84 ms with one program per tile over all
    examples (the kernel before this rule); native's single cuBLAS GEMM takes 0.24 ms.
    """
    for name, v in (("segments", segments), ("tiles", tiles), ("multiprocessors", multiprocessors)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if segments < 0 or tiles < 1 or multiprocessors < 1:
        raise ValueError(f"expected segments >= 0, tiles >= 1 and multiprocessors >= 1, got segments={segments}, "
                         f"tiles={tiles}, multiprocessors={multiprocessors}")
    if segments == 0:
        return 1
    groups = min(segments, max(1, -(-GEMM_FOLD_PROGRAMS_PER_SM * multiprocessors // tiles)))
    return -(-segments // groups)


#: Name of the rule by which :func:`~ordered_ssd.fold.fold_example_gemms` times its bit-neutral variants at the
#: first launch of a shape and keeps the least costly (:data:`GEMM_FOLD_VARIANTS`). v1 ranked them by GPU time
#: alone; v2 (2026-12-01) by GPU time plus the host time of their launches (``gemm._gpu_and_host_ms``): at
#: S5 (64 examples of 512 positions) v1 took ``"partials"`` for in_proj, 22 groups of 3 examples, 44 launches, on a
#: step that waits on the host.
GEMM_FOLD_TIMED_RULE = "gemm-timed-v2"

#: Bit-neutral. The launch variants of :func:`~ordered_ssd.fold.fold_example_gemms` for bf16/fp16 inputs on sm_90
#: that rule ``gemm-timed-v2`` times, each ``(kind, (BM, BN, BK, GROUP_M, num_warps, num_stages))``; the first is
#: the static choice (the pinned configuration, :func:`gemm_fold_config`, and rule ``gemm-chain-v1``):
#:
#: * ``"chain"``: ``kernels.gemm_fold_chain_kernel``, programs per (group of segments, tile), the running sum
#:   handed down a chain;
#: * ``"nest"``: ``kernels.gemm_fold_nest_kernel``, one program per tile over all segments in registers;
#: * ``"partials"``: ``kernels.gemm_partials_kernel`` writes the fp32 partials of all segments in parallel (timed
#:   only where they fit :data:`GEMM_FOLD_WORKSPACE_BYTES` together, so one group: two launches whatever the batch),
#:   then ``kernels.fold_kernel`` adds them to the running sum in segment order;
#: * ``"tma"``: ``kernels.gemm_fold_tma_kernel``, the nest kernel with its operand blocks loaded by the tensor
#:   memory accelerator (host tensor descriptors over ``[E, L, M]`` and ``[E, L, N]``); ``"tma-persistent"``:
#:   ``kernels.gemm_fold_tma_persistent_kernel``, the same on ``min(tiles, multiprocessors)`` programs that take
#:   the tiles in turn. Timed only where both operands allow TMA (``gemm.tma_ready``: unit stride on the last axis,
#:   16-byte aligned data and strides).
#:
#: Why every variant gives the same bits: each output element is ``init`` (or +0.0) plus, one fp32 addition per
#: segment (:data:`GEMM_FOLD_SEGMENT_L`) in segment order, a partial computed from that segment alone as a chain of
#: tensor-core products over K blocks of ``BK`` = 64 positions in order. The tile shape, ``GROUP_M``, warps, stages
#: and which program or launch computes which partial decide no addition. Checked bit for bit on the H200 (triton
#: 3.6.0) at 12 projections of the bench shapes (S5, G6, G7, S2, G11, G1; 2026-12-01), at 17 (every grid row's
#: kind of projection, 2026-12-01, with the chain at 64 x 64 tiles among 16 candidates), at 20 (the TMA kernels at
#: 11 configurations, 2026-12-01) and by ``tests/gpu/fold/test_gemm_fold.py``.
#: A TMA load zero-fills what lies past the tensor (positions past ``L``, rows past ``M`` or ``N``) as the other
#: kernels' masked loads do, and a segment's K blocks never reach past its end but at ``L``.
#:
#: Why these (docs/performance.md at fd1275b, "Projection-fold variants"): over those 17 projections the chain was
#: the fastest or within 3 % of it on 11; ``"nest"`` at 128 x 128 on the out_proj-like ones (S5, G4, G2 out_proj,
#: S1 in_proj); the chain at 64 x 64 where the output has few tiles (G1's in_proj, 18 tiles at 128 x 128: 0.19 ms
#: against 0.28); ``"partials"`` where all partials fit one workspace (G1's out_proj: 0.11 against 0.27).
#: ``"nest"`` at 128 x 128 with 4 warps was the fastest at G11's in_proj (3.08 ms against 4.68 for the chain;
#: H200, 2026-12-01). The nest kernel with ``tl.range(flatten=True)`` on its segment loop is not listed: Triton 3.6
#: compiles that loop nest unchanged (the same TTGIR but for the attribute), so it is ``"nest"`` under another
#: name. The TMA kernels (2026-12-01, 20 projections, docs/performance.md at fd1275b, "TMA projection folds"):
#: persistent at 128 x 256 was the fastest of all at the long-example in_proj (G12's 1.74 ms against the chain's
#: 2.02 and cuBLAS's 1.60; G6's 0.67 against 0.88), one tile per program at 128 x 128 with 4 warps, 64 x 128 and
#: 64 x 64 at most out_proj-like ones and G1's in_proj.
GEMM_FOLD_VARIANTS = (
    ("chain", None),
    ("chain", (64, 64, 64, 8, 4, 4)),
    ("nest", (128, 128, 64, 8, 8, 4)),
    ("nest", (128, 128, 64, 8, 4, 3)),
    ("nest", (64, 128, 64, 8, 4, 4)),
    ("partials", (128, 256, 64, 8, 8, 3)),
    ("partials", (128, 128, 64, 8, 8, 4)),
    ("tma", (128, 128, 64, 8, 4, 4)),
    ("tma", (64, 128, 64, 8, 4, 4)),
    ("tma", (64, 64, 64, 8, 4, 4)),
    ("tma-persistent", (128, 256, 64, 8, 8, 3)),
    ("tma-persistent", (128, 128, 64, 8, 8, 4)),
)

#: Bit-neutral. Bound on the fp32 workspace of the ``"partials"`` variant of :data:`GEMM_FOLD_VARIANTS` (bytes).
GEMM_FOLD_WORKSPACE_BYTES = 32 << 20

#: Whether :func:`~ordered_ssd.fold.fold_example_gemms` may time its variants (rule ``gemm-timed-v2``); a test
#: hook: False launches the static choice for every shape not timed yet.
GEMM_FOLD_TIMING = True


#: Bit-neutral. Bound on the bytes of the fp32 buffer of per-example weight-gradient partials that
#: :func:`~ordered_ssd.fold.fold_example_gemms_grouped` (fp64, off CUDA) folds in one launch (at least one
#: example; the group size depends on the shape alone and never changes a value).
LINEAR_GROUP_BYTES = 64 << 20

#: Order-deciding. Positions per tile of the conv1d weight/bias gradient partials
#: (:func:`~ordered_ssd.fold.conv1d_weight_grad_partials`): example ``b``'s partial ``t`` sums positions
#: ``t * CONV1D_BWD_TILE_L ...`` up to the next tile, one position at a time, and the tiles are folded in order.
#: A shape-only constant (never the batch size), so an example's partials are the same alone or in any batch. A
#: multiple of 4 (the kernel loads four positions at a time).
CONV1D_BWD_TILE_L = 128

#: Bit-neutral. Channels per program of the conv1d partials kernel: no operation mixes channels (each channel's
#: sums are its own registers' sequence), so the block only decides which channels a program owns, never an order.
CONV1D_BWD_BLOCK_D = 64

#: Bit-neutral. Warps per program of the conv1d partials kernel: it only decides how many channels a lane holds
#: (two at 64 channels and one warp), never an order. One warp per 64 channels was the fastest of BLOCK_D
#: 64/128/256 x 1/2/4/8 warps on the H200 at eight layer shapes (B 1..64, L 512..65536, 544..8704 channels;
#: 2026-12-03), all with the same bits.
CONV1D_BWD_NUM_WARPS = 1

#: Version of ordered-ssd's own reduction algorithms on the CUDA path; raised whenever a change gives other bits
#: for the same kernels and pinned table. 1: grouped per-example cuBLAS GEMMs for the projections; 2:
#: :func:`~ordered_ssd.fold.fold_example_gemms` below 8192 positions; 3: the conv1d weight/bias
#: gradients from ordered-ssd's own per-(example, tile) partials kernel (:data:`CONV1D_BWD_TILE_L`) instead of
#: causal-conv1d's channel-first backward called once per example; 4: at ``L == 1`` (one position per example)
#: :func:`~ordered_ssd.fold.fold_example_gemms` adds every example's partial to the running sum as a separate fp32
#: addition (the kernels no longer let Triton compile ``L == 1`` as a constant, which folded the addition into
#: the tensor-core accumulation for all but each program's first example, so the bits could depend on the grouping);
#: other lengths are expected to keep version 3's bits (the same fp32 additions in the sm_90 code; the committed
#: digests, ``L`` = 100, matched on the H200); 5: the projections' weight gradients on CUDA come from
#: :func:`~ordered_ssd.fold.fold_example_gemms` at every sequence length, over per-(example, segment) partials of
#: :data:`GEMM_FOLD_SEGMENT_L` positions (from 8192 positions on, version 4 ran one cuBLAS GEMM per example, so its
#: launches grew with the batch); sequences shorter than 8192 positions keep version 4's bits; 6: the reference path
#: (the CPU, fp64) computes each sequence alone, chunk by chunk, and folds the parameter gradients over sequences
#: (:mod:`ordered_ssd.reference.canonical`), so a sequence's bits do not depend on its layout; the CUDA path keeps
#: version 5's bits; 7: with ``sequence_invariant`` on CUDA (an option, off by default) each run of ``seq_idx`` is
#: computed as its own row, so the parameter gradients fold over sequences as over the rows of a batch, and the
#: projections run the row-invariant GEMM (its ``block_k`` is in the fingerprint); the default CUDA path and the
#: reference path keep version 6's bits.
REDUCTION_VERSION = 7


@dataclass(frozen=True)
class RowInvariantGemmConfig:
    """The pinned launch configuration of the row-invariant GEMM for one input dtype.

    ``block_k`` decides the order of the sum (the ``K`` loop's blocks, each a sequence of tensor-core products
    added to the fp32 accumulator): changing it changes bits, so it is fingerprinted
    (:func:`ordered_ssd.fold.reduction_fingerprint`). ``block_m``, ``block_n``, ``group_m`` only decide which
    program computes which tile; ``num_warps`` and ``num_stages`` how. All are pinned anyway: nothing here is chosen
    at run time. ``provenance``: where the values come from.
    """
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    provenance: str


_PROVENANCE = ("pinned 2026-12-07: the usual Hopper tile for a bf16/fp16 Triton GEMM (128x128x64, 8 warps, 3 "
               "stages), fits the shared memory of sm_80 and sm_90; fp32 (IEEE products) at 64x64x32")

#: dtype -> :class:`RowInvariantGemmConfig` (one literal per dtype; no autotuning, no shape rule).
ROW_INVARIANT_GEMM_CONFIGS = {
    torch.bfloat16: RowInvariantGemmConfig(128, 128, 64, 8, 8, 3, _PROVENANCE),
    torch.float16: RowInvariantGemmConfig(128, 128, 64, 8, 8, 3, _PROVENANCE),
    torch.float32: RowInvariantGemmConfig(64, 64, 32, 8, 4, 3, _PROVENANCE),
}


def row_invariant_gemm_order() -> dict:
    """The order-deciding part of the configurations, ``{dtype name: block_k}`` (for the reduction fingerprint)."""
    return {str(k).replace("torch.", ""): v.block_k for k, v in ROW_INVARIANT_GEMM_CONFIGS.items()}


def reduction_fingerprint(device=None) -> str:
    """``"v{REDUCTION_VERSION} gemm={hash}"``: the CUDA path's reduction algorithms and their settings (the fold
    kernel's configurations, :data:`GEMM_FOLD_SEGMENT_L`, :data:`CONV1D_BWD_TILE_L`, the row-invariant GEMM's
    ``block_k`` per dtype); part of the determinism
    fingerprint.

    ``device`` None: the pinned :data:`GEMM_FOLD_CONFIGS`. A CUDA ``device``: the configurations
    :func:`gemm_fold_config` picks for its shared-memory limit (on a device where every pinned one fits, such as the
    H200, the same hash as None)."""
    limit = None
    if device is not None and torch.device(device).type == "cuda":
        from csrc_bindings import _resources  # imports nothing native

        limit = _resources.shared_memory_limit(device)
    configs = gemm_fold_configs_for(limit)
    settings = json.dumps({"configs": {str(k): list(v) for k, v in configs.items()},
                           "segment_l": GEMM_FOLD_SEGMENT_L, "conv1d_tile_l": CONV1D_BWD_TILE_L,
                           "row_invariant_gemm": row_invariant_gemm_order()},
                          sort_keys=True)
    return f"v{REDUCTION_VERSION} gemm={hashlib.sha256(settings.encode()).hexdigest()[:12]}"


def linear_weight_grad_is_fused(dy: torch.Tensor, weight_dtype: torch.dtype) -> bool:
    """Order-deciding rule: whether :func:`~ordered_ssd.ops.linear.ordered_linear_weight_grad` runs
    :func:`~ordered_ssd.fold.fold_example_gemms` (one launch, any sequence length) rather than one GEMM per example
    (:func:`~ordered_ssd.fold.fold_example_gemms_grouped`): on CUDA, bf16/fp16/fp32 inputs and an fp32
    accumulator. Depends on the device type and dtypes only (never on the batch size)."""
    return (dy.device.type == "cuda" and dy.dtype in GEMM_FOLD_CONFIGS
            and accumulation_dtype(weight_dtype) == torch.float32)


def rmsnorm_rows_per_program(seqlen: int, chunk_size: int) -> int:
    """Order-deciding rule: the row block of the gated-RMSNorm weight-gradient partials, ``gcd(L, chunk_size)``
    rows: the largest divisor of ``L`` that divides ``chunk_size``, so every partial lies inside one example (and
    one chunk) and the partition depends only on the shape."""
    return math.gcd(seqlen, chunk_size)
