"""The fold's Triton kernels, as ordinary top-level ``@triton.jit`` functions.

Imported lazily by :mod:`ordered_ssd.fold.primitives` (on CUDA only), so ``import ordered_ssd`` never imports
triton. Every kernel adds in the order the docstring of :mod:`ordered_ssd.fold` states: one fp32 addition at a
time, the partition index in a sequential loop inside one program (or, in :func:`gemm_fold_chain_kernel`, handed
from program to program in order), so the block sizes of the launches (bit-neutral: they only decide which output
elements a program owns) never change a value.

The GEMM folds take ``L`` (positions per example) with ``do_not_specialize``: Triton would otherwise compile
``L == 1`` as a constant, unroll the partial's one-block K loop, and fold the running sum's ``acc += p`` into the
tensor-core accumulation (``dot(a, b, acc)``), so at ``L == 1`` an example's addition would be the MMA's, not a
separate fp32 addition, for the examples after a program's first: bits that depend on the grouping, hence on the
batch size and the GPU's SM count (reduction version 4 removes this).
"""
import triton
import triton.language as tl


@triton.jit
def fold_kernel(p_ptr, init_ptr, out_ptr, K, M, stride_k, HAS_INIT: tl.constexpr, BLOCK: tl.constexpr):
    """``out[m] = (((init[m] or +0.0) + p[0, m]) + p[1, m]) + ...`` in fp32; one program per ``BLOCK`` of m."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_INIT:
        acc += tl.load(init_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for k in range(0, K):
        acc += tl.load(p_ptr + tl.cast(k, tl.int64) * stride_k + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc, mask=mask)


@triton.jit
def _fold_one(p_ptr, out_ptr, KO, KI, M, MI, s_ko, s_ki, s_mo, s_mi, blk, BLOCK: tl.constexpr):
    """One block of one fold of :func:`fold_many_kernel`: ``out[m] = ((+0.0 + p[k=0, m]) + p[k=1, m]) + ...`` in fp32
    over ``k = ko * KI + ki`` in order, element ``(k, m)`` at ``ko * s_ko + ki * s_ki + mo * s_mo + mi * s_mi``
    with ``m = mo * MI + mi``."""
    m = blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = m < M
    mo = m // MI
    base = p_ptr + mo * s_mo + (m - mo * MI) * s_mi
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ko in range(0, KO):  # pointers advanced by the strides: 64-bit, and the interpreter runs it
        ptrs = base
        for _ki in range(0, KI):
            acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            ptrs += s_ki
        base += s_ko
    tl.store(out_ptr + m, acc, mask=mask)


@triton.jit
def _fold_blocks(p_ptr, out_ptr, KO, KI, M, MI, s_ko, s_ki, s_mo, s_mi, pid, start, BLOCK: tl.constexpr):
    """Programs ``start .. start + cdiv(M, BLOCK) - 1`` of :func:`fold_many_kernel` fold this partial tensor (block
    ``pid - start`` of it); returns where the next fold's programs start."""
    n = tl.cdiv(M, BLOCK)
    if (pid >= start) & (pid < start + n):
        _fold_one(p_ptr, out_ptr, KO, KI, M, MI, s_ko, s_ki, s_mo, s_mi, pid - start, BLOCK)
    return start + n


@triton.jit
def fold_many_kernel(p0, o0, KO0, KI0, M0, MI0, sko0, ski0, smo0, smi0,
                     p1, o1, KO1, KI1, M1, MI1, sko1, ski1, smo1, smi1,
                     p2, o2, KO2, KI2, M2, MI2, sko2, ski2, smo2, smi2,
                     p3, o3, KO3, KI3, M3, MI3, sko3, ski3, smo3, smi3,
                     p4, o4, KO4, KI4, M4, MI4, sko4, ski4, smo4, smi4,
                     p5, o5, KO5, KI5, M5, MI5, sko5, ski5, smo5, smi5,
                     p6, o6, KO6, KI6, M6, MI6, sko6, ski6, smo6, smi6,
                     p7, o7, KO7, KI7, M7, MI7, sko7, ski7, smo7, smi7,
                     NFOLDS: tl.constexpr, BLOCK: tl.constexpr):
    """Up to 8 independent folds in one launch (Triton has no array of pointers: one argument group per fold):
    fold ``i`` owns ``cdiv(M_i, BLOCK)`` consecutive programs (fold 0 first) and each of its outputs is
    :func:`_fold_one`'s sequential fp32 sum, the loop of :func:`fold_kernel` without ``init``. Folds
    ``NFOLDS..7`` are not traced (their arguments are None)."""
    pid = tl.program_id(0)
    start = _fold_blocks(p0, o0, KO0, KI0, M0, MI0, sko0, ski0, smo0, smi0, pid, 0, BLOCK)
    if NFOLDS > 1:
        start = _fold_blocks(p1, o1, KO1, KI1, M1, MI1, sko1, ski1, smo1, smi1, pid, start, BLOCK)
    if NFOLDS > 2:
        start = _fold_blocks(p2, o2, KO2, KI2, M2, MI2, sko2, ski2, smo2, smi2, pid, start, BLOCK)
    if NFOLDS > 3:
        start = _fold_blocks(p3, o3, KO3, KI3, M3, MI3, sko3, ski3, smo3, smi3, pid, start, BLOCK)
    if NFOLDS > 4:
        start = _fold_blocks(p4, o4, KO4, KI4, M4, MI4, sko4, ski4, smo4, smi4, pid, start, BLOCK)
    if NFOLDS > 5:
        start = _fold_blocks(p5, o5, KO5, KI5, M5, MI5, sko5, ski5, smo5, smi5, pid, start, BLOCK)
    if NFOLDS > 6:
        start = _fold_blocks(p6, o6, KO6, KI6, M6, MI6, sko6, ski6, smo6, smi6, pid, start, BLOCK)
    if NFOLDS > 7:
        start = _fold_blocks(p7, o7, KO7, KI7, M7, MI7, sko7, ski7, smo7, smi7, pid, start, BLOCK)


@triton.jit
def example_sums_kernel(p_ptr, out_ptr, L, M, s_e, s_l, s_m, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """``out[e, m] = fold_l(p[e, l, m])`` in fp32: one example's sequential sum over its positions from +0.0, one
    fp32 addition per position, position 0 first; one program per ``(example e, BLOCK of m)``, ``out`` [E, M]
    contiguous. The position loop runs ``UNROLL`` positions per iteration (a static unroll, so that their loads are
    issued before their additions, which stay in order), then the last ``L % UNROLL`` one at a time: the same
    additions in the same order at any ``UNROLL`` and ``BLOCK``. :func:`~ordered_ssd.fold.fold_example_sums` folds
    the examples' sums afterwards, example 0 first (:func:`fold_kernel`)."""
    e = tl.program_id(0).to(tl.int64)
    m = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = m < M
    ptrs = p_ptr + e * s_e + m * s_m  # advanced by s_l: 64-bit, and the interpreter runs it
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    full = (L // UNROLL) * UNROLL
    for _g in range(0, full, UNROLL):
        for _i in tl.static_range(UNROLL):
            acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            ptrs += s_l
    for _l in range(full, L):
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        ptrs += s_l
    tl.store(out_ptr + e * M + m, acc, mask=mask)


@triton.jit
def scan_kernel(p_ptr, out_ptr, R, N, REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    """Running fp32 sum along each row of ``p`` [R, N] (position 0 first, or N - 1 first with ``REVERSE``)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < R
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, N):
        j = N - 1 - i if REVERSE else i
        acc += tl.load(p_ptr + rows * N + j, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows * N + j, acc, mask=mask)


@triton.jit
def dA_cumsum_grad_kernel(ddA_ptr, prev_ptr, chunk_ptr, next_ptr, R, N, BLOCK: tl.constexpr):
    """Per row ``r`` of the [R, N] fp32 buffers (R = examples x heads x chunks, N = chunk length), in place:
    ``prev[r, N-1] += chunk[r]``; ``prev[r]`` becomes its running sum from position N - 1 down to 0; then
    ``ddA[r, j] += next_cum[j] + prev[r, j]`` with ``next_cum`` the running sum of ``next[r]`` from position 0
    (``next`` is not written). Each running sum starts from +0.0 and adds one position at a time: the additions of
    :func:`scan_kernel` and of the elementwise adds it replaces (:func:`~ordered_ssd.fold.dA_cumsum_grad_scans`).

    The forward loop reads ``prev`` back after the reverse loop stored it, without a barrier: every load and store
    of a row has the same one-element-per-thread layout, so each thread reads back its own scalar stores, which the
    PTX memory model orders (``tests/fold/test_many.py`` checks that the compiled loads and stores stay scalar)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < R
    base = rows * N
    last = tl.load(prev_ptr + base + (N - 1), mask=mask, other=0.0) + tl.load(chunk_ptr + rows, mask=mask, other=0.0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    acc += last
    tl.store(prev_ptr + base + (N - 1), acc, mask=mask)
    for i in range(1, N):
        j = N - 1 - i
        acc += tl.load(prev_ptr + base + j, mask=mask, other=0.0)
        tl.store(prev_ptr + base + j, acc, mask=mask)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, N):
        acc += tl.load(next_ptr + base + j, mask=mask, other=0.0)
        both = acc + tl.load(prev_ptr + base + j, mask=mask, other=0.0)
        tl.store(ddA_ptr + base + j, tl.load(ddA_ptr + base + j, mask=mask, other=0.0) + both, mask=mask)


@triton.jit
def _gemm_partial(a_ptr, b_ptr, u, NSEG, L, M, N, s_ab, s_al, s_am, s_bb, s_bl, s_bn, rm, rn, rk, IEEE: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SEG: tl.constexpr, AQ: tl.constexpr,
                  BQ: tl.constexpr):
    """The [BM, BN] partial of segment ``u`` alone: example ``u // NSEG``, its positions ``s * SEG`` up to
    ``min(L, (s + 1) * SEG)`` with ``s = u % NSEG``, in K blocks of BK positions in order, fp32 accumulation.
    With ``NSEG == 1`` (``L <= SEG``) the segment is the whole example.

    ``s_ab``, ``s_al`` (``s_bb``, ``s_bl``) come divided by ``AQ`` (``BQ``), a power of two that divides both; the
    kernels likewise pass ``M`` and ``N`` divided by ``MQ`` and ``NQ`` and multiply them back first. The products
    by the constants tell the compiler that rows start aligned and that the masks are constant over aligned runs
    (Triton only knows an integer argument's divisibility by 16), so a width such as in_proj's 3224 still gets
    16-byte asynchronous copies. Addresses and masks only: no value changes."""
    s_ab = s_ab * AQ
    s_al = s_al * AQ
    s_bb = s_bb * BQ
    s_bl = s_bl * BQ
    e = u // NSEG
    start = (u - e * NSEG) * SEG
    n = min(SEG, L - start)  # positions of this segment (L - start for the last one)
    e64 = tl.cast(e, tl.int64)  # (a plain int in a tl.range loop under the interpreter: no .to)
    start64 = tl.cast(start, tl.int64)
    a_ptrs = a_ptr + e64 * s_ab + start64 * s_al + rm[:, None] * s_am + rk[None, :] * s_al
    b_ptrs = b_ptr + e64 * s_bb + start64 * s_bl + rk[:, None] * s_bl + rn[None, :] * s_bn
    p = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, n, BK):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < n - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < n - k0) & (rn[None, :] < N), other=0.0)
        if IEEE:
            p = tl.dot(a, b, p, input_precision="ieee")
        else:
            p = tl.dot(a, b, p)
        a_ptrs += BK * s_al
        b_ptrs += BK * s_bl
    return p


@triton.jit
def _tile_start(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """First row and first column of tile ``pid`` of an ``[M, N]`` output in the grouped order of the GEMM folds
    (for L2 reuse; it only decides which program owns which tile, never a value)."""
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gsz = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gsz
    pid_n = (pid % width) // gsz
    return pid_m * BM, pid_n * BN


@triton.jit
def _tile_of(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Row and column offsets of tile ``pid`` (:func:`_tile_start`)."""
    om, on = _tile_start(pid, M, N, BM, BN, GROUP_M)
    return om + tl.arange(0, BM), on + tl.arange(0, BN)


@triton.jit(do_not_specialize=["L"])  # L == 1 as a constant would fuse acc += p (module doc)
def gemm_fold_chain_kernel(a_ptr, b_ptr, init_ptr, out_ptr, sync_ptr, NU, NSEG, L, M, N, s_ab, s_al, s_am, s_bb,
                           s_bl, s_bn, SPP, HAS_INIT: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SEG: tl.constexpr,
                           AQ: tl.constexpr, BQ: tl.constexpr, MQ: tl.constexpr, NQ: tl.constexpr):
    """``out = fold_u(partial_u)`` over the ``NU`` segments (``NSEG`` per example, :func:`_gemm_partial`): one
    program per (group of ``SPP`` consecutive segments, tile of ``out``); the groups run in parallel and the tile's
    running sum is handed down a chain of programs, segment 0 first.

    ``sync_ptr``: int32 ``[tiles + 1]``, zero at launch. ``sync_ptr[tiles]`` hands out tickets: a program's ticket,
    not its program id, names its (group, tile), group-major, so every program it waits for has an earlier ticket
    and is running or done (no deadlock, whatever order the hardware starts programs in). ``sync_ptr[t]`` counts the
    groups already folded into tile ``t``. The program of group ``g`` computes the partial of its first segment,
    waits until the count is ``g``, reads the running sum (``init`` or +0.0 for ``g == 0``; past L1, after a
    load-acquire and a CTA barrier), adds the partial, then computes and adds its other segments' partials one at a
    time, writes the sum back and sets the count to ``g + 1`` (a release exchange after a CTA barrier). Every output
    element gets one fp32 addition per segment, in segment order, of a partial computed from that segment alone:
    the bits depend on neither ``SPP`` nor the number of examples (bit-neutral). ``M``, ``N`` and the example and
    position strides come divided by ``MQ``, ``NQ``, ``AQ``, ``BQ`` (:func:`_gemm_partial`).
    """
    M = M * MQ
    N = N * NQ
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    tiles = num_m * num_n
    ticket = tl.atomic_add(sync_ptr + tiles, 1)
    g = ticket // tiles
    pid = ticket - g * tiles
    rm, rn = _tile_of(pid, M, N, BM, BN, GROUP_M)
    rk = tl.arange(0, BK)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    out_offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    u0 = g * SPP
    count = min(SPP, NU - u0)
    p = _gemm_partial(a_ptr, b_ptr, u0, NSEG, L, M, N, s_ab, s_al, s_am, s_bb, s_bl, s_bn, rm, rn, rk, IEEE, BM, BN,
                      BK, SEG, AQ, BQ)
    count_ptr = sync_ptr + pid
    if g == 0:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if HAS_INIT:
            acc += tl.load(init_ptr + out_offs, mask=out_mask, other=0.0).to(tl.float32)
    else:
        while tl.atomic_add(count_ptr, 0, sem="acquire") < g:
            pass
        tl.debug_barrier()
        acc = tl.load(out_ptr + out_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
    acc += p  # the lexical fold: one fp32 addition per segment, segment 0 first
    for i in range(1, count):
        acc += _gemm_partial(a_ptr, b_ptr, u0 + i, NSEG, L, M, N, s_ab, s_al, s_am, s_bb, s_bl, s_bn, rm, rn, rk, IEEE,
                             BM, BN, BK, SEG, AQ, BQ)
    tl.store(out_ptr + out_offs, acc, mask=out_mask)
    tl.debug_barrier()
    tl.atomic_xchg(count_ptr, g + 1, sem="release")


@triton.jit(do_not_specialize=["L"])  # L == 1 as a constant would fuse acc += p (module doc)
def gemm_fold_nest_kernel(a_ptr, b_ptr, init_ptr, out_ptr, NU, NSEG, L, M, N, s_ab, s_al, s_am, s_bb, s_bl, s_bn,
                          HAS_INIT: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SEG: tl.constexpr,
                          AQ: tl.constexpr, BQ: tl.constexpr, MQ: tl.constexpr, NQ: tl.constexpr):
    """``out = fold_u(partial_u)``, one program per tile of ``out`` over all ``NU`` segments: per segment the
    partial of :func:`_gemm_partial` (K blocks of BK positions in order from +0.0, fp32 accumulation), added to the
    tile's running sum (``init`` or +0.0) in registers, segment 0 first: the additions of
    :func:`gemm_fold_chain_kernel`, without the hand-off.
    ``M``, ``N`` and the strides as in :func:`gemm_fold_chain_kernel`."""
    M = M * MQ
    N = N * NQ
    rm, rn = _tile_of(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rk = tl.arange(0, BK)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    out_offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if HAS_INIT:
        acc += tl.load(init_ptr + out_offs, mask=out_mask, other=0.0).to(tl.float32)
    for u in range(0, NU):
        p = _gemm_partial(a_ptr, b_ptr, u, NSEG, L, M, N, s_ab, s_al, s_am, s_bb, s_bl, s_bn, rm, rn, rk, IEEE, BM, BN,
                          BK, SEG, AQ, BQ)
        acc += p
    tl.store(out_ptr + out_offs, acc, mask=out_mask)


@triton.jit(do_not_specialize=["L"])  # L == 1 as a constant would fuse acc += p (module doc)
def gemm_partials_kernel(a_ptr, b_ptr, p_ptr, U0, NSEG, L, M, N, s_ab, s_al, s_am, s_bb, s_bl, s_bn,
                         IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         GROUP_M: tl.constexpr, SEG: tl.constexpr, AQ: tl.constexpr, BQ: tl.constexpr,
                         MQ: tl.constexpr, NQ: tl.constexpr):
    """``p[j]`` = the fp32 partial of segment ``U0 + j`` (``p`` contiguous ``[*, M, N]``): one program per (tile,
    segment ``j``), the partial of :func:`_gemm_partial`; :func:`fold_kernel` then adds them in segment order.
    ``M``, ``N`` and the strides as in :func:`gemm_fold_chain_kernel`."""
    M = M * MQ
    N = N * NQ
    j = tl.program_id(1)
    rm, rn = _tile_of(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rk = tl.arange(0, BK)
    p = _gemm_partial(a_ptr, b_ptr, U0 + j, NSEG, L, M, N, s_ab, s_al, s_am, s_bb, s_bl, s_bn, rm, rn, rk, IEEE, BM,
                      BN, BK, SEG, AQ, BQ)
    offs = j.to(tl.int64) * M * N + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(p_ptr + offs, p, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _tma_partial(a_desc, b_desc, u, NSEG, L, om, on, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 SEG: tl.constexpr):
    """:func:`_gemm_partial` with the operand blocks loaded by the tensor memory accelerator (TMA, sm_90):
    ``a_desc`` / ``b_desc`` are host tensor descriptors over ``a`` [E, L, M] and ``b`` [E, L, N] with blocks
    ``[1, BK, BM]`` / ``[1, BK, BN]``; the block at ``(e, start + k0, om)`` is the one :func:`_gemm_partial` loads,
    and the positions past ``L`` (the only positions past a segment's end that a K block of a segment can reach,
    every segment but an example's last being a multiple of ``BK`` long) and the rows past ``M`` / ``N`` arrive as
    zeros, as its masked loads give them. The same products in the same order."""
    e = u // NSEG
    start = (u - e * NSEG) * SEG
    n = min(SEG, L - start)
    p = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(0, n, BK):
        a = a_desc.load([e, start + k0, om]).reshape(BK, BM)
        b = b_desc.load([e, start + k0, on]).reshape(BK, BN)
        p = tl.dot(a.T, b, p)
    return p


@triton.jit
def _tma_tile(a_desc, b_desc, init_ptr, out_ptr, t, NU, NSEG, L, M, N, HAS_INIT: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SEG: tl.constexpr):
    """Tile ``t`` of ``out``: the additions of :func:`gemm_fold_nest_kernel` (the running sum ``init`` or +0.0 in
    registers, plus each segment's partial, segment 0 first), the partials by :func:`_tma_partial`."""
    om, on = _tile_start(t, M, N, BM, BN, GROUP_M)
    rm = om + tl.arange(0, BM)
    rn = on + tl.arange(0, BN)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    out_offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if HAS_INIT:
        acc += tl.load(init_ptr + out_offs, mask=out_mask, other=0.0).to(tl.float32)
    for u in tl.range(0, NU):
        acc += _tma_partial(a_desc, b_desc, u, NSEG, L, om, on, BM, BN, BK, SEG)
    tl.store(out_ptr + out_offs, acc, mask=out_mask)


@triton.jit(do_not_specialize=["L"])  # L == 1 as a constant would fuse acc += p (module doc)
def gemm_fold_tma_kernel(a_desc, b_desc, init_ptr, out_ptr, NU, NSEG, L, M, N, HAS_INIT: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                         SEG: tl.constexpr):
    """:func:`gemm_fold_nest_kernel` with TMA loads (:func:`_tma_partial`): one program per tile of ``out``.
    bf16/fp16 ``a`` and ``b`` with unit stride on their last axis and 16-byte aligned data and strides."""
    _tma_tile(a_desc, b_desc, init_ptr, out_ptr, tl.program_id(0), NU, NSEG, L, M, N, HAS_INIT, BM, BN, BK, GROUP_M,
              SEG)


@triton.jit(do_not_specialize=["L"])  # L == 1 as a constant would fuse acc += p (module doc)
def gemm_fold_tma_persistent_kernel(a_desc, b_desc, init_ptr, out_ptr, NU, NSEG, L, M, N, PROGRAMS,
                                    HAS_INIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                                    GROUP_M: tl.constexpr, SEG: tl.constexpr):
    """:func:`gemm_fold_tma_kernel` on ``PROGRAMS`` programs (the launch's grid), each taking the tiles ``pid``,
    ``pid + PROGRAMS``, ... in turn: which program computes a tile decides no addition."""
    tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    for t in tl.range(tl.program_id(0), tiles, PROGRAMS):
        _tma_tile(a_desc, b_desc, init_ptr, out_ptr, t, NU, NSEG, L, M, N, HAS_INIT, BM, BN, BK, GROUP_M, SEG)


@triton.jit
def _conv_load(x_b, o_b, s_b, pos, L, dmask, s_xl, s_ol, s_sl, HAS_SEQ: tl.constexpr):
    """Position ``pos`` of :func:`conv1d_grad_partials_kernel`'s tile: ``(x, dout, seq id)`` (0, 0, -1 past L)."""
    valid = pos < L
    x0 = tl.load(x_b + pos * s_xl, mask=dmask & valid, other=0.0).to(tl.float32)
    g = tl.load(o_b + pos * s_ol, mask=dmask & valid, other=0.0).to(tl.float32)
    q0 = -1
    if HAS_SEQ:
        q0 = tl.load(s_b + pos * s_sl, mask=valid, other=-1)
    return x0, g, q0


@triton.jit
def _conv_step(x0, g, q0, h1, h2, h3, q1, q2, q3, wl0, wl1, wl2, wl3, bias, acc0, acc1, acc2, acc3, accb,
               W: tl.constexpr, HAS_SEQ: tl.constexpr, SILU: tl.constexpr):
    """One position of :func:`conv1d_grad_partials_kernel` (its docstring has the math): the masked taps, ``g``,
    one fp32 addition per partial; returns the shifted history and the sums."""
    m1 = h1
    m2 = h2
    m3 = h3
    if HAS_SEQ:
        m1 = tl.where(q1 == q0, h1, 0.0)
        m2 = tl.where(q2 == q0, h2, 0.0)
        m3 = tl.where(q3 == q0, h3, 0.0)
    if SILU:
        pre = bias
        if W >= 4:
            pre = pre + wl3 * m3
        if W >= 3:
            pre = pre + wl2 * m2
        pre = pre + wl1 * m1
        pre = pre + wl0 * x0
        sig = 1.0 / (1.0 + tl.exp(-pre))
        g = g * (sig * (1.0 + pre * (1.0 - sig)))
    acc0 += g * x0
    acc1 += g * m1
    if W >= 3:
        acc2 += g * m2
    if W >= 4:
        acc3 += g * m3
    accb += g
    return x0, h1, h2, q0, q1, q2, acc0, acc1, acc2, acc3, accb


@triton.jit
def conv1d_grad_partials_kernel(x_ptr, w_ptr, bias_ptr, dout_ptr, seq_ptr, dw_ptr, db_ptr, L, DIM, NT,
                                s_xb, s_xd, s_xl, s_ob, s_od, s_ol, s_sb, s_sl, s_wd, s_ww,
                                W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEQ: tl.constexpr,
                                SILU: tl.constexpr, TILE_L: tl.constexpr, BLOCK_D: tl.constexpr):
    """ordered-ssd's conv1d weight/bias gradient partials: one program per (example b, tile t, channel block).

    Math (causal-conv1d's backward formula): with ``m_j[d, l] = x[d, l - j]`` (zero before position 0, and zero
    where ``seq_idx[l - j] != seq_idx[l]``), ``pre = (((bias + w[0] m_{W-1}) + w[1] m_{W-2}) + ...) + w[W-1] m_0``
    (oldest tap first), ``g = dout * (s * (1 + pre * (1 - s)))`` with ``s = 1 / (1 + exp(-pre))`` (the derivative
    of SiLU; ``g = dout`` without activation),
    ``dw[b, t, d, W-1-j] = sum_l g[d, l] m_j[d, l]`` and ``db[b, t, d] = sum_l g[d, l]`` over the tile's
    positions ``l = t*TILE_L, t*TILE_L + 1, ...`` in that order, one fp32 addition per position from +0.0.
    No operation mixes channels (a lane holds one or more channels' own sums), so ``BLOCK_D`` and ``num_warps``
    change no bit. Past ``L`` (last tile) ``x = dout = 0``, so ``g = 0`` and each addition adds a zero to a sum
    that is never -0.0.
    """
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < DIM
    x_b = x_ptr + b * s_xb + d.to(tl.int64) * s_xd
    o_b = dout_ptr + b * s_ob + d.to(tl.int64) * s_od
    s_b = seq_ptr + b * s_sb
    # weight of lag j (x[l - j]) is w[:, W-1-j]
    wl0 = tl.load(w_ptr + d * s_wd + (W - 1) * s_ww, mask=dmask, other=0.0).to(tl.float32)
    wl1 = tl.load(w_ptr + d * s_wd + (W - 2) * s_ww, mask=dmask, other=0.0).to(tl.float32)
    wl2 = tl.zeros([BLOCK_D], dtype=tl.float32)
    wl3 = tl.zeros([BLOCK_D], dtype=tl.float32)
    if W >= 3:
        wl2 = tl.load(w_ptr + d * s_wd + (W - 3) * s_ww, mask=dmask, other=0.0).to(tl.float32)
    if W >= 4:
        wl3 = tl.load(w_ptr + d * s_wd + (W - 4) * s_ww, mask=dmask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_D], dtype=tl.float32)
    l0 = t * TILE_L
    # history: h_j = x[l0 - j] (0 before position 0), q_j its sequence id (-1 before position 0)
    h1 = tl.load(x_b + (l0 - 1).to(tl.int64) * s_xl, mask=dmask & (l0 >= 1), other=0.0).to(tl.float32)
    h2 = tl.load(x_b + (l0 - 2).to(tl.int64) * s_xl, mask=dmask & (l0 >= 2), other=0.0).to(tl.float32)
    h3 = tl.load(x_b + (l0 - 3).to(tl.int64) * s_xl, mask=dmask & (l0 >= 3), other=0.0).to(tl.float32)
    q1 = -1
    q2 = -1
    q3 = -1
    if HAS_SEQ:
        q1 = tl.load(s_b + (l0 - 1).to(tl.int64) * s_sl, mask=l0 >= 1, other=-1)
        q2 = tl.load(s_b + (l0 - 2).to(tl.int64) * s_sl, mask=l0 >= 2, other=-1)
        q3 = tl.load(s_b + (l0 - 3).to(tl.int64) * s_sl, mask=l0 >= 3, other=-1)
    acc0 = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_D], dtype=tl.float32)
    accb = tl.zeros([BLOCK_D], dtype=tl.float32)
    # four positions' loads in flight, then their four steps in position order: the same arithmetic as one
    # position per iteration, at a quarter of the dependent memory round trips
    tl.static_assert(TILE_L % 4 == 0)
    for i in range(0, TILE_L, 4):
        pos = (l0 + i).to(tl.int64)
        xa, ga, qa = _conv_load(x_b, o_b, s_b, pos, L, dmask, s_xl, s_ol, s_sl, HAS_SEQ)
        xb, gb, qb = _conv_load(x_b, o_b, s_b, pos + 1, L, dmask, s_xl, s_ol, s_sl, HAS_SEQ)
        xc, gc, qc = _conv_load(x_b, o_b, s_b, pos + 2, L, dmask, s_xl, s_ol, s_sl, HAS_SEQ)
        xd, gd, qd = _conv_load(x_b, o_b, s_b, pos + 3, L, dmask, s_xl, s_ol, s_sl, HAS_SEQ)
        h1, h2, h3, q1, q2, q3, acc0, acc1, acc2, acc3, accb = _conv_step(
            xa, ga, qa, h1, h2, h3, q1, q2, q3, wl0, wl1, wl2, wl3, bias, acc0, acc1, acc2, acc3, accb, W, HAS_SEQ,
            SILU)
        h1, h2, h3, q1, q2, q3, acc0, acc1, acc2, acc3, accb = _conv_step(
            xb, gb, qb, h1, h2, h3, q1, q2, q3, wl0, wl1, wl2, wl3, bias, acc0, acc1, acc2, acc3, accb, W, HAS_SEQ,
            SILU)
        h1, h2, h3, q1, q2, q3, acc0, acc1, acc2, acc3, accb = _conv_step(
            xc, gc, qc, h1, h2, h3, q1, q2, q3, wl0, wl1, wl2, wl3, bias, acc0, acc1, acc2, acc3, accb, W, HAS_SEQ,
            SILU)
        h1, h2, h3, q1, q2, q3, acc0, acc1, acc2, acc3, accb = _conv_step(
            xd, gd, qd, h1, h2, h3, q1, q2, q3, wl0, wl1, wl2, wl3, bias, acc0, acc1, acc2, acc3, accb, W, HAS_SEQ,
            SILU)
    part = (b * NT + t) * DIM + d
    dw = dw_ptr + part * W
    tl.store(dw + (W - 1), acc0, mask=dmask)
    tl.store(dw + (W - 2), acc1, mask=dmask)
    if W >= 3:
        tl.store(dw + (W - 3), acc2, mask=dmask)
    if W >= 4:
        tl.store(dw + (W - 4), acc3, mask=dmask)
    if HAS_BIAS:
        tl.store(db_ptr + part, accb, mask=dmask)
